//! The shared ring's header, the first page of its segment: what both processes check before
//! they trust the segment (magic, version, sizes), and the per-slot state words they hand
//! the slots over with.
//!
//! Every word is a CPU-side atomic, read and written with acquire and release only by the two
//! processes' CPUs: the GPU never touches the header (the H200 machine reports
//! `host_native_atomic = 0`, so no read-modify-write between CPU and GPU on shared words).
//! Nothing read from the segment is trusted as a size or an offset: the layout is computed
//! once, by each side, from checked arithmetic, and the header must agree with it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::memory::shared::round_up;
use crate::stage::MAX_FRAME_BYTES;

/// Opens every hetmem ring segment.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"HETMRNG1");
/// The protocol's version: both processes must speak the same one.
pub(crate) const VERSION: u32 = 2;
/// The most slots a ring has (their state words fill part of the header page).
pub const MAX_SHARED_SLOTS: usize = 64;

/// Nobody holds the slot: the producer may fill it.
pub(crate) const FREE: u32 = 0;
/// The producer is writing a frame into it.
pub(crate) const FILLING: u32 = 1;
/// It holds a complete frame, not yet taken by the consumer.
pub(crate) const FULL: u32 = 2;
/// The consumer holds its frame.
pub(crate) const CONSUMING: u32 = 3;

/// One slot's words.
#[repr(C)]
pub(crate) struct SlotWords {
    /// [`FREE`], [`FILLING`], [`FULL`] or [`CONSUMING`]; anything else is a corrupt segment.
    pub(crate) state: AtomicU32,
    reserved: AtomicU32,
    /// The index of the frame it holds, written before the state turns [`FULL`].
    pub(crate) sequence: AtomicU64,
}

/// The header as it lies in the segment.
#[repr(C)]
pub(crate) struct HeaderWords {
    pub(super) magic: AtomicU64,
    pub(super) version: AtomicU32,
    pub(super) slots: AtomicU32,
    pub(super) header_bytes: AtomicU64,
    pub(super) frame_bytes: AtomicU64,
    pub(super) slot_stride: AtomicU64,
    pub(super) total_bytes: AtomicU64,
    /// The producer's process id, for messages.
    pub(crate) producer_pid: AtomicU32,
    /// The consumer's process id, for messages.
    pub(crate) consumer_pid: AtomicU32,
    /// Set (release) by the producer after its last frame: the end of the stream.
    pub(crate) producer_closed: AtomicU32,
    /// Set (release) by the consumer when it stops taking frames.
    pub(crate) consumer_closed: AtomicU32,
    /// The slots' words.
    pub(crate) slot_words: [SlotWords; MAX_SHARED_SLOTS],
}

/// Where everything lies in a ring's segment, from checked arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    /// The bytes of one frame.
    pub(crate) frame_bytes: usize,
    /// How many slots.
    pub(crate) slots: usize,
    /// The header's bytes: whole pages.
    pub(crate) header_bytes: usize,
    /// From one slot's start to the next: whole pages, so each slot is registered alone.
    pub(crate) slot_stride: usize,
    /// The segment's bytes.
    pub(crate) total_bytes: usize,
}

impl RingLayout {
    /// The layout of `slots` slots of `frame_bytes` each, on pages of `page` bytes.
    ///
    /// # Errors
    /// Zero or too many slots, an empty frame or one above [`MAX_FRAME_BYTES`], or a total
    /// that overflows.
    pub(crate) fn new(frame_bytes: usize, slots: usize, page: usize) -> Result<RingLayout> {
        if !(1..=MAX_SHARED_SLOTS).contains(&slots) {
            return Err(Error::invalid(
                "shared ring slots",
                format!("{slots} slots: a shared ring has 1 to {MAX_SHARED_SLOTS}"),
            ));
        }
        if frame_bytes == 0 || frame_bytes > MAX_FRAME_BYTES {
            return Err(Error::invalid(
                "shared ring frame",
                format!("{frame_bytes} bytes: a frame is 1 byte to {MAX_FRAME_BYTES} bytes"),
            ));
        }
        let header_bytes = round_up("shared ring header", size_of::<HeaderWords>(), page)?;
        let slot_stride = round_up("shared ring frame", frame_bytes, page)?;
        let total_bytes = slot_stride
            .checked_mul(slots)
            .and_then(|slots_bytes| slots_bytes.checked_add(header_bytes))
            .ok_or_else(|| {
                Error::invalid(
                    "shared ring size",
                    format!("{slots} slots of {frame_bytes} bytes overflow the address space"),
                )
            })?;
        Ok(RingLayout { frame_bytes, slots, header_bytes, slot_stride, total_bytes })
    }

