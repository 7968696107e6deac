//! [`Queue`]: an ordered queue of work on a device, and the owner of buffers lent to it.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use super::fence::{Fence, FenceKind, FlagPage};
use super::guard::Guard;
use super::launch::KernelArgs;
use super::lease::{CpuRead, Lease, LeaseParts, LeaseState, Lent, Shared};
use crate::backend::cuda::{CudaDevice, Event, Kernel, LaunchConfig, Stream, mapped_address};
use crate::backend::queue::QueueStream;
use crate::backend::{BackendKind, Device};
use crate::error::{Error, Result};
use crate::faults::{FaultPoint, Hit};
use crate::memory::{Buffer, Region, WritableBuffer};

/// A queue of work on one device (a CUDA stream, or the calling thread on the CPU backend),
/// and the owner of the buffers lent to that work. Cheap to clone; clones share the queue.
///
/// # Examples
/// ```
/// use hetmem::{Device, HostBuf, PinOptions, Queue, ops};
/// let device = Device::open_best()?;
/// let queue = Queue::new(&device)?;
/// let mut input = HostBuf::<u32>::pinned(&device, 1024, PinOptions::default())?;
/// input.as_mut_slice().iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
/// let output = HostBuf::<u32>::pinned(&device, 1024, PinOptions::default())?;
///
/// let input = queue.share(input); // GPU and CPU may both read it now
/// let mut output = queue.lend(output); // only the GPU may touch it now
/// ops::affine_u32(&queue, &input, &mut output, 3, 1)?;
/// let output = output.reclaim()?; // waits for the kernel
/// assert_eq!(output.as_slice()[10], 31);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Queue {
    core: Arc<QueueCore>,
}

pub(crate) struct QueueCore {
    backend: QueueStream,
    /// The flag page of flag fences: on a GPU only.
    flags: Option<Arc<FlagPage>>,
    fence_kind: FenceKind,
    /// Held from queueing work until its fence is recorded on the leases, so that across
    /// threads the last fence a lease records is also the last in stream order.
    submit_order: Mutex<()>,
}

impl std::fmt::Debug for QueueCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueCore")
            .field("backend", &self.backend)
            .field("fence_kind", &self.fence_kind)
            .field("submit_order", &self.submit_order)
            .finish()
    }
}

impl QueueCore {
    pub(crate) fn is_cpu(&self) -> bool {
        self.backend.backend() == BackendKind::Cpu
    }

    /// The ordinal of the GPU the queue runs on; `None` on the CPU backend.
    pub(crate) fn cuda_ordinal(&self) -> Option<usize> {
        self.backend.gpu_ordinal()
    }

    pub(crate) fn stream(&self) -> Option<&Stream> {
        self.backend.stream().map(|stream| &**stream)
    }

    pub(crate) fn signal(&self) -> Result<Fence> {
        self.signal_with(self.fence_kind)
    }

    /// A fence on everything queued on the stream at the time of waiting; `None` on the CPU.
    pub(crate) fn stream_fence(&self) -> Option<Fence> {
        self.backend.stream().map(|stream| Fence::stream(Arc::clone(stream)))
    }

    /// Records on `lease` a fence after all work queued on the stream so far, by whoever queued
    /// it (cudarc, through a view of the lease).
    ///
    /// # Errors
    /// As for [`QueueCore::submit`]; the lease then waits for the whole stream.
    pub(crate) fn record_queued_use(&self, lease: &LeaseState) -> Result<()> {
        self.submit(&[lease], |_| Ok::<(), Error>(()))
    }

    /// Queues `work` on the stream and records a fence after it on every lease in `leases`.
    ///
    /// Should the fence fail to be made after the work is queued (no events or file
    /// descriptors left), or `work` fail after queueing part of itself, each lease records a
    /// fence on the whole stream instead, and the error is returned: a lease never forgets work
    /// that uses its buffer.
    pub(crate) fn submit<E>(
        &self,
        leases: &[&LeaseState],
        work: impl FnOnce(&Stream) -> Result<(), E>,
    ) -> Result<()>
    where
        Error: From<E>,
    {
        let Some(stream) = self.backend.stream() else {
            return Err(Error::NeedsGpu {
                what: "GPU work".into(),
                detail: "it was queued on a queue of the CPU backend".into(),
            });
        };
        let _order = self.submit_order.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Err(error) = work(stream) {
            let fence = Fence::stream(Arc::clone(stream));
            for lease in leases {
                lease.record_use(fence.clone());
            }
            return Err(error.into());
        }
        let (fence, failure) = match self.signal() {
            Ok(fence) => (fence, None),
            Err(error) => (Fence::stream(Arc::clone(stream)), Some(error)),
        };
        for lease in leases {
            lease.record_use(fence.clone());
        }
        failure.map_or(Ok(()), Err)
    }

