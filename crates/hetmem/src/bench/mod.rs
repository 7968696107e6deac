//! Measurements behind `hetmem bench`: what each way of sharing memory costs on this machine.
//!
//! Every figure is measured in the same run as the ceiling or peer it is compared with; GPU
//! timings use device events or CPU clocks around synchronised work; data is random, never
//! zeros.

pub mod compare;
pub mod completion;
pub mod link;
pub mod pinning;
pub mod sizes;
mod stats;
pub mod streaming;
pub mod user_stage;

pub use stats::Summary;
