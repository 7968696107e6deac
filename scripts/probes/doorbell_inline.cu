// Probe: what a doorbell round trip for a 64-byte request costs, by protocol.
//
// A persistent one-block kernel serves requests the CPU writes into mapped pinned memory and
// replies there; the CPU times submit-to-reply over many requests. Protocols:
//   two_reads   the server polls the doorbell word (one thread), then reads the payload in a
//               second pass over the link, fences at system scope and publishes the reply
//               sequence (hetmem's doorbell today)
//   inline      the payload rides in the polled 128-byte line: every 32-byte sector starts with
//               the sequence word, which the CPU writes after that sector's payload, so a warp's
//               one read of the line is accepted only when all four sectors carry the new
//               sequence; the reply comes back the same way (one warp store of a line whose
//               four sectors each start with the sequence), with no fence
//   flag        a bare mapped-flag round trip (the floor: no payload)
// The reply is gain * x for 16 floats and is checked for every request.
//
//     nvcc -O2 -arch=sm_90 -o /tmp/doorbell_inline scripts/probes/doorbell_inline.cu && /tmp/doorbell_inline
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int N = 16;        // floats per request
constexpr int LINE = 32;     // words per 128-byte line
constexpr int SLOT = 4 * LINE;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Slot: line 0 request, line 1 out-of-line payload (two_reads), line 2 reply line,
// line 3 out-of-line reply (two_reads).
__global__ void server(unsigned* words, int protocol, unsigned count) {
    __shared__ unsigned cmd;
    __shared__ float x[N];
    const unsigned lane = threadIdx.x;
    for (unsigned seq = 1; seq <= count; ++seq) {
        unsigned* slot = words + (seq % 2) * SLOT;
        float gain;
        if (protocol == 0) {  // two_reads
            if (lane == 0) {
                while (ld_acquire(&slot[0]) != seq) {}
            }
            __syncthreads();
            if (lane < N) x[lane] = ((volatile float*)(slot + LINE))[lane];
            if (lane == 31) cmd = ((volatile unsigned*)slot)[1];
            __syncthreads();
            gain = __uint_as_float(cmd);
            if (lane < N) ((float*)(slot + 3 * LINE))[lane] = gain * x[lane];
            __syncthreads();
            if (lane == 0) { __threadfence_system(); st_release(&slot[2 * LINE], seq); }
        } else if (protocol == 1) {  // inline
            unsigned w;
            for (;;) {
                w = ((volatile unsigned*)slot)[lane];
                const bool fresh = (lane % 8 != 0) || w == seq;
                if (__all_sync(0xFFFFFFFFu, fresh)) break;
            }
            // Payload: word 1 gain, then floats at the words that are not sector heads.
            gain = __uint_as_float(__shfl_sync(0xFFFFFFFFu, w, 1));
            // Reply line: sector heads = seq, word 1 status, floats elsewhere (same positions).
            float y = gain * __uint_as_float(w);
            unsigned out = (lane % 8 == 0) ? seq : (lane == 1 ? 0u : __float_as_uint(y));
            ((volatile unsigned*)(slot + 2 * LINE))[lane] = out;
        } else {  // flag
            if (lane == 0) {
                while (ld_acquire(&slot[0]) != seq) {}
                st_release(&slot[2 * LINE], seq);
            }
        }
        __syncwarp();
    }
}

// Positions of the 16 floats in the inline line: words that are neither a sector head nor word 1.
static int inline_pos(int i) {
    static int pos[N];
    static bool made = false;
    if (!made) {
        int k = 0;
        for (int wd = 0; wd < LINE && k < N; ++wd)
            if (wd % 8 != 0 && wd != 1) pos[k++] = wd;
        made = true;
    }
    return pos[i];
}

int main() {
    const unsigned count = 20000;
    unsigned* host;
    CHECK(cudaHostAlloc(&host, 2 * SLOT * 4, cudaHostAllocMapped));
    unsigned* dev;
    CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    const char* names[] = {"two_reads", "inline", "flag"};
    for (int protocol = 0; protocol < 3; ++protocol) {
        memset(host, 0, 2 * SLOT * 4);
        auto* w = reinterpret_cast<std::atomic<unsigned>*>(host);
        server<<<1, 32>>>(dev, protocol, count);
        CHECK(cudaGetLastError());
        std::vector<double> us;
        us.reserve(count);
        float xs[N];
        for (unsigned seq = 1; seq <= count; ++seq) {
            std::atomic<unsigned>* slot = w + (seq % 2) * SLOT;
            const float gain = 1.0f + (seq % 7) * 0.25f;
            for (int i = 0; i < N; ++i) xs[i] = (float)((seq * 2654435761u + i * 40503u) % 100000) * 0.01f;
            auto t0 = std::chrono::steady_clock::now();
            if (protocol == 0) {
                for (int i = 0; i < N; ++i) slot[LINE + i].store(__builtin_bit_cast(unsigned, xs[i]), std::memory_order_relaxed);
                slot[1].store(__builtin_bit_cast(unsigned, gain), std::memory_order_relaxed);
                slot[0].store(seq, std::memory_order_release);
            } else if (protocol == 1) {
                slot[1].store(__builtin_bit_cast(unsigned, gain), std::memory_order_relaxed);
                for (int i = 0; i < N; ++i) slot[inline_pos(i)].store(__builtin_bit_cast(unsigned, xs[i]), std::memory_order_relaxed);
                for (int s = 3; s >= 0; --s) slot[8 * s].store(seq, std::memory_order_release);
            } else {
                slot[0].store(seq, std::memory_order_release);
            }
            if (protocol == 1) {
                for (;;) {
                    bool all = true;
                    for (int s = 0; s < 4; ++s) all = all && slot[2 * LINE + 8 * s].load(std::memory_order_acquire) == seq;
                    if (all) break;
                }
            } else {
                while (slot[2 * LINE].load(std::memory_order_acquire) != seq) {}
            }
            auto t1 = std::chrono::steady_clock::now();
            if (protocol != 2) {
                for (int i = 0; i < N; ++i) {
                    const int at = protocol == 0 ? 3 * LINE + i : 2 * LINE + inline_pos(i);
                    const float got = __builtin_bit_cast(float, slot[at].load(std::memory_order_relaxed));
                    if (got != gain * xs[i]) { printf("%s: request %u float %d: %g, want %g\n", names[protocol], seq, i, got, gain * xs[i]); exit(1); }
                }
            }
            if (seq > 1000) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
        CHECK(cudaDeviceSynchronize());
        std::sort(us.begin(), us.end());
        printf("%-10s median %.2f us  p10 %.2f  p90 %.2f  p99 %.2f  (%zu requests, every reply checked)\n", names[protocol],
               us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10], us[us.size() * 99 / 100], us.size());
    }
    return 0;
}
