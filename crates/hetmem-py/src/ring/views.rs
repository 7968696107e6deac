//! What the Python stage and the ring's users see of a slot's bytes: `DeviceFrame`, a slot's
//! device buffer as the CUDA array interface gives it to PyTorch and CuPy, and `host_memory`, a
//! slot's host buffer as a `Memory` that `hetmem.Buffer` views. Both hold the ring alive, so no
//! view outlives the memory it names; what a view may touch when is the Python half's rule
//! (the hand-off: `LentError`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::RingOwner;
use crate::memory::{Layout, Memory};
use crate::view::{Range, TypeStr};

/// One frame's shape and element type, checked once when the ring is made: the array
/// interfaces' shape and type string, and the bytes they cover.
#[derive(Debug, Clone)]
pub(crate) struct FrameSpec {
    pub(crate) shape: Vec<usize>,
    pub(crate) typestr: String,
    pub(crate) nbytes: usize,
}

impl FrameSpec {
    /// `shape` elements of the NumPy dtype whose type string is `typestr` and size `itemsize`.
    ///
    /// # Errors
    /// `ValueError`: a dtype the CUDA array interface cannot carry, an itemsize that disagrees
    /// with the type string, a byte count that overflows, or an empty frame.
    pub(crate) fn new(shape: Vec<usize>, typestr: &str, itemsize: usize, what: &str) -> PyResult<FrameSpec> {
        let parsed = TypeStr::parse(typestr, true)?;
        if parsed.itemsize != itemsize {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{what}: dtype {typestr:?} says {} bytes an element, the dtype {itemsize}",
                parsed.itemsize
            )));
        }
        let nbytes = crate::size::product(shape.iter().copied().chain([itemsize]), what)?;
        if nbytes == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{what}: shape {shape:?} holds no element; a frame holds at least one"
            )));
        }
        // The shape covers exactly the buffer: checked as every view of the package is.
        Range::checked(nbytes, 0, shape.clone(), itemsize)?;
        Ok(FrameSpec { shape, typestr: parsed.text(), nbytes })
    }
}

/// A slot's buffer as the GPU addresses it, for the stage: the CUDA array interface (version
/// 3) of `spec` at the address the slot's lease gave for the ring's stream. It holds the ring,
/// so the address stays valid while PyTorch or CuPy (which keep this object as their array's
/// owner) hold it; whether the GPU may touch the bytes is the hand-off's: during the stage's
/// call, on the ring's stream.
#[pyclass(frozen, module = "hetmem._native")]
pub struct DeviceFrame {
    /// Never read: it keeps the slot's memory alive.
    _owner: Arc<RingOwner>,
    address: u64,
    spec: FrameSpec,
    ordinal: usize,
}

impl std::fmt::Debug for DeviceFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceFrame").field("shape", &self.spec.shape).finish()
    }
}

impl DeviceFrame {
    pub(crate) fn new(owner: Arc<RingOwner>, address: u64, spec: FrameSpec, ordinal: usize) -> DeviceFrame {
        DeviceFrame { _owner: owner, address, spec, ordinal }
    }
}

#[pymethods]
impl DeviceFrame {
    /// The CUDA array interface: C-contiguous, no stream to wait for (the stage runs on the
    /// ring's stream, after the frame's earlier work there).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("version", 3)?;
        dict.set_item("shape", PyTuple::new(py, &self.spec.shape)?)?;
        dict.set_item("typestr", &self.spec.typestr)?;
        // Never flagged read-only, input or output: PyTorch refuses a read-only interface. The
        // stage reads its input only (its documented contract).
        dict.set_item("data", (self.address, false))?;
        dict.set_item("strides", py.None())?;
        dict.set_item("stream", py.None())?;
        Ok(dict)
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.spec.shape)
    }

    fn __repr__(&self) -> String {
        format!("hetmem._native.DeviceFrame(shape={:?}, typestr={:?})", self.spec.shape, self.spec.typestr)
    }
}

/// The ring's CUDA stream, for the stage: its handle, and the ring, held so the stream is not
/// destroyed while the stage's stream object (a `torch.cuda.ExternalStream`, which keeps this
/// object) may still queue work on it.
#[pyclass(frozen, module = "hetmem._native")]
pub struct DeviceStream {
    /// Never read: it keeps the ring's queues, and so the stream, alive.
    _owner: Arc<RingOwner>,
    handle: usize,
}

impl std::fmt::Debug for DeviceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStream").finish_non_exhaustive()
    }
}

impl DeviceStream {
    pub(crate) fn new(owner: Arc<RingOwner>, handle: usize) -> DeviceStream {
        DeviceStream { _owner: owner, handle }
    }
}

#[pymethods]
impl DeviceStream {
    /// The `CUstream` handle; valid while this object lives.
    #[getter]
    fn handle(&self) -> usize {
        self.handle
    }
}

/// A slot's host buffer, `nbytes` bytes at `host_ptr`, as a `Memory` holding the ring alive.
/// It belongs to no GPU (`Device::cpu`): letting it go waits for nothing, since the ring's
/// memory is freed only with the ring, which waits for the device first (`RingOwner`).
pub(crate) fn host_memory(owner: &Arc<RingOwner>, host_ptr: usize, nbytes: usize, readonly: bool) -> Memory {
    let layout = Layout { host_ptr, nbytes, device_ptr: None, readonly, kind: "ring" };
    Memory::new(Box::new(Arc::clone(owner)), layout, &hetmem::Device::cpu())
}
