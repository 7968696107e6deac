//! Typed buffers in every kind of memory the CPU and a GPU can share.
//!
//! | type | memory | CPU access | GPU access |
//! |---|---|---|---|
//! | [`HostBuf`] | pinned by the driver, or registered (a [`PageBox`], a page-aligned `Vec`) | yes | mapped: zero-copy; else copies |
//! | [`MappedFile`] | a read-only file mapping, registered read-only | read | read (zero-copy) |
//! | [`FileWindow`], [`FileWindowMut`] | a byte range of a [`WindowedFile`], mapped and registered while it lives (read-only, or read-write `MAP_SHARED`) | read / read-write | read / read-write (zero-copy) |
//! | [`CachedWindow`] | a read-only window kept by a [`WindowCache`] within a [`PinnedBudget`] | read | read (zero-copy) |
//! | [`ManagedBuf`] | managed memory, migrated on demand or by prefetch | yes | yes |
//! | [`DeviceBuf`] | device memory | through copies | yes |
//! | [`SharedHostBuf`] | a sealed `memfd` or `/dev/shm` segment shared with other processes, registered in each | yes | mapped: zero-copy |
//!
//! A [`Chunk`] or [`ReadChunk`] of a [`Chunked`] buffer of any kind is a buffer too: a range
//! of it, lent or shared on its own. A [`DeviceBudget`] caps the device memory
//! [`DeviceBuf::with_budget`] allocates.
//!
//! Every kind also exists on the CPU backend, as plain page-aligned memory, so code written
//! against hetmem runs unchanged without a GPU.
//!
//! # The zero-copy contract
//! A buffer held by value belongs to the CPU: it hands out `&[T]` and `&mut [T]`, and no GPU
//! work that uses it is pending. To let the GPU use it, a [`crate::Queue`] takes it by value
//! and returns a lease ([`crate::Lent`] for GPU reads and writes, [`crate::Shared`] for reads
//! by both sides); while the lease lives, safe code cannot reach the buffer's memory from the
//! CPU (or, for `Shared`, can only read it). Reclaiming the lease waits for the GPU work and
//! gives the buffer back; dropping it waits too, so memory is never freed under the GPU.
//! Host memory is page-aligned; device addresses are at least 256-byte aligned.
//!
//! The contract covers GPU work that hetmem queues or that runs through a lease. A slice the
//! CPU holds (`&[T]`, `&mut [T]`) handed to another crate's asynchronous copy is not covered:
//! cudarc's `memcpy_dtoh`, `memcpy_htod` and `clone_htod` take such a slice for pageable memory
//! and return before the driver has finished copying into or out of page-locked memory, so the
//! copy is still running when the borrow ends. Give cudarc a lent buffer's
//! [`crate::Lent::cudarc_host_mut`] instead, or synchronise the stream before the buffer is
//! touched, dropped or lent again.

mod budget;
mod chunked;
mod claims;
mod device;
pub(crate) mod fd_passing;
mod file;
mod host;
mod in_flight;
mod managed;
mod mapped_words;
mod pool;
pub(crate) mod shared;
mod sigbus;
mod truncation;
mod window;
mod window_cache;

pub(crate) use crate::backend::cpu::memory::check_within_memory;
pub use crate::backend::cpu::{HUGE_PAGE_BYTES, PageBox, page_size};
pub use budget::{DeviceBudget, PinnedBudget};
pub use chunked::{Chunk, Chunked, ChunksAlive, ReadChunk};
pub use device::DeviceBuf;
pub use file::MappedFile;
pub use host::{HostBuf, HostKind, PinMethod, PinOptions, RegisterError, RegisterOptions};
pub use in_flight::{InFlight, Wait, Waiter};
pub use managed::ManagedBuf;
pub use mapped_words::MappedKind;
pub(crate) use mapped_words::{LINE_WORDS, MappedView, MappedWords};
pub use pool::{PinnedPool, PoolStats};
pub use shared::{SharedHostBuf, SharedOptions};
pub use window::{FileWindow, FileWindowMut, WindowedFile};
pub use window_cache::{CachedWindow, WindowCache, WindowCacheStats};

use bytemuck::Pod;

mod sealed {
    use std::ptr::NonNull;

    /// Implemented by hetmem's buffers and leases only: this module is private, so code outside
    /// hetmem can neither implement it nor call its method.
    pub trait Sealed {
        /// Where the bytes are.
        fn region(&self) -> Region;

        /// Where the bytes lie in a mapped file, for a buffer that is a file mapping: hetmem's
        /// CPU loops over it check the file's size and recover faults (`truncation`).
        fn file_span(&self) -> Option<super::truncation::FileSpan<'_>> {
            None
        }
    }

    /// Where a buffer's bytes are, for the layers that hand it to the CPU or a GPU. Unnameable
    /// outside hetmem (this module is private): addresses never leave the library.
    #[derive(Debug, Clone, Copy)]
    pub struct Region {
        /// The CPU address of the elements, when the CPU can address them.
        pub(crate) host: Option<NonNull<u8>>,
        /// The address kernels use, when the GPU can address them.
        pub(crate) device: Option<u64>,
        /// The elements' size in bytes.
        pub(crate) bytes: usize,
        /// The CUDA device the memory belongs to; `None` for CPU-backend memory.
        pub(crate) device_ordinal: Option<usize>,
        /// The whole pages the buffer owns (start, length), when it owns whole pages: only such
        /// buffers can be guarded with `mprotect`.
        pub(crate) pages: Option<(NonNull<u8>, usize)>,
        /// The mapping is read-only for the CPU (a file).
        pub(crate) read_only: bool,
        /// Pinned with the portable flag: every CUDA context of the process may use it, not
        /// only the one of `device_ordinal`.
        pub(crate) portable: bool,
    }

    // SAFETY: Region is a description (addresses and sizes); it grants no access by itself.
    unsafe impl Send for Region {}
    // SAFETY: as for Send.
    unsafe impl Sync for Region {}
}
pub(crate) use sealed::{Region, Sealed};
pub(crate) use truncation::{FileOrigin, FileSpan, guarded};

/// The element type of hetmem buffers: plain data (any bit pattern valid, no pointers) that may
/// cross threads. Implemented for every such type.
pub trait Element: Pod + Send + Sync {}

impl<T: Pod + Send + Sync> Element for T {}

/// A buffer of `Elem`s that can be lent to GPU work. Implemented by hetmem's buffer types only.
pub trait Buffer: Sealed + Send + Sync + 'static {
    /// The element type.
    type Elem: Element;

    /// The number of elements.
    fn len(&self) -> usize;

    /// Always false: hetmem buffers hold at least one element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A buffer the GPU may write. Everything but a read-only [`MappedFile`].
pub trait WritableBuffer: Buffer {}

/// A buffer the CPU can read while the GPU reads it too (through a [`crate::Shared`] lease).
pub trait HostVisible: Buffer {}
