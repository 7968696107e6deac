//! Evicting a cell's host buffers from the CPU's caches before it runs, so that every cell
//! starts alike whatever the cell or the check before it did.
//!
//! Why: the GPU reads host memory through the CPU's coherence machinery. A line the CPU holds
//! in a core's private cache has to be snooped out of that core, and on the H200 machine a
//! kernel reading mapped memory that the previous cell's check had just read on several cores
//! ran at two thirds of its cold rate (see `bench/results/2026-12-01-h200-link-cold-cache`).
//! Cells ran in a fixed order, so one cell measured that penalty and its neighbours did not.

/// Bytes per cache line: the step of the flush. Lines are 64 bytes on every x86-64 and on the
/// Arm server cores NVIDIA pairs with its GPUs (Grace's Neoverse V2); a shorter line elsewhere
/// would only leave some lines cached, never touch memory outside `bytes`.
const LINE: usize = 64;

/// Writes back and evicts every cache line holding part of `bytes` from every level of the
/// CPU's caches, on every core: CLFLUSH on x86-64, DC CIVAC on AArch64, nothing elsewhere.
/// Spread over rayon's threads (about a millisecond for 64 MiB); the data is unchanged.
pub(super) fn flush(bytes: &[u8]) {
    use rayon::prelude::*;
    bytes.par_chunks(1 << 20).for_each(|chunk| {
        let start = chunk.as_ptr() as usize;
        // The first line may begin before `chunk`; it is still the line of `chunk`'s first byte,
        // so on a mapped page.
        let mut line = start & !(LINE - 1);
        while line < start + chunk.len() {
            flush_line(line as *const u8);
            line += LINE;
        }
        fence();
    });
}

#[cfg(target_arch = "x86_64")]
fn flush_line(line: *const u8) {
    // SAFETY: CLFLUSH (SSE2, part of x86-64) reads no data and writes none; `line` is in the
    // cache line of a byte of a live slice, so on a mapped page, which is all it requires.
    unsafe { std::arch::x86_64::_mm_clflush(line) }
}

#[cfg(target_arch = "x86_64")]
fn fence() {
    // SAFETY: MFENCE has no operands; it orders this thread's flushes before what follows.
    unsafe { std::arch::x86_64::_mm_mfence() }
}

#[cfg(target_arch = "aarch64")]
fn flush_line(line: *const u8) {
    // SAFETY: DC CIVAC cleans and invalidates the line to the point of coherence; it changes no
    // data, and `line` is in the cache line of a byte of a live slice, so on a mapped page.
    unsafe { std::arch::asm!("dc civac, {0}", in(reg) line, options(nostack, preserves_flags)) }
}

#[cfg(target_arch = "aarch64")]
fn fence() {
    // SAFETY: DSB has no operands; it waits for this thread's cache maintenance to complete.
    unsafe { std::arch::asm!("dsb ish", options(nostack, preserves_flags)) }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn flush_line(_line: *const u8) {}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn fence() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushing_keeps_the_data_at_any_offset_and_length() {
        let data: Vec<u8> = (0..3 * LINE + 17).map(|i| (i * 131 + 7) as u8).collect();
        let before = data.clone();
        // Unaligned starts and ends, an empty slice, a whole buffer over several chunks.
        flush(&data[5..2 * LINE + 3]);
        flush(&data[..0]);
        flush(&data);
        let big: Vec<u8> = (0..(3 << 20) + 9).map(|i| (i % 251) as u8).collect();
        flush(&big);
        assert_eq!(data, before);
        assert!(big.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
}
