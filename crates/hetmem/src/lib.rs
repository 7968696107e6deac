//! hetmem: zero-copy CPU<->GPU memory sharing for NVIDIA GPUs, with a CPU backend.
//!
//! Moving data between CPU and GPU is the bottleneck of real-time and large-data GPU work.
//! hetmem gives Rust programs every way to share memory with the GPU (pinned and mapped host
//! memory, registered memory and files, managed memory, device memory), a hand-off that makes
//! the compiler forbid the CPU and GPU writing one buffer at once, and measurements that say
//! which path wins on a given machine. Without a GPU, everything runs on a CPU backend.
//!
//! # Layers
//! Bottom up, as the imports are (`scripts/architecture/run-all` draws them); a layer uses only
//! layers below it, often several at once (a pipeline calls ops, the hand-off, memory and the
//! backend directly):
//! - `faults`, the fault injection hooks (armed by tests only), below everything.
//! - [`backend`]: [`backend::cuda`], the only module that calls the CUDA driver (through
//!   cudarc, loaded at run time), and [`backend::cpu`], behind one dispatch: the memory, the
//!   queue's stream and the [`backend::Capabilities`] the layers above ask for, with errors
//!   of their own ([`backend::BackendError`]).
//! - [`error`], hetmem's one error type, which the backend's convert into.
//! - [`memory`]: typed buffers in every kind of shareable memory, a pinned pool, file windows
//!   mapped on demand (within a pinned budget), buffers cut into ranges lent on their own,
//!   memory shared with other processes, and a device-memory budget; [`kernels`]: hetmem's CUDA sources, compiled by NVRTC on
//!   first use and cached on disk; [`retry`]: retrying transient failures.
//! - [`handoff`]: queues, leases and fences: the compiler-enforced rule that the CPU and the
//!   GPU never write one buffer at once; [`placement`]: which buffers of a computation go to
//!   device memory and which stay mapped, under a budget, from a measured link profile, with
//!   a reason for each; and, with feature `testing`, `testing`'s helpers for tests.
//! - [`stage`]: what runs on a frame (inputs, outputs and constants by [`stage::FrameLayout`],
//!   a GPU and a CPU path) and the [`Strategy`] a stage is told; [`resident`]: kernels that
//!   stay on the GPU and poll mapped memory (the doorbell), and mapped flags, counters and
//!   mailboxes for users' own protocols; [`data`]: files on their way to
//!   the GPU (streamed reads into pinned staging, windows registered in place, safetensors).
//! - [`ops`]: operations with a GPU and a CPU path, and the stages built on them.
//! - [`pipeline`]: the strategies implemented once, and the [`FrameFilter`] and rings that
//!   move frames through a stage, within a process or between two
//!   ([`pipeline::shared_ring`]).
//!
//! The measurements behind `hetmem bench` and `hetmem doctor` live in their own crate,
//! `hetmem-bench`, so a program that shares memory builds none of them.
//!
//! # Example: the zero-copy hand-off
//! Pinned, mapped host buffers; the CPU fills the input in place; the queue gets the input
//! shared and the output lent, so until `reclaim` the compiler refuses any CPU access to the
//! output while the kernel writes it over the link (`examples/zero_copy.rs` in full). Without
//! a GPU the same lines run on the CPU backend.
//! ```
//! use hetmem::{Device, HostBuf, PinOptions, Queue, ops};
//!
//! let device = Device::open_best()?;
//! let queue = Queue::new(&device)?;
//! let mut input = HostBuf::<u32>::pinned(&device, 1 << 16, PinOptions::default())?;
//! let output = HostBuf::<u32>::pinned(&device, 1 << 16, PinOptions::default())?;
//! input.as_mut_slice().iter_mut().enumerate().for_each(|(i, x)| *x = i as u32 ^ 0x9e37);
//!
//! let input = queue.share(input); // the GPU reads it; the CPU may still read it
//! let mut output = queue.lend(output); // the GPU's alone until reclaimed
//! ops::affine_u32(&queue, &input, &mut output, 3, 1)?; // y = 3x + 1, in host memory
//! let output = output.reclaim()?; // waits for the kernel
//! let input = input.reclaim()?;
//!
//! let expected = input.as_slice().iter().map(|x| x.wrapping_mul(3).wrapping_add(1));
//! assert!(output.as_slice().iter().copied().eq(expected));
//! # Ok::<(), hetmem::Error>(())
//! ```

#![deny(missing_docs)]

pub mod backend;
pub mod data;
pub mod error;
mod faults;
pub mod handoff;
pub mod kernels;
pub mod memory;
pub mod ops;
pub mod pipeline;
pub mod placement;
pub mod resident;
pub mod retry;
pub mod stage;
#[cfg(feature = "testing")]
pub mod testing;

// The types a program starts with; the rest is reached through its module (`memory::`,
// `handoff::`, `error::`, `backend::`, ...).
pub use backend::{BackendChoice, BackendKind, Device};
pub use error::{Error, Result};
pub use handoff::{Fence, FenceKind, Lease, Lent, Queue, Shared};
pub use memory::{
    Buffer, DeviceBuf, Element, HostBuf, ManagedBuf, MappedFile, PageBox, PinOptions, WindowedFile,
    WritableBuffer,
};
pub use pipeline::{FrameFilter, FrameRing, RingOptions, Strategy};
