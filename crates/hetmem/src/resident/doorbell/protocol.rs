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
/// A request or reply line: 128 bytes, four 32-byte sectors, each starting with the sequence
/// word. The side that writes a line writes each sector's payload before its sequence word, and
/// a line is taken only when all four sequence words are new, so one read of the line (which
/// may come as four sector reads at different times) never passes for a torn one.
pub(super) const LINE_WORDS: usize = 32;
pub(super) const SECTOR_WORDS: usize = 8;
pub(super) const SLOT_WORDS: usize = 2176;
/// The request line, at the slot's start. Its sequence word is the doorbell word: the
/// sequence number's low 16 bits, the sample count, the opcode, so one read tells the server a
/// request has arrived, what it is and, when it is small, all of it.
pub(super) const REQ_LINE: usize = 0;
pub(super) const SEQ_MASK: u32 = 0xFFFF;
pub(super) const LEN_SHIFT: u32 = 16;
pub(super) const LEN_MASK: u32 = 0x7FF;
pub(super) const OP_SHIFT: u32 = 27;
/// Words of the request line: the tap count, the gain (f32 bits).
pub(super) const REQ_TAPS: usize = 1;
pub(super) const REQ_GAIN: usize = 2;
/// The request line's payload words (the rest of words 3..32, sequence words aside) carry
/// the taps, then the samples, when they fit: 26 words.
const REQ_PAYLOAD_FROM: usize = 3;
pub(super) const INLINE_REQUEST_WORDS: usize = 26;
/// Where taps and samples go when they do not fit the line.
pub(super) const TAPS: usize = 32;
pub(super) const SAMPLES: usize = 96;
/// The reply line: the full sequence number in each sector's first word, the status in word 1,
/// the samples in the rest when there are at most 27.
pub(super) const REPLY_LINE: usize = 1120;
pub(super) const REPLY_STATUS: usize = 1;
const REPLY_PAYLOAD_FROM: usize = 2;
pub(super) const INLINE_REPLY_WORDS: usize = 27;
/// Where reply samples go when they do not fit the line.
pub(super) const REPLY_SAMPLES: usize = 1152;

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

    /// Writes the request into the slot at `base` as request `seq`: the body first (in the
    /// request line when it fits), the doorbell words that hand the slot to the server last
    /// (release), so the server never sees a half-written request.
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
        let line = base + REQ_LINE;
        words[line + REQ_TAPS].store(taps.len() as u32, Ordering::Relaxed);
        words[line + REQ_GAIN].store(gain.to_bits(), Ordering::Relaxed);
        let values = taps.iter().chain(samples);
        if request_is_inline(taps.len(), samples.len()) {
            for (at, value) in payload_words(REQ_PAYLOAD_FROM).zip(values) {
                words[line + at].store(value.to_bits(), Ordering::Relaxed);
            }
        } else {
            for (word, tap) in words[base + TAPS..].iter().zip(taps) {
                word.store(tap.to_bits(), Ordering::Relaxed);
            }
            for (word, sample) in words[base + SAMPLES..].iter().zip(samples) {
                word.store(sample.to_bits(), Ordering::Relaxed);
            }
        }
        let bell = (seq as u32 & SEQ_MASK) | ((samples.len() as u32) << LEN_SHIFT) | (op << OP_SHIFT);
        publish_line(&words[line..line + LINE_WORDS], bell);
    }
}

/// Whether a request of `taps` taps and `samples` samples travels in its request line.
pub(super) fn request_is_inline(taps: usize, samples: usize) -> bool {
    taps + samples <= INLINE_REQUEST_WORDS
}

/// Whether a reply of `samples` samples travels in its reply line.
pub(super) fn reply_is_inline(samples: usize) -> bool {
    samples <= INLINE_REPLY_WORDS
}

/// The words of a line that carry payload, in order: all but each sector's sequence word and
/// the words before `from`.
pub(super) fn payload_words(from: usize) -> impl Iterator<Item = usize> {
    (from..LINE_WORDS).filter(|at| at % SECTOR_WORDS != 0)
}

/// Hands a line over: each sector's sequence word, last sector first, with release, after
/// everything written before.
pub(super) fn publish_line(line: &[AtomicU32], sequence: u32) {
    for sector in (0..LINE_WORDS / SECTOR_WORDS).rev() {
        line[sector * SECTOR_WORDS].store(sequence, Ordering::Release);
    }
}

/// The line's sequence word, when all four sectors carry the same one (the line is whole).
pub(super) fn line_sequence(line: &[AtomicU32]) -> Option<u32> {
    let first = line[0].load(Ordering::Acquire);
    (1..LINE_WORDS / SECTOR_WORDS)
        .all(|sector| line[sector * SECTOR_WORDS].load(Ordering::Acquire) == first)
        .then_some(first)
}

