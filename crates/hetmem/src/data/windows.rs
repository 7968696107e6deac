//! A piece of a file mapped and registered in place: the page cache's own pages, which the copy
//! engines (or a kernel) read with no copy on the CPU. The smallest private window the stream
//! needs: one read-only [`MappedFile`] per piece, unregistered and unmapped when dropped. (The
//! general windows, mapped and unmapped on demand under a pinned budget, are
//! [`crate::memory::WindowedFile`] and [`crate::memory::WindowCache`].)

use std::sync::Arc;

use memmap2::MmapOptions;

use super::source::{OpenFile, Piece};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::memory::{MappedFile, page_size};

/// Maps and registers `piece` of `file` read-only; returns the window and where in it the
/// piece's bytes start (a mapping starts on a page). A file that no longer holds the piece (it
/// was truncated while the stream ran) is refused before it is mapped.
///
/// # Safety
/// The file must not be truncated or modified while the window lives (the contract of
/// [`MappedFile`]).
pub(crate) unsafe fn map_piece(
    device: &Device,
    file: &OpenFile,
    piece: &Piece,
) -> Result<(MappedFile<u8>, usize)> {
    let page = page_size() as u64;
    let start = piece.file_offset / page * page;
    let skip = (piece.file_offset - start) as usize;
    file.origin.check_holds(piece.file_offset, piece.file_offset + piece.len as u64)?;
    // SAFETY: the caller promises the file is not truncated or modified while mapped; the
    // mapping moves into the window, which unregisters it before unmapping.
    let map = unsafe { MmapOptions::new().offset(start).len(skip + piece.len).map(file.origin.file()) }
        .map_err(|source| Error::Io {
            context: format!("mapping a window of {} at byte {start}", file.origin.path().display()),
            source,
        })?;
    if let Err(error) = map.advise(memmap2::Advice::Sequential) {
        tracing::debug!("madvise(SEQUENTIAL) on a window: {error}");
    }
    // The window's CPU reads (copies on the CPU backend, a stage's CPU path) check the file's
    // size and recover a fault if it shrinks meanwhile.
    let window =
        MappedFile::of_file(device, map, Arc::clone(&file.origin), start).map_err(|failure| failure.error)?;
    Ok((window, skip))
}
