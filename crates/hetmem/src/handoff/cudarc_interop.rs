//! cudarc interop: a [`Queue`] made from a cudarc `CudaStream` and the other way round, leases
//! seen by cudarc as device memory ([`CudarcView`], [`CudarcViewMut`]), and lent host buffers
//! seen by cudarc's copies as host memory ([`CudarcHostMut`]), so that cudarc's kernels, copies
//! and libraries run on hetmem's mapped, registered and file-backed memory under the hand-off's
//! rules.
//!
//! # cudarc's copies and plain slices
//! cudarc 0.19 takes any `&[T]` or `&mut [T]` as host memory for its copies (`memcpy_htod`,
//! `memcpy_dtoh`, `clone_htod`, ...) and assumes, as for pageable memory, that the copy is done
//! with the slice when the call returns: it neither waits nor records anything. For page-locked
//! memory that is not true: the driver copies asynchronously, after the call has returned. So a
//! slice of a hetmem host buffer (`HostBuf::as_mut_slice`, a chunk, a window, a ring slot)
//! handed to one of those copies is still being read or written by a copy engine when the
//! borrow ends, and a CPU access, a drop (a pool hands the block out again at once) or a lend
//! that follows races it. cudarc's own `PinnedHostSlice::as_mut_slice` has the same property.
//! hetmem cannot see such a copy, so it cannot wait for it: that use is outside the hand-off,
//! and the caller must synchronise the stream before touching the buffer again. The copy that
//! keeps the rules goes through a lease: [`Lent::cudarc_host_mut`] gives cudarc the buffer's
//! host memory for copies on the lease's queue's stream, and reclaiming the lease waits for them.
//!
//! hetmem and cudarc share a device through its primary context, the one `CudaContext::new`
//! retains; a queue and a cudarc stream can name one CUDA stream, so that work queued through
//! either runs in one order. This module uses cudarc's safe layer only; the raw handles cross
//! in `backend::cuda`.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ::cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, HostSlice, SyncOnDrop,
};

use super::queue::Queue;
use super::{FenceKind, Lease, LeaseState, Lent, Shared};
use crate::backend::cuda::{CudaDevice, Stream};
use crate::error::{Error, Result};
use crate::memory::{Buffer, Sealed, WritableBuffer};

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
        Ok(stream.to_cudarc(device.ordinal(), ctx)?)
    }
}

fn cpu_queue() -> Error {
    Error::NeedsGpu { what: "cudarc interop".into(), detail: "cudarc needs a queue on a CUDA device".into() }
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

    /// The buffer's host memory for cudarc's copies on `stream` (`memcpy_dtoh` into it,
    /// `memcpy_htod` or `clone_htod` from it): a cudarc `HostSlice` whose copies reclaiming the
    /// lease waits for, unlike a plain slice's (see [the zero-copy contract](crate::memory)). `stream` must be the
    /// stream of the lease's queue (see [`CudarcView`]); the memory need not be mapped.
    ///
    /// ```no_run
    /// use cudarc::driver::CudaContext;
    /// use hetmem::{Device, HostBuf, PinOptions, Queue};
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let ctx = CudaContext::new(0)?;
    /// let stream = ctx.new_stream()?;
    /// let queue = Queue::from_cudarc(&stream)?;
    /// let device = Device::Cuda(queue.cuda_device().expect("a CUDA queue").clone());
    /// let on_gpu = stream.clone_htod(&[1.0f32; 4096])?;
    ///
    /// let mut lent = queue.lend(HostBuf::<f32>::pinned(&device, 4096, PinOptions::default())?);
    /// stream.memcpy_dtoh(&on_gpu, &mut lent.cudarc_host_mut(&stream)?)?; // queued, not done
    /// let host = lent.reclaim()?; // waits for the copy
    /// assert_eq!(host.as_slice()[0], 1.0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A lease of a CPU-backend queue; `stream` is not the stream of the lease's queue, or its
    /// context is not primary; a buffer with no host memory (device memory: use
    /// [`Lent::cudarc_view_mut`]).
    pub fn cudarc_host_mut(&mut self, stream: &CudaStream) -> Result<CudarcHostMut<'_, B::Elem>> {
        let Some(host) = self.region().host else {
            return Err(Error::invalid(
                "cudarc host view",
                "the buffer has no host memory: give cudarc its device address (`cudarc_view_mut`)",
            ));
        };
        let len = self.len();
        let core = ViewCore::new(&*self, stream)?;
        Ok(CudarcHostMut { core, host: host.cast::<B::Elem>(), len, exclusive: PhantomData })
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
/// `CudarcViewMut`'s). cudarc's safe copies keep these rules on the view's side by themselves,
/// with one exception: cudarc 0.19's `memcpy_dtoh` only asserts that its destination is at
/// least as long as its source, then copies as many elements as the destination holds, so a
/// longer destination reads past the view's buffer on the device. Give `memcpy_dtoh` a
/// destination exactly as long as the view (`clone_dtoh` always is). Host memory on the other
/// side of a copy is another matter: a plain slice of page-locked memory is not waited for (see
/// [the zero-copy contract](crate::memory) and [`CudarcHostMut`]).
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
    core: ViewCore<'a>,
    /// The address kernels on the lease's device use.
    address: u64,
    len: usize,
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

/// A [`Lent`] lease's host memory seen by cudarc's copies as a `HostSlice`: `memcpy_dtoh` into
/// it, `memcpy_htod` and `clone_htod` from it, on the lease's queue's stream. Made by
/// [`Lent::cudarc_host_mut`].
///
/// cudarc takes a plain slice's copy to be finished when the call returns, which is not so for
/// page-locked memory (see [the zero-copy contract](crate::memory)); through this view the copy is queued on the
/// lease's stream and, when the view drops, the lease records a fence after it, so reclaiming
/// or dropping the lease waits for it. The stream rules and the panics are [`CudarcView`]'s.
///
/// As a destination of `memcpy_dtoh`, the view must be exactly as long as the source: cudarc
/// 0.19 copies as many elements as the destination holds, reading past a shorter source.
#[derive(Debug)]
pub struct CudarcHostMut<'a, T> {
    core: ViewCore<'a>,
    host: NonNull<T>,
    len: usize,
    exclusive: PhantomData<&'a mut [T]>,
}

