//! The files a stream reads: byte ranges, cut into pieces of at most one staging chunk, and read
//! with `O_DIRECT` where the filesystem allows it, through the page cache otherwise.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::memory::FileOrigin;

/// The alignment `O_DIRECT` reads keep (offsets, lengths and buffer addresses): the largest
/// logical block size of common devices. Staging buffers are page-aligned.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// A byte range of a file, read as one part of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FileRange {
    /// The file.
    pub path: PathBuf,
    /// The first byte.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
}

impl FileRange {
    /// All of the file at `path`.
    ///
    /// # Errors
    /// The file is missing or unreadable, or is not a regular file.
    pub fn whole(path: impl AsRef<Path>) -> Result<FileRange> {
        let path = path.as_ref();
        let metadata = std::fs::metadata(path)
            .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })?;
        if !metadata.is_file() {
            return Err(Error::invalid("file", format!("{} is not a regular file", path.display())));
        }
        Ok(FileRange { path: path.to_path_buf(), offset: 0, len: metadata.len() })
    }
}

/// How a stream's bytes came off storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "snake_case"))]
pub enum ReadMode {
    /// `O_DIRECT`: from the device into the staging buffers, past the page cache.
    Direct,
    /// Through the page cache (`pread`, with sequential read-ahead advised).
    Buffered,
    /// Not read: the page cache's pages were mapped and registered in place.
    Mapped,
    /// `O_DIRECT` for most bytes, the page cache for some: small ranges gathered into one
    /// staging chunk (read whole, so through the page cache), or a file `O_DIRECT` could not
    /// open.
    Mixed,
}

impl std::fmt::Display for ReadMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadMode::Direct => "O_DIRECT",
            ReadMode::Buffered => "buffered",
            ReadMode::Mapped => "mapped",
            ReadMode::Mixed => "O_DIRECT and buffered",
        })
    }
}

/// One piece of a stream: at most one staging chunk of one range, or (a gathered piece) the
/// whole of `ranges` consecutive small ranges, read one after another into one staging chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The range's index (a gathered piece's first range).
    pub source: usize,
    /// How many ranges the piece holds: 1, or more for a gathered piece (ranges `source..source
    /// + ranges`, each whole).
    pub ranges: usize,
    /// Where the piece starts in the file.
    pub file_offset: u64,
    /// Where it starts in its range.
    pub source_offset: u64,
    /// Where it starts in the stream (all ranges one after another).
    pub stream_offset: u64,
    /// Its length in bytes.
    pub len: usize,
}

/// The pieces of `ranges`, each at most `chunk` bytes, in stream order.
pub(crate) fn plan(ranges: &[FileRange], chunk: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut stream_offset = 0;
    for (source, range) in ranges.iter().enumerate() {
        let mut source_offset = 0;
        while source_offset < range.len {
            let len = (range.len - source_offset).min(chunk as u64) as usize;
            pieces.push(Piece {
                source,
                ranges: 1,
                file_offset: range.offset + source_offset,
                source_offset,
                stream_offset,
                len,
            });
            source_offset += len as u64;
            stream_offset += len as u64;
        }
    }
    pieces
}

/// As [`plan`], with runs of consecutive ranges that are each smaller than a quarter `chunk`
/// and whose `places` follow on (range k + 1 goes where range k ends: a tensor-parallel slice's
/// rows) gathered into pieces of up to `chunk` bytes, so that each staging chunk carries many
/// ranges and takes one copy to the GPU, not one per range (a slice along dim 1 of a large
/// tensor is a range per row: a piece per row ran at well under 1 GB/s).
pub(crate) fn plan_gathered(ranges: &[FileRange], places: &[usize], chunk: usize) -> Vec<Piece> {
    debug_assert_eq!(ranges.len(), places.len());
    let small = (chunk / 4) as u64;
    let mut pieces = Vec::new();
    let mut stream_offset = 0u64;
    let mut source = 0;
    while source < ranges.len() {
        let range = &ranges[source];
        let mut end = source + 1;
        let mut len = range.len;
        if range.len > 0 && range.len < small {
            while end < ranges.len() {
                let next = &ranges[end];
                let follows = usize::try_from(ranges[end - 1].len)
                    .ok()
                    .and_then(|len| places[end - 1].checked_add(len))
                    == Some(places[end]);
                if !(follows && next.len > 0 && next.len < small && len + next.len <= chunk as u64) {
                    break;
                }
                len += next.len;
                end += 1;
            }
        }
        if end - source > 1 {
            pieces.push(Piece {
                source,
                ranges: end - source,
                file_offset: range.offset,
                source_offset: 0,
                stream_offset,
                len: len as usize,
            });
            stream_offset += len;
        } else {
            for mut piece in plan(std::slice::from_ref(range), chunk) {
                piece.source = source;
                piece.stream_offset += stream_offset;
                pieces.push(piece);
            }
            stream_offset += range.len;
        }
        source = end;
    }
    pieces
}

