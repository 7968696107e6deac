//! A window's memory ([`Mapping`]: the file mapped, or a read-write window's staging memory on
//! a GPU) and what every window holds ([`WindowMapping`]: the mapping, its registration and
//! its claim on the file's range).

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use memmap2::{Mmap, MmapMut};

use super::super::claims::Claim;
use super::super::{FileOrigin, FileSpan, Region, guarded};
use crate::backend::cpu::memory::page_size;
use crate::backend::cuda::PinnedAlloc;
use crate::backend::memory::HostMemory;
use crate::error::Result;

/// A window's memory: a read-only or read-write mapping of the file, or, for a read-write
/// window on a GPU, pinned memory staging the range
/// ([`WindowedFile::window_mut`](super::WindowedFile::window_mut)).
#[derive(Debug)]
pub(super) enum Mapping {
    ReadOnly(#[allow(dead_code, reason = "held only to keep the mapping until the window drops")] Mmap),
    ReadWrite(MmapMut),
    Staged(Staged),
}

/// A read-write window's bytes in pinned mapped memory, and where they go in the file.
#[derive(Debug)]
pub(super) struct Staged {
    pub(super) alloc: PinnedAlloc,
    pub(super) file: std::fs::File,
    pub(super) offset: u64,
}

impl Staged {
    /// Writes `bytes` of the staging memory from `from` to the file, and waits until the file
    /// holds them.
    pub(super) fn write_back(&self, from: usize, bytes: usize) -> std::io::Result<()> {
        // SAFETY: `from + bytes` is within the allocation (callers pass a range of the window);
        // no GPU work writes it now (the window is not lent: `&mut` or being dropped).
        let data = unsafe { std::slice::from_raw_parts(self.alloc.host_ptr().add(from), bytes) };
        self.file.write_all_at(data, self.offset + from as u64)?;
        self.file.sync_data()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // As a shared mapping would, the window's last contents reach the file.
        if let Err(error) = self.write_back(0, self.alloc.len_bytes()) {
            tracing::error!("writing a read-write file window back at byte {} failed: {error}", self.offset);
        }
    }
}

/// What both kinds of window hold: the mapping (from the page holding the window's first byte),
/// its registration, and the window's claim on the file's range.
#[derive(Debug)]
pub(super) struct WindowMapping {
    /// Holds a second reference to the mapping, so it is unmapped only after the range is
    /// unregistered (which waits while a resident kernel runs).
    #[allow(dead_code, reason = "held only to keep the range registered until the window drops")]
    pub(super) registration: Option<HostMemory>,
    pub(super) map: Arc<Mapping>,
    /// The file, when the window maps it (not for staged memory, which the CPU reads safely).
    pub(super) origin: Option<Arc<FileOrigin>>,
    /// Whether a CPU access faulted on a page past the file's end (see `truncation`).
    pub(super) faulted: AtomicBool,
    /// The mapping's first byte.
    pub(super) start: NonNull<u8>,
    /// Bytes mapped before the window's first byte (its offset in its page).
    pub(super) lead: usize,
    /// The window's bytes in the file.
    pub(super) range: Range<u64>,
    /// The device address of the window's first byte, when registered.
    pub(super) device_ptr: Option<u64>,
    pub(super) device_ordinal: Option<usize>,
    /// Released last, once the window is unmapped or its unmapping is queued.
    pub(super) _claim: Claim,
}

// SAFETY: `start` points into the mapping this value owns (through `map`), which is freed with
// it; the CPU reaches the bytes only through the window's methods, which follow `&`/`&mut`.
unsafe impl Send for WindowMapping {}
// SAFETY: as for Send: shared references hand out only shared slices.
unsafe impl Sync for WindowMapping {}

impl WindowMapping {
    pub(super) fn bytes(&self) -> usize {
        (self.range.end - self.range.start) as usize
    }

    /// The window's first byte.
    pub(super) fn host(&self) -> NonNull<u8> {
        // SAFETY: `lead` bytes into the mapping, which is `lead + bytes()` long.
        unsafe { self.start.add(self.lead) }
    }

    pub(super) fn file_span(&self) -> Option<FileSpan<'_>> {
        let origin = self.origin.as_deref()?;
        Some(FileSpan {
            origin: Some(origin),
            offset: self.range.start,
            writable: matches!(*self.map, Mapping::ReadWrite(_)),
            faulted: &self.faulted,
        })
    }

    /// Runs `f` over the window's bytes with the file checked and a fault recovered.
    pub(super) fn guarded<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        // SAFETY: the span is this window's, whose bytes start at `host()` in its own mapping,
        // which `self` keeps mapped.
        unsafe { guarded(self.file_span(), self.host(), self.bytes(), f) }
    }

    pub(super) fn region(&self) -> Region {
        let mapped = self.lead + self.bytes();
        Region {
            host: Some(self.host()),
            device: self.device_ptr,
            bytes: self.bytes(),
            device_ordinal: self.device_ordinal,
            // The mapping is the window's own, so all its pages may be protected; the staging
            // memory of a read-write window on a GPU is the driver's, so it is not.
            pages: match *self.map {
                Mapping::Staged(_) => None,
                _ => Some((self.start, mapped.div_ceil(page_size()) * page_size())),
            },
            read_only: matches!(*self.map, Mapping::ReadOnly(_)),
            portable: false,
        }
    }
}
