//! A device's primary context, shared by everything made on that device.
//!
//! Driver calls act on the calling thread's current context, so every owning type keeps an
//! `Arc<Context>` and calls [`Context::bind`] before its driver calls, from whatever thread
//! it is used on. Errors met while dropping handles cannot be returned; they are recorded
//! here and surfaced by the next [`Context::take_deferred_error`].
//!
//! # Resident kernels
//! While a kernel that never ends on its own runs (a doorbell, a gate), some driver calls
//! wait for the whole device to be idle, that is for that kernel, in every thread of the
//! process. Measured on the H200 machine (`bench/results/2026-11-30-h200-probes`):
//! `cuMemFree`, `cuMemFreeHost`, `cuMemHostUnregister`, `cuModuleLoadData`, `cuModuleUnload`
//! and `cuCtxSynchronize` wait; allocating, pinning, registering, streams, events, copies and
//! launches on other streams do not. So while a [`ResidentKernel`] token lives:
//! - releases that would wait ([`Release::waits_for_device`]) are deferred, and run when the
//!   last token drops; a kernel that never stops keeps its token (leaked), and the deferred
//!   releases are leaked with it rather than hang the process;
//! - the calls a caller makes and waits for (loading a module, synchronising the context)
//!   fail at once with [`BackendError::ResidentKernelRunning`](crate::backend::BackendError::ResidentKernelRunning) instead of hanging.
//!
//! The count is kept per driver context for the whole process, so every open of a device
//! sees it; and a call that found no resident kernel holds a shared lock until it returns,
//! which a resident kernel's token takes exclusively before it counts in: none can start
//! between the check and the call.
//!
//! # A lost context
//! A kernel fault (an illegal address, a trap) leaves the context unusable: every later call
//! returns the same error, and on driver 580 not even `cuDevicePrimaryCtxReset` brings it back
//! (the probe above). Once a call reports such an error, the context is marked lost: releases
//! are skipped (they would only fail again, and the process must restart to use the GPU).

use std::sync::{Mutex, RwLock, RwLockReadGuard};

use cudarc::driver::{result, sys};

use super::Call;
use crate::backend::cuda::error::CudaError;
use crate::backend::error::BackendError;

#[derive(Debug)]
pub(crate) struct Context {
    device: sys::CUdevice,
    raw: sys::CUcontext,
    deferred: Mutex<Option<CudaError>>,
}

/// Resident kernels and deferred releases of each driver context (by its handle), shared by
/// every open of its device: each open retains the primary context into a [`Context`] of its
/// own, and a resident kernel launched through one must hold back the releases of all.
static RESIDENT: Mutex<Vec<(usize, Resident)>> = Mutex::new(Vec::new());

/// Held (shared) across every driver call that would wait for a resident kernel, from the check
/// that none runs to the call's end; taken exclusively to count a resident kernel in. So no
/// resident kernel can start between the check and the call, which would then wait for it
/// (for ever, should the waiting thread be the one meant to stop it).
static WAITING_CALLS: RwLock<()> = RwLock::new(());

/// Lets a call that waits for the device run to its end before any resident kernel starts.
pub(crate) type NoResidentGuard = RwLockReadGuard<'static, ()>;

fn waiting_calls() -> NoResidentGuard {
    WAITING_CALLS.read().unwrap_or_else(|poison| poison.into_inner())
}

/// Resident kernels running in a context, and the releases waiting for them to end.
#[derive(Default)]
struct Resident {
    running: usize,
    /// Each release with what must stay alive until it has run (the memory a registration
    /// covers: unmapped early, its addresses could be mapped and registered again by then).
    pending: Vec<(Release, Option<Keep>)>,
}

/// Something kept alive until a release has run.
pub(crate) type Keep = Box<dyn std::any::Any + Send + Sync>;

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("running", &self.running)
            .field("pending", &self.pending.len())
            .finish()
    }
}

/// A handle to give back to the driver, as plain data so it can wait in a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    DeviceMemory(sys::CUdeviceptr),
    PinnedHost(usize),
    Registration(usize),
    Module(usize),
    Stream(usize),
    Event(usize),
}

impl Release {
    /// Whether the driver makes this call wait until the device is idle (measured; see the
    /// module documentation).
    pub(crate) fn waits_for_device(self) -> bool {
        !matches!(self, Release::Stream(_) | Release::Event(_))
    }

