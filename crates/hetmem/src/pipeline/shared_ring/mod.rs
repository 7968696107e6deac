//! The cross-process frame ring: a producer process fills slots of shared memory, a consumer
//! process runs a stage on them (on the CPU, or by handing a slot's memory to the GPU, which
//! reads it in place), with no copy between the processes.
//!
//! # The protocol
//! The producer makes a sealed `memfd`: one header page ([`MAX_SHARED_SLOTS`] slot state
//! words, the sizes, a magic and a version) and the slots, each a whole number of pages so
//! each is registered with the GPU on its own. It sends the memfd over a connected Unix socket
//! (`SCM_RIGHTS`); the consumer checks the header against the segment's real size and the
//! layout it computes itself, registers the slots, and answers. From then on the socket
//! belongs to the ring: it carries the wake-ups ("a slot is full", "a slot is free", one byte
//! each), and the caller must neither read nor write it.
//!
//! Frame `k` uses slot `k % slots`. A slot goes round `free -> filling -> full -> consuming ->
//! free`; each step is taken only by the side that holds the slot, as a release store that
//! the other side reads with acquire, so the bytes of a frame are complete before the
//! consumer sees `full`, and the consumer has finished with them before the producer sees
//! `free`. Slot ownership is thus the hand-off rule across processes: a [`SlotWriter`] is the
//! producer's only way to a slot's bytes, a [`SharedFrame`] the consumer's, and neither exists
//! while the other side holds the slot. The consumer checks that each frame carries the index
//! it expects: frames arrive in order, none lost or delivered twice.
//!
//! A side that waits looks at the slot in a loop for a few tens of microseconds (a hand-over
//! then costs no scheduler wake-up), then polls its end of the socket together with the
//! peer's pidfd: a peer
//! that dies (even by `SIGKILL`) is noticed at once, and the survivor gets
//! [`Error::PeerGone`] naming its pid and what it was doing, after the frames it completed.
//! Nothing is left behind: the memfd has no name, and goes when the last process unmaps it.
//!
//! # Soundness: what safe code may see of a slot
//! Both processes map every slot writable, and nothing in one process can stop the other
//! writing a slot it does not hold. A Rust `&[u8]` or `&mut [u8]` of such memory would be
//! undefined behaviour the moment a peer broke the protocol, so the safe API never makes
//! one: a frame is read with [`SharedFrame::read_at`] or [`SharedFrame::to_vec`], a slot
//! written with [`SlotWriter::write_at`] or [`SlotWriter::fill`], all word-sized relaxed
//! atomic copies (a misbehaving peer can garble the bytes, never this process's memory
//! model); [`RingConsumer::run`] copies the frame out for the stage's CPU path. The zero-copy
//! paths stay: a [`SharedFrame`] is a buffer, shared with a queue so that a kernel reads it
//! in place (the GPU reading memory a CPU writes is no Rust reference), and
//! [`SlotWriter::as_mut_ptr`] / [`SharedFrame::as_ptr`] give the address to code that fills
//! or reads it itself. `SharedFrame::as_slice` and both `as_mut_slice` remain, `unsafe`,
//! for a caller who trusts the peer to run this protocol. A frame is not `HostVisible`, so
//! a shared lease of it gives no `host()` slice either.
//!
//! This was chosen over `unsafe` constructors (`connect`, `create`) that trust the peer
//! outright: those would make every use of the ring unsafe to keep one slice, where the GPU
//! path (the one the ring is for) needs no trust at all.
//!
//! # A peer that breaks the protocol
//! Whatever the peer writes into the header is checked before use (sizes at connect, each
//! state word and frame index when read), and the segment is a memfd sealed against shrinking
//! (a `/dev/shm` segment, which cannot be sealed, is refused): a hostile peer cannot make this
//! process read or write outside the segment or crash it with SIGBUS.
//!
//! Nor can it hang a wait. Wake-ups are bytes on the socket, sent and received with
//! `MSG_DONTWAIT`, never eventfds: an eventfd passed to the peer is one open file in both
//! processes, whose `O_NONBLOCK` the peer could clear (and whose counter it could drain, or
//! fill to its maximum) between this process's poll and its read or write, which would then
//! wait for good. Each end of a socket is a file of its own, out of the peer's reach. Every
//! wait also looks at the slot again at least every 100 ms, so a lost or stolen wake-up costs
//! latency, never a hang; [`RingProducer::next_slot_within`] and
//! [`RingConsumer::next_frame_within`] bound a wait outright.
//!
//! # Examples
//! Both sides in one process here, for brevity (`examples/two_processes.rs` uses two):
//! ```
//! use hetmem::Device;
//! use hetmem::pipeline::shared_ring::{RingConsumer, RingProducer};
//! use std::os::unix::net::UnixStream;
//!
//! let device = Device::open_best()?;
//! let (left, right) = UnixStream::pair().expect("a socket pair");
//! let consumer = std::thread::spawn(move || -> hetmem::Result<Vec<u8>> {
//!     let mut ring = RingConsumer::connect(&Device::open_best()?, &right, Default::default())?;
//!     let mut firsts = Vec::new();
//!     while let Some(frame) = ring.next_frame()? {
//!         let mut first = [0u8];
//!         frame.read_at(0, &mut first)?; // a copy: the producer's process can write the slot
//!         firsts.push(first[0]); // dropping the frame frees its slot
//!     }
//!     Ok(firsts)
//! });
//! let mut ring = RingProducer::create(&device, &left, 4096, 3, Default::default())?;
//! for k in 0..10u8 {
//!     let mut slot = ring.next_slot()?;
//!     slot.fill(k);
//!     slot.publish();
//! }
//! ring.close();
//! assert_eq!(consumer.join().unwrap()?, (0..10).collect::<Vec<u8>>());
//! # Ok::<(), hetmem::Error>(())
//! ```

