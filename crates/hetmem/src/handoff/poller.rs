//! Awaiting fences without blocking a thread: one poller thread per process watches the fences
//! that futures wait on and wakes their tasks.
//!
//! While any future is pending the poller spins (yielding between sweeps), so a flag fence is
//! noticed within a microsecond or two; with none pending it parks and costs nothing. This
//! needs no particular async runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use super::Fence;
use crate::error::Result;

/// Sweeps between checks for failed streams (each check is a driver call per fence).
const SWEEPS_PER_ERROR_CHECK: u64 = 256;

/// Where the poller finds the task to wake: the latest waker of a pending future, or none once
/// the future is gone.
type WakerSlot = Arc<Mutex<Option<Waker>>>;

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
                        let slot = Arc::new(Mutex::new(Some(cx.waker().clone())));
                        poller().watch(self.fence.clone(), Arc::clone(&slot));
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

struct Poller {
    incoming: Mutex<Vec<(Fence, WakerSlot)>>,
    thread: Thread,
}

fn poller() -> &'static Poller {
    static POLLER: OnceLock<Poller> = OnceLock::new();
    POLLER.get_or_init(|| {
        let thread = std::thread::Builder::new()
            .name("hetmem-fence-poller".into())
            .spawn(run)
            .expect("spawning the fence poller thread");
        Poller { incoming: Mutex::new(Vec::new()), thread: thread.thread().clone() }
    })
}

impl Poller {
    fn watch(&self, fence: Fence, slot: WakerSlot) {
        lock(&self.incoming).push((fence, slot));
        self.thread.unpark();
    }

    fn take_incoming(&self, into: &mut Vec<(Fence, WakerSlot)>) {
        into.append(&mut lock(&self.incoming));
    }
}

fn run() {
    let poller = poller();
    let mut watched: Vec<(Fence, WakerSlot)> = Vec::new();
    let mut sweep: u64 = 0;
    loop {
        poller.take_incoming(&mut watched);
        if watched.is_empty() {
            std::thread::park();
            continue;
        }
        sweep += 1;
        let check_errors = sweep.is_multiple_of(SWEEPS_PER_ERROR_CHECK);
        watched.retain(|(fence, slot)| {
            // The future was dropped: nobody is waiting any more.
            if Arc::strong_count(slot) == 1 {
                return false;
            }
            match fence.poll(check_errors) {
                Ok(false) => true,
                // A finished or failed fence wakes its task, which polls again and sees which.
                Ok(true) | Err(_) => {
                    if let Some(waker) = lock(slot).take() {
                        waker.wake();
                    }
                    false
                }
            }
        });
        std::thread::yield_now();
    }
}
