//! `FrameRing`, native half: hetmem's frame ring (`hetmem::FrameRing`) whose stage is a Python
//! callable (`stage`), its producer's and consumer's holds on slots (`holds`) and the views of
//! a slot's bytes the stage and the users get (`views`), and the video files read straight into
//! its slots (`feed`). The ring, its strategies, ordering
//! and hand-off are hetmem's own; this module only carries them to Python, checking every
//! size it is given, and lets go of the interpreter while it waits for the ring or the GPU.

mod feed;
mod holds;
mod stage;
pub(crate) mod views;

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use hetmem::backend::cuda::CudaDevice;
use hetmem::pipeline::{FrameRing, RingOptions};
use hetmem::{Error, Strategy};
use pyo3::IntoPyObjectExt;
use pyo3::PyTraverseError;
use pyo3::exceptions::{PyBlockingIOError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::device::Device;
use crate::size::{Int, checked_add, product, sizes};
use crate::{HetmemError, to_py_err};
use holds::{HeldBy, InputHold, OnThisThread, OutputHold};
use stage::PyStage;
use views::{DeviceFrame, DeviceStream, FrameSpec};

/// The longest a blocking take waits with the interpreter let go before it looks for a signal
/// (Ctrl-C), as the shared ring's waits do.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// Runs `take` (the interpreter let go) with waits of [`SIGNAL_SLICE`] until it gives a hold or
/// an error, running the signal handlers between the slices: Ctrl-C (or any handler's
/// exception) is raised here, with nothing taken, and the ring as it was.
fn take_interruptibly<T>(
    py: Python<'_>,
    would_wait_for_ever: impl Fn() -> PyResult<()>,
    take: impl Fn() -> hetmem::Result<Option<T>> + Sync,
) -> PyResult<hetmem::Result<T>> {
    loop {
        // Again before every slice: a signal handler run between slices may have taken what
        // only this thread can give back.
        would_wait_for_ever()?;
        match py.detach(|| OnThisThread(take())).0 {
            Ok(Some(hold)) => return Ok(Ok(hold)),
            Ok(None) => py.check_signals()?,
            Err(error) => return Ok(Err(error)),
        }
    }
}

/// Adds the ring's classes and functions to the native module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Ring>()?;
    module.add_class::<InputHold>()?;
    module.add_class::<OutputHold>()?;
    module.add_class::<DeviceFrame>()?;
    module.add_class::<DeviceStream>()?;
    module.add_class::<feed::FrameFile>()?;
    module.add_function(wrap_pyfunction!(ring_strategies, module)?)?;
    Ok(())
}

/// The ring, and what its memory is freed after: every Python view of a slot holds it.
pub(crate) struct RingOwner {
    /// Dropped only after the device's work is done (`Drop`).
    ring: ManuallyDrop<FrameRing<PyStage>>,
    cuda: Option<CudaDevice>,
    held_by: HeldBy,
}

impl Drop for RingOwner {
    fn drop(&mut self) {
        // The ring's leases wait for the work they know of; a stage may have queued more on the
        // slots' memory (a kept tensor used later, another stream): wait for the device first.
        if let Some(device) = &self.cuda
            && let Err(error) = device.synchronize_work()
        {
            eprintln!(
                "hetmem: waiting for the device before freeing a frame ring failed ({error}); its {} bytes of \
                 host memory are leaked rather than freed while GPU work may still use them",
                self.ring.host_bytes()
            );
            return;
        }
        // SAFETY: drop runs once, and `ring` is not used after it.
        unsafe { ManuallyDrop::drop(&mut self.ring) };
    }
}

/// Every strategy hetmem's rings take, as `(name, summary)`, `auto` last: the names mean
/// what they mean in hetmem (`Strategy::TRAITS`).
#[pyfunction]
fn ring_strategies() -> Vec<(&'static str, &'static str)> {
    Strategy::ALL
        .into_iter()
        .chain([Strategy::Auto])
        .map(|strategy| (strategy.name(), strategy.summary()))
        .collect()
}

