// dataset_blur3_rgb (crates/hetmem-bench/kernels/dataset.cu) run on the CPU, its text as it
// is, every thread of a block in turn, phase by phase (a __syncthreads ends a thread's phase;
// the phases before it are run again, writing what they wrote before), under AddressSanitizer
// (the shared tiles are globals here: an index past either one is an overflow). Each global
// load and store is checked to lie inside the frame and to be aligned; each output byte must be
// written once, with the blur of a CPU reference. Frames of many widths and heights, the first,
// a middle or the last frame of a buffer that starts at a random alignment, the output at one
// too. Run by dataset_blur_emulate.py (which makes the kernel's text into kernel_body.inc).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <random>
struct uint4 { unsigned int x, y, z, w; };
struct dim3 { unsigned int x = 0, y = 0, z = 0; };
static dim3 threadIdx, blockIdx, blockDim;
static int sync_target, sync_count;
struct PhaseDone {};
static void sync_block() { if (sync_count++ == sync_target) throw PhaseDone{}; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static const unsigned char *g_src, *g_src_end; static unsigned char *g_dst, *g_dst_end;
static std::vector<int> writes; static long bad = 0;
#define FAIL(...) do { if (bad++ < 20) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr);} } while (0)
static uint4 load16(const unsigned char* g) {
  if (g < g_src || g + 16 > g_src_end || ((uintptr_t)g & 15)) FAIL("load16 out of frame/misaligned: %ld", (long)(g - g_src));
  uint4 v; memcpy(&v, g, 16); return v;
}
static unsigned char load1(const unsigned char* g) {
  if (g < g_src || g >= g_src_end) FAIL("load1 out of frame: %ld", (long)(g - g_src));
  return *g;
}
static void mark(unsigned char* g) {
  if (g < g_dst || g >= g_dst_end) { FAIL("store out of frame: %ld", (long)(g - g_dst)); return; }
  writes[g - g_dst]++;
}
static void store16(unsigned char* g, uint4 v) {
  if ((uintptr_t)g & 15) FAIL("store16 misaligned");
  for (int b = 0; b < 16; ++b) mark(g + b);
  if (g >= g_dst && g + 16 <= g_dst_end) memcpy(g, &v, 16);
}
static void store1(unsigned char* g, unsigned char v) { mark(g); if (g >= g_dst && g < g_dst_end) *g = v; }
#include "kernel_body.inc"  // made by dataset_blur_emulate.py
int main(int argc, char** argv) {
  std::mt19937_64 rng(argc > 1 ? atoll(argv[1]) : 1);
  std::vector<std::pair<int,int>> sizes;
  int ws[] = {1,2,3,4,5,6,15,16,17,21,37,42,85,126,127,128,129,130,131,170,255,256,257,258,301,383,384,385};
  int hs[] = {1,2,3,4,31,32,33,34,37,63,64,65};
  long runs = 0;
  for (int w : ws) for (int h : hs) for (int rep = 0; rep < 3; ++rep) {
    int frames = 3; int which = rep;  // first, middle, last frame of the buffer
    size_t fb = (size_t)w * h * 3;
    int in_skew = rng() % 16, out_skew = rng() % 16;
    size_t in_len = in_skew + fb * frames;
    unsigned char* in_alloc = (unsigned char*)aligned_alloc(16, (in_len + 15) / 16 * 16);
    for (size_t i = 0; i < in_len; ++i) in_alloc[i] = rng();
    unsigned char* frames_base = in_alloc + in_skew;  // `frames`: any alignment
    unsigned long long in_offset = (unsigned long long)which * fb;
    size_t out_len = out_skew + fb;
    unsigned char* out_alloc = (unsigned char*)aligned_alloc(16, (out_len + 15) / 16 * 16 + 16);
    memset(out_alloc, 0xA5, (out_len + 15) / 16 * 16 + 16);
    unsigned char* out = out_alloc + out_skew;
    g_src = frames_base + in_offset; g_src_end = g_src + fb; g_dst = out; g_dst_end = out + fb;
    writes.assign(fb, 0);
    blockDim.x = 128; blockDim.y = 4;
    unsigned gx = (w + 127) / 128, gy = (h + 31) / 32;
    for (unsigned by = 0; by < gy; ++by) for (unsigned bx = 0; bx < gx; ++bx) {
      blockIdx.x = bx; blockIdx.y = by;
      for (int phase = 0; phase < 3; ++phase) {
        for (unsigned ty = 0; ty < 4; ++ty) for (unsigned tx = 0; tx < 128; ++tx) {
          threadIdx.x = tx; threadIdx.y = ty; sync_target = phase; sync_count = 0;
          try { dataset_blur3_rgb(frames_base, in_offset, out, 0, w, h); } catch (PhaseDone&) {}
        }
      }
    }
    // reference
    const unsigned char* s = g_src;
    for (int y = 0; y < h; ++y) for (int x = 0; x < w; ++x) for (int c = 0; c < 3; ++c) {
      unsigned sum = 0;
      for (int dy = -1; dy <= 1; ++dy) for (int dx = -1; dx <= 1; ++dx) {
        int yy = std::min(std::max(y + dy, 0), h - 1), xx = std::min(std::max(x + dx, 0), w - 1);
        unsigned wgt = (dy == 0 ? 2 : 1) * (dx == 0 ? 2 : 1);
        sum += wgt * s[((size_t)yy * w + xx) * 3 + c];
      }
      size_t i = ((size_t)y * w + x) * 3 + c;
      unsigned char want = (sum + 8) >> 4;
      if (out[i] != want) FAIL("%dx%d skews %d/%d frame %d: byte %zu is %d, want %d", w, h, in_skew, out_skew, which, i, out[i], want);
      if (writes[i] != 1) FAIL("%dx%d: byte %zu written %d times", w, h, i, writes[i]);
    }
    for (int i = 0; i < out_skew; ++i) if (out_alloc[i] != 0xA5) FAIL("wrote before out");
    for (size_t i = out_skew + fb; i < (out_len + 15) / 16 * 16 + 16; ++i) if (out_alloc[i] != 0xA5) FAIL("wrote after out");
    free(in_alloc); free(out_alloc); runs++;
  }
  printf("%ld runs, %ld failures\n", runs, bad);
  return bad != 0;
}
