// The kernel of `hetmem bench dataset`: a 3x3 binomial blur (weights 1 2 1 by 1 2 1, /16,
// rounded half up) of one interleaved 8-bit RGB frame, edges repeated, read from
// `frames + in_offset` and written to `out + out_offset`. The offsets let one launch take any
// frame of a data set held whole in one buffer (mapped host memory, a registered file, or
// device memory) without a buffer per frame: the data set's frame k is at k x frame bytes.
//
// Each 32x8 block stages its pixels and a one-pixel border (34x10 pixels, 3 bytes each) in
// shared memory, so every byte read across the link is read once per block, by consecutive
// threads (coalesced), whatever memory holds the frame.

#define TILE_W 32
#define TILE_H 8

extern "C" __global__ void dataset_blur3_rgb(const unsigned char* __restrict__ frames,
                                             unsigned long long in_offset,
                                             unsigned char* __restrict__ out,
                                             unsigned long long out_offset,
                                             unsigned int width, unsigned int height) {
    __shared__ unsigned char tile[(TILE_H + 2) * (TILE_W + 2) * 3];
    const unsigned char* src = frames + in_offset;
    unsigned char* dst = out + out_offset;
    const int x0 = (int)(blockIdx.x * TILE_W) - 1;
    const int y0 = (int)(blockIdx.y * TILE_H) - 1;
    const int row_bytes = (TILE_W + 2) * 3;
    const int threads = TILE_W * TILE_H;
    const int thread = threadIdx.y * TILE_W + threadIdx.x;
    for (int i = thread; i < (TILE_H + 2) * row_bytes; i += threads) {
        const int ty = i / row_bytes;
        const int tb = i % row_bytes;
        const int x = min(max(x0 + tb / 3, 0), (int)width - 1);
        const int y = min(max(y0 + ty, 0), (int)height - 1);
        tile[i] = src[((unsigned long long)y * width + x) * 3 + tb % 3];
    }
    __syncthreads();
    const unsigned int x = blockIdx.x * TILE_W + threadIdx.x;
    const unsigned int y = blockIdx.y * TILE_H + threadIdx.y;
    if (x >= width || y >= height) {
        return;
    }
    for (int c = 0; c < 3; ++c) {
        unsigned int sum = 0;
        for (int dy = 0; dy < 3; ++dy) {
            const unsigned char* row = tile + (threadIdx.y + dy) * row_bytes + threadIdx.x * 3 + c;
            const unsigned int wy = dy == 1 ? 2u : 1u;
            sum += wy * (row[0] + 2u * row[3] + row[6]);
        }
        dst[((unsigned long long)y * width + x) * 3 + c] = (unsigned char)((sum + 8u) >> 4);
    }
}
