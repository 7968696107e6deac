// Separable Gaussian blur of 8-bit planes, built for reading and writing across PCIe.
//
// Each block owns a tile: a band of columns, full rows of it from a range of the plane's
// rows. It walks down its range in chunks of CHUNK rows, keeping the horizontal results of
// the last 2r rows in a shared-memory ring, so every input row of the range crosses the link
// once; only the 2r halo columns of a band and the 2r halo rows of a range are read twice.
// Global reads and writes are 16-byte vectors wherever the row allows, bytes at the ends.
// Each thread issues LOADS_IN_FLIGHT loads before it waits for any, so one chunk costs about
// one round trip over the link, not one per load.
//
// Arithmetic (identical to the CPU path, so the two are bit-exact): Q16 weights summing to
// 65536; horizontal sums rounded to Q8 (<= 65280); vertical sums in 32 bits, rounded to 8 bits.
//
// table (u32): taps weights, then PLANE_WORDS words per plane:
//   offset_lo, offset_hi, width, height, channels, band_px, bands, ranges, range_rows, tile_start

#define CHUNK 16
#define PLANE_WORDS 10
#define MAX_TAPS 65
#define MAX_RING (CHUNK + MAX_TAPS - 1)
#define LOADS_IN_FLIGHT 4

__device__ __forceinline__ int resolve(int index, int len, unsigned int border) {
    if (border == 1) {  // replicate
        return index < 0 ? 0 : (index >= len ? len - 1 : index);
    }
    if (len == 1) {
        return 0;
    }
    int period = 2 * (len - 1);
    int folded = index % period;
    if (folded < 0) {
        folded += period;
    }
    return folded < len ? folded : period - folded;
}

