//! Resident kernels: kernels that stay on the GPU and poll mapped host memory, so that the CPU
//! talks to them with plain loads and stores instead of a driver call each time.
//!
//! - [`Doorbell`]: a persistent kernel serving small requests (gain, FIR over at most 4 KiB of
//!   f32) in microseconds, with a bounded queue, a watchdog and blocking or async waits.
//! - [`Gate`]: a one-thread kernel that waits until the CPU lets it finish, for measuring
//!   completion signals (hetmem-bench's `completion`) and for testing that waits do not block.
//! - [`mapped`]: flags, counters and mailboxes in mapped memory, with a written ordering
//!   contract and a header of device functions, for users' own kernels and protocols.
//!
//! A layer beside the hand-off ([`crate::handoff`]) that uses it: each kernel runs on its own
//! [`Queue`](crate::Queue), launched with [`KernelArgs`](crate::handoff::KernelArgs).
//!
//! # Resident kernels and the driver
//! While such a kernel runs, driver calls that wait for the whole device (freeing or
//! unregistering memory, loading or unloading a module, `cuCtxSynchronize`) would wait for it,
//! that is until it stops, in any thread of the process. hetmem enforces this in its CUDA
//! backend: while a resident kernel runs on a GPU, hetmem defers its own frees on that GPU
//! until the kernel has stopped, and loading a kernel for the first time or synchronising the
//! device fails at once with [`Error::ResidentKernelRunning`](crate::Error::ResidentKernelRunning)
//! instead of hanging. Allocating and pinning memory, copies and launches on other queues go on
//! as usual. Driver calls made by other libraries in the process are outside hetmem's reach.

pub mod doorbell;
mod gate;
pub mod mapped;

pub use doorbell::{Doorbell, DoorbellOptions, Request, Ticket};
pub use gate::Gate;
pub use mapped::{Counter, Mailbox, MailboxReceiver, MailboxSender, SeqFlag, Writer};
