//! cudarc's safe layer over hetmem's handles: a hetmem stream as a cudarc `CudaStream` and a
//! cudarc stream as a hetmem one, and whether a cudarc context is the one hetmem uses. Raw
//! stream and context handles cross between hetmem and cudarc here and nowhere else; what the
//! hand-off makes of them is in `handoff::cudarc_interop`.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream};

use super::context::Context;
use super::{CudaDevice, Stream};
use crate::backend::BackendKind;
use crate::backend::error::{BackendError, Result};

/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, a different stream on each
/// thread (cudarc's `CudaContext::per_thread_stream`).
const PER_THREAD_STREAM: usize = 0x2;

/// The cudarc wrappers made for one hetmem stream.
///
/// A wrapper names the stream's handle without keeping it alive, and hetmem cannot learn when
/// a user drops a wrapper's last clone. So the stream keeps a clone of each, and when it drops
/// while any is still reachable elsewhere, it leaks its handle instead of destroying it.
#[derive(Debug, Default)]
pub(crate) struct Wrappers {
    handed_out: Mutex<HandedOut<CudaStream>>,
    /// The one wrapper that cudarc views of leases on this stream return from
    /// `DeviceSlice::stream`, and that nothing else hands out (see `handoff::cudarc_interop`).
    for_views: OnceLock<Arc<CudaStream>>,
}

impl Wrappers {
    fn add(&self, wrapper: Arc<CudaStream>) {
        self.handed_out.lock().unwrap_or_else(|poison| poison.into_inner()).add(wrapper);
    }

    /// Whether a wrapper may still be used by someone other than the stream.
    pub(super) fn reachable(&mut self) -> bool {
        let handed_out = self.handed_out.get_mut().unwrap_or_else(|poison| poison.into_inner());
        handed_out.any_reachable()
            || self.for_views.get_mut().is_some_and(|kept| Arc::get_mut(kept).is_none())
    }
}

/// `Arc`s given out, kept to learn later whether any is still reachable elsewhere.
#[derive(Debug)]
struct HandedOut<T>(Vec<Arc<T>>);

impl<T> Default for HandedOut<T> {
    fn default() -> Self {
        HandedOut(Vec::new())
    }
}

impl<T> HandedOut<T> {
    /// Keeps `arc`, and forgets those nobody else can reach any more, so the list stays short.
    fn add(&mut self, arc: Arc<T>) {
        self.0.retain_mut(|kept| Arc::get_mut(kept).is_none());
        self.0.push(arc);
    }

    /// Whether another strong or weak reference to any of them exists. `Arc::get_mut` answers
    /// without a race: when it succeeds, no other reference exists that could make a new one.
    fn any_reachable(&mut self) -> bool {
        self.0.iter_mut().any(|kept| Arc::get_mut(kept).is_none())
    }
}

impl CudaDevice {
    /// The device whose primary context `ctx` is.
    ///
    /// # Errors
    /// `ctx` is not a device's primary context; the device cannot be opened.
    pub(crate) fn from_cudarc(ctx: &CudaContext) -> Result<CudaDevice> {
        let device = CudaDevice::open(ctx.ordinal())
            .map_err(|reason| BackendError::Unavailable { requested: BackendKind::Cuda, reason })?;
        device.check_cudarc_context(ctx)?;
        Ok(device)
    }

    /// A cudarc function loaded in `ctx`, which must be this device's primary context, as a
    /// hetmem kernel (the function, and so its module, is kept alive with it).
    ///
    /// # Errors
    /// As for [`check_context`].
    pub(crate) fn kernel_from_cudarc(
        &self,
        ctx: &CudaContext,
        function: &cudarc::driver::CudaFunction,
        name: &str,
    ) -> Result<super::Kernel> {
        self.check_cudarc_context(ctx)?;
        // SAFETY: a cudarc function belongs to the context whose module loaded it; the caller
        // of the stage's constructor names that context (KernelCode::Cudarc's contract), checked
        // above to be this device's primary one; the clone keeps its module loaded.
        Ok(unsafe {
            super::Kernel::foreign(
                function.cu_function(),
                Arc::clone(self.context()),
                Arc::new(function.clone()),
                name,
            )
        })
    }

    /// Succeeds when `ctx` is this device's primary context, the one hetmem uses.
    ///
    /// # Errors
    /// As for [`check_context`].
    pub(crate) fn check_cudarc_context(&self, ctx: &CudaContext) -> Result<()> {
        check_context(self.context(), self.ordinal(), ctx)
    }
}

