//! [`Attached`]: a managed buffer attached to one queue's stream.

use super::lease::Lent;
use super::queue::Queue;
use crate::backend::cuda::{Attachment, MemLocation};
use crate::error::{Error, Result};
use crate::memory::{Element, ManagedBuf};

/// A [`ManagedBuf`] attached to the stream of one [`Queue`] (`cuStreamAttachMemAsync` with
/// `CU_MEM_ATTACH_SINGLE`), made by [`Queue::attach`] and given back, attached to every stream
/// again, by [`Attached::detach`].
///
/// Attached, the driver keeps the pages coherent with that stream's work alone, rather than
/// with every stream of every device. The types keep the rules that go with it:
/// - GPU work reaches the buffer only through [`Attached::lease`], a [`Lent`] lease of the
///   queue it is attached to: kernels ([`crate::handoff::KernelArgs::write`]), copies and
///   stages on that queue take it, and any other queue refuses it when the work is queued
///   (a lease of another queue). `Attached` itself is no buffer, so it cannot be lent to
///   another queue.
/// - The CPU reaches the elements only through [`Attached::host`] and [`Attached::host_mut`],
///   which first wait for every piece of work queued on the lease, then synchronise the queue
///   (CUDA lets the CPU touch memory attached to one stream once that stream is idle), and
///   whose borrow keeps [`Attached::lease`] from queuing more while the CPU holds the slice.
/// - It borrows the queue, so it cannot outlive the stream it is attached to.
///
/// Those rules are what the attachment asks of devices without concurrent managed access; a
/// `ManagedBuf` exists only on devices with it, where CUDA lets other streams and the CPU
/// touch memory attached to one stream all the same. So a lease taken out of
/// [`Attached::lease`]'s `&mut` (by `std::mem::swap` with another), which then leaves with
/// the buffer still attached, breaks no rule that memory safety rests on.
///
/// Dropping it waits for the work queued on it, then frees the memory. On the CPU backend the
/// attachment is a no-op, with the same types and rules.
///
/// # Examples
/// ```
/// use hetmem::{Device, ManagedBuf, Queue};
///
/// let device = Device::open_best()?;
/// let queue = Queue::new(&device)?;
/// # if device.capabilities().gpu && !device.capabilities().concurrent_managed_access { return Ok(()); }
/// let mut attached = queue.attach(ManagedBuf::<u32>::new(&device, 1024)?)?;
/// attached.host_mut()?.fill(7); // waits for the attachment first
/// let _lease = attached.lease(); // for kernels, copies and stages on `queue`
/// assert!(attached.host()?.iter().all(|&x| x == 7));
/// let buffer = attached.detach()?; // attached to every stream again
/// # drop(buffer);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct Attached<'q, T: Element> {
    queue: &'q Queue,
    side: Side<T>,
}

/// Who holds the buffer now.
#[derive(Debug)]
enum Side<T: Element> {
    /// The CPU: all work queued on it has finished.
    Cpu(ManagedBuf<T>),
    /// The queue, through a lease.
    Gpu(Lent<ManagedBuf<T>>),
    /// Waiting for its work failed, so the buffer was leaked rather than freed under the GPU.
    Lost,
}

impl Queue {
    /// Attaches `buffer` to this queue's stream: see [`Attached`].
    ///
    /// # Errors
    /// The driver's error; the buffer is then leaked if the attachment may still be queued.
    pub fn attach<T: Element>(&self, buffer: ManagedBuf<T>) -> Result<Attached<'_, T>> {
        let mut lent = self.lend(buffer);
        lent.attach(Attachment::Single)?;
        Ok(Attached { queue: self, side: Side::Gpu(lent) })
    }
}

impl<'q, T: Element> Attached<'q, T> {
    /// The queue the buffer is attached to.
    pub fn queue(&self) -> &'q Queue {
        self.queue
    }

    /// The buffer, lent to the queue it is attached to, for GPU work there: kernels, copies,
    /// prefetches, stages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when earlier GPU work on the buffer failed (it was leaked).
    pub fn lease(&mut self) -> Result<&mut Lent<ManagedBuf<T>>> {
        if let Side::Cpu(_) = self.side {
            let Side::Cpu(buffer) = std::mem::replace(&mut self.side, Side::Lost) else {
                unreachable!("matched above")
            };
            self.side = Side::Gpu(self.queue.lend(buffer));
        }
        match &mut self.side {
            Side::Gpu(lent) => Ok(lent),
            _ => Err(lost()),
        }
    }

    /// Queues a migration of the buffer to `location` on its queue (see [`Lent::prefetch`]).
    ///
    /// # Errors
    /// As for [`Attached::lease`]; the driver's error.
    pub fn prefetch(&mut self, location: MemLocation) -> Result<()> {
        self.lease()?.prefetch(location)
    }

    /// The elements, for the CPU to read, once the work queued on the buffer has finished and
    /// the queue is idle (a call that finds the buffer with the CPU already returns at once).
    ///
    /// # Errors
    /// The error of failed GPU work (the buffer is then leaked, and later calls fail), or of
    /// synchronising the queue.
    pub fn host(&mut self) -> Result<&[T]> {
        Ok(self.host_mut()?)
    }

    /// The elements, for the CPU to read and write, once the work queued on the buffer has
    /// finished and the queue is idle.
    ///
    /// # Errors
    /// As for [`Attached::host`].
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        if let Side::Gpu(_) = self.side {
            let Side::Gpu(lent) = std::mem::replace(&mut self.side, Side::Lost) else {
                unreachable!("matched above")
            };
            // On failure the lease leaks the buffer (it may still be in use) and `side` stays
            // Lost.
            self.side = Side::Cpu(lent.reclaim()?);
            // The stream the memory is attached to is idle before the CPU touches it, whatever
            // else was queued on it.
            self.queue.synchronize()?;
        }
        match &mut self.side {
            Side::Cpu(buffer) => Ok(buffer.as_mut_slice()),
            _ => Err(lost()),
        }
    }

    /// Attaches the buffer to every stream again (`CU_MEM_ATTACH_GLOBAL`), waits for that and
    /// for all work queued on it, and gives it back.
    ///
    /// # Errors
    /// As for [`Attached::host`]; the driver's error.
    pub fn detach(mut self) -> Result<ManagedBuf<T>> {
        self.lease()?.attach(Attachment::Global)?;
        match std::mem::replace(&mut self.side, Side::Lost) {
            Side::Gpu(lent) => lent.reclaim(),
            _ => unreachable!("lease() leaves it lent"),
        }
    }
}

fn lost() -> Error {
    Error::invalid(
        "attached managed buffer",
        "earlier GPU work on it failed, so it was leaked rather than freed under the GPU: allocate \
         a new buffer",
    )
}
