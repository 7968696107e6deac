//! Page-locked host memory: driver allocations (`cuMemHostAlloc`) and registrations of memory
//! the process already has (`cuMemHostRegister`).
//!
//! These are the raw owners. Who may touch the memory when is decided by the memory and
//! hand-off layers above; here each type only guarantees that the memory stays pinned (and
//! mapped) for as long as it lives, and is released once.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{Context, Keep, Release};
use super::{Call, CudaDevice};
use crate::backend::cuda::error::CudaError;
use crate::backend::error::{BackendError, Result};

/// Flags of a pinned allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HostAllocFlags {
    /// Usable from every CUDA context, not only the allocating one (`PORTABLE`).
    pub portable: bool,
    /// Mapped into the device's address space, for zero-copy kernels (`DEVICEMAP`).
    pub device_map: bool,
    /// Write-combined (`WRITECOMBINED`): can be faster for the GPU to read over PCIe; CPU reads
    /// bypass the cache (documented as very slow on bare metal).
    pub write_combined: bool,
}

impl HostAllocFlags {
    fn bits(self) -> u32 {
        let mut bits = 0;
        if self.portable {
            bits |= sys::CU_MEMHOSTALLOC_PORTABLE;
        }
        if self.device_map {
            bits |= sys::CU_MEMHOSTALLOC_DEVICEMAP;
        }
        if self.write_combined {
            bits |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        }
        bits
    }
}

/// Flags of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RegisterFlags {
    /// Usable from every CUDA context (`PORTABLE`).
    pub portable: bool,
    /// Mapped into the device's address space (`DEVICEMAP`).
    pub device_map: bool,
    /// The device only reads the memory (`READ_ONLY`). Required for read-only mappings
    /// such as a `PROT_READ` file mapping, which fail with `CUDA_ERROR_INVALID_VALUE` otherwise.
    pub read_only: bool,
}

impl RegisterFlags {
    fn bits(self) -> u32 {
        let mut bits = 0;
        if self.portable {
            bits |= sys::CU_MEMHOSTREGISTER_PORTABLE;
        }
        if self.device_map {
            bits |= sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        }
        if self.read_only {
            bits |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        bits
    }
}

/// The device address of pinned host memory at `host`, in the bound context.
fn device_pointer(host: *mut u8) -> Result<u64, CudaError> {
    let mut device = 0;
    // SAFETY: the driver only looks `host` up among the pinned ranges the bound context can
    // use (it never dereferences it; an unknown address is CUDA_ERROR_INVALID_VALUE); the call
    // writes one CUdeviceptr.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }
        .call("cuMemHostGetDevicePointer")?;
    Ok(device)
}

/// The address kernels on `device` use for mapped pinned host memory at `host`, which may have
/// been pinned in another device's context with the portable flag
/// (`cuMemHostGetDevicePointer` in `device`'s context; with unified addressing it is the host
/// address, but the driver is asked rather than assumed).
///
/// # Errors
/// Memory this device's context cannot use (not portable, not mapped), or a driver failure.
pub(crate) fn mapped_address(device: &CudaDevice, host: *mut u8) -> Result<u64, CudaError> {
    device.bind()?;
    device_pointer(host)
}

/// Host memory allocated page-locked by the driver (`cuMemHostAlloc`), freed on drop.
#[derive(Debug)]
pub struct PinnedAlloc {
    ptr: *mut u8,
    bytes: usize,
    device_ptr: Option<u64>,
    portable: bool,
    ctx: Arc<Context>,
}

// SAFETY: the allocation is plain memory owned by this value; the pointer is not tied to a
// thread, and freeing it binds the context first.
unsafe impl Send for PinnedAlloc {}
// SAFETY: shared references expose only the addresses; access to the bytes is governed by the
// owning layers above.
unsafe impl Sync for PinnedAlloc {}

impl PinnedAlloc {
    /// Allocates `bytes` of pinned host memory. The memory is page-aligned and uninitialised:
    /// [`PinnedAlloc::zeroed`] before any reference to it is formed.
    ///
    /// # Errors
    /// Zero bytes, or the driver's error (out of memory).
    pub fn new(device: &CudaDevice, bytes: usize, flags: HostAllocFlags) -> Result<PinnedAlloc> {
        if bytes == 0 {
            return Err(BackendError::invalid("pinned allocation size", "0 bytes: allocate at least 1 byte"));
        }
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Allocation)?;
        device.bind()?;
        // SAFETY: the context is bound and the size non-zero; the pointer is freed once, in Drop.
        let ptr = unsafe { result::malloc_host(bytes, flags.bits()) }.call("cuMemHostAlloc")? as *mut u8;
        let mut alloc = PinnedAlloc {
            ptr,
            bytes,
            device_ptr: None,
            portable: flags.portable,
            ctx: Arc::clone(device.context()),
        };
        if flags.device_map {
            alloc.device_ptr = Some(device_pointer(ptr)?);
        }
        Ok(alloc)
    }

