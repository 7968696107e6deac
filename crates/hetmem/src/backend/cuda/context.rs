//! A device's primary context, shared by everything made on that device.
//!
//! Driver calls act on the calling thread's current context, so every owning type keeps an
//! `Arc<Context>` and calls [`Context::bind`] before its driver calls, from whatever thread
//! it is used on. Errors met while dropping handles cannot be returned; they are recorded
//! here and surfaced by the next [`Context::take_deferred_error`].

use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::Call;
use crate::error::CudaError;

#[derive(Debug)]
pub(crate) struct Context {
    device: sys::CUdevice,
    raw: sys::CUcontext,
    deferred: Mutex<Option<CudaError>>,
}

// SAFETY: the CUDA driver API is thread-safe, and a context handle may be made current on any
// thread (cuCtxSetCurrent). `Context` holds only the handle, the device number and a Mutex;
// it gives out no reference to thread-local driver state.
unsafe impl Send for Context {}
// SAFETY: as for Send: the handle is only ever passed by value to thread-safe driver calls.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`. The driver must be initialised.
    pub(crate) fn retain(ordinal: usize) -> Result<Context, CudaError> {
        let device = result::device::get(ordinal as i32).call("cuDeviceGet")?;
        // SAFETY: `device` came from cuDeviceGet on an initialised driver; the retained
        // context is released exactly once, in Drop.
        let raw = unsafe { result::primary_ctx::retain(device) }.call("cuDevicePrimaryCtxRetain")?;
        Ok(Context { device, raw, deferred: Mutex::new(None) })
    }

    /// Whether `other` is the same driver context (two opens of one device share it).
    pub(crate) fn same_as(&self, other: &Context) -> bool {
        self.raw == other.raw
    }

    /// The driver's device handle.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Makes this context current on the calling thread, if it is not already.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        if result::ctx::get_current().call("cuCtxGetCurrent")? != Some(self.raw) {
            // SAFETY: `raw` is a retained primary context, alive until `self` drops.
            unsafe { result::ctx::set_current(self.raw) }.call("cuCtxSetCurrent")?;
        }
        Ok(())
    }

    /// Runs a release call from a `Drop`, recording its error instead of panicking.
    pub(crate) fn release(&self, release: impl FnOnce() -> Result<(), CudaError>) {
        if let Err(error) = self.bind().and_then(|()| release()) {
            tracing::warn!("releasing a CUDA resource failed: {error}");
            let mut slot = self.deferred.lock().unwrap_or_else(|poison| poison.into_inner());
            slot.get_or_insert(error);
        }
    }

    /// The first error recorded while releasing resources, if any; clears it.
    pub(crate) fn take_deferred_error(&self) -> Option<CudaError> {
        self.deferred.lock().unwrap_or_else(|poison| poison.into_inner()).take()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Context::retain`; every object made in this context
        // holds an Arc to it, so none outlives this release.
        if let Err(error) = unsafe { result::primary_ctx::release(self.device) } {
            tracing::warn!("cuDevicePrimaryCtxRelease failed: {error}");
        }
    }
}
