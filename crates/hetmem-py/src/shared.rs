//! `SharedRingProducer` and `SharedRingConsumer`: hetmem's cross-process frame ring
//! (`hetmem::pipeline::shared_ring`) for Python processes. The ring, its sealed memory, the
//! slots' hand-off, the order of frames and the noticing of a dead peer are the library's;
//! this module finds the peer (a Unix socket path, or a connected socket object), agrees on
//! the frames' shape and dtype with it, hands slots and frames to Python as `Memory` (the
//! Python half's `Buffer` views, revoked at the hand-off), and lets go of the interpreter
//! while it waits.
//!
//! A slot's `Memory` holds the ring's mapping (`RingProducer::mapping`), not the ring: a
//! NumPy array kept past its frame reads (or writes) later frames' bytes, which the hand-off
//! rule forbids, but never unmapped memory.

use std::any::Any;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use hetmem::pipeline::shared_ring::{ConsumerLimits, RingConsumer, RingProducer, SharedFrame, SlotWriter};
use pyo3::exceptions::{PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::device::Device;
use crate::memory::{Layout, Memory};
use crate::ring::spec;
use crate::ring::views::FrameSpec;
use crate::size::Int;
use crate::{HetmemError, to_py_err};

pyo3::create_exception!(
    _native,
    PeerGone,
    HetmemError,
    "The process at the other end of a shared ring exited, was killed, or closed the ring: `pid` \
     and `role` name it. The frames it finished before it went were delivered."
);

/// Adds the shared ring's classes and its exception to the native module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("PeerGone", module.py().get_type::<PeerGone>())?;
    module.add_class::<Producer>()?;
    module.add_class::<Consumer>()?;
    module.add_class::<FrameHold>()?;
    Ok(())
}

/// The longest description of a frame a peer may send (shape and dtype, as text).
const MAX_DESCRIPTION: usize = 4096;
/// How often a wait for the peer to appear looks again (and lets Ctrl-C through).
const RETRY: Duration = Duration::from_millis(20);
/// The longest a wait for the peer goes without looking for a signal (Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// A library error as Python's: a gone peer as `PeerGone` with its `pid` and `role`.
fn ring_err(py: Python<'_>, error: hetmem::Error) -> PyErr {
    if let hetmem::Error::PeerGone { role, pid, .. } = &error {
        let (role, pid) = (*role, *pid);
        let raised = PeerGone::new_err(error.to_string());
        let value = raised.value(py);
        if value.setattr("pid", pid).and_then(|()| value.setattr("role", role)).is_err() {
            return HetmemError::new_err(error.to_string());
        }
        return raised;
    }
    to_py_err(error)
}

/// What is left until `deadline` (None: for ever), for a library call that takes a timeout.
fn left_until(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()))
}

/// A set-up's error as Python's: a peer that stayed silent past the timeout as `TimeoutError`.
fn set_up_err(py: Python<'_>, error: hetmem::Error) -> PyErr {
    match &error {
        hetmem::Error::Io { source, .. } if source.kind() == ErrorKind::TimedOut => {
            PyTimeoutError::new_err(format!(
                "{error}: the peer connected but did not finish the set-up; give a longer timeout if it is slow"
            ))
        }
        _ => ring_err(py, error),
    }
}

/// `timeout` seconds (None: for ever) from now, checked; a deadline past what the clock holds
/// (hundreds of years: 1e300 is a finite number of seconds) is none, a wait for ever.
fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    let Some(seconds) = timeout else { return Ok(None) };
    if !(seconds >= 0.0 && seconds.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "timeout {seconds}: give a finite number of seconds >= 0, or None to wait for ever"
        )));
    }
    Ok(Duration::try_from_secs_f64(seconds).ok().and_then(|duration| Instant::now().checked_add(duration)))
}

