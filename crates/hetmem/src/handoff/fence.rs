//! Fences: how the CPU learns that GPU work queued before a point has finished.
//!
//! Slowest to fastest on the H200 machine (figures in `bench/results/`):
//! - [`FenceKind::HostCallback`]: the driver runs a host function after the work, which writes
//!   an eventfd the CPU blocks on. Fits `poll`-based event loops ([`Fence::eventfd`]); the
//!   driver's callback thread adds tens of microseconds.
//! - [`FenceKind::Event`]: a CUDA event, waited on with `cuEventSynchronize`. The default.
//! - [`FenceKind::Flag`]: the stream writes a sequence number into mapped host memory
//!   (`cuStreamWriteValue32`, with a memory barrier) and the CPU spins on it: the fastest, at
//!   the cost of a spinning core while waiting.
//!
//! Any fence can also be awaited: [`Fence::wait_async`] hands it to a poller thread that wakes
//! the task when it completes, so async runtimes never block a worker. With the `tokio`
//! feature, `Fence::wait_tokio` awaits a host-callback fence on tokio's own reactor instead.

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rustix::event::EventfdFlags;
use rustix::fd::OwnedFd;

use crate::backend::cuda::{CudaDevice, Event, HostAllocFlags, PinnedAlloc, Stream};
use crate::error::{Error, Result};

/// How a queue signals that work has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FenceKind {
    /// A CUDA event; waiting calls `cuEventSynchronize`.
    #[default]
    Event,
    /// A sequence number written into mapped host memory by the stream; waiting spins on it.
    Flag,
    /// A host function run by the driver after the work, writing an eventfd; waiting blocks in
    /// `poll`/`read`. Each such fence holds one file descriptor until its last clone drops.
    HostCallback,
}

/// A point in a queue's work; complete once everything queued before it has finished.
/// Cheap to clone; clones observe the same point.
#[derive(Clone)]
pub struct Fence {
    inner: Arc<FenceInner>,
}

enum FenceInner {
    /// CPU-backend work, which finishes before its fence exists.
    Done,
    /// Everything queued on the stream (the fallback when no other fence could be made).
    Stream(Arc<Stream>),
    Event(Event),
    Flag {
        page: Arc<FlagPage>,
        target: u32,
        stream: Arc<Stream>,
    },
    Callback(Arc<CallbackState>),
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &*self.inner {
            FenceInner::Done => "done",
            FenceInner::Stream(_) => "stream",
            FenceInner::Event(_) => "event",
            FenceInner::Flag { .. } => "flag",
            FenceInner::Callback(_) => "host callback",
        };
        f.debug_struct("Fence").field("kind", &kind).finish()
    }
}

/// Spins between checks for a failed stream while waiting on a flag.
const FLAG_SPINS_PER_ERROR_CHECK: u32 = 1 << 12;

impl Fence {
    /// A fence that is already complete (CPU-backend work).
    pub(crate) fn done() -> Fence {
        Fence { inner: Arc::new(FenceInner::Done) }
    }

    /// A fence on everything queued on `stream` so far and later: it needs no resources, so it
    /// is what a lease records when a proper fence cannot be made.
    pub(crate) fn stream(stream: Arc<Stream>) -> Fence {
        Fence { inner: Arc::new(FenceInner::Stream(stream)) }
    }

    /// Signals `kind` on `stream` after all work queued so far.
    pub(crate) fn signal(
        device: &CudaDevice,
        stream: &Arc<Stream>,
        flags: &Arc<FlagPage>,
        kind: FenceKind,
    ) -> Result<Fence> {
        let inner = match kind {
            FenceKind::Event => {
                let event = Event::new(device, false)?;
                event.record(stream)?;
                FenceInner::Event(event)
            }
            FenceKind::Flag => {
                let target = flags.signal()?;
                FenceInner::Flag { page: Arc::clone(flags), target, stream: Arc::clone(stream) }
            }
            FenceKind::HostCallback => {
                let state = Arc::new(CallbackState::new(Some(Arc::clone(stream)))?);
                let signalled = Arc::clone(&state);
                stream.launch_host_fn(Box::new(move || signalled.signal()))?;
                FenceInner::Callback(state)
            }
        };
        Ok(Fence { inner: Arc::new(inner) })
    }