    fn signal_with(&self, kind: FenceKind) -> Result<Fence> {
        match (self.backend.gpu(), &self.flags) {
            (Some((device, stream)), Some(flags)) => Fence::signal(device, stream, flags, kind),
            (None, _) => Ok(Fence::done()),
            // A finished fence here would let leases go while the GPU still uses them.
            (Some(_), None) => unreachable!("a GPU queue always has its flag page (Queue::with_backend)"),
        }
    }
}

/// A buffer that could not be guarded, handed back unchanged.
#[derive(Debug)]
pub struct GuardError<B> {
    /// Why guarding failed.
    pub error: Error,
    /// The buffer.
    pub buffer: B,
}

impl<B> std::fmt::Display for GuardError<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot guard the buffer: {}", self.error)
    }
}

impl<B: std::fmt::Debug> std::error::Error for GuardError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Queue {
    /// A queue on `device` whose leases complete through CUDA events.
    ///
    /// # Errors
    /// Creating the stream or its flag page failed.
    pub fn new(device: &Device) -> Result<Queue> {
        Queue::with_fence_kind(device, FenceKind::default())
    }

    /// A queue whose leases and [`Queue::signal`] use fences of `kind`.
    ///
    /// # Errors
    /// Creating the stream or its flag page failed.
    pub fn with_fence_kind(device: &Device, kind: FenceKind) -> Result<Queue> {
        Queue::with_backend(QueueStream::new(device)?, kind)
    }

    /// A queue of work on `stream`, a stream of `device`.
    ///
    /// # Errors
    /// Creating the flag page failed.
    pub(super) fn on_stream(device: CudaDevice, stream: Stream, kind: FenceKind) -> Result<Queue> {
        Queue::with_backend(QueueStream::on(device, Arc::new(stream)), kind)
    }

    /// A queue on `backend`, with a flag page for flag fences where it is a GPU's stream.
    ///
    /// # Errors
    /// Creating the flag page failed.
    fn with_backend(backend: QueueStream, kind: FenceKind) -> Result<Queue> {
        let flags = match backend.gpu() {
            Some((device, stream)) => Some(Arc::new(FlagPage::new(device, Arc::clone(stream))?)),
            None => None,
        };
        let core = QueueCore { backend, flags, fence_kind: kind, submit_order: Mutex::new(()) };
        Ok(Queue { core: Arc::new(core) })
    }

    /// The queue `lease` belongs to.
    pub(super) fn of_lease(lease: &LeaseState) -> Queue {
        Queue { core: Arc::clone(&lease.queue) }
    }

    /// The backend the queue runs on.
    pub fn backend(&self) -> BackendKind {
        self.core.backend.backend()
    }

    /// A fresh timing event on this queue's GPU; `None` on the CPU backend.
    ///
    /// # Errors
    /// Creating the event failed.
    pub(crate) fn timing_event(&self) -> Result<Option<Event>> {
        Ok(self.core.backend.timing_event()?)
    }

    /// Records `event` at the point this queue's work has reached.
    ///
    /// # Errors
    /// Recording failed.
    pub(crate) fn record(&self, event: &Event) -> Result<()> {
        Ok(self.core.backend.record(event)?)
    }

    /// The device the queue runs on.
    pub(crate) fn device(&self) -> Device {
        self.core.backend.device()
    }

    /// The CUDA device, on the CUDA backend.
    pub fn cuda_device(&self) -> Option<&CudaDevice> {
        self.core.backend.cuda_device()
    }

    /// The queue's CUDA stream, on the CUDA backend: for timing events around its work.
    pub(crate) fn stream(&self) -> Option<&Stream> {
        self.core.stream()
    }

    /// Lends `buffer` to work on this queue, exclusively: the GPU may read and write it.
    pub fn lend<B: WritableBuffer>(&self, buffer: B) -> Lent<B> {
        Lent::new(buffer, Arc::clone(&self.core), None)
    }

