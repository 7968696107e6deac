// Probe: why a zero-copy kernel's rate at 4-8 MiB depends on what ran before
// it, and which launch shape reads, and reads while writing, fastest at those sizes.
//   shape:  grid x block for a read (XOR-reduce) and a read+write (copy) of mapped pinned memory,
//           timed back to back with events, the buffers untouched by the CPU (cold)
//   before: the read at 4 MiB (hetmem's shape) timed right after different things: itself
//           (back to back), a 1 ms pause, a 256 MiB pinned D2H copy, and with a blocking kernel
//           queued ahead of the start event (nvbench's method: the launch and the GPU's wake-up
//           are not timed)
// Medians of 30 repetitions, GB/s (10^9 bytes/s) each way.
//
//     nvcc -O3 -arch=sm_90 -o /tmp/zero_copy_mid_size scripts/probes/zero_copy_mid_size.cu && /tmp/zero_copy_mid_size
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <thread>
#include <vector>

#define CHECK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); exit(1); } } while (0)

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

__global__ void read_xor(const uint4* __restrict__ src, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) atomicXor(out, acc);  // keeps the loads; almost never taken
}

__global__ void copy_xor(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned long long n, unsigned key) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const uint4 v = src[i];
        dst[i] = make_uint4(v.x ^ key, v.y ^ key, v.z ^ key, v.w ^ key);
    }
}

// Spins until *go is set (by the CPU, through mapped memory) or ~50 ms pass.
__global__ void blocking(const volatile unsigned* go) {
    const long long start = clock64();
    while (*go == 0 && clock64() - start < 100000000ll) {
    }
}

int main() {
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t largest = 256 << 20;
    unsigned char *src, *dst, *d_big;
    CHECK(cudaHostAlloc(&src, largest, cudaHostAllocMapped));
    CHECK(cudaHostAlloc(&dst, largest, cudaHostAllocMapped));
    CHECK(cudaMalloc(&d_big, largest));
    for (size_t i = 0; i < largest; ++i) src[i] = (unsigned char)(i * 2654435761u >> 24);
    memset(dst, 0, largest);
    unsigned* out;
    CHECK(cudaMalloc(&out, 4));
    volatile unsigned* go;
    CHECK(cudaHostAlloc((void**)&go, 64, cudaHostAllocMapped));
    unsigned* d_go;
    CHECK(cudaHostGetDevicePointer((void**)&d_go, (void*)go, 0));
    unsigned char *m_src, *m_dst;
    CHECK(cudaHostGetDevicePointer((void**)&m_src, src, 0));
    CHECK(cudaHostGetDevicePointer((void**)&m_dst, dst, 0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));

    auto time_one = [&](auto launch, bool block_ahead) {
        if (block_ahead) {
            *go = 0;
            blocking<<<1, 1, 0, s>>>(d_go);
        }
        CHECK(cudaEventRecord(a, s));
        launch();
        CHECK(cudaEventRecord(b, s));
        if (block_ahead) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));  // everything is queued
            *go = 1;
        }
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        return ms;
    };

    printf("== shape (cold buffers, back to back, %d SMs): GB/s read | read+write each way\n", sms);
    const size_t sizes[] = {4 << 20, 6220800, 8 << 20, 256 << 20};
    printf("%-10s %-8s", "grid", "block");
    for (size_t bytes : sizes) printf(" %9zuB r %9zuB rw", bytes, bytes);
    printf("\n");
    for (int block : {256, 512, 1024}) {
        for (int per_sm_x4 : {1, 2, 4, 8, 16, 32}) {
            const int grid = std::max(1, sms * per_sm_x4 / 4);
            printf("%-10d %-8d", grid, block);
            for (size_t bytes : sizes) {
                const unsigned long long n = bytes / 16;
                std::vector<double> r, rw;
                for (int rep = 0; rep < 33; ++rep) {
                    float ms = time_one([&] { read_xor<<<grid, block, 0, s>>>((const uint4*)m_src, n, out); }, false);
                    if (rep >= 3) r.push_back(bytes / (ms * 1e6));
                    ms = time_one([&] { copy_xor<<<grid, block, 0, s>>>((const uint4*)m_src, (uint4*)m_dst, n, 0x5a5a5a5au); }, false);
                    if (rep >= 3) rw.push_back(bytes / (ms * 1e6));
                }
                printf(" %11.1f %12.1f", median(r), median(rw));
            }
            printf("\n");
            fflush(stdout);
        }
    }

    printf("== before: 4 MiB read, grid %d x 512 (hetmem's read shape), after ...\n", sms * 8);
    const size_t bytes = 4 << 20;
    const unsigned long long n = bytes / 16;
    auto read4 = [&] { read_xor<<<sms * 8, 512, 0, s>>>((const uint4*)m_src, n, out); };
    for (int variant = 0; variant < 4; ++variant) {
        for (bool block_ahead : {false, true}) {
            std::vector<double> r;
            for (int rep = 0; rep < 33; ++rep) {
                if (variant == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                if (variant == 2) CHECK(cudaMemcpyAsync(dst, d_big, largest, cudaMemcpyDeviceToHost, s));
                if (variant == 3) CHECK(cudaMemcpyAsync(d_big, src, largest, cudaMemcpyHostToDevice, s));
                if (variant >= 2) CHECK(cudaStreamSynchronize(s));
                float ms = time_one(read4, block_ahead);
                if (rep >= 3) r.push_back(bytes / (ms * 1e6));
            }
            const char* names[] = {"itself (back to back)", "a 1 ms pause", "a 256 MiB D2H copy", "a 256 MiB H2D copy"};
            printf("%-24s %-22s %6.1f GB/s\n", names[variant], block_ahead ? "blocking kernel ahead" : "plain", median(r));
            fflush(stdout);
        }
    }
    return 0;
}
