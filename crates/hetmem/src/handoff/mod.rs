//! The hand-off: who may touch a buffer when.
//!
//! A buffer held by value belongs to the CPU. [`Queue::lend`] moves it into a [`Lent`] lease
//! for GPU work that reads and writes it, [`Queue::share`] into a [`Shared`] lease that both
//! sides may only read; `reclaim` waits on the lease's [`Fence`] and gives the buffer back. The
//! compiler therefore rejects a CPU write to a lent buffer, a CPU read of a buffer the GPU is
//! writing, and any use of a buffer after lending it. [`Queue::lend_guarded`] also makes the
//! pages inaccessible to the CPU while lent, so unsafe code that kept a raw pointer faults
//! instead of corrupting data.
//!
//! cudarc's kernels, copies and libraries work on leases under the same rules: a queue and a
//! cudarc stream convert both ways ([`Queue::from_cudarc`], [`Queue::cudarc_stream`]), and a
//! lease is seen by cudarc as device memory through a [`CudarcView`] or [`CudarcViewMut`], and
//! a lent host buffer by cudarc's copies as host memory through a [`CudarcHostMut`]. A plain
//! slice of a host buffer handed to cudarc's copies is outside these rules: cudarc does not wait
//! for a copy into or out of page-locked memory (see [`CudarcHostMut`]).
//!
//! ```compile_fail
//! # use hetmem::*;
//! # let device = Device::open_best().unwrap();
//! # let queue = Queue::new(&device).unwrap();
//! let buf = HostBuf::<u32>::pinned(&device, 16, PinOptions::default()).unwrap();
//! let mut lent = queue.lend(buf);
//! lent.as_mut_slice()[0] = 1; // error: a lent buffer has no host access
//! ```

mod attach;
mod cudarc_interop;
mod fence;
mod guard;
mod launch;
mod lease;
mod poller;
mod queue;
#[cfg(feature = "tokio")]
mod reactor;

pub use self::cudarc_interop::{CudarcHostMut, CudarcView, CudarcViewMut};
pub use attach::Attached;
pub use fence::{Fence, FenceFd, FenceKind};
pub use launch::KernelArgs;
pub(crate) use lease::{CpuRead, LeaseParts, LeaseState};
pub use lease::{Lease, Lent, Shared};
pub use poller::FenceFuture;
pub use queue::{GuardError, Queue};
