// Probe: why hetmem's blur kernel moves a frame across the link at
// about 30 GB/s each way when it reads and writes mapped memory, where a plain read+write
// copy kernel moves 40. hetmem's own kernel (crates/hetmem/kernels/gaussian.cu, included
// whole) on one random RGB 8-bit frame, 5x5, input and output in mapped pinned memory, at
// 1080p and 4K; the GPU span (events) of one launch, median of 100, for:
//   copy         a read+write copy kernel over the same buffers (16-byte vectors, SMs / 4
//                blocks of 512 threads, grid-stride: hetmem's bench_copy_u4 shape)
//   blur B x T   the blur with bands of B pixels and about T tiles (hetmem: B = 128, T about
//                one per SM)
// each with the input as the CPU left it after writing the frame (dirty lines in its cache)
// and after evicting it (CLFLUSH). Every blur output is compared with the same kernel's
// result on device memory (band 128), byte for byte; the copy with the input.
//
//     nvcc -O3 -arch=sm_90 -o /tmp/blur_mapped_shape scripts/probes/blur_mapped_shape.cu && /tmp/blur_mapped_shape
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>
#include <x86intrin.h>

#include "../../crates/hetmem/kernels/gaussian.cu"

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

__global__ void copy_u4(const uint4* in, uint4* out, size_t n16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        out[i] = in[i];
}

struct Plan { std::vector<unsigned> table; unsigned tiles; size_t shared; int range_rows; };

// hetmem's tiling (GaussianPlan::tiled) for one RGB 8-bit plane, radius 2, with the band width
// a parameter: about `tiles` tiles, ranges of at least 64 rows.
static Plan plan(int W, int H, int band, int tiles) {
    const int r = 2, ch = 3;
    Plan p;
    p.table = {4096, 16384, 24576, 16384, 4096};  // Q16 1-4-6-4-1
    int bands = (W + band - 1) / band;
    int ranges = std::min(std::max(tiles / bands, 1), std::max((H + 63) / 64, 1));
    int range_rows = (H + ranges - 1) / ranges;
    ranges = (H + range_rows - 1) / range_rows;
    p.table.insert(p.table.end(), {0u, 0u, (unsigned)W, (unsigned)H, (unsigned)ch, (unsigned)band, (unsigned)bands,
                                   (unsigned)ranges, (unsigned)range_rows, 0u});
    p.tiles = bands * ranges;
    p.range_rows = range_rows;
    const int ring = CHUNK + 2 * r;
    const size_t in_stride = ((15 + (band + 2 * r) * ch + 16 + 15) / 16) * 16;
    const size_t mid_stride = ((band * ch + 3) / 4) * 4;
    const size_t out_stride = ((15 + band * ch + 16 + 15) / 16) * 16;
    p.shared = ring * in_stride + ((ring * mid_stride * 2 + 15) / 16) * 16 + CHUNK * out_stride;
    return p;
}

static void evict(const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; i += 64) _mm_clflush(p + i);
    _mm_mfence();
}

