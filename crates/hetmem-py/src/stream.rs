//! `Stream`: a CUDA stream hetmem made, exported to PyTorch and CuPy by its handle.

use std::sync::{Arc, Mutex, Weak};

use pyo3::prelude::*;

use crate::device::Device;
use crate::{HetmemError, to_py_err};

/// A CUDA stream of hetmem's (`hetmem::backend::cuda::Stream`, non-blocking) on the device's
/// primary context, which PyTorch and CuPy share. Its handle (`handle`, or the CUDA stream
/// protocol's `__cuda_stream__`) is what `torch.cuda.ExternalStream` and
/// `cupy.cuda.ExternalStream` take; the stream lives as long as this object, so keep it alive
/// while theirs is in use.
#[pyclass(frozen, module = "hetmem._native")]
#[derive(Debug)]
pub struct Stream {
    inner: Arc<hetmem::backend::cuda::Stream>,
    ordinal: usize,
}

/// hetmem's live streams, so that a DLPack consumer naming one by its handle
/// (`__dlpack__(stream=s.handle)`) can be followed: a stream found here is alive, and the
/// export holds it alive until the consumer's view dies.
static LIVE: Mutex<Vec<Weak<hetmem::backend::cuda::Stream>>> = Mutex::new(Vec::new());

/// The live stream of hetmem's whose handle is `handle`, if any.
pub(crate) fn live_stream(handle: usize) -> Option<Arc<hetmem::backend::cuda::Stream>> {
    let live = LIVE.lock().unwrap_or_else(|poison| poison.into_inner());
    live.iter().filter_map(Weak::upgrade).find(|stream| stream.id() == handle)
}

#[pymethods]
impl Stream {
    /// Creates a stream on `device` (a GPU: the CPU backend has no streams).
    #[new]
    fn new(device: &Device) -> PyResult<Stream> {
        let Some(cuda) = device.inner.as_cuda() else {
            let why = device.inner.cpu_fallback_reason().map(ToString::to_string).unwrap_or_default();
            return Err(HetmemError::new_err(format!(
                "no CUDA stream on the CPU backend ({why}): streams need a GPU; run where one is visible"
            )));
        };
        let inner =
            Arc::new(hetmem::backend::cuda::Stream::new(cuda).map_err(|error| to_py_err(error.into()))?);
        let mut live = LIVE.lock().unwrap_or_else(|poison| poison.into_inner());
        live.retain(|stream| stream.strong_count() > 0);
        live.push(Arc::downgrade(&inner));
        Ok(Stream { inner, ordinal: cuda.ordinal() })
    }

    /// The `CUstream` handle as an integer (what `ExternalStream` takes).
    #[getter]
    fn handle(&self) -> usize {
        self.inner.id()
    }

    /// The CUDA stream protocol (cuda.core): `(0, handle)`, version 0 of the protocol.
    fn __cuda_stream__(&self) -> (u32, usize) {
        (0, self.inner.id())
    }

    /// The CUDA device ordinal the stream belongs to.
    #[getter]
    fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// Blocks until all work queued on the stream so far has finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.synchronize()).map_err(|error| to_py_err(error.into()))
    }

    /// Whether all work queued so far has finished, without blocking.
    fn query(&self) -> PyResult<bool> {
        self.inner.is_idle().map_err(|error| to_py_err(error.into()))
    }

    fn __repr__(&self) -> String {
        format!("hetmem.Stream(handle={:#x}, device={})", self.inner.id(), self.ordinal)
    }
}
