// Probe: where one frame's latency goes, and what a launch-free or
// graph-launched frame would save. hetmem's own blur kernels (crates/hetmem/kernels/gaussian.cu,
// included whole) on one RGB 8-bit frame, 5x5, one frame at a time, timed from handing the frame
// over to the result readable by the CPU:
//   mapped/launch   gaussian_u8 reading and writing mapped pinned memory, one launch per frame,
//                   tiled as hetmem tiles it (x share: tiles per SM), then cuStreamSynchronize
//                   (sync) or a spin on a mapped word the stream writes after the kernel (flag)
//   mapped/resident a persistent kernel (one block per tile, as many tiles as SMs) that polls a
//                   mapped doorbell for the next frame, blurs it in place across the link and
//                   raises a mapped done word: no launch, no completion round trip
//   overlap/direct  hetmem's pinned-async frame: segmented uploads signalling the overlap kernel,
//                   downloads waiting on its signals, every call issued per frame
//   overlap/graph   the same work captured once into a CUDA graph (two, alternating the sequence
//                   number) and launched with one call per frame
//   overlap/mapped-out  uploads by the copy engine, the kernel writing mapped output
// Every output is checked against the plain kernel's, on random frames; timings are medians over
// the frames, in microseconds, with the GPU's own span (events) beside the wall time.
//
//     nvcc -O3 -arch=sm_90 -lcuda -o /tmp/frame_latency scripts/probes/frame_latency.cu && /tmp/frame_latency
// The resident kernel reads the same addresses frame after frame, so a load that hits a line
// cached by an earlier frame reads stale input (the check says MISMATCH); built with
// -Xptxas -dlcm=cg its loads skip L1:
//     nvcc -O3 -arch=sm_90 -lcuda -Xptxas -dlcm=cg -o /tmp/frame_latency_cg scripts/probes/frame_latency.cu && /tmp/frame_latency_cg resident
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
#include <vector>

#include "../../crates/hetmem/kernels/gaussian.cu"

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)
#define CHECK_CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorString(e, &s); printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, s); exit(1); } } while (0)

using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
static double p99(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() * 99 / 100]; }

static int W, H, SMS, FRAMES = 300, WARMUP = 30;
static size_t FRAME;

struct Plan { std::vector<unsigned> table; unsigned tiles, blocks; size_t shared; };

// GaussianPlan::tiled for one RGB 8-bit plane, radius 2; `range_rows` 0 = hetmem's plain tiling
// (about `share` tiles per SM), else fixed ranges as the overlap kernel takes them.
static int BAND = 128;  // the band width in pixels; `BAND=256` in the environment for another

static Plan plan(double share, int range_rows) {
    const int band = BAND, r = 2, ch = 3;
    Plan p;
    p.table = {4096, 16384, 24576, 16384, 4096};  // Q16 1-4-6-4-1
    int bands = (W + band - 1) / band;
    int ranges;
    if (range_rows == 0) {
        int want = std::max(1, (int)(SMS * share + 0.5));
        ranges = std::min(std::max(want / bands, 1), std::max((H + 63) / 64, 1));
        range_rows = (H + ranges - 1) / ranges;
    }
    ranges = (H + range_rows - 1) / range_rows;
    p.table.insert(p.table.end(), {0u, 0u, (unsigned)W, (unsigned)H, (unsigned)ch, (unsigned)band, (unsigned)bands,
                                   (unsigned)ranges, (unsigned)range_rows, 0u});
    p.tiles = bands * ranges;
    p.blocks = p.tiles;
    const int ring = CHUNK + 2 * r;
    const size_t in_stride = ((15 + (band + 2 * r) * ch + 16 + 15) / 16) * 16;
    const size_t mid_stride = ((band * ch + 3) / 4) * 4;
    const size_t out_stride = ((15 + band * ch + 16 + 15) / 16) * 16;
    p.shared = ring * in_stride + ((ring * mid_stride * 2 + 15) / 16) * 16 + CHUNK * out_stride;
    return p;
}

