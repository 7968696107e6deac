//! What a `Memory` waits for before it lets its memory go (a pinned block back to its pool, a
//! staged file window written back, pinned memory freed or unregistered): the GPU work that
//! may still use the memory through a view it handed out.
//!
//! A view handed to a consumer whose stream hetmem can follow (DLPack's `stream=1`, the legacy
//! default stream, or a stream of hetmem's own) leaves an event, recorded on that stream when
//! the consumer's tensor dies; the release waits for each event. Every other view (host views,
//! which PyTorch may copy from asynchronously since the memory is pinned; the CUDA array
//! interface, which names no consumer stream; DLPack without a stream, or with another
//! library's stream, whose handle may be destroyed before the consumer's tensor dies) makes
//! the release wait for the whole device. Nothing relies on the driver's free calls waiting
//! on their own. When a wait fails, the memory is leaked rather than released under the GPU.

use std::sync::{Arc, Mutex};

use hetmem::backend::cuda::{CudaDevice, Event, Stream};

/// The GPU work a memory's release waits for (nothing on the CPU backend).
#[derive(Debug)]
pub(crate) struct GpuUses {
    /// The device whose work may use the memory; None on the CPU backend.
    device: Option<CudaDevice>,
    state: Mutex<UseState>,
}

#[derive(Debug, Default)]
struct UseState {
    /// Events recorded on consumers' streams when their views died.
    events: Vec<Event>,
    /// A view went where hetmem cannot follow its work: the release waits for the device.
    whole_device: bool,
}

impl GpuUses {
    /// Uses of memory belonging to `device`.
    pub(crate) fn new(device: &hetmem::Device) -> GpuUses {
        GpuUses { device: device.as_cuda().cloned(), state: Mutex::default() }
    }

    /// Uses of memory no GPU reaches.
    pub(crate) fn none() -> GpuUses {
        GpuUses { device: None, state: Mutex::default() }
    }

    /// The device whose work may use the memory; None on the CPU backend.
    pub(crate) fn cuda_device(&self) -> Option<&CudaDevice> {
        self.device.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UseState> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// A view was handed out whose GPU work hetmem cannot follow: the release waits for the
    /// device.
    pub(crate) fn note_unknown(&self) {
        if self.device.is_some() {
            self.lock().whole_device = true;
        }
    }

    /// A consumer on `stream` is done with its view: the release waits for the work queued on
    /// `stream` until now. Events already complete are dropped, so a memory exported batch
    /// after batch keeps few.
    pub(crate) fn note_stream(&self, stream: &Stream) {
        let Some(device) = &self.device else { return };
        let recorded = Event::new(device, false).and_then(|event| event.record(stream).map(|()| event));
        let mut state = self.lock();
        state.events.retain(|event| !matches!(event.is_complete(), Ok(true)));
        match recorded {
            Ok(event) => state.events.push(event),
            // Without the event, only the device's idleness says the work is done.
            Err(_) => state.whole_device = true,
        }
    }

    /// Blocks until the work the release must wait for has finished.
    ///
    /// # Errors
    /// A wait failed: the work may still use the memory, which must then be leaked; the text
    /// says which wait.
    pub(crate) fn wait(&self) -> Result<(), String> {
        let Some(device) = &self.device else { return Ok(()) };
        let state = std::mem::take(&mut *self.lock());
        if state.whole_device {
            // Not `synchronize`: that also reports (and clears) a failure of some earlier,
            // unrelated release, which would leak this memory for nothing and lose that error.
            return device.synchronize_work().map_err(|error| format!("waiting for the device: {error}"));
        }
        for event in &state.events {
            event.synchronize().map_err(|error| format!("waiting for a consumer's stream: {error}"))?;
        }
        Ok(())
    }
}

/// The consumer's stream of a DLPack export, as the protocol's `stream` names it, when hetmem
/// can follow its work: `1` (the legacy default stream), or a stream of hetmem's own (found
/// by its handle, and held alive). Anything else (None, `-1`, `2`, another library's stream)
/// is None: its handle is not trusted past the export.
pub(crate) fn followed_stream(device: &CudaDevice, stream: Option<i128>) -> Option<Arc<Stream>> {
    match stream? {
        1 => Stream::legacy_default(device).ok().map(Arc::new),
        handle => crate::stream::live_stream(usize::try_from(handle).ok()?),
    }
}