/// Runs `attempt` (the interpreter let go) until it gives a value, letting Ctrl-C through and
/// failing with `TimeoutError` (`waiting_for` says for what) past `deadline`.
fn retry<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    waiting_for: &str,
    mut attempt: impl FnMut() -> std::io::Result<Option<T>> + Send,
) -> PyResult<T> {
    loop {
        let tried = py.detach(|| {
            let tried = attempt();
            if matches!(tried, Ok(None)) {
                std::thread::sleep(RETRY);
            }
            tried
        });
        match tried {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => return Err(HetmemError::new_err(format!("{waiting_for}: {error}"))),
        }
        py.check_signals()?;
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Err(PyTimeoutError::new_err(format!(
                "{waiting_for}: no peer came before the timeout; start the other side, or give a longer timeout"
            )));
        }
    }
}

/// The socket path a producer listens on, removed when the producer has its consumer (or
/// gave up): a path left behind would refuse the next producer.
struct Listening {
    path: PathBuf,
}

impl Drop for Listening {
    fn drop(&mut self) {
        // Gone already (someone removed it) is fine: nothing is left behind either way.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Waits for one consumer at `path` (a new socket file, removed once it came).
fn accept_at(py: Python<'_>, path: PathBuf, deadline: Option<Instant>) -> PyResult<UnixStream> {
    let listener = UnixListener::bind(&path).map_err(|error| {
        HetmemError::new_err(format!(
            "listening at {}: {error}; give a path in a directory you can write that does not exist yet",
            path.display()
        ))
    })?;
    let listening = Listening { path };
    listener.set_nonblocking(true).map_err(|error| HetmemError::new_err(format!("listening: {error}")))?;
    let what = format!("waiting for a consumer at {}", listening.path.display());
    let stream = retry(py, deadline, &what, || match listener.accept() {
        Ok((stream, _)) => Ok(Some(stream)),
        Err(error) if error.kind() == ErrorKind::WouldBlock => Ok(None),
        Err(error) => Err(error),
    })?;
    stream.set_nonblocking(false).map_err(|error| HetmemError::new_err(format!("{what}: {error}")))?;
    Ok(stream)
}

/// Connects to the producer listening at `path`, waiting for it to appear.
fn connect_to(py: Python<'_>, path: PathBuf, deadline: Option<Instant>) -> PyResult<UnixStream> {
    let what = format!("connecting to a producer at {}", path.display());
    retry(py, deadline, &what, || match UnixStream::connect(&path) {
        Ok(stream) => Ok(Some(stream)),
        Err(error) if matches!(error.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => Ok(None),
        Err(error) => Err(error),
    })
}

/// The connected Unix stream socket `peer` is: a path (`str` or `os.PathLike`) to listen at
/// (`listen`) or connect to, or a connected `socket.socket`, whose descriptor is duplicated
/// (the socket object keeps its own).
fn stream_for(
    py: Python<'_>,
    peer: &Bound<'_, PyAny>,
    listen: bool,
    deadline: Option<Instant>,
) -> PyResult<(UnixStream, Option<Restore>)> {
    let socket_type = py.import("socket")?.getattr("socket")?;
    if !peer.is_instance(&socket_type)? {
        let path: PathBuf = peer.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "{}: give a socket path (str or os.PathLike) or a connected socket.socket",
                peer.repr().map_or_else(|_| "the peer".to_owned(), |repr| repr.to_string())
            ))
        })?;
        let stream = if listen { accept_at(py, path, deadline)? } else { connect_to(py, path, deadline)? };
        return Ok((stream, None));
    }
    // The C `fileno` of `_socket.socket` (the base of every `socket.socket`), never a
    // subclass's override: an override could name any descriptor, or a closed one.
    let fileno = py.import("_socket")?.getattr("socket")?.getattr("fileno")?;
    let fd: i32 = fileno.call1((peer,))?.extract()?;
    if fd < 0 {
        return Err(PyValueError::new_err("the socket is closed (fileno() is -1); give a connected socket"));
    }
    // SAFETY: `fd` is the descriptor the live socket object `peer` owns (read by the C base
    // method above, which no subclass overrides), and `peer` is borrowed by this function (so
    // it is not collected); no Python code runs between that read and the duplicate below (so
    // nothing closes it meanwhile); the borrow ends with the duplicate, here, at once.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let owned = borrowed
        .try_clone_to_owned()
        .map_err(|error| HetmemError::new_err(format!("duplicating the socket's descriptor: {error}")))?;
    let stream = UnixStream::from(owned);
    // A socket of another family or kind is refused before a byte is sent on it: a datagram
    // or packet Unix socket passes the address checks but breaks the byte-stream handshake.
    let connected = stream.local_addr().and_then(|_| stream.peer_addr()).and_then(|_| {
        let kind = rustix::net::sockopt::socket_type(&stream)?;
        if kind == rustix::net::SocketType::STREAM {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("its type is {kind:?}, not SOCK_STREAM")))
        }
    });
    if let Err(error) = connected {
        return Err(PyValueError::new_err(format!(
            "the socket is not a connected Unix stream socket ({error}); make it with \
             socket.socketpair() or socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) and connect it"
        )));
    }
    let restore = Restore::record(&stream)?;
    stream.set_nonblocking(false).map_err(|error| HetmemError::new_err(format!("the socket: {error}")))?;
    Ok((stream, Some(restore)))
}