// `blur_mapped_shape 256` times only the blur with bands of 256 (for builds with another CHUNK).
int main(int argc, char** argv) {
    const int only_band = argc > 1 ? atoi(argv[1]) : 0;
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaFuncSetAttribute(gaussian_u8, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (auto [W, H] : {std::pair{1920, 1080}, std::pair{3840, 2160}}) {
        const size_t frame = (size_t)W * H * 3;
        unsigned char *h_src, *h_in, *h_out, *h_ref, *d_in, *d_out, *m_in, *m_out;
        CHECK(cudaHostAlloc(&h_in, frame, cudaHostAllocMapped));
        CHECK(cudaHostAlloc(&h_out, frame, cudaHostAllocMapped));
        CHECK(cudaHostGetDevicePointer((void**)&m_in, h_in, 0));
        CHECK(cudaHostGetDevicePointer((void**)&m_out, h_out, 0));
        h_src = (unsigned char*)malloc(frame);
        h_ref = (unsigned char*)malloc(frame);
        unsigned x = 12345;
        for (size_t i = 0; i < frame; ++i) { x = x * 1664525u + 1013904223u; h_src[i] = (unsigned char)(x >> 24); }
        CHECK(cudaMalloc(&d_in, frame));
        CHECK(cudaMalloc(&d_out, frame));
        CHECK(cudaMemcpy(d_in, h_src, frame, cudaMemcpyHostToDevice));
        unsigned* d_table;
        CHECK(cudaMalloc(&d_table, 64 * 4));
        {
            Plan p = plan(W, H, 128, sms);
            CHECK(cudaMemcpy(d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
            gaussian_u8<<<p.tiles, THREADS, p.shared>>>(d_in, d_out, d_table, 1, 2, 0);
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(h_ref, d_out, frame, cudaMemcpyDeviceToHost));
        }
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        printf("== %dx%d RGB (%zu bytes), %d SMs, CHUNK %d; GPU span, median of 100 launches\n", W, H, frame, sms, CHUNK);
        printf("%-28s %6s %6s %10s %10s %10s %10s %10s\n", "kernel", "tiles", "rows", "dirty us", "GB/s each",
               "in-only us", "evicted us", "GB/s each");
        // copy shapes (band 0: tiles = blocks, threads) and blur shapes (band, tiles).
        struct Shape { int band, tiles, threads; };
        std::vector<Shape> shapes = {{0, 16, 512}, {0, 33, 256}, {0, 33, 512}, {0, 66, 256}, {0, 132, 256}};
        for (int band : {128, 256})
            for (int t : {8, 12, 16, 24, 32, 48, 64}) shapes.push_back({band, t, 0});
        for (int t : {8, 16, 32}) shapes.push_back({512, t, 0});
        if (only_band)
            shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return s.band != only_band; }),
                         shapes.end());
        for (auto shape : shapes) {
            Plan p = plan(W, H, shape.band ? shape.band : 128, shape.band ? shape.tiles : sms);
            if (shape.band) CHECK(cudaMemcpy(d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
            double us[3];
            bool ok = true;
            for (int state = 0; state < 3; ++state) {
                const bool evicted = state == 2;
                std::vector<double> t;
                for (int rep = 0; rep < 110; ++rep) {
                    memcpy(h_in, h_src, frame);
                    if (state != 1 || rep == 9) memset(h_out, 0xa5, frame);  // in-only: poisoned once, untimed
                    if (evicted) { evict(h_in, frame); evict(h_out, frame); }
                    CHECK(cudaEventRecord(a));
                    if (shape.band)
                        gaussian_u8<<<p.tiles, THREADS, p.shared>>>(m_in, m_out, d_table, 1, 2, 0);
                    else
                        copy_u4<<<shape.tiles, shape.threads>>>((const uint4*)m_in, (uint4*)m_out, frame / 16);
                    CHECK(cudaGetLastError());
                    CHECK(cudaEventRecord(b));
                    CHECK(cudaEventSynchronize(b));
                    float ms;
                    CHECK(cudaEventElapsedTime(&ms, a, b));
                    if (rep >= 10) t.push_back(ms * 1e3);
                    if (rep == 9 || rep == 109) ok = ok && memcmp(h_out, shape.band ? h_ref : h_src, frame) == 0;
                }
                us[state] = median(t);
            }
            char name[64];
            if (shape.band) snprintf(name, sizeof name, "blur band %d", shape.band);
            else snprintf(name, sizeof name, "copy (%d blocks x %d)", shape.tiles, shape.threads);
            printf("%-28s %6u %6d %10.1f %10.1f %10.1f %10.1f %10.1f %s\n", name, shape.band ? p.tiles : 0,
                   shape.band ? p.range_rows : 0, us[0], frame / us[0] / 1e3, us[1], us[2], frame / us[2] / 1e3,
                   ok ? "bit-exact" : "MISMATCH");
            fflush(stdout);
        }
        CHECK(cudaFreeHost(h_in));
        CHECK(cudaFreeHost(h_out));
        CHECK(cudaFree(d_in));
        CHECK(cudaFree(d_out));
        CHECK(cudaFree(d_table));
        free(h_src);
        free(h_ref);
    }
    return 0;
}
