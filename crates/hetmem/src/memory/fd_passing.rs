//! File descriptors passed to another process over a Unix socket (`SCM_RIGHTS`), with a small
//! fixed-size message beside them: how shared memory and a ring's eventfds reach the peer.

use std::io::IoSlice;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

use crate::error::{Error, Result};

/// The most descriptors one message carries (a ring sends three).
pub(crate) const MAX_FDS: usize = 4;

fn io_error(context: &str, errno: rustix::io::Errno) -> Error {
    Error::Io { context: context.to_string(), source: errno.into() }
}

/// Sends `message` and `fds` to the process at the other end of `socket`, the descriptors
/// attached to the message's first byte.
///
/// # Errors
/// More than [`MAX_FDS`] descriptors, an empty message, or the socket's error (a peer that
/// is gone: `EPIPE`).
pub(crate) fn send_fds(socket: BorrowedFd<'_>, message: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    if fds.len() > MAX_FDS || message.is_empty() {
        return Err(Error::invalid(
            "descriptor message",
            format!(
                "{} descriptors with {} bytes: at most {MAX_FDS}, and at least one byte",
                fds.len(),
                message.len()
            ),
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Error::invalid("descriptor message", "the descriptors do not fit the control buffer"));
    }
    let sent = sendmsg(socket, &[IoSlice::new(message)], &mut control, SendFlags::NOSIGNAL)
        .map_err(|errno| io_error("sending shared memory descriptors over the socket", errno))?;
    // The descriptors went with the first byte; the rest, if the socket took less, follows.
    write_all(socket, &message[sent..])
}

/// Receives a message of exactly `message.len()` bytes and the descriptors sent with it.
///
/// # Errors
/// The peer closing the socket first (it exited or refused), a message cut short, more
/// descriptors than [`MAX_FDS`] (the kernel then drops them), or the socket's error.
pub(crate) fn recv_fds(socket: BorrowedFd<'_>, message: &mut [u8]) -> Result<Vec<OwnedFd>> {
    recv_fds_until(socket, message, None)
}

/// [`recv_fds`], giving up at `deadline` (`None`: never) with an [`Error::Io`] of kind
/// `TimedOut`: a peer that connected but sends nothing (or stops half-way) cannot keep this
/// process waiting past it.
///
/// # Errors
/// As [`recv_fds`], and the deadline passing.
pub(crate) fn recv_fds_until(
    socket: BorrowedFd<'_>,
    message: &mut [u8],
    deadline: Option<Instant>,
) -> Result<Vec<OwnedFd>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    // Never a blocking receive: whatever the descriptor's flags (shared with the caller, and
    // with anyone it was passed to), MSG_DONTWAIT, and a poll bounded by the deadline between.
    let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
    let received = loop {
        match recvmsg(socket, &mut [IoSliceMut::new(message)], &mut control, flags) {
            Ok(received) => break received,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                wait_readable(socket, deadline, "receiving shared memory descriptors")?
            }
            Err(errno) => return Err(io_error("receiving shared memory descriptors from the socket", errno)),
        }
    };
    let mut fds = Vec::new();
    for cmsg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = cmsg {
            fds.extend(received);
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(Error::invalid(
            "descriptor message",
            format!("the peer sent more than {MAX_FDS} descriptors: it is not a hetmem peer of this version"),
        ));
    }
    if received.bytes == 0 {
        return Err(Error::Io {
            context: "receiving shared memory descriptors".to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer closed the socket before sending them (it exited, or refused the exchange)",
            ),
        });
    }
    read_exact_until(socket, &mut message[received.bytes..], deadline)?;
    Ok(fds)
}

/// Writes all of `bytes` to `socket`.
pub(crate) fn write_all(socket: BorrowedFd<'_>, mut bytes: &[u8]) -> Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(socket, bytes, SendFlags::NOSIGNAL) {
            Ok(sent) => bytes = &bytes[sent..],
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(io_error("writing to the peer's socket", errno)),
        }
    }
    Ok(())
}

/// Reads exactly `bytes.len()` bytes from `socket`, giving up at `deadline` (`None`: never)
/// with an [`Error::Io`] of kind `TimedOut`. Never a blocking read, whatever the socket's
/// flags: `MSG_DONTWAIT`, with a poll bounded by the deadline between.
///
/// # Errors
/// The peer closing the socket first, the socket's error, or the deadline passing.
pub(crate) fn read_exact_until(
    socket: BorrowedFd<'_>,
    mut bytes: &mut [u8],
    deadline: Option<Instant>,
) -> Result<()> {
    while !bytes.is_empty() {
        match rustix::net::recv(socket, &mut *bytes, RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                return Err(Error::Io {
                    context: "reading from the peer's socket".to_string(),
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                });
            }
            Ok((read, _)) => bytes = &mut bytes[read..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                wait_readable(socket, deadline, "reading from the peer's socket")?
            }
            Err(errno) => return Err(io_error("reading from the peer's socket", errno)),
        }
    }
    Ok(())
}

/// Waits until `socket` has something to read (bytes, its end of file, an error), or fails
/// with `TimedOut` once `deadline` passes; `doing` names the wait in that error.
fn wait_readable(socket: BorrowedFd<'_>, deadline: Option<Instant>, doing: &str) -> Result<()> {
    let left = match deadline {
        None => None,
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Io {
                    context: format!("{doing}: the peer sent nothing before the timeout"),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "is the other side running hetmem's side of the exchange? give a longer timeout \
                         if it is only slow",
                    ),
                });
            }
            Some(left)
        }
    };
    // At most a second a poll: a deadline far off still takes whole seconds only.
    let slice = left.unwrap_or(std::time::Duration::from_secs(1)).min(std::time::Duration::from_secs(1));
    let timeout =
        rustix::event::Timespec { tv_sec: slice.as_secs() as i64, tv_nsec: i64::from(slice.subsec_nanos()) };
    let mut fds = [rustix::event::PollFd::new(&socket, rustix::event::PollFlags::IN)];
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(errno) => Err(io_error(doing, errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_and_message_arrive_together() {
        let (left, right) = UnixStream::pair().unwrap();
        let eventfd = rustix::event::eventfd(7, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        let message: Vec<u8> = (0..40).map(|_| fastrand::u8(..)).collect();
        send_fds(left.as_fd(), &message, &[eventfd.as_fd()]).unwrap();
        let mut got = vec![0u8; message.len()];
        let fds = recv_fds(right.as_fd(), &mut got).unwrap();
        assert_eq!(got, message);
        assert_eq!(fds.len(), 1);
        let mut value = [0u8; 8];
        rustix::io::read(&fds[0], &mut value).unwrap();
        assert_eq!(u64::from_ne_bytes(value), 7, "the received descriptor is the same eventfd");
    }

    #[test]
    fn a_closed_peer_is_an_error_not_a_hang() {
        let (left, right) = UnixStream::pair().unwrap();
        drop(left);
        let error = recv_fds(right.as_fd(), &mut [0u8; 8]).unwrap_err();
        assert!(error.to_string().contains("closed the socket"), "{error}");
    }
}
