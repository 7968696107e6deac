//! hetmem: zero-copy CPU<->GPU memory sharing for NVIDIA GPUs, with a CPU backend.
//!
//! Moving data between CPU and GPU is the bottleneck of real-time and large-data GPU work.
//! hetmem gives Rust programs every way to share memory with the GPU (pinned and mapped host
//! memory, registered memory and files, managed memory, device memory), a hand-off that makes
//! the compiler forbid the CPU and GPU writing one buffer at once, and measurements that say
//! which path wins on a given machine. Without a GPU, everything runs on a CPU backend.
//!
//! # Layers
//! Each layer only talks to the one below:
//! - [`backend`]: [`backend::cuda`], the only module that calls the CUDA driver (through
//!   cudarc, loaded at run time), and [`backend::cpu`].
//! - [`kernels`]: the CUDA C sources, compiled by NVRTC on first use and cached on disk.
//! - [`doctor`]: what this machine can do, checked and explained.
//!
//! # Example
//! ```
//! use hetmem::Device;
//!
//! let device = Device::open_best()?;
//! match device.cpu_fallback_reason() {
//!     Some(reason) => println!("CPU backend: {reason}"),
//!     None => println!("GPU: {}", device.name()),
//! }
//! # Ok::<(), hetmem::Error>(())
//! ```

#![deny(missing_docs)]

pub mod backend;
pub mod doctor;
pub mod error;
pub mod kernels;
pub mod testing;

pub use backend::{BackendChoice, BackendKind, Device};
pub use error::{CudaError, Error, NvrtcError, Result, Unavailable};