mod header;
mod peer;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use header::MAX_SHARED_SLOTS;
use header::{CONSUMING, FILLING, FREE, FULL, HeaderWords, RingLayout};
use peer::Peer;

use crate::backend::Device;
use crate::backend::cpu::memory::page_size;
use crate::error::{Error, Result};
use crate::memory::fd_passing::{read_exact_until, recv_fds_until, send_fds, write_all};
use crate::memory::shared::{SharedSegment, Unsealed, round_up};
use crate::memory::{Buffer, HostBuf, Region, RegisterOptions, Sealed, WritableBuffer};
use crate::stage::Stage;

/// Opens the message that carries a ring's descriptors.
const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"HETMRING");
/// The consumer's answer: it took the ring.
const ACCEPTED: u8 = 1;
/// The consumer's answer: it refused the ring (its own error says why).
const REFUSED: u8 = 0;
/// `producer_closed` after [`RingProducer::close`]: the end of the stream.
const CLOSED: u32 = 1;
/// `producer_closed` when the producer was dropped without closing (an error, a panic).
const ABANDONED: u32 = 2;

/// What both sides of a ring hold.
struct RingShared {
    segment: Arc<SharedSegment>,
    layout: RingLayout,
    peer: Peer,
    /// Each slot's memory as a buffer registered in this process, while no frame holds it.
    slots: Mutex<Vec<Option<HostBuf<u8>>>>,
}

/// The header of `segment`.
///
/// # Errors
/// A segment smaller than the header.
fn header_of(segment: &SharedSegment) -> Result<&HeaderWords> {
    if segment.bytes() < size_of::<HeaderWords>() {
        return Err(Error::invalid(
            "shared ring size",
            format!("{} holds {} bytes: less than a ring's header", segment.description(), segment.bytes()),
        ));
    }
    // SAFETY: the segment's mapping starts on a page (aligned for the header's 8-byte words)
    // and holds at least the header's bytes (checked above) while `segment` lives, which the
    // returned reference borrows. Every field is an atomic, valid for any bits, and the other
    // process changes them only through atomic operations of its own (the same type on the
    // same machine); whatever it writes is checked before use (`HeaderWords::layout`, the
    // state words' values), never trusted as a size or an offset.
    Ok(unsafe { &*segment.start().as_ptr().cast::<HeaderWords>() })
}

impl RingShared {
    fn header(&self) -> &HeaderWords {
        header_of(&self.segment).expect("checked when the ring was set up")
    }

    /// Slot `slot`'s state.
    ///
    /// # Errors
    /// A value no side writes: the segment was written outside the protocol.
    fn state(&self, slot: usize) -> Result<u32> {
        match self.header().slot(slot).state.load(Ordering::Acquire) {
            state @ (FREE | FILLING | FULL | CONSUMING) => Ok(state),
            other => Err(Error::invalid(
                "shared ring slot",
                format!(
                    "slot {slot} of {} is in state {other}, which no hetmem ring writes: the segment was \
                     written outside the ring's protocol",
                    self.segment.description()
                ),
            )),
        }
    }

    fn set_state(&self, slot: usize, state: u32) {
        self.header().slot(slot).state.store(state, Ordering::Release);
    }

    fn buffers(&self) -> MutexGuard<'_, Vec<Option<HostBuf<u8>>>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take_buffer(&self, slot: usize) -> HostBuf<u8> {
        self.buffers()[slot].take().expect("a slot's buffer is taken by one frame at a time")
    }

    fn put_buffer(&self, slot: usize, buffer: HostBuf<u8>) {
        self.buffers()[slot] = Some(buffer);
    }
}