/// A frame ring whose stage is a Python callable. See `hetmem.FrameRing`, the Python half,
/// for the API; every argument is checked here again.
#[pyclass(frozen, module = "hetmem._native", name = "FrameRing")]
pub struct Ring {
    owner: Arc<RingOwner>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("ring", &*self.owner.ring).finish()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The stage's adapted views hold the ring alive; with the ring object gone, no new frame
        // can reach the stage, and the views are let go (tensors a user kept still hold it).
        self.owner.ring.stage().clear_views();
    }
}

/// A frame's spec from the Python half's `(shape, typestr, itemsize)`.
pub(crate) fn spec(shape: &[Int], typestr: &str, itemsize: Int, what: &str) -> PyResult<FrameSpec> {
    let shape = sizes(shape, &format!("{what} shape"))?;
    FrameSpec::new(shape, typestr, itemsize.size(&format!("{what} itemsize"))?, what)
}

#[pymethods]
impl Ring {
    /// A ring of `slots` slots on `device` by `strategy` (a name of `ring_strategies`) whose
    /// frames of `frame` (shape, type string, itemsize) become outputs of `out` through
    /// `call(frame, out, stream)`, each view made by `adapt(role, view)` once per slot.
    #[new]
    #[pyo3(signature = (device, strategy, frame, out, slots, call, adapt))]
    #[allow(clippy::too_many_arguments, reason = "the constructor's keywords, from the Python half")]
    fn new(
        py: Python<'_>,
        device: &Device,
        strategy: &str,
        frame: (Vec<Int>, String, Int),
        out: (Vec<Int>, String, Int),
        slots: Int,
        call: Py<PyAny>,
        adapt: Py<PyAny>,
    ) -> PyResult<Ring> {
        let strategy: Strategy = strategy.parse().map_err(to_py_err)?;
        let frame = spec(&frame.0, &frame.1, frame.2, "frame")?;
        let out = spec(&out.0, &out.1, out.2, "out")?;
        let slots = slots.size("slots")?;
        if slots == 0 {
            return Err(PyValueError::new_err(
                "slots: 0; a ring needs at least one slot (3 overlap upload, work and download)",
            ));
        }
        // What the slots will take, checked before anything is allocated.
        let per_slot = checked_add(frame.nbytes, out.nbytes, "frame + out bytes")?;
        product([per_slot, slots], "slots x (frame + out) bytes")?;
        if !py.import("builtins")?.getattr("callable")?.call1((&call,))?.is_truthy()? {
            return Err(PyValueError::new_err(
                "stage: not callable; give a function stage(frame, out, stream)",
            ));
        }
        let stage = PyStage::new(frame, out, call, adapt).map_err(to_py_err)?;
        let options = RingOptions { slots, ..RingOptions::default() };
        let inner = &device.inner;
        let ring = py.detach(|| FrameRing::with_stage(inner, strategy, stage, options)).map_err(to_py_err)?;
        let owner = Arc::new(RingOwner {
            ring: ManuallyDrop::new(ring),
            cuda: inner.as_cuda().cloned(),
            held_by: HeldBy::default(),
        });
        owner.ring.stage().set_owner(&owner);
        Ok(Ring { owner })
    }

    /// The next frame's slot, waiting (the interpreter let go, Ctrl-C heard every 50 ms) while
    /// the ring is full when `block`, else None at once; `HetmemError` once the ring is closed.
    fn take_input(&self, py: Python<'_>, block: bool) -> PyResult<Option<InputHold>> {
        let ring = &*self.owner.ring;
        // Full, the ring frees a slot only when the oldest result is released, which only
        // this thread can do while it holds that result.
        let would_wait_for_ever = || {
            if self.owner.held_by.output_here()
                && ring.submitted().saturating_sub(ring.drained()) >= ring.slots() as u64
            {
                return Err(HetmemError::new_err(
                    "take_input would wait for ever: the ring is full and this thread holds its oldest result; \
                     release it first",
                ));
            }
            Ok(())
        };
        let taken = if block {
            take_interruptibly(py, would_wait_for_ever, || ring.next_input_within(Some(SIGNAL_SLICE)))?
        } else {
            py.detach(|| OnThisThread(ring.try_next_input())).0
        };
        match taken {
            Ok(slot) => Ok(Some(InputHold::new(Arc::clone(&self.owner), slot))),
            Err(Error::WouldBlock(_)) => Ok(None),
            Err(Error::RingClosed) => Err(HetmemError::new_err(
                "the frame ring is closed: it takes no more frames; make a new ring",
            )),
            Err(error) => Err(to_py_err(error)),
        }
    }

