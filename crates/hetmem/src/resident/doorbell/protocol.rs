//! The doorbell's wire protocol: the layout of the shared memory in 32-bit words (as in
//! kernels/doorbell.cu), how a request is written into a slot and a reply read back, and the
//! CPU reference of each request's arithmetic.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{DoorbellStop, Error, Result};

/// The most samples one request carries (4 KiB of f32).
pub const MAX_SAMPLES: usize = 1024;
/// The most FIR taps one request carries.
pub const MAX_TAPS: usize = 64;
/// The most requests a doorbell queues.
pub const MAX_DEPTH: usize = 256;

// The layout in 32-bit words, as in kernels/doorbell.cu.
pub(super) const STOP: usize = 0;
pub(super) const STARTED: usize = 1;
pub(super) const EXITED: usize = 2;
pub(super) const CONTROL_WORDS: usize = 32;
pub(super) const SLOT_WORDS: usize = 2144;
/// The doorbell word: the sequence number's low 16 bits, the sample count, the opcode; written
/// last, so one read tells the server a request has arrived and what it is.
pub(super) const REQ_SEQ: usize = 0;
pub(super) const SEQ_MASK: u32 = 0xFFFF;
pub(super) const LEN_SHIFT: u32 = 16;
pub(super) const LEN_MASK: u32 = 0x7FF;
pub(super) const OP_SHIFT: u32 = 27;
pub(super) const REQ_TAPS: usize = 3;
pub(super) const REQ_GAIN: usize = 4;
pub(super) const TAPS: usize = 16;
pub(super) const SAMPLES: usize = 80;
pub(super) const REPLY_SEQ: usize = 1104;
pub(super) const REPLY_STATUS: usize = 1105;
pub(super) const REPLY_SAMPLES: usize = 1120;

pub(super) const OP_GAIN: u32 = 1;
pub(super) const OP_FIR: u32 = 2;
pub(super) const OP_STALL: u32 = 3;
pub(super) const OP_WEDGE: u32 = 4;

pub(super) const STATUS_DONE: u32 = 0;
/// The server did not know the opcode ([`Error::DoorbellBadReply`]).
pub(super) const STATUS_UNKNOWN: u32 = 1;
pub(super) const STATUS_STOPPED: u32 = 2;

/// Words of the shared memory of a doorbell queueing `depth` requests.
pub(super) fn words_for(depth: usize) -> usize {
    CONTROL_WORDS + depth * SLOT_WORDS
}

/// The first word of the slot request `seq` (from 1) uses.
pub(super) fn slot_base(depth: usize, seq: u64) -> usize {
    CONTROL_WORDS + slot_index(depth, seq) * SLOT_WORDS
}

/// The slot request `seq` (from 1) uses.
pub(super) fn slot_index(depth: usize, seq: u64) -> usize {
    (seq - 1) as usize % depth
}

/// A small request for the doorbell.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Request<'a> {
    /// `y[i] = gain * x[i]`.
    Gain {
        /// The factor.
        gain: f32,
        /// The samples (1 to [`MAX_SAMPLES`]).
        samples: &'a [f32],
    },
    /// `y[i] = sum over j of taps[j] * x[i - j]`, samples before the block taken as 0.
    Fir {
        /// The taps (1 to [`MAX_TAPS`]).
        taps: &'a [f32],
        /// The samples (1 to [`MAX_SAMPLES`]).
        samples: &'a [f32],
    },
    /// Feature `testing` only: the server spins until shut down and never replies, so the
    /// watchdog fires.
    #[cfg(feature = "testing")]
    Stall,
    /// Feature `testing` only: the server spins for `millis` milliseconds and ignores shutdown
    /// meanwhile, like a kernel that is stuck.
    #[cfg(feature = "testing")]
    Wedge {
        /// How long.
        millis: u32,
    },
}