/// The taps and samples of the request in the slot at `base` whose doorbell word is `bell`
/// (the server's side; the kernel does the same). The counts are clamped as the kernel clamps
/// them.
pub(super) fn read_request(words: &[AtomicU32], base: usize, bell: u32) -> (Vec<f32>, Vec<f32>) {
    let line = base + REQ_LINE;
    let len = (((bell >> LEN_SHIFT) & LEN_MASK) as usize).min(MAX_SAMPLES);
    let tap_count = (words[line + REQ_TAPS].load(Ordering::Relaxed) as usize).min(MAX_TAPS);
    let float = |at: usize| f32::from_bits(words[at].load(Ordering::Relaxed));
    if request_is_inline(tap_count, len) {
        let values: Vec<f32> =
            payload_words(REQ_PAYLOAD_FROM).take(tap_count + len).map(|at| float(line + at)).collect();
        (values[..tap_count].to_vec(), values[tap_count..].to_vec())
    } else {
        let taps = (0..tap_count).map(|j| float(base + TAPS + j)).collect();
        (taps, (0..len).map(|i| float(base + SAMPLES + i)).collect())
    }
}

/// Writes the reply to request `seq` into the slot at `base` (the server's side): the samples
/// (in the reply line when they fit), the status, then the line's sequence words.
pub(super) fn write_reply(words: &[AtomicU32], base: usize, seq: u32, status: u32, samples: &[f32]) {
    let line = base + REPLY_LINE;
    if reply_is_inline(samples.len()) {
        for (at, value) in payload_words(REPLY_PAYLOAD_FROM).zip(samples) {
            words[line + at].store(value.to_bits(), Ordering::Relaxed);
        }
    } else {
        for (word, value) in words[base + REPLY_SAMPLES..].iter().zip(samples) {
            word.store(value.to_bits(), Ordering::Relaxed);
        }
    }
    words[line + REPLY_STATUS].store(status, Ordering::Relaxed);
    publish_line(&words[line..line + LINE_WORDS], seq);
}

/// The full sequence number of the last reply written into the slot at `base`, if its line is
/// whole.
pub(super) fn reply_sequence(words: &[AtomicU32], base: usize) -> Option<u32> {
    line_sequence(&words[base + REPLY_LINE..base + REPLY_LINE + LINE_WORDS])
}

/// The reply to request `seq` of `len` samples in the slot at `base`, if it has arrived.
pub(super) fn read_reply(words: &[AtomicU32], base: usize, seq: u64, len: usize) -> Option<Result<Vec<f32>>> {
    if reply_sequence(words, base) != Some(seq as u32) {
        return None;
    }
    let line = base + REPLY_LINE;
    let float = |at: usize| f32::from_bits(words[at].load(Ordering::Relaxed));
    Some(match words[line + REPLY_STATUS].load(Ordering::Relaxed) {
        STATUS_DONE if reply_is_inline(len) => {
            Ok(payload_words(REPLY_PAYLOAD_FROM).take(len).map(|at| float(line + at)).collect())
        }
        STATUS_DONE => Ok((0..len).map(|i| float(base + REPLY_SAMPLES + i)).collect()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_payload_words_are_the_ones_the_kernel_indexes() {
        // kernels/doorbell.cu: payload_index(lane, from) = lane - from - lane / 8 for payload words.
        for (from, capacity) in
            [(REQ_PAYLOAD_FROM, INLINE_REQUEST_WORDS), (REPLY_PAYLOAD_FROM, INLINE_REPLY_WORDS)]
        {
            let words: Vec<usize> = payload_words(from).collect();
            assert_eq!(words.len(), capacity);
            for (index, &lane) in words.iter().enumerate() {
                assert_eq!(index, lane - from - lane / SECTOR_WORDS);
            }
        }
    }

    #[test]
    fn requests_and_replies_round_trip_in_and_out_of_their_lines() {
        let mut rng = fastrand::Rng::new();
        let random =
            |rng: &mut fastrand::Rng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.f32() - 0.5).collect() };
        let words: Vec<AtomicU32> = (0..words_for(2)).map(|_| AtomicU32::new(0xA5A5_A5A5)).collect();
        for (seq, (taps, samples)) in
            [(3, 23), (3, 24), (0, 26), (0, 27), (64, 1024), (1, 1)].into_iter().enumerate()
        {
            let seq = seq as u64 + 1;
            let (taps, samples) = (random(&mut rng, taps), random(&mut rng, samples));
            let request = if taps.is_empty() {
                Request::Gain { gain: 1.5, samples: &samples }
            } else {
                Request::Fir { taps: &taps, samples: &samples }
            };
            let base = slot_base(2, seq);
            request.write(&words, base, seq);
            let line = &words[base + REQ_LINE..base + REQ_LINE + LINE_WORDS];
            let bell = line_sequence(line).expect("a whole line");
            assert_eq!(u64::from(bell & SEQ_MASK), seq);
            assert_eq!(read_request(&words, base, bell), (taps.clone(), samples.clone()));

            let reply = request.reference();
            assert_eq!(read_reply(&words, base, seq, reply.len()).map(|r| r.is_ok()), None, "no reply yet");
            write_reply(&words, base, seq as u32, STATUS_DONE, &reply);
            assert_eq!(read_reply(&words, base, seq, reply.len()).unwrap().unwrap(), reply);
        }
    }

    #[test]
    fn a_line_with_one_stale_sector_is_not_taken() {
        let words: Vec<AtomicU32> = (0..words_for(1)).map(|_| AtomicU32::new(0)).collect();
        let base = slot_base(1, 1);
        write_reply(&words, base, 1, STATUS_DONE, &[2.0]);
        words[base + REPLY_LINE + 2 * SECTOR_WORDS].store(0, Ordering::Relaxed);
        assert!(read_reply(&words, base, 1, 1).is_none());
    }
}