    /// Blocks until the work before the fence has finished.
    ///
    /// # Errors
    /// The error of any failed work before the fence.
    pub fn wait(&self) -> Result<()> {
        match &*self.inner {
            FenceInner::Done => Ok(()),
            FenceInner::Stream(stream) => Ok(stream.synchronize()?),
            FenceInner::Event(event) => Ok(event.synchronize()?),
            FenceInner::Flag { page, target, stream } => {
                let mut spins = 0u32;
                let mut idle_checks = 0u32;
                while !page.reached(*target) {
                    std::hint::spin_loop();
                    spins += 1;
                    if spins.is_multiple_of(FLAG_SPINS_PER_ERROR_CHECK) {
                        // A failed stream never writes the flag: surface its error instead of
                        // spinning for ever. An idle stream has written it; give the write a
                        // moment to become visible, then call it lost.
                        if stream.is_idle()? {
                            idle_checks += 1;
                            if idle_checks > 1000 && !page.reached(*target) {
                                return Err(Error::FlagNeverArrived { target: *target });
                            }
                        }
                    }
                }
                Ok(())
            }
            FenceInner::Callback(state) => state.wait(),
        }
    }

    /// Whether the work before the fence has finished, without blocking.
    ///
    /// # Errors
    /// The error of any failed work before the fence.
    pub fn is_complete(&self) -> Result<bool> {
        self.poll(true)
    }

    /// Like [`Fence::is_complete`]; `check_errors: false` skips the driver call a flag fence
    /// needs to notice a failed stream, for pollers that check often.
    pub(crate) fn poll(&self, check_errors: bool) -> Result<bool> {
        match &*self.inner {
            FenceInner::Done => Ok(true),
            FenceInner::Stream(stream) => Ok(stream.is_idle()?),
            FenceInner::Event(event) => Ok(event.is_complete()?),
            FenceInner::Flag { page, target, stream } => {
                if page.reached(*target) {
                    return Ok(true);
                }
                if check_errors {
                    stream.is_idle()?;
                }
                Ok(false)
            }
            FenceInner::Callback(state) => {
                if state.done.load(Ordering::Acquire) {
                    return Ok(true);
                }
                // After a failed kernel the driver never runs the callback: ask the stream.
                if check_errors {
                    state.check_stream()?;
                }
                Ok(false)
            }
        }
    }

    /// A future that completes when the fence does, without blocking the polling thread:
    /// usable from tokio or any other executor. The process's poller thread watches it: it
    /// sweeps continuously for 250 us after each registration or completion (a short wait is
    /// noticed within microseconds), then backs off, sleeping between sweeps, so that a long
    /// wait costs no core: an event or flag fence completing after a long wait is noticed up
    /// to an eighth of the wait (at most 1 ms) late, a host-callback fence at once (its
    /// eventfd wakes the poller).
    pub fn wait_async(&self) -> super::poller::FenceFuture {
        super::poller::FenceFuture::new(self.clone())
    }

    /// The eventfd of a host-callback fence ([`FenceKind::HostCallback`]), for `poll`-,
    /// `epoll`- or reactor-based loops (mio, tokio's `AsyncFd`, glib...); `None` for the other
    /// kinds, which have none.
    ///
    /// The descriptor becomes readable when the fence completes and then stays readable. Wait
    /// for readability only: do not read from it (that would hide the completion from other
    /// waiters). After it is readable, or after a while without, call
    /// [`Fence::is_complete`]: it confirms completion and reports a failed stream, whose
    /// callback never runs.
    ///
    /// ```no_run
    /// # use hetmem::{Device, FenceKind, Queue};
    /// # use std::os::fd::AsFd;
    /// let device = Device::open_best()?;
    /// let queue = Queue::with_fence_kind(&device, FenceKind::HostCallback)?;
    /// let fence = queue.signal()?;
    /// let fd = fence.eventfd().expect("a host-callback fence");
    /// let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
    /// while !fence.is_complete()? {
    ///     // A timeout, so that a failed stream is noticed by is_complete.
    ///     let timeout = rustix::time::Timespec { tv_sec: 0, tv_nsec: 10_000_000 };
    ///     rustix::event::poll(&mut fds, Some(&timeout)).ok();
    /// }
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn eventfd(&self) -> Option<FenceFd> {
        match &*self.inner {
            FenceInner::Callback(state) => Some(FenceFd { state: Arc::clone(state) }),
            _ => None,
        }
    }