/// Registers each slot of `segment` with `device` as a buffer of its own.
fn register_slots(
    device: &Device,
    segment: &Arc<SharedSegment>,
    layout: &RingLayout,
    options: RegisterOptions,
) -> Result<Mutex<Vec<Option<HostBuf<u8>>>>> {
    let slots = (0..layout.slots)
        .map(|slot| {
            let start = segment.start().as_ptr().wrapping_add(layout.slot_offset(slot));
            let start = NonNull::new(start).expect("inside a mapping, so never null");
            // SAFETY: the slot's `frame_bytes` lie inside the mapping (the layout's total,
            // from checked arithmetic, is at most the segment's size: checked by both sides),
            // initialised as all shared memory is, and stay mapped while the owner, the
            // segment, lives; it moves into the registration. Slots are whole pages apart, so
            // no two registrations cover one page, and the header page is not registered.
            // Other processes touch a slot only while the protocol gives it to them, and then
            // this process holds no buffer of it (it is inside a SlotWriter or SharedFrame
            // only while this side owns the slot).
            unsafe {
                HostBuf::register_in_place(device, Arc::clone(segment), start, layout.frame_bytes, options)
            }
            .map(Some)
            .map_err(|failure| failure.error)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Mutex::new(slots))
}

/// The producing side of a shared ring. See the [module documentation](self).
pub struct RingProducer {
    shared: Arc<RingShared>,
    next: u64,
    closed: bool,
}

impl std::fmt::Debug for RingProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingProducer")
            .field("layout", &self.shared.layout)
            .field("consumer_pid", &self.shared.peer.pid())
            .field("next", &self.next)
            .finish()
    }
}

impl RingProducer {
    /// Makes a ring of `slots` slots of `frame_bytes` each, sends it to the consumer at the
    /// other end of `socket` (a connected Unix socket) and waits for it to take it. Each slot
    /// is registered with `device` as `options` say (nothing to register on the CPU backend).
    ///
    /// # Errors
    /// Zero or more than [`MAX_SHARED_SLOTS`] slots, an empty frame, a size that overflows;
    /// the consumer refusing the ring (its own error says why) or going away; the system or
    /// the driver failing to make, map or register the memory.
    pub fn create(
        device: &Device,
        socket: &UnixStream,
        frame_bytes: usize,
        slots: usize,
        options: RegisterOptions,
    ) -> Result<RingProducer> {
        Self::create_within(device, socket, frame_bytes, slots, options, None)
    }

    /// [`RingProducer::create`], waiting at most `timeout` (`None`: for ever) for the
    /// consumer's answer: a peer that connected but never runs its side of the set-up (a
    /// stuck, hostile or mistaken process) is an error then, not a wait for good. The
    /// consumer answers once it has registered every slot, so leave it time for that.
    ///
    /// # Errors
    /// As [`RingProducer::create`]; an [`Error::Io`] of kind `TimedOut` once `timeout` passes.
    pub fn create_within(
        device: &Device,
        socket: &UnixStream,
        frame_bytes: usize,
        slots: usize,
        options: RegisterOptions,
        timeout: Option<Duration>,
    ) -> Result<RingProducer> {
        let deadline = deadline_after(timeout);
        let layout = RingLayout::new(frame_bytes, slots, page_size())?;
        let segment = Arc::new(SharedSegment::memfd("hetmem-ring", layout.total_bytes, false)?);
        header_of(&segment)?.init(&layout, std::process::id());
        let mut hello = [0u8; 24];
        hello[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello[8..16].copy_from_slice(&u64::from(header::VERSION).to_le_bytes());
        hello[16..].copy_from_slice(&(layout.total_bytes as u64).to_le_bytes());
        send_fds(socket.as_fd(), &hello, &[segment.fd()])?;
        let mut answer = [REFUSED];
        let refused = |detail: &str| {
            Error::invalid("shared ring", format!("the consumer {detail}: its own error says why"))
        };
        read_exact_until(socket.as_fd(), &mut answer, deadline).map_err(|error| match error {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut => Error::Io {
                context: "waiting for the consumer to take the ring: it did not answer in time".into(),
                source,
            },
            _ => refused("went away before taking the ring"),
        })?;
        if answer[0] != ACCEPTED {
            return Err(refused("refused the ring"));
        }
        // Written by the consumer before its answer, which this process has read.
        let claimed = header_of(&segment)?.consumer_pid.load(Ordering::Acquire);
        let peer = Peer::new("consumer", socket, claimed)?;
        let slots = register_slots(device, &segment, &layout, options)?;
        let shared = Arc::new(RingShared { segment, layout, peer, slots });
        Ok(RingProducer { shared, next: 0, closed: false })
    }

    /// Waits for the next frame's slot to be free and gives it to the caller to fill.
    /// Dropping the writer without [`SlotWriter::publish`] gives the slot back unused.
    ///
    /// # Errors
    /// [`Error::PeerGone`] when the consumer exits, is killed, or closes the ring meanwhile;
    /// a corrupt state word.
    pub fn next_slot(&mut self) -> Result<SlotWriter<'_>> {
        Ok(self.next_slot_within(None)?.expect("no deadline: waits until a slot is free"))
    }

