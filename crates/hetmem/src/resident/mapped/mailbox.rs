//! [`Mailbox`]: fixed-size messages with sequence numbers, from one sender to one receiver,
//! through mapped memory.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytemuck::Pod;

use super::wait;
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::memory::{LINE_WORDS, MappedKind, MappedView, MappedWords};

/// The most slots a mailbox has.
pub const MAX_DEPTH: usize = 4096;
/// The largest message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024;

// The layout in 32-bit words, as in kernels/hetmem/mapped.cuh. Line 0 holds constants the CPU
// writes before anyone else sees the memory; line 1 the receiver's count of messages taken;
// the slots follow, each on lines of its own: its sequence word, then the message's words.
const DEPTH: usize = 0;
const MESSAGE_WORDS: usize = 1;
const SLOT_WORDS: usize = 2;
const TAKEN: usize = LINE_WORDS;
const SLOTS: usize = 2 * LINE_WORDS;

/// A ring of `depth` slots for messages of type `T` in mapped memory, from one sender to one
/// receiver, either of which may be a kernel: the CPU takes its end with [`Mailbox::sender`]
/// or [`Mailbox::receiver`] (each once), and a kernel is given the mailbox's address
/// ([`KernelArgs::mapped`](crate::handoff::KernelArgs::mapped)) and plays the other end with
/// `hetmem_mailbox_send` or `hetmem_mailbox_recv` of `mapped.cuh`. On the CPU backend both ends
/// are CPU threads.
///
/// Message `k` (from 1) goes in slot `(k - 1) % depth`: the sender waits until the receiver
/// has taken message `k - depth`, writes the message's words, then releases `k` into the
/// slot's sequence word; the receiver waits to acquire `k` there, reads the words, then
/// releases `k` as its count taken. No read-modify-write crosses the link (see [the
/// module](super) for the ordering contract). The messages are plain data (`T: Pod`, a whole
/// number of 32-bit words, at most [`MAX_MESSAGE_BYTES`]), copied in and out word by word.
///
/// # Examples
/// ```
/// use hetmem::Device;
/// use hetmem::resident::Mailbox;
/// use std::time::Duration;
///
/// let mailbox = Mailbox::<[u32; 4]>::new(&Device::open_best()?, 8)?;
/// let (mut tx, mut rx) = (mailbox.sender()?, mailbox.receiver()?);
/// tx.send(&[1, 2, 3, 4], Duration::from_secs(1))?;
/// assert_eq!(rx.recv(Duration::from_secs(1))?, [1, 2, 3, 4]);
/// assert_eq!(rx.try_recv(), None);
/// # Ok::<(), hetmem::Error>(())
/// ```
pub struct Mailbox<T> {
    shared: Arc<Shared>,
    message: PhantomData<fn(T) -> T>,
}

struct Shared {
    words: MappedWords,
    depth: usize,
    message_words: usize,
    slot_words: usize,
    sender_taken: AtomicBool,
    receiver_taken: AtomicBool,
}

impl<T> std::fmt::Debug for Mailbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("depth", &self.shared.depth)
            .field("message_bytes", &(self.shared.message_words * 4))
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn slot(&self, seq: u32) -> &[AtomicU32] {
        // depth is a power of two ≤ 2^12, so it divides 2^32 and slots stay in step across the
        // sequence numbers' wrap.
        let index = seq.wrapping_sub(1) as usize % self.depth;
        let base = SLOTS + index * self.slot_words;
        &self.words.words()[base..base + 1 + self.message_words]
    }

    fn taken(&self) -> &AtomicU32 {
        &self.words.words()[TAKEN]
    }
}

impl<T: Pod> Mailbox<T> {
    /// A mailbox of `depth` slots on `device`, empty.
    ///
    /// # Errors
    /// A depth that is not a power of two from 1 to [`MAX_DEPTH`]; a message type that is not
    /// a whole number of 32-bit words from 4 to [`MAX_MESSAGE_BYTES`] bytes; a GPU that cannot
    /// map host memory; the driver's error.
    pub fn new(device: &Device, depth: usize) -> Result<Mailbox<T>> {
        if !(depth.is_power_of_two() && depth <= MAX_DEPTH) {
            return Err(Error::invalid(
                "mailbox depth",
                format!("{depth}: give a power of two from 1 to {MAX_DEPTH} (slots must divide 2^32)"),
            ));
        }
        let bytes = size_of::<T>();
        if bytes == 0 || !bytes.is_multiple_of(4) || bytes > MAX_MESSAGE_BYTES {
            return Err(Error::invalid(
                "mailbox message",
                format!(
                    "{} is {bytes} bytes: messages are whole 32-bit words, 4 to {MAX_MESSAGE_BYTES} \
                     bytes (pad the type)",
                    std::any::type_name::<T>()
                ),
            ));
        }
        let message_words = bytes / 4;
        let slot_words = (1 + message_words).div_ceil(LINE_WORDS) * LINE_WORDS;
        let words = depth
            .checked_mul(slot_words)
            .and_then(|slots| slots.checked_add(SLOTS))
            .ok_or_else(|| Error::invalid("mailbox size", "depth times slot size overflows"))?;
        let memory = MappedWords::zeroed(device, words)?;
        // Written before any end or kernel exists, so these plain stores are seen by all.
        for (index, value) in [(DEPTH, depth), (MESSAGE_WORDS, message_words), (SLOT_WORDS, slot_words)] {
            memory.words()[index].store(value as u32, Ordering::Release);
        }
        let shared = Shared {
            words: memory,
            depth,
            message_words,
            slot_words,
            sender_taken: AtomicBool::new(false),
            receiver_taken: AtomicBool::new(false),
        };
        Ok(Mailbox { shared: Arc::new(shared), message: PhantomData })
    }

