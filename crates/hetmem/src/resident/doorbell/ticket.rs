//! [`Ticket`]: a submitted request, and the waits for its reply (blocking, or a future), each
//! bounded by the doorbell's watchdog.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use super::protocol;
use super::server::{Doorbell, SPINS_BEFORE_YIELD};
use crate::error::{Error, Result};

/// A submitted request; [`Ticket::wait`] gets its reply. Dropping it without waiting is
/// allowed: its slot is reused once the server has replied.
#[derive(Debug)]
#[must_use = "a ticket's reply is read with wait() or wait_async()"]
pub struct Ticket<'bell> {
    bell: &'bell Doorbell,
    seq: u64,
    len: usize,
    /// When an async wait first found no reply, for its watchdog.
    started: Option<Instant>,
}

impl<'bell> Ticket<'bell> {
    /// The ticket of request `seq` of `len` samples, just written into its slot.
    pub(super) fn new(bell: &'bell Doorbell, seq: u64, len: usize) -> Ticket<'bell> {
        Ticket { bell, seq, len, started: None }
    }

    /// The request's sequence number (from 1).
    pub fn sequence(&self) -> u64 {
        self.seq
    }

    /// The reply, if it has arrived.
    fn reply(&self) -> Option<Result<Vec<f32>>> {
        protocol::read_reply(self.bell.words(), self.bell.slot_base(self.seq), self.seq, self.len)
    }

    /// Waits for the reply: spins first (the reply takes microseconds), then yields. A server
    /// found stopped is asked once more for the reply: it may have replied and exited between
    /// the look at the reply and the look at the server (it writes the reply before EXITED,
    /// and EXITED is read with Acquire, so a reply written before it is seen after it).
    ///
    /// # Errors
    /// [`Error::DoorbellTimeout`] when no reply comes within the doorbell's timeout;
    /// [`Error::DoorbellStopped`] when the server no longer serves (the request may not have
    /// run); [`Error::DoorbellBadReply`] when the server's reply breaks the protocol; the
    /// kernel's failure.
    pub fn wait(self) -> Result<Vec<f32>> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(reply) = self.reply() {
                return reply;
            }
            if spins >= SPINS_BEFORE_YIELD && start.elapsed() > self.bell.timeout {
                return Err(Error::DoorbellTimeout { sequence: self.seq, timeout: self.bell.timeout });
            }
            spins = match self.bell.pause(spins) {
                Ok(spins) => spins,
                Err(error) => return self.reply().unwrap_or(Err(error)),
            };
        }
    }

    /// The reply as a future, for async code. It polls the reply word each time the executor
    /// polls it and asks to be polled again at once while there is none, so it keeps a worker
    /// busy for the few microseconds a reply takes; the watchdog applies as for
    /// [`Ticket::wait`].
    pub fn wait_async(self) -> TicketFuture<'bell> {
        TicketFuture { ticket: Some(self) }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let slot = protocol::slot_index(self.bell.depth, self.seq);
        self.bell.outstanding[slot].store(false, Ordering::Release);
    }
}

/// The future of [`Ticket::wait_async`].
#[derive(Debug)]
#[must_use = "a future does nothing unless awaited"]
pub struct TicketFuture<'bell> {
    ticket: Option<Ticket<'bell>>,
}

impl Future for TicketFuture<'_> {
    type Output = Result<Vec<f32>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(ticket) = self.ticket.as_mut() else {
            return Poll::Ready(Err(Error::invalid("doorbell future", "polled after it completed")));
        };
        if let Some(reply) = ticket.reply() {
            self.ticket = None;
            return Poll::Ready(reply);
        }
        let started = *ticket.started.get_or_insert_with(Instant::now);
        if started.elapsed() > ticket.bell.timeout {
            let error = Error::DoorbellTimeout { sequence: ticket.seq, timeout: ticket.bell.timeout };
            self.ticket = None;
            return Poll::Ready(Err(error));
        }
        if let Err(error) = ticket.bell.check_server() {
            let reply = ticket.reply().unwrap_or(Err(error));
            self.ticket = None;
            return Poll::Ready(reply);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
