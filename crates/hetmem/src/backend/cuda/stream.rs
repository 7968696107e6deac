//! Streams (ordered queues of GPU work) and events (points in them the host can wait on).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{Context, Keep, Release};
use super::interop::Wrappers;
use super::{Call, CudaDevice, split};
use crate::backend::cuda::error::CudaError;
use crate::backend::error::BackendError;

/// A CUDA stream: one hetmem made (non-blocking: it does not synchronise with the legacy
/// default stream), or one borrowed from cudarc ([`crate::Queue::from_cudarc`]).
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Context>,
    /// `None` when hetmem made the stream and destroys it; else what keeps a borrowed stream
    /// alive (its owner's handle), dropped instead of destroying the stream.
    lender: Option<Keep>,
    /// The cudarc wrappers of this stream handed out (see [`Wrappers`]).
    wrappers: Wrappers,
}

// SAFETY: stream handles may be used from any thread once their context is current, which
// every method ensures through `Context::bind`; the driver serialises enqueues itself.
unsafe impl Send for Stream {}
// SAFETY: as for Send: enqueueing work on one stream from several threads is thread-safe in
// the driver API (the order between threads is whatever order the calls happen in).
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a non-blocking stream on `device`.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn new(device: &CudaDevice) -> Result<Stream, CudaError> {
        device.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking).call("cuStreamCreate")?;
        Ok(Stream { raw, ctx: Arc::clone(device.context()), lender: None, wrappers: Wrappers::default() })
    }

    /// A stream someone else made, used by hetmem without owning it.
    ///
    /// # Safety
    /// `raw` must be a live stream of `ctx` (or a default-stream handle that names the same
    /// stream on every thread), and stay alive as long as `lender` does.
    pub(super) unsafe fn borrowed(ctx: Arc<Context>, raw: sys::CUstream, lender: Keep) -> Stream {
        Stream { raw, ctx, lender: Some(lender), wrappers: Wrappers::default() }
    }

    /// The legacy default stream of `device`'s primary context, borrowed (never destroyed): the
    /// stream a DLPack consumer names with `stream=1`, and PyTorch's default stream. Recording
    /// an [`Event`] on it marks the end of the work queued there so far.
    ///
    /// # Errors
    /// Binding the device's context failed.
    pub fn legacy_default(device: &CudaDevice) -> Result<Stream, CudaError> {
        device.bind()?;
        // SAFETY: the null handle names the context's legacy default stream (cudarc calls the
        // entry points without per-thread default streams): the same stream on every thread,
        // alive as long as the context, which `ctx` keeps retained; nothing destroys it.
        Ok(unsafe { Stream::borrowed(Arc::clone(device.context()), std::ptr::null_mut(), Box::new(())) })
    }

    /// Blocks until all work queued so far has finished.
    ///
    /// # Errors
    /// The error of any failed work in the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of the bound context.
        unsafe { result::stream::synchronize(self.raw) }.call("cuStreamSynchronize")
    }

    /// Whether all work queued so far has finished, without blocking.
    ///
    /// # Errors
    /// The error of any failed work in the stream.
    pub fn is_idle(&self) -> Result<bool, CudaError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of the bound context.
        match unsafe { sys::cuStreamQuery(self.raw) }.result() {
            Ok(()) => Ok(true),
            Err(error) if error.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(error) => Err(error).call("cuStreamQuery"),
        }
    }

    /// Makes later work on this stream wait for `event`'s last record.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: both handles are live; the wait captures the event's current record.
        unsafe {
            result::stream::wait_event(self.raw, event.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
        .call("cuStreamWaitEvent")
    }

    /// Queues a copy of `bytes` from `src` to `dst` (device or mapped/pinned host addresses).
    ///
    /// # Safety
    /// Both ranges must be valid for the copy in this context, and must not be accessed in a
    /// way that races the copy, until the work queued on this stream has finished.
    ///
    /// # Errors
    /// A failing driver call.
    pub(crate) unsafe fn copy_async(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> crate::backend::error::Result<()> {
        crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Copy)?;
        self.ctx.bind()?;
        let mut copy = |at: usize, len: usize| {
            // SAFETY: the caller guarantees the ranges and their lifetime; `in_parts` passes
            // parts of them.
            unsafe { sys::cuMemcpyAsync(dst + at as u64, src + at as u64, len, self.raw) }.result()
        };
        // The host side may be either: split at the source's page boundaries first, then, if a
        // part is still refused, at the destination's (parts copied twice copy the same bytes).
        split::in_parts(src as usize, bytes, &mut copy)
            .or_else(|error| match error.0 {
                sys::CUresult::CUDA_ERROR_INVALID_VALUE => split::in_parts(dst as usize, bytes, &mut copy),
                _ => Err(error),
            })
            .call("cuMemcpyAsync")?;
        Ok(())
    }

    /// Queues a 32-bit store of `value` to `address` once all earlier work has finished, with a
    /// memory barrier, so whoever sees the value also sees that work's writes.
    ///
    /// # Safety
    /// `address` must be a 4-byte aligned device or mapped host address that stays valid until
    /// the store has happened.
    ///
    /// # Errors
    /// A failing driver call.
    pub(crate) unsafe fn write_value32(&self, address: u64, value: u32) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees the address; DEFAULT flags keep the barrier.
        unsafe {
            sys::cuStreamWriteValue32_v2(
                self.raw,
                address,
                value,
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        }
        .call("cuStreamWriteValue32")
    }

    /// Makes later work on this stream wait until the 32-bit word at `address` equals `value`
    /// (the GPU's front end polls it; the CPU is not involved).
    ///
    /// # Safety
    /// `address` must be a 4-byte aligned device or mapped host address that stays valid until
    /// the wait has ended, and something must eventually store `value` there, or the stream
    /// (and whatever waits for it) never progresses.
    ///
    /// # Errors
    /// A failing driver call.
    pub(crate) unsafe fn wait_value32(&self, address: u64, value: u32) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: the caller guarantees the address and that the value will be stored.
        unsafe {
            sys::cuStreamWaitValue32_v2(
                self.raw,
                address,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
            )
        }
        .call("cuStreamWaitValue32")
    }

    /// Queues `callback` to run on a driver thread once all earlier work has finished.
    ///
    /// The callback must not call CUDA or wait for GPU work (CUDA's contract for host
    /// functions; breaking it can deadlock the driver), which is why this is crate-private:
    /// hetmem's only callback writes an eventfd.
    ///
    /// # Errors
    /// A failing driver call (the callback is then dropped without running).
    pub(crate) fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send>) -> Result<(), CudaError> {
        unsafe extern "C" fn trampoline(data: *mut c_void) {
            // SAFETY: `data` is the Box<Box<dyn FnOnce>> leaked below, handed to the driver
            // exactly once; the driver calls this exactly once.
            let callback = unsafe { Box::from_raw(data.cast::<Box<dyn FnOnce() + Send>>()) };
            callback();
        }
        self.ctx.bind()?;
        let data = Box::into_raw(Box::new(callback));
        // SAFETY: `trampoline` matches CUhostFn and takes back ownership of `data`.
        let launched = unsafe { sys::cuLaunchHostFunc(self.raw, Some(trampoline), data.cast()) }
            .call("cuLaunchHostFunc");
        if launched.is_err() {
            // SAFETY: the driver rejected the call, so it will never run the trampoline; the
            // box is reclaimed here exactly once.
            drop(unsafe { Box::from_raw(data) });
        }
        launched
    }

    /// A number identifying this stream while it lives.
    pub fn id(&self) -> usize {
        self.raw as usize
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind()
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(super) fn wrappers(&self) -> &Wrappers {
        &self.wrappers
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.wrappers.reachable() {
            // A cudarc wrapper still names the handle, and nothing tells hetmem when its last
            // clone goes: leave the stream alive for the rest of the process rather than let
            // the wrapper queue work on a destroyed handle. (Its context stays alive too: the
            // wrapper's CudaContext holds a retain on it.)
            tracing::debug!("a cudarc wrapper outlives its hetmem stream; the stream is kept, not destroyed");
            std::mem::forget(self.lender.take());
            return;
        }
        if self.lender.is_none() {
            // `raw` is live and destroyed once; the driver lets queued work finish first.
            self.ctx.release(Release::Stream(self.raw as usize));
        }
        // A borrowed stream is its owner's to destroy: dropping `lender` lets it.
    }
}

