//! hetmem-nixl: hetmem's memory moved by NVIDIA NIXL, host and device buffers registered
//! with a NIXL agent, and transfers into and out of other agents' memory, in this process, in
//! another, or on another machine, with the hand-off kept.
//!
//! - [`Agent`]: a NIXL agent with its UCX backend; [`Agent::metadata`] and [`Agent::add_peer`]
//!   exchange what two agents need to reach each other (the bytes travel by the caller's own
//!   channel: a socket, a file, a key-value store).
//! - [`Registered`]: a [`HostBuf`](hetmem::HostBuf) (NIXL's `DRAM_SEG`) or a GPU's
//!   [`DeviceBuf`](hetmem::DeviceBuf) (`VRAM_SEG`, with its CUDA device) registered with an
//!   agent. [`Registered::remote`] describes it to a peer as a [`RemoteRegion`], which travels
//!   as bytes ([`RemoteRegion::to_bytes`]).
//! - [`Transfer`]: a write of a registered buffer into a peer's region, or a read of a peer's
//!   region into one. The transfer owns the buffer while NIXL moves it; [`Transfer::finish`]
//!   gives it back once NIXL has reported the transfer complete. A failed transfer keeps it
//!   for good (UCX may still move its bytes: NIXL's status looks at a request's last step, and
//!   a cancel may not stop the one before), and a transfer dropped in flight waits a bounded
//!   time, then leaks the buffer rather than free it under UCX, as a failed one does.
//!
//! # What the types cannot promise
//! NIXL is one-sided: a peer that holds an agent's metadata (or a buffer's region) may write or
//! read any buffer registered with that agent at any time, without this process taking part.
//! No borrow can rule that out, so a registered buffer's contents are reached only through
//! `unsafe` accessors ([`Registered::memory`], [`Registered::memory_mut`]), whose caller
//! vouches, by the application's own protocol (a message, a notification, the end of a step),
//! that no agent moves its data meanwhile. And since NIXL does not tell peers of a
//! deregistration, a buffer a peer could reach ([`Registered::is_exposed`]) is leaked when
//! dropped rather than freed; [`Registered::into_inner`] (`unsafe`) hands it back to a caller
//! who knows no peer will use it again. Peers are trusted: a peer's region bytes are checked
//! for form ([`RemoteRegion::from_bytes`]), and NIXL checks they lie inside what that peer
//! registered.

//! NIXL's C API comes from the `nixl-cu13` wheel's `libnixl_capi.so`, loaded when the first
//! agent is made: put the wheel's `.nixl_cu13.mesonpy.libs` folder on `LD_LIBRARY_PATH`
//! (docs/cluster.md). Where it is missing, [`Agent::new`] says so ([`available`] asks first).
//! A crate of its own, outside hetmem's workspace: building hetmem needs neither NIXL nor the
//! libclang that `nixl-sys` generates its bindings with. The Python package's `hetmem.nixl` is
//! the same model over the `nixl` Python package.

mod agent;
mod region;
mod transfer;

pub use agent::{Agent, NixlMemory, Refused, Registered};
pub use region::{RegionKind, RemoteRegion};
pub use transfer::Transfer;

use hetmem::Error;

/// Whether NIXL's C API (`libnixl_capi.so`) could be loaded: without it every NIXL call would
/// abort the process, so [`Agent::new`] refuses instead.
pub fn available() -> bool {
    !nixl_sys::is_stub()
}

/// The library folder of the wheel, for the remedy of a missing library.
pub(crate) const LIBRARY_REMEDY: &str = "install NIXL's wheel (`pip install nixl-cu13==1.5.1`) and put its \
     `.nixl_cu13.mesonpy.libs` folder (in site-packages) on LD_LIBRARY_PATH";

/// A failed NIXL call as hetmem's error: the call, NIXL's words, and what to do.
pub(crate) fn failed(call: &'static str, error: nixl_sys::NixlError, remedy: &'static str) -> Error {
    Error::Nixl { call, problem: error.to_string(), remedy }
}
