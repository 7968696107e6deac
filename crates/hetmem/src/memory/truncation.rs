//! Files truncated under their mappings: what hetmem's own CPU loops over a file mapping do
//! about it.
//!
//! While a loop reads or writes a mapping (a copy, a checksum, an operation's CPU path), the
//! mapping's range is armed against SIGBUS ([`super::sigbus`]): a fault on a page the file no
//! longer holds is recovered, and the caller gets [`Error::FileTruncated`] (or
//! [`Error::FileUnreadable`] when the file still holds the page, which its storage failed to
//! read) instead of a signal that ends the process. The file's size is read (one `fstat`) only
//! after a fault, or before the loop where the range cannot be armed. What is not covered: a
//! `&[T]` that a caller took from a window's `as_slice` and reads itself (or a NumPy view over
//! a Python window), which faults as any mapping does; the mapping types' unsafe constructors
//! state that contract.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use super::sigbus::{self, Fault};
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
/// first byte, whether the mapping may be written, and the mapping's record of an earlier
/// fault.
#[derive(Debug, Clone, Copy)]
pub struct FileSpan<'a> {
    pub(crate) origin: Option<&'a FileOrigin>,
    pub(crate) offset: u64,
    pub(crate) writable: bool,
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
        self.check_not_faulted(bytes)?;
        match self.origin {
            Some(origin) => origin.check_holds(self.offset, self.offset + bytes as u64),
            None => Ok(()),
        }
    }

    /// An error if an earlier access to the mapping faulted.
    fn check_not_faulted(&self, bytes: usize) -> Result<()> {
        if self.faulted.load(Ordering::Acquire) {
            return Err(self.truncated(
                self.offset..self.offset + bytes as u64,
                "an earlier access to this mapping faulted, and its pages past the fault hold \
                 zeros now: drop it and map the file again",
            ));
        }
        Ok(())
    }

    fn truncated(&self, range: std::ops::Range<u64>, detail: &str) -> Error {
        Error::FileTruncated {
            path: self.origin.map(|origin| origin.path.clone()),
            range,
            detail: detail.to_string(),
        }
    }

    /// The error for a fault recovered in the `bytes` from the span's start (`fault`, where
    /// this loop's range recorded it; `None` for one another access recorded in the mapping
    /// while this loop ran): a truncation, or a page its storage could not read.
    fn fault_error(&self, bytes: usize, fault: Option<Fault>) -> Error {
        let range = self.offset..self.offset + bytes as u64;
        let size = self.origin.map(FileOrigin::size);
        let unreadable = || Error::FileUnreadable {
            path: self.origin.map(|origin| origin.path.clone()),
            range: range.clone(),
        };
        match (fault, size) {
            // Another loop's fault, recorded in the mapping while this one ran.
            (None, _) => self.truncated(
                range.clone(),
                "another access to this mapping faulted while hetmem read or wrote it, and its \
                 pages past the fault hold zeros now; what was made of those bytes is discarded: \
                 drop the mapping and map the file again",
            ),
            (Some(Fault::Unreadable), _) => unreadable(),
            (Some(Fault::Unknown), Some(Ok(size))) if size >= range.end => unreadable(),
            (_, Some(Ok(size))) => self.truncated(
                range.clone(),
                &format!(
                    "the file is {size} bytes now: it was truncated while hetmem read or wrote \
                     it (SIGBUS, recovered); what was made of those bytes is discarded"
                ),
            ),
            // The size is unknown (a mapping made elsewhere, or fstat failed): a truncation is
            // the likely cause.
            _ => self.truncated(
                range.clone(),
                "an access through the mapping faulted (SIGBUS, recovered): the file was truncated \
                 while hetmem read or wrote it, or its storage failed to read a page; what was \
                 made of those bytes is discarded",
            ),
        }
    }
}

/// Runs `f`, a loop of hetmem's over the `bytes` at `host` (a mapping of `span`, or memory
/// that is no file's when `span` is `None`), with the mapping armed against SIGBUS: a fault
/// while `f` runs is recovered, `f`'s result dropped, and the call answers
/// [`Error::FileTruncated`] or [`Error::FileUnreadable`]. A mapping that faulted before is
/// refused at once. Where the range cannot be armed, the file's size is checked before `f`.
///
/// # Safety
/// With a `span`, `host..host + bytes` are the bytes it describes: a range of one file
/// mapping, which stays mapped while this runs (SIGBUS recovery maps zeros over its pages).
pub(crate) unsafe fn guarded<R>(
    span: Option<FileSpan<'_>>,
    host: NonNull<u8>,
    bytes: usize,
    f: impl FnOnce() -> R,
) -> Result<R> {
    let Some(span) = span else { return Ok(f()) };
    span.check_not_faulted(bytes)?;
    let mapping = sigbus::Mapping {
        writable: span.writable,
        file: span.origin.map(|origin| (origin.file().as_fd(), span.offset)),
        faulted: span.faulted,
    };
    // Unarmed (no handler, or every slot taken), the file is checked first. A panic in `f`
    // disarms the range on the way out; the handler has recorded a fault in the mapping
    // already, so later accesses are refused.
    let check_unless_armed = |armed: bool| if armed { Ok(()) } else { span.check(bytes) };
    // SAFETY: the caller's contract: `host..host + bytes` are the span's bytes, in one file
    // mapping that stays mapped while this runs.
    let (made, fault) = unsafe { sigbus::with_armed(host.as_ptr(), bytes, mapping, check_unless_armed, f) }?;
    // The mapping's record too: a fault another loop met while this one ran may have zeroed
    // pages this one read without faulting.
    if fault.is_some() || span.faulted.load(Ordering::Acquire) {
        return Err(span.fault_error(bytes, fault));
    }
    Ok(made)
}
