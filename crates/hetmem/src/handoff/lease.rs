//! Leases: a buffer while GPU work may use it.
//!
//! [`Lent`] is exclusive: GPU work may read and write the buffer and the CPU cannot reach it.
//! [`Shared`] is read-only for both: GPU work may read it and the CPU may read it too. Either
//! gives the buffer back through `reclaim`, which waits for the last work that used it.
//! Dropping a lease waits as well, so memory is never freed under the GPU; if that wait fails
//! (the GPU work failed), the buffer is leaked rather than freed while it may be in use.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::fence::Fence;
use super::guard::Guard;
use super::queue::QueueCore;
use crate::backend::cuda::{Attachment, MemLocation};
use crate::error::{Error, Result};
use crate::memory::{
    Buffer, Element, FileSpan, HostVisible, ManagedBuf, Region, Sealed, WritableBuffer, guarded,
};

mod private {
    /// The bookkeeping every lease carries: its queue, the fence of the last work that used
    /// the buffer, and the guard, if any. Unnameable outside hetmem (this module is private).
    #[derive(Debug)]
    pub struct LeaseState {
        pub(crate) queue: std::sync::Arc<super::QueueCore>,
        pub(super) last_use: std::sync::Mutex<Option<super::Fence>>,
        pub(super) guard: Option<super::Guard>,
        /// cudarc views of the lease not yet dropped (see [`LeaseState::open_view`]).
        pub(super) views: std::sync::atomic::AtomicUsize,
    }

    /// The part of a lease only hetmem may call: this module is private, so code outside hetmem
    /// can neither implement it nor reach the buffer's addresses or bookkeeping.
    pub trait LeaseParts {
        /// The lease's bookkeeping.
        fn state(&self) -> &LeaseState;
    }
}
pub(crate) use private::{LeaseParts, LeaseState};

impl LeaseState {
    fn new(queue: Arc<QueueCore>, guard: Option<Guard>) -> LeaseState {
        LeaseState { queue, last_use: Mutex::new(None), guard, views: AtomicUsize::new(0) }
    }

    /// Counts in a cudarc view: code outside hetmem may now queue work on the buffer on the
    /// lease's stream, which the lease learns of only when [`LeaseState::close_view`] records a
    /// fence after it. Until then, waiting for the lease waits for the whole stream.
    pub(crate) fn open_view(&self) {
        self.views.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts out a view opened by [`LeaseState::open_view`], once a fence after its work is
    /// recorded.
    pub(crate) fn close_view(&self) {
        self.views.fetch_sub(1, Ordering::AcqRel);
    }

    /// Records that work up to `fence` uses the buffer. Work on one queue finishes in order,
    /// so the latest fence covers every earlier use.
    pub(crate) fn record_use(&self, fence: Fence) {
        *self.last_use.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(fence);
    }

    fn pending(&self) -> Option<Fence> {
        if self.views.load(Ordering::Acquire) > 0 {
            // Work a live view let cudarc queue (`is_complete` may ask meanwhile), or a leaked
            // one (reclaiming and dropping own the lease, so a view still counted then was
            // forgotten), may be anywhere on the stream, with no fence recorded for it.
            return self.queue.stream_fence();
        }
        self.last_use.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    fn wait(&self) -> Result<()> {
        crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::FenceWait)?;
        if let Some(fence) = self.pending() {
            fence.wait()?;
            *self.last_use.lock().unwrap_or_else(|poison| poison.into_inner()) = None;
        }
        Ok(())
    }

    fn is_complete(&self) -> Result<bool> {
        self.pending().map_or(Ok(true), |fence| fence.is_complete())
    }

    /// Waits for the GPU, then restores CPU access to guarded pages.
    fn finish(&self) -> Result<()> {
        self.wait()?;
        match &self.guard {
            Some(guard) => guard.lift(),
            None => Ok(()),
        }
    }

    /// Runs `f` with the buffer's pages accessible to the CPU: CPU-backend queues only, whose
    /// work runs on the calling thread while the buffer is lent.
    fn with_cpu_access<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        if let Some(device) = self.queue.cuda_ordinal() {
            return Err(Error::LentToGpu { device });
        }
        let _access = self.guard.as_ref().map(Guard::cpu_access).transpose()?;
        Ok(f())
    }
}

/// A buffer and its lease bookkeeping: the part [`Lent`] and [`Shared`] have in common.
/// Dropping it waits for the GPU; if that wait fails the buffer is leaked, never freed.
#[derive(Debug)]
struct Held<B: Buffer> {
    buf: ManuallyDrop<B>,
    state: ManuallyDrop<LeaseState>,
}

impl<B: Buffer> Held<B> {
    fn new(buf: B, queue: Arc<QueueCore>, guard: Option<Guard>) -> Held<B> {
        Held { buf: ManuallyDrop::new(buf), state: ManuallyDrop::new(LeaseState::new(queue, guard)) }
    }