    fn call(self) -> &'static str {
        match self {
            Release::DeviceMemory(_) => "cuMemFree",
            Release::PinnedHost(_) => "cuMemFreeHost",
            Release::Registration(_) => "cuMemHostUnregister",
            Release::Module(_) => "cuModuleUnload",
            Release::Stream(_) => "cuStreamDestroy",
            Release::Event(_) => "cuEventDestroy",
        }
    }

    /// Gives the handle back to the driver; the context must be bound.
    fn run(self) -> Result<(), CudaError> {
        // SAFETY: each handle was made in this context by the owning type, which queues its
        // release exactly once, from its Drop, after the work that uses it has finished (the
        // owners above wait for their fences, or leak instead of releasing).
        let code = unsafe {
            match self {
                Release::DeviceMemory(ptr) => sys::cuMemFree_v2(ptr),
                Release::PinnedHost(ptr) => sys::cuMemFreeHost(ptr as *mut std::ffi::c_void),
                Release::Registration(ptr) => sys::cuMemHostUnregister(ptr as *mut std::ffi::c_void),
                Release::Module(raw) => sys::cuModuleUnload(raw as sys::CUmodule),
                Release::Stream(raw) => sys::cuStreamDestroy_v2(raw as sys::CUstream),
                Release::Event(raw) => sys::cuEventDestroy_v2(raw as sys::CUevent),
            }
        };
        code.call(self.call())
    }
}

// SAFETY: the CUDA driver API is thread-safe, and a context handle may be made current on any
// thread (cuCtxSetCurrent). `Context` holds only the handle, the device number and Mutexes;
// it gives out no reference to thread-local driver state.
unsafe impl Send for Context {}
// SAFETY: as for Send: the handle is only ever passed by value to thread-safe driver calls.
unsafe impl Sync for Context {}

/// Contexts a call has reported a sticky error in (by handle): they stay unusable for the
/// rest of the process.
static LOST: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Records that the context current on this thread is lost, when `error` is one that loses
/// it. Called on every driver error, so no call site can forget it.
pub(crate) fn note_error(error: &CudaError) {
    if !error.is_sticky() {
        return;
    }
    if let Ok(Some(raw)) = result::ctx::get_current() {
        let mut lost = LOST.lock().unwrap_or_else(|poison| poison.into_inner());
        if !lost.contains(&(raw as usize)) {
            tracing::error!("the CUDA context is lost ({}); GPU work needs a new process", error.name);
            lost.push(raw as usize);
        }
    }
}

impl Context {
    /// Retains the primary context of device `ordinal`. The driver must be initialised.
    pub(crate) fn retain(ordinal: usize) -> Result<Context, CudaError> {
        let device = result::device::get(ordinal as i32).call("cuDeviceGet")?;
        // SAFETY: `device` came from cuDeviceGet on an initialised driver; the retained
        // context is released exactly once, in Drop.
        let raw = unsafe { result::primary_ctx::retain(device) }.call("cuDevicePrimaryCtxRetain")?;
        Ok(Context { device, raw, deferred: Mutex::new(None) })
    }

    /// The driver's context handle.
    pub(super) fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// Whether `other` is the same driver context (two opens of one device share it).
    pub(crate) fn same_as(&self, other: &Context) -> bool {
        self.raw == other.raw
    }

    /// The driver's device handle.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Whether a kernel fault has made this context unusable.
    pub(crate) fn is_lost(&self) -> bool {
        LOST.lock().unwrap_or_else(|poison| poison.into_inner()).contains(&(self.raw as usize))
    }