    /// [`RingProducer::next_slot`], waiting at most `timeout` (`None` for ever): `Ok(None)` when
    /// no slot came free in time (the ring is as it was; call again). For callers that must
    /// wake up now and then, as a binding checking for Ctrl-C.
    ///
    /// # Errors
    /// As [`RingProducer::next_slot`].
    pub fn next_slot_within(&mut self, timeout: Option<Duration>) -> Result<Option<SlotWriter<'_>>> {
        let deadline = deadline_after(timeout);
        let shared = &*self.shared;
        let slot = (self.next % shared.layout.slots as u64) as usize;
        let sequence = self.next;
        let free = shared.peer.wait(
            deadline,
            || {
                if shared.header().consumer_closed.load(Ordering::Acquire) != 0 {
                    return Err(shared
                        .peer
                        .gone(format!("it closed the ring; frame {sequence} has no taker")));
                }
                Ok((shared.state(slot)? == FREE).then_some(()))
            },
            || {
                Err(shared
                    .peer
                    .gone(format!("it exited or was killed while frame {sequence} waited for a free slot")))
            },
        )?;
        if free.is_none() {
            return Ok(None);
        }
        shared.set_state(slot, FILLING);
        let buffer = shared.take_buffer(slot);
        Ok(Some(SlotWriter { producer: self, slot, sequence, buffer: Some(buffer) }))
    }

    /// Ends the stream: the consumer takes the frames published so far, then hears the end
    /// (`None` from [`RingConsumer::next_frame`]). Dropping the producer without closing it
    /// tells the consumer the stream broke off ([`Error::PeerGone`]).
    pub fn close(mut self) {
        self.end(CLOSED);
    }

    fn end(&mut self, how: u32) {
        if !self.closed {
            self.closed = true;
            self.shared.header().producer_closed.store(how, Ordering::Release);
            self.shared.peer.signal();
        }
    }

    /// The bytes of one frame.
    pub fn frame_bytes(&self) -> usize {
        self.shared.layout.frame_bytes
    }

    /// How many slots the ring has.
    pub fn slots(&self) -> usize {
        self.shared.layout.slots
    }

    /// The consumer's process id.
    pub fn consumer_pid(&self) -> u32 {
        self.shared.peer.pid()
    }

    /// Keeps the ring's shared memory mapped in this process for as long as the handle lives,
    /// whatever becomes of the ring: for language bindings whose views of a slot cannot be
    /// revoked (a view kept past its frame then reads later frames' bytes, never unmapped
    /// memory).
    pub fn mapping(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::clone(&self.shared.segment) as Arc<dyn std::any::Any + Send + Sync>
    }
}

impl Drop for RingProducer {
    fn drop(&mut self) {
        self.end(ABANDONED);
    }
}

/// A free slot the producer fills: the next frame, until published.
pub struct SlotWriter<'a> {
    producer: &'a mut RingProducer,
    slot: usize,
    sequence: u64,
    buffer: Option<HostBuf<u8>>,
}

impl std::fmt::Debug for SlotWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotWriter").field("slot", &self.slot).field("sequence", &self.sequence).finish()
    }
}

impl SlotWriter<'_> {
    /// The frame's index in the stream, from 0.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The bytes of one frame.
    pub fn len(&self) -> usize {
        self.producer.shared.layout.frame_bytes
    }

    /// Always false: a frame holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `bytes` into the slot from byte `offset` on (what the previous frame in it
    /// left stays elsewhere), with word-sized atomic stores: sound whatever the peer does.
    ///
    /// # Errors
    /// `offset + bytes.len()` past the frame.
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let len = self.len();
        check_span("write", offset, bytes.len(), len)?;
        // SAFETY: the span lies inside the slot (checked), which is mapped while the writer
        // lives; atomic stores race nothing in this process's memory model.
        unsafe { copy_in(self.as_mut_ptr().add(offset), bytes) };
        Ok(())
    }

    /// Sets every byte of the frame to `byte` (atomic stores, as [`SlotWriter::write_at`]).
    pub fn fill(&mut self, byte: u8) {
        let len = self.len();
        // SAFETY: the whole slot, mapped while the writer lives.
        unsafe { fill_in(self.as_mut_ptr(), len, byte) };
    }

    /// The slot's first byte, for code that writes it itself (a GPU copy, a device that
    /// captures into it): [`SlotWriter::len`] bytes, valid while the writer lives.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buffer.as_ref().expect("held until publish or drop").region().host.expect("host memory").as_ptr()
    }

    /// The slot's bytes, exactly one frame, as a Rust slice: zero-copy, what the previous
    /// frame in it left until written.
    ///
    /// # Safety
    /// The consumer process must run this protocol (hetmem's ring, unmodified): it maps the
    /// slot writable, and a write of its while this slice lives would be a data race, which
    /// is undefined behaviour. Use [`SlotWriter::write_at`] or [`SlotWriter::fill`] where the
    /// peer is not trusted that far.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buffer.as_mut().expect("held until publish or drop").as_mut_slice()
    }

    /// Hands the frame to the consumer.
    pub fn publish(mut self) {
        let shared = &*self.producer.shared;
        let buffer = self.buffer.take().expect("held until publish or drop");
        shared.put_buffer(self.slot, buffer);
        shared.header().slot(self.slot).sequence.store(self.sequence, Ordering::Relaxed);
        // The release store orders the frame's bytes and its sequence before the state.
        shared.set_state(self.slot, FULL);
        shared.peer.signal();
        self.producer.next += 1;
    }
}

impl Drop for SlotWriter<'_> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            let shared = &*self.producer.shared;
            shared.put_buffer(self.slot, buffer);
            shared.set_state(self.slot, FREE);
        }
    }
}

