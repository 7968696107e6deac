//! The process at the other end of a shared ring: who it is (its pid, from the socket's
//! credentials), waiting for it to hand a slot over (an eventfd), and noticing at once that
//! it is gone (its pidfd turns readable, its end of the socket closes) instead of waiting for
//! a wake-up that will never come.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::error::{Error, Result};

/// How long one wait sleeps before it looks at the slot again, whatever the eventfd says: a
/// bound on the cost of a lost wake-up, not the way a dead peer is noticed (that is at once).
const RECHECK: Duration = Duration::from_millis(100);

fn os_error(context: &str, errno: rustix::io::Errno) -> Error {
    Error::Io { context: context.to_string(), source: errno.into() }
}

/// The other process.
#[derive(Debug)]
pub(crate) struct Peer {
    /// `producer` or `consumer`.
    role: &'static str,
    pid: u32,
    /// Readable once the process has exited; `None` where the kernel has no pidfds (before
    /// Linux 5.3, or refused in a sandbox): the socket alone tells then.
    pidfd: Option<OwnedFd>,
    /// This process's end of the socket the ring was set up over: nothing more is sent on
    /// it, so it turns readable (end of file) only when the peer's end closes.
    socket: OwnedFd,
}

impl Peer {
    /// The process at the other end of `socket`.
    ///
    /// # Errors
    /// The socket is not a connected Unix socket.
    pub(crate) fn new(role: &'static str, socket: &UnixStream) -> Result<Peer> {
        let pid = peer_pid(socket)?;
        let pidfd = match rustix::process::Pid::from_raw(pid as i32) {
            Some(raw) => rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
                .inspect_err(|errno| {
                    tracing::debug!(
                        "no pidfd for the ring's {role} (pid {pid}): {errno}; watching its socket"
                    )
                })
                .ok(),
            None => {
                tracing::debug!("the ring's {role} runs in another pid namespace: watching its socket");
                None
            }
        };
        let socket = socket
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io { context: "duplicating the ring's socket".into(), source })?;
        Ok(Peer { role, pid, pidfd, socket })
    }

    /// Its process id; 0 where it is not visible in this process's pid namespace.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The error that says it is gone, with `detail` (what it was doing).
    pub(crate) fn gone(&self, detail: String) -> Error {
        Error::PeerGone { role: self.role, pid: self.pid, detail }
    }

    /// Waits until `check` finds what it looks for (`Some`), calling it first, again after
    /// each wake-up on `wake` and at least every [`RECHECK`]. Once the peer is gone, `check`
    /// runs once more (what the peer finished before it went still counts), then `on_gone`
    /// answers.
    ///
    /// # Errors
    /// `check`'s or `on_gone`'s errors, or a failed poll.
    pub(crate) fn wait<T>(
        &self,
        wake: &OwnedFd,
        mut check: impl FnMut() -> Result<Option<T>>,
        on_gone: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let timeout = Timespec { tv_sec: 0, tv_nsec: RECHECK.as_nanos() as i64 };
        loop {
            if let Some(found) = check()? {
                return Ok(found);
            }
            // Without a pidfd the socket is polled twice: the same answer, no allocation.
            let exit = self.pidfd.as_ref().unwrap_or(&self.socket);
            let mut fds = [
                PollFd::new(wake, PollFlags::IN),
                PollFd::new(&self.socket, PollFlags::IN | PollFlags::RDHUP),
                PollFd::new(exit, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(os_error("waiting for the ring's peer", errno)),
            }
            let peer_gone = fds[1..].iter().any(|fd| !fd.revents().is_empty());
            // Read only when readable: the producer shares the eventfd's flags and could make
            // it blocking again, and a read of an empty one would then wait for good.
            if !fds[0].revents().is_empty() {
                drain(wake);
            }
            if peer_gone {
                return match check()? {
                    Some(found) => Ok(found),
                    None => on_gone(),
                };
            }
        }
    }
}

/// The pid of the process at the other end of `socket` (`SO_PEERCRED`); 0 where the kernel
/// reports none (a peer in a pid namespace this process cannot see, as across containers).
///
/// Read with libc, not rustix's `socket_peercred`, which makes a non-zero `Pid` of the
/// kernel's value and so is undefined behaviour for a 0.
///
/// # Errors
/// The socket is not a connected Unix socket.
fn peer_pid(socket: &UnixStream) -> Result<u32> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `credentials` is a plain struct valid for writes of `len` bytes (its size), `len`
    // is valid for a write, and the descriptor is a live socket borrowed for the call.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut len,
        )
    };
    if result != 0 {
        return Err(Error::Io {
            context: "reading the peer's credentials from the ring's socket".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(u32::try_from(credentials.pid).unwrap_or(0))
}

/// Wakes the process waiting on `eventfd`.
pub(crate) fn signal(eventfd: &OwnedFd) {
    // A failure here can only be a counter at its maximum (the peer has not read for 2^64
    // wake-ups): it is awake anyway.
    let _ = rustix::io::write(eventfd, &1u64.to_ne_bytes());
}

/// Clears the wake-ups `eventfd` holds (it is non-blocking: nothing to read is no error).
fn drain(eventfd: &OwnedFd) {
    let mut count = [0u8; 8];
    let _ = rustix::io::read(eventfd, &mut count);
}

/// A new non-blocking eventfd for wake-ups.
///
/// # Errors
/// The system's error (too many open files).
pub(crate) fn new_eventfd() -> Result<OwnedFd> {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
        .map_err(|errno| os_error("creating an eventfd for the ring's wake-ups", errno))
}
