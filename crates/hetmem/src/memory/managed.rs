//! [`ManagedBuf`]: managed (unified) memory, one address on both sides, migrated by the driver.

use std::ptr::NonNull;

use super::Element;
use super::{Buffer, Region, Sealed, WritableBuffer};
use crate::backend::Device;
use crate::backend::cpu::memory::byte_len;
use crate::backend::cuda::{Advice, ManagedAlloc};
use crate::backend::memory::ManagedMemory;
use crate::error::Result;

/// `len` elements of managed memory (plain memory on the CPU backend).
///
/// The CPU touches it while it holds the buffer; the pages then migrate to the host. Lent to
/// GPU work, it migrates on first touch there (slow, page faults) unless prefetched with
/// [`crate::Lent::prefetch`]. Only devices where CPU and GPU may touch managed memory at once
/// (`concurrent_managed_access`) get managed buffers: elsewhere a CPU access during any GPU
/// work would crash the process.
pub struct ManagedBuf<T> {
    storage: ManagedMemory,
    ptr: NonNull<T>,
    len: usize,
    device_ordinal: Option<usize>,
}

// SAFETY: the buffer owns its memory exclusively, like a Box<[T]>; T: Pod is plain data.
unsafe impl<T: Element> Send for ManagedBuf<T> {}
// SAFETY: shared references give out only &[T].
unsafe impl<T: Element> Sync for ManagedBuf<T> {}

impl<T: Element> ManagedBuf<T> {
    /// `len` zeroed elements of managed memory on `device`.
    ///
    /// # Errors
    /// Zero length, size overflow, a device without concurrent managed access, or the
    /// driver's error.
    pub fn new(device: &Device, len: usize) -> Result<ManagedBuf<T>> {
        let bytes = byte_len::<T>("managed buffer length", len)?;
        let storage = device.allocate_managed(bytes)?;
        let ptr = storage.host_ptr();
        let device_ordinal = device.gpu_ordinal();
        Ok(ManagedBuf { storage, ptr: ptr.cast(), len, device_ordinal })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements (migrating pages to the host as they are touched).
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements at `ptr`; holding the buffer by value means no GPU
        // work uses it, and concurrent managed access lets the CPU touch it at any time.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in as_slice; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Tells the driver how the memory will be used. Does nothing on the CPU backend.
    ///
    /// # Errors
    /// The driver's error.
    pub fn advise(&self, advice: Advice) -> Result<()> {
        Ok(self.storage.advise(advice)?)
    }

    /// The driver allocation, for prefetches and kernels given its address on a stream of your
    /// own (none on the CPU backend).
    pub fn managed_alloc(&self) -> Option<&ManagedAlloc> {
        self.storage.managed_alloc()
    }
}

impl<T: Element> Sealed for ManagedBuf<T> {
    fn region(&self) -> Region {
        Region {
            host: Some(self.ptr.cast()),
            device: self.storage.device_ptr(),
            bytes: self.len * size_of::<T>(),
            device_ordinal: self.device_ordinal,
            pages: None,
            read_only: false,
            portable: false,
        }
    }
}

impl<T: Element> Buffer for ManagedBuf<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.len
    }
}

impl<T: Element> WritableBuffer for ManagedBuf<T> {}

impl<T> std::fmt::Debug for ManagedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedBuf").field("len", &self.len).finish_non_exhaustive()
    }
}
