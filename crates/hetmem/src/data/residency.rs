//! How much of a file the page cache holds, measured by sampling: what [`super::LoadMethod::Auto`]
//! chooses by.

use std::io::IoSliceMut;

use rustix::io::{Errno, ReadWriteFlags};

use super::source::FileRange;
use crate::error::{Error, Result};

/// The fraction of `ranges`' bytes the page cache holds, from `samples` 4 KiB reads spread
/// evenly over them, each told not to wait for storage (`preadv2` with `RWF_NOWAIT`): a read
/// that would wait finds its page uncached. `None` where the kernel cannot tell (before
/// Linux 4.14, or a filesystem without `RWF_NOWAIT`). Costs `samples` small reads; a sample
/// that misses may start the kernel's read-ahead there (a few hundred KiB), as a read would.
///
/// # Errors
/// A file is missing or unreadable.
pub fn resident_fraction(ranges: &[FileRange], samples: usize) -> Result<Option<f64>> {
    let total: u64 = ranges.iter().map(|range| range.len).sum();
    if total == 0 || samples == 0 {
        return Ok(Some(1.0));
    }
    let mut page = [0u8; 4096];
    let mut cached = 0usize;
    let mut asked = 0usize;
    for (index, range) in ranges.iter().enumerate() {
        let share = ((samples as u128 * range.len as u128).div_ceil(total as u128) as usize)
            .max(usize::from(range.len > 0));
        if share == 0 {
            continue;
        }
        let file = std::fs::File::open(&range.path)
            .map_err(|source| Error::Io { context: format!("opening {}", range.path.display()), source })?;
        for sample in 0..share {
            let offset = range.offset + (range.len as u128 * sample as u128 / share as u128) as u64;
            let len = page.len().min((range.offset + range.len - offset) as usize);
            match rustix::io::preadv2(
                &file,
                &mut [IoSliceMut::new(&mut page[..len])],
                offset,
                ReadWriteFlags::NOWAIT,
            ) {
                Ok(_) => cached += 1,
                Err(Errno::AGAIN) => {}
                Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                    tracing::debug!("{}: the kernel cannot say what is cached", ranges[index].path.display());
                    return Ok(None);
                }
                Err(error) => {
                    return Err(Error::Io {
                        context: format!("sampling {} at byte {offset}", range.path.display()),
                        source: error.into(),
                    });
                }
            }
            asked += 1;
        }
    }
    Ok(Some(cached as f64 / asked.max(1) as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_is_resident() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("warm.bin");
        let bytes: Vec<u8> = (0..1 << 20).map(|_| fastrand::u8(1..)).collect();
        std::fs::write(&path, &bytes).unwrap();
        let range = FileRange::whole(&path).unwrap();
        // Written through the page cache, so every sample finds its page (or the kernel cannot
        // tell at all).
        if let Some(fraction) = resident_fraction(&[range], 32).unwrap() {
            assert!(fraction > 0.99, "{fraction}");
        }
    }
}