/// The consuming side of a shared ring. See the [module documentation](self).
pub struct RingConsumer {
    shared: Arc<RingShared>,
    next: u64,
    ended: bool,
    /// [`RingConsumer::run`]'s copy of a frame, kept between frames.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RingConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingConsumer")
            .field("layout", &self.shared.layout)
            .field("producer_pid", &self.shared.peer.pid())
            .field("next", &self.next)
            .finish()
    }
}

/// What a consumer accepts of the ring a producer offers, checked before any of it is mapped
/// for frames or registered with a device: a producer is another process, and without limits
/// it could offer [`MAX_SHARED_SLOTS`] slots of any size, which registering would pin (fault
/// in) whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerLimits {
    /// The size of a frame the consumer expects (`None`: any).
    pub frame_bytes: Option<usize>,
    /// The most slots it takes (1 to [`MAX_SHARED_SLOTS`]).
    pub max_slots: usize,
}

impl Default for ConsumerLimits {
    /// Any frame size, up to [`MAX_SHARED_SLOTS`] slots.
    fn default() -> ConsumerLimits {
        ConsumerLimits { frame_bytes: None, max_slots: MAX_SHARED_SLOTS }
    }
}

impl ConsumerLimits {
    /// Refuses a ring of `slots` slots of `frame_bytes` that these limits do not allow.
    fn check(&self, frame_bytes: usize, slots: usize) -> Result<()> {
        if !(1..=MAX_SHARED_SLOTS).contains(&self.max_slots) {
            return Err(Error::invalid(
                "shared ring limits",
                format!("max_slots {}: give 1 to {MAX_SHARED_SLOTS}", self.max_slots),
            ));
        }
        if let Some(expected) = self.frame_bytes.filter(|&expected| expected != frame_bytes) {
            return Err(Error::invalid(
                "shared ring",
                format!(
                    "the producer offers frames of {frame_bytes} bytes where this consumer expects {expected}: \
                     both sides must agree on the frame"
                ),
            ));
        }
        if slots > self.max_slots {
            return Err(Error::invalid(
                "shared ring",
                format!(
                    "the producer offers {slots} slots of {frame_bytes} bytes; this consumer takes at most {}: \
                     make the ring with fewer slots, or allow more",
                    self.max_slots
                ),
            ));
        }
        Ok(())
    }
}

impl RingConsumer {
    /// Takes the ring the producer at the other end of `socket` sends
    /// ([`RingProducer::create`]), after checking its header against the segment, and
    /// registers each slot with `device` as `options` say. A ring refused is refused to the
    /// producer too, so it does not wait.
    ///
    /// # Errors
    /// A message that is not a hetmem ring's, another protocol version, a bad header (a wrong
    /// magic, sizes that disagree), a segment smaller than its header says (named in the
    /// error: refused, never mapped past its end), descriptors of the wrong kind; the system
    /// or the driver failing to map or register the memory.
    pub fn connect(device: &Device, socket: &UnixStream, options: RegisterOptions) -> Result<RingConsumer> {
        Self::connect_within(device, socket, options, None)
    }

    /// [`RingConsumer::connect`], waiting at most `timeout` (`None`: for ever) for the
    /// producer's ring: a peer that connected but never sends it (or stops half-way through
    /// the message) is an error then, not a wait for good.
    ///
    /// # Errors
    /// As [`RingConsumer::connect`]; an [`Error::Io`] of kind `TimedOut` once `timeout` passes.
    pub fn connect_within(
        device: &Device,
        socket: &UnixStream,
        options: RegisterOptions,
        timeout: Option<Duration>,
    ) -> Result<RingConsumer> {
        Self::connect_limited(device, socket, options, timeout, ConsumerLimits::default())
    }

    /// [`RingConsumer::connect_within`], taking only a ring that `limits` allow (its frame
    /// size, its number of slots), checked before any of it is registered; a ring refused is
    /// refused to the producer too.
    ///
    /// # Errors
    /// As [`RingConsumer::connect_within`]; a ring outside `limits`, or limits that are not
    /// (`max_slots` outside 1 to [`MAX_SHARED_SLOTS`]).
    pub fn connect_limited(
        device: &Device,
        socket: &UnixStream,
        options: RegisterOptions,
        timeout: Option<Duration>,
        limits: ConsumerLimits,
    ) -> Result<RingConsumer> {
        let mut hello = [0u8; 24];
        let fds = recv_fds_until(socket.as_fd(), &mut hello, deadline_after(timeout))?;
        match Self::accept(device, socket, &hello, fds, options, limits) {
            Ok(consumer) => {
                write_all(socket.as_fd(), &[ACCEPTED])?;
                Ok(consumer)
            }
            Err(error) => {
                // The producer waits for an answer; if it is gone there is nobody to tell.
                let _ = write_all(socket.as_fd(), &[REFUSED]);
                Err(error)
            }
        }
    }