    /// The eventfd of a host-callback fence, borrowed: what the poller thread sleeps on.
    pub(crate) fn ready_fd(&self) -> Option<BorrowedFd<'_>> {
        match &*self.inner {
            FenceInner::Callback(state) => Some(state.fd.as_fd()),
            _ => None,
        }
    }

    /// A host-callback fence with no stream behind it, and the function that completes it:
    /// the fence the poller's and the tokio tests signal by hand, without a GPU.
    #[cfg(test)]
    pub(crate) fn signalled_by_hand() -> (Fence, impl Fn() + Send + Sync + 'static) {
        let state = Arc::new(CallbackState::new(None).expect("an eventfd for a test fence"));
        let signal = {
            let state = Arc::clone(&state);
            move || state.signal()
        };
        (Fence { inner: Arc::new(FenceInner::Callback(state)) }, signal)
    }
}

/// The eventfd of a host-callback fence ([`Fence::eventfd`]): readable once the fence has
/// completed. It keeps the descriptor open while it lives, even after the fence is dropped.
#[derive(Clone)]
pub struct FenceFd {
    state: Arc<CallbackState>,
}

impl std::fmt::Debug for FenceFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceFd").field("fd", &self.state.fd.as_raw_fd()).finish()
    }
}

impl AsFd for FenceFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.state.fd.as_fd()
    }
}

impl AsRawFd for FenceFd {
    fn as_raw_fd(&self) -> RawFd {
        self.state.fd.as_raw_fd()
    }
}

/// A page of mapped pinned memory whose first word a queue's stream writes sequence numbers to.
///
/// The page keeps the stream that writes it: dropping the page waits for that stream first
/// (a write it queued may still be pending, fence or no fence), and leaks the page when the
/// stream failed, rather than free memory the GPU may still write.
pub(crate) struct FlagPage {
    alloc: ManuallyDrop<PinnedAlloc>,
    word: *const AtomicU32,
    next: Mutex<u32>,
    stream: Arc<Stream>,
}

// SAFETY: the word is an AtomicU32 in memory owned by `alloc`, valid from any thread; the
// sequence counter is behind a Mutex.
unsafe impl Send for FlagPage {}
// SAFETY: as for Send.
unsafe impl Sync for FlagPage {}

impl FlagPage {
    /// A flag page written by `stream`.
    pub(crate) fn new(device: &CudaDevice, stream: Arc<Stream>) -> Result<FlagPage> {
        let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
        // Zeroed before the word is read as an atomic: the driver leaves its memory unwritten.
        let alloc = PinnedAlloc::zeroed(device, 4096, flags)?;
        let word = alloc.host_ptr().cast::<AtomicU32>();
        Ok(FlagPage { alloc: ManuallyDrop::new(alloc), word, next: Mutex::new(0), stream })
    }

    /// Queues the next sequence number on the page's stream and returns it.
    fn signal(&self) -> Result<u32> {
        let stream = &self.stream;
        // The lock keeps sequence order and stream order the same across threads.
        let mut next = self.next.lock().unwrap_or_else(|poison| poison.into_inner());
        let target = next.wrapping_add(1);
        let address = self.alloc.device_ptr().expect("flag pages are mapped");
        // SAFETY: the address is the first, 4-byte aligned word of this mapped page, which
        // outlives the write: dropping the page waits for this stream first (or leaks it).
        unsafe { stream.write_value32(address, target) }?;
        *next = target;
        Ok(target)
    }

    /// Whether the stream has written `target` (or a later number) yet.
    fn reached(&self, target: u32) -> bool {
        // SAFETY: `word` points into `self.alloc`, alive as long as self and zeroed when
        // allocated.
        let seen = unsafe { (*self.word).load(Ordering::Acquire) };
        // Wrapping comparison: sequence numbers run round after 2^32 signals.
        seen.wrapping_sub(target) as i32 >= 0
    }
}

