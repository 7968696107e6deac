// Probe: the link's rates at frame sizes, by the kind of pinned memory and
// whether the CPU has just written it (a producer writes each frame just before handing it over;
// a consumer's buffer was just read or poisoned). frame_latency.cu showed that one frame's wall
// time is its GPU span plus a few microseconds: what is left is the transfers themselves.
//   kinds: hostalloc (cudaHostAlloc), register-4k (malloc'd, registered), register-thp
//          (2 MiB-aligned, MADV_HUGEPAGE, touched, registered)
//   rows:  H2D alone, D2H alone, H2D and D2H at once on two streams (the pinned-async frame),
//          and a kernel copying mapped input to mapped output (the zero-copy frame)
// Medians of 30 repetitions, GB/s (10^9 bytes/s) each way, from events.
//
//     nvcc -O3 -arch=sm_90 -o /tmp/link_frame_size scripts/probes/link_frame_size.cu && /tmp/link_frame_size
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <vector>

#define CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); exit(1); } } while (0)

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// A mapped copy: 16-byte vectors, grid-stride.
__global__ void mapped_copy(const uint4* __restrict__ in, uint4* __restrict__ out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = in[i];
    }
}

enum Kind { HOSTALLOC, REGISTER_4K, REGISTER_THP };
static const char* kind_name[] = {"hostalloc", "register-4k", "register-thp"};

static unsigned char* host_alloc(Kind kind, size_t bytes) {
    void* p = nullptr;
    if (kind == HOSTALLOC) {
        CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
        return (unsigned char*)p;
    }
    if (kind == REGISTER_4K) {
        p = malloc(bytes);
        memset(p, 1, bytes);
    } else {
        const size_t huge = 2 << 20, rounded = (bytes + huge - 1) / huge * huge;
        if (posix_memalign(&p, huge, rounded) != 0) exit(1);
        madvise(p, rounded, MADV_HUGEPAGE);
        memset(p, 1, rounded);
    }
    CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped));
    return (unsigned char*)p;
}

int main() {
    const size_t sizes[] = {6220800, 24883200, 268435456};
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e[6];
    for (auto& ev : e) CHECK(cudaEventCreate(&ev));
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("%-13s %-10s %-8s %8s %8s %14s %14s %14s\n", "memory", "bytes", "cpu", "H2D", "D2H", "both (each)",
           "mapped copy", "mapped SMs/4");
    for (size_t bytes : sizes) {
        unsigned char *d_in, *d_out;
        CHECK(cudaMalloc(&d_in, bytes));
        CHECK(cudaMalloc(&d_out, bytes));
        std::vector<unsigned char> src(bytes);
        for (size_t i = 0; i < bytes; ++i) src[i] = (unsigned char)(i * 2654435761u >> 24);
        for (Kind kind : {HOSTALLOC, REGISTER_4K, REGISTER_THP}) {
            unsigned char* in = host_alloc(kind, bytes);
            unsigned char* out = host_alloc(kind, bytes);
            memcpy(in, src.data(), bytes);
            unsigned char *m_in, *m_out;
            CHECK(cudaHostGetDevicePointer((void**)&m_in, in, 0));
            CHECK(cudaHostGetDevicePointer((void**)&m_out, out, 0));
            for (bool written : {false, true}) {
                std::vector<double> h2d, d2h, both, mapped, mapped4;
                for (int rep = 0; rep < 33; ++rep) {
                    auto touch = [&] {
                        if (written) {
                            memcpy(in, src.data(), bytes);  // the producer's frame
                            memset(out, 0xa5, bytes);       // the consumer's buffer, poisoned
                        }
                    };
                    float ms;
                    touch();
                    CHECK(cudaEventRecord(e[0], a));
                    CHECK(cudaMemcpyAsync(d_in, in, bytes, cudaMemcpyHostToDevice, a));
                    CHECK(cudaEventRecord(e[1], a));
                    CHECK(cudaEventSynchronize(e[1]));
                    CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
                    if (rep >= 3) h2d.push_back(bytes / (ms * 1e6));
                    touch();
                    CHECK(cudaEventRecord(e[0], a));
                    CHECK(cudaMemcpyAsync(out, d_out, bytes, cudaMemcpyDeviceToHost, a));
                    CHECK(cudaEventRecord(e[1], a));
                    CHECK(cudaEventSynchronize(e[1]));
                    CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
                    if (rep >= 3) d2h.push_back(bytes / (ms * 1e6));
                    touch();
                    CHECK(cudaEventRecord(e[0], a));
                    CHECK(cudaStreamWaitEvent(b, e[0], 0));
                    CHECK(cudaMemcpyAsync(d_in, in, bytes, cudaMemcpyHostToDevice, a));
                    CHECK(cudaMemcpyAsync(out, d_out, bytes, cudaMemcpyDeviceToHost, b));
                    CHECK(cudaEventRecord(e[2], b));
                    CHECK(cudaStreamWaitEvent(a, e[2], 0));
                    CHECK(cudaEventRecord(e[1], a));
                    CHECK(cudaEventSynchronize(e[1]));
                    CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
                    if (rep >= 3) both.push_back(bytes / (ms * 1e6));
                    for (int grid : {sms * 8, sms / 4}) {
                        touch();
                        CHECK(cudaEventRecord(e[0], a));
                        mapped_copy<<<grid, 1024, 0, a>>>((const uint4*)m_in, (uint4*)m_out, bytes / 16);
                        CHECK(cudaEventRecord(e[1], a));
                        CHECK(cudaEventSynchronize(e[1]));
                        CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
                        if (rep >= 3) (grid == sms / 4 ? mapped4 : mapped).push_back(bytes / (ms * 1e6));
                    }
                }
                if (memcmp(out, in, bytes) != 0) printf("mapped copy MISMATCH\n");
                printf("%-13s %-10zu %-8s %8.1f %8.1f %14.1f %14.1f %14.1f\n", kind_name[kind], bytes,
                       written ? "written" : "cold", median(h2d), median(d2h), median(both), median(mapped),
                       median(mapped4));
                fflush(stdout);
            }
            if (kind == HOSTALLOC) {
                CHECK(cudaFreeHost(in));
                CHECK(cudaFreeHost(out));
            } else {
                CHECK(cudaHostUnregister(in));
                CHECK(cudaHostUnregister(out));
                free(in);
                free(out);
            }
        }
        CHECK(cudaFree(d_in));
        CHECK(cudaFree(d_out));
    }
    return 0;
}