    fn accept(
        device: &Device,
        socket: &UnixStream,
        hello: &[u8; 24],
        fds: Vec<OwnedFd>,
        options: RegisterOptions,
        limits: ConsumerLimits,
    ) -> Result<RingConsumer> {
        let word = |at: usize| u64::from_le_bytes(hello[at..at + 8].try_into().expect("8 bytes"));
        if word(0) != HELLO_MAGIC || fds.len() != 1 {
            return Err(Error::invalid(
                "shared ring message",
                format!(
                    "{} descriptors and no hetmem ring header: the peer is not a RingProducer",
                    fds.len()
                ),
            ));
        }
        if word(8) != u64::from(header::VERSION) {
            return Err(Error::invalid(
                "shared ring message",
                format!(
                    "the producer speaks protocol version {}, this hetmem {}: build both with the same hetmem",
                    word(8),
                    header::VERSION
                ),
            ));
        }
        let [memfd]: [OwnedFd; 1] = fds.try_into().expect("checked: one descriptor");
        let header_bytes = round_up("shared ring header", size_of::<HeaderWords>(), page_size())?;
        // Sealed, whatever its kind: nothing the producer does may shrink it under the frames
        // this safe API hands out (a named segment could be truncated: SIGBUS on a read).
        let segment = Arc::new(SharedSegment::from_fd(memfd, header_bytes, Unsealed::Refused)?);
        let header = header_of(&segment)?;
        let layout = header.layout(page_size(), segment.bytes(), segment.description())?;
        limits.check(layout.frame_bytes, layout.slots)?;
        header.consumer_pid.store(std::process::id(), Ordering::Release);
        let claimed = header.producer_pid.load(Ordering::Acquire);
        let peer = Peer::new("producer", socket, claimed)?;
        let slots = register_slots(device, &segment, &layout, options)?;
        let shared = Arc::new(RingShared { segment, layout, peer, slots });
        Ok(RingConsumer { shared, next: 0, ended: false, scratch: Vec::new() })
    }

    /// Waits for the next frame; `None` once the producer has closed the stream and every
    /// frame it published has been taken. Frames come in order; dropping one frees its slot
    /// (several may be held at once, up to the ring's slots, and dropped in any order).
    ///
    /// # Errors
    /// [`Error::PeerGone`] when the producer exits, is killed or drops the ring without
    /// closing it (after the frames it completed); a frame out of order or a corrupt state
    /// word (the segment written outside the protocol).
    pub fn next_frame(&mut self) -> Result<Option<SharedFrame>> {
        Ok(self.next_frame_within(None)?.expect("no deadline: waits until a frame or the end comes"))
    }

    /// [`RingConsumer::next_frame`], waiting at most `timeout` (`None` for ever): the outer
    /// `None` when neither a frame nor the end came in time (the ring is as it was; call
    /// again). For callers that must wake up now and then, as a binding checking for Ctrl-C.
    ///
    /// # Errors
    /// As [`RingConsumer::next_frame`].
    pub fn next_frame_within(&mut self, timeout: Option<Duration>) -> Result<Option<Option<SharedFrame>>> {
        let deadline = deadline_after(timeout);
        if self.ended {
            return Ok(Some(None));
        }
        let shared = Arc::clone(&self.shared);
        let slot = (self.next % shared.layout.slots as u64) as usize;
        let sequence = self.next;
        if shared.buffers()[slot].is_none() {
            // Waiting would never end: the slot frees only when this process drops that frame.
            return Err(Error::invalid(
                "shared ring frame",
                format!(
                    "frame {sequence} needs slot {slot}, which this process still holds with frame {}: \
                     all {} slots are held here; drop a frame before taking the next",
                    sequence - shared.layout.slots as u64,
                    shared.layout.slots
                ),
            ));
        }
        let Some(full) = shared.peer.wait(
            deadline,
            || look(&shared, slot, sequence),
            || {
                Err(shared.peer.gone(match shared.state(slot) {
                    Ok(FILLING) => format!("it exited or was killed while writing frame {sequence}"),
                    _ => format!("it exited or was killed after {sequence} frames, without closing the ring"),
                }))
            },
        )?
        else {
            return Ok(None);
        };
        if !full {
            self.ended = true;
            return Ok(Some(None));
        }
        shared.set_state(slot, CONSUMING);
        let buffer = shared.take_buffer(slot);
        self.next += 1;
        Ok(Some(Some(SharedFrame { shared, slot, sequence, buffer: Some(buffer) })))
    }

