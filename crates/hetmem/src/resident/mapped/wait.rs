//! Waiting on a mapped word: spin (the other side answers within microseconds), then yield
//! the core, until a deadline.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Polls before a waiter starts yielding its core: about as long as a round trip over PCIe
/// takes many times over.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// Calls `poll` until it returns `Some`, spinning then yielding, for at most `timeout`.
///
/// # Errors
/// [`Error::MappedWaitTimeout`] naming `what` when `timeout` passes first.
pub(super) fn until<R>(
    what: &'static str,
    timeout: Duration,
    mut poll: impl FnMut() -> Option<R>,
) -> Result<R> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(ready) = poll() {
            return Ok(ready);
        }
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        if start.elapsed() > timeout {
            return Err(Error::MappedWaitTimeout { what, timeout });
        }
        std::thread::yield_now();
    }
}
