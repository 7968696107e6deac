//! Raw device memory.
//!
//! [`DeviceAlloc`] is the backend's untyped allocation. Its copies wait for their stream before
//! returning, so they are safe with any host slice; the typed, overlapping versions live in the
//! memory layer above.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{Context, Release};
use super::split::in_parts;
use super::{Call, CudaDevice, Stream};
use crate::backend::error::{BackendError, Result};

/// A block of device memory (`cuMemAlloc`), freed on drop.
///
/// Allocations are aligned to at least 256 bytes, as the driver guarantees.
#[derive(Debug)]
pub struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<Context>,
}

// SAFETY: a device address is a plain integer valid in its context from any thread; every
// use binds the context first.
unsafe impl Send for DeviceAlloc {}
// SAFETY: shared references only read the address and size, or read the device memory
// (`download`); writing it (`upload`, `zero`) takes `&mut self`. The driver is thread-safe.
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// Allocates `bytes` of device memory.
    ///
    /// # Errors
    /// Zero bytes, or the driver's out-of-memory error.
    pub fn new(device: &CudaDevice, bytes: usize) -> Result<DeviceAlloc> {
        if bytes == 0 {
            return Err(BackendError::invalid("device allocation size", "0 bytes: allocate at least 1 byte"));
        }
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Allocation)?;
        device.bind()?;
        // SAFETY: the context is bound and `bytes` is non-zero; the pointer is freed once, in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.call("cuMemAlloc")?;
        Ok(DeviceAlloc { ptr, bytes, ctx: Arc::clone(device.context()) })
    }

    /// The size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The device address, for kernel arguments.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `src` to the start of this allocation through `stream` and waits for it.
    ///
    /// # Errors
    /// `src` longer than the allocation, or a failed copy.
    pub fn upload(&mut self, stream: &Stream, src: &[u8]) -> Result<()> {
        self.check_fits(src.len())?;
        stream.bind()?;
        let queued = in_parts(src.as_ptr() as usize, src.len(), &mut |at, len| {
            // SAFETY: the destination range [ptr + at, ptr + at + len) lies inside this
            // allocation (checked; `in_parts` stays within `src.len()`); `src` is borrowed until
            // the stream is synchronised below, so the driver never reads it after this
            // function returns.
            unsafe { result::memcpy_htod_async(self.ptr + at as u64, &src[at..at + len], stream.raw()) }
        })
        .call("cuMemcpyHtoDAsync");
        // The parts queued before a refused one still read `src`: wait for them whatever the
        // outcome, before the borrow ends.
        let waited = stream.synchronize();
        queued?;
        Ok(waited?)
    }

    /// Copies the start of this allocation into `dst` through `stream` and waits for it.
    ///
    /// # Errors
    /// `dst` longer than the allocation, or a failed copy.
    pub fn download(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        self.check_fits(dst.len())?;
        stream.bind()?;
        let queued = in_parts(dst.as_ptr() as usize, dst.len(), &mut |at, len| {
            // SAFETY: the source range lies inside this allocation (checked; `in_parts` stays
            // within `dst.len()`); `dst` is borrowed mutably until the stream is synchronised
            // below, so nothing else sees it while the driver writes it.
            unsafe { result::memcpy_dtoh_async(&mut dst[at..at + len], self.ptr + at as u64, stream.raw()) }
        })
        .call("cuMemcpyDtoHAsync");
        // The parts queued before a refused one still write `dst`: wait for them whatever the
        // outcome, before the borrow ends.
        let waited = stream.synchronize();
        queued?;
        Ok(waited?)
    }

    /// Copies `src` to the start of this allocation with the driver's synchronous copy
    /// (`cuMemcpyHtoD`), which returns once the copy is done (or, from pageable memory, once
    /// `src` has been staged).
    ///
    /// # Errors
    /// `src` longer than the allocation, or a failed copy.
    pub fn upload_sync(&mut self, src: &[u8]) -> Result<()> {
        self.check_fits(src.len())?;
        self.ctx.bind()?;
        // SAFETY: the destination range lies inside this allocation (checked); the call is
        // synchronous with respect to `src`, so the driver is done with it when it returns.
        unsafe { result::memcpy_htod_sync(self.ptr, src) }.call("cuMemcpyHtoD")?;
        Ok(())
    }

    /// Copies the start of this allocation into `dst` with the driver's synchronous copy
    /// (`cuMemcpyDtoH`), which returns once `dst` holds the data.
    ///
    /// # Errors
    /// `dst` longer than the allocation, or a failed copy.
    pub fn download_sync(&self, dst: &mut [u8]) -> Result<()> {
        self.check_fits(dst.len())?;
        self.ctx.bind()?;
        // SAFETY: the source range lies inside this allocation (checked); `dst` is borrowed
        // mutably for the call, which returns only when the copy into it has finished.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr) }.call("cuMemcpyDtoH")?;
        Ok(())
    }

    /// Sets every byte to zero through `stream` and waits for it.
    ///
    /// # Errors
    /// A failed memset.
    pub fn zero(&mut self, stream: &Stream) -> Result<()> {
        stream.bind()?;
        // SAFETY: the range is exactly this live allocation.
        unsafe { result::memset_d8_async(self.ptr, 0, self.bytes, stream.raw()) }.call("cuMemsetD8Async")?;
        Ok(stream.synchronize()?)
    }

    /// Checks a copy of `len` bytes: it fits, and no fault is injected into it.
    fn check_fits(&self, len: usize) -> Result<()> {
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Copy)?;
        if len > self.bytes {
            return Err(BackendError::invalid(
                "copy length",
                format!("{len} bytes do not fit a {}-byte device allocation", self.bytes),
            ));
        }
        Ok(())
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // `ptr` came from cuMemAlloc in this context and is freed once. Nothing here relies on
        // cuMemFree waiting for the device: the owners above drop an allocation only when no
        // work that uses it is pending (leases wait for their fences, or leak).
        self.ctx.release(Release::DeviceMemory(self.ptr));
    }
}
