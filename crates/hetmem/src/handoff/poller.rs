//! Awaiting fences without blocking a thread: one poller thread per process watches the fences
//! that futures wait on and wakes their tasks.
//!
//! While any future is pending the poller spins (yielding between sweeps), so a flag fence is
//! noticed within a microsecond or two; with none pending it parks and costs nothing. This
//! needs no particular async runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use super::Fence;
use crate::error::Result;

/// Sweeps between checks for failed streams (each check is a driver call per fence).
const SWEEPS_PER_ERROR_CHECK: u64 = 256;

/// A future that resolves when its fence completes. Made by [`Fence::wait_async`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct FenceFuture {
    fence: Fence,
}

impl FenceFuture {
    pub(crate) fn new(fence: Fence) -> FenceFuture {
        FenceFuture { fence }
    }
}

impl Future for FenceFuture {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.fence.poll(true) {
            Ok(true) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(error)),
            Ok(false) => {
                poller().watch(self.fence.clone(), cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

struct Poller {
    incoming: Mutex<Vec<(Fence, Waker)>>,
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
    fn watch(&self, fence: Fence, waker: Waker) {
        self.incoming.lock().unwrap_or_else(|poison| poison.into_inner()).push((fence, waker));
        self.thread.unpark();
    }

    fn take_incoming(&self, into: &mut Vec<(Fence, Waker)>) {
        into.append(&mut self.incoming.lock().unwrap_or_else(|poison| poison.into_inner()));
    }
}

fn run() {
    let poller = poller();
    let mut watched: Vec<(Fence, Waker)> = Vec::new();
    let mut sweep: u64 = 0;
    loop {
        poller.take_incoming(&mut watched);
        if watched.is_empty() {
            std::thread::park();
            continue;
        }
        sweep += 1;
        let check_errors = sweep.is_multiple_of(SWEEPS_PER_ERROR_CHECK);
        // A finished or failed fence wakes its task, which polls again and sees which.
        watched.retain(|(fence, waker)| match fence.poll(check_errors) {
            Ok(false) => true,
            Ok(true) | Err(_) => {
                waker.wake_by_ref();
                false
            }
        });
        std::thread::yield_now();
    }
}
