// The kernel of `hetmem bench dataset`: a 3x3 binomial blur (weights 1 2 1 by 1 2 1, /16,
// rounded half up) of one interleaved 8-bit RGB frame, edges repeated, read from
// `frames + in_offset` and written to `out + out_offset`. The offsets let one launch take any
// frame of a data set held whole in one buffer (mapped host memory, a registered file, or
// device memory) without a buffer per frame: the data set's frame k is at k x frame bytes.
//
// Built for frames read and written across PCIe (mapped host memory), where what costs is the
// number and shape of the link's requests, not the arithmetic:
// - Each block blurs a tile of TILE_W x TILE_H pixels. It first stages the tile's rows with a
//   one-pixel border (edges repeated) in shared memory, every byte of them fetched by whole,
//   aligned 16-byte loads, all of a block's loads issued before any is waited for (a thread's
//   share lands in registers first). A vector may take bytes of the neighbouring pixels: they
//   are inside the frame and unused. Only a vector that would cross the frame's first or last
//   byte is read a byte at a time, so nothing outside the frame is read.
// - The results are staged in shared memory too and written as whole, aligned 16-byte stores:
//   a byte store per channel would send the link partial writes (three strided byte stores per
//   warp instruction), which cost several times the bytes they carry. Only the bytes at a tile
//   row's ends that do not fill an aligned vector are stored one at a time (none for 8K frames).
// - Rows shared by two tiles are read twice: TILE_H + 2 read for TILE_H written.

#define TILE_W 128
#define TILE_H 32
#define THREADS 512
// Bytes of a staged input row: up to 15 of skew (the row's misalignment, kept so that aligned
// global vectors land aligned in shared memory) and (TILE_W + 2) x 3 bytes, rounded up to 16.
#define IN_PITCH 416
#define IN_VECTORS (IN_PITCH / 16)
// Bytes of a staged output row: up to 15 of skew and TILE_W x 3 bytes, rounded up to 16.
#define OUT_PITCH 400
#define OUT_VECTORS (OUT_PITCH / 16)
#define IN_ITEMS ((TILE_H + 2) * IN_VECTORS)
#define LOADS_PER_THREAD ((IN_ITEMS + THREADS - 1) / THREADS)

