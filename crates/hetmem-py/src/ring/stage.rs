//! `PyStage`: a Python callable as a stage of hetmem's frame ring. The ring calls it at each
//! frame's submit, on the producer's thread, with the interpreter attached: on a GPU queue
//! with the frame's device views (`DeviceFrame`, through the leases the strategy made, for the
//! ring's stream), on the CPU with its host views. What the callable queues on the ring's
//! stream is covered by the leases' fences (the cudarc views record one when they drop), so the
//! slot is not handed back before that work is done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use hetmem::handoff::{CudarcView, Lease, Lent, Queue};
use hetmem::memory::{Buffer, WritableBuffer};
use hetmem::placement::Where;
use hetmem::stage::{FrameLayout, Runs, ScalarType, Stage};
use hetmem::{Error, Result, Strategy};
use pyo3::prelude::*;

use super::RingOwner;
use super::views::{DeviceFrame, DeviceStream, FrameSpec, host_memory};
use crate::attached::Attached;

/// Which of a frame's buffers a view is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Frame,
    Out,
    Stream,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Frame => "frame",
            Role::Out => "out",
            Role::Stream => "stream",
        }
    }
}

/// The Python callable and what it is handed.
pub(crate) struct PyStage {
    inputs: [FrameLayout; 1],
    outputs: [FrameLayout; 1],
    frame: FrameSpec,
    out: FrameSpec,
    /// `call(frame, out, stream)`: the Python half's wrapper of the user's stage.
    call: Attached<Py<PyAny>>,
    /// `adapt(role, view)`: a view (`DeviceFrame`, a host `Memory`, a stream handle) as the
    /// stage receives it (a torch tensor, a NumPy array, a torch stream), made once per slot.
    adapt: Attached<Py<PyAny>>,
    /// The ring this stage runs in, for the views to hold it alive (set once it exists).
    owner: OnceLock<Weak<RingOwner>>,
    /// The frame being submitted: the producer sets it before the ring calls the stage.
    current: AtomicU64,
    /// Exceptions the callable raised, with their frames' indices, until the consumer meets
    /// those frames.
    raised: Mutex<Vec<(u64, PyErr)>>,
    /// The adapted views, by the address and role they are of: a slot's addresses are the same
    /// for every frame, so each view is adapted once. They hold the ring (a cycle), so the ring
    /// object clears them when it goes (`clear_views`).
    views: Mutex<HashMap<(u64, Role), Py<PyAny>>>,
    /// The ring object is gone (`clear_views`): a hold kept past it may still submit, but what
    /// its stage makes then is neither cached nor kept, or it would hold the ring for ever.
    ring_gone: AtomicBool,
}

impl std::fmt::Debug for PyStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyStage").field("frame", &self.frame).field("out", &self.out).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A slot's stream, as cudarc wraps it (the views are asked for on it) and as the stage sees it.
pub(crate) struct Prepared {
    stream: Option<Arc<CudaStream>>,
}

impl PyStage {
    /// A stage turning frames of `frame` into outputs of `out` through `call`.
    ///
    /// # Errors
    /// A frame above what hetmem's layouts take.
    pub(crate) fn new(
        frame: FrameSpec,
        out: FrameSpec,
        call: Py<PyAny>,
        adapt: Py<PyAny>,
    ) -> Result<PyStage> {
        let inputs = [FrameLayout::samples(frame.nbytes, ScalarType::U8)?];
        let outputs = [FrameLayout::samples(out.nbytes, ScalarType::U8)?];
        Ok(PyStage {
            inputs,
            outputs,
            frame,
            out,
            call: Attached::new(call),
            adapt: Attached::new(adapt),
            owner: OnceLock::new(),
            current: AtomicU64::new(0),
            raised: Mutex::new(Vec::new()),
            views: Mutex::new(HashMap::new()),
            ring_gone: AtomicBool::new(false),
        })
    }

    /// Tells the stage which ring it runs in.
    pub(crate) fn set_owner(&self, owner: &Arc<RingOwner>) {
        // Set once, by the ring's constructor, right after the ring is made.
        let _ = self.owner.set(Arc::downgrade(owner));
    }

    /// Frame `index` is the one submitted next.
    pub(crate) fn begin_frame(&self, index: u64) {
        self.current.store(index, Ordering::Release);
    }

    /// The exception the callable raised on frame `index`, if it raised one.
    pub(crate) fn take_raised(&self, index: u64) -> Option<PyErr> {
        let mut raised = lock(&self.raised);
        let at = raised.iter().position(|(frame, _)| *frame == index)?;
        Some(raised.swap_remove(at).1)
    }

    /// The Python callables the stage holds, one reference each: for the garbage collector.
    pub(crate) fn callables(&self) -> [&Py<PyAny>; 2] {
        [&self.call, &self.adapt]
    }

    /// Drops the adapted views (they hold the ring alive), for good: the ring object is gone.
    pub(crate) fn clear_views(&self) {
        self.ring_gone.store(true, Ordering::Release);
        let views = std::mem::take(&mut *lock(&self.views));
        drop(views);
        lock(&self.raised).clear();
    }

