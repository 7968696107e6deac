//! Evicting a bandwidth cell's host buffers from the CPU's caches before it runs, so that every
//! cell starts alike whatever the cell or the check before it did.
//!
//! Once per cell, before its warm-up: a path whose own work passes the data through the CPU
//! (the pageable copies stage it through the driver's buffers) warms it again as it runs.
//! Managed memory is not evicted (see `Buffers::evict_from_cpu_caches`).
//!
//! Why: the GPU reads host memory through the CPU's coherence machinery, and a line a core
//! holds in its private cache likely has to be snooped out of it. On the H200 machine every
//! full sweep that left the caches as the previous cells' checks had left them had one read
//! cell at 55-87% of its rate with the buffers evicted (4 MiB at 26.0 and 31.5 GB/s against
//! 47, 16 MiB at 43.5 against 50); no sweep with eviction did
//! (`bench/results/2026-12-01-h200-link-cold-cache`). Which earlier cell sets it up is not
//! isolated.

/// Bytes per cache line: the step of the flush. Lines are 64 bytes on every x86-64 and on the
/// Arm server cores NVIDIA pairs with its GPUs (Grace's Neoverse V2); a shorter line elsewhere
/// would only leave some lines cached, never touch memory outside `bytes`.
const LINE: usize = 64;

/// Writes back and evicts every cache line holding part of `bytes` from every level of the
/// CPU's caches, on every core: CLFLUSH on x86-64, DC CIVAC on AArch64, nothing elsewhere.
/// Spread over rayon's threads; the data is unchanged.
pub(super) fn flush(bytes: &[u8]) {
    use rayon::prelude::*;
    bytes.par_chunks(1 << 20).for_each(|chunk| {
        let start = chunk.as_ptr() as usize;
        // The first line may begin before `chunk`; it is still the line of `chunk`'s first byte,
        // so on a mapped page.
        let mut line = start & !(LINE - 1);
        while line < start + chunk.len() {
            // SAFETY: `line` is the cache line of a byte of `chunk`, a live slice: a line never
            // crosses a page, so it is on that byte's mapped page.
            unsafe { flush_line(line as *const u8) };
            line += LINE;
        }
        fence();
    });
}

/// Writes back and evicts the cache line holding `line` (CLFLUSH; every x86-64 CPU has it).
///
/// # Safety
/// `line` must point into a mapped page of this process (no data is read or written).
#[cfg(target_arch = "x86_64")]
unsafe fn flush_line(line: *const u8) {
    // SAFETY: the caller's contract; CLFLUSH needs only the address to be mapped.
    unsafe { std::arch::x86_64::_mm_clflush(line) }
}

#[cfg(target_arch = "x86_64")]
fn fence() {
    // SAFETY: MFENCE needs SSE2, which every x86-64 CPU has; it orders this thread's flushes
    // before what follows.
    unsafe { std::arch::x86_64::_mm_mfence() }
}

/// Cleans and invalidates the cache line holding `line` to the point of coherence (DC CIVAC).
///
/// # Safety
/// `line` must point into a mapped page of this process (no data is changed).
#[cfg(target_arch = "aarch64")]
unsafe fn flush_line(line: *const u8) {
    // SAFETY: the caller's contract; DC CIVAC changes no data and needs the address mapped.
    unsafe { std::arch::asm!("dc civac, {0}", in(reg) line, options(nostack, preserves_flags)) }
}

#[cfg(target_arch = "aarch64")]
fn fence() {
    // SAFETY: DSB SY takes no memory operand; it waits until this thread's cache maintenance is
    // complete for every observer, the GPU included.
    unsafe { std::arch::asm!("dsb sy", options(nostack, preserves_flags)) }
}

/// Does nothing: no cache maintenance instruction is used on this architecture.
///
/// # Safety
/// None needed; `unsafe` only to match the other architectures' signature.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn flush_line(_line: *const u8) {}

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
