// Probe: where the 8-10 us each extra segment adds to one pipelined frame
// comes from. One RGB frame of random data (1080p by default: 6,220,800 bytes; give WIDTH
// HEIGHT for another) crosses the link in N pieces (N = 1, 6, 12, 16, 24), in five arrangements, each timed over 200 frames after 20 warm-ups
// (median GPU span from events, and median wall time from the first call to the stream's end):
//   up          N uploads back to back on one stream (pinned -> device)
//   down        N downloads back to back on one stream (device -> pinned)
//   both        the N uploads on one stream and N downloads (of another buffer) on a second,
//               independent: the two directions at once
//   chain       upload i on stream A, an event; stream B waits for it and downloads piece i
//               (from the uploaded buffer): the dependency the pinned-async frame has, no kernel
//   chain+k     as chain, with a kernel on stream K between them (upload -> K xor-copies the
//               piece on the device -> download): hetmem's segmented frame without the blur
// Every output is checked against the input (chain: equal; chain+k: xor key) on every frame;
// outputs are poisoned before each frame. What the figures separate: a fixed cost per copy in
// the copy engine (up/down grow with N), a cost per cross-stream wait (chain grows faster than
// both), a cost per kernel in the chain (chain+k grows faster than chain).
//
//     nvcc -O3 -arch=sm_90 -o /tmp/copy_chain scripts/probes/copy_chain.cu && /tmp/copy_chain [WIDTH HEIGHT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <random>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

using Clock = std::chrono::steady_clock;
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

static size_t FRAME = 1920 * 1080 * 3;
static const int FRAMES = 200, WARMUP = 20;
static const unsigned KEY = 0x5A;

__global__ void xor_copy(const unsigned char* in, unsigned char* out, size_t n, unsigned char key) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = in[i] ^ key;
}

enum Mode { UP, DOWN, BOTH, CHAIN, CHAIN_K };
static const char* NAMES[] = {"up", "down", "both", "chain", "chain+k"};

int main(int argc, char** argv) {
    if (argc == 3) FRAME = (size_t)atoi(argv[1]) * atoi(argv[2]) * 3;
    printf("frame: %zu bytes\n", FRAME);
    unsigned char *h_in, *h_out, *d_a, *d_b, *d_src;
    CHECK(cudaHostAlloc(&h_in, FRAME, cudaHostAllocDefault));
    CHECK(cudaHostAlloc(&h_out, FRAME, cudaHostAllocDefault));
    CHECK(cudaMalloc(&d_a, FRAME));
    CHECK(cudaMalloc(&d_b, FRAME));
    CHECK(cudaMalloc(&d_src, FRAME));
    std::mt19937_64 rng(12345);
    for (size_t i = 0; i < FRAME; ++i) h_in[i] = (unsigned char)rng();
    // The download source of `down` and `both`: random too.
    CHECK(cudaMemcpy(d_src, h_in, FRAME, cudaMemcpyHostToDevice));
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t a, b, k;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
    const int MAXN = 24;
    cudaEvent_t up_done[MAXN], k_done[MAXN], start, end_a, end_b;
    for (int i = 0; i < MAXN; ++i) {
        CHECK(cudaEventCreateWithFlags(&up_done[i], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&k_done[i], cudaEventDisableTiming));
    }
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end_a));
    CHECK(cudaEventCreate(&end_b));

    printf("%-8s %4s %10s %10s %12s\n", "mode", "N", "gpu us", "wall us", "us/extra seg");
    for (int mode = UP; mode <= CHAIN_K; ++mode) {
        double gpu1 = 0;
        for (int n : {1, 6, 12, 16, 24}) {
            size_t piece = (FRAME + n - 1) / n;
            std::vector<double> gpu, wall;
            for (int f = 0; f < WARMUP + FRAMES; ++f) {
                memset(h_out, 0xA5, FRAME);
                CHECK(cudaMemsetAsync(d_a, 0xC3, FRAME, a));
                CHECK(cudaMemsetAsync(d_b, 0x3C, FRAME, a));
                CHECK(cudaStreamSynchronize(a));
                auto t0 = Clock::now();
                CHECK(cudaEventRecord(start, a));
                CHECK(cudaStreamWaitEvent(b, start, 0));
                CHECK(cudaStreamWaitEvent(k, start, 0));
                for (int i = 0; i < n; ++i) {
                    size_t off = i * piece, len = std::min(piece, FRAME - off);
                    if (mode == UP || mode == BOTH || mode == CHAIN || mode == CHAIN_K)
                        CHECK(cudaMemcpyAsync(d_a + off, h_in + off, len, cudaMemcpyHostToDevice, a));
                    if (mode == DOWN || mode == BOTH)
                        CHECK(cudaMemcpyAsync(h_out + off, d_src + off, len, cudaMemcpyDeviceToHost, mode == DOWN ? a : b));
                    if (mode == CHAIN) {
                        CHECK(cudaEventRecord(up_done[i], a));
                        CHECK(cudaStreamWaitEvent(b, up_done[i], 0));
                        CHECK(cudaMemcpyAsync(h_out + off, d_a + off, len, cudaMemcpyDeviceToHost, b));
                    }
                    if (mode == CHAIN_K) {
                        CHECK(cudaEventRecord(up_done[i], a));
                        CHECK(cudaStreamWaitEvent(k, up_done[i], 0));
                        unsigned blocks = std::min<size_t>(sms * 4, (len + 511) / 512);
                        xor_copy<<<blocks, 512, 0, k>>>(d_a + off, d_b + off, len, KEY);
                        CHECK(cudaGetLastError());
                        CHECK(cudaEventRecord(k_done[i], k));
                        CHECK(cudaStreamWaitEvent(b, k_done[i], 0));
                        CHECK(cudaMemcpyAsync(h_out + off, d_b + off, len, cudaMemcpyDeviceToHost, b));
                    }
                }
                CHECK(cudaEventRecord(end_a, a));
                CHECK(cudaEventRecord(end_b, b));
                CHECK(cudaEventSynchronize(end_a));
                CHECK(cudaEventSynchronize(end_b));
                double w = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
                float ms_a, ms_b;
                CHECK(cudaEventElapsedTime(&ms_a, start, end_a));
                CHECK(cudaEventElapsedTime(&ms_b, start, end_b));
                CHECK(cudaStreamSynchronize(k));
                // Check: what the mode moved, every frame.
                if (mode == UP) {
                    CHECK(cudaMemcpy(h_out, d_a, FRAME, cudaMemcpyDeviceToHost));
                }
                bool ok = true;
                for (size_t i = 0; i < FRAME && ok; i += 1) {
                    unsigned char want = mode == CHAIN_K ? h_in[i] ^ KEY : h_in[i];
                    if (h_out[i] != want) {
                        printf("MISMATCH mode %s n %d byte %zu: %02x want %02x\n", NAMES[mode], n, i, h_out[i], want);
                        ok = false;
                    }
                }
                if (!ok) return 1;
                if (f >= WARMUP) {
                    gpu.push_back(1e3 * std::max(ms_a, ms_b));
                    wall.push_back(w);
                }
            }
            double g = median(gpu);
            if (n == 1) gpu1 = g;
            printf("%-8s %4d %10.1f %10.1f %12s\n", NAMES[mode], n, g, median(wall),
                   n == 1 ? "-" : (std::to_string((g - gpu1) / (n - 1)).substr(0, 5)).c_str());
        }
    }
    return 0;
}
