//! `Device`: the GPU hetmem uses, or the CPU backend where there is none.

use pyo3::prelude::*;

use crate::size::Int;
use crate::to_py_err;

/// The device hetmem's memory belongs to: a CUDA device (device 0 unless another is opened by
/// `open_cuda`), or the CPU backend where no GPU can be used (then `fallback_reason` says
/// why). `HETMEM_BACKEND=cpu|cuda` forces the choice `open_best` makes.
#[pyclass(frozen, module = "hetmem._native")]
#[derive(Debug)]
pub struct Device {
    pub(crate) inner: hetmem::Device,
}

#[pymethods]
impl Device {
    /// Opens the best device of this machine (`hetmem::Device::open_best`).
    #[staticmethod]
    fn open_best() -> PyResult<Device> {
        hetmem::Device::open_best().map(|inner| Device { inner }).map_err(|error| to_py_err(error.into()))
    }

    /// CUDA device `ordinal` (its primary context, which PyTorch and CuPy share).
    ///
    /// Errors: a negative or huge ordinal (`ValueError`); CUDA unusable here, or no such
    /// device (`HetmemError` listing the GPUs present).
    #[staticmethod]
    fn open_cuda(ordinal: Int) -> PyResult<Device> {
        let ordinal = ordinal.size("CUDA device ordinal")?;
        // Where CUDA cannot run, why (no driver, ...) is the answer, not an empty list.
        let present = hetmem::backend::cuda::CudaDevice::names().map_err(|reason| {
            crate::HetmemError::new_err(format!(
                "CUDA device {ordinal} cannot be opened: CUDA cannot run here ({reason}); use the CPU backend \
                 (hetmem.device()) or fix the CUDA setup"
            ))
        })?;
        if ordinal >= present.len() {
            let listed = if present.is_empty() {
                "none".to_string()
            } else {
                present
                    .iter()
                    .enumerate()
                    .map(|(at, name)| format!("cuda:{at} ({name})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(crate::HetmemError::new_err(format!(
                "CUDA device {ordinal} does not exist; present: {listed}; give one of those (CUDA_VISIBLE_DEVICES \
                 renumbers them)"
            )));
        }
        hetmem::Device::open_ordinal(ordinal)
            .map(|inner| Device { inner })
            .map_err(|error| to_py_err(error.into()))
    }

    /// The names of the CUDA devices present, by ordinal; empty where CUDA cannot run.
    #[staticmethod]
    fn cuda_names() -> Vec<String> {
        hetmem::backend::cuda::CudaDevice::names().unwrap_or_default()
    }

    /// `"cuda"` or `"cpu"`.
    #[getter]
    fn backend(&self) -> &'static str {
        match self.inner.backend() {
            hetmem::BackendKind::Cuda => "cuda",
            hetmem::BackendKind::Cpu => "cpu",
        }
    }

    /// The CUDA device ordinal, or None on the CPU backend.
    #[getter]
    fn ordinal(&self) -> Option<usize> {
        self.inner.as_cuda().map(|cuda| cuda.ordinal())
    }

    /// The GPU's or the CPU's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name()
    }

    /// Why hetmem fell back to the CPU backend, or None.
    #[getter]
    fn fallback_reason(&self) -> Option<String> {
        self.inner.cpu_fallback_reason().map(ToString::to_string)
    }

    /// Waits for all work on the GPU (`cuCtxSynchronize` on the primary context, which PyTorch
    /// and CuPy share); nothing to wait for on the CPU backend.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        match self.inner.as_cuda() {
            Some(cuda) => py.detach(|| cuda.synchronize()).map_err(|error| to_py_err(error.into())),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!("Device(backend={:?}, name={:?})", self.backend(), self.inner.name())
    }
}
