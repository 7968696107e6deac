//! The doorbell's server on the CPU backend: a thread that follows kernels/doorbell.cu step
//! for step on plain memory, so the CPU side of the protocol is tested without a GPU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::protocol::{
    CONTROL_WORDS, EXITED, LEN_MASK, LEN_SHIFT, MAX_SAMPLES, MAX_TAPS, OP_FIR, OP_GAIN, OP_SHIFT, OP_STALL,
    OP_WEDGE, REPLY_SAMPLES, REPLY_SEQ, REPLY_STATUS, REQ_GAIN, REQ_SEQ, REQ_TAPS, SAMPLES, SEQ_MASK,
    SLOT_WORDS, STARTED, STATUS_DONE, STATUS_STOPPED, STATUS_UNKNOWN, STOP, TAPS, fir_of, gain_of,
};

/// Polls before the idle server starts yielding, then sleeping: it shares the machine.
const IDLE_SPINS: u32 = 1 << 12;
const IDLE_YIELDS: u32 = 1 << 13;
const IDLE_SLEEP: Duration = Duration::from_micros(50);

/// Serves requests until told to stop, then marks itself exited.
pub(super) fn serve(words: &[AtomicU32], depth: usize) {
    words[STARTED].store(1, Ordering::Release);
    let mut expected: u32 = 1;
    let mut idle = 0u32;
    loop {
        let base = CONTROL_WORDS + (expected.wrapping_sub(1) as usize % depth) * SLOT_WORDS;
        let bell = words[base + REQ_SEQ].load(Ordering::Acquire);
        if bell & SEQ_MASK == expected & SEQ_MASK {
            idle = 0;
            let status = execute(words, base, bell);
            words[base + REPLY_STATUS].store(status, Ordering::Relaxed);
            words[base + REPLY_SEQ].store(expected, Ordering::Release);
            expected = expected.wrapping_add(1);
            continue;
        }
        if words[STOP].load(Ordering::Acquire) != 0 {
            break;
        }
        idle = idle.saturating_add(1);
        if idle < IDLE_SPINS {
            std::hint::spin_loop();
        } else if idle < IDLE_YIELDS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(IDLE_SLEEP);
        }
    }
    words[EXITED].store(1, Ordering::Release);
}

fn floats(words: &[AtomicU32]) -> Vec<f32> {
    words.iter().map(|word| f32::from_bits(word.load(Ordering::Relaxed))).collect()
}

/// Runs the request in the slot at `base`, announced by the doorbell word `bell`, writes the
/// reply samples, returns the status.
fn execute(words: &[AtomicU32], base: usize, bell: u32) -> u32 {
    let opcode = bell >> OP_SHIFT;
    let len = (((bell >> LEN_SHIFT) & LEN_MASK) as usize).min(MAX_SAMPLES);
    let tap_count = (words[base + REQ_TAPS].load(Ordering::Relaxed) as usize).min(MAX_TAPS);
    let samples = floats(&words[base + SAMPLES..base + SAMPLES + len]);
    let reply = match opcode {
        OP_GAIN => gain_of(f32::from_bits(words[base + REQ_GAIN].load(Ordering::Relaxed)), &samples),
        OP_FIR => fir_of(&floats(&words[base + TAPS..base + TAPS + tap_count]), &samples),
        OP_STALL => {
            while words[STOP].load(Ordering::Acquire) == 0 {
                std::thread::sleep(IDLE_SLEEP);
            }
            return STATUS_STOPPED;
        }
        OP_WEDGE => {
            let millis = words[base + REQ_GAIN].load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(millis.into()));
            return STATUS_STOPPED;
        }
        _ => return STATUS_UNKNOWN,
    };
    for (word, value) in words[base + REPLY_SAMPLES..].iter().zip(reply) {
        word.store(value.to_bits(), Ordering::Relaxed);
    }
    STATUS_DONE
}
