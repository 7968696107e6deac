//! `PinnedPool`: pinned host memory reused instead of pinned again.

use hetmem::PinOptions;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::device::Device;
use crate::memory::Memory;
use crate::size::Int;
use crate::to_py_err;

/// A pool of pinned host memory (`hetmem::memory::PinnedPool`) within a byte budget: a buffer given
/// back (its `Memory` and every view of it dead) stays pinned for the next `acquire` of its
/// size class, so pinning is paid once.
#[pyclass(frozen, module = "hetmem._native")]
#[derive(Debug)]
pub struct PinnedPool {
    inner: hetmem::memory::PinnedPool,
    device: hetmem::Device,
}

#[pymethods]
impl PinnedPool {
    /// A pool for `device` holding at most `budget_bytes` pinned.
    #[new]
    fn new(device: &Device, budget_bytes: Int) -> PyResult<PinnedPool> {
        let budget_bytes = budget_bytes.size("pool budget_bytes")?;
        Ok(PinnedPool {
            inner: hetmem::memory::PinnedPool::new(&device.inner, budget_bytes),
            device: device.inner.clone(),
        })
    }

    /// `nbytes` of pinned memory from the pool: a cached block of the size class when there
    /// is one (holding what its last user left), else newly pinned (zeroed). A block goes
    /// back to the pool only once the GPU work that may use it has finished (see `Memory`).
    #[pyo3(signature = (nbytes, mapped = true, portable = false, write_combined = false))]
    fn acquire(
        &self,
        py: Python<'_>,
        nbytes: Int,
        mapped: bool,
        portable: bool,
        write_combined: bool,
    ) -> PyResult<Memory> {
        let nbytes = nbytes.size("pool acquire nbytes")?;
        let options = PinOptions { mapped, portable, write_combined, ..PinOptions::default() };
        let buffer = py.detach(|| self.inner.acquire::<u8>(nbytes, options)).map_err(to_py_err)?;
        Ok(Memory::from_host(buffer, &self.device))
    }

    /// The pool's counters: hits, misses, evictions, bytes_pinned, bytes_in_use,
    /// blocks_cached.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        let dict = PyDict::new(py);
        dict.set_item("hits", stats.hits)?;
        dict.set_item("misses", stats.misses)?;
        dict.set_item("evictions", stats.evictions)?;
        dict.set_item("bytes_pinned", stats.bytes_pinned)?;
        dict.set_item("bytes_in_use", stats.bytes_in_use)?;
        dict.set_item("blocks_cached", stats.blocks_cached)?;
        Ok(dict)
    }

    /// Frees every cached block.
    fn trim(&self) {
        self.inner.trim();
    }
}
