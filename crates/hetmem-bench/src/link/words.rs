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

/// The 16-byte vector random read `i` loads, of `n16` (kernels/bench.cu's
/// `bench_random_index`).
pub(crate) fn random_index(i: u64, seed: u32, n16: u64) -> u64 {
    let mut x = i ^ (u64::from(seed) << 32);
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^= x >> 33;
    x % n16
}

/// The XOR of the words `bench_read_random` loads from the `words.len() / 4` vectors of
/// `words`: what it computes.
pub(crate) fn random_read_checksum(words: &[u32], seed: u32) -> u32 {
    use rayon::prelude::*;
    let n16 = (words.len() / 4) as u64;
    (0..n16)
        .into_par_iter()
        .map(|i| {
            let at = random_index(i, seed, n16) as usize * 4;
            words[at] ^ words[at + 1] ^ words[at + 2] ^ words[at + 3]
        })
        .reduce(|| 0, |a, b| a ^ b)
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