/// A range's file, opened for the stream's reads.
#[derive(Debug)]
pub(crate) struct OpenFile {
    /// The file read through the page cache (and mapped, for windows), and its path.
    pub(crate) origin: Arc<FileOrigin>,
    direct: Option<File>,
    /// The file's size when it was opened.
    size: u64,
}

/// Refuses a range that does not lie inside a file of `size` bytes.
fn check_inside(range: &FileRange, size: u64) -> Result<()> {
    if range.offset.checked_add(range.len).is_none_or(|end| end > size) {
        return Err(Error::invalid(
            "file range",
            format!(
                "{} bytes from byte {} of {}, a file of {size} bytes",
                range.len,
                range.offset,
                range.path.display()
            ),
        ));
    }
    Ok(())
}

/// Opens the files of `ranges`, each path once (a sharded load's thousands of ranges share a
/// few files: one descriptor a range ran out of descriptors), and the index of each range's
/// file.
pub(crate) fn open_files(
    ranges: &[FileRange],
    direct: bool,
    refused: &Mutex<Option<String>>,
) -> Result<(Vec<OpenFile>, Vec<usize>)> {
    let mut files: Vec<OpenFile> = Vec::new();
    let mut by_path: std::collections::HashMap<&std::path::Path, usize> = std::collections::HashMap::new();
    let mut file_of = Vec::with_capacity(ranges.len());
    for range in ranges {
        let index = match by_path.get(range.path.as_path()) {
            Some(&index) => {
                files[index].check_range(range)?;
                index
            }
            None => {
                files.push(OpenFile::open(range, direct, refused)?);
                by_path.insert(range.path.as_path(), files.len() - 1);
                files.len() - 1
            }
        };
        file_of.push(index);
    }
    Ok((files, file_of))
}

/// Opens `path` for reading without waiting: with `O_NONBLOCK`, a FIFO's open returns at once
/// instead of waiting for a writer that may never come (with the interpreter released, not
/// even Ctrl-C would end that wait). Callers check the file is a regular one before reading
/// (a FIFO or a device such as `/dev/zero` has no end to read to). On a regular file the flag
/// changes nothing.
pub(crate) fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32).open(path)
}

