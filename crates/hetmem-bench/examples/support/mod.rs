//! Helpers the examples share: fresh non-zero data and a check against the CPU reference.

use std::time::{SystemTime, UNIX_EPOCH};

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

/// Marsaglia's xorshift32: fast, dependency-free, and never yields 0 from a non-zero state,
/// so every generated word is non-zero and differs from the buffers' zeroed contents.
pub struct XorShift32(u32);

impl XorShift32 {
    /// Seeded from the clock, so each run uses fresh data.
    pub fn from_time() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_nanos());
        let seed = (nanos as u32) ^ ((nanos >> 32) as u32) ^ std::process::id();
        XorShift32(if seed == 0 { 0x9E37_79B9 } else { seed })
    }

    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}