/// A CUDA event: a marker recorded into a stream.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: as for Stream: event handles are plain driver handles usable from any thread with
// the context bound.
unsafe impl Send for Event {}
// SAFETY: as for Send; the driver's event calls are thread-safe.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event. `timing` events can measure elapsed time; others are cheaper to
    /// record and wait on.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn new(device: &CudaDevice, timing: bool) -> Result<Event, CudaError> {
        device.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let raw = result::event::create(flags).call("cuEventCreate")?;
        Ok(Event { raw, ctx: Arc::clone(device.context()) })
    }

    /// Records the event at the current end of `stream`.
    ///
    /// # Errors
    /// A failing driver call, or a stream of another device.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        stream.bind()?;
        // SAFETY: both handles are live; the driver rejects a stream of another context.
        unsafe { result::event::record(self.raw, stream.raw()) }.call("cuEventRecord")
    }

    /// Blocks until the work before the event's last record has finished.
    ///
    /// # Errors
    /// The error of any failed work before the event.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        unsafe { result::event::synchronize(self.raw) }.call("cuEventSynchronize")
    }

    /// Whether the work before the event's last record has finished, without blocking.
    ///
    /// # Errors
    /// The error of any failed work before the event.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(error) if error.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(error) => Err(error).call("cuEventQuery"),
        }
    }

    /// Milliseconds between `start` and this event; both must be timing events, recorded
    /// and complete.
    ///
    /// # Errors
    /// Events without timing, unrecorded or incomplete events.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32, CudaError> {
        self.ctx.bind()?;
        // SAFETY: both are live events; the driver checks that they were recorded.
        unsafe { result::event::elapsed(start.raw, self.raw) }.call("cuEventElapsedTime")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // `raw` is live and destroyed once; destroying a recorded, incomplete event is allowed
        // (the driver releases it when the work completes).
        self.ctx.release(Release::Event(self.raw as usize));
    }
}
