//! Copies the driver refuses because their host range spans two page-locked registrations,
//! done in parts.

use cudarc::driver::{DriverError, sys};

/// Host memory is page-locked in whole pages: the seams between registrations fall on them.
const PAGE: usize = 4096;

/// Runs `copy(at, len)` over `0..len` of host memory starting at address `host`; a range the
/// driver refuses with `CUDA_ERROR_INVALID_VALUE` is split in two at a page boundary and each
/// part tried. hetmem registers large host buffers in pieces
/// (`RegisterOptions::max_piece_bytes`), and the driver refuses a copy whose host range spans
/// two page-locked registrations (a 95 MB frame of a 50 GB registered data set was, on the
/// H200 machine); the parts on either side of the seam copy. A copy refused for another reason
/// fails with the driver's error once no page boundary is left inside the refused part, after
/// about 2 log2(len / 4096) tries.
pub(super) fn in_parts(
    host: usize,
    len: usize,
    copy: &mut dyn FnMut(usize, usize) -> Result<(), DriverError>,
) -> Result<(), DriverError> {
    fn part(
        host: usize,
        at: usize,
        len: usize,
        copy: &mut dyn FnMut(usize, usize) -> Result<(), DriverError>,
    ) -> Result<(), DriverError> {
        match copy(at, len) {
            Err(error) if error.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                // The page boundary nearest the middle, strictly inside the part.
                let (first, end) = (host + at, host + at + len);
                let middle = first + len / 2;
                let below = middle - middle % PAGE;
                let split = if below > first { below } else { below + PAGE };
                if split >= end {
                    return Err(error);
                }
                part(host, at, split - first, copy)?;
                part(host, split - host, end - split, copy)
            }
            done => done,
        }
    }
    if len == 0 {
        return Ok(());
    }
    part(host, 0, len, copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> DriverError {
        DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    #[test]
    fn a_copy_across_a_registration_seam_is_split_and_covers_every_byte_once() {
        let len = 95_532_803;
        // The host range starts mid-page; seams fall on page boundaries.
        let host = 0x7f00_0000_0123;
        for seam in [0x7f00_0010_0000usize, 0x7f00_0263_a000, host + len - 100 - (host + len - 100) % PAGE] {
            let mut parts: Vec<(usize, usize)> = Vec::new();
            let mut copy = |at: usize, n: usize| {
                if host + at < seam && host + at + n > seam {
                    return Err(refused());
                }
                parts.push((at, n));
                Ok(())
            };
            assert!(in_parts(host, len, &mut copy).is_ok(), "seam {seam:#x}");
            parts.sort();
            let mut next = 0;
            for &(at, n) in &parts {
                assert_eq!(at, next, "seam {seam:#x}: parts {parts:?}");
                next = at + n;
            }
            assert_eq!(next, len, "seam {seam:#x}");
            assert!(parts.len() < 64, "seam {seam:#x}: {} parts", parts.len());
        }
    }

    #[test]
    fn a_copy_refused_for_another_reason_fails() {
        let mut tries = 0;
        let mut refuse_all = |_: usize, _: usize| {
            tries += 1;
            Err(refused())
        };
        assert!(in_parts(0x1000, 1 << 30, &mut refuse_all).is_err());
        assert!(tries < 64, "{tries} tries");
        let mut other = |_: usize, _: usize| Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(
            matches!(in_parts(0x1000, 1 << 30, &mut other), Err(error) if error.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
    }
}