impl Drop for FlagPage {
    fn drop(&mut self) {
        match self.stream.synchronize() {
            // SAFETY: the stream that writes the page is idle, so no write is pending; the
            // page is dropped once, here.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.alloc) },
            Err(error) => tracing::error!("a queue's stream failed; leaking its flag page: {error}"),
        }
    }
}

/// The shared state of a host-callback fence.
struct CallbackState {
    done: AtomicBool,
    /// Written once, after `done` is set: readable from then on.
    fd: OwnedFd,
    /// Asked between waits: after a failed kernel the driver never runs the callback. `None`
    /// only for the fences hetmem's own tests signal by hand.
    stream: Option<Arc<Stream>>,
}

/// How long a host-callback wait blocks before asking the stream whether it failed.
const CALLBACK_ERROR_CHECK: rustix::time::Timespec = rustix::time::Timespec { tv_sec: 0, tv_nsec: 5_000_000 };

impl CallbackState {
    fn new(stream: Option<Arc<Stream>>) -> Result<CallbackState> {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC)
            .map_err(|errno| Error::Io { context: "creating an eventfd".into(), source: errno.into() })?;
        Ok(CallbackState { done: AtomicBool::new(false), fd, stream })
    }

    /// Whether a wait should go on: an error once the stream has failed.
    fn check_stream(&self) -> Result<()> {
        match &self.stream {
            Some(stream) => stream.is_idle().map(|_| ()).map_err(Error::from),
            None => Ok(()),
        }
    }

    /// Runs on the driver's callback thread.
    fn signal(&self) {
        self.done.store(true, Ordering::Release);
        if let Err(errno) = rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            tracing::error!("writing a fence's eventfd failed: {errno}");
        }
    }

    /// Blocks until the callback has run. The eventfd is never read, so it stays readable for
    /// every other waiter (clones of the fence, `poll` loops, the poller, tokio).
    fn wait(&self) -> Result<()> {
        while !self.done.load(Ordering::Acquire) {
            let mut fds = [rustix::event::PollFd::new(&self.fd, rustix::event::PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&CALLBACK_ERROR_CHECK)) {
                // Nothing yet: a failed stream will never call back, so surface its error.
                Ok(0) => self.check_stream()?,
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(errno) => {
                    return Err(Error::Io {
                        context: "polling a fence's eventfd".into(),
                        source: errno.into(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable now.
    fn readable(fd: &impl AsFd) -> bool {
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        rustix::event::poll(&mut fds, Some(&zero)).unwrap() == 1
    }

    #[test]
    fn a_host_callback_fences_eventfd_becomes_and_stays_readable() {
        let (fence, signal) = Fence::signalled_by_hand();
        let fd = fence.eventfd().expect("a host-callback fence has an eventfd");
        assert!(!readable(&fd) && !fence.is_complete().unwrap());
        let waiter = {
            let fence = fence.clone();
            std::thread::spawn(move || fence.wait())
        };
        signal();
        waiter.join().unwrap().unwrap();
        // Waiting did not consume it: every other waiter still sees it.
        assert!(readable(&fd) && readable(&fd.clone()) && fence.is_complete().unwrap());
        fence.wait().unwrap();
        // The descriptor outlives the fence.
        drop(fence);
        assert!(readable(&fd), "{fd:?}");
        assert!(Fence::done().eventfd().is_none());
    }

    /// A flag the stream was never asked to write, as on a platform that loses the stream's
    /// writes to mapped memory: once the stream is idle the wait ends, by its own variant,
    /// instead of spinning for ever.
    #[test]
    fn a_flag_that_never_arrives_is_reported() {
        const TEST: &str = "handoff::fence::tests::a_flag_that_never_arrives_is_reported";
        let Some(cuda) = crate::testing::cuda_device_or_skip(TEST) else { return };
        let stream = Arc::new(Stream::new(&cuda).unwrap());
        let page = Arc::new(FlagPage::new(&cuda, Arc::clone(&stream)).unwrap());
        let fence = Fence { inner: Arc::new(FenceInner::Flag { page, target: 1, stream }) };
        match fence.wait() {
            Err(Error::FlagNeverArrived { target: 1 }) => {}
            other => panic!("expected Error::FlagNeverArrived, got {other:?}"),
        }
    }
}