/// The caller's socket's file flags and receive timeout as they were before the set-up,
/// put back when this drops: the duplicate shares them with the caller's `socket.socket`
/// (one open file), and the set-up needs the socket blocking for a while, nothing more.
struct Restore {
    socket: std::os::fd::OwnedFd,
    flags: rustix::fs::OFlags,
    read_timeout: Option<Duration>,
}

impl Restore {
    fn record(stream: &UnixStream) -> PyResult<Restore> {
        let failed =
            |error: std::io::Error| HetmemError::new_err(format!("reading the socket's settings: {error}"));
        let flags = rustix::fs::fcntl_getfl(stream).map_err(|errno| failed(errno.into()))?;
        let read_timeout = stream.read_timeout().map_err(failed)?;
        let socket = std::os::fd::AsFd::as_fd(stream).try_clone_to_owned().map_err(failed)?;
        Ok(Restore { socket, flags, read_timeout })
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        // Best effort: a socket the peer reset still takes these; nothing to report otherwise.
        let _ = rustix::fs::fcntl_setfl(&self.socket, self.flags);
        let stream = UnixStream::from(self.socket.try_clone().expect("a descriptor duplicates"));
        let _ = stream.set_read_timeout(self.read_timeout);
    }
}

/// The frames' shape and dtype as both sides compare them.
fn describe(spec: &FrameSpec) -> String {
    let extents: Vec<String> = spec.shape.iter().map(usize::to_string).collect();
    let comma = if extents.len() == 1 { "," } else { "" };
    format!("shape ({}{comma}) dtype {}", extents.join(", "), spec.typestr)
}

/// Fills `bytes` from `stream`, in slices of [`SIGNAL_SLICE`] with the interpreter let go,
/// looking for Ctrl-C between them; a `TimedOut` error past `deadline` (a peer that
/// connected but says nothing). The socket's receive timeout is left as it was found.
fn read_interruptibly(
    py: Python<'_>,
    stream: &UnixStream,
    bytes: &mut [u8],
    deadline: Option<Instant>,
) -> PyResult<std::io::Result<()>> {
    let before = match stream.read_timeout() {
        Ok(before) => before,
        Err(error) => return Ok(Err(error)),
    };
    let mut filled = 0;
    let read = loop {
        if filled == bytes.len() {
            break Ok(());
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            break Err(std::io::Error::new(ErrorKind::TimedOut, "no answer before the timeout"));
        }
        let unread = &mut bytes[filled..];
        let got = py.detach(|| {
            stream.set_read_timeout(Some(SIGNAL_SLICE))?;
            let mut reader = stream;
            reader.read(unread)
        });
        match got {
            Ok(0) => break Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the peer closed the socket")),
            Ok(count) => filled += count,
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if let Err(signal) = py.check_signals() {
                    let _ = stream.set_read_timeout(before);
                    return Err(signal);
                }
            }
            Err(error) => break Err(error),
        }
    };
    let restored = stream.set_read_timeout(before);
    Ok(read.and(restored))
}

