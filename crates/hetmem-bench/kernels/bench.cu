// Kernels of `hetmem bench link`: moving bytes across the link with the kernel's own loads and
// stores (zero-copy), and checking that every byte really moved.
//
// Each kernel is grid-stride (launched with about SMs x 8 blocks of 512 threads; read+write
// with SMs / 4, so its reads and writes overlap: link/gpu.rs, copy_blocks) so any size runs
// with one launch. Reads fold every 32-bit word into an XOR checksum that is written to
// device memory and compared with the CPU's: the loads cannot be elided, and a missed or
// repeated word changes the result. Writes store a value computed from the index, which the
// CPU recomputes.

// The value written at 32-bit word `i`: a cheap mix of the index and the seed (never all zero).
__device__ __forceinline__ unsigned int bench_word(unsigned long long i, unsigned int seed) {
    unsigned int x = (unsigned int)i ^ (unsigned int)(i >> 32) * 0x9E3779B9u ^ seed;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

// XOR of a thread's value across the block, added to *out by one atomic per warp.
__device__ __forceinline__ void xor_into(unsigned int value, unsigned int* out) {
    for (int offset = 16; offset > 0; offset /= 2) {
        value ^= __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicXor(out, value);
    }
}

// *out ^= XOR of the n16 16-byte vectors at src: coalesced 16-byte loads.
extern "C" __global__ void bench_read_u4(const uint4* __restrict__ src, unsigned long long n16,
                                         unsigned int* out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    xor_into(acc, out);
}

// dst[i] = bench_word(i, seed) for the n16 * 4 words at dst: coalesced 16-byte stores.
extern "C" __global__ void bench_write_u4(uint4* __restrict__ dst, unsigned long long n16, unsigned int seed) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        const unsigned long long w = i * 4;
        dst[i] = make_uint4(bench_word(w, seed), bench_word(w + 1, seed), bench_word(w + 2, seed),
                            bench_word(w + 3, seed));
    }
}

// dst[i] = src[i] ^ key over n16 16-byte vectors: every byte crosses the link twice, once
// each way, at the same time.
extern "C" __global__ void bench_copy_u4(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                         unsigned long long n16, unsigned int key) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        const uint4 v = src[i];
        dst[i] = make_uint4(v.x ^ key, v.y ^ key, v.z ^ key, v.w ^ key);
    }
}

// *out ^= XOR of the n32 32-bit words at src (n32 a multiple of 32), read in the pitfall's
// pattern: consecutive threads read words 128 bytes apart, so each warp's 32 loads touch 32
// lines and each 4-byte load is its own transaction on the link. Every word is still read once.
extern "C" __global__ void bench_read_strided(const unsigned int* __restrict__ src, unsigned long long n32,
                                              unsigned int* out) {
    const unsigned long long lines = n32 / 32;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; g < n32; g += stride) {
        acc ^= src[(g % lines) * 32 + g / lines];
    }
    xor_into(acc, out);
}

// The 16-byte vector that random read `i` of a cell loads: a 64-bit mix of the read's index
// and the seed, reduced to one of n16 vectors (the same mix as the CPU's check, link/words.rs).
__device__ __forceinline__ unsigned long long bench_random_index(unsigned long long i, unsigned int seed,
                                                                 unsigned long long n16) {
    unsigned long long x = i ^ ((unsigned long long)seed << 32);
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x % n16;
}

// *out ^= XOR of n16 16-byte vectors at src, each loaded from a random place in the n16: every
// load a page apart from its neighbours', so the GPU's address translation (its TLB for host
// pages: 4 KiB, 2 MiB or 1 GiB) is what the rate depends on.
extern "C" __global__ void bench_read_random(const uint4* __restrict__ src, unsigned long long n16,
                                             unsigned int seed, unsigned int* out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        const uint4 v = src[bench_random_index(i, seed, n16)];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    xor_into(acc, out);
}
