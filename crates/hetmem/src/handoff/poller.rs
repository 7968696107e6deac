//! Awaiting fences without blocking a thread: one poller thread per process watches the fences
//! that futures wait on and wakes their tasks. It needs no particular async runtime.
//!
//! How the poller waits, so that it costs a core only while a completion is imminent:
//! - With nothing watched (for [`HOT_SPIN`] after the last completion) it blocks in `poll(2)`
//!   on its own eventfd, which a new registration writes: an idle process has no spinning
//!   thread, and a registration is seen at once.
//! - For [`HOT_SPIN`] after each registration or completion it sweeps the watched fences
//!   continuously, yielding between sweeps: a short kernel's fence is noticed within a
//!   microsecond or two of its end.
//! - After that it backs off: it sleeps in `poll(2)` between sweeps, on its eventfd and on the
//!   eventfds of host-callback fences, for an eighth of the time since the last progress
//!   (from [`MIN_SLEEP`] to [`MAX_SLEEP`]). A host-callback fence wakes it at once; an event
//!   or flag fence that completes after a long wait is noticed at most an eighth of that wait
//!   (and at most [`MAX_SLEEP`]) late; a long wait costs at most a thousand sweeps a second
//!   (host-callback fences alone: [`FD_SLEEP`] between sweeps, which only look for failed
//!   streams).

use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fd::OwnedFd;

use super::Fence;
use crate::error::{Error, Result};

/// How long the poller sweeps without sleeping after a registration or a completion: long
/// enough that a steady stream of waits (a frame's, a request's) registers its next fence
/// while the poller is still sweeping, so neither it nor the wait pays for waking a sleeping
/// thread. At 50 us the completion benchmark's next registration (after a synchronise and a
/// launch) found it asleep: an awaited flag fence was seen 17 us after the kernel ended on the
/// H200, against 12 us with a poller that always swept.
const HOT_SPIN: Duration = Duration::from_micros(250);
/// The shortest sleep once the poller backs off.
const MIN_SLEEP: Duration = Duration::from_micros(20);
/// The longest sleep: the most an event or flag fence's completion can go unnoticed.
const MAX_SLEEP: Duration = Duration::from_millis(1);
/// The sleep when every watched fence has an eventfd (host callbacks), which wakes the poller
/// itself: only a failed stream, whose callback never runs, needs a sweep to be noticed.
const FD_SLEEP: Duration = Duration::from_millis(5);
/// Sweeps between checks for failed streams (each check is a driver call per fence) while the
/// poller spins; once it backs off, every sweep checks.
const SWEEPS_PER_ERROR_CHECK: u64 = 256;

/// Where the poller finds the task to wake: the latest waker of a pending future, or none once
/// the future is gone.
type WakerSlot = Arc<Mutex<Option<Waker>>>;

/// What the poller watches: a fence, or in tests a stand-in.
pub(crate) trait Watched: Send {
    /// Whether it has completed (or failed: either way its task is woken, polls again and
    /// sees which).
    fn is_done(&self, check_errors: bool) -> Result<bool>;
    /// A descriptor that becomes readable when it completes, if it has one.
    fn ready_fd(&self) -> Option<BorrowedFd<'_>>;
}

impl Watched for Fence {
    fn is_done(&self, check_errors: bool) -> Result<bool> {
        self.poll(check_errors)
    }

    fn ready_fd(&self) -> Option<BorrowedFd<'_>> {
        Fence::ready_fd(self)
    }
}

/// A future that resolves when its fence completes. Made by [`Fence::wait_async`].
///
/// Dropping it before it completes is cheap: the poller forgets the fence at its next sweep.
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct FenceFuture {
    fence: Fence,
    slot: Option<WakerSlot>,
}

impl FenceFuture {
    pub(crate) fn new(fence: Fence) -> FenceFuture {
        FenceFuture { fence, slot: None }
    }
}

