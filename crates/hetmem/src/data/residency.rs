//! How much of a file the page cache holds, measured by sampling: what [`super::LoadMethod::Auto`]
//! chooses by.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::io::IoSliceMut;
use std::path::Path;

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
    // Checked before any arithmetic on them: `resident_fraction` runs before the ranges are
    // checked against their files (it chooses how they are opened), so a caller's range may
    // reach past any file, and its end past 2^64.
    if let Some(range) = ranges.iter().find(|range| range.offset.checked_add(range.len).is_none()) {
        return Err(Error::invalid(
            "file range",
            format!(
                "{} bytes from byte {} of {}: it ends past 2^64 bytes, which no file holds; give real file ranges",
                range.len,
                range.offset,
                range.path.display()
            ),
        ));
    }
    let total: u128 = ranges.iter().map(|range| u128::from(range.len)).sum();
    if total == 0 || samples == 0 {
        return Ok(Some(1.0));
    }
    let samples_wide = samples as u128;
    // Each file opened once: a sharded load's plan holds a range per row of a tensor (a million
    // of them), and a sample (and an open) per range took seconds.
    let mut files: HashMap<&Path, File> = HashMap::new();
    let mut page = [0u8; 4096];
    let mut cached = 0usize;
    // The range holding the next sample, and where it starts in the stream of all of them.
    let (mut index, mut range_start) = (0usize, 0u128);
    for sample in 0..samples {
        // total x sample / samples, without the product (which passes 2^128 for ranges adding
        // up past 2^64 and a large count): the remainder's product is below samples^2.
        let sample = sample as u128;
        let at = total / samples_wide * sample + total % samples_wide * sample / samples_wide;
        while range_start + u128::from(ranges[index].len) <= at {
            range_start += u128::from(ranges[index].len);
            index += 1;
        }
        let range = &ranges[index];
        // Inside the range: `at` lies in [range_start, range_start + len), and the range's end
        // fits 64 bits (checked above).
        let within = (at - range_start) as u64;
        let offset = range.offset + within;
        let len = (range.len - within).min(page.len() as u64) as usize;
        let file = match files.entry(range.path.as_path()) {
            Entry::Occupied(open) => open.into_mut(),
            Entry::Vacant(slot) => {
                slot.insert(super::source::open_nonblocking(&range.path).map_err(|source| Error::Io {
                    context: format!("opening {}", range.path.display()),
                    source,
                })?)
            }
        };
        match rustix::io::preadv2(
            &*file,
            &mut [IoSliceMut::new(&mut page[..len])],
            offset,
            ReadWriteFlags::NOWAIT,
        ) {
            Ok(_) => cached += 1,
            Err(Errno::AGAIN) => {}
            Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                tracing::debug!("{}: the kernel cannot say what is cached", range.path.display());
                return Ok(None);
            }
            Err(error) => {
                return Err(Error::Io {
                    context: format!("sampling {} at byte {offset}", range.path.display()),
                    source: error.into(),
                });
            }
        }
    }
    Ok(Some(cached as f64 / samples as f64))
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

    /// Many small ranges (a sharded plan's rows), fewer samples than ranges: the fraction is
    /// still measured; a file the ranges name that is gone is an error naming it.
    #[test]
    fn many_ranges_take_the_samples_asked_for_over_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.bin");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let rows: Vec<FileRange> =
            (0..100_000u64).map(|row| FileRange { path: path.clone(), offset: row * 10, len: 5 }).collect();
        if let Some(fraction) = resident_fraction(&rows, 64).unwrap() {
            assert!(fraction > 0.99, "{fraction}");
        }
        let gone = [FileRange { path: dir.path().join("gone.bin"), offset: 0, len: 10 }];
        let error = resident_fraction(&gone, 4).unwrap_err().to_string();
        assert!(error.contains("gone.bin"), "{error}");
    }

    /// A range whose end passes 2^64 is refused, naming it, before any arithmetic on it (it
    /// overflowed: a panic in a debug build, a wrapped offset in a release one); ranges adding
    /// up past 2^64 are sampled, and empty ranges in the middle and at the end passed over.
    #[test]
    fn ranges_past_two_to_the_sixty_four_are_refused_or_sampled_without_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        for (offset, len) in [(u64::MAX, 1), (u64::MAX - 10, 100), (1, u64::MAX)] {
            let past = [
                FileRange { path: path.clone(), offset, len },
                FileRange { path: path.clone(), offset: 0, len: 8192 },
            ];
            let error = resident_fraction(&past, 64).unwrap_err().to_string();
            assert!(error.contains("2^64") && error.contains(&offset.to_string()), "{error}");
        }
        // Two ranges of almost 2^64 bytes each (past the file's end: the stream refuses them
        // when it opens the file; a sample there reads nothing, or is told it cannot).
        let huge = [
            FileRange { path: path.clone(), offset: 0, len: u64::MAX - 1 },
            FileRange { path: path.clone(), offset: 0, len: 0 },
            FileRange { path: path.clone(), offset: 0, len: u64::MAX - 1 },
            FileRange { path: path.clone(), offset: 5, len: 0 },
        ];
        if let Some(fraction) = resident_fraction(&huge, 4096).unwrap() {
            assert!((0.0..=1.0).contains(&fraction), "{fraction}");
        }
        let mixed = [
            FileRange { path: path.clone(), offset: 0, len: 0 },
            FileRange { path: path.clone(), offset: 100, len: 3 },
            FileRange { path: path.clone(), offset: 0, len: 0 },
            FileRange { path: path.clone(), offset: 4000, len: 4192 },
            FileRange { path: path.clone(), offset: 8192, len: 0 },
        ];
        if let Some(fraction) = resident_fraction(&mixed, 1000).unwrap() {
            assert!(fraction > 0.99, "{fraction}");
        }
    }
}
