//! A piece of a file mapped and registered in place: the page cache's own pages, which the copy
//! engines (or a kernel) read with no copy on the CPU. The smallest private window the stream
//! needs: one read-only [`MappedFile`] per piece, unregistered and unmapped when dropped. (The
//! general windows of `MappedFile`, mapped and unmapped on demand under a pinned budget, are
//! issue 13's item 1, built apart from this.)

use memmap2::MmapOptions;

use super::source::{OpenFile, Piece};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::memory::{MappedFile, page_size};

/// Maps and registers `piece` of `file` read-only; returns the window and where in it the
/// piece's bytes start (a mapping starts on a page).
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
    // SAFETY: the caller promises the file is not truncated or modified while mapped; the
    // mapping moves into the window, which unregisters it before unmapping.
    let map = unsafe { MmapOptions::new().offset(start).len(skip + piece.len).map(&file.buffered) }
        .map_err(|source| Error::Io { context: format!("mapping a window at byte {start}"), source })?;
    if let Err(error) = map.advise(memmap2::Advice::Sequential) {
        tracing::debug!("madvise(SEQUENTIAL) on a window: {error}");
    }
    let window = MappedFile::from_mmap(device, map).map_err(|failure| failure.error)?;
    Ok((window, skip))
}