    /// Slots: messages sent and not yet taken, at most.
    pub fn depth(&self) -> usize {
        self.shared.depth
    }

    /// The CPU's sending end; a kernel then receives.
    ///
    /// # Errors
    /// [`Error::StillHeld`] when the sender was taken before (a mailbox has one).
    pub fn sender(&self) -> Result<MailboxSender<T>> {
        take(&self.shared.sender_taken, "a mailbox's sender")?;
        Ok(MailboxSender { shared: Arc::clone(&self.shared), next: 1, message: PhantomData })
    }

    /// The CPU's receiving end; a kernel then sends.
    ///
    /// # Errors
    /// [`Error::StillHeld`] when the receiver was taken before (a mailbox has one).
    pub fn receiver(&self) -> Result<MailboxReceiver<T>> {
        take(&self.shared.receiver_taken, "a mailbox's receiver")?;
        Ok(MailboxReceiver { shared: Arc::clone(&self.shared), next: 1, message: PhantomData })
    }
}

fn take(taken: &AtomicBool, what: &'static str) -> Result<()> {
    if taken.swap(true, Ordering::AcqRel) {
        return Err(Error::StillHeld {
            what,
            remedy: "a mailbox has one sender and one receiver: pass the one taken first".into(),
        });
    }
    Ok(())
}

impl<T> MappedView for Mailbox<T> {
    fn memory(&self) -> &MappedWords {
        &self.shared.words
    }

    fn kind(&self) -> MappedKind {
        MappedKind::Mailbox { message_bytes: self.shared.message_words * 4 }
    }
}

/// The CPU's sending end of a [`Mailbox`].
pub struct MailboxSender<T> {
    shared: Arc<Shared>,
    /// The next message's sequence number.
    next: u32,
    message: PhantomData<fn(T) -> T>,
}

impl<T: Pod> MailboxSender<T> {
    /// Sends `message`, waiting while every slot holds a message not yet taken.
    ///
    /// # Errors
    /// [`Error::MappedWaitTimeout`] when no slot frees within `timeout` (the receiver has
    /// stopped taking messages); nothing is sent then.
    pub fn send(&mut self, message: &T, timeout: Duration) -> Result<()> {
        wait::until("a free mailbox slot (the receiver taking a message)", timeout, || {
            self.has_room().then_some(())
        })?;
        self.write(message);
        Ok(())
    }

    /// Sends `message` if a slot is free; `false` (nothing sent) when all are full.
    pub fn try_send(&mut self, message: &T) -> bool {
        if !self.has_room() {
            return false;
        }
        self.write(message);
        true
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u32 {
        self.next.wrapping_sub(1)
    }

    fn has_room(&self) -> bool {
        let taken = self.shared.taken().load(Ordering::Acquire);
        // Message `next` reuses the slot of message `next - depth`, which must have been taken.
        (self.next.wrapping_sub(taken) as usize) <= self.shared.depth
    }

    fn write(&mut self, message: &T) {
        let slot = self.shared.slot(self.next);
        for (word, bytes) in slot[1..].iter().zip(bytemuck::bytes_of(message).chunks_exact(4)) {
            word.store(u32::from_ne_bytes(bytes.try_into().expect("chunks of 4")), Ordering::Relaxed);
        }
        slot[0].store(self.next, Ordering::Release);
        self.next = self.next.wrapping_add(1);
    }
}

/// The CPU's receiving end of a [`Mailbox`].
pub struct MailboxReceiver<T> {
    shared: Arc<Shared>,
    /// The next message's sequence number.
    next: u32,
    message: PhantomData<fn(T) -> T>,
}

impl<T: Pod> MailboxReceiver<T> {
    /// The next message, waiting for it.
    ///
    /// # Errors
    /// [`Error::MappedWaitTimeout`] when none arrives within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<T> {
        wait::until("a mailbox message", timeout, || self.try_recv())
    }

    /// The next message, if it has arrived.
    pub fn try_recv(&mut self) -> Option<T> {
        let slot = self.shared.slot(self.next);
        if slot[0].load(Ordering::Acquire) != self.next {
            return None;
        }
        let mut message = T::zeroed();
        for (bytes, word) in bytemuck::bytes_of_mut(&mut message).chunks_exact_mut(4).zip(&slot[1..]) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        // The words are read: the sender may reuse the slot.
        self.shared.taken().store(self.next, Ordering::Release);
        self.next = self.next.wrapping_add(1);
        Some(message)
    }

    /// Messages received so far.
    pub fn received(&self) -> u32 {
        self.next.wrapping_sub(1)
    }
}

impl<T> std::fmt::Debug for MailboxSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailboxSender").field("next", &self.next).finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for MailboxReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailboxReceiver").field("next", &self.next).finish_non_exhaustive()
    }
}