    /// Allocates `bytes` of pinned host memory, every byte zero: the driver does not promise
    /// the contents of its allocations, and a reference (a slice, an atomic) over bytes never
    /// written would be undefined behaviour.
    ///
    /// # Errors
    /// As for [`PinnedAlloc::new`].
    pub fn zeroed(device: &CudaDevice, bytes: usize, flags: HostAllocFlags) -> Result<PinnedAlloc> {
        let alloc = PinnedAlloc::new(device, bytes, flags)?;
        // SAFETY: the allocation holds `bytes` bytes at `ptr`, owned by `alloc`; nothing else
        // refers to it yet, and no GPU work has been queued on it.
        unsafe { std::ptr::write_bytes(alloc.ptr, 0, alloc.bytes) };
        Ok(alloc)
    }

    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The device address, when allocated with `device_map`.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// Whether every context of the process may use it (allocated with `portable`).
    pub fn is_portable(&self) -> bool {
        self.portable
    }
}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        // `ptr` came from cuMemHostAlloc and is freed once; the owners above never let this
        // drop while GPU work that uses it is pending.
        self.ctx.release(Release::PinnedHost(self.ptr as usize));
    }
}

/// A registered (page-locked, optionally mapped) range of memory the process already owns,
/// and the owner of that memory, which it frees only after unregistering the range (also when
/// that waits for resident kernels). Unregistered on drop.
///
/// A range larger than `max_chunk` is registered in pieces. That is only done where the device
/// uses host addresses for registered memory, so the pieces stay one contiguous range on the
/// device as well; elsewhere such a range is refused.
pub struct Registration {
    ptr: *mut u8,
    bytes: usize,
    chunks: Vec<*mut u8>,
    device_ptr: Option<u64>,
    portable: bool,
    ctx: Arc<Context>,
    /// The owner of the memory the range covers: freed only after the range is unregistered.
    covers: Option<Keep>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("bytes", &self.bytes)
            .field("pieces", &self.chunks.len())
            .field("mapped", &self.device_ptr.is_some())
            .finish_non_exhaustive()
    }
}

// SAFETY: the registration holds addresses, and an owner that is Send itself; unregistering
// binds the context first.
unsafe impl Send for Registration {}
// SAFETY: shared references expose only the addresses.
unsafe impl Sync for Registration {}

/// A registration that failed: why, and the owner of the memory handed back.
#[derive(Debug)]
pub struct RegistrationFailed<M> {
    /// Why it failed.
    pub error: BackendError,
    /// The owner, unregistered; `None` when the registration failed part-way while a resident
    /// kernel runs: the pieces registered before the failure are unregistered once the resident
    /// kernels end, and the owner is kept until then (then dropped).
    pub owner: Option<M>,
}

