//! Awaiting fences on tokio's own reactor (the `tokio` feature): a host-callback fence's
//! eventfd is registered with the runtime through `tokio::io::unix::AsyncFd`, so the task
//! wakes when the driver's callback writes it, with no poller thread in between.

use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::Fence;
use crate::error::{Error, Result};

/// How long an await waits on the eventfd before asking whether the stream failed (the
/// driver never runs the callback of a failed stream).
const ERROR_CHECK: Duration = Duration::from_millis(5);

impl Fence {
    /// Waits for the fence on a tokio runtime. A host-callback fence
    /// ([`FenceKind::HostCallback`](super::FenceKind::HostCallback)) is awaited through its
    /// eventfd on the runtime's reactor (`AsyncFd`); other kinds, which have no descriptor,
    /// through [`Fence::wait_async`].
    ///
    /// Needs a tokio runtime with I/O and time enabled (`enable_all`, as `#[tokio::main]`
    /// does); as with tokio's own sockets, calling it without one panics.
    ///
    /// ```no_run
    /// # async fn demo() -> hetmem::Result<()> {
    /// use hetmem::{Device, FenceKind, Queue};
    /// let device = Device::open_best()?;
    /// let queue = Queue::with_fence_kind(&device, FenceKind::HostCallback)?;
    /// // ... queue work ...
    /// queue.signal()?.wait_tokio().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// The error of any failed work before the fence, or the reactor refusing the eventfd.
    pub async fn wait_tokio(&self) -> Result<()> {
        let Some(fd) = self.eventfd() else {
            return self.wait_async().await;
        };
        if self.poll(false)? {
            return Ok(());
        }
        // SAFETY: the `FenceFd` owns a share of the fence's callback state, which owns the
        // eventfd: the descriptor stays open, and `as_raw_fd` returns it, for as long as the
        // `AsyncFd` holds the `FenceFd`.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|error| {
            Error::Io {
                context: "registering a fence's eventfd with the tokio reactor".into(),
                source: error.into(),
            }
        })?;
        loop {
            match tokio::time::timeout(ERROR_CHECK, fd.readable()).await {
                Ok(ready) => {
                    let mut ready = ready.map_err(|source| Error::Io {
                        context: "awaiting a fence's eventfd".into(),
                        source,
                    })?;
                    if self.poll(true)? {
                        return Ok(());
                    }
                    // Readable but not complete cannot happen (the callback marks the fence
                    // complete before it writes); forget the readiness rather than spin.
                    ready.clear_ready();
                }
                // A failed stream never calls back: its error ends the wait.
                Err(_elapsed) => {
                    if self.poll(true)? {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_host_callback_fence_is_awaited_on_the_reactor() {
        let (fence, signal) = Fence::signalled_by_hand();
        let start = Instant::now();
        runtime().block_on(async {
            // The signal comes from a task of this same single-threaded runtime: an await that
            // blocked the thread would never let it run (the test would hang, then time out
            // below).
            let signaller = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                signal();
            });
            tokio::time::timeout(Duration::from_secs(20), fence.wait_tokio())
                .await
                .expect("the await never completed")
                .unwrap();
            signaller.await.unwrap();
        });
        assert!(start.elapsed() >= Duration::from_millis(25), "completed before the callback");
    }

    #[test]
    fn an_unsignalled_fence_stays_pending_and_other_kinds_complete() {
        let (fence, _signal) = Fence::signalled_by_hand();
        runtime().block_on(async {
            let pending = tokio::time::timeout(Duration::from_millis(50), fence.wait_tokio()).await;
            assert!(pending.is_err(), "completed without its callback: {pending:?}");
            // A fence without a descriptor (here a completed one) goes through wait_async.
            Fence::done().wait_tokio().await.unwrap();
        });
    }
}