impl Request<'_> {
    pub(super) fn samples(&self) -> &[f32] {
        match self {
            Request::Gain { samples, .. } | Request::Fir { samples, .. } => samples,
            #[cfg(feature = "testing")]
            Request::Stall | Request::Wedge { .. } => &[],
        }
    }

    pub(super) fn check(&self) -> Result<()> {
        let samples = self.samples().len();
        #[cfg(feature = "testing")]
        let test_only = matches!(self, Request::Stall | Request::Wedge { .. });
        #[cfg(not(feature = "testing"))]
        let test_only = false;
        if !test_only && !(1..=MAX_SAMPLES).contains(&samples) {
            return Err(Error::invalid("doorbell request", format!("{samples} samples: 1 to {MAX_SAMPLES}")));
        }
        if let Request::Fir { taps, .. } = self
            && !(1..=MAX_TAPS).contains(&taps.len())
        {
            return Err(Error::invalid("doorbell request", format!("{} taps: 1 to {MAX_TAPS}", taps.len())));
        }
        Ok(())
    }

    /// The reply computed on the CPU, exactly as the kernel computes it (bit for bit).
    pub fn reference(&self) -> Vec<f32> {
        match *self {
            Request::Gain { gain, samples } => gain_of(gain, samples),
            Request::Fir { taps, samples } => fir_of(taps, samples),
            #[cfg(feature = "testing")]
            Request::Stall | Request::Wedge { .. } => Vec::new(),
        }
    }

    /// Writes the request into the slot at `base` as request `seq`: the body first, the
    /// doorbell word that hands the slot to the server last (release), so the server never
    /// sees a half-written request.
    pub(super) fn write(&self, words: &[AtomicU32], base: usize, seq: u64) {
        let (op, taps, gain) = match *self {
            Request::Gain { gain, .. } => (OP_GAIN, &[][..], gain),
            Request::Fir { taps, .. } => (OP_FIR, taps, 0.0),
            #[cfg(feature = "testing")]
            Request::Stall => (OP_STALL, &[][..], 0.0),
            #[cfg(feature = "testing")]
            Request::Wedge { millis } => (OP_WEDGE, &[][..], f32::from_bits(millis)),
        };
        let samples = self.samples();
        words[base + REQ_TAPS].store(taps.len() as u32, Ordering::Relaxed);
        words[base + REQ_GAIN].store(gain.to_bits(), Ordering::Relaxed);
        for (word, tap) in words[base + TAPS..].iter().zip(taps) {
            word.store(tap.to_bits(), Ordering::Relaxed);
        }
        for (word, sample) in words[base + SAMPLES..].iter().zip(samples) {
            word.store(sample.to_bits(), Ordering::Relaxed);
        }
        let bell = (seq as u32 & SEQ_MASK) | ((samples.len() as u32) << LEN_SHIFT) | (op << OP_SHIFT);
        words[base + REQ_SEQ].store(bell, Ordering::Release);
    }
}

/// The reply to request `seq` of `len` samples in the slot at `base`, if it has arrived.
pub(super) fn read_reply(words: &[AtomicU32], base: usize, seq: u64, len: usize) -> Option<Result<Vec<f32>>> {
    if words[base + REPLY_SEQ].load(Ordering::Acquire) != seq as u32 {
        return None;
    }
    Some(match words[base + REPLY_STATUS].load(Ordering::Relaxed) {
        STATUS_DONE => Ok(words[base + REPLY_SAMPLES..base + REPLY_SAMPLES + len]
            .iter()
            .map(|word| f32::from_bits(word.load(Ordering::Relaxed)))
            .collect()),
        STATUS_STOPPED => Err(Error::DoorbellStopped { cause: DoorbellStop::ShutDown }),
        status => Err(Error::DoorbellBadReply { sequence: seq, status }),
    })
}

pub(super) fn gain_of(gain: f32, samples: &[f32]) -> Vec<f32> {
    samples.iter().map(|&x| gain * x).collect()
}

pub(super) fn fir_of(taps: &[f32], samples: &[f32]) -> Vec<f32> {
    (0..samples.len())
        .map(|i| {
            taps.iter()
                .take(i + 1)
                .enumerate()
                .fold(0.0f32, |acc, (j, &tap)| tap.mul_add(samples[i - j], acc))
        })
        .collect()
}
