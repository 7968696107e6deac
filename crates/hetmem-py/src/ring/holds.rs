//! The producer's and the consumer's holds on a slot, as Python objects: `InputHold` (the
//! next frame's slot, written through a host view, then submitted) and `OutputHold` (the
//! oldest frame's output, read through a host view, then released). Each keeps the ring's
//! hold (`InputSlot`, `OutputFrame`, which lock the slot) across Python calls, so it is bound
//! to the thread that took it (`unsendable`), as the lock is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use hetmem::pipeline::{InputSlot, OutputFrame};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::RingOwner;
use super::stage::PyStage;
use super::views::host_memory;
use crate::memory::Memory;

/// A value carried out of `py.detach`, which runs its closure on the calling thread and
/// returns there: the ring's holds lock a slot's mutex, so they may not cross threads, and
/// this never lets them (it is made inside the closure and unwrapped by its caller at once).
pub(super) struct OnThisThread<T>(pub(super) T);

// SAFETY: only `take_input` and `take_output` (directly or through `take_interruptibly`) make
// one, as the value of a `py.detach` closure, and unwrap it on the same thread right after: `detach` runs the closure on the
// thread that called it (it only lets go of the interpreter meanwhile), so the value never
// reaches another thread.
unsafe impl<T> Send for OnThisThread<T> {}

/// Which thread holds the ring's input slot and which its output frame, and whether the ring
/// is closed: the holds are bound to their thread, so a blocking take on that thread that only
/// the hold's own end could satisfy would wait for ever (until Ctrl-C); `Ring` refuses it
/// instead.
#[derive(Debug, Default)]
pub(super) struct HeldBy {
    input: Mutex<Option<ThreadId>>,
    output: Mutex<Option<ThreadId>>,
    closed: AtomicBool,
}

fn mark(by: &Mutex<Option<ThreadId>>, thread: Option<ThreadId>) {
    *by.lock().unwrap_or_else(|poison| poison.into_inner()) = thread;
}

fn here(by: &Mutex<Option<ThreadId>>) -> bool {
    *by.lock().unwrap_or_else(|poison| poison.into_inner()) == Some(std::thread::current().id())
}

impl HeldBy {
    /// Whether this thread holds the input slot (filling it, or in the stage at its submit).
    pub(super) fn input_here(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && here(&self.input)
    }

    /// Whether this thread holds the output frame.
    pub(super) fn output_here(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && here(&self.output)
    }

    /// Whether no input slot is held (none is being filled or staged), on any thread.
    pub(super) fn input_free(&self) -> bool {
        self.input.lock().unwrap_or_else(|poison| poison.into_inner()).is_none()
    }

    /// The ring was closed: a take no longer waits for a frame, it ends.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// Marks the input slot free when dropped.
struct InputFreed<'a>(&'a HeldBy);

impl Drop for InputFreed<'_> {
    fn drop(&mut self) {
        mark(&self.0.input, None);
    }
}

/// The next frame's slot, held by the producer until `submit` or `cancel`.
#[pyclass(unsendable, module = "hetmem._native")]
pub struct InputHold {
    /// Declared before `owner`, so dropped first: it borrows the ring `owner` holds.
    slot: Option<InputSlot<'static, PyStage>>,
    owner: Arc<RingOwner>,
    index: u64,
}

impl std::fmt::Debug for InputHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputHold").field("index", &self.index).finish_non_exhaustive()
    }
}

impl InputHold {
    /// Holds `slot`, a slot of `owner`'s ring.
    pub(super) fn new(owner: Arc<RingOwner>, slot: InputSlot<'_, PyStage>) -> InputHold {
        let index = slot.index();
        // SAFETY: `slot` borrows the ring inside `owner`'s allocation, which does not move or
        // go while an `Arc` of it lives; this hold keeps one (`owner`) and drops `slot` before
        // it (field order). The `'static` never leaves this type: `slot` is private and only
        // used through borrows of `self`.
        let slot =
            unsafe { std::mem::transmute::<InputSlot<'_, PyStage>, InputSlot<'static, PyStage>>(slot) };
        mark(&owner.held_by.input, Some(std::thread::current().id()));
        InputHold { slot: Some(slot), owner, index }
    }