    fn owner(&self) -> Result<Arc<RingOwner>> {
        self.owner.get().and_then(Weak::upgrade).ok_or_else(|| {
            Error::invalid("Python stage", "its ring is gone (the stage ran outside a live ring)")
        })
    }

    /// The adapted view of `role` at `address`, made by `make` the first time.
    fn view(
        &self,
        py: Python<'_>,
        address: u64,
        role: Role,
        make: impl FnOnce() -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(view) = lock(&self.views).get(&(address, role)) {
            return Ok(view.clone_ref(py));
        }
        let adapted = self.adapt.call1(py, (role.name(), make()?))?;
        if !self.ring_gone.load(Ordering::Acquire) {
            lock(&self.views).insert((address, role), adapted.clone_ref(py));
        }
        Ok(adapted)
    }

    /// Calls the Python stage on views `made` for it; an exception (of the stage, or of making
    /// its views) is kept for the consumer, with the frame's index, and fails the frame.
    fn run(&self, py: Python<'_>, made: PyResult<(Py<PyAny>, Py<PyAny>, Py<PyAny>)>) -> Result<()> {
        let called = made.and_then(|(frame, out, stream)| self.call.call1(py, (frame, out, stream)));
        match called {
            Ok(_) => Ok(()),
            Err(error) => {
                let message = error.to_string();
                let index = self.current.load(Ordering::Acquire);
                // With the ring object gone no consumer meets the frame; its traceback would
                // hold the views, and they the ring.
                if !self.ring_gone.load(Ordering::Acquire) {
                    lock(&self.raised).push((index, error));
                }
                Err(Error::invalid("Python stage", format!("it raised {message}")))
            }
        }
    }
}

impl Stage for PyStage {
    type Prepared = Prepared;

    fn inputs(&self) -> &[FrameLayout] {
        &self.inputs
    }

    fn outputs(&self) -> &[FrameLayout] {
        &self.outputs
    }

    fn runs(&self) -> Runs {
        Runs { gpu: true, cpu: true }
    }

    fn prepare(&self, queue: &Queue, _strategy: Strategy, _constants: &[Where]) -> Result<Prepared> {
        let Some(device) = queue.cuda_device() else { return Ok(Prepared { stream: None }) };
        // The primary context, which hetmem, PyTorch and CuPy share.
        let context = CudaContext::new(device.ordinal())
            .map_err(|error| Error::invalid("CUDA context for the Python stage", error.to_string()))?;
        Ok(Prepared { stream: Some(queue.cudarc_stream(&context)?) })
    }

    fn queue<I, O>(
        &self,
        prepared: &mut Prepared,
        queue: &Queue,
        inputs: &[I],
        outputs: &mut [Lent<O>],
    ) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        let (Some(stream), Some(device)) = (&prepared.stream, queue.cuda_device()) else {
            return Err(Error::NeedsGpu {
                what: "a Python stage's device views".into(),
                detail: "the ring runs its CPU path on the CPU backend".into(),
            });
        };
        let ordinal = device.ordinal();
        let owner = self.owner()?;
        // The views are asked for on the ring's stream: what the callable queues there follows
        // the frame's upload, and the leases record a fence after it when the views drop.
        let input = CudarcView::of(&inputs[0], stream)?;
        let mut output = outputs[0].cudarc_view_mut(stream)?;
        let (in_address, _in_synced) = input.device_ptr(stream);
        let (out_address, _out_synced) = output.device_ptr_mut(stream);
        let handle = stream.cu_stream() as usize;
        Python::attach(|py| {
            let made = (|| {
                let frame = self.view(py, in_address, Role::Frame, || {
                    let view = DeviceFrame::new(Arc::clone(&owner), in_address, self.frame.clone(), ordinal);
                    Ok(Py::new(py, view)?.into_any())
                })?;
                let out = self.view(py, out_address, Role::Out, || {
                    let view = DeviceFrame::new(Arc::clone(&owner), out_address, self.out.clone(), ordinal);
                    Ok(Py::new(py, view)?.into_any())
                })?;
                let stream = self.view(py, handle as u64, Role::Stream, || {
                    Ok(Py::new(py, DeviceStream::new(Arc::clone(&owner), handle))?.into_any())
                })?;
                Ok::<_, PyErr>((frame, out, stream))
            })();
            self.run(py, made)
        })
    }

    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let owner = self.owner()?;
        let input = inputs[0];
        let output = &mut *outputs[0];
        // Views of the slot's own buffers, which live as long as the ring their views hold; the
        // callable reads the one and writes the other during this call only (the hand-off).
        let (in_address, in_len) = (input.as_ptr() as usize, input.len());
        let (out_address, out_len) = (output.as_mut_ptr() as usize, output.len());
        Python::attach(|py| {
            let made = (|| {
                let frame = self.view(py, in_address as u64, Role::Frame, || {
                    Ok(Py::new(py, host_memory(&owner, in_address, in_len, true))?.into_any())
                })?;
                let out = self.view(py, out_address as u64, Role::Out, || {
                    Ok(Py::new(py, host_memory(&owner, out_address, out_len, false))?.into_any())
                })?;
                Ok::<_, PyErr>((frame, out, py.None()))
            })();
            self.run(py, made)
        })
    }
}