impl OpenFile {
    /// Opens `range`'s file, checking the range lies inside it; with `direct`, a second handle
    /// with `O_DIRECT` where the filesystem allows it (the reason it does not is recorded in
    /// `refused`).
    pub(crate) fn open(range: &FileRange, direct: bool, refused: &Mutex<Option<String>>) -> Result<OpenFile> {
        let path = &range.path;
        let buffered = open_nonblocking(path)
            .map_err(|source| Error::Io { context: format!("opening {}", path.display()), source })?;
        let metadata = buffered
            .metadata()
            .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })?;
        if !metadata.is_file() {
            return Err(Error::invalid(
                "load",
                format!("{} is not a regular file (a pipe or a device): give a file", path.display()),
            ));
        }
        let size = metadata.len();
        check_inside(range, size)?;
        // Several threads read neighbouring pieces: a doubled read-ahead window keeps the disk
        // busy between them. Advice only: a filesystem that ignores it reads the same bytes.
        if let Err(error) = rustix::fs::fadvise(&buffered, 0, None, rustix::fs::Advice::Sequential) {
            tracing::debug!("posix_fadvise(SEQUENTIAL) on {}: {error}", path.display());
        }
        let direct = if direct {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(path)
            {
                Ok(file) => Some(file),
                Err(error) => {
                    let reason =
                        format!("{} refuses O_DIRECT ({error}): read through the page cache", path.display());
                    tracing::debug!("{reason}");
                    refused.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(reason);
                    None
                }
            }
        } else {
            None
        };
        Ok(OpenFile { origin: Arc::new(FileOrigin::new(buffered, path)), direct, size })
    }

    /// Checks that `range` (of this file) lies inside it.
    pub(crate) fn check_range(&self, range: &FileRange) -> Result<()> {
        check_inside(range, self.size)
    }

    /// Whether reads of this file go past the page cache.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Reads `piece` into `buf` (at least `piece.len + DIRECT_ALIGN` bytes, page-aligned) and
    /// returns where in `buf` its bytes start: 0 through the page cache; the piece's offset past
    /// the block below it with `O_DIRECT`, which reads whole aligned blocks. A direct read the
    /// filesystem refuses (`EINVAL` where alignment rules differ) falls back to the page cache
    /// and sets `direct_failed`, with the reason in `refused`.
    pub(crate) fn read(
        &self,
        piece: &Piece,
        buf: &mut [u8],
        direct_failed: &AtomicBool,
        refused: &Mutex<Option<String>>,
    ) -> Result<usize> {
        if let Some(direct) = self.direct.as_ref().filter(|_| !direct_failed.load(Ordering::Relaxed)) {
            let start = piece.file_offset / DIRECT_ALIGN * DIRECT_ALIGN;
            let skip = (piece.file_offset - start) as usize;
            let end = (piece.file_offset + piece.len as u64).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
            let span = (end - start) as usize;
            match read_fully(direct, &mut buf[..span], start, skip + piece.len) {
                Ok(()) => return Ok(skip),
                Err(error) if error.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                    let reason = format!(
                        "{} refuses O_DIRECT reads ({error}): read through the page cache",
                        self.origin.path().display()
                    );
                    tracing::debug!("{reason}");
                    refused.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(reason);
                    direct_failed.store(true, Ordering::Relaxed);
                }
                Err(source) => return Err(self.read_error(piece, source)),
            }
        }
        read_fully(self.origin.file(), &mut buf[..piece.len], piece.file_offset, piece.len)
            .map_err(|source| self.read_error(piece, source))?;
        Ok(0)
    }

    /// Reads all of `buf` from the file at `offset` through the page cache (a gathered
    /// piece's small ranges: `O_DIRECT` would read a whole block for each).
    pub(crate) fn read_buffered(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        read_fully(self.origin.file(), buf, offset, buf.len()).map_err(|source| Error::Io {
            context: format!("reading {} at byte {offset}", self.origin.path().display()),
            source,
        })
    }

    fn read_error(&self, piece: &Piece, source: std::io::Error) -> Error {
        Error::Io {
            context: format!("reading {} at byte {}", self.origin.path().display(), piece.file_offset),
            source,
        }
    }
}

