//! The doorbell's server on the CPU backend: a thread that follows kernels/doorbell.cu step
//! for step on plain memory, so the CPU side of the protocol is tested without a GPU.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::protocol::{
    CONTROL_WORDS, EXITED, LINE_WORDS, OP_FIR, OP_GAIN, OP_SHIFT, OP_STALL, OP_WEDGE, REQ_GAIN, REQ_LINE,
    SEQ_MASK, SLOT_WORDS, STARTED, STATUS_DONE, STATUS_STOPPED, STATUS_UNKNOWN, STOP, fir_of, gain_of,
    line_sequence, read_request, write_reply,
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
        let line = &words[base + REQ_LINE..base + REQ_LINE + LINE_WORDS];
        if let Some(bell) = line_sequence(line).filter(|bell| bell & SEQ_MASK == expected & SEQ_MASK) {
            idle = 0;
            let (status, reply) = execute(words, base, bell);
            write_reply(words, base, expected, status, &reply);
            expected = expected.wrapping_add(1);
            continue;
        }
        if words[STOP].load(Ordering::Acquire) != 0 {
            // The stop is stored after every request its thread submitted, so one that landed
            // since the look above is visible now: served first, as `shutdown` promises.
            if line_sequence(line).is_some_and(|bell| bell & SEQ_MASK == expected & SEQ_MASK) {
                continue;
            }
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

/// Runs the request in the slot at `base`, announced by the doorbell word `bell`: the status
/// and the reply samples.
fn execute(words: &[AtomicU32], base: usize, bell: u32) -> (u32, Vec<f32>) {
    let opcode = bell >> OP_SHIFT;
    let (taps, samples) = read_request(words, base, bell);
    let gain = words[base + REQ_LINE + REQ_GAIN].load(Ordering::Relaxed);
    match opcode {
        OP_GAIN => (STATUS_DONE, gain_of(f32::from_bits(gain), &samples)),
        OP_FIR => (STATUS_DONE, fir_of(&taps, &samples)),
        OP_STALL => {
            while words[STOP].load(Ordering::Acquire) == 0 {
                std::thread::sleep(IDLE_SLEEP);
            }
            (STATUS_STOPPED, Vec::new())
        }
        OP_WEDGE => {
            std::thread::sleep(Duration::from_millis(gain.into()));
            (STATUS_STOPPED, Vec::new())
        }
        _ => (STATUS_UNKNOWN, Vec::new()),
    }
}
