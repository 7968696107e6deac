//! cudarc interop: a [`Queue`] made from a cudarc `CudaStream` and the other way round, and
//! leases seen by cudarc as device memory ([`CudarcView`], [`CudarcViewMut`]), so that cudarc's
//! kernels, copies and libraries run on hetmem's mapped, registered and file-backed memory under
//! the hand-off's rules.
//!
//! hetmem and cudarc share a device through its primary context, the one `CudaContext::new`
//! retains; a queue and a cudarc stream can name one CUDA stream, so that work queued through
//! either runs in one order. This module uses cudarc's safe layer only; the raw handles cross
//! in `backend::cuda`.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ::cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::queue::Queue;
use super::{FenceKind, Lease, LeaseState, Lent, Shared};
use crate::backend::cuda::{CudaDevice, Stream};
use crate::error::{Error, Result};
use crate::memory::{Buffer, WritableBuffer};

impl Queue {
    /// A queue on `stream`, a stream that cudarc made (or wraps) in a device's primary context
    /// (`CudaContext::new`): hetmem's work and cudarc's on it run in one order.
    ///
    /// The queue keeps a clone of `stream`, which keeps a stream cudarc owns alive; hetmem never
    /// destroys it.
    ///
    /// # Errors
    /// A stream of a context that is not a device's primary one; the per-thread default stream
    /// (another stream on each thread); the device cannot be opened; the queue's flag page
    /// cannot be made.
    pub fn from_cudarc(stream: &Arc<CudaStream>) -> Result<Queue> {
        let device = CudaDevice::from_cudarc(stream.context())?;
        let stream = Stream::from_cudarc(&device, stream)?;
        Queue::on_stream(device, stream, FenceKind::default())
    }

    /// The queue's stream as a cudarc stream of `ctx`, the primary context of the queue's
    /// device (`CudaContext::new(ordinal)`): cudarc's work on it and hetmem's run in one order.
    ///
    /// The wrapper does not own the stream. Should a wrapper (a clone of it, or a weak
    /// reference) still exist when the queue, its leases and fences are all gone, the stream
    /// is left alive for the rest of the process rather than destroyed under it.
    ///
    /// cudarc itself orders its own `CudaSlice`s between streams only once their context has
    /// made a stream with `new_stream` (cudarc's `is_managing_stream_synchronization`); hetmem's
    /// leases are used by cudarc on their queue's stream only (see [`CudarcView`]).
    ///
    /// # Errors
    /// A CPU-backend queue; `ctx` is not the primary context of the queue's device.
    pub fn cudarc_stream(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        let (Some(device), Some(stream)) = (self.cuda_device(), self.stream()) else {
            return Err(cpu_queue());
        };
        stream.to_cudarc(device.ordinal(), ctx)
    }
}

fn cpu_queue() -> Error {
    Error::invalid("cudarc interop", "the queue is on the CPU backend; cudarc needs a CUDA queue")
}

impl<B: Buffer> Shared<B> {
    /// The buffer as cudarc device memory to read: a [`DevicePtr`] for cudarc's kernels, copies
    /// and libraries on `stream`, which must be the stream of the lease's queue (see
    /// [`CudarcView`]).
    ///
    /// # Errors
    /// A lease of a CPU-backend queue; `stream` is not the stream of the lease's queue, or its
    /// context is not primary; a buffer the device cannot address (pinned without mapping: pin
    /// it mapped, or copy it to a `DeviceBuf`).
    pub fn cudarc_view(&self, stream: &CudaStream) -> Result<CudarcView<'_, B::Elem>> {
        CudarcView::new(self, stream)
    }
}

impl<B: WritableBuffer> Lent<B> {
    /// The buffer as cudarc device memory to read, like [`Shared::cudarc_view`].
    ///
    /// # Errors
    /// As for [`Shared::cudarc_view`].
    pub fn cudarc_view(&self, stream: &CudaStream) -> Result<CudarcView<'_, B::Elem>> {
        CudarcView::new(self, stream)
    }

    /// The buffer as cudarc device memory to read and write: a [`DevicePtrMut`] (and
    /// [`DevicePtr`]) for cudarc's kernels, copies and libraries. `stream` must be the stream
    /// of the lease's queue (see [`CudarcView`]).
    ///
    /// # Errors
    /// As for [`Shared::cudarc_view`].
    pub fn cudarc_view_mut(&mut self, stream: &CudaStream) -> Result<CudarcViewMut<'_, B::Elem>> {
        let view = CudarcView::new(&*self, stream)?;
        Ok(CudarcViewMut { view, exclusive: PhantomData })
    }
}

