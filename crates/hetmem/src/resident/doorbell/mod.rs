//! [`Doorbell`]: microsecond round trips to a persistent GPU kernel through mapped memory.
//!
//! Launching a kernel per small request costs 5-10 µs before any work is done. The doorbell
//! launches one kernel (one block) that stays resident and polls a ring of request slots in
//! mapped host memory; the CPU writes a request (a gain or FIR over at most 4 KiB of f32
//! samples), then its sequence number last, and the kernel writes the reply into the same
//! slot, then the reply's sequence number last. A small request (taps and samples in at most
//! 26 words) travels whole in the 128-byte line the kernel polls, and a small reply (at most
//! 27 samples) in one line back, each 32-byte sector carrying the sequence number so that a
//! line is taken only when it is whole: one read over the link each way, and no fence. Larger
//! ones go through the slot's body, fenced at system scope. Neither side makes a driver call
//! per request.
//!
//! - [`Doorbell::submit`] queues a request and returns a [`Ticket`]; the queue holds `depth`
//!   requests, and a full queue blocks (up to the watchdog timeout) or, with
//!   [`Doorbell::try_submit`], returns [`Error::WouldBlock`].
//! - [`Ticket::wait`] spins, then yields, until the reply arrives; [`Ticket::wait_async`] is
//!   the same as a future. Both are watched: no reply within the timeout (default
//!   [`DEFAULT_TIMEOUT`]) is [`Error::DoorbellTimeout`], never a hang.
//! - [`Doorbell::shutdown`] (and `Drop`) asks the kernel to stop, waits a bounded time for it
//!   to exit and for its stream; a kernel that does not stop is reported and its memory leaked
//!   (freeing it would wait for the kernel for ever).
//!
//! Arithmetic: gain is one f32 multiply, FIR accumulates `taps[j] * x[i - j]` from `j = 0` up
//! with fused multiply-adds; the kernel and [`Request::reference`] do exactly the same, so
//! results are **bit-exact** with the CPU.
//!
//! While the kernel runs it is a resident kernel: hetmem defers its own frees on that GPU and
//! refuses calls that would wait for it (see [the module above](super)). On the CPU backend a
//! thread plays the kernel's part with the same protocol, so the same code runs and is tested
//! without a GPU.
//!
//! The parts, a file each: the wire protocol (the shared memory's layout, how a request is
//! written and a reply read, and the CPU reference), the server (start, the bounded queue, the
//! watchdog, stop), tickets and their futures, and the CPU thread that serves without a GPU.
//!
//! # Examples
//! ```
//! use hetmem::Device;
//! use hetmem::resident::{Doorbell, Request};
//!
//! let device = Device::open_best()?;
//! let bell = Doorbell::start(&device, 8)?;
//! let samples = [1.0f32, 2.0, 3.0, 4.0];
//! let reply = bell.submit(Request::Gain { gain: 0.5, samples: &samples })?.wait()?;
//! assert_eq!(reply, [0.5, 1.0, 1.5, 2.0]);
//! bell.shutdown()?;
//! # Ok::<(), hetmem::Error>(())
//! ```
//!
//! [`Error::WouldBlock`]: crate::Error::WouldBlock
//! [`Error::DoorbellTimeout`]: crate::Error::DoorbellTimeout

mod cpu;
mod protocol;
mod server;
mod ticket;

pub use protocol::{MAX_DEPTH, MAX_SAMPLES, MAX_TAPS, Request};
pub use server::{DEFAULT_TIMEOUT, Doorbell, DoorbellOptions};
pub use ticket::{Ticket, TicketFuture};