    /// The oldest frame, waiting (the interpreter let go, Ctrl-C heard every 50 ms while no
    /// frame is submitted) for it to be submitted and for its work when `block`: an `OutputHold`; `(index, exception)` for a frame whose stage failed
    /// (the exception the stage raised, or the library's); None after the last frame of a
    /// closed ring. Without `block`, `BlockingIOError` when the oldest frame is not done.
    fn take_output(&self, py: Python<'_>, block: bool) -> PyResult<Py<PyAny>> {
        let ring = &*self.owner.ring;
        // With every submitted frame out, the next is the one this thread is filling (or
        // staging): only this thread can submit it, so it would never come.
        let would_wait_for_ever = || {
            if self.owner.held_by.input_here() && ring.submitted() == ring.drained() {
                return Err(HetmemError::new_err(
                    "take_output would wait for ever: the next frame is the one this thread is filling (or its \
                     stage is running); submit it first, or take results on another thread",
                ));
            }
            Ok(())
        };
        let taken = if block {
            take_interruptibly(py, would_wait_for_ever, || ring.next_output_within(Some(SIGNAL_SLICE)))?
        } else {
            py.detach(|| OnThisThread(ring.try_next_output())).0
        };
        match taken {
            Ok(frame) => Ok(Py::new(py, OutputHold::new(Arc::clone(&self.owner), frame))?.into_any()),
            Err(Error::FrameFailed { index, source }) => {
                let cause = match ring.stage().take_raised(index) {
                    Some(raised) => raised.into_value(py).into_any(),
                    None => HetmemError::new_err(source.to_string()).into_value(py).into_any(),
                };
                Ok(PyTuple::new(py, [index.into_py_any(py)?, cause])?.into_any().unbind())
            }
            Err(Error::RingClosed) => Ok(py.None()),
            Err(Error::WouldBlock(why)) => Err(PyBlockingIOError::new_err(format!("{why}: try again later"))),
            Err(error) => Err(to_py_err(error)),
        }
    }

    /// The stage's callables, for the garbage collector: a stage that refers to its own ring
    /// (a bound method of the object holding it) is a cycle through this object, collected
    /// only if the collector sees it. Reported only while no input slot is held: the ring
    /// object then is the one way to the callables (only an input hold calls them, and only
    /// the ring makes one), so this object owns the one reference the stage holds to each, and
    /// clearing them, should the ring be garbage while views keep its memory, calls nothing
    /// later. Taken while the ring runs a stage (an input is held), nothing is reported: the
    /// cycle is kept, never cut under a running stage.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if self.owner.held_by.input_free() {
            for callable in self.owner.ring.stage().callables() {
                visit.call(callable)?;
            }
        }
        Ok(())
    }

    /// Takes no more frames; the frames in the ring still come out.
    fn close(&self) {
        self.owner.held_by.close();
        self.owner.ring.close();
    }

    /// The strategy's name (never `auto`).
    #[getter]
    fn strategy(&self) -> &'static str {
        self.owner.ring.strategy().name()
    }

    /// The number of slots.
    #[getter]
    fn slots(&self) -> usize {
        self.owner.ring.slots()
    }

    /// Frames submitted so far.
    #[getter]
    fn submitted(&self) -> u64 {
        self.owner.ring.submitted()
    }

    /// Frames the consumer has finished with so far.
    #[getter]
    fn drained(&self) -> u64 {
        self.owner.ring.drained()
    }

    /// Host memory the slots' frame buffers take, in bytes.
    #[getter]
    fn host_bytes(&self) -> usize {
        self.owner.ring.host_bytes()
    }

    /// Device memory the slots' frame buffers take, in bytes.
    #[getter]
    fn device_bytes(&self) -> usize {
        self.owner.ring.device_bytes()
    }

    /// Bytes that cross the host-GPU link per frame.
    #[getter]
    fn link_bytes_per_frame(&self) -> u64 {
        self.owner.ring.link_bytes_per_frame()
    }
}
