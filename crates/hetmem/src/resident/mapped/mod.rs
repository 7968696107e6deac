//! Mapped flags, counters and mailboxes: typed views of words in mapped host memory, for
//! protocols of one's own between the CPU and a kernel (often a resident one) that polls.
//!
//! - [`SeqFlag`]: one 32-bit word that one side raises to a sequence number and the other
//!   waits for ("frame 17 is ready", "stop").
//! - [`Counter`]: one 32-bit count with a single writing side ([`Writer`]): items produced,
//!   bytes consumed. Both sides writing it is refused where the link has no native atomics.
//! - [`Mailbox`]: a ring of fixed-size messages, each slot carrying its sequence number,
//!   from one sender to one receiver, either way between the CPU and a GPU ([`MailboxSender`],
//!   [`MailboxReceiver`] are the CPU's ends).
//!
//! Each lives in its own mapped pinned memory (the memory the doorbell polls too) on a GPU,
//! and in plain memory on the CPU backend, where two CPU threads run the same protocol. A
//! kernel gets a view's address through [`KernelArgs::mapped`] (or as a [`Param::Mapped`] of
//! a [`KernelStage`]), and touches it with the device functions of `kernels/hetmem/mapped.cuh`
//! (`#include <hetmem/mapped.cuh>` in a user's CUDA C: hetmem's NVRTC compiles of users'
//! sources give them that header; [`HEADER`] is its text).
//!
//! # The ordering contract
//! Every word is written by one side at a time and published with **release** ordering,
//! and read with **acquire** ordering, at system scope, so that what a side wrote before
//! publishing is seen by the side that observed the publication:
//! - On the CPU, views use `std::sync::atomic` with `Ordering::Release` for every store
//!   that publishes, `Ordering::Acquire` for every load that observes, and `Relaxed` for a
//!   mailbox's payload words, which are ordered by the slot's sequence word.
//! - On the GPU, `mapped.cuh` publishes with `st.release.sys.global.u32` and observes with
//!   `ld.acquire.sys.global.u32` (what `cuda::atomic_ref<unsigned, cuda::thread_scope_system>`
//!   emits for `store(release)` and `load(acquire)`), payloads with volatile 32-bit accesses
//!   ordered by those; a GPU counter's increment is `__threadfence_system()` then a
//!   system-scope GPU atomic (`atomicAdd_system`: a device-scope one is atomic among the
//!   device's threads only, never with the CPU's, whatever the link).
//! - A message is published by its sequence word, written after its payload; the receiver
//!   reads the payload only after it has seen that word, and acknowledges by releasing its
//!   count of messages taken, after which the sender may reuse the slot. So no message is
//!   read torn, lost or seen twice.
//! - One thread per side runs a view's protocol (one sender, one receiver, a flag's or
//!   counter's one writer). In a kernel that is typically thread 0 of a block, which shares
//!   what it received through shared memory and `__syncthreads()`.
//!
//! # Read-modify-write across the link
//! A GPU's atomic on mapped host memory is atomic with the CPU's only where the link performs
//! atomics natively ([`Capabilities::host_native_atomics`], `host_native_atomic = 1`, as over
//! NVLink-C2C). Over PCIe (the H200's case, `host_native_atomic = 0`) each side's
//! read-modify-write is atomic among its own threads only, and a word both sides
//! increment loses updates. So a [`Counter`] has one writing side, and one written by both
//! ([`Writer::Both`]) is refused with [`Error::AtomicsNotNative`] unless the link has native
//! atomics. The flags and mailboxes above need no read-modify-write across the link at all:
//! each word has one writer.
//!
//! # Lifetime
//! A kernel must not touch a view after the view is dropped. Dropping waits for the device
//! (freeing pinned memory does): with a kernel that polls until told to stop, stop it first.
//!
//! [`KernelArgs::mapped`]: crate::handoff::KernelArgs::mapped
//! [`Param::Mapped`]: crate::stage::Param::Mapped
//! [`KernelStage`]: crate::stage::KernelStage
//! [`Capabilities::host_native_atomics`]: crate::backend::Capabilities::host_native_atomics
//! [`Error::AtomicsNotNative`]: crate::Error::AtomicsNotNative

mod flag;
mod mailbox;
mod wait;

pub use flag::{Counter, SeqFlag, Writer};
pub use mailbox::{MAX_DEPTH, MAX_MESSAGE_BYTES, Mailbox, MailboxReceiver, MailboxSender};

/// The device functions of the ordering contract, as users' kernels `#include
/// <hetmem/mapped.cuh>` them.
pub const HEADER: &str = crate::kernels::USER_HEADERS[0].1;

/// The name users' kernels include [`HEADER`] by.
pub const HEADER_NAME: &str = crate::kernels::USER_HEADERS[0].0;