    /// Takes the next frame and runs `stage`'s CPU path on it, writing `outputs` (one buffer
    /// per output of the stage, each exactly its layout's size); the frame's slot is freed
    /// when it returns. Returns the frame's index, or `None` at the end of the stream. To run
    /// a frame on the GPU, take it with [`RingConsumer::next_frame`] and share it with a
    /// queue: it is a buffer, read in place.
    ///
    /// # Errors
    /// A stage whose one input is not a frame of this ring, outputs of the wrong number or
    /// sizes, a stage without a CPU path; [`RingConsumer::next_frame`]'s errors; the stage's,
    /// as [`Error::FrameFailed`] with the frame's index.
    pub fn run<S: Stage>(&mut self, stage: &S, outputs: &mut [&mut [u8]]) -> Result<Option<u64>> {
        let frame_bytes = self.shared.layout.frame_bytes;
        if stage.inputs().len() != 1 || stage.inputs()[0].bytes() != frame_bytes {
            return Err(Error::invalid(
                "shared ring stage",
                format!(
                    "the stage takes {} inputs ({:?} bytes); a shared ring gives one frame of {frame_bytes} bytes",
                    stage.inputs().len(),
                    stage.inputs().iter().map(|layout| layout.bytes()).collect::<Vec<_>>()
                ),
            ));
        }
        let wanted: Vec<usize> = stage.outputs().iter().map(|layout| layout.bytes()).collect();
        let given: Vec<usize> = outputs.iter().map(|output| output.len()).collect();
        if wanted != given {
            return Err(Error::invalid(
                "shared ring stage",
                format!("the stage writes outputs of {wanted:?} bytes; given {given:?}"),
            ));
        }
        if !stage.runs().cpu {
            return Err(Error::invalid(
                "shared ring stage",
                "the stage has no CPU path: take the frame with next_frame and share it with a GPU queue",
            ));
        }
        let Some(frame) = self.next_frame()? else { return Ok(None) };
        let sequence = frame.sequence();
        // Copied out first: a stage takes a `&[u8]`, which may not point into memory the
        // producer can write (the module's "Soundness" says why).
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.resize(frame_bytes, 0);
        frame.read_at(0, &mut bytes).expect("the whole frame");
        drop(frame);
        let ran = stage.run_cpu(&[&bytes], outputs);
        self.scratch = bytes;
        ran.map_err(|error| Error::FrameFailed { index: sequence, source: Box::new(error) })?;
        Ok(Some(sequence))
    }

    /// The bytes of one frame.
    pub fn frame_bytes(&self) -> usize {
        self.shared.layout.frame_bytes
    }

    /// How many slots the ring has.
    pub fn slots(&self) -> usize {
        self.shared.layout.slots
    }

    /// The producer's process id.
    pub fn producer_pid(&self) -> u32 {
        self.shared.peer.pid()
    }

    /// Keeps the ring's shared memory mapped in this process for as long as the handle lives,
    /// whatever becomes of the ring: for language bindings whose views of a slot cannot be
    /// revoked (a view kept past its frame then reads later frames' bytes, never unmapped
    /// memory).
    pub fn mapping(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::clone(&self.shared.segment) as Arc<dyn std::any::Any + Send + Sync>
    }
}

/// Checks that `len` bytes from `offset` lie inside a frame of `frame_bytes`.
fn check_span(what: &str, offset: usize, len: usize, frame_bytes: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= frame_bytes => Ok(()),
        _ => Err(Error::invalid(
            "shared ring frame",
            format!("a {what} of {len} bytes at offset {offset} passes the frame's {frame_bytes} bytes"),
        )),
    }
}

/// Copies `out.len()` bytes from `from` with relaxed atomic loads, eight bytes at a time where
/// aligned: bytes another process may write meanwhile are read without a data race.
///
/// # Safety
/// `from` is valid for reads of `out.len()` bytes for the call.
unsafe fn copy_out(from: *const u8, out: &mut [u8]) {
    let mut at = 0;
    while at < out.len() {
        // SAFETY: `at < out.len()`: inside the span the caller vouches for; atomics of the
        // right alignment (checked for the word), which the other side also only stores to.
        unsafe {
            let here = from.add(at);
            if here.cast::<u64>().is_aligned() && out.len() - at >= 8 {
                let word = AtomicU64::from_ptr(here.cast::<u64>().cast_mut()).load(Ordering::Relaxed);
                out[at..at + 8].copy_from_slice(&word.to_ne_bytes());
                at += 8;
            } else {
                out[at] = AtomicU8::from_ptr(here.cast_mut()).load(Ordering::Relaxed);
                at += 1;
            }
        }
    }
}

/// Copies `bytes` to `to` with relaxed atomic stores, as [`copy_out`] reads.
///
/// # Safety
/// `to` is valid for writes of `bytes.len()` bytes for the call.
unsafe fn copy_in(to: *mut u8, bytes: &[u8]) {
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: as in `copy_out`.
        unsafe {
            let here = to.add(at);
            if here.cast::<u64>().is_aligned() && bytes.len() - at >= 8 {
                let word = u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
                AtomicU64::from_ptr(here.cast::<u64>()).store(word, Ordering::Relaxed);
                at += 8;
            } else {
                AtomicU8::from_ptr(here).store(bytes[at], Ordering::Relaxed);
                at += 1;
            }
        }
    }
}

/// Sets `len` bytes at `to` to `byte`, with atomic stores as [`copy_in`].
///
/// # Safety
/// `to` is valid for writes of `len` bytes for the call.
unsafe fn fill_in(to: *mut u8, len: usize, byte: u8) {
    let block = [byte; 4096];
    let mut at = 0;
    while at < len {
        let take = (len - at).min(block.len());
        // SAFETY: `at + take <= len`, inside the caller's span.
        unsafe { copy_in(to.add(at), &block[..take]) };
        at += take;
    }
}

