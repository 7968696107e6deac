// Two sums over the 32-bit little-endian words of a byte range, added into sums[2 * pair] and
// sums[2 * pair + 1] (mod 2^64): the plain sum of the words, and the sum of each word times its
// position in its file plus one. The second changes when words move, so a chunk that lands at
// the wrong offset shows; both are order-free, so chunks may be summed in any order. A last
// partial word is zero-padded.
//
// The stage `hetmem load --stage checksum` runs on each chunk of a file, reading it where it
// lies (pinned staging memory or a registered window of the page cache); the CPU computes the
// same sums (`ops::checksum_cpu`) to verify it.

extern "C" __global__ void checksum_words(const unsigned char* __restrict__ base,
                                          unsigned long long byte_offset,
                                          unsigned long long n_bytes,
                                          unsigned long long first_word,
                                          unsigned long long* __restrict__ sums,
                                          unsigned long long pair) {
    const unsigned int* words = (const unsigned int*)(base + byte_offset);
    const unsigned long long n_words = n_bytes / 4;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long sum = 0, weighted = 0;
    for (unsigned long long i = first; i < n_words; i += stride) {
        const unsigned long long word = words[i];
        sum += word;
        weighted += word * (first_word + i + 1);
    }
    if (first == 0 && n_bytes % 4 != 0) {
        unsigned long long word = 0;
        for (unsigned long long b = 0; b < n_bytes % 4; ++b) {
            word |= (unsigned long long)base[byte_offset + n_words * 4 + b] << (8 * b);
        }
        sum += word;
        weighted += word * (first_word + n_words + 1);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
        weighted += __shfl_down_sync(0xffffffffu, weighted, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sums[2 * pair], sum);
        atomicAdd(&sums[2 * pair + 1], weighted);
    }
}
