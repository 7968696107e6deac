//! How much memory reading one input may take, decided from the size it declares before
//! anything that large is allocated: a cap on pixels (`hetmem filter --max-pixels`), the memory
//! this machine has available, and allocations that fail with an error instead of aborting.
//!
//! A header is a few bytes that may claim anything: a 65536 x 65536 PPM header needs 24 GiB
//! for the filter's input and output frames. Allocating that first and failing later aborts
//! the process, or (with Linux's overcommit) lets the OOM killer end it, or another process,
//! once the pages are touched.

use anyhow::bail;

/// The default pixel cap (`hetmem filter --max-pixels`): 2^28 pixels, 16384 x 16384, beyond
/// any camera or 16K video frame; one such frame is 1 GiB as RGBA.
pub const DEFAULT_MAX_PIXELS: u64 = 1 << 28;

/// The most bytes an encoded image may take per pixel of the cap when it is read into memory:
/// 16-bit RGBA PNM takes 8 bytes a pixel, ASCII PNM up to 16; PNG and JPEG far less.
const ENCODED_BYTES_PER_PIXEL: u64 = 16;

/// The limits reading one input works within: the most pixels (width x height) it may
/// declare, and the memory this machine has available.
///
/// Its messages name the remedy as `hetmem filter` spells it (`--max-pixels N`).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// The most pixels (width x height) an input may declare.
    max_pixels: u64,
}

impl Default for Budget {
    /// [`DEFAULT_MAX_PIXELS`].
    fn default() -> Budget {
        Budget::new(DEFAULT_MAX_PIXELS)
    }
}

impl Budget {
    /// At most `max_pixels` pixels (width x height) an input may declare.
    pub fn new(max_pixels: u64) -> Budget {
        Budget { max_pixels }
    }

    /// The most pixels (width x height) an input may declare.
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// Refuses a `width` x `height` image, declared by `what` (`its Y4M header`) of `input`,
    /// that is above the pixel cap, or whose filtering needs more than `bytes` the machine has
    /// available. Called before anything of that size is allocated.
    ///
    /// # Errors
    /// Either limit exceeded, with the declared size, the bytes it needs and the remedy.
    pub fn check(&self, input: &str, what: &str, width: u64, height: u64, bytes: u64) -> anyhow::Result<()> {
        let pixels = width.saturating_mul(height);
        let needs = format!(
            "{input}: {what} declares {width}x{height} pixels ({pixels} pixels), which needs {bytes} bytes ({}) \
             of memory to filter",
            approx(bytes)
        );
        if pixels > self.max_pixels {
            bail!(
                "{needs}; hetmem filters at most {} pixels ({}) unless told otherwise: if the file is \
                 genuine and this machine has the memory, pass --max-pixels {pixels}",
                self.max_pixels,
                approx_pixels(self.max_pixels)
            );
        }
        if let Some(available) = available_memory()
            && bytes > available
        {
            bail!(
                "{needs}, and this machine has {available} bytes ({}) available: free memory, or filter a \
                 smaller image",
                approx(available)
            );
        }
        Ok(())
    }

    /// The most bytes an encoded image (a file or a pipe) may hold: more cannot be an image
    /// within the cap.
    pub(crate) fn max_encoded_bytes(&self) -> u64 {
        self.max_pixels.saturating_mul(ENCODED_BYTES_PER_PIXEL).saturating_add(1 << 20)
    }
}

/// Memory the kernel can give without swapping (`MemAvailable`), where it says.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Reserves room for at least `bytes` more in `buffer` (growing it as `Vec` does), or says that
/// the machine has no room for them.
///
/// # Errors
/// The allocation failing.
pub(crate) fn reserve(buffer: &mut Vec<u8>, bytes: usize, what: &str) -> anyhow::Result<()> {
    if buffer.try_reserve(bytes).is_err() {
        bail!(
            "cannot allocate {} bytes ({}) for {what}: out of memory",
            buffer.len() + bytes,
            approx((buffer.len() + bytes) as u64)
        );
    }
    Ok(())
}

/// `12.0 GiB`: a size for people, beside the exact one.
fn approx(bytes: u64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} bytes") } else { format!("{value:.1} {}", units[unit]) }
}

/// `16384 x 16384` for a square number of pixels, else `268.4 million`.
fn approx_pixels(pixels: u64) -> String {
    let side = pixels.isqrt();
    if side * side == pixels {
        format!("{side} x {side}")
    } else {
        format!("{:.1} million", pixels as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(approx(512), "512 bytes");
        assert_eq!(approx(3 << 29), "1.5 GiB");
        assert_eq!(approx(24 << 30), "24.0 GiB");
        assert_eq!(approx_pixels(DEFAULT_MAX_PIXELS), "16384 x 16384");
        assert_eq!(approx_pixels(3_000_000), "3.0 million");
    }

    #[test]
    fn the_cap_is_checked_before_the_memory_and_names_the_remedy() {
        let budget = Budget { max_pixels: 1 << 20 };
        assert!(budget.check("in.ppm", "its PPM header", 1024, 1024, 6 << 20).is_ok());
        let error = budget.check("in.ppm", "its PPM header", 1025, 1024, 6 << 20).unwrap_err().to_string();
        assert!(
            error.contains("in.ppm: its PPM header declares 1025x1024 pixels (1049600 pixels)"),
            "{error}"
        );
        assert!(error.contains("--max-pixels 1049600") && error.contains("1024 x 1024"), "{error}");
        // Within the cap but more than any machine has: refused all the same.
        let everything = Budget { max_pixels: u64::MAX };
        let result = everything.check("-", "its Y4M header", 1, 1, u64::MAX);
        match available_memory() {
            Some(_) => assert!(result.unwrap_err().to_string().contains("available: free memory")),
            None => assert!(result.is_ok(), "no /proc/meminfo: only the cap is checked"),
        }
    }

    #[test]
    fn a_failed_reservation_is_an_error_not_an_abort() {
        let mut buffer = vec![0u8; 16];
        let error = reserve(&mut buffer, usize::MAX / 2, "the test").unwrap_err().to_string();
        assert!(error.contains("for the test: out of memory"), "{error}");
        reserve(&mut buffer, 1 << 10, "the test").unwrap();
        assert!(buffer.capacity() >= 16 + (1 << 10));
    }
}