/// Sends `mine` (this side's frame description) and reads the peer's; an error naming both
/// unless they are the same. Both sides send before they read: each message fits the
/// socket's buffer, so neither waits for the other.
fn agree(
    py: Python<'_>,
    stream: &UnixStream,
    mine: &str,
    peer_role: &str,
    deadline: Option<Instant>,
) -> PyResult<()> {
    let exchanged = (|| -> PyResult<std::io::Result<Vec<u8>>> {
        let length = u32::try_from(mine.len()).map_err(|_| PyValueError::new_err("description too long"))?;
        let sent = py.detach(|| {
            let mut writer = stream;
            writer.write_all(&length.to_le_bytes())?;
            writer.write_all(mine.as_bytes())
        });
        if let Err(error) = sent {
            return Ok(Err(error));
        }
        let mut length = [0u8; 4];
        if let Err(error) = read_interruptibly(py, stream, &mut length, deadline)? {
            return Ok(Err(error));
        }
        let length = usize::try_from(u32::from_le_bytes(length)).unwrap_or(usize::MAX);
        if length > MAX_DESCRIPTION {
            return Ok(Err(std::io::Error::other(format!(
                "the {peer_role} sent a description of {length} bytes (at most {MAX_DESCRIPTION}): not a hetmem \
                 shared ring"
            ))));
        }
        let mut theirs = vec![0u8; length];
        Ok(read_interruptibly(py, stream, &mut theirs, deadline)?.map(|()| theirs))
    })()?;
    let theirs = exchanged.map_err(|error| {
        HetmemError::new_err(format!(
            "agreeing on the frames with the {peer_role}: {error}; is the other side a hetmem.SharedRing?"
        ))
    })?;
    let theirs = String::from_utf8_lossy(&theirs);
    if theirs != mine {
        return Err(PyValueError::new_err(format!(
            "the {peer_role}'s frames are {theirs}, this side's {mine}: declare the same shape and dtype on both \
             sides"
        )));
    }
    Ok(())
}

/// A slot's or a frame's bytes (`nbytes` at `host`) as a `Memory` that keeps the ring's
/// mapping. Only an address goes to Python, never a Rust slice: the peer process can write
/// these bytes, and NumPy's reads and writes of them are C's, as with any shared memory.
fn slot_memory(
    mapping: &Arc<dyn Any + Send + Sync>,
    host: *const u8,
    nbytes: usize,
    readonly: bool,
) -> Memory {
    let layout = Layout { host_ptr: host as usize, nbytes, device_ptr: None, readonly, kind: "shared" };
    Memory::new(Box::new(Arc::clone(mapping)), layout, &hetmem::Device::cpu())
}

/// `state`, locked without waiting: the lock is held while a call waits for the peer with
/// the interpreter let go, and a second thread waiting for it with the interpreter held would
/// never let the first one back in.
fn lock<'a, T>(state: &'a Mutex<T>, what: &str) -> PyResult<MutexGuard<'a, T>> {
    match state.try_lock() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => Err(HetmemError::new_err(format!(
            "the shared ring's {what} is in use by another thread (waiting for the peer): use each side from one \
             thread at a time"
        ))),
    }
}

/// The producer's ring and the slot being filled.
struct ProducerState {
    /// The slot being filled; it borrows `*ring`, so it is dropped first (`ProducerState::end`).
    writer: Option<SlotWriter<'static>>,
    /// The ring, boxed, owned here (from `Box::leak`); None once closed.
    ring: Option<NonNull<RingProducer>>,
    published: u64,
}

// SAFETY: the state owns the ring behind `ring` (the pointer is a leaked `Box`'s, freed only
// by `end`) and the writer that borrows it, and moves them together, so sending the state is
// sending a `RingProducer` and its `SlotWriter`, both `Send` (checked below); the `Mutex`
// around it keeps every use to one thread at a time.
unsafe impl Send for ProducerState {}

const _: () = {
    const fn sendable<T: Send>() {}
    sendable::<RingProducer>();
    sendable::<SlotWriter<'static>>();
};

