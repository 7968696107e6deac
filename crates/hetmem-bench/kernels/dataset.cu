// The kernel of `hetmem bench dataset`: a 3x3 binomial blur (weights 1 2 1 by 1 2 1, /16,
// rounded half up) of one interleaved 8-bit RGB frame, edges repeated, read from
// `frames + in_offset` and written to `out + out_offset`. The offsets let one launch take any
// frame of a data set held whole in one buffer (mapped host memory, a registered file, or
// device memory) without a buffer per frame: the data set's frame k is at k x frame bytes.
//
// Each block blurs a tile of 128 x 16 pixels. It first stages the tile's 18 rows (with a
// one-pixel border, edges repeated) in shared memory, one warp per row: each row's bytes are
// read with 16-byte loads from 16-byte aligned addresses, and the bytes before the first such
// address and after the last (the row's head and tail) one at a time, so nothing outside the
// row is read. Mapped memory is read across the link in wide requests, and each byte once per
// block (rows shared by two tiles: 18 read for 16 written).

#define TILE_W 128
#define TILE_H 16
// Bytes of a staged row: up to 15 of skew (the row's misalignment, kept so that 16-byte loads
// land 16-byte aligned in shared memory) and (TILE_W + 2) x 3 bytes, rounded up to 16.
#define ROW_PITCH 416

extern "C" __global__ void dataset_blur3_rgb(const unsigned char* __restrict__ frames,
                                             unsigned long long in_offset,
                                             unsigned char* __restrict__ out,
                                             unsigned long long out_offset,
                                             unsigned int width, unsigned int height) {
    __shared__ __align__(16) unsigned char tile[(TILE_H + 2) * ROW_PITCH];
    __shared__ int skews[TILE_H + 2];
    const unsigned char* src = frames + in_offset;
    unsigned char* dst = out + out_offset;
    const int tile_x = (int)(blockIdx.x * TILE_W);
    const int tile_y = (int)(blockIdx.y * TILE_H);
    // The pixels staged of each row: the tile's and its border, inside the frame. Clamping a
    // neighbour's x to the frame lands inside them.
    const int xs = max(tile_x - 1, 0);
    const int xe = min(tile_x + TILE_W + 1, (int)width);
    const int bytes = (xe - xs) * 3;
    const int thread = (int)(threadIdx.y * blockDim.x + threadIdx.x);
    const int warps = (int)(blockDim.x * blockDim.y) / 32;
    const int lane = thread % 32;
    for (int r = thread / 32; r < TILE_H + 2; r += warps) {
        const int y = min(max(tile_y - 1 + r, 0), (int)height - 1);
        const unsigned char* row = src + ((unsigned long long)y * width + xs) * 3;
        const int skew = (int)((unsigned long long)row & 15);
        unsigned char* staged = tile + r * ROW_PITCH + skew;
        // row[head] is the first byte at a 16-byte aligned address (so is staged + head).
        const int head = min((16 - skew) & 15, bytes);
        const int vectors = (bytes - head) / 16;
        const int tail = head + vectors * 16;
        if (lane == 0) {
            skews[r] = skew;
        }
        for (int b = lane; b < head; b += 32) {
            staged[b] = row[b];
        }
        const uint4* from = (const uint4*)(row + head);
        uint4* to = (uint4*)(staged + head);
        for (int v = lane; v < vectors; v += 32) {
            to[v] = from[v];
        }
        for (int b = tail + lane; b < bytes; b += 32) {
            staged[b] = row[b];
        }
    }
    __syncthreads();
    const int x = tile_x + (int)threadIdx.x;
    if (x >= (int)width) {
        return;
    }
    // Each neighbour's byte offset in a staged row, edges repeated.
    const int left = (max(x - 1, 0) - xs) * 3;
    const int centre = (x - xs) * 3;
    const int right = (min(x + 1, (int)width - 1) - xs) * 3;
    for (int ty = (int)threadIdx.y; ty < TILE_H && tile_y + ty < (int)height; ty += (int)blockDim.y) {
        const int y = tile_y + ty;
        for (int c = 0; c < 3; ++c) {
            unsigned int sum = 0;
            for (int dy = 0; dy < 3; ++dy) {
                const unsigned char* row = tile + (ty + dy) * ROW_PITCH + skews[ty + dy] + c;
                const unsigned int wy = dy == 1 ? 2u : 1u;
                sum += wy * (row[left] + 2u * row[centre] + row[right]);
            }
            dst[((unsigned long long)y * width + x) * 3 + c] = (unsigned char)((sum + 8u) >> 4);
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