impl Registration {
    /// Registers `[ptr, ptr + bytes)` with `device`, in pieces of at most `max_chunk` bytes,
    /// and takes `owner`, whose memory the range covers, so that it is freed only after the
    /// range is unregistered: while a resident kernel runs, unregistering waits, and memory
    /// unmapped before then could be mapped and registered again meanwhile. That holds on the
    /// error path too: a registration that fails part-way unregisters the pieces it made, and
    /// keeps `owner` until it has.
    ///
    /// # Safety
    /// The range must be mapped memory of this process that stays mapped while `owner` lives,
    /// and is not registered elsewhere until the returned value is dropped.
    ///
    /// # Errors
    /// Zero bytes; a range that needs several pieces on a device that does not use host
    /// addresses for registered memory; the driver's error (already registered, a read-only
    /// mapping without `read_only`, not supported). The owner comes back in the error when no
    /// piece is left registered.
    #[allow(clippy::result_large_err, reason = "the error hands the caller's memory back, on a cold path")]
    pub unsafe fn register<M: Any + Send + Sync>(
        device: &CudaDevice,
        ptr: *mut u8,
        bytes: usize,
        flags: RegisterFlags,
        max_chunk: usize,
        owner: M,
    ) -> Result<Registration, RegistrationFailed<M>> {
        if bytes == 0 {
            return Err(RegistrationFailed {
                error: BackendError::invalid("registration size", "0 bytes"),
                owner: Some(owner),
            });
        }
        let max_chunk = max_chunk.max(1);
        if bytes > max_chunk && !device.uses_host_pointer_for_registered_memory() {
            let error = BackendError::invalid(
                "registration size",
                format!(
                    "{bytes} bytes exceed one registration ({max_chunk} bytes) and this device does \
                     not map registered memory at its host address, so pieces would not be contiguous"
                ),
            );
            return Err(RegistrationFailed { error, owner: Some(owner) });
        }
        if let Err(error) = crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Registration)
            .and_then(|()| Ok(device.bind()?))
        {
            return Err(RegistrationFailed { error, owner: Some(owner) });
        }
        let mut registration = Registration {
            ptr,
            bytes,
            chunks: Vec::new(),
            device_ptr: None,
            portable: flags.portable,
            ctx: Arc::clone(device.context()),
            covers: None,
        };
        // SAFETY: the caller's contract, passed on.
        match unsafe { registration.register_pieces(flags, max_chunk) } {
            Ok(()) => {
                registration.covers = Some(Box::new(owner));
                Ok(registration)
            }
            Err(error) => Err(RegistrationFailed { error, owner: registration.unwind(owner) }),
        }
    }

    /// Registers the range piece by piece, noting each piece as it succeeds, and finds its
    /// device address.
    ///
    /// # Safety
    /// As for [`Registration::register`].
    unsafe fn register_pieces(&mut self, flags: RegisterFlags, max_chunk: usize) -> Result<()> {
        let (ptr, bytes) = (self.ptr, self.bytes);
        let mut offset = 0;
        while offset < bytes {
            let len = max_chunk.min(bytes - offset);
            // SAFETY: the piece lies inside the caller's range, which stays mapped while the
            // owner lives (the contract); the owner is kept until every piece noted here is
            // unregistered, on the error path too (`unwind`).
            let chunk = unsafe { ptr.add(offset) };
            if offset > 0 {
                crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Registration)?;
            }
            // SAFETY: as above.
            unsafe { sys::cuMemHostRegister_v2(chunk.cast::<c_void>(), len, flags.bits()) }
                .call("cuMemHostRegister")?;
            self.chunks.push(chunk);
            offset += len;
        }
        if flags.device_map {
            let base = device_pointer(ptr)?;
            for &chunk in &self.chunks[1..] {
                let expected = base + (chunk as u64 - ptr as u64);
                let actual = device_pointer(chunk)?;
                if actual != expected {
                    return Err(BackendError::invalid(
                        "registration",
                        format!("piece at {chunk:p} maps to {actual:#x}, not {expected:#x}: not contiguous"),
                    ));
                }
            }
            self.device_ptr = Some(base);
        }
        Ok(())
    }

    /// Unregisters the pieces registered so far, keeping `owner` until they are; hands it back
    /// when that happened now.
    fn unwind<M: Any + Send + Sync>(mut self, owner: M) -> Option<M> {
        let releases = unregistering(&mut self.chunks);
        if releases.is_empty() {
            return Some(owner);
        }
        let kept = self.ctx.release_all_keeping(releases, Box::new(owner))?;
        kept.downcast::<M>().ok().map(|owner| *owner)
    }

    /// The host address of the range.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// How many driver registrations make up the range.
    pub fn pieces(&self) -> usize {
        self.chunks.len()
    }

    /// The device address, when registered with `device_map`.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// Whether every context of the process may use it (registered with `portable`).
    pub fn is_portable(&self) -> bool {
        self.portable
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Each piece was registered by this value and is unregistered once; the memory they
        // cover goes after the last.
        let releases = unregistering(&mut self.chunks);
        match self.covers.take() {
            Some(owner) => drop(self.ctx.release_all_keeping(releases, owner)),
            None => releases.into_iter().for_each(|release| self.ctx.release(release)),
        }
    }
}

/// The releases that unregister `chunks`, which are left empty.
fn unregistering(chunks: &mut Vec<*mut u8>) -> Vec<Release> {
    chunks.drain(..).map(|chunk| Release::Registration(chunk as usize)).collect()
}