impl ProducerState {
    /// Drops the slot being filled, then the ring: closed (`close`) or not (the consumer
    /// hears the stream broke off).
    fn end(&mut self, close: bool) {
        self.writer = None;
        if let Some(ring) = self.ring.take() {
            // SAFETY: `ring` came from `Box::leak` in `Producer::new`, is taken out of `self.ring`
            // here (so freed once), and no borrow of it remains: the writer, its one borrow,
            // was dropped just above.
            let ring = unsafe { Box::from_raw(ring.as_ptr()) };
            if close {
                ring.close();
            }
        }
    }
}

/// The producing side. See `hetmem.SharedRing`, the Python half, for the API.
#[pyclass(frozen, module = "hetmem._native", name = "SharedRingProducer")]
pub struct Producer {
    state: Mutex<ProducerState>,
    mapping: Arc<dyn Any + Send + Sync>,
    frame_bytes: usize,
    slots: usize,
    consumer_pid: u32,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRingProducer").field("consumer_pid", &self.consumer_pid).finish_non_exhaustive()
    }
}

impl Producer {
    fn state(&self) -> PyResult<MutexGuard<'_, ProducerState>> {
        lock(&self.state, "producer")
    }
}

#[pymethods]
impl Producer {
    /// A ring of `slots` slots of frames of `frame` (shape, type string, itemsize) on
    /// `device`, sent to the consumer at `peer` (a path to listen at, or a connected socket)
    /// once it came (within `timeout` seconds, None: for ever) and agreed on the frames.
    #[new]
    #[pyo3(signature = (device, peer, frame, slots, timeout))]
    fn new(
        py: Python<'_>,
        device: &Device,
        peer: &Bound<'_, PyAny>,
        frame: (Vec<Int>, String, Int),
        slots: Int,
        timeout: Option<f64>,
    ) -> PyResult<Producer> {
        let spec = spec(&frame.0, &frame.1, frame.2, "frame")?;
        let slots = slots.size("slots")?;
        let most = hetmem::pipeline::shared_ring::MAX_SHARED_SLOTS;
        if slots == 0 || slots > most {
            return Err(PyValueError::new_err(format!(
                "slots: {slots}; a shared ring has 1 to {most} slots (3 or 4 keep both processes busy)"
            )));
        }
        // What the slots will take, checked before anyone is waited for.
        crate::size::product([spec.nbytes, slots], "slots x frame bytes")?;
        let deadline = deadline(timeout)?;
        // `_restore` puts the caller's socket's settings back once the ring is set up.
        let (stream, _restore) = stream_for(py, peer, true, deadline)?;
        agree(py, &stream, &describe(&spec), "consumer", deadline)?;
        let (inner, nbytes, left) = (&device.inner, spec.nbytes, left_until(deadline));
        // Bounded by the timeout: a consumer that agreed on the frames, then says nothing more,
        // is a TimeoutError, not a wait for good.
        let ring = py
            .detach(|| RingProducer::create_within(inner, &stream, nbytes, slots, Default::default(), left))
            .map_err(|error| set_up_err(py, error))?;
        let mapping = ring.mapping();
        let (frame_bytes, slots, consumer_pid) = (ring.frame_bytes(), ring.slots(), ring.consumer_pid());
        let ring = NonNull::from(Box::leak(Box::new(ring)));
        let state = Mutex::new(ProducerState { writer: None, ring: Some(ring), published: 0 });
        Ok(Producer { state, mapping, frame_bytes, slots, consumer_pid })
    }