    /// Lends `buffer` like [`Queue::lend`] and also removes all CPU access to its pages until it
    /// is reclaimed, so a stray raw-pointer or FFI access faults at once.
    ///
    /// # Errors
    /// The buffer does not own whole pages (a registered `Vec`, managed or device memory); the
    /// GPU reaches host memory through the CPU's page tables (ATS, Grace Hopper), where the
    /// protection would fault the GPU too; or `mprotect` failed. The buffer comes back in the
    /// error.
    pub fn lend_guarded<B: WritableBuffer>(&self, buffer: B) -> Result<Lent<B>, GuardError<B>> {
        let host_page_tables = self
            .cuda_device()
            .is_some_and(|gpu| gpu.attributes().pageable_memory_access_uses_host_page_tables);
        match Guard::protect(&buffer.region(), host_page_tables) {
            Ok(guard) => Ok(Lent::new(buffer, Arc::clone(&self.core), Some(guard))),
            Err(error) => Err(GuardError { error, buffer }),
        }
    }

    /// Shares `buffer` with work on this queue, read-only for both sides.
    pub fn share<B: Buffer>(&self, buffer: B) -> Shared<B> {
        Shared::new(buffer, Arc::clone(&self.core))
    }

    /// A fence (of the queue's kind) after all work queued so far.
    ///
    /// # Errors
    /// The driver's error.
    pub fn signal(&self) -> Result<Fence> {
        self.core.signal()
    }

    /// A fence of `kind` after all work queued so far.
    ///
    /// # Errors
    /// The driver's error.
    pub fn signal_with(&self, kind: FenceKind) -> Result<Fence> {
        self.core.signal_with(kind)
    }

    /// Blocks until all work queued so far has finished (`cuStreamSynchronize`).
    ///
    /// # Errors
    /// The error of failed work.
    pub fn synchronize(&self) -> Result<()> {
        match self.core.stream() {
            Some(stream) => Ok(stream.synchronize()?),
            None => Ok(()),
        }
    }

    /// Queues `kernel` with `args`, then records the launch on every lease among them.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type (buffers are passed
    /// as pointers to their element type), and the kernel must access each buffer only within
    /// its length, and write only buffers passed with [`KernelArgs::write`]; a mapped view
    /// ([`KernelArgs::mapped`]) only through `hetmem/mapped.cuh`'s functions for the kind of
    /// view it is, and not after the view is dropped.
    ///
    /// # Errors
    /// A CPU-backend queue; a lease of another queue; a buffer the device cannot address (not
    /// mapped, or of another device); the driver rejecting the launch.
    pub unsafe fn launch(&self, kernel: &Kernel, config: LaunchConfig, args: KernelArgs<'_>) -> Result<()> {
        if self.core.is_cpu() {
            return Err(Error::NeedsGpu {
                what: "a CUDA kernel launch".into(),
                detail: "kernels run on a queue of the cuda backend; hetmem's ops run their CPU path instead"
                    .into(),
            });
        }
        let (mut words, leases) =
            args.resolve(self.core.cuda_ordinal(), |state, region| self.device_address(state, region))?;
        if crate::faults::check(FaultPoint::Launch)? == Hit::Trap {
            return self.launch_illegal_store(&leases);
        }
        let mut pointers: Vec<*mut c_void> = words.iter_mut().map(|word| (word as *mut u64).cast()).collect();
        self.core.submit(&leases, |stream| {
            // SAFETY: the caller guarantees the argument list matches the kernel; every buffer
            // address was checked to belong to this queue's device; `submit` records a fence
            // after the launch on every lease (a stream fence if the fence itself fails), so no
            // buffer is reclaimed or freed before the kernel finishes.
            unsafe { kernel.launch(stream, config, &mut pointers) }
        })
    }