// The resident kernel: waits for doorbell == seq (block 0 polls host memory, then tells the
// others through device memory), blurs its tiles, and the last block to finish raises done.
__global__ void __launch_bounds__(THREADS, 1)
resident(const unsigned char* src, unsigned char* dst, const unsigned* table, const volatile unsigned* doorbell,
         volatile unsigned* done, volatile unsigned* go, unsigned* finished, unsigned frames) {
    for (unsigned seq = 1; seq <= frames; ++seq) {
        if (threadIdx.x == 0) {
            if (blockIdx.x == 0) {
                while (*doorbell != seq) {
                }
                __threadfence_system();
                *go = seq;
            } else {
                while (*go != seq) {
                }
            }
            __threadfence();
        }
        __syncthreads();
        const Overlap none = {nullptr, nullptr, nullptr, 1, 0, 0, 0};
        gaussian_body<false, 1>(src, dst, table, 1, 2, 0, none);
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) {
            if (atomicAdd(finished, 1) == gridDim.x - 1) {
                *finished = 0;
                __threadfence_system();
                *done = seq;
            }
        }
    }
}

// Spins until the mapped word `w` holds `v`; gives up after two seconds (a stalled kernel).
static void spin_until(const volatile unsigned* w, unsigned v, const char* what) {
    auto t = Clock::now();
    while (*w != v) {
        if (us_since(t) > 2e6) {
            printf("%s: stalled waiting for %u (word holds %u)\n", what, v, *w);
            exit(1);
        }
    }
}

struct Row { const char* name; double wall, wall99, gpu; bool ok; };
static std::vector<Row> rows;

static void report(const char* name, std::vector<double>& wall, std::vector<double>& gpu, bool ok) {
    Row row{name, median(wall), p99(wall), gpu.empty() ? 0.0 : median(gpu), ok};
    rows.push_back(row);
    printf("%-40s wall %8.1f us (p99 %8.1f)  gpu %8.1f us  %s\n", name, row.wall, row.wall99, row.gpu,
           ok ? "bit-exact" : "MISMATCH");
    fflush(stdout);
}

static unsigned char *h_in, *h_out, *d_in, *d_out;
static unsigned char *h_src[2], *h_ref[2];  // two random frames and their results: frames alternate
static unsigned char *p_in, *p_out;  // pinned, unmapped use (overlap)

static bool check_out(const unsigned char* out, int f) { return memcmp(out, h_ref[f % 2], FRAME) == 0; }
// The CPU writes frame f into the strategy's input memory (not timed).
static void write_frame(unsigned char* in, int f) { memcpy(in, h_src[f % 2], FRAME); }

static void fill_random(unsigned char* p, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < FRAME; ++i) { x = x * 1664525u + 1013904223u; p[i] = (unsigned char)(x >> 24); }
}

static void reference(const Plan& p, unsigned* d_table) {
    for (int k = 0; k < 2; ++k) {
        CHECK(cudaMemcpy(d_in, h_src[k], FRAME, cudaMemcpyHostToDevice));
        gaussian_u8<<<p.blocks, THREADS, p.shared>>>(d_in, d_out, d_table, 1, 2, 0);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(h_ref[k], d_out, FRAME, cudaMemcpyDeviceToHost));
    }
}

