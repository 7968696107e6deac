//! The cells' data: random words, the XOR checksum the read kernels compute, and the pattern
//! the write kernel stores.

use crate::random::SplitMix64;

/// Fills `words` with random data from `seed` (in parallel, one stream per 1 MiB chunk).
pub(crate) fn fill_random(words: &mut [u32], seed: u64) {
    use rayon::prelude::*;
    words.par_chunks_mut(1 << 18).enumerate().for_each(|(chunk, words)| {
        let mut rng = SplitMix64::part(seed, chunk as u64);
        for word in words {
            *word = (rng.next_u64() >> 32) as u32;
        }
    });
}

/// The XOR of every word: what the read kernels compute.
pub(crate) fn xor_checksum(words: &[u32]) -> u32 {
    use rayon::prelude::*;
    words.par_chunks(1 << 18).map(|chunk| chunk.iter().fold(0, |acc, &w| acc ^ w)).reduce(|| 0, |a, b| a ^ b)
}

/// The word `bench_write_u4` stores at index `i` (kernels/bench.cu's `bench_word`).
pub(crate) fn bench_word(i: u64, seed: u32) -> u32 {
    let mut x = (i as u32) ^ ((i >> 32) as u32).wrapping_mul(0x9E37_79B9) ^ seed;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    x
}

/// The first index where `words` differs from `bench_word(i, seed)`.
pub(crate) fn first_pattern_mismatch(words: &[u32], seed: u32) -> Option<usize> {
    use rayon::prelude::*;
    words.par_iter().enumerate().position_first(|(i, &word)| word != bench_word(i as u64, seed))
}