    /// Queues, instead of a launch, a kernel that stores to an illegal address: an injected
    /// [`crate::faults::FaultKind::Trap`] that really loses the context. Its leases record it
    /// like the launch it replaces.
    #[cfg(feature = "testing")]
    fn launch_illegal_store(&self, leases: &[&LeaseState]) -> Result<()> {
        let device = self.cuda_device().expect("launches checked for a CUDA queue");
        let kernel = crate::kernels::kernel(device, &crate::kernels::FAULT, "illegal_store")?;
        let mut address = 0x10u64;
        let mut pointers = [(&mut address as *mut u64).cast::<c_void>()];
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_bytes: 0 };
        self.core.submit(leases, |stream| {
            // SAFETY: illegal_store(u64 address) takes one u64; the store faults on purpose
            // (feature `testing`), which touches no memory of any buffer.
            unsafe { kernel.launch(stream, config, &mut pointers) }
        })
    }

    #[cfg(not(feature = "testing"))]
    fn launch_illegal_store(&self, _leases: &[&LeaseState]) -> Result<()> {
        unreachable!("traps are injected only with the `testing` feature")
    }

    /// Queues a copy of all of `src` into `dst` (copy engines on the GPU, memcpy on the CPU).
    ///
    /// A copy between two pinned host buffers is done by the driver synchronously with the
    /// stream: the call returns only when earlier work on the queue has finished.
    ///
    /// # Errors
    /// Buffers of different lengths, leases of another queue, memory the device cannot reach,
    /// or the driver's error.
    pub fn copy<S, D>(&self, src: &S, dst: &mut Lent<D>) -> Result<()>
    where
        S: Lease,
        D: WritableBuffer<Elem = <S::Buf as Buffer>::Elem>,
    {
        if src.len() != dst.len() {
            return Err(Error::invalid("copy", format!("{} elements into {}", src.len(), dst.len())));
        }
        self.check_owner(src)?;
        self.check_owner(dst)?;
        match self.core.stream() {
            None => {
                crate::faults::fail::<Error>(FaultPoint::Copy)?;
                src.cpu_read(|from| dst.cpu_write(|to| to.copy_from_slice(from)))??
            }
            Some(_) => {
                let (from, to) = (self.copy_address(src)?, self.copy_address(dst)?);
                let bytes = src.region().bytes;
                self.core.submit(&[src.state(), dst.state()], |stream| {
                    // SAFETY: both ranges are the full buffers, owned by leases of this queue
                    // that record a fence after the copy (`submit`) and so outlive it; `dst` is
                    // exclusively lent.
                    unsafe { stream.copy_async(to, from, bytes) }
                })?;
            }
        }
        Ok(())
    }

    /// Queues a copy of `len` elements of `src` from element `src_offset` into `dst` at element
    /// `dst_offset`: a part of a buffer, as when a file arrives chunk by chunk in staging
    /// buffers and lands at its place in one device allocation. The same memory rules as
    /// [`Queue::copy`].
    ///
    /// # Errors
    /// A range past the end of either buffer, leases of another queue, memory the device
    /// cannot reach, or the driver's error.
    pub fn copy_range<S, D>(
        &self,
        src: &S,
        src_offset: usize,
        dst: &mut Lent<D>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>
    where
        S: Lease,
        D: WritableBuffer<Elem = <S::Buf as Buffer>::Elem>,
    {
        for (what, offset, buffer_len) in
            [("source", src_offset, src.len()), ("destination", dst_offset, dst.len())]
        {
            if offset.checked_add(len).is_none_or(|end| end > buffer_len) {
                return Err(Error::invalid(
                    "copy range",
                    format!("{len} elements from {what} element {offset} pass the end of its {buffer_len}"),
                ));
            }
        }
        self.check_owner(src)?;
        self.check_owner(dst)?;
        let elem = size_of::<<S::Buf as Buffer>::Elem>();
        match self.core.stream() {
            None => {
                crate::faults::fail::<Error>(FaultPoint::Copy)?;
                src.cpu_read(|from| {
                    dst.cpu_write(|to| {
                        to[dst_offset..dst_offset + len].copy_from_slice(&from[src_offset..src_offset + len])
                    })
                })??
            }
            Some(_) if len == 0 => {}
            Some(_) => {
                let from = self.copy_address(src)? + (src_offset * elem) as u64;
                let to = self.copy_address(dst)? + (dst_offset * elem) as u64;
                self.core.submit(&[src.state(), dst.state()], |stream| {
                    // SAFETY: both ranges were checked to lie inside their buffers, owned by
                    // leases of this queue that record a fence after the copy (`submit`) and so
                    // outlive it; `dst` is exclusively lent.
                    unsafe { stream.copy_async(to, from, len * elem) }
                })?;
            }
        }
        Ok(())
    }

    /// Queues `work` (which may fan out to other streams, provided it joins them back into the
    /// queue's stream before returning) and records a fence after it on every lease in
    /// `leases`: for hetmem's ops that queue several operations as one unit.
    pub(crate) fn submit_joined<E>(
        &self,
        leases: &[&LeaseState],
        work: impl FnOnce(&Stream) -> Result<(), E>,
    ) -> Result<()>
    where
        Error: From<E>,
    {
        self.core.submit(leases, work)
    }

    /// The address copies and kernels on this queue use for the lease's buffer: its device
    /// address, else (pinned, unmapped) its host address, which only copies may use.
    ///
    /// # Errors
    /// A lease of another queue, or a buffer of another device.
    pub(crate) fn address_of<L: Lease>(&self, lease: &L) -> Result<u64> {
        self.check_owner(lease)?;
        self.copy_address(lease)
    }

    /// The address a kernel on this queue's device uses for the buffer of `lease`, a lease of
    /// this queue.
    ///
    /// # Errors
    /// A lease of another queue; a buffer the device cannot address (not mapped, or of another
    /// device).
    pub(super) fn kernel_address<L: Lease>(&self, lease: &L) -> Result<u64> {
        self.device_address(lease.state(), &lease.region())
    }

    fn check_owner<L: Lease>(&self, lease: &L) -> Result<()> {
        if Arc::ptr_eq(&lease.state().queue, &self.core) {
            Ok(())
        } else {
            Err(Error::ForeignQueue { what: "this lease", remedy: "reclaim it and lend it to this queue" })
        }
    }

    /// The address a kernel on this queue's device uses for the lease's buffer.
    fn device_address(&self, state: &LeaseState, region: &Region) -> Result<u64> {
        if !Arc::ptr_eq(&state.queue, &self.core) {
            return Err(Error::ForeignQueue {
                what: "a kernel argument's lease",
                remedy: "pass leases of the queue the kernel runs on",
            });
        }
        let mapped = self.mapped_address(region)?;
        mapped.ok_or_else(|| {
            Error::invalid(
                "kernel argument",
                "the buffer is not mapped into the device's address space: allocate it with \
                 PinOptions { mapped: true, .. } or register it with mapped: true, or copy it to a DeviceBuf",
            )
        })
    }

    /// The address kernels on this queue's device use for the region, when it is mapped: its
    /// own device address, or for a portable buffer of another device the address this
    /// device's context gives it.
    fn mapped_address(&self, region: &Region) -> Result<Option<u64>> {
        match self.check_device(region)? {
            Reach::Own => Ok(region.device),
            Reach::Portable(device) => match (region.device, region.host) {
                (Some(_), Some(host)) => Ok(Some(mapped_address(device, host.as_ptr())?)),
                _ => Ok(None),
            },
        }
    }

    /// The address a copy on this queue uses: the device address, else (unified addressing)
    /// the host address of pinned memory.
    fn copy_address<L: Lease>(&self, lease: &L) -> Result<u64> {
        let region = lease.region();
        self.mapped_address(&region)?
            .or(region.host.map(|host| host.as_ptr() as u64))
            .ok_or_else(|| Error::invalid("copy", "the buffer has no address"))
    }

    /// Whether this queue's device may use the region's memory, and how.
    fn check_device(&self, region: &Region) -> Result<Reach<'_>> {
        let Some(device) = self.core.backend.cuda_device() else { return Ok(Reach::Own) };
        Ok(match reach(region.device_ordinal, region.portable, device.ordinal())? {
            ReachKind::Own => Reach::Own,
            ReachKind::Portable => Reach::Portable(device),
        })
    }
}