extern "C" __global__ void __launch_bounds__(THREADS) dataset_blur3_rgb(const unsigned char* __restrict__ frames,
                                                                        unsigned long long in_offset,
                                                                        unsigned char* __restrict__ out,
                                                                        unsigned long long out_offset,
                                                                        unsigned int width, unsigned int height) {
    __shared__ __align__(16) unsigned char in_tile[(TILE_H + 2) * IN_PITCH];
    __shared__ __align__(16) unsigned char out_tile[TILE_H * OUT_PITCH];
    const unsigned char* src = frames + in_offset;
    const unsigned char* src_end = src + (unsigned long long)width * height * 3;
    unsigned char* dst = out + out_offset;
    const int tile_x = (int)(blockIdx.x * TILE_W);
    const int tile_y = (int)(blockIdx.y * TILE_H);
    const int rows_out = min(TILE_H, (int)height - tile_y);
    const int staged_rows = rows_out + 2;
    // The pixels staged of each row: the tile's and its border, inside the frame. Clamping a
    // neighbour's x to the frame lands inside them.
    const int xs = max(tile_x - 1, 0);
    const int xe = min(tile_x + TILE_W + 1, (int)width);
    const int in_bytes = (xe - xs) * 3;
    const int thread = (int)(threadIdx.y * blockDim.x + threadIdx.x);

    // Staging. Item i is vector i % IN_VECTORS of staged row i / IN_VECTORS; the vector at
    // shared offset 16 v of a row holds the global aligned 16 bytes at (row start & ~15) + 16 v.
    uint4 loaded[LOADS_PER_THREAD];
#pragma unroll
    for (int k = 0; k < LOADS_PER_THREAD; ++k) {
        const int item = thread + k * THREADS;
        const int r = item / IN_VECTORS;
        const int v = item % IN_VECTORS;
        if (r < staged_rows) {
            const int y = min(max(tile_y - 1 + r, 0), (int)height - 1);
            const unsigned char* row = src + ((unsigned long long)y * width + xs) * 3;
            const unsigned char* g = row - ((unsigned long long)row & 15) + 16 * v;
            if (g < row + in_bytes && g >= src && g + 16 <= src_end) {
                loaded[k] = *(const uint4*)g;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < LOADS_PER_THREAD; ++k) {
        const int item = thread + k * THREADS;
        const int r = item / IN_VECTORS;
        const int v = item % IN_VECTORS;
        if (r < staged_rows) {
            const int y = min(max(tile_y - 1 + r, 0), (int)height - 1);
            const unsigned char* row = src + ((unsigned long long)y * width + xs) * 3;
            const unsigned char* g = row - ((unsigned long long)row & 15) + 16 * v;
            unsigned char* staged = in_tile + r * IN_PITCH + 16 * v;
            if (g < row + in_bytes) {
                if (g >= src && g + 16 <= src_end) {
                    *(uint4*)staged = loaded[k];
                } else {
                    // The frame's first or last vector: only its bytes inside the frame.
                    for (int b = 0; b < 16; ++b) {
                        if (g + b >= src && g + b < src_end) {
                            staged[b] = g[b];
                        }
                    }
                }
            }
        }
    }
    __syncthreads();

    // The blur, into the staged output rows.
    const int x = tile_x + (int)threadIdx.x;
    if (x < (int)width) {
        // Each neighbour's byte offset in a staged row, edges repeated.
        const int left = (max(x - 1, 0) - xs) * 3;
        const int centre = (x - xs) * 3;
        const int right = (min(x + 1, (int)width - 1) - xs) * 3;
        for (int ty = (int)threadIdx.y; ty < rows_out; ty += (int)blockDim.y) {
            const int y = tile_y + ty;
            const int out_skew = (int)((unsigned long long)(dst + ((unsigned long long)y * width + tile_x) * 3) & 15);
            unsigned char* result = out_tile + ty * OUT_PITCH + out_skew + (int)threadIdx.x * 3;
            for (int c = 0; c < 3; ++c) {
                unsigned int sum = 0;
                for (int dy = 0; dy < 3; ++dy) {
                    const int in_y = min(max(tile_y - 1 + ty + dy, 0), (int)height - 1);
                    const unsigned char* in_row = src + ((unsigned long long)in_y * width + xs) * 3;
                    const int in_skew = (int)((unsigned long long)in_row & 15);
                    const unsigned char* row = in_tile + (ty + dy) * IN_PITCH + in_skew + c;
                    const unsigned int wy = dy == 1 ? 2u : 1u;
                    sum += wy * (row[left] + 2u * row[centre] + row[right]);
                }
                result[c] = (unsigned char)((sum + 8u) >> 4);
            }
        }
    }
    __syncthreads();

    // The stores: item i is vector i % OUT_VECTORS of output row i / OUT_VECTORS, aligned as
    // in staging; a vector only partly inside the tile's row is stored byte by byte.
    const int out_bytes = (min(tile_x + TILE_W, (int)width) - tile_x) * 3;
    for (int item = thread; item < rows_out * OUT_VECTORS; item += THREADS) {
        const int r = item / OUT_VECTORS;
        const int v = item % OUT_VECTORS;
        unsigned char* row = dst + ((unsigned long long)(tile_y + r) * width + tile_x) * 3;
        unsigned char* g = row - ((unsigned long long)row & 15) + 16 * v;
        const unsigned char* staged = out_tile + r * OUT_PITCH + 16 * v;
        if (g >= row + out_bytes || g + 16 <= row) {
            continue;
        }
        if (g >= row && g + 16 <= row + out_bytes) {
            *(uint4*)g = *(const uint4*)staged;
        } else {
            for (int b = 0; b < 16; ++b) {
                if (g + b >= row && g + b < row + out_bytes) {
                    g[b] = staged[b];
                }
            }
        }
    }
}

// The sparse pass of `hetmem bench dataset`: the XOR of the 32-bit words of chunk_bytes at
// every stride-th byte of the len bytes at base (chunk k at k x stride, cut at len), folded
// into *out: a kernel that touches chunk_bytes / stride of a data set's bytes (5% by
// default). 16-byte loads (base, chunk_bytes and stride are multiples of 16); a vector that
// runs past len is read a byte at a time, each byte XORed in as a word.
extern "C" __global__ void dataset_sparse_xor(const unsigned char* __restrict__ base, unsigned long long len,
                                              unsigned long long chunk_bytes, unsigned long long stride,
                                              unsigned int* out) {
    const unsigned long long chunks = (len + stride - 1) / stride;
    const unsigned long long per_chunk = chunk_bytes / 16;
    const unsigned long long items = chunks * per_chunk;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += step) {
        const unsigned long long at = (i / per_chunk) * stride + (i % per_chunk) * 16;
        if (at + 16 <= len) {
            const uint4 v = *(const uint4*)(base + at);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        } else {
            for (unsigned long long b = at; b < len; ++b) {
                acc ^= (unsigned int)base[b];
            }
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicXor(out, acc);
    }
}
