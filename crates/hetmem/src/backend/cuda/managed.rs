//! Managed (unified) memory: one address valid on host and device, migrated by the driver.

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::{Context, Release};
use super::entry::{self, Location};
use super::{Call, CudaDevice, Stream};
use crate::backend::error::{BackendError, Result};

/// Where managed memory should live or be prefetched to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemLocation {
    /// Host memory.
    Host,
    /// The memory of the device with this ordinal.
    Device(usize),
}

impl MemLocation {
    fn raw(self) -> Location {
        match self {
            MemLocation::Host => Location::host(),
            MemLocation::Device(ordinal) => Location::device(ordinal),
        }
    }
}

/// Advice about how managed memory will be used (`cuMemAdvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Mostly read: the driver may keep read-only copies on several processors.
    ReadMostly,
    /// Prefer to keep the pages at this location.
    PreferredLocation(MemLocation),
    /// This location will access the memory: map it there to avoid faults.
    AccessedBy(MemLocation),
}

/// Which streams' work managed memory is associated with (`cuStreamAttachMemAsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// Every stream of every device (`CU_MEM_ATTACH_GLOBAL`): how it is allocated.
    Global,
    /// One stream (`CU_MEM_ATTACH_SINGLE`): the driver needs to keep the memory coherent with
    /// that stream's work only, so the CPU may touch it once that stream is idle, whatever
    /// other streams run.
    Single,
}

/// Managed memory (`cuMemAllocManaged`, attached globally), freed on drop.
#[derive(Debug)]
pub struct ManagedAlloc {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Context>,
}

// SAFETY: a managed allocation is plain memory owned by this value; the address is valid from
// any thread, and every driver call binds the context first.
unsafe impl Send for ManagedAlloc {}
// SAFETY: shared references expose only the address; access to the bytes is governed above.
unsafe impl Sync for ManagedAlloc {}

impl ManagedAlloc {
    /// Allocates `bytes` of managed memory.
    ///
    /// # Errors
    /// Zero bytes, or the driver's error.
    pub fn new(device: &CudaDevice, bytes: usize) -> Result<ManagedAlloc> {
        if bytes == 0 {
            return Err(BackendError::invalid(
                "managed allocation size",
                "0 bytes: allocate at least 1 byte",
            ));
        }
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Allocation)?;
        device.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is bound; the call writes one address, freed once in Drop.
        unsafe {
            sys::cuMemAllocManaged(&mut ptr, bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32)
        }
        .call("cuMemAllocManaged")?;
        Ok(ManagedAlloc { ptr, bytes, ctx: Arc::clone(device.context()) })
    }

    /// The address, the same on host and device.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// Queues a migration of the whole allocation to `location` on `stream`.
    ///
    /// # Safety
    /// As for [`ManagedAlloc::prefetch_range`].
    ///
    /// # Errors
    /// The driver's error (a device without concurrent managed access rejects prefetches).
    pub unsafe fn prefetch(&self, stream: &Stream, location: MemLocation) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.prefetch_range(stream, location, 0, self.bytes) }
    }

    /// Queues a migration of `len` bytes from byte `offset` to `location` on `stream`: only
    /// the part a kernel is about to read, where the allocation is larger.
    ///
    /// # Safety
    /// The migration runs after this returns: the allocation must stay alive until `stream`
    /// has finished it (synchronise the stream, or hold the allocation through a lease of the
    /// hand-off, whose fence covers the prefetch), since nothing here keeps it.
    ///
    /// # Errors
    /// A range that is empty or runs past the allocation, or the driver's error.
    pub unsafe fn prefetch_range(
        &self,
        stream: &Stream,
        location: MemLocation,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(BackendError::invalid(
                "managed prefetch range",
                format!("{len} bytes at offset {offset} of a {}-byte allocation", self.bytes),
            ));
        }
        stream.bind()?;
        // SAFETY: the range lies inside this live allocation (checked above); prefetching moves
        // pages without changing their contents, so it cannot race any access. The stream is a
        // live stream of this context, bound above.
        unsafe { entry::mem_prefetch_async(self.ptr + offset as u64, len, location.raw(), stream.raw()) }?;
        Ok(())
    }

    /// Queues on `stream` the association of the whole allocation with `attachment`: with
    /// `stream` alone ([`Attachment::Single`]) or with every stream ([`Attachment::Global`]).
    /// It takes effect when `stream` reaches it.
    ///
    /// # Safety
    /// As for [`ManagedAlloc::prefetch_range`]: the allocation must stay alive until `stream`
    /// has passed the call. And until then, and for as long as it is attached to `stream`
    /// alone, the caller must keep the CPU's accesses to times when `stream` is idle (on a
    /// device without concurrent managed access, any other access faults).
    ///
    /// # Errors
    /// The driver's error.
    pub unsafe fn attach(&self, stream: &Stream, attachment: Attachment) -> Result<()> {
        let flags = match attachment {
            Attachment::Global => sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL,
            Attachment::Single => sys::CUmemAttach_flags::CU_MEM_ATTACH_SINGLE,
        };
        stream.bind()?;
        // SAFETY: the address is this live allocation's start and the length 0 means all of
        // it, as the call requires of managed memory; the stream is a live stream of this
        // context, bound above. Attaching changes only which streams' work the driver keeps
        // the pages coherent with, not their contents; the caller keeps the CPU's accesses
        // within what the attachment allows.
        unsafe { sys::cuStreamAttachMemAsync(stream.raw(), self.ptr, 0, flags as u32) }
            .call("cuStreamAttachMemAsync")?;
        Ok(())
    }

    /// Gives the driver advice about the whole allocation.
    ///
    /// # Errors
    /// The driver's error.
    pub fn advise(&self, advice: Advice) -> Result<()> {
        self.ctx.bind()?;
        let (raw, location) = match advice {
            Advice::ReadMostly => (sys::CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY, MemLocation::Host),
            Advice::PreferredLocation(location) => {
                (sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, location)
            }
            Advice::AccessedBy(location) => (sys::CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY, location),
        };
        // SAFETY: the range is this live allocation; advice changes placement policy only.
        unsafe { entry::mem_advise(self.ptr, self.bytes, raw, location.raw()) }?;
        Ok(())
    }
}

impl Drop for ManagedAlloc {
    fn drop(&mut self) {
        // Allocated by cuMemAllocManaged and freed once; the owners above never let this drop
        // while GPU work that uses it is pending.
        self.ctx.release(Release::DeviceMemory(self.ptr));
    }
}