/// Reads from `offset` into `buf` until at least `need` bytes arrived: the end of the file may
/// come first in `buf` (an aligned direct read past it), but not before `need`.
fn read_fully(file: &File, buf: &mut [u8], offset: u64, need: usize) -> std::io::Result<()> {
    let mut got = 0;
    while got < need {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file ended early: was it truncated while being read?",
                ));
            }
            Ok(n) => got += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(len: u64, offset: u64) -> FileRange {
        FileRange { path: PathBuf::from("f"), offset, len }
    }

    #[test]
    fn pieces_cover_every_range_in_order_without_gaps() {
        let ranges = [range(10_000, 8), range(0, 0), range(4096, 0), range(1, 100)];
        let pieces = plan(&ranges, 4096);
        let lens: Vec<usize> = pieces.iter().map(|p| p.len).collect();
        assert_eq!(lens, [4096, 4096, 1808, 4096, 1]);
        assert_eq!(pieces[2].file_offset, 8 + 8192);
        assert_eq!(pieces[3].source, 2);
        assert_eq!(pieces[4].stream_offset, 10_000 + 4096);
        assert_eq!(pieces[4].file_offset, 100);
    }

    /// Small ranges whose places follow on are gathered into pieces of up to a chunk; a large
    /// range, a zero-length one, or a gap between places ends a run.
    #[test]
    fn small_ranges_that_follow_on_are_gathered_into_chunks() {
        // Twelve rows of 300 bytes placed one after another, a 5000-byte range, three more rows,
        // then a row placed after a gap.
        let mut ranges: Vec<FileRange> = (0..12).map(|row| range(300, 1000 * row)).collect();
        let mut places: Vec<usize> = (0..12).map(|row| 300 * row as usize).collect();
        ranges.push(range(5000, 50_000));
        places.push(3600);
        for row in 0..3 {
            ranges.push(range(300, 60_000 + 1000 * row));
            places.push(8600 + 300 * row as usize);
        }
        ranges.push(range(300, 70_000));
        places.push(20_000);
        let pieces = plan_gathered(&ranges, &places, 4096);
        let shape: Vec<(usize, usize, usize)> = pieces.iter().map(|p| (p.source, p.ranges, p.len)).collect();
        // 4096 / 300: 13 rows fit a chunk, but 12 come before the large range; the large range
        // is a chunk and a rest; the three rows; the row after a gap alone.
        assert_eq!(shape, [(0, 12, 3600), (12, 1, 4096), (12, 1, 904), (13, 3, 900), (16, 1, 300)]);
        let streamed: Vec<u64> = pieces.iter().map(|p| p.stream_offset).collect();
        assert_eq!(streamed, [0, 3600, 7696, 8600, 9500]);
        assert_eq!(pieces[2].file_offset, 50_000 + 4096);
        assert_eq!(pieces[3].file_offset, 60_000);
        // Without places that follow on, nothing is gathered.
        let apart: Vec<usize> = (0..ranges.len()).map(|k| 10_000 * k).collect();
        assert!(plan_gathered(&ranges, &apart, 4096).iter().all(|p| p.ranges == 1));
        assert_eq!(plan_gathered(&ranges, &apart, 4096), plan(&ranges, 4096));
    }

    /// Ranges of one path share one open file (a sharded load makes thousands of ranges over a
    /// few files: one descriptor each ran out of them), and each is still checked against it.
    #[test]
    fn ranges_of_one_path_share_one_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
        std::fs::write(&a, vec![1u8; 5000]).unwrap();
        std::fs::write(&b, vec![2u8; 300]).unwrap();
        let at = |path: &PathBuf, offset, len| FileRange { path: path.clone(), offset, len };
        let ranges: Vec<FileRange> =
            (0..5000u64).step_by(10).map(|offset| at(&a, offset, 10)).chain([at(&b, 0, 300)]).collect();
        let refused = Mutex::new(None);
        let (files, file_of) = open_files(&ranges, false, &refused).unwrap();
        assert_eq!(files.len(), 2);
        assert!(file_of[..500].iter().all(|&file| file == 0) && file_of[500] == 1, "{file_of:?}");
        let past = [at(&a, 0, 10), at(&a, 4995, 10)];
        let Err(error) = open_files(&past, false, &refused) else {
            panic!("a range past the end was opened")
        };
        let error = error.to_string();
        assert!(error.contains("a.bin") && error.contains("a file of 5000 bytes"), "{error}");
    }

    /// A direct read the filesystem refuses (here: a buffer off the alignment `O_DIRECT`
    /// needs, which the stream's own buffers never are) falls back to the page cache, says
    /// why, and still reads the right bytes; so does a file whose filesystem refuses
    /// `O_DIRECT` when opened.
    #[test]
    fn refused_direct_reads_fall_back_to_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("direct.bin");
        let bytes: Vec<u8> = (0..3 * DIRECT_ALIGN as usize + 77).map(|_| fastrand::u8(1..)).collect();
        std::fs::write(&path, &bytes).unwrap();
        let range = FileRange::whole(&path).unwrap();
        let refused = Mutex::new(None);
        let file = OpenFile::open(&range, true, &refused).unwrap();
        let failed = AtomicBool::new(false);
        let piece = Piece {
            source: 0,
            ranges: 1,
            file_offset: 4096 + 8,
            source_offset: 4096 + 8,
            stream_offset: 0,
            len: 5000,
        };
        let mut backing = vec![0xA5u8; 4 * DIRECT_ALIGN as usize + 4096];
        // Off by one from any alignment the kernel could accept.
        let misaligned = (backing.as_ptr() as usize).next_multiple_of(4096) - backing.as_ptr() as usize + 1;
        let buf = &mut backing[misaligned..];
        let skip = file.read(&piece, buf, &failed, &refused).unwrap();
        assert_eq!(&buf[skip..skip + piece.len], &bytes[4104..4104 + 5000]);
        assert!(
            failed.load(Ordering::Relaxed) || !file.is_direct(),
            "a misaligned direct read cannot succeed"
        );
        let reason = refused.lock().unwrap().clone().expect("the fallback is reported");
        assert!(reason.contains("direct.bin") && reason.contains("O_DIRECT"), "{reason}");
    }
}