/// The instant `timeout` from now; `None` (for ever) for none or one past what the clock holds.
fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|timeout| Instant::now().checked_add(timeout))
}

/// Whether frame `sequence` is full in `slot` (`Some(true)`), the stream has ended before it
/// (`Some(false)`), or neither yet (`None`).
fn look(shared: &RingShared, slot: usize, sequence: u64) -> Result<Option<bool>> {
    let full = |shared: &RingShared| -> Result<bool> {
        if shared.state(slot)? != FULL {
            return Ok(false);
        }
        // Read after the acquire load of the state, which the producer released after it.
        let found = shared.header().slot(slot).sequence.load(Ordering::Relaxed);
        if found != sequence {
            return Err(Error::invalid(
                "shared ring frame",
                format!(
                    "slot {slot} holds frame {found} where frame {sequence} belongs: the producer skipped \
                     or repeated a frame (the segment was written outside the ring's protocol)"
                ),
            ));
        }
        Ok(true)
    };
    if full(shared)? {
        return Ok(Some(true));
    }
    match shared.header().producer_closed.load(Ordering::Acquire) {
        0 => Ok(None),
        // Closed after its last publish: a frame not full now never will be.
        CLOSED => Ok(Some(full(shared)?)),
        _ => {
            Err(shared.peer.gone(format!("it dropped the ring without closing it, after {sequence} frames")))
        }
    }
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        self.shared.header().consumer_closed.store(1, Ordering::Release);
        self.shared.peer.signal();
    }
}

/// A frame the consumer holds: its slot's memory, registered in this process, a buffer
/// like any other (share it with a [`crate::Queue`] and a kernel reads it in place, or lend
/// it to have the frame processed in place). Dropping it frees the slot for the producer.
pub struct SharedFrame {
    shared: Arc<RingShared>,
    slot: usize,
    sequence: u64,
    buffer: Option<HostBuf<u8>>,
}

impl std::fmt::Debug for SharedFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFrame").field("slot", &self.slot).field("sequence", &self.sequence).finish()
    }
}

impl SharedFrame {
    /// The frame's index in the stream, from 0.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    fn buffer(&self) -> &HostBuf<u8> {
        self.buffer.as_ref().expect("held until dropped")
    }

    /// The bytes of one frame.
    pub fn len(&self) -> usize {
        self.shared.layout.frame_bytes
    }

    /// Always false: a frame holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the frame's bytes from byte `offset` on into `out` (all of it), with word-sized
    /// atomic loads: sound whatever the peer does (a peer that writes meanwhile, against the
    /// protocol, can only make the copy hold its bytes).
    ///
    /// # Errors
    /// `offset + out.len()` past the frame.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_span("read", offset, out.len(), self.len())?;
        // SAFETY: the span lies inside the slot (checked), mapped while the frame lives.
        unsafe { copy_out(self.as_ptr().add(offset), out) };
        Ok(())
    }

    /// The frame's bytes, copied out ([`SharedFrame::read_at`]).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; self.len()];
        self.read_at(0, &mut bytes).expect("the whole frame");
        bytes
    }

    /// The frame's first byte, for code that reads it itself: [`SharedFrame::len`] bytes,
    /// valid while the frame lives. The GPU path needs none of this: share the frame with a
    /// queue and a kernel reads it in place.
    pub fn as_ptr(&self) -> *const u8 {
        self.buffer().region().host.expect("host memory").as_ptr().cast_const()
    }

    /// The frame's bytes as a Rust slice: zero-copy.
    ///
    /// # Safety
    /// The producer process must run this protocol (hetmem's ring, unmodified): it maps the
    /// slot writable, and a write of its while this slice lives would be a data race, which
    /// is undefined behaviour. Use [`SharedFrame::read_at`] or [`SharedFrame::to_vec`] where
    /// the peer is not trusted that far.
    pub unsafe fn as_slice(&self) -> &[u8] {
        self.buffer().as_slice()
    }

    /// The frame's bytes, to change in place (the consumer holds the slot).
    ///
    /// # Safety
    /// As [`SharedFrame::as_slice`].
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buffer.as_mut().expect("held until dropped").as_mut_slice()
    }

    /// Whether kernels can address it directly (zero-copy).
    pub fn is_mapped(&self) -> bool {
        self.buffer().is_mapped()
    }
}

impl Drop for SharedFrame {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.shared.put_buffer(self.slot, buffer);
            // The release store orders this process's reads (and GPU work, already waited
            // for by the lease that held the frame) before the producer's next writes.
            self.shared.set_state(self.slot, FREE);
            self.shared.peer.signal();
        }
    }
}

impl Sealed for SharedFrame {
    fn region(&self) -> Region {
        self.buffer().region()
    }
}

impl Buffer for SharedFrame {
    type Elem = u8;

    fn len(&self) -> usize {
        self.buffer().len()
    }
}

// Not `HostVisible`: that would hand safe code a `&[u8]` (`Shared::host`) of memory the
// producer can write. The GPU reads it in place all the same.
impl WritableBuffer for SharedFrame {}

#[cfg(test)]
mod tests;
