//! The windows themselves: [`FileWindow`] (read-only) and [`FileWindowMut`] (read-write), the
//! buffers a program holds, lends and shares.

use std::marker::PhantomData;
use std::ops::Range;

use super::super::{Buffer, Element, FileSpan, HostVisible, Region, Sealed, WritableBuffer};
use super::io;
use super::mapping::{Mapping, WindowMapping};
use crate::backend::cpu::memory::page_size;
use crate::error::{Error, Result};

/// A read-only window of a [`WindowedFile`](super::WindowedFile): the bytes of a range as `T`s, mapped and
/// registered read-only with the GPU (plain on the CPU backend) while it lives. Nothing can
/// write it, so it is shared with the GPU ([`crate::Queue::share`]), never lent.
///
/// The file's safety contract ([`WindowedFile`](super::WindowedFile)) holds while the window lives.
#[derive(Debug)]
pub struct FileWindow<T> {
    pub(super) mapping: WindowMapping,
    pub(super) _elems: PhantomData<T>,
}

/// A read-write window of a [`WindowedFile`](super::WindowedFile): the bytes of a range as `T`s,
/// mapped `MAP_SHARED` on the CPU backend, staged in pinned mapped memory on a GPU (written back
/// by [`FileWindowMut::flush`] and when dropped; see
/// [`WindowedFile::window_mut`](super::WindowedFile::window_mut)). The CPU writes it through
/// [`FileWindowMut::as_mut_slice`], kernels through a [`crate::Lent`] lease;
/// [`FileWindowMut::flush`] makes what both wrote durable in the file.
///
/// The file's safety contract ([`WindowedFile`](super::WindowedFile)) holds while the window lives.
#[derive(Debug)]
pub struct FileWindowMut<T> {
    pub(super) mapping: WindowMapping,
    pub(super) _elems: PhantomData<T>,
}

macro_rules! window_common {
    ($window:ident) => {
        impl<T: Element> $window<T> {
            /// The number of elements.
            pub fn len(&self) -> usize {
                self.mapping.bytes() / size_of::<T>()
            }

            /// Always false: windows hold at least one element.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The window's bytes in the file.
            pub fn file_range(&self) -> Range<u64> {
                self.mapping.range.clone()
            }

            /// The elements.
            pub fn as_slice(&self) -> &[T] {
                // SAFETY: `len` elements at `host`, mapped while the window lives and aligned
                // for `T` (checked when the window was made); every bit pattern is a valid `T`
                // (Pod); nothing writes them while `&self` is held (a read-write window is
                // written only through `&mut self` or a Lent lease, which owns it).
                unsafe { std::slice::from_raw_parts(self.mapping.host().as_ptr().cast::<T>(), self.len()) }
            }

            /// Whether kernels on a GPU reach the window directly: a registered mapping, or
            /// (read-write windows) pinned memory staging the range.
            pub fn is_registered(&self) -> bool {
                self.mapping.device_ptr.is_some()
            }

            /// The address kernels use for the window's first element, when registered, on the
            /// device it was registered with.
            pub fn device_ptr(&self) -> Option<u64> {
                self.mapping.device_ptr
            }

            /// Bytes page-locked for the window: whole pages from the one holding its first
            /// byte.
            pub fn locked_bytes(&self) -> usize {
                (self.mapping.lead + self.mapping.bytes()).div_ceil(page_size()) * page_size()
            }
        }

        impl<T: Element> $window<T> {
            /// Checks that the file still holds the window's bytes, and that no access through
            /// the window faulted: before handing the window's memory to code that reads it
            /// unguarded (a NumPy view, say), which a truncated file would crash.
            ///
            /// # Errors
            /// [`Error::FileTruncated`], or the operating system's error reading the file's size.
            pub fn check_file(&self) -> Result<()> {
                match self.mapping.file_span() {
                    Some(span) => span.check(self.mapping.bytes()),
                    None => Ok(()),
                }
            }

            /// Runs `f`, which reads (or, through a read-write window's memory, writes) the
            /// window, with a fault from a truncation while `f` runs recovered: the pages from
            /// the faulting one on read as zeros, `f` returns, its result is dropped and the call
            /// answers [`Error::FileTruncated`]. The window then stays faulted
            /// ([`Self::check_file`] fails, and so does every later guarded call): drop it. A
            /// fault outside the window is not recovered; one on the window from another thread
            /// while `f` runs is (that thread reads zeros where the file ended). A panic in `f`
            /// unwinds through, and the window is marked faulted all the same if it faulted.
            ///
            /// # Errors
            /// [`Error::FileTruncated`]; [`Error::FileUnreadable`] for a fault on a page the
            /// file still holds (its storage failed to read it); the operating system's error
            /// reading the file's size.
            pub fn guard_truncation<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
                self.mapping.guarded(f)
            }
        }

        impl<T: Element> Sealed for $window<T> {
            fn region(&self) -> Region {
                self.mapping.region()
            }

            fn file_span(&self) -> Option<FileSpan<'_>> {
                self.mapping.file_span()
            }
        }

        impl<T: Element> Buffer for $window<T> {
            type Elem = T;

            fn len(&self) -> usize {
                self.mapping.bytes() / size_of::<T>()
            }
        }

        impl<T: Element> HostVisible for $window<T> {}
    };
}