/// A lease's buffer seen by cudarc as device memory to read: a [`DevicePtr`] (and
/// `DeviceSlice`) for cudarc's kernels, copies (`memcpy_dtoh`, `memcpy_dtod`, ...) and the
/// libraries built on them. Made by [`Shared::cudarc_view`] or [`Lent::cudarc_view`];
/// [`CudarcViewMut`], from [`Lent::cudarc_view_mut`] only, also writes.
///
/// # How the hand-off's promise holds
/// - The view borrows the lease, so while it lives the buffer cannot be reclaimed: the CPU
///   cannot reach it (a `Shared` lease lets the CPU read). A `CudarcViewMut` borrows its
///   `Lent` exclusively, and a `Shared` lease gives no `DevicePtrMut`, so safe code cannot
///   make cudarc write a shared buffer.
/// - cudarc gets the address (`device_ptr`, `device_ptr_mut`) only for the stream of the
///   lease's queue, through any wrapper of it: the work it queues there follows the lease's
///   earlier work in stream order, and when the view drops, the lease records a fence after
///   it, so reclaiming or dropping the lease waits for it. A view leaked with `mem::forget`
///   leaves the lease waiting for its whole stream instead.
/// - Nothing here relies on cudarc's own bookkeeping (its `SyncOnDrop` is inert): cudarc skips
///   a stream synchronisation when an earlier error is pending in its context, and records
///   events only in its multi-stream mode.
///
/// # Safety
/// Not a precondition of this type's methods, which are safe, but of cudarc's `unsafe` kernel
/// launch when it is handed an address from a view: the kernel must be launched on the stream
/// the address was asked for while the view lives; it must stay within [`DeviceSlice::len`]
/// elements; and it must not write through an address from a `CudarcView` (only a
/// `CudarcViewMut`'s). cudarc's safe copies keep these rules by themselves.
///
/// # Examples
/// A cudarc kernel reading a shared buffer and writing a lent one:
/// ```no_run
/// use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
/// use hetmem::{Device, HostBuf, PinOptions, Queue};
/// # fn run(function: &cudarc::driver::CudaFunction) -> Result<(), Box<dyn std::error::Error>> {
/// let ctx = CudaContext::new(0)?;
/// let stream = ctx.new_stream()?;
/// let queue = Queue::from_cudarc(&stream)?; // hetmem's work and cudarc's, in one order
/// let device = Device::Cuda(queue.cuda_device().expect("a CUDA queue").clone());
///
/// let input = queue.share(HostBuf::<u32>::pinned(&device, 1024, PinOptions::default())?);
/// let mut output = queue.lend(HostBuf::<u32>::pinned(&device, 1024, PinOptions::default())?);
/// {
///     let input = input.cudarc_view(&stream)?;
///     let mut output = output.cudarc_view_mut(&stream)?;
///     let (input_ptr, _input_queued) = input.device_ptr(&stream);
///     let (output_ptr, _output_queued) = output.device_ptr_mut(&stream);
///     let n = 1024u32;
///     let mut launch = stream.launch_builder(function);
///     launch.arg(&input_ptr).arg(&output_ptr).arg(&n);
///     // SAFETY: the kernel is `k(const unsigned*, unsigned*, unsigned)`, stays within `n`
///     // elements and writes only the output; it is launched on the stream both addresses were
///     // asked for, while the views live.
///     unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
/// } // the views drop: each lease records a fence after the kernel
/// let output = output.reclaim()?; // waits for the kernel
/// # Ok(()) }
/// ```
///
/// # Panics
/// `device_ptr` and `device_ptr_mut` panic, before anything is queued, for any stream but the
/// lease's queue's: another stream (hetmem could not wait for work there: lend the buffer to a
/// queue on that stream instead, `Queue::from_cudarc`), another context's, and the stream the
/// view returns from `DeviceSlice::stream`. That last one is for cudarc's bookkeeping: cudarc
/// asks it for the address only to copy between devices (`memcpy_dtod` from another device's
/// stream), and the copy then runs on a stream the lease cannot wait for.
#[derive(Debug)]
pub struct CudarcView<'a, T> {
    lease: &'a LeaseState,
    /// The address kernels on the lease's device use.
    address: u64,
    len: usize,
    /// The lease's queue's stream, as the wrapper only `DeviceSlice::stream` hands out.
    stream: Arc<CudaStream>,
    /// Whether work may have been queued on the lease's stream through the view.
    queued: AtomicBool,
    elements: PhantomData<&'a [T]>,
}

/// A [`Lent`] lease's buffer seen by cudarc as device memory to read and write: a
/// [`DevicePtrMut`] and [`DevicePtr`]. Made by [`Lent::cudarc_view_mut`]; the contract is
/// [`CudarcView`]'s.
#[derive(Debug)]
pub struct CudarcViewMut<'a, T> {
    view: CudarcView<'a, T>,
    exclusive: PhantomData<&'a mut [T]>,
}

