//! Loaded bytes read back from the device and compared with their files: each load of
//! `bench file`, by samples, and `hetmem load --verify`, whole.

use std::os::unix::fs::FileExt;

use hetmem::data::FileRange;
use hetmem::error::Error;
use hetmem::memory::{DeviceBuf, HostBuf, PinOptions};
use hetmem::{Device, Queue};

use crate::error::{BenchError, Result};

/// How much of each part to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// Every byte.
    Whole,
    /// 1 MiB at the start, the middle and the end of each part.
    Samples,
}

/// The piece read back at a time.
const WINDOW: usize = 64 << 20;

/// Compares `loaded`, which holds each `(range, offset)` of `parts` at its offset, with the
/// files; gives the buffer back.
///
/// # Errors
/// A byte differs ([`BenchError::ResultMismatch`], naming the file and offset); a read or copy
/// failed.
pub fn compare_with_files(
    device: &Device,
    queue: &Queue,
    loaded: DeviceBuf<u8>,
    parts: &[(FileRange, usize)],
    extent: Extent,
) -> Result<DeviceBuf<u8>> {
    let window = WINDOW.min(loaded.len());
    let loaded = queue.share(loaded);
    let mut host = Some(queue.lend(HostBuf::<u8>::pinned(device, window, PinOptions::default())?));
    let mut expected = vec![0u8; window];
    for (range, offset) in parts {
        let len = range.len as usize;
        let spans: Vec<(usize, usize)> = match extent {
            Extent::Whole => (0..len).step_by(window.max(1)).map(|at| (at, window.min(len - at))).collect(),
            Extent::Samples => {
                let sample = len.min(1 << 20).min(window);
                vec![(0, sample), ((len - sample) / 2, sample), (len - sample, sample)]
            }
        };
        let file = std::fs::File::open(&range.path)
            .map_err(|source| Error::Io { context: format!("opening {}", range.path.display()), source })?;
        for (at, span) in spans.into_iter().filter(|&(_, span)| span > 0) {
            let mut lent = host.take().expect("the window is back between spans");
            queue.copy_range(&loaded, offset + at, &mut lent, 0, span)?;
            let got = lent.reclaim()?;
            file.read_exact_at(&mut expected[..span], range.offset + at as u64).map_err(|source| {
                Error::Io { context: format!("reading {}", range.path.display()), source }
            })?;
            if let Some(index) =
                got.as_slice()[..span].iter().zip(&expected[..span]).position(|(a, b)| a != b)
            {
                return Err(BenchError::ResultMismatch {
                    what: "a loaded file",
                    detail: format!(
                        "byte {} of {}: {:#04x} on the device, {:#04x} in the file",
                        range.offset + (at + index) as u64,
                        range.path.display(),
                        got.as_slice()[index],
                        expected[index]
                    ),
                });
            }
            host = Some(queue.lend(got));
        }
    }
    if let Some(host) = host {
        host.reclaim()?;
    }
    Ok(loaded.reclaim()?)
}