impl Future for FenceFuture {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.fence.poll(true) {
            Ok(true) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(error)),
            Ok(false) => {
                match &self.slot {
                    Some(slot) => *lock(slot) = Some(cx.waker().clone()),
                    None => {
                        let poller = match Poller::global() {
                            Ok(poller) => poller,
                            Err(error) => return Poll::Ready(Err(error)),
                        };
                        let slot = Arc::new(Mutex::new(Some(cx.waker().clone())));
                        poller.watch(Box::new(self.fence.clone()), Arc::clone(&slot));
                        self.slot = Some(slot);
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for FenceFuture {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            *lock(slot) = None;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// One watched item and the task it wakes.
struct Entry {
    watched: Box<dyn Watched>,
    slot: WakerSlot,
}

/// A poller thread's shared state.
pub(crate) struct Poller {
    incoming: Mutex<Vec<Entry>>,
    /// Written by a registration while the thread sleeps, to wake it.
    doorbell: OwnedFd,
    /// Set while the thread sleeps (or is about to).
    sleeping: AtomicBool,
    /// Iterations of the thread's loop so far: what the tests of its idle behaviour count.
    loops: AtomicU64,
}

impl Poller {
    /// The process's poller, started on first use.
    ///
    /// # Errors
    /// No eventfd or no thread could be made (the next call tries again).
    fn global() -> Result<Arc<Poller>> {
        static GLOBAL: Mutex<Option<Arc<Poller>>> = Mutex::new(None);
        let mut global = lock(&GLOBAL);
        if let Some(poller) = &*global {
            return Ok(Arc::clone(poller));
        }
        let poller = Poller::start()?;
        *global = Some(Arc::clone(&poller));
        Ok(poller)
    }

    /// A poller and its thread, which runs as long as the process.
    fn start() -> Result<Arc<Poller>> {
        let doorbell =
            rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|errno| {
                Error::Io { context: "creating the fence poller's eventfd".into(), source: errno.into() }
            })?;
        let poller = Arc::new(Poller {
            incoming: Mutex::new(Vec::new()),
            doorbell,
            sleeping: AtomicBool::new(false),
            loops: AtomicU64::new(0),
        });
        let thread = Arc::clone(&poller);
        std::thread::Builder::new()
            .name("hetmem-fence-poller".into())
            .spawn(move || thread.run())
            .map_err(|source| Error::Io { context: "starting the fence poller thread".into(), source })?;
        Ok(poller)
    }

    /// Watches `watched` until it completes or `slot`'s future is dropped, then wakes the
    /// slot's task.
    fn watch(&self, watched: Box<dyn Watched>, slot: WakerSlot) {
        lock(&self.incoming).push(Entry { watched, slot });
        // Pairs with `sleep`: either the thread sees the new entry before it sleeps, or this
        // sees it sleeping and wakes it.
        if self.sleeping.load(Ordering::SeqCst) {
            // The count cannot overflow (each wake-up reads it back to zero); a failed write
            // leaves the entry to the thread's next sweep.
            let _ = rustix::io::write(&self.doorbell, &1u64.to_ne_bytes());
        }
    }

    /// Moves new entries into `into`; whether there were any.
    fn take_incoming(&self, into: &mut Vec<Entry>) -> bool {
        let mut incoming = lock(&self.incoming);
        let any = !incoming.is_empty();
        into.append(&mut incoming);
        any
    }

    /// The thread's loop.
    fn run(&self) {
        let mut watched: Vec<Entry> = Vec::new();
        let mut last_progress = Instant::now();
        let mut sweeps: u64 = 0;
        loop {
            self.loops.fetch_add(1, Ordering::Relaxed);
            if self.take_incoming(&mut watched) {
                last_progress = Instant::now();
            }
            let quiet = last_progress.elapsed();
            let backing_off = quiet >= HOT_SPIN;
            if watched.is_empty() {
                // Lingering a moment after the last completion catches the next registration
                // of a steady stream of waits without a wake-up.
                if backing_off {
                    self.sleep(&watched, None);
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            sweeps += 1;
            let check_errors = backing_off || sweeps.is_multiple_of(SWEEPS_PER_ERROR_CHECK);
            let before = watched.len();
            watched.retain(|entry| {
                // The future was dropped: nobody is waiting any more.
                if Arc::strong_count(&entry.slot) == 1 {
                    return false;
                }
                match entry.watched.is_done(check_errors) {
                    Ok(false) => true,
                    // A finished or failed fence wakes its task, which polls again and sees which.
                    Ok(true) | Err(_) => {
                        if let Some(waker) = lock(&entry.slot).take() {
                            waker.wake();
                        }
                        false
                    }
                }
            });
            if watched.len() < before {
                last_progress = Instant::now();
            } else if backing_off {
                let all_wake_us = watched.iter().all(|entry| entry.watched.ready_fd().is_some());
                let timeout = if all_wake_us { FD_SLEEP } else { (quiet / 8).clamp(MIN_SLEEP, MAX_SLEEP) };
                self.sleep(&watched, Some(timeout));
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Sleeps until a registration, a watched eventfd becoming readable, or `timeout`.
    fn sleep(&self, watched: &[Entry], timeout: Option<Duration>) {
        self.sleeping.store(true, Ordering::SeqCst);
        if !lock(&self.incoming).is_empty() {
            self.sleeping.store(false, Ordering::SeqCst);
            return;
        }
        let mut fds: Vec<PollFd<'_>> = std::iter::once(self.doorbell.as_fd())
            .chain(watched.iter().filter_map(|entry| entry.watched.ready_fd()))
            .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
            .collect();
        let timeout = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        if let Err(errno) = rustix::event::poll(&mut fds, timeout.as_ref())
            && errno != rustix::io::Errno::INTR
        {
            // Not expected with valid descriptors; sleep anyway rather than spin.
            tracing::error!("the fence poller's poll(2) failed: {errno}");
            std::thread::sleep(MAX_SLEEP);
        }
        self.sleeping.store(false, Ordering::SeqCst);
        // Empty the doorbell (non-blocking: it may not have been rung).
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.doorbell, &mut count);
    }
}

#[cfg(test)]
mod tests {
    use std::task::Wake;

    use super::*;

    /// A stand-in for an event or flag fence: polled, no descriptor.
    struct Polled(Arc<AtomicBool>);

    impl Watched for Polled {
        fn is_done(&self, _check_errors: bool) -> Result<bool> {
            Ok(self.0.load(Ordering::Acquire))
        }
        fn ready_fd(&self) -> Option<BorrowedFd<'_>> {
            None
        }
    }

    /// A waker that records when it was woken.
    struct Recorder(Mutex<Option<Instant>>);

    impl Wake for Recorder {
        fn wake(self: Arc<Self>) {
            lock(&self.0).get_or_insert_with(Instant::now);
        }
    }

    /// Watches `watched` on `poller` with a recording waker; returns the recorder and the slot
    /// (the future's side, which must stay alive for the poller to keep watching).
    fn watch(poller: &Poller, watched: Box<dyn Watched>) -> (Arc<Recorder>, WakerSlot) {
        let recorder = Arc::new(Recorder(Mutex::new(None)));
        let slot = Arc::new(Mutex::new(Some(Waker::from(Arc::clone(&recorder)))));
        poller.watch(watched, Arc::clone(&slot));
        (recorder, slot)
    }

    /// Seconds from `since` until `recorder` was woken, waiting up to 10 s for it.
    fn woken_after(recorder: &Recorder, since: Instant) -> Option<f64> {
        while since.elapsed() < Duration::from_secs(10) {
            if let Some(at) = *lock(&recorder.0) {
                return Some(at.duration_since(since).as_secs_f64());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        None
    }

    /// The poller's loop iterations during `window`.
    fn loops_during(poller: &Poller, window: Duration) -> u64 {
        let before = poller.loops.load(Ordering::Relaxed);
        std::thread::sleep(window);
        poller.loops.load(Ordering::Relaxed) - before
    }

    #[test]
    fn an_idle_poller_sleeps_and_a_registration_wakes_it() {
        let poller = Poller::start().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let idle = loops_during(&poller, Duration::from_millis(300));
        assert_eq!(idle, 0, "the idle poller looped {idle} times in 300 ms");
        // A registration after the idle time is swept at once (nothing else wakes it now).
        let done = Arc::new(AtomicBool::new(true));
        let start = Instant::now();
        let (recorder, _slot) = watch(&poller, Box::new(Polled(done)));
        let seconds = woken_after(&recorder, start).expect("the registration was never swept");
        eprintln!("woken {:.1} us after registering with an idle poller", seconds * 1e6);
        // Generous for a loaded machine; a lost registration would not wake at all.
        assert!(seconds < 1.0, "woken only after {seconds} s");
        std::thread::sleep(Duration::from_millis(20));
        let idle = loops_during(&poller, Duration::from_millis(100));
        assert_eq!(idle, 0, "idle again, the poller looped {idle} times in 100 ms");
    }

    #[test]
    fn a_long_wait_backs_off_and_the_completion_is_still_noticed() {
        let poller = Poller::start().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (recorder, _slot) = watch(&poller, Box::new(Polled(Arc::clone(&done))));
        // Past the sweeping that follows a registration.
        std::thread::sleep(HOT_SPIN * 4);
        let waiting = loops_during(&poller, Duration::from_millis(300));
        // Spinning would sweep hundreds of thousands of times; backing off, about one sweep
        // per millisecond after the first few.
        assert!(waiting < 1500, "the poller looped {waiting} times in 300 ms of waiting");
        assert!(lock(&recorder.0).is_none(), "woken before the completion");
        let start = Instant::now();
        done.store(true, Ordering::Release);
        let seconds = woken_after(&recorder, start).expect("the completion was never noticed");
        eprintln!("{waiting} loops in 300 ms; completion noticed after {:.1} us", seconds * 1e6);
        assert!(seconds < 1.0, "noticed only after {seconds} s");
    }

    #[test]
    fn a_host_callback_fence_wakes_a_backed_off_poller_by_its_eventfd() {
        let poller = Poller::start().unwrap();
        let (fence, signal) = Fence::signalled_by_hand();
        let (recorder, _slot) = watch(&poller, Box::new(fence.clone()));
        std::thread::sleep(HOT_SPIN * 4);
        let waiting = loops_during(&poller, Duration::from_millis(300));
        // One sweep per FD_SLEEP (5 ms) once backed off: 60 in 300 ms; spinning would be
        // hundreds of thousands. On a machine loaded with five parallel builds this counted
        // 833 twice in one session (cause not found: poll(2) returned early), so the bound
        // separates sleeping from spinning, not one sleep length from another.
        assert!(waiting < 3000, "the poller looped {waiting} times in 300 ms of waiting");
        let start = Instant::now();
        signal();
        let seconds = woken_after(&recorder, start).expect("the callback was never noticed");
        eprintln!("{waiting} loops in 300 ms; callback noticed after {:.1} us", seconds * 1e6);
        assert!(seconds < 1.0, "noticed only after {seconds} s");
        assert!(fence.is_complete().unwrap());
    }

    #[test]
    fn a_dropped_future_is_forgotten() {
        let poller = Poller::start().unwrap();
        let (recorder, slot) = watch(&poller, Box::new(Polled(Arc::new(AtomicBool::new(false)))));
        drop(slot);
        // Forgotten at the next sweep: the poller then idles with nothing watched.
        std::thread::sleep(Duration::from_millis(50));
        let idle = loops_during(&poller, Duration::from_millis(300));
        assert!(idle == 0 && lock(&recorder.0).is_none(), "{idle} loops after the drop");
    }

    #[test]
    fn a_fence_future_completes_when_its_callback_runs() {
        let (fence, signal) = Fence::signalled_by_hand();
        let signaller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            signal();
        });
        let start = Instant::now();
        block_on(fence.wait_async()).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(25), "completed before the callback");
        signaller.join().unwrap();
    }

    /// The smallest executor: polls, parking between polls.
    fn block_on<F: Future>(future: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut context = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
                return output;
            }
            std::thread::park();
        }
    }
}