    /// The byte offset of slot `slot` in the segment (`slot < slots`).
    pub(crate) fn slot_offset(&self, slot: usize) -> usize {
        debug_assert!(slot < self.slots);
        // Cannot overflow: at most total_bytes, which was computed with checked arithmetic.
        self.header_bytes + slot * self.slot_stride
    }
}

impl HeaderWords {
    /// Writes a new ring's header (the segment is fresh and zeroed: every slot [`FREE`]).
    pub(crate) fn init(&self, layout: &RingLayout, producer_pid: u32) {
        self.version.store(VERSION, Ordering::Relaxed);
        self.slots.store(layout.slots as u32, Ordering::Relaxed);
        self.header_bytes.store(layout.header_bytes as u64, Ordering::Relaxed);
        self.frame_bytes.store(layout.frame_bytes as u64, Ordering::Relaxed);
        self.slot_stride.store(layout.slot_stride as u64, Ordering::Relaxed);
        self.total_bytes.store(layout.total_bytes as u64, Ordering::Relaxed);
        self.producer_pid.store(producer_pid, Ordering::Relaxed);
        // Last, with release: a reader that sees the magic sees the rest.
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// The layout the header describes, after checking every field against the layout
    /// recomputed from its frame size and slot count, and the total against the segment's
    /// real size (`segment_bytes`, from `fstat`). `segment` names the segment in errors.
    ///
    /// # Errors
    /// A wrong magic or version, a field that disagrees, or a segment smaller than the
    /// header says.
    pub(crate) fn layout(&self, page: usize, segment_bytes: usize, segment: &str) -> Result<RingLayout> {
        let bad = |problem: String| Error::invalid("shared ring header", format!("{segment}: {problem}"));
        let magic = self.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#018x}, expected {MAGIC:#018x}: not a hetmem ring segment"
            )));
        }
        let version = self.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad(format!(
                "protocol version {version}, this hetmem speaks {VERSION}: build both processes \
                 with the same hetmem"
            )));
        }
        let as_usize = |what: &str, value: u64| {
            usize::try_from(value).map_err(|_| bad(format!("{what} {value} does not fit this machine")))
        };
        let frame_bytes = as_usize("frame size", self.frame_bytes.load(Ordering::Relaxed))?;
        let slots = self.slots.load(Ordering::Relaxed) as usize;
        let expected = RingLayout::new(frame_bytes, slots, page).map_err(|error| bad(error.to_string()))?;
        for (what, found, wanted) in [
            ("header size", self.header_bytes.load(Ordering::Relaxed), expected.header_bytes),
            ("slot stride", self.slot_stride.load(Ordering::Relaxed), expected.slot_stride),
            ("total size", self.total_bytes.load(Ordering::Relaxed), expected.total_bytes),
        ] {
            if found != wanted as u64 {
                return Err(bad(format!(
                    "{what} {found}, but {slots} slots of {frame_bytes} bytes on {page}-byte pages make {wanted}"
                )));
            }
        }
        if segment_bytes < expected.total_bytes {
            return Err(Error::invalid(
                "shared ring size",
                format!(
                    "{segment} holds {segment_bytes} bytes, but its header describes {} ({slots} slots of \
                     {frame_bytes} bytes): refused rather than mapped past its end (SIGBUS)",
                    expected.total_bytes
                ),
            ));
        }
        Ok(expected)
    }

    /// The words of slot `slot` (`slot < MAX_SHARED_SLOTS`).
    pub(crate) fn slot(&self, slot: usize) -> &SlotWords {
        &self.slot_words[slot]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_header_fits_one_page() {
        assert!(size_of::<HeaderWords>() <= 4096);
        assert_eq!(align_of::<HeaderWords>(), 8);
    }

    #[test]
    fn a_layout_is_whole_pages_and_its_limits_are_named() {
        let layout = RingLayout::new(1920 * 1080 * 3, 4, 4096).unwrap();
        assert_eq!(layout.header_bytes, 4096);
        assert_eq!(layout.slot_stride, (1920 * 1080 * 3usize).next_multiple_of(4096));
        assert_eq!(layout.total_bytes, 4096 + 4 * layout.slot_stride);
        assert_eq!(layout.slot_offset(3), 4096 + 3 * layout.slot_stride);
        assert!(RingLayout::new(100, 0, 4096).unwrap_err().to_string().contains("1 to 64"));
        assert!(RingLayout::new(100, 65, 4096).is_err());
        assert!(RingLayout::new(0, 2, 4096).unwrap_err().to_string().contains("0 bytes"));
        assert!(RingLayout::new(MAX_FRAME_BYTES + 1, 2, 4096).is_err());
    }

    proptest! {
        /// Any frame size and slot count either make a layout whose slots are page-aligned,
        /// disjoint, and inside the total, or an error: never a wrapped size.
        #[test]
        fn layouts_are_consistent_or_refused(
            frame_bytes in prop_oneof![0usize..100_000, (MAX_FRAME_BYTES - 10_000)..=(MAX_FRAME_BYTES + 10)],
            slots in 0usize..80,
            page_shift in 12u32..22,
        ) {
            let page = 1usize << page_shift;
            match RingLayout::new(frame_bytes, slots, page) {
                Ok(layout) => {
                    prop_assert!((1..=MAX_SHARED_SLOTS).contains(&slots));
                    prop_assert!((1..=MAX_FRAME_BYTES).contains(&frame_bytes));
                    prop_assert!(layout.slot_stride >= frame_bytes);
                    prop_assert!(layout.slot_stride % page == 0 && layout.header_bytes % page == 0);
                    let last = layout.slot_offset(slots - 1);
                    prop_assert!(last % page == 0);
                    prop_assert_eq!(last.checked_add(layout.slot_stride), Some(layout.total_bytes));
                }
                Err(error) => {
                    let text = error.to_string();
                    prop_assert!(
                        !(1..=MAX_SHARED_SLOTS).contains(&slots)
                            || frame_bytes == 0
                            || frame_bytes > MAX_FRAME_BYTES
                            || text.contains("overflow"),
                        "{}", text
                    );
                }
            }
        }

        /// A header with any one field changed from a valid one is refused, naming the field;
        /// a segment smaller than the header's total is refused, naming the segment.
        #[test]
        fn a_header_is_trusted_only_when_every_field_agrees(
            frame_bytes in 1usize..200_000,
            slots in 1usize..=MAX_SHARED_SLOTS,
            field in 0usize..6,
            delta in 1u64..1_000_000,
        ) {
            let layout = RingLayout::new(frame_bytes, slots, 4096).unwrap();
            let mut memory = crate::memory::PageBox::<u64>::zeroed(4096 / 8).unwrap();
            // SAFETY: a page-aligned page of zeroed memory, big enough and aligned for the
            // header (checked by the_header_fits_one_page), of atomics valid for any bits.
            let header = unsafe { &*memory.as_mut_ptr().cast::<HeaderWords>() };
            header.init(&layout, 1);
            prop_assert_eq!(header.layout(4096, layout.total_bytes, "seg").unwrap(), layout);
            let small = header.layout(4096, layout.total_bytes - 1, "memfd:seg").unwrap_err().to_string();
            prop_assert!(small.contains("memfd:seg holds"), "{}", small);
            match field {
                0 => { header.magic.fetch_add(delta, Ordering::Relaxed); }
                1 => { header.version.fetch_add(delta as u32, Ordering::Relaxed); }
                2 => { header.header_bytes.fetch_add(delta, Ordering::Relaxed); }
                3 => { header.slot_stride.fetch_add(delta * 4096, Ordering::Relaxed); }
                4 => { header.total_bytes.fetch_add(delta, Ordering::Relaxed); }
                _ => { header.slots.store(MAX_SHARED_SLOTS as u32 + delta as u32, Ordering::Relaxed); }
            }
            let error = header.layout(4096, usize::MAX, "seg").unwrap_err().to_string();
            let named = ["magic", "version", "header size", "slot stride", "total size", "slots"][field];
            prop_assert!(error.contains("seg:") && error.contains(named), "{}", error);
        }
    }
}