    /// Waits (the interpreter let go) for the next frame's slot and returns its index and
    /// its writable bytes; `PeerGone` when the consumer went.
    fn slot(&self, py: Python<'_>) -> PyResult<(u64, Memory)> {
        let mut state = self.state()?;
        if let Some(writer) = &state.writer {
            return Err(PyValueError::new_err(format!(
                "frame {}'s slot is still being filled: publish (or cancel) it before taking the next",
                writer.sequence()
            )));
        }
        let ring = state.ring.ok_or_else(|| {
            HetmemError::new_err("the shared ring was closed: it takes no more frames; make a new ring")
        })?;
        // Waited for in slices, so that Ctrl-C is heard while no slot comes free.
        let mut writer = loop {
            // SAFETY: `ring` came from `Box::leak` in `new` and is freed only by
            // `ProducerState::end`, after dropping the writer; the writer made here is the one
            // borrow of it (none is held: checked above, under the lock that every use of the
            // state takes; a pass that found no slot keeps none), and it lives in the same
            // state, which drops it first.
            let ring: &'static mut RingProducer = unsafe { &mut *ring.as_ptr() };
            match py
                .detach(|| ring.next_slot_within(Some(SIGNAL_SLICE)))
                .map_err(|error| ring_err(py, error))?
            {
                Some(writer) => break writer,
                None => py.check_signals()?,
            }
        };
        let sequence = writer.sequence();
        let memory = slot_memory(&self.mapping, writer.as_mut_ptr(), writer.len(), false);
        state.writer = Some(writer);
        Ok((sequence, memory))
    }

    /// Hands the slot being filled to the consumer; returns its frame's index.
    fn publish(&self) -> PyResult<u64> {
        let mut state = self.state()?;
        let writer = state
            .writer
            .take()
            .ok_or_else(|| PyValueError::new_err("no slot is being filled: take one with slot() first"))?;
        let sequence = writer.sequence();
        writer.publish();
        state.published += 1;
        Ok(sequence)
    }

    /// Gives the slot being filled back unused (its frame index comes again).
    fn cancel(&self) -> PyResult<()> {
        self.state()?.writer = None;
        Ok(())
    }

    /// Ends the stream: the consumer takes the frames published so far, then hears the end.
    /// A slot being filled is given back unused.
    fn close(&self) -> PyResult<()> {
        self.state()?.end(true);
        Ok(())
    }

    /// The bytes of one frame.
    #[getter]
    fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// The number of slots.
    #[getter]
    fn slots(&self) -> usize {
        self.slots
    }

    /// The consumer's process id.
    #[getter]
    fn peer_pid(&self) -> u32 {
        self.consumer_pid
    }

    /// Frames published so far.
    #[getter]
    fn published(&self) -> PyResult<u64> {
        Ok(self.state()?.published)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // Dropped without closing: the consumer hears that the stream broke off.
        self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner()).end(false);
    }
}

/// The consuming side. See `hetmem.SharedRing`, the Python half, for the API.
#[pyclass(frozen, module = "hetmem._native", name = "SharedRingConsumer")]
pub struct Consumer {
    /// None once closed.
    ring: Mutex<Option<RingConsumer>>,
    mapping: Arc<dyn Any + Send + Sync>,
    frame_bytes: usize,
    slots: usize,
    producer_pid: u32,
    ended: AtomicBool,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRingConsumer").field("producer_pid", &self.producer_pid).finish_non_exhaustive()
    }
}

#[pymethods]
impl Consumer {
    /// Connects to the producer at `peer` (a path it listens at, waited for up to `timeout`
    /// seconds, None: for ever; or a connected socket), agrees on the frames of `frame`
    /// (shape, type string, itemsize) and takes its ring, registered with `device`, if it has
    /// frames of that size and at most `max_slots` slots (checked before any of it is
    /// registered).
    #[new]
    #[pyo3(signature = (device, peer, frame, timeout, max_slots))]
    fn new(
        py: Python<'_>,
        device: &Device,
        peer: &Bound<'_, PyAny>,
        frame: (Vec<Int>, String, Int),
        timeout: Option<f64>,
        max_slots: Int,
    ) -> PyResult<Consumer> {
        let spec = spec(&frame.0, &frame.1, frame.2, "frame")?;
        let max_slots = max_slots.size("max_slots")?;
        let most = hetmem::pipeline::shared_ring::MAX_SHARED_SLOTS;
        if max_slots == 0 || max_slots > most {
            return Err(PyValueError::new_err(format!(
                "max_slots: {max_slots}; a shared ring has 1 to {most} slots"
            )));
        }
        let limits = ConsumerLimits { frame_bytes: Some(spec.nbytes), max_slots };
        let deadline = deadline(timeout)?;
        let (stream, _restore) = stream_for(py, peer, false, deadline)?;
        agree(py, &stream, &describe(&spec), "producer", deadline)?;
        let (inner, left) = (&device.inner, left_until(deadline));
        // Bounded by the timeout, as the producer's side.
        let ring = py
            .detach(|| RingConsumer::connect_limited(inner, &stream, Default::default(), left, limits))
            .map_err(|error| set_up_err(py, error))?;
        Ok(Consumer {
            mapping: ring.mapping(),
            frame_bytes: ring.frame_bytes(),
            slots: ring.slots(),
            producer_pid: ring.producer_pid(),
            ring: Mutex::new(Some(ring)),
            ended: AtomicBool::new(false),
        })
    }

