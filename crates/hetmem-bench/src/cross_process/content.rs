//! What the producer puts in each frame, the same in both rings: a seeded base frame, written
//! into each slot on its first use, and a stamp over the frame's first bytes written for every
//! frame (its index, then bytes seeded by the index). Either side can rebuild any frame from
//! the seed and the index, so the consumer checks that each frame arrived once, in order, as
//! written, and the CPU blur of a rebuilt frame checks a sample of outputs.

use crate::random::SplitMix64;

/// The bytes stamped into every frame: its index (eight bytes, little-endian), then seeded
/// bytes. 4 KiB is a real write for the producer (a frame header, a line of a sensor's
/// output) that costs it about a microsecond, so the transport is what is measured.
pub const STAMP_BYTES: usize = 4096;

/// Keeps the stamps' stream apart from the base frame's.
const STAMP_SALT: u64 = 0x5354_414d_505f_5f5f;

/// The frames of one run: a base frame and each frame's stamp, from one seed.
#[derive(Debug, Clone)]
pub struct FrameContent {
    seed: u64,
    base: Vec<u8>,
}

impl FrameContent {
    /// The frames of `frame_bytes` bytes (at least 8: a stamp holds the index) seeded `seed`.
    pub fn new(seed: u64, frame_bytes: usize) -> FrameContent {
        FrameContent { seed, base: SplitMix64::new(seed).bytes(frame_bytes) }
    }

    /// The base frame, written into each slot on its first use.
    pub fn base(&self) -> &[u8] {
        &self.base
    }

    /// The bytes a stamp covers: [`STAMP_BYTES`], or the whole frame if smaller.
    pub fn stamp_len(&self) -> usize {
        STAMP_BYTES.min(self.base.len())
    }

    /// Writes frame `index`'s stamp into `out` ([`FrameContent::stamp_len`] bytes).
    pub fn stamp(&self, index: u64, out: &mut [u8]) {
        let (head, rest) = out.split_at_mut(8);
        head.copy_from_slice(&index.to_le_bytes());
        SplitMix64::part(self.seed ^ STAMP_SALT, index).fill_bytes(rest);
    }

    /// The index a stamp carries.
    pub fn index_of(stamp: &[u8]) -> u64 {
        u64::from_le_bytes(stamp[..8].try_into().expect("a stamp holds eight bytes of index"))
    }

    /// Frame `index` whole: the base with its stamp.
    pub fn frame(&self, index: u64) -> Vec<u8> {
        let mut frame = self.base.clone();
        let len = self.stamp_len();
        self.stamp(index, &mut frame[..len]);
        frame
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`, one clock for every process on the machine: the
/// producer's publish and the consumer's result are timed on it.
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_base_with_its_own_stamp() {
        let content = FrameContent::new(42, 10_000);
        let (first, second) = (content.frame(7), content.frame(8));
        assert_eq!(FrameContent::index_of(&first), 7);
        assert_eq!(FrameContent::index_of(&second), 8);
        assert_ne!(first[8..STAMP_BYTES], second[8..STAMP_BYTES]);
        assert_eq!(first[STAMP_BYTES..], content.base()[STAMP_BYTES..]);
        assert_ne!(first[..STAMP_BYTES], content.base()[..STAMP_BYTES]);
        assert_eq!(FrameContent::new(42, 10_000).frame(7), first, "the seed decides the frames");
        assert_eq!(FrameContent::new(43, 100).stamp_len(), 100);
    }
}
