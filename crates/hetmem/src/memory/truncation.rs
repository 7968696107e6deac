//! Files truncated under their mappings: what hetmem's own CPU loops over a file mapping do
//! about it.
//!
//! Before a loop reads or writes a mapping (a copy, a checksum, an operation's CPU path) the
//! file's size is checked against the bytes the loop needs, and while it runs the mapping's
//! range is armed against SIGBUS ([`super::sigbus`]), since the file may shrink after the
//! check. Either way the caller gets [`Error::FileTruncated`] instead of a signal that ends
//! the process. What is not covered: a `&[T]` that a caller took from a window's `as_slice`
//! and reads itself (or a NumPy view over a Python window), which faults as any mapping does;
//! the mapping types' unsafe constructors state that contract.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use super::sigbus;
use crate::error::{Error, Result};

/// The file behind a mapping: for its size now, and to name it in errors.
#[derive(Debug)]
pub(crate) struct FileOrigin {
    file: File,
    path: PathBuf,
}

impl FileOrigin {
    pub(crate) fn new(file: File, path: &Path) -> FileOrigin {
        FileOrigin { file, path: path.to_path_buf() }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size now.
    pub(crate) fn size(&self) -> Result<u64> {
        self.file.metadata().map(|metadata| metadata.len()).map_err(|source| Error::Io {
            context: format!("reading the size of {}", self.path.display()),
            source,
        })
    }

    /// An error unless the file still holds bytes `start..end`.
    pub(crate) fn check_holds(&self, start: u64, end: u64) -> Result<()> {
        let size = self.size()?;
        if size < end {
            return Err(Error::FileTruncated {
                path: Some(self.path.clone()),
                range: start..end,
                detail: format!("the file is {size} bytes now"),
            });
        }
        Ok(())
    }
}

/// Where a buffer's bytes lie in a mapped file, for the checks above: the file (unknown for a
/// mapping made elsewhere, [`super::MappedFile::from_mmap`]), the file offset of the buffer's
/// first byte, and the mapping's record of an earlier fault.
#[derive(Debug, Clone, Copy)]
pub struct FileSpan<'a> {
    pub(crate) origin: Option<&'a FileOrigin>,
    pub(crate) offset: u64,
    pub(crate) faulted: &'a AtomicBool,
}

impl FileSpan<'_> {
    /// The span of a part of the buffer, `bytes` in.
    pub(crate) fn advanced(self, bytes: usize) -> Self {
        FileSpan { offset: self.offset + bytes as u64, ..self }
    }

    /// An error unless the file still holds the `bytes` from the span's start and no earlier
    /// access faulted (the mapping then holds zeros where the file ended).
    pub(crate) fn check(&self, bytes: usize) -> Result<()> {
        let range = self.offset..self.offset + bytes as u64;
        if self.faulted.load(Ordering::Acquire) {
            return Err(self.error(
                range,
                "an earlier access to this mapping faulted, and its pages past the file's end hold \
                 zeros now: drop it and map the file again",
            ));
        }
        match self.origin {
            Some(origin) => origin.check_holds(range.start, range.end),
            None => Ok(()),
        }
    }

    fn error(&self, range: std::ops::Range<u64>, detail: &str) -> Error {
        Error::FileTruncated {
            path: self.origin.map(|origin| origin.path.clone()),
            range,
            detail: detail.to_string(),
        }
    }
}

/// Runs `f`, a loop of hetmem's over the `bytes` at `host` (a mapping of `span`, or memory
/// that is no file's when `span` is `None`): checks the file first, and recovers a SIGBUS from
/// the mapping while `f` runs; either way an [`Error::FileTruncated`], and `f`'s result is
/// dropped when the mapping faulted.
pub(crate) fn guarded<R>(
    span: Option<FileSpan<'_>>,
    host: NonNull<u8>,
    bytes: usize,
    f: impl FnOnce() -> R,
) -> Result<R> {
    let Some(span) = span else { return Ok(f()) };
    span.check(bytes)?;
    let armed = sigbus::arm(host.as_ptr(), bytes);
    let made = f();
    if armed.faulted() {
        drop(armed);
        span.faulted.store(true, Ordering::Release);
        let range = span.offset..span.offset + bytes as u64;
        return Err(span.error(
            range,
            "an access through the mapping faulted (SIGBUS): the file was truncated while hetmem read \
             or wrote it, or its storage failed to read a page; what was made of those bytes is \
             discarded",
        ));
    }
    Ok(made)
}