    /// Waits (the interpreter let go) up to `timeout` seconds (None: for ever) for the next
    /// frame: its index, its read-only bytes and its hold (released, its slot freed, by
    /// `SharedFrameHold.release`); None at the end of the stream; `PeerGone` when the producer
    /// went without closing it; `TimeoutError` when no frame (nor the end) came in time, the
    /// ring as it was (call again to go on waiting).
    #[pyo3(signature = (timeout = None))]
    fn next_frame(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<(u64, Memory, FrameHold)>> {
        let deadline = deadline(timeout)?;
        let mut ring = lock(&self.ring, "consumer")?;
        let ring = ring.as_mut().ok_or_else(|| {
            HetmemError::new_err("the shared ring was closed on this side: make a new one to take frames")
        })?;
        // Waited for in slices, so that Ctrl-C is heard while no frame comes; the last slice
        // ends at the deadline.
        let next = loop {
            let slice = left_until(deadline).map_or(SIGNAL_SLICE, |left| left.min(SIGNAL_SLICE));
            match py.detach(|| ring.next_frame_within(Some(slice))).map_err(|error| ring_err(py, error))? {
                Some(next) => break next,
                None => {
                    py.check_signals()?;
                    if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                        return Err(PyTimeoutError::new_err(format!(
                            "no frame came from the producer (pid {}) within {} s; it may be slow or stuck: \
                             wait again, or give a longer timeout",
                            self.producer_pid,
                            timeout.unwrap_or_default()
                        )));
                    }
                }
            }
        };
        let Some(frame) = next else {
            self.ended.store(true, Ordering::Relaxed);
            return Ok(None);
        };
        let sequence = frame.sequence();
        let memory = slot_memory(&self.mapping, frame.as_ptr(), frame.len(), true);
        Ok(Some((sequence, memory, FrameHold { frame: Mutex::new(Some(frame)), sequence })))
    }

    /// Lets go of the ring: the producer hears that no more frames are taken. Frames still
    /// held stay readable until released.
    fn close(&self) -> PyResult<()> {
        *lock(&self.ring, "consumer")? = None;
        Ok(())
    }

    /// The bytes of one frame.
    #[getter]
    fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// The number of slots.
    #[getter]
    fn slots(&self) -> usize {
        self.slots
    }

    /// The producer's process id.
    #[getter]
    fn peer_pid(&self) -> u32 {
        self.producer_pid
    }

    /// Whether the producer closed the stream and every frame was taken.
    #[getter]
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// A frame the consumer holds; `release` frees its slot for the producer.
#[pyclass(frozen, module = "hetmem._native", name = "SharedFrameHold")]
pub struct FrameHold {
    frame: Mutex<Option<SharedFrame>>,
    sequence: u64,
}

impl std::fmt::Debug for FrameHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFrameHold").field("sequence", &self.sequence).finish_non_exhaustive()
    }
}

#[pymethods]
impl FrameHold {
    /// The frame's index in the stream.
    #[getter]
    fn index(&self) -> u64 {
        self.sequence
    }

    /// Frees the frame's slot for the producer (again: nothing).
    fn release(&self) {
        // Never waited on: only this method locks it, and it does not wait inside.
        *self.frame.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    }
}
