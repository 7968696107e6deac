//! [`SetupTime`]: what building a [`FrameRing`](super::FrameRing) or a
//! [`FrameFilter`](super::FrameFilter) spent, by part, so that a program reporting frames per
//! second can name its setup instead of hiding it in (or leaving it out of) the rate.

use std::ops::AddAssign;
use std::time::{Duration, Instant};

/// Wall-clock time spent building a ring or a filter, by part; the parts add up to (nearly)
/// the time around the constructor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetupTime {
    /// Choosing where each buffer goes (the hybrid strategy's placement, from the link
    /// profile); zero by the other strategies.
    pub placement: Duration,
    /// Creating each slot's queue (a stream and its events).
    pub queues: Duration,
    /// Preparing the stage for each slot: the kernel's first load (compiled by NVRTC, or read
    /// from the kernel cache) and its constant data copied to where the placement put it.
    pub kernel: Duration,
    /// Allocating each slot's frame memory: pinning, mapping or device allocation.
    pub frame_memory: Duration,
}

impl SetupTime {
    /// Every part together.
    pub fn total(&self) -> Duration {
        self.placement + self.queues + self.kernel + self.frame_memory
    }
}

impl AddAssign for SetupTime {
    fn add_assign(&mut self, other: SetupTime) {
        self.placement += other.placement;
        self.queues += other.queues;
        self.kernel += other.kernel;
        self.frame_memory += other.frame_memory;
    }
}

/// Runs `work`, adding the time it took to `into`.
pub(crate) fn timed<T>(into: &mut Duration, work: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = work();
    *into += start.elapsed();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_and_sum_across_slots() {
        let one = SetupTime {
            placement: Duration::from_millis(3),
            queues: Duration::from_millis(5),
            kernel: Duration::from_millis(7),
            frame_memory: Duration::from_millis(11),
        };
        let mut two = one;
        two += one;
        assert_eq!(one.total(), Duration::from_millis(26));
        assert_eq!(two.total(), Duration::from_millis(52));
        assert_eq!(two.kernel, Duration::from_millis(14));
    }

    #[test]
    fn timed_adds_the_time_the_work_took() {
        let mut spent = Duration::from_millis(1);
        let value = timed(&mut spent, || {
            std::thread::sleep(Duration::from_millis(20));
            42
        });
        assert_eq!(value, 42);
        assert!(spent >= Duration::from_millis(21), "{spent:?}");
    }
}
