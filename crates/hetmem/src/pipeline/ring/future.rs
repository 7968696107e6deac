//! [`NextOutput`]: the oldest frame as a future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{FrameRing, OutputFrame, lock};
use crate::error::{Error, Result};
use crate::handoff::FenceFuture;
use crate::stage::Stage;

/// The future of [`FrameRing::next_output_async`].
#[must_use = "a future does nothing unless awaited"]
pub struct NextOutput<'ring, S: Stage> {
    ring: &'ring FrameRing<S>,
    fence: Option<FenceFuture>,
}

impl<'ring, S: Stage> NextOutput<'ring, S> {
    pub(super) fn new(ring: &'ring FrameRing<S>) -> Self {
        NextOutput { ring, fence: None }
    }
}

impl<S: Stage> std::fmt::Debug for NextOutput<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextOutput").field("awaiting_gpu", &self.fence.is_some()).finish()
    }
}

impl<'ring, S: Stage> Future for NextOutput<'ring, S> {
    type Output = Result<OutputFrame<'ring, S>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ring = self.ring;
        loop {
            if let Some(fence) = self.fence.as_mut() {
                match Pin::new(fence).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // A failed fence: the frame's own reclaim below reports the failure.
                    Poll::Ready(_) => self.fence = None,
                }
            }
            match ring.try_next_output() {
                Err(Error::WouldBlock(_)) => {}
                done => return Poll::Ready(done),
            }
            match ring.oldest_fence() {
                Ok(Some(fence)) => self.fence = Some(fence.wait_async()),
                Ok(None) => {
                    // Nothing submitted yet: wait for the producer. Registered before looking
                    // again, so a submission in between is not missed.
                    let mut wakers = lock(&ring.wakers);
                    if !wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
                        wakers.push(cx.waker().clone());
                    }
                    drop(wakers);
                    return match ring.try_next_output() {
                        Err(Error::WouldBlock(_)) => Poll::Pending,
                        done => Poll::Ready(done),
                    };
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}
