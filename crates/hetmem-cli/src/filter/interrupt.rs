//! Ctrl-C while a video streams: stop reading, finish and write every whole frame read, exit
//! with 130.
//!
//! In a terminal pipeline (`ffmpeg ... | hetmem filter - - | ffmpeg ...`) Ctrl-C sends SIGINT
//! to every process of the group at once, so the upstream writer often dies and closes the
//! pipe, perhaps mid-frame, while hetmem is still reading. The flag is therefore set by the
//! signal handler itself, not by a thread it wakes (as the `ctrlc` crate does): the kernel
//! runs the handler before the `read` that sees the pipe's end returns, so an input that ends
//! because of Ctrl-C is always known to be interrupted, not truncated.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set on the first SIGINT: read no more frames, write the ones in flight, end.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C has been pressed since [`catch_ctrl_c`].
pub(super) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Makes the first Ctrl-C end the stream cleanly instead of killing the process mid-frame.
/// The second one kills it as usual (the handler resets itself): the reader may be waiting on
/// an input that never comes.
#[cfg(unix)]
pub(super) fn catch_ctrl_c() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

    extern "C" fn on_sigint(_: nix::libc::c_int) {
        // Async-signal-safe: one atomic store.
        INTERRUPTED.store(true, Ordering::SeqCst);
    }
    // SA_RESTART: reads and writes carry on after the handler (the reader sees the flag at
    // the next frame); SA_RESETHAND: the second Ctrl-C takes the default action.
    let action = SigAction::new(
        SigHandler::Handler(on_sigint),
        SaFlags::SA_RESTART | SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and touches no
    // other state; replacing SIGINT's disposition affects nothing else in this process (no
    // other part of hetmem handles signals).
    if let Err(error) = unsafe { sigaction(Signal::SIGINT, &action) } {
        tracing::debug!("no Ctrl-C handler: {error}");
    }
}

/// Elsewhere Ctrl-C ends the process as usual.
#[cfg(not(unix))]
pub(super) fn catch_ctrl_c() {}
