//! The process at the other end of a shared ring: who it is (its pid, from the socket's
//! credentials), waiting for it to hand a slot over (a wake-up byte on the socket), and
//! noticing at once that it is gone (its pidfd turns readable, its end of the socket closes)
//! instead of waiting for a wake-up that will never come.
//!
//! Wake-ups travel on the socket, not on eventfds: an eventfd is one open file shared by both
//! processes, so the peer could clear its `O_NONBLOCK` (and drain or fill the counter) and
//! make this process's read or write of it wait for good. Each end of a socket pair is a file
//! of its own, its flags out of the peer's reach, and `MSG_DONTWAIT` makes each send and
//! receive here non-blocking whatever they are.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{RecvFlags, SendFlags};

use crate::error::{Error, Result};

/// How long one wait sleeps before it looks at the slot again, whatever the eventfd says: a
/// bound on the cost of a lost wake-up, not the way a dead peer is noticed (that is at once).
const RECHECK: Duration = Duration::from_millis(100);

/// How long a wait first looks at the slot in a loop, before it sleeps in `poll`: a frame or
/// slot handed over within it is taken without the scheduler's wake-up (several microseconds
/// on the H200 machine: the cross-process ring's one-frame latency was 12-14 us above the
/// single-process ring's by zero-copy). Costs at most this much CPU per wait that sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// What a wake-up carries on the socket: nothing but its arrival counts.
const WAKE: u8 = 0x57;

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
    /// This process's end of the socket the ring was set up over: after the set-up it carries
    /// only wake-up bytes, and its end of file says the peer's end closed.
    socket: OwnedFd,
}

impl Peer {
    /// The process at the other end of `socket`; `claimed` is the pid the peer wrote in the
    /// ring's header, taken only where the socket cannot tell (see below).
    ///
    /// The socket's credentials name the process that connected it, but for a
    /// `socketpair` they name the process that made the pair, for both ends: a trainer that
    /// makes one per worker and hands one end to each would watch its own pid (which never
    /// exits) instead of the worker's, and a worker that died leaving its end open in a
    /// child (a fork that kept it) would never be noticed. Where the credentials name this
    /// process (or none), the peer's claim is watched instead: a claim that lies can only make
    /// this side hear early that the peer is gone, which the peer could say by exiting.
    ///
    /// # Errors
    /// The socket is not a connected Unix socket.
    pub(crate) fn new(role: &'static str, socket: &UnixStream, claimed: u32) -> Result<Peer> {
        let credited = peer_pid(socket)?;
        let pid = if (credited == 0 || credited == std::process::id()) && claimed != 0 {
            claimed
        } else {
            credited
        };
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

    /// Waits until `check` finds what it looks for (`Some`), calling it first (in a loop for
    /// up to [`SPIN`], then sleeping in `poll`), again after
    /// each wake-up from the peer and at least every [`RECHECK`], until `deadline` (`None`:
    /// for ever; `Ok(None)` once it passes). Once the peer is gone, `check` runs once more
    /// (what the peer finished before it went still counts), then `on_gone` answers.
    ///
    /// # Errors
    /// `check`'s or `on_gone`'s errors, or a failed poll.
    pub(crate) fn wait<T>(
        &self,
        deadline: Option<Instant>,
        mut check: impl FnMut() -> Result<Option<T>>,
        on_gone: impl FnOnce() -> Result<T>,
    ) -> Result<Option<T>> {
        let spin_until = Instant::now() + SPIN;
        loop {
            if let Some(found) = check()? {
                return Ok(Some(found));
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) || Instant::now() >= spin_until {
                break;
            }
            std::hint::spin_loop();
        }
        loop {
            if let Some(found) = check()? {
                return Ok(Some(found));
            }
            let mut slice = RECHECK;
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                slice = slice.min(left);
            }
            let timeout = Timespec { tv_sec: 0, tv_nsec: slice.as_nanos() as i64 };
            // Without a pidfd the socket is polled twice: the same answer, no allocation.
            let exit = self.pidfd.as_ref().unwrap_or(&self.socket);
            let mut fds = [
                PollFd::new(&self.socket, PollFlags::IN | PollFlags::RDHUP),
                PollFd::new(exit, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(os_error("waiting for the ring's peer", errno)),
            }
            let socket = fds[0].revents();
            let mut peer_gone = socket.intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
                || (self.pidfd.is_some() && !fds[1].revents().is_empty());
            if socket.contains(PollFlags::IN) && !self.drain() {
                peer_gone = true;
            }
            if peer_gone {
                return match check()? {
                    Some(found) => Ok(Some(found)),
                    None => on_gone().map(Some),
                };
            }
        }
    }

    /// Wakes the peer if it waits: one byte on the socket, sent without waiting whatever the
    /// socket's flags (`MSG_DONTWAIT`) and without `SIGPIPE`. A full socket buffer means the
    /// peer has wake-ups it has not read yet, so it is awake anyway; a closed one means it is
    /// gone, which its own side of the protocol notices.
    pub(crate) fn signal(&self) {
        let _ = rustix::net::send(&self.socket, &[WAKE], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }

    /// Reads the wake-ups the socket holds, never waiting (`MSG_DONTWAIT`, whatever the
    /// descriptor's flags say), and at most a bounded amount (a peer that floods the socket
    /// cannot keep this process here). False once the peer's end is closed (end of file, a
    /// reset).
    fn drain(&self) -> bool {
        let mut bytes = [0u8; 4096];
        for _ in 0..16 {
            match rustix::net::recv(&self.socket, &mut bytes, RecvFlags::DONTWAIT) {
                Ok((0, _)) => return false,
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return true,
                Err(_) => return false,
            }
        }
        true
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