window_common!(FileWindow);
window_common!(FileWindowMut);

impl<T: Element> WritableBuffer for FileWindowMut<T> {}

impl<T: Element> FileWindowMut<T> {
    /// The elements, for the CPU to write.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`; the mapping is writable, the pointer comes from the
        // mutable mapping, and `&mut self` makes the access exclusive (no other window of the
        // file overlaps this one).
        unsafe { std::slice::from_raw_parts_mut(self.mapping.host().as_ptr().cast::<T>(), self.len()) }
    }

    /// Writes the whole window to the file and waits until it is there (`msync`).
    ///
    /// # Errors
    /// The operating system's error.
    pub fn flush(&mut self) -> Result<()> {
        self.flush_range(0..self.len())
    }

    /// Writes the elements `range` of the window to the file and waits until they are there.
    ///
    /// A kernel's writes reach the page cache at once (the pages are shared), but the kernel
    /// does not see them as CPU writes: pages the system wrote back while registered would
    /// count as clean. So each page of the range is first marked dirty by a CPU write of its
    /// own first byte, then synced. Call it after reclaiming the lease the kernel wrote through.
    ///
    /// # Errors
    /// A range past the window; [`Error::FileTruncated`] when the file no longer holds the
    /// window (what was written past its end is lost); the operating system's error.
    pub fn flush_range(&mut self, range: Range<usize>) -> Result<()> {
        if range.start >= range.end || range.end > self.len() {
            return Err(Error::invalid(
                "flush range",
                format!("elements {range:?} of a window of {}", self.len()),
            ));
        }
        let page = page_size();
        let own = self.mapping.lead + range.start * size_of::<T>();
        let first = own / page * page;
        let end = self.mapping.lead + range.end * size_of::<T>();
        let start = self.mapping.start;
        // The touches reach the file's pages: a file truncated under the window answers an
        // error here, not SIGBUS; what the file still holds is synced all the same.
        let touched = self.mapping.guarded(|| {
            for page_start in (first..end).step_by(page) {
                // The window's own byte: a page it shares with a neighbouring window is touched
                // at the first byte of this window in it, never at a byte the neighbour may be
                // writing.
                let offset = page_start.max(own);
                // SAFETY: `offset` is inside the window's own bytes (`own..end`), in its
                // writable mapping; `&mut self` means no lease holds the window, so no GPU work
                // writes it now and no Rust reference into it lives. Writing back the byte read
                // changes no data.
                unsafe {
                    let byte = start.as_ptr().add(offset);
                    byte.write_volatile(byte.read_volatile());
                }
            }
        });
        let synced = match &*self.mapping.map {
            Mapping::ReadWrite(map) => map.flush_range(first, end - first),
            Mapping::Staged(staged) => staged.write_back(own, end - own),
            Mapping::ReadOnly(_) => unreachable!("read-write windows hold writable memory"),
        };
        synced.map_err(|source| {
            io(format!("syncing bytes {:?} of a file window", self.mapping.range), source)
        })?;
        touched?;
        // A file that shrank meanwhile dropped the window's pages past its end, synced or not.
        self.check_file()
    }
}