// SAFETY: the view stands for a `&mut` borrow of a lent buffer of `T` (Send); its other
// fields are Send (checked below); the pointer is only handed to the driver, from whichever
// thread holds the view.
unsafe impl<T: Send> Send for CudarcHostMut<'_, T> {}
// SAFETY: through a shared view cudarc only reads the memory (`stream_synced_slice`, the
// source of `memcpy_htod`/`clone_htod`), as a `&[T]` of `T: Sync` may be read from several
// threads; writing (`stream_synced_mut_slice`) takes the view exclusively. The other fields
// are Sync (checked below).
unsafe impl<T: Sync> Sync for CudarcHostMut<'_, T> {}

/// The fields of a host view besides its pointer may cross threads by themselves.
const _: () = {
    const fn send_and_sync<S: Send + Sync>() {}
    send_and_sync::<ViewCore<'static>>();
};

/// What every view of a lease for cudarc holds: the lease (counted as viewed while the view
/// lives), its queue's stream, and whether cudarc may have queued work there through the view.
#[derive(Debug)]
struct ViewCore<'a> {
    lease: &'a LeaseState,
    /// The lease's queue's stream, as the wrapper only `DeviceSlice::stream` hands out.
    stream: Arc<CudaStream>,
    /// Whether work may have been queued on the lease's stream through the view.
    queued: AtomicBool,
}

impl<'a> ViewCore<'a> {
    fn new<L: Lease>(lease: &'a L, stream: &CudaStream) -> Result<ViewCore<'a>> {
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
        let stream = own.wrapper_for_views(device.ordinal(), stream.context())?;
        state.open_view();
        Ok(ViewCore { lease: state, stream, queued: AtomicBool::new(false) })
    }

    /// Refuses any stream but the lease's queue's, and notes that work may be queued there.
    fn check_stream(&self, stream: &CudaStream) {
        match route(StreamKey::of(stream), StreamKey::of(&self.stream)) {
            Ok(()) => self.queued.store(true, Ordering::Release),
            Err(why) => panic!("{why}"),
        }
    }
}

impl Drop for ViewCore<'_> {
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

impl<'a, T> CudarcView<'a, T> {
    /// Any lease's buffer as cudarc device memory to read, as [`Shared::cudarc_view`] and
    /// [`Lent::cudarc_view`] give it: for code generic over [`Lease`], such as a
    /// [`crate::stage::Stage`], whose inputs are leases of whichever buffer the strategy uses.
    ///
    /// # Errors
    /// As for [`Shared::cudarc_view`].
    pub fn of<L>(lease: &'a L, stream: &CudaStream) -> Result<CudarcView<'a, T>>
    where
        L: Lease,
        L::Buf: Buffer<Elem = T>,
    {
        CudarcView::new(lease, stream)
    }

    fn new<L>(lease: &'a L, stream: &CudaStream) -> Result<CudarcView<'a, T>>
    where
        L: Lease,
        L::Buf: Buffer<Elem = T>,
    {
        let core = ViewCore::new(lease, stream)?;
        let address = Queue::of_lease(lease.state()).kernel_address(lease)?;
        Ok(CudarcView { core, address, len: lease.len(), elements: PhantomData })
    }
}

impl<T> DeviceSlice<T> for CudarcView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }
}

impl<T> DevicePtr<T> for CudarcView<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.core.check_stream(stream);
        // Nothing to do when cudarc has queued the work: the view's drop records the fence.
        (self.address, SyncOnDrop::Sync(None))
    }
}

impl<T> DeviceSlice<T> for CudarcViewMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.view.core.stream
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

impl<T> HostSlice<T> for CudarcHostMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn stream_synced_slice<'s>(&'s self, stream: &'s CudaStream) -> (&'s [T], SyncOnDrop<'s>) {
        self.core.check_stream(stream);
        // SAFETY: `host` and `len` describe the lent buffer's host memory, which the lease keeps
        // alive and the CPU cannot reach while this view (a borrow of the `Lent`) lives. cudarc
        // only hands the slice's address to the driver for a copy queued on the lease's stream
        // (checked above), never reads it on the CPU; `T: Element` makes any bytes valid.
        let slice = unsafe { std::slice::from_raw_parts(self.host.as_ptr(), self.len) };
        // Nothing to do when cudarc has queued the copy: the view's drop records the fence.
        (slice, SyncOnDrop::Sync(None))
    }

    unsafe fn stream_synced_mut_slice<'s>(
        &'s mut self,
        stream: &'s CudaStream,
    ) -> (&'s mut [T], SyncOnDrop<'s>) {
        self.core.check_stream(stream);
        // SAFETY: as in `stream_synced_slice`; the `Lent` lease is borrowed exclusively by this
        // view, so nothing else reaches the memory the driver is to write.
        let slice = unsafe { std::slice::from_raw_parts_mut(self.host.as_ptr(), self.len) };
        (slice, SyncOnDrop::Sync(None))
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