    /// Makes this context current on the calling thread, if it is not already.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        if result::ctx::get_current().call("cuCtxGetCurrent")? != Some(self.raw) {
            // SAFETY: `raw` is a retained primary context, alive until `self` drops.
            unsafe { result::ctx::set_current(self.raw) }.call("cuCtxSetCurrent")?;
        }
        Ok(())
    }

    /// Runs `f` on this context's resident kernels and deferred releases, under the lock that
    /// every open of the device shares.
    fn with_resident<R>(&self, f: impl FnOnce(&mut Resident) -> R) -> R {
        let mut all = RESIDENT.lock().unwrap_or_else(|poison| poison.into_inner());
        let key = self.raw as usize;
        let at = match all.iter().position(|(raw, _)| *raw == key) {
            Some(at) => at,
            None => {
                all.push((key, Resident::default()));
                all.len() - 1
            }
        };
        f(&mut all[at].1)
    }

    /// Gives a handle back to the driver from a `Drop`: now, or once the resident kernels have
    /// ended if the call would wait for them; not at all in a lost context. Errors are
    /// recorded instead of panicking.
    pub(crate) fn release(&self, release: Release) {
        self.release_keeping(release, None);
    }

    /// Like [`Context::release`], keeping `keep` alive until the release has run (or for ever,
    /// in a lost context, where it never runs).
    pub(crate) fn release_keeping(&self, release: Release, keep: Option<Keep>) {
        if self.is_lost() {
            tracing::debug!("{} skipped: the context is lost", release.call());
            std::mem::forget(keep);
            return;
        }
        let mut keep = keep;
        let guard = release.waits_for_device().then(waiting_calls);
        let deferred = guard.is_some()
            && self.with_resident(|resident| {
                if resident.running == 0 {
                    return false;
                }
                resident.pending.push((release, keep.take()));
                true
            });
        if deferred {
            tracing::debug!("{} deferred until the resident kernels end", release.call());
            return;
        }
        self.run_release(release);
        drop(guard);
        drop(keep);
    }

    /// Gives every handle of `releases` back, now or (all of them) once the resident kernels
    /// have ended, keeping `keep` alive until the last has run. Returns `keep` when they ran
    /// now, so a caller can hand the memory they covered back; `None` when they were deferred
    /// (`keep` goes with them) or the context is lost (`keep` is leaked: they never run).
    pub(crate) fn release_all_keeping(&self, releases: Vec<Release>, keep: Keep) -> Option<Keep> {
        if self.is_lost() {
            tracing::debug!("{} release(s) skipped: the context is lost", releases.len());
            std::mem::forget(keep);
            return None;
        }
        let mut kept = Some(keep);
        let guard = releases.iter().any(|release| release.waits_for_device()).then(waiting_calls);
        let deferred = guard.is_some()
            && self.with_resident(|resident| {
                if resident.running == 0 {
                    return false;
                }
                // The owner goes with the last release (there is one: one waits for the device).
                let last = releases.len() - 1;
                for (index, &release) in releases.iter().enumerate() {
                    resident.pending.push((release, if index == last { kept.take() } else { None }));
                }
                true
            });
        if deferred {
            tracing::debug!("{} release(s) deferred until the resident kernels end", releases.len());
            return None;
        }
        let keep = kept.expect("kept unless deferred");
        for release in releases {
            self.run_release(release);
        }
        drop(guard);
        Some(keep)
    }

    fn run_release(&self, release: Release) {
        if let Err(error) = self.bind().and_then(|()| release.run()) {
            tracing::warn!("releasing a CUDA resource failed: {error}");
            let mut slot = self.deferred.lock().unwrap_or_else(|poison| poison.into_inner());
            slot.get_or_insert(error);
        }
    }

    /// An error instead of `call` when it would wait for a resident kernel; else a guard to
    /// hold until `call` has returned, so that none starts meanwhile.
    pub(crate) fn check_no_resident(&self, call: &'static str) -> Result<NoResidentGuard, BackendError> {
        let guard = waiting_calls();
        match self.with_resident(|resident| resident.running) {
            0 => Ok(guard),
            running => Err(BackendError::ResidentKernelRunning { call, running }),
        }
    }

    /// Counts a resident kernel in; [`Context::leave_resident`] counts it out.
    fn enter_resident(&self) {
        // Waits for the waiting calls under way, and keeps new ones out while it counts.
        let _no_waiting_calls = WAITING_CALLS.write().unwrap_or_else(|poison| poison.into_inner());
        self.with_resident(|resident| resident.running += 1);
    }

    fn leave_resident(&self) {
        let pending = self.with_resident(|resident| {
            resident.running -= 1;
            if resident.running > 0 { Vec::new() } else { std::mem::take(&mut resident.pending) }
        });
        // Each as if released now: deferred again should another resident kernel have started.
        for (release, keep) in pending {
            self.release_keeping(release, keep);
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

/// A resident kernel counted in its context from before its launch until it has ended: while
/// any such token lives, releases that would wait for the device are deferred and calls that
/// would wait fail (see the module documentation). Drop it once the kernel has ended; leak it
/// (`std::mem::forget`) when the kernel may still run.
#[derive(Debug)]
pub(crate) struct ResidentKernel {
    ctx: std::sync::Arc<Context>,
}

impl ResidentKernel {
    /// Counts a resident kernel in on `device`'s context.
    pub(crate) fn enter(device: &super::CudaDevice) -> ResidentKernel {
        let ctx = std::sync::Arc::clone(device.context());
        ctx.enter_resident();
        ResidentKernel { ctx }
    }
}

impl Drop for ResidentKernel {
    fn drop(&mut self) {
        self.ctx.leave_resident();
    }
}
