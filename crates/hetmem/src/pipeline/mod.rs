//! How frames reach a stage: the strategies of DESIGN.md, each moving the same frames through
//! the same stage by a different path, so they can be compared side by side.
//!
//! The strategies are implemented once, in `slot.rs` (see its table): a [`FrameFilter`] runs
//! one slot a frame at a time, a [`FrameRing`] several with their frames overlapping, and a
//! [`FanOutRing`] one ring per GPU. [`shared_ring`] moves frames between two processes through
//! shared memory.

mod fan_out;
mod frame_filter;
mod gaussian;
mod hybrid;
mod ring;
mod setup_time;
pub mod shared_ring;
mod slot;

pub use crate::stage::Strategy;
pub use fan_out::{FanInput, FanOutRing, FanOutput};
pub use frame_filter::FrameFilter;
pub use ring::{DEFAULT_SLOTS, FrameRing, InputSlot, NextOutput, OutputFrame, RingOptions};
pub use setup_time::SetupTime;

use crate::error::{Error, Result};

/// An error unless `index` names one of `count` buffers.
fn check_index(what: &str, index: usize, count: usize) -> Result<()> {
    if index < count {
        Ok(())
    } else {
        Err(Error::invalid("frame buffer", format!("{what} {index}: the stage has {count}")))
    }
}