impl<'a, T> CudarcView<'a, T> {
    fn new<L>(lease: &'a L, stream: &CudaStream) -> Result<CudarcView<'a, T>>
    where
        L: Lease,
        L::Buf: Buffer<Elem = T>,
    {
        let state = lease.state();
        let queue = Queue::of_lease(state);
        let (Some(device), Some(own)) = (queue.cuda_device(), queue.stream()) else {
            return Err(cpu_queue());
        };
        if !own.is_cudarc(stream) {
            return Err(Error::invalid(
                "cudarc stream",
                "it is not the stream of the lease's queue: use `queue.cudarc_stream(&ctx)`, or make \
                 the queue with `Queue::from_cudarc(&stream)`",
            ));
        }
        let address = queue.kernel_address(lease)?;
        let stream = own.wrapper_for_views(device.ordinal(), stream.context())?;
        state.open_view();
        Ok(CudarcView {
            lease: state,
            address,
            len: lease.len(),
            stream,
            queued: AtomicBool::new(false),
            elements: PhantomData,
        })
    }

    /// Refuses any stream but the lease's queue's, and notes that work may be queued there.
    fn check_stream(&self, stream: &CudaStream) {
        match route(StreamKey::of(stream), StreamKey::of(&self.stream)) {
            Ok(()) => self.queued.store(true, Ordering::Release),
            Err(why) => panic!("{why}"),
        }
    }
}

impl<T> Drop for CudarcView<'_, T> {
    fn drop(&mut self) {
        if self.queued.load(Ordering::Acquire)
            && let Err(error) = self.lease.queue.record_queued_use(self.lease)
        {
            tracing::error!(
                "recording cudarc's work on a lease failed; it waits for the whole stream: {error}"
            );
        }
        self.lease.close_view();
    }
}

impl<T> DeviceSlice<T> for CudarcView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for CudarcView<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.check_stream(stream);
        // Nothing to do when cudarc has queued the work: the view's drop records the fence.
        (self.address, SyncOnDrop::Sync(None))
    }
}

impl<T> DeviceSlice<T> for CudarcViewMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.view.stream
    }
}

impl<T> DevicePtr<T> for CudarcViewMut<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view.device_ptr(stream)
    }
}

impl<T> DevicePtrMut<T> for CudarcViewMut<'_, T> {
    fn device_ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view.device_ptr(stream)
    }
}

/// What tells cudarc streams apart for [`route`].
#[derive(Debug, Clone, Copy)]
struct StreamKey {
    context: usize,
    handle: usize,
    /// The wrapper object itself, so that the one `DeviceSlice::stream` hands out is known.
    object: usize,
}

impl StreamKey {
    fn of(stream: &CudaStream) -> StreamKey {
        StreamKey {
            context: stream.context().cu_ctx() as usize,
            handle: stream.cu_stream() as usize,
            object: std::ptr::from_ref(stream) as usize,
        }
    }
}

/// Succeeds when work asked for on stream `asked` can use a lease whose queue's stream is
/// `queue`, the wrapper its view returns from `DeviceSlice::stream`; else says why not.
fn route(asked: StreamKey, queue: StreamKey) -> Result<(), &'static str> {
    if asked.object == queue.object {
        Err("a hetmem lease's address was asked for the stream its cudarc view returns from \
             `DeviceSlice::stream`, which cudarc does only to copy between devices (on a stream the \
             lease cannot wait for): copy on the lease's queue's stream, `queue.cudarc_stream(&ctx)`")
    } else if asked.context != queue.context {
        Err("a hetmem lease's address was asked for a stream of another CUDA context: use the \
             lease's queue's stream, `queue.cudarc_stream(&ctx)`")
    } else if asked.handle != queue.handle {
        Err("a hetmem lease's address was asked for a stream other than its queue's, where hetmem \
             could not wait for the work: use the queue's stream (`queue.cudarc_stream(&ctx)`), or \
             lend the buffer to a queue on that stream (`Queue::from_cudarc(&stream)`)")
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{StreamKey, route};

    const QUEUE: StreamKey = StreamKey { context: 0x100, handle: 0x200, object: 0x300 };

    #[test]
    fn the_lease_s_own_stream_is_taken_through_any_wrapper() {
        let wrapper = StreamKey { object: 0x400, ..QUEUE };
        assert_eq!(route(wrapper, QUEUE), Ok(()));
    }

    #[test]
    fn another_stream_of_the_context_is_refused() {
        for handle in [0x500, 0] {
            let other = StreamKey { handle, object: 0x400, ..QUEUE };
            let why = route(other, QUEUE).unwrap_err();
            assert!(why.contains("other than its queue's"), "{why}");
        }
    }

    #[test]
    fn another_context_s_stream_is_refused_even_with_the_same_handle_value() {
        let same_handle = StreamKey { context: 0x600, object: 0x400, ..QUEUE };
        let why = route(same_handle, QUEUE).unwrap_err();
        assert!(why.contains("another CUDA context"), "{why}");
    }

    #[test]
    fn the_stream_a_view_reports_to_cudarc_is_refused() {
        let why = route(QUEUE, QUEUE).unwrap_err();
        assert!(why.contains("DeviceSlice::stream"), "{why}");
    }
}
