//! By-address access to the CUDA backend, for measurements and interop that need the driver's
//! own operations: memory handed out as raw host and device addresses ([`PinnedAlloc`],
//! [`DeviceAlloc`], [`Registration`]), copies between addresses ([`copy_async`]) and kernel
//! launches with argument pointers ([`launch`]).
//!
//! Nothing here knows which buffer an address belongs to, who else uses it, or when queued
//! work is done with it: that is the caller's to keep. The operations that could make memory
//! unsound (a copy or a kernel reaching memory that is freed, or that the CPU touches
//! meanwhile) are `unsafe fn`, each with its `# Safety` contract. Prefer hetmem's buffers
//! ([`crate::HostBuf`], [`crate::DeviceBuf`]) lent to a [`crate::Queue`], whose hand-off
//! enforces those rules; hold memory used by work queued here in a [`crate::memory::InFlight`]
//! so it is freed only once that work has finished.

use std::ffi::c_void;

pub use super::host::{HostAllocFlags, PinnedAlloc, RegisterFlags, Registration, RegistrationFailed};
pub use super::memory::DeviceAlloc;
use super::{Kernel, LaunchConfig, Stream};
use crate::backend::error::Result;

/// Queues a copy of `bytes` from address `src` to address `dst` on `stream` (device or
/// pinned host addresses, with unified addressing).
///
/// # Safety
/// - `[dst, dst + bytes)` and `[src, src + bytes)` are each valid memory the stream's
///   device can reach, and they do not overlap (a copy split into parts may repeat a part).
/// - Both stay valid, and nothing (the CPU, or other GPU work) writes either or reads `dst`
///   in a way that races the copy, until the work queued on `stream` has finished: also when
///   this returns an error, since parts may already be queued.
///
/// # Errors
/// A failing driver call.
pub unsafe fn copy_async(stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
    // SAFETY: the caller's contract, which is `Stream::copy_async`'s.
    unsafe { stream.copy_async(dst, src, bytes) }
}

/// Queues `kernel` on `stream` with the argument pointers `args`.
///
/// # Safety
/// - `args` holds one pointer per kernel parameter, in order, each pointing to a value of
///   exactly that parameter's type; the values are copied during this call.
/// - Every device address passed (device memory, or mapped host memory, whose pinning or
///   registration must outlive the work) belongs to the kernel's device and stays valid, and
///   is not accessed by the host or by other GPU work in a way that races the kernel, until
///   the work queued on `stream` has finished; the kernel must stay inside the memory at
///   those addresses.
///
/// # Errors
/// A launch the driver rejects (too many threads, too much shared memory, a stream of
/// another device).
pub unsafe fn launch(
    kernel: &Kernel,
    stream: &Stream,
    config: LaunchConfig,
    args: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract, which is `Kernel::launch`'s.
    unsafe { kernel.launch(stream, config, args) }
}