/// How a CUDA queue reaches a buffer.
enum Reach<'q> {
    /// Made for the queue's own device (or the queue is on the CPU): its own addresses.
    Own,
    /// Portable memory made for another device: addresses from this device's context.
    Portable(&'q CudaDevice),
}

/// [`Reach`] without the device, decided from ordinals alone.
#[derive(Debug, PartialEq, Eq)]
enum ReachKind {
    Own,
    Portable,
}

/// Whether a queue on CUDA device `queue` may use memory made for `buffer` (`None`: the CPU
/// backend). Another device's memory only if it was pinned portable: the driver then lets
/// every context use it, so it is lent to one queue at a time like any buffer (the lease owns
/// it), whichever GPU that queue is on.
fn reach(buffer: Option<usize>, portable: bool, queue: usize) -> Result<ReachKind> {
    match buffer {
        Some(ordinal) if ordinal == queue => Ok(ReachKind::Own),
        Some(_) if portable => Ok(ReachKind::Portable),
        Some(ordinal) => Err(Error::invalid(
            "buffer",
            format!(
                "it belongs to CUDA device {ordinal}, the queue to device {queue}: pin it with \
                 PinOptions {{ portable: true, .. }} to use it from every GPU"
            ),
        )),
        None => Err(Error::invalid(
            "buffer",
            "it was made on the CPU backend, so the GPU cannot reach it: make it on the CUDA device",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_takes_its_own_device_s_memory_and_portable_memory_of_others() {
        assert_eq!(reach(Some(1), false, 1).unwrap(), ReachKind::Own);
        assert_eq!(reach(Some(1), true, 1).unwrap(), ReachKind::Own);
        assert_eq!(reach(Some(0), true, 1).unwrap(), ReachKind::Portable);
    }

    #[test]
    fn other_devices_memory_needs_the_portable_flag() {
        let error = reach(Some(0), false, 1).unwrap_err().to_string();
        assert!(error.contains("belongs to CUDA device 0, the queue to device 1"), "{error}");
        assert!(error.contains("portable: true"), "{error}");
        assert!(reach(None, true, 0).unwrap_err().to_string().contains("CPU backend"));
    }
}
