//! How frames reach a kernel: the strategies of DESIGN.md, each moving the same frames
//! through the same kernel by a different path, so they can be compared side by side.

mod fan_out;
mod frame_filter;
mod ring;
mod strategy;

pub use fan_out::{FanInput, FanOutRing, FanOutput};
pub use frame_filter::FrameFilter;
pub use ring::{CpuStage, DEFAULT_SLOTS, FrameRing, InputSlot, NextOutput, OutputFrame, RingOptions};
pub use strategy::Strategy;
