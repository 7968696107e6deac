//! The benchmark's one seeded random generator: SplitMix64 (Steele, Lea and Flood, 2014).
//!
//! Every measurement runs on fresh random data, never zeros or a constant: a kernel that
//! skipped its work, or a copy that moved nothing, would otherwise pass its check. SplitMix64 is
//! small, fast, needs no dependency, and any seed (0 included) gives a full-period stream, so a
//! data set can be filled in parallel from one seed by giving each part a seed of its own.

/// SplitMix64: a 64-bit state advanced by a constant and scrambled on the way out.
///
/// # Examples
/// ```
/// use hetmem_bench::random::SplitMix64;
///
/// let mut rng = SplitMix64::new(7);
/// let mut again = SplitMix64::new(7);
/// assert_eq!(rng.next_u64(), again.next_u64());
/// let mut bytes = [0u8; 13];
/// rng.fill_bytes(&mut bytes);
/// assert!(bytes.iter().any(|&byte| byte != bytes[0]));
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

/// The golden-ratio increment of SplitMix64, also used to spread the seeds of parallel parts.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// The stream of `seed`: the same seed gives the same stream.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A stream seeded by [`fresh_seed`]: different data every run.
    pub fn fresh() -> SplitMix64 {
        SplitMix64::new(fresh_seed())
    }

    /// The seed of part `index` of a stream seeded `seed` (a chunk filled by its own thread).
    pub const fn part(seed: u64, index: u64) -> SplitMix64 {
        SplitMix64::new(seed ^ index.wrapping_mul(GOLDEN_GAMMA))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `bytes` with random bytes, eight from each word (little-endian), the last word cut
    /// to what is left.
    pub fn fill_bytes(&mut self, bytes: &mut [u8]) {
        for word in bytes.chunks_mut(8) {
            word.copy_from_slice(&self.next_u64().to_le_bytes()[..word.len()]);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        self.fill_bytes(&mut bytes);
        bytes
    }
}

/// A seed that differs from run to run and from process to process: the wall clock's
/// nanoseconds and the process id. Never 0.
pub fn fresh_seed() -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |time| time.as_nanos());
    ((nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_splitmix64() {
        // The reference outputs of SplitMix64 seeded 1234567 (Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(1_234_567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn bytes_are_the_words_little_endian_and_a_part_is_its_own_stream() {
        let mut words = SplitMix64::new(99);
        let mut bytes = SplitMix64::new(99);
        let mut got = [0u8; 11];
        bytes.fill_bytes(&mut got);
        let (first, second) = (words.next_u64().to_le_bytes(), words.next_u64().to_le_bytes());
        assert_eq!(&got[..8], &first);
        assert_eq!(&got[8..], &second[..3]);
        assert_eq!(SplitMix64::part(99, 0).next_u64(), SplitMix64::new(99).next_u64());
        assert_ne!(SplitMix64::part(99, 1).next_u64(), SplitMix64::new(99).next_u64());
        assert_ne!(fresh_seed(), 0);
    }
}