/// Succeeds when `ctx` is `ours`, the primary context of device `ordinal`.
///
/// # Errors
/// Another device's context, or one that is not primary (cudarc's `new_non_primary`, `new_cig`,
/// `from_raw_context`): memory and streams of one context are not another's.
fn check_context(ours: &Context, ordinal: usize, ctx: &CudaContext) -> Result<()> {
    // cudarc destroys a context it does not know to be primary when its last Arc drops, so even
    // the primary context's handle wrapped that way is refused.
    if ctx.is_primary() && ctx.cu_ctx() == ours.raw() && ctx.cu_device() == ours.device() {
        return Ok(());
    }
    let whose = if ctx.ordinal() == ordinal {
        "a context that is not the device's primary one".to_string()
    } else {
        format!("CUDA device {}'s context", ctx.ordinal())
    };
    Err(BackendError::invalid(
        "cudarc context",
        format!(
            "{whose}, where CUDA device {ordinal}'s primary context is needed: make it with \
             `CudaContext::new({ordinal})`"
        ),
    ))
}

impl Stream {
    /// `stream`, made by cudarc, as a hetmem stream; holding a clone keeps it alive.
    ///
    /// # Errors
    /// A stream of a context other than `device`'s primary one; the per-thread default stream,
    /// which names another stream on each thread (a queue is used from several).
    pub(crate) fn from_cudarc(device: &CudaDevice, stream: &Arc<CudaStream>) -> Result<Stream> {
        check_context(device.context(), device.ordinal(), stream.context())?;
        if stream.cu_stream() as usize == PER_THREAD_STREAM {
            return Err(BackendError::invalid(
                "cudarc stream",
                "the per-thread default stream is another stream on each thread: use \
                 `CudaContext::new_stream` or `default_stream`",
            ));
        }
        let lender = Box::new(Arc::clone(stream));
        // SAFETY: the handle is a live stream of the device's primary context (checked above),
        // or its legacy default stream (null), the same on every thread; `lender` holds the
        // cudarc stream, which destroys the handle only when its last clone drops.
        Ok(unsafe { Stream::borrowed(Arc::clone(device.context()), stream.cu_stream(), lender) })
    }

    /// This stream, of device `ordinal`, as a cudarc stream of `ctx`.
    ///
    /// # Errors
    /// `ctx` is not this stream's context, the device's primary one.
    pub(crate) fn to_cudarc(&self, ordinal: usize, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        check_context(self.context(), ordinal, ctx)?;
        // SAFETY: the handle is a live stream of `ctx` (checked above to be this stream's
        // context); the stream outlives every wrapper still reachable (`Wrappers`); work through
        // either is in the one stream's order.
        let wrapper = unsafe { ctx.wrap_borrowed_stream(self.raw()) };
        self.wrappers().add(Arc::clone(&wrapper));
        Ok(wrapper)
    }

    /// The wrapper that cudarc views of leases on this stream (of device `ordinal`) return from
    /// `DeviceSlice::stream`, made for `ctx` on first use.
    ///
    /// # Errors
    /// `ctx` is not this stream's context, the device's primary one.
    pub(crate) fn wrapper_for_views(
        &self,
        ordinal: usize,
        ctx: &Arc<CudaContext>,
    ) -> Result<Arc<CudaStream>> {
        check_context(self.context(), ordinal, ctx)?;
        let wrapper = self.wrappers().for_views.get_or_init(|| {
            // SAFETY: as in `to_cudarc`; `Wrappers::reachable` checks this one too.
            unsafe { ctx.wrap_borrowed_stream(self.raw()) }
        });
        Ok(Arc::clone(wrapper))
    }

    /// Whether `stream` is this stream: the same handle in the same context.
    pub(crate) fn is_cudarc(&self, stream: &CudaStream) -> bool {
        stream.cu_stream() == self.raw() && stream.context().cu_ctx() == self.context().raw()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::HandedOut;

    #[test]
    fn a_handed_out_arc_is_reachable_while_a_clone_or_a_weak_reference_lives() {
        let mut handed_out = HandedOut::default();
        let given = Arc::new(1u32);
        handed_out.add(Arc::clone(&given));
        assert!(handed_out.any_reachable());
        let weak = Arc::downgrade(&given);
        drop(given);
        assert!(handed_out.any_reachable(), "a weak reference could still upgrade");
        drop(weak);
        assert!(!handed_out.any_reachable());
    }

    #[test]
    fn arcs_nobody_else_holds_are_forgotten_when_the_next_is_added() {
        let mut handed_out = HandedOut::default();
        for value in 0..100u32 {
            handed_out.add(Arc::new(value));
        }
        assert_eq!(handed_out.0.len(), 1, "only the last is kept");
        let kept = Arc::new(7u32);
        handed_out.add(Arc::clone(&kept));
        handed_out.add(Arc::new(8));
        assert_eq!(handed_out.0.len(), 2, "the one still held elsewhere and the newest");
        assert!(handed_out.any_reachable());
    }
}