    fn reclaim(self) -> Result<B> {
        let mut this = ManuallyDrop::new(self);
        if let Err(error) = this.state.finish() {
            tracing::error!("GPU work on a lent buffer failed; leaking the buffer: {error}");
            return Err(error);
        }
        // SAFETY: `this` is ManuallyDrop and never used again, so each field is moved out or
        // dropped exactly once.
        unsafe {
            ManuallyDrop::drop(&mut this.state);
            Ok(ManuallyDrop::take(&mut this.buf))
        }
    }

    async fn reclaim_async(self) -> Result<B> {
        if let Some(fence) = self.state.pending() {
            fence.wait_async().await?;
        }
        self.reclaim()
    }
}

impl<B: Buffer> Drop for Held<B> {
    fn drop(&mut self) {
        match self.state.finish() {
            // SAFETY: drop runs once; the fields are not used afterwards.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buf) },
            Err(error) => tracing::error!("GPU work on a dropped lease failed; leaking its buffer: {error}"),
        }
        // SAFETY: as above.
        unsafe { ManuallyDrop::drop(&mut self.state) };
    }
}

/// A buffer lent to GPU work, or shared with it. Implemented by [`Lent`] and [`Shared`].
pub trait Lease: Sealed + LeaseParts + Send + Sync {
    /// The buffer type.
    type Buf: Buffer;

    /// The number of elements in the buffer.
    fn len(&self) -> usize;

    /// Always false: hetmem buffers hold at least one element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// CPU access to a lease's elements for hetmem's own CPU paths.
pub(crate) trait CpuRead: Lease {
    /// Runs `f` on the elements, on a CPU-backend queue (whose work runs on the calling thread).
    fn cpu_read<R>(&self, f: impl FnOnce(&[<Self::Buf as Buffer>::Elem]) -> R) -> Result<R> {
        let region = self.region();
        let host =
            region.host.ok_or_else(|| Error::invalid("CPU access", "the buffer has no host address"))?;
        self.state().with_cpu_access(|| {
            // A fault in a file mapping is recovered (`guarded`).
            // SAFETY: guarded: the span and the region are the held buffer's, whose bytes start
            // at `host`; the lease keeps the buffer (and so its mapping) alive. The slice: `len`
            // initialised elements live at `host` while the lease holds the buffer; the lease
            // is borrowed for the call, and on a CPU queue no other work runs now.
            unsafe {
                guarded(self.file_span(), host, region.bytes, || {
                    f(std::slice::from_raw_parts(host.cast().as_ptr(), self.len()))
                })
            }
        })?
    }
}

impl<L: Lease> CpuRead for L {}

/// A buffer lent exclusively to GPU work on a [`crate::Queue`]: the GPU may read and write it;
/// the CPU cannot reach it until [`Lent::reclaim`] gives it back.
///
/// ```compile_fail
/// # use hetmem::*;
/// # let device = Device::open_best().unwrap();
/// # let queue = Queue::new(&device).unwrap();
/// let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
/// let lent = queue.lend(buf);
/// buf.as_slice(); // error: `buf` moved into the lease
/// ```
#[derive(Debug)]
#[must_use = "dropping a lease waits for the GPU; reclaim it to get the buffer back"]
pub struct Lent<B: WritableBuffer> {
    held: Held<B>,
}

impl<B: WritableBuffer> Lent<B> {
    pub(crate) fn new(buf: B, queue: Arc<QueueCore>, guard: Option<Guard>) -> Lent<B> {
        Lent { held: Held::new(buf, queue, guard) }
    }

    /// Waits for the last GPU work that used the buffer and gives it back to the CPU.
    ///
    /// # Errors
    /// The error of the failed GPU work. The buffer is then leaked, never freed, since the
    /// GPU may still be using it.
    pub fn reclaim(self) -> Result<B> {
        self.held.reclaim()
    }

    /// Awaits the last GPU work that used the buffer without blocking the thread, then gives it
    /// back. Dropping the future before it completes drops the lease, which then waits for the
    /// GPU on the dropping thread.
    ///
    /// # Errors
    /// As for [`Lent::reclaim`].
    pub async fn reclaim_async(self) -> Result<B> {
        self.held.reclaim_async().await
    }

    /// Whether the GPU work that used the buffer has finished.
    ///
    /// # Errors
    /// The error of failed GPU work.
    pub fn is_complete(&self) -> Result<bool> {
        self.held.state.is_complete()
    }

