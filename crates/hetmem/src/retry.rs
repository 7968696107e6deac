//! Bounded retries of transient failures, with back-off.
//!
//! A failed allocation or registration (pinned or device memory short, `ulimit -l`), a busy
//! device or an exhausted pool may succeed a moment later ([`Error::is_transient`]). Such a
//! failure is retried a bounded number of times, waiting twice as long each time; anything else,
//! and a transient failure that outlasts the retries, is returned as it is. Retrying changes
//! nothing but timing: the operation either does what it would have done, or fails.

use std::time::Duration;

use crate::error::{Error, Result};

/// How often and how patiently a transient failure is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries after the first (0: no retries).
    pub retries: u32,
    /// The wait before the first retry; each later wait doubles, up to `max_delay`.
    pub first_delay: Duration,
    /// The longest wait between two tries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Three retries after 10, 20 and 40 ms.
    fn default() -> RetryPolicy {
        RetryPolicy {
            retries: 3,
            first_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(200),
        }
    }
}

impl RetryPolicy {
    /// No retries: the first failure is returned.
    pub const NONE: RetryPolicy =
        RetryPolicy { retries: 0, first_delay: Duration::ZERO, max_delay: Duration::ZERO };

    /// Runs `op` until it succeeds, fails with an error that is not transient, or has been
    /// retried `retries` times; `what` names it in the warnings logged before each retry.
    ///
    /// # Errors
    /// The last error of `op`.
    pub fn run<T>(&self, what: &str, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let mut delay = self.first_delay;
        let mut attempt = 0;
        loop {
            match op() {
                Ok(value) => return Ok(value),
                Err(error) if error.is_transient() && attempt < self.retries => {
                    attempt += 1;
                    tracing::warn!(
                        "{what} failed ({error}); retry {attempt} of {} in {delay:?}",
                        self.retries
                    );
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(self.max_delay);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Whether `error` is one [`RetryPolicy::run`] retries.
pub fn is_retried(error: &Error) -> bool {
    error.is_transient()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> RetryPolicy {
        RetryPolicy { retries: 3, first_delay: Duration::from_millis(1), max_delay: Duration::from_millis(2) }
    }

    fn shortage() -> Error {
        Error::PoolExhausted { requested: 1, in_use: 1, budget: 1 }
    }

    #[test]
    fn a_shortage_that_passes_is_retried_until_it_succeeds() {
        let mut calls = 0;
        let value = short()
            .run("allocation", || {
                calls += 1;
                if calls < 3 { Err(shortage()) } else { Ok(calls) }
            })
            .unwrap();
        assert_eq!((value, calls), (3, 3));
    }

    #[test]
    fn retries_are_bounded_and_the_last_error_comes_back() {
        let mut calls = 0;
        let error = short()
            .run("allocation", || -> Result<()> {
                calls += 1;
                Err(shortage())
            })
            .unwrap_err();
        assert_eq!(calls, 4, "the first try and three retries");
        assert!(matches!(error, Error::PoolExhausted { .. }), "{error}");
    }

    #[test]
    fn errors_that_will_not_pass_are_not_retried() {
        let mut calls = 0;
        let error = short()
            .run("launch", || -> Result<()> {
                calls += 1;
                Err(Error::invalid("radius", "too large"))
            })
            .unwrap_err();
        assert_eq!(calls, 1);
        assert!(!is_retried(&error));
        assert_eq!(RetryPolicy::NONE.run("x", || -> Result<()> { Err(shortage()) }).map_err(|_| ()), Err(()));
    }
}
