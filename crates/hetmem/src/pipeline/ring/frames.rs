//! The producer's hold on the next frame's slot, and the consumer's on the oldest frame.

use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;

use super::{FrameRing, lock};
use crate::error::Result;
use crate::pipeline::slot::Slot;
use crate::stage::Stage;

/// The producer's hold on the next frame's slot: write the frame through `DerefMut` (its first
/// input buffer; others through [`InputSlot::input_mut`]), then [`InputSlot::submit`] it.
/// Dropped without submitting, the slot goes back unused.
///
/// The slot's bytes are page-locked: handed to another crate's asynchronous copy (cudarc's
/// `memcpy_htod`), they are still read after the call returns, and submitting or dropping the
/// slot does not wait for that copy (see [`crate::HostBuf::as_slice`]).
pub struct InputSlot<'ring, S: Stage> {
    ring: &'ring FrameRing<S>,
    guard: Option<MutexGuard<'ring, Slot<S>>>,
    slot: usize,
    index: u64,
}

impl<S: Stage> std::fmt::Debug for InputSlot<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputSlot").field("slot", &self.slot).field("index", &self.index).finish()
    }
}

impl<'ring, S: Stage> InputSlot<'ring, S> {
    pub(super) fn new(
        ring: &'ring FrameRing<S>,
        guard: MutexGuard<'ring, Slot<S>>,
        slot: usize,
        index: u64,
    ) -> Self {
        InputSlot { ring, guard: Some(guard), slot, index }
    }

    /// The index this frame will have in the stream.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Input buffer `buffer` of the frame (the stage's `inputs()[buffer]` layout).
    ///
    /// # Errors
    /// No such buffer.
    pub fn input_mut(&mut self, buffer: usize) -> Result<&mut [u8]> {
        crate::pipeline::check_index("input", buffer, self.ring.stage.inputs().len())?;
        self.slot_mut().input_mut(buffer)
    }

    fn slot_mut(&mut self) -> &mut Slot<S> {
        self.guard.as_mut().expect("held until submitted")
    }

    /// Hands the frame to the GPU (or the CPU stage) and returns its index. Failures of its
    /// work come out at [`FrameRing::next_output`], in order, as [`crate::Error::FrameFailed`].
    pub fn submit(mut self) -> u64 {
        let mut guard = self.guard.take().expect("an input slot holds its slot until submitted");
        guard.submit(&self.ring.stage, self.index);
        drop(guard);
        lock(&self.ring.state).submit(self.slot);
        self.ring.notify();
        self.index
    }
}

impl<S: Stage> Deref for InputSlot<'_, S> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.guard.as_ref().expect("held until submitted").input(0).expect("checked when the slot was taken")
    }
}

impl<S: Stage> DerefMut for InputSlot<'_, S> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.slot_mut().input_mut(0).expect("checked when the slot was taken")
    }
}

impl<S: Stage> Drop for InputSlot<'_, S> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            lock(&self.ring.state).cancel_input(self.slot);
            self.ring.notify();
        }
    }
}

/// The consumer's hold on the oldest finished frame: read it through `Deref` (its first output
/// buffer; others through [`OutputFrame::output`]); dropping it frees the slot for the
/// producer.
pub struct OutputFrame<'ring, S: Stage> {
    ring: &'ring FrameRing<S>,
    guard: Option<MutexGuard<'ring, Slot<S>>>,
    slot: usize,
    index: u64,
}

impl<S: Stage> std::fmt::Debug for OutputFrame<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFrame").field("slot", &self.slot).field("index", &self.index).finish()
    }
}

impl<'ring, S: Stage> OutputFrame<'ring, S> {
    pub(super) fn new(
        ring: &'ring FrameRing<S>,
        guard: MutexGuard<'ring, Slot<S>>,
        slot: usize,
        index: u64,
    ) -> Self {
        OutputFrame { ring, guard: Some(guard), slot, index }
    }

    /// The frame's index in the stream.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Output buffer `buffer` of the frame (the stage's `outputs()[buffer]` layout).
    ///
    /// # Errors
    /// No such buffer.
    pub fn output(&self, buffer: usize) -> Result<&[u8]> {
        crate::pipeline::check_index("output", buffer, self.ring.stage.outputs().len())?;
        self.guard.as_ref().expect("held until dropped").output(buffer)
    }
}

impl<S: Stage> Deref for OutputFrame<'_, S> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.guard
            .as_ref()
            .expect("held until dropped")
            .output(0)
            .expect("a finished frame's slot holds its memory")
    }
}

impl<S: Stage> Drop for OutputFrame<'_, S> {
    fn drop(&mut self) {
        drop(self.guard.take());
        lock(&self.ring.state).finish_output(self.slot);
        self.ring.notify();
    }
}