    fn slot(&mut self) -> PyResult<&mut InputSlot<'static, PyStage>> {
        let index = self.index;
        self.slot.as_mut().ok_or_else(|| {
            PyValueError::new_err(format!(
                "frame {index} was already submitted or cancelled; take a new slot"
            ))
        })
    }
}

impl InputHold {
    /// The slot's input bytes, for a native producer to write the frame into
    /// (`FrameFile::read_into`).
    pub(super) fn bytes(&mut self) -> PyResult<&mut [u8]> {
        Ok(self.slot()?)
    }
}

#[pymethods]
impl InputHold {
    /// The frame's index in the stream.
    #[getter]
    fn index(&self) -> u64 {
        self.index
    }

    /// The slot's input bytes, for the producer to write the frame into.
    fn memory(&mut self) -> PyResult<Memory> {
        let owner = Arc::clone(&self.owner);
        let bytes: &mut [u8] = self.slot()?;
        Ok(host_memory(&owner, bytes.as_mut_ptr() as usize, bytes.len(), false))
    }

    /// Hands the frame to the stage (which runs now, on this thread) and returns its index; a
    /// failure of the stage comes out with the frame, in order.
    fn submit(&mut self) -> PyResult<u64> {
        self.slot()?;
        let Some(slot) = self.slot.take() else { unreachable!("checked by `slot` above") };
        self.owner.ring.stage().begin_frame(self.index);
        // Held (by this thread, in the stage) until the submit returns, or unwinds.
        let _free = InputFreed(&self.owner.held_by);
        Ok(slot.submit())
    }

    /// Gives the slot back unused.
    fn cancel(&mut self) {
        if self.slot.take().is_some() {
            mark(&self.owner.held_by.input, None);
        }
    }
}

impl Drop for InputHold {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// The oldest frame's output, held by the consumer until `release`.
#[pyclass(unsendable, module = "hetmem._native")]
pub struct OutputHold {
    /// Declared before `owner`, so dropped first: it borrows the ring `owner` holds.
    frame: Option<OutputFrame<'static, PyStage>>,
    owner: Arc<RingOwner>,
    index: u64,
}

impl std::fmt::Debug for OutputHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputHold").field("index", &self.index).finish_non_exhaustive()
    }
}

impl OutputHold {
    /// Holds `frame`, a frame of `owner`'s ring.
    pub(super) fn new(owner: Arc<RingOwner>, frame: OutputFrame<'_, PyStage>) -> OutputHold {
        let index = frame.index();
        // SAFETY: as in `InputHold::new`: the frame borrows the ring `owner` keeps alive and
        // in place, and is dropped before it (field order); the `'static` never leaves.
        let frame =
            unsafe { std::mem::transmute::<OutputFrame<'_, PyStage>, OutputFrame<'static, PyStage>>(frame) };
        mark(&owner.held_by.output, Some(std::thread::current().id()));
        OutputHold { frame: Some(frame), owner, index }
    }
}

#[pymethods]
impl OutputHold {
    /// The frame's index in the stream.
    #[getter]
    fn index(&self) -> u64 {
        self.index
    }

    /// The slot's output bytes, read-only.
    fn memory(&self) -> PyResult<Memory> {
        let index = self.index;
        let frame = self.frame.as_ref().ok_or_else(|| {
            PyValueError::new_err(format!(
                "frame {index}'s output was released; its slot went back to the ring"
            ))
        })?;
        let bytes: &[u8] = frame;
        Ok(host_memory(&self.owner, bytes.as_ptr() as usize, bytes.len(), true))
    }

    /// Gives the slot back to the ring for the next frame.
    fn release(&mut self) {
        if self.frame.take().is_some() {
            mark(&self.owner.held_by.output, None);
        }
    }
}

impl Drop for OutputHold {
    fn drop(&mut self) {
        self.release();
    }
}