static void mapped_launch(double share, bool flag) {
    Plan p = plan(share, 0);
    unsigned* d_table;
    CHECK(cudaMalloc(&d_table, p.table.size() * 4));
    CHECK(cudaMemcpy(d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    volatile unsigned* hflag;
    CHECK(cudaHostAlloc((void**)&hflag, 64, cudaHostAllocMapped));
    *hflag = 0;
    unsigned char *src, *dst;
    CHECK(cudaHostGetDevicePointer((void**)&src, h_in, 0));
    CHECK(cudaHostGetDevicePointer((void**)&dst, h_out, 0));
    void* dflag;
    CHECK(cudaHostGetDevicePointer(&dflag, (void*)hflag, 0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<double> wall, gpu;
    bool ok = true;
    for (int f = 0; f < WARMUP + FRAMES; ++f) {
        memset(h_out, 0xa5, FRAME);
        write_frame(h_in, f);
        auto t = Clock::now();
        gaussian_u8<<<p.blocks, THREADS, p.shared, s>>>(src, dst, d_table, 1, 2, 0);
        if (flag) {
            CHECK_CU(cuStreamWriteValue32((CUstream)s, (CUdeviceptr)dflag, f + 1, 0));
            spin_until(hflag, f + 1, "mapped/launch flag");
        } else {
            CHECK(cudaStreamSynchronize(s));
        }
        double us = us_since(t);
        if (f >= WARMUP) wall.push_back(us);
        ok = ok && check_out(h_out, f);
    }
    // The GPU span, separately (events add work of their own).
    for (int f = 0; f < 50; ++f) {
        CHECK(cudaEventRecord(a, s));
        gaussian_u8<<<p.blocks, THREADS, p.shared, s>>>(src, dst, d_table, 1, 2, 0);
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        gpu.push_back(ms * 1000);
    }
    char name[96];
    snprintf(name, sizeof name, "mapped/launch %s, %u tiles", flag ? "flag" : "sync", p.tiles);
    report(strdup(name), wall, gpu, ok);
    CHECK(cudaFree(d_table));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost((void*)hflag));
}

static void mapped_resident(double share) {
    Plan p = plan(share, 0);
    unsigned* d_table;
    CHECK(cudaMalloc(&d_table, p.table.size() * 4));
    CHECK(cudaMemcpy(d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
    // Every block must be resident at once: at most one per SM (1024 threads, launch bounds 1).
    unsigned blocks = std::min<unsigned>(p.tiles, SMS);
    volatile unsigned *doorbell, *done;
    CHECK(cudaHostAlloc((void**)&doorbell, 128, cudaHostAllocMapped));
    CHECK(cudaHostAlloc((void**)&done, 128, cudaHostAllocMapped));
    *doorbell = 0;
    *done = 0;
    unsigned* dev_words;
    CHECK(cudaMalloc(&dev_words, 256));
    CHECK(cudaMemset(dev_words, 0, 256));
    unsigned char *src, *dst;
    CHECK(cudaHostGetDevicePointer((void**)&src, h_in, 0));
    CHECK(cudaHostGetDevicePointer((void**)&dst, h_out, 0));
    void *d_doorbell, *d_done;
    CHECK(cudaHostGetDevicePointer(&d_doorbell, (void*)doorbell, 0));
    CHECK(cudaHostGetDevicePointer(&d_done, (void*)done, 0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned frames = WARMUP + FRAMES;
    resident<<<blocks, THREADS, p.shared, s>>>(src, dst, d_table, (const unsigned*)d_doorbell, (unsigned*)d_done,
                                                dev_words, dev_words + 32, frames);
    CHECK(cudaGetLastError());
    std::vector<double> wall, gpu;
    bool ok = true;
    for (unsigned f = 1; f <= frames; ++f) {
        memset(h_out, 0xa5, FRAME);
        write_frame(h_in, f);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        auto t = Clock::now();
        *doorbell = f;
        spin_until(done, f, "resident");
        double us = us_since(t);
        if (f > (unsigned)WARMUP) wall.push_back(us);
        ok = ok && check_out(h_out, f);
    }
    CHECK(cudaStreamSynchronize(s));
    char name[96];
    snprintf(name, sizeof name, "mapped/resident, %u tiles, %u blocks", p.tiles, blocks);
    report(strdup(name), wall, gpu, ok);
    CHECK(cudaFree(d_table));
    CHECK(cudaFree(dev_words));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost((void*)doorbell));
    CHECK(cudaFreeHost((void*)done));
}

// One pinned-async frame as hetmem queues it (GaussianOverlap::queue_frame), with its segments'
// copies spread round-robin over `lanes` upload and `lanes` download streams (hetmem: one each).
constexpr int MAX_LANES = 4;
struct Overlapped {
    Plan p;
    unsigned* d_table;
    unsigned* sync;
    int segments, lanes;
    size_t seg_bytes;
    cudaStream_t work, up[MAX_LANES], down[MAX_LANES];
    cudaEvent_t start, uploaded[MAX_LANES], downloaded[MAX_LANES];
    bool mapped_out;
    unsigned char* dst;  // d_out, or the mapped host output

    void init(int want, bool mapped_output, int lane_count) {
        p = plan(0, 2 * CHUNK);
        p.blocks = std::min<unsigned>(p.tiles, SMS);
        CHECK(cudaMalloc(&d_table, p.table.size() * 4));
        CHECK(cudaMemcpy(d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
        seg_bytes = ((FRAME + want - 1) / want + 15) / 16 * 16;
        segments = (int)((FRAME + seg_bytes - 1) / seg_bytes);
        lanes = lane_count;
        CHECK(cudaMalloc(&sync, 3 * segments * 4));
        CHECK(cudaMemset(sync, 0, 3 * segments * 4));
        CHECK(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&start, cudaEventDisableTiming));
        for (int k = 0; k < lanes; ++k) {
            CHECK(cudaStreamCreateWithFlags(&up[k], cudaStreamNonBlocking));
            CHECK(cudaStreamCreateWithFlags(&down[k], cudaStreamNonBlocking));
            CHECK(cudaEventCreateWithFlags(&uploaded[k], cudaEventDisableTiming));
            CHECK(cudaEventCreateWithFlags(&downloaded[k], cudaEventDisableTiming));
        }
        mapped_out = mapped_output;
        if (mapped_out) {
            CHECK(cudaHostGetDevicePointer((void**)&dst, h_out, 0));
        } else {
            dst = d_out;
        }
    }
    // Queues one frame with sequence number `seq` on `work` (capturable).
    void queue(unsigned seq) {
        CHECK(cudaEventRecord(start, work));
        for (int k = 0; k < lanes; ++k) {
            CHECK(cudaStreamWaitEvent(up[k], start, 0));
            CHECK(cudaStreamWaitEvent(down[k], start, 0));
        }
        for (int s = 0; s < segments; ++s) {
            size_t off = s * seg_bytes, n = std::min(seg_bytes, FRAME - off);
            cudaStream_t lane = up[s % lanes];
            CHECK(cudaMemcpyAsync(d_in + off, p_in + off, n, cudaMemcpyHostToDevice, lane));
            CHECK_CU(cuStreamWriteValue32((CUstream)lane, (CUdeviceptr)(sync + s), seq, 0));
        }
        gaussian_u8_overlap<<<p.blocks, THREADS, p.shared, work>>>(d_in, dst, d_table, 1, 2, 0, sync, segments,
                                                                     seg_bytes, FRAME, seq, mapped_out ? 0 : 1);
        CHECK(cudaGetLastError());
        if (!mapped_out) {
            for (int s = 0; s < segments; ++s) {
                size_t off = s * seg_bytes, n = std::min(seg_bytes, FRAME - off);
                cudaStream_t lane = down[s % lanes];
                CHECK_CU(cuStreamWaitValue32((CUstream)lane, (CUdeviceptr)(sync + segments + s), seq,
                                             CU_STREAM_WAIT_VALUE_EQ));
                CHECK(cudaMemcpyAsync(p_out + off, d_out + off, n, cudaMemcpyDeviceToHost, lane));
            }
        }
        for (int k = 0; k < lanes; ++k) {
            CHECK(cudaEventRecord(uploaded[k], up[k]));
            CHECK(cudaStreamWaitEvent(work, uploaded[k], 0));
            CHECK(cudaEventRecord(downloaded[k], down[k]));
            CHECK(cudaStreamWaitEvent(work, downloaded[k], 0));
        }
    }
    void destroy() {
        CHECK(cudaFree(d_table));
        CHECK(cudaFree(sync));
        CHECK(cudaStreamDestroy(work));
        CHECK(cudaEventDestroy(start));
        for (int k = 0; k < lanes; ++k) {
            CHECK(cudaStreamDestroy(up[k]));
            CHECK(cudaStreamDestroy(down[k]));
            CHECK(cudaEventDestroy(uploaded[k]));
            CHECK(cudaEventDestroy(downloaded[k]));
        }
    }
};

static void overlap(int want, bool graph, bool flag, bool mapped_output, int lanes = 1) {
    Overlapped o;
    o.init(want, mapped_output, lanes);
    unsigned char* out = mapped_output ? h_out : p_out;
    unsigned char* in = p_in;
    cudaGraphExec_t exec[2] = {nullptr, nullptr};
    if (graph) {
        for (int k = 0; k < 2; ++k) {
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(o.work, cudaStreamCaptureModeThreadLocal));
            o.queue(k + 1);
            CHECK(cudaStreamEndCapture(o.work, &g));
            CHECK(cudaGraphInstantiate(&exec[k], g, 0));
            CHECK(cudaGraphDestroy(g));
            CHECK(cudaGraphUpload(exec[k], o.work));
        }
        CHECK(cudaStreamSynchronize(o.work));
    }
    volatile unsigned* hflag;
    CHECK(cudaHostAlloc((void**)&hflag, 64, cudaHostAllocMapped));
    *hflag = 0;
    void* dflag;
    CHECK(cudaHostGetDevicePointer(&dflag, (void*)hflag, 0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<double> wall, gpu;
    bool ok = true;
    for (int f = 0; f < WARMUP + FRAMES; ++f) {
        memset(out, 0xa5, FRAME);
        write_frame(in, f);
        const bool timed = f % 4 == 3;  // a quarter of the frames also give the GPU's span
        auto t = Clock::now();
        if (timed) CHECK(cudaEventRecord(a, o.work));
        if (graph) {
            CHECK(cudaGraphLaunch(exec[f % 2], o.work));
        } else {
            o.queue(f + 1);
        }
        if (timed) CHECK(cudaEventRecord(b, o.work));
        if (flag) {
            CHECK_CU(cuStreamWriteValue32((CUstream)o.work, (CUdeviceptr)dflag, f + 1, 0));
            spin_until(hflag, f + 1, "overlap flag");
        } else {
            CHECK(cudaStreamSynchronize(o.work));
        }
        double us = us_since(t);
        if (f >= WARMUP) {
            if (timed) {
                CHECK(cudaEventSynchronize(b));
                float ms;
                CHECK(cudaEventElapsedTime(&ms, a, b));
                gpu.push_back(ms * 1000);
            } else {
                wall.push_back(us);
            }
        }
        ok = ok && check_out(out, f);
    }
    char name[96];
    snprintf(name, sizeof name, "overlap/%s%s %s, %d segments, %d lanes", graph ? "graph" : "direct",
             mapped_output ? " mapped-out" : "", flag ? "flag" : "sync", o.segments, lanes);
    report(strdup(name), wall, gpu, ok);
    for (auto graph_exec : exec)
        if (graph_exec) CHECK(cudaGraphExecDestroy(graph_exec));
    o.destroy();
    CHECK(cudaFreeHost((void*)hflag));
}

// Whether stream memory operations (cuStreamWriteValue32, cuStreamWaitValue32) can be captured
// into a graph on this driver.
static bool graphs_capture_mem_ops() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned* w;
    CHECK(cudaMalloc(&w, 4));
    CHECK(cudaMemset(w, 0, 4));
    cudaGraph_t g = nullptr;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUresult write = cuStreamWriteValue32((CUstream)s, (CUdeviceptr)w, 1, 0);
    CUresult wait = cuStreamWaitValue32((CUstream)s, (CUdeviceptr)w, 1, CU_STREAM_WAIT_VALUE_EQ);
    cudaError_t end = cudaStreamEndCapture(s, &g);
    (void)cudaGetLastError();
    bool ok = write == CUDA_SUCCESS && wait == CUDA_SUCCESS && end == cudaSuccess;
    printf("graph capture of stream memory operations: write %d, wait %d, end %d: %s\n", (int)write, (int)wait,
           (int)end, ok ? "supported" : "NOT supported, graph rows skipped");
    if (g) CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(w));
    CHECK(cudaStreamDestroy(s));
    return ok;
}

// `frame_latency [GROUP]` runs only the rows of GROUP (mapped, resident, overlap, lanes).
// `BAND=256 TILES=48,64` in the environment: bands of 256 pixels, and the mapped and resident
// rows at about those tile counts (instead of 0.5, 1 and 2 tiles per SM); build with
// `-DCHUNK=8` for another chunk.
int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : nullptr;
    if (const char* band = getenv("BAND")) BAND = atoi(band);
    std::vector<int> tiles;
    if (const char* list = getenv("TILES"))
        for (const char* at = list; *at; ) { tiles.push_back(atoi(at)); while (*at && *at != ',') ++at; if (*at) ++at; }
    auto runs = [&](const char* group) { return only == nullptr || strcmp(only, group) == 0; };
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    SMS = prop.multiProcessorCount;
    CHECK(cudaFuncSetAttribute(gaussian_u8, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    CHECK(cudaFuncSetAttribute(gaussian_u8_overlap, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    CHECK(cudaFuncSetAttribute(resident, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    const bool graphs = graphs_capture_mem_ops();
    const int sizes[2][2] = {{1920, 1080}, {3840, 2160}};
    for (auto& size : sizes) {
        W = size[0];
        H = size[1];
        FRAME = (size_t)W * H * 3;
        FRAMES = W > 1920 ? 150 : 300;
        printf("== %dx%d RGB (%zu bytes), %s, %d SMs, %d frames, band %d, CHUNK %d\n", W, H, FRAME, prop.name, SMS, FRAMES, BAND, CHUNK);
        CHECK(cudaHostAlloc((void**)&h_in, FRAME, cudaHostAllocMapped));
        CHECK(cudaHostAlloc((void**)&h_out, FRAME, cudaHostAllocMapped));
        CHECK(cudaHostAlloc((void**)&p_in, FRAME, 0));
        CHECK(cudaHostAlloc((void**)&p_out, FRAME, 0));
        for (int k = 0; k < 2; ++k) {
            h_src[k] = (unsigned char*)malloc(FRAME);
            h_ref[k] = (unsigned char*)malloc(FRAME);
            fill_random(h_src[k], W + k);
        }
        CHECK(cudaMalloc(&d_in, FRAME));
        CHECK(cudaMalloc(&d_out, FRAME));
        {
            Plan p = plan(1.0, 0);
            unsigned* t;
            CHECK(cudaMalloc(&t, p.table.size() * 4));
            CHECK(cudaMemcpy(t, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
            reference(p, t);
            CHECK(cudaFree(t));
        }
        std::vector<double> shares = {0.5, 1.0, 2.0};
        if (!tiles.empty()) { shares.clear(); for (int t : tiles) shares.push_back((double)t / SMS); }
        for (double share : shares) {
            if (!runs("mapped")) break;
            mapped_launch(share, false);
            mapped_launch(share, true);
        }
        std::vector<double> resident_shares = {1.0, 2.0};
        if (!tiles.empty()) resident_shares = shares;
        for (double share : resident_shares) {
            if (runs("resident")) mapped_resident(share);
        }
        const int segments[] = {1, 3, 6, 12, 16, 24};
        if (runs("overlap")) {
            for (int s : segments) overlap(s, false, false, false);
            for (int s : {6, 12}) overlap(s, false, false, true);
        }
        if (runs("overlap") || runs("lanes")) {
            for (int lanes : {1, 2, 3, 4}) {
                for (int s : {6, 12, 16, 24, 32}) overlap(s, false, false, false, lanes);
                for (int s : {6, 12, 24}) overlap(s, false, false, true, lanes);
            }
        }
        if (runs("overlap") && graphs) {
            for (int s : segments) {
                overlap(s, true, false, false);
                overlap(s, true, true, false);
            }
            for (int s : {6, 12}) overlap(s, true, true, true);
        }
        CHECK(cudaFreeHost(h_in));
        CHECK(cudaFreeHost(h_out));
        CHECK(cudaFreeHost(p_in));
        CHECK(cudaFreeHost(p_out));
        CHECK(cudaFree(d_in));
        CHECK(cudaFree(d_out));
        for (int k = 0; k < 2; ++k) {
            free(h_src[k]);
            free(h_ref[k]);
        }
    }
    return 0;
}
