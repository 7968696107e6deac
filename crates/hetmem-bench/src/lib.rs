//! hetmem-bench: the measurements and diagnostics behind `hetmem bench` and `hetmem doctor`.
//!
//! [hetmem](https://docs.rs/hetmem) is the library for sharing memory between the CPU and NVIDIA
//! GPUs; this crate answers "on this machine, should I copy, map, or use managed memory?" with
//! measurements instead of folklore. It returns reports as data (`serde::Serialize`, stable
//! field names); turning them into text tables, CSV or plots is the `hetmem` command's job.
//!
//! Every figure is measured in the same run as the ceiling or peer it is compared with; GPU
//! timings use device events or CPU clocks around synchronised work; data is random, never
//! zeros, and every cell checks its own result against the CPU.
//!
//! - [`doctor`]: what this machine can do, checked and explained (never fails).
//! - [`link`]: bandwidth and latency of every way bytes cross the CPU<->GPU link;
//!   [`compare`]: the same paths as a recommendation.
//! - [`file`](mod@file): a file into GPU memory by every method of `hetmem::data`, cold and warm,
//!   against the storage's and the link's own rates.
//! - [`ct`]: the CT computation with its buffers copied, mapped, hybrid and
//!   placed by [`hetmem::placement`], against the CPU.
//! - [`streaming`]: frames per second through a frame ring, by strategy;
//!   [`frame_strategies`]: each strategy's latency through a frame filter; [`pcie`]: NVML's
//!   PCIe counters sampled while either runs.
//! - [`cross_process`]: the cross-process frame ring (two processes) against the
//!   single-process frame ring, frames/s and one frame's latency, in one run.
//! - [`completion`]: how fast the CPU learns that GPU work finished; [`pinning`]: what pinning
//!   and registering memory cost.
//! - [`kernels`]: the CUDA source of the benchmark's own kernels; [`random`]: the one seeded
//!   generator of the benchmark's data.
//! - [`error`]: [`BenchError`], hetmem's errors and the states only a measurement has (a result
//!   that differs from the CPU's, a failed cell of the link table).
//!
//! # Example
//! ```
//! use hetmem::Device;
//! use hetmem_bench::doctor::{Report, Status};
//!
//! let device = Device::open_best()?;
//! let report = Report::gather(&device);
//! for check in report.checks.iter().filter(|check| check.status != Status::Ok) {
//!     println!("{} {}: {}", check.scope, check.name, check.detail);
//! }
//! # Ok::<(), hetmem::Error>(())
//! ```
//!
//! Measuring the link (a GPU run of [`link::LinkOptions::quick`] takes under a minute):
//! ```no_run
//! use hetmem::Device;
//! use hetmem_bench::link::{self, LinkOptions};
//!
//! let device = Device::open_best()?;
//! let report = link::measure(&device, &LinkOptions::quick())?;
//! for cell in &report.bandwidth {
//!     println!("{} at {} bytes: {:.1} GB/s ({})", cell.path, cell.bytes, cell.gb_s.median, cell.verified_by);
//! }
//! # Ok::<(), hetmem_bench::BenchError>(())
//! ```

#![deny(missing_docs)]

pub mod compare;
pub mod completion;
pub mod cross_process;
pub mod ct;
pub mod dataset;
pub mod doctor;
pub mod error;
pub mod file;
pub mod frame_strategies;
pub mod kernels;
pub mod link;
pub mod pcie;
pub mod pinning;
pub mod random;
pub mod sizes;
mod stats;
pub mod streaming;
pub mod user_stage;

pub use error::{BenchError, Result};
pub use stats::Summary;
