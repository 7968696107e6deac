//! Helpers the examples share: fresh non-zero data and a check against the CPU reference.

use hetmem_bench::random::SplitMix64;

/// An error naming the first word that differs from the reference, if any does.
#[allow(dead_code, reason = "each example compiles this module; the stage examples compare bytes themselves")]
pub fn check(what: &str, got: &[u32], expected: &[u32]) -> Result<(), String> {
    if got.len() != expected.len() {
        return Err(format!("{what}: {} words, expected {}", got.len(), expected.len()));
    }
    match got.iter().zip(expected).position(|(g, e)| g != e) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: word {i} is {:#010x}, the CPU computed {:#010x} ({} of {} words differ)",
            got[i],
            expected[i],
            got.iter().zip(expected).filter(|(g, e)| g != e).count(),
            got.len()
        )),
    }
}

/// Fresh non-zero words from the benchmark's generator ([`SplitMix64`]), seeded from the clock
/// and the process: every word differs from the buffers' zeroed contents.
pub struct FreshWords(SplitMix64);

impl FreshWords {
    /// Seeded from the clock, so each run uses fresh data.
    pub fn from_time() -> Self {
        FreshWords(SplitMix64::fresh())
    }

    pub fn next_u32(&mut self) -> u32 {
        loop {
            let word = (self.0.next_u64() >> 32) as u32;
            if word != 0 {
                return word;
            }
        }
    }
}
