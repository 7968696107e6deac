//! The native half of hetmem's Python package (`hetmem._native`): hetmem's devices, streams
//! and memory (pinned, registered in place, file windows), DLPack capsules over them (and the
//! reading of other producers' capsules), and the data loader's CPU pre-processing. The
//! Python half (`python/hetmem/`) gives them shapes, dtypes, NumPy, DLPack and CUDA array
//! interface views and the lend/reclaim rule; addresses cross into Python only as the integers
//! those protocols carry.

mod batch;
mod device;
mod dlpack;
mod file;
mod memory;
mod pool;
mod stream;

use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    HetmemError,
    pyo3::exceptions::PyRuntimeError,
    "An error of the hetmem library; its message names the cause and a remedy."
);

/// hetmem's errors as Python exceptions: invalid arguments as `ValueError`, the rest as
/// `HetmemError`, each with the library's message (cause and remedy).
fn to_py_err(error: hetmem::Error) -> PyErr {
    match error {
        hetmem::Error::InvalidArgument { .. } => pyo3::exceptions::PyValueError::new_err(error.to_string()),
        other => HetmemError::new_err(other.to_string()),
    }
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("HetmemError", module.py().get_type::<HetmemError>())?;
    module.add_class::<device::Device>()?;
    module.add_class::<memory::Memory>()?;
    module.add_class::<file::WindowedFile>()?;
    module.add_class::<pool::PinnedPool>()?;
    module.add_class::<stream::Stream>()?;
    module.add_class::<dlpack::TensorInfo>()?;
    module.add_function(wrap_pyfunction!(memory::pinned, module)?)?;
    module.add_function(wrap_pyfunction!(memory::register, module)?)?;
    module.add_function(wrap_pyfunction!(dlpack::capsule, module)?)?;
    module.add_function(wrap_pyfunction!(dlpack::tensor_info, module)?)?;
    module.add_function(wrap_pyfunction!(batch::prepare_batch, module)?)?;
    module.add("page_size", hetmem::memory::page_size())?;
    Ok(())
}