    /// Runs `f` on the elements, mutably, on a CPU-backend queue.
    pub(crate) fn cpu_write<R>(&mut self, f: impl FnOnce(&mut [B::Elem]) -> R) -> Result<R> {
        let region = self.held.buf.region();
        let host =
            region.host.ok_or_else(|| Error::invalid("CPU access", "the buffer has no host address"))?;
        let len = self.held.buf.len();
        let span = self.held.buf.file_span();
        self.held.state.with_cpu_access(|| {
            // SAFETY: as in cpu_read, and `&mut self` makes the access exclusive.
            unsafe {
                guarded(span, host, region.bytes, || {
                    f(std::slice::from_raw_parts_mut(host.cast().as_ptr(), len))
                })
            }
        })?
    }
}

impl<T: Element> Lent<ManagedBuf<T>> {
    /// Queues a migration of the managed buffer to `location` (the device before kernels read
    /// it, the host before the CPU does), so accesses there do not fault. Nothing happens on the
    /// CPU backend.
    ///
    /// # Errors
    /// The driver's error.
    pub fn prefetch(&mut self, location: MemLocation) -> Result<()> {
        let held = &self.held;
        let (Some(alloc), Some(_)) = (held.buf.managed_alloc(), held.state.queue.stream()) else {
            return Ok(());
        };
        // SAFETY: the allocation is the lent buffer's, which the lease holds until the fence
        // `submit` records on it (after the prefetch, on the same stream) has passed.
        held.state.queue.submit(&[&held.state], |stream| unsafe { alloc.prefetch(stream, location) })
    }

    /// Queues the association of the managed buffer with this lease's stream alone, or with
    /// every stream again ([`crate::handoff::Attached`] is the public face). Nothing happens
    /// on the CPU backend.
    pub(crate) fn attach(&mut self, attachment: Attachment) -> Result<()> {
        let held = &self.held;
        let (Some(alloc), Some(_)) = (held.buf.managed_alloc(), held.state.queue.stream()) else {
            return Ok(());
        };
        // SAFETY: the allocation is the lent buffer's, which the lease holds until the fence
        // `submit` records on it (after the attachment, on the same stream) has passed; the
        // CPU reaches the buffer only after reclaiming it, which waits for that fence, and a
        // ManagedBuf exists only on devices with concurrent managed access, where the CPU may
        // touch managed memory whatever other streams run.
        held.state.queue.submit(&[&held.state], |stream| unsafe { alloc.attach(stream, attachment) })
    }
}

impl<B: WritableBuffer> Sealed for Lent<B> {
    fn region(&self) -> Region {
        self.held.buf.region()
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.held.buf.file_span()
    }
}

impl<B: WritableBuffer> LeaseParts for Lent<B> {
    fn state(&self) -> &LeaseState {
        &self.held.state
    }
}

impl<B: WritableBuffer> Lease for Lent<B> {
    type Buf = B;

    fn len(&self) -> usize {
        self.held.buf.len()
    }
}

/// A buffer shared read-only between the CPU and GPU work on a [`crate::Queue`]: kernels may
/// read it, the CPU may read it ([`Shared::host`]), nobody may write it.
#[derive(Debug)]
#[must_use = "dropping a lease waits for the GPU; reclaim it to get the buffer back"]
pub struct Shared<B: Buffer> {
    held: Held<B>,
}

impl<B: Buffer> Shared<B> {
    pub(crate) fn new(buf: B, queue: Arc<QueueCore>) -> Shared<B> {
        Shared { held: Held::new(buf, queue, None) }
    }

    /// Waits for the last GPU work that read the buffer and gives it back to the CPU.
    ///
    /// # Errors
    /// As for [`Lent::reclaim`].
    pub fn reclaim(self) -> Result<B> {
        self.held.reclaim()
    }

    /// Awaits the GPU work that read the buffer, then gives it back.
    ///
    /// # Errors
    /// As for [`Lent::reclaim`].
    pub async fn reclaim_async(self) -> Result<B> {
        self.held.reclaim_async().await
    }

    /// Whether the GPU work that read the buffer has finished.
    ///
    /// # Errors
    /// The error of failed GPU work.
    pub fn is_complete(&self) -> Result<bool> {
        self.held.state.is_complete()
    }
}

impl<B: HostVisible> Shared<B> {
    /// The elements, for the CPU to read while GPU work reads them too.
    pub fn host(&self) -> &[B::Elem] {
        let region = self.held.buf.region();
        let host = region.host.expect("host-visible buffers have a host address");
        // SAFETY: `len` initialised elements at `host`, alive while the lease is; a shared lease
        // lets no one write them (GPU writes need a Lent), so reading races nothing.
        unsafe { std::slice::from_raw_parts(host.cast().as_ptr(), self.held.buf.len()) }
    }
}

impl<B: Buffer> Sealed for Shared<B> {
    fn region(&self) -> Region {
        self.held.buf.region()
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.held.buf.file_span()
    }
}

impl<B: Buffer> LeaseParts for Shared<B> {
    fn state(&self) -> &LeaseState {
        &self.held.state
    }
}

impl<B: Buffer> Lease for Shared<B> {
    type Buf = B;

    fn len(&self) -> usize {
        self.held.buf.len()
    }
}