extern "C" __global__ void gaussian_u8(const unsigned char* __restrict__ src,
                                      unsigned char* __restrict__ dst,
                                      const unsigned int* __restrict__ table,
                                      unsigned int plane_count,
                                      unsigned int radius,
                                      unsigned int border) {
    extern __shared__ __align__(16) unsigned char shared[];
    __shared__ unsigned int weights[MAX_TAPS];
    __shared__ unsigned int plane_words[PLANE_WORDS];
    // Per loaded row of a chunk: the byte offset of the row's image part in global memory, and
    // where its first loaded pixel sits in shared memory (keeps 16-byte alignment with global).
    __shared__ long long row_offset[MAX_RING];
    __shared__ int row_base[MAX_RING];

    const int r = (int)radius;
    const int taps = 2 * r + 1;
    const unsigned int* planes = table + taps;

    // Which plane and tile this block owns.
    unsigned int plane = 0;
    for (unsigned int p = 1; p < plane_count; ++p) {
        if (blockIdx.x >= planes[p * PLANE_WORDS + 9]) {
            plane = p;
        }
    }
    if (threadIdx.x < PLANE_WORDS) {
        plane_words[threadIdx.x] = planes[plane * PLANE_WORDS + threadIdx.x];
    }
    for (int k = threadIdx.x; k < taps; k += blockDim.x) {
        weights[k] = table[k];
    }
    __syncthreads();

    const unsigned long long offset =
        (unsigned long long)plane_words[0] | ((unsigned long long)plane_words[1] << 32);
    const int width = (int)plane_words[2];
    const int height = (int)plane_words[3];
    const int channels = (int)plane_words[4];
    const int band_px = (int)plane_words[5];
    const int bands = (int)plane_words[6];
    const int range_rows = (int)plane_words[8];
    const int tile = (int)(blockIdx.x - plane_words[9]);
    const int band = tile % bands;
    const int range = tile / bands;

    const int x0 = band * band_px;
    const int band_width = min(band_px, width - x0);
    const int y0 = range * range_rows;
    const int y1 = min(y0 + range_rows, height);
    if (band_width <= 0 || y0 >= y1) {
        return;
    }
    const long long row_bytes = (long long)width * channels;
    const unsigned char* plane_src = src + offset;
    unsigned char* plane_dst = dst + offset;

    // Loaded columns: [seg_lo, seg_hi) in pixels; the in-image part [a_px, b_px).
    const int seg_lo = x0 - r;
    const int seg_hi = x0 + band_width + r;
    const int a_px = max(seg_lo, 0);
    const int b_px = min(seg_hi, width);
    const int lead = (a_px - seg_lo) * channels;          // halo bytes left of the image part
    const int load_bytes = (b_px - a_px) * channels;       // in-image bytes per row
    const int seg_bytes = (seg_hi - seg_lo) * channels;    // every loaded byte per row
    const int out_bytes = band_width * channels;
    const int halo_px = (seg_hi - seg_lo) - (b_px - a_px);
    const int halo_bytes = halo_px * channels;

    // Shared memory: the input rows of a chunk, then the ring of horizontal results.
    const int in_stride = ((15 + seg_bytes + 16) + 15) & ~15;
    const int ring = CHUNK + 2 * r;
    unsigned char* in_rows = shared;
    unsigned short* mid = (unsigned short*)(shared + (size_t)ring * in_stride);

    int next_virtual = y0 - r;  // the next row (virtual: may lie outside the plane) to load
    for (int yo = y0; yo < y1; yo += CHUNK) {
        const int n_out = min(CHUNK, y1 - yo);
        const int load_end = yo + n_out + r;
        const int n_load = load_end - next_virtual;

        // 0. Where each row to load lives.
        for (int row = threadIdx.x; row < n_load; row += blockDim.x) {
            const int y = resolve(next_virtual + row, height, border);
            const long long at = y * row_bytes + (long long)a_px * channels;
            row_offset[row] = at;
            row_base[row] = (int)(((unsigned long long)(plane_src + at) - (unsigned long long)lead) & 15);
        }
        __syncthreads();

        // 1. Load rows [next_virtual, load_end) into in_rows, 16-byte units, several in flight.
        const int max_units = load_bytes / 16 + 2;
        const int items = n_load * max_units;
        for (int first = threadIdx.x; first < items; first += LOADS_IN_FLIGHT * blockDim.x) {
            uint4 vectors[LOADS_IN_FLIGHT];
#pragma unroll
            for (int k = 0; k < LOADS_IN_FLIGHT; ++k) {
                const int item = first + k * blockDim.x;
                if (item < items) {
                    const int row = item / max_units;
                    const int unit = item - row * max_units;
                    const unsigned char* g = plane_src + row_offset[row];
                    const long long chunk_start = (long long)(((unsigned long long)g & ~15ull) - (unsigned long long)g) + 16ll * unit;
                    if (chunk_start >= 0 && chunk_start + 16 <= load_bytes) {
                        vectors[k] = *(const uint4*)(g + chunk_start);
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < LOADS_IN_FLIGHT; ++k) {
                const int item = first + k * blockDim.x;
                if (item < items) {
                    const int row = item / max_units;
                    const int unit = item - row * max_units;
                    const unsigned char* g = plane_src + row_offset[row];
                    unsigned char* s = in_rows + row * in_stride + row_base[row] + lead;  // s == g (mod 16)
                    const long long chunk_start = (long long)(((unsigned long long)g & ~15ull) - (unsigned long long)g) + 16ll * unit;
                    if (chunk_start >= load_bytes) {
                        continue;
                    }
                    if (chunk_start >= 0 && chunk_start + 16 <= load_bytes) {
                        *(uint4*)(s + chunk_start) = vectors[k];
                    } else {
                        const int lo = (int)max(chunk_start, 0ll);
                        const int hi = (int)min(chunk_start + 16, (long long)load_bytes);
                        for (int i = lo; i < hi; ++i) {
                            s[i] = g[i];
                        }
                    }
                }
            }
        }
        // Border columns outside the plane (edge bands only), read from their mirror pixels.
        if (halo_px > 0) {
            const int left = a_px - seg_lo;
            for (int item = threadIdx.x; item < n_load * halo_bytes; item += blockDim.x) {
                const int row = item / halo_bytes;
                const int k = item - row * halo_bytes;
                const int px_index = k / channels;
                const int ch = k - px_index * channels;
                const int x = px_index < left ? seg_lo + px_index : b_px + (px_index - left);
                const int xr = resolve(x, width, border);
                const long long row_start = row_offset[row] - (long long)a_px * channels;
                in_rows[row * in_stride + row_base[row] + (x - seg_lo) * channels + ch] =
                    plane_src[row_start + (long long)xr * channels + ch];
            }
        }
        __syncthreads();

        // 2. Horizontal pass into the ring, four bytes per thread.
        const int quads = (out_bytes + 3) / 4;
        const int first_slot_loaded = next_virtual - (y0 - r);
        for (int item = threadIdx.x; item < n_load * quads; item += blockDim.x) {
            const int row = item / quads;
            const int j0 = (item - row * quads) * 4;
            const unsigned char* s = in_rows + row * in_stride + row_base[row];
            int slot = (first_slot_loaded + row) % ring;
            unsigned short* out = mid + slot * out_bytes;
            const int j_end = min(j0 + 4, out_bytes);
            for (int j = j0; j < j_end; ++j) {
                unsigned int sum = 0;
                for (int k = 0; k < taps; ++k) {
                    sum += weights[k] * (unsigned int)s[j + k * channels];
                }
                out[j] = (unsigned short)((sum + (1u << 7)) >> 8);
            }
        }
        __syncthreads();

        // 3. Vertical pass: rows [yo, yo + n_out) out to global, 16 bytes at a time.
        const int out_units = out_bytes / 16 + 2;
        for (int item = threadIdx.x; item < n_out * out_units; item += blockDim.x) {
            const int row = item / out_units;
            const int unit = item - row * out_units;
            const int y = yo + row;
            unsigned char* g = plane_dst + y * row_bytes + (long long)x0 * channels;
            const unsigned long long g_addr = (unsigned long long)g;
            const long long chunk_start = (long long)((g_addr & ~15ull) - g_addr) + 16ll * unit;
            if (chunk_start >= out_bytes) {
                continue;
            }
            const int first_slot = (y - y0) % ring;  // the slot of virtual row y - r
            if (chunk_start >= 0 && chunk_start + 16 <= out_bytes) {
                unsigned int sums[16];
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    sums[i] = 1u << 23;
                }
                int slot = first_slot;
                for (int k = 0; k < taps; ++k) {
                    const unsigned short* m = mid + slot * out_bytes + chunk_start;
                    const unsigned int w = weights[k];
#pragma unroll
                    for (int i = 0; i < 16; ++i) {
                        sums[i] += w * (unsigned int)m[i];
                    }
                    slot = slot + 1 == ring ? 0 : slot + 1;
                }
                uint4 packed;
                unsigned int* words = (unsigned int*)&packed;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    words[q] = (sums[4 * q] >> 24) | ((sums[4 * q + 1] >> 24) << 8) |
                               ((sums[4 * q + 2] >> 24) << 16) | ((sums[4 * q + 3] >> 24) << 24);
                }
                *(uint4*)(g + chunk_start) = packed;
            } else {
                const int lo = (int)max(chunk_start, 0ll);
                const int hi = (int)min(chunk_start + 16, (long long)out_bytes);
                for (int i = lo; i < hi; ++i) {
                    unsigned int sum = 1u << 23;
                    int slot = first_slot;
                    for (int k = 0; k < taps; ++k) {
                        sum += weights[k] * (unsigned int)mid[slot * out_bytes + i];
                        slot = slot + 1 == ring ? 0 : slot + 1;
                    }
                    g[i] = (unsigned char)(sum >> 24);
                }
            }
        }
        __syncthreads();
        next_virtual = load_end;
    }
}
