//! The native half of hetmem's Python package (`hetmem._native`): hetmem's devices, streams
//! and memory (pinned, registered in place, file windows), the views over that memory (NumPy's
//! and CUDA's array interfaces, DLPack capsules) and the reading of other producers' capsules,
//! the data loader's CPU pre-processing, safetensors checkpoints loaded into one allocation
//! (`load`), the doctor's report (`doctor`), and the cross-process frame ring (`shared`). The
//! Python half (`python/hetmem/`) gives them shapes, dtypes and the lend/reclaim rule.
//!
//! Every function here is callable from Python, underscore or not, so none trusts what the
//! Python half computed: no function takes an address (registration consumes the array's own
//! DLPack capsule and pins what owns its memory, `owner`; views take an offset and a shape
//! within a `Memory`, fixed in a frozen `View` that exports them), and every integer is
//! checked here (`size`: negative values, products and sums that overflow, ranges that leave
//! the memory). Addresses cross into Python only as the integers the protocols carry, for
//! memory a `Memory` holds alive. A `Memory` waits for the GPU work that may use it before it
//! lets its memory go (`release`), with the interpreter released (`attached`).

mod attached;
mod batch;
mod device;
mod dlpack;
mod doctor;
mod file;
mod gather;
mod import;
mod load;
mod memory;
mod owner;
mod pool;
mod register;
mod release;
mod ring;
mod shared;
mod size;
mod stream;
mod truncation;
mod view;

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
    module.add_class::<import::TensorInfo>()?;
    module.add_class::<view::View>()?;
    module.add_class::<load::LoadedCheckpoint>()?;
    module.add_function(wrap_pyfunction!(load::load_checkpoint, module)?)?;
    module.add_function(wrap_pyfunction!(load::plan_checkpoint, module)?)?;
    module.add_function(wrap_pyfunction!(load::balanced_devices, module)?)?;
    module.add_function(wrap_pyfunction!(load::link_h2d_gb_per_s, module)?)?;
    module.add_function(wrap_pyfunction!(doctor::doctor_json, module)?)?;
    module.add_function(wrap_pyfunction!(memory::pinned, module)?)?;
    module.add_function(wrap_pyfunction!(register::register, module)?)?;
    module.add_function(wrap_pyfunction!(dlpack::capsule, module)?)?;
    module.add_function(wrap_pyfunction!(import::tensor_info, module)?)?;
    module.add_function(wrap_pyfunction!(batch::prepare_batch, module)?)?;
    module.add_function(wrap_pyfunction!(gather::gather_records, module)?)?;
    module.add_function(wrap_pyfunction!(truncation::check_file, module)?)?;
    ring::register(module)?;
    shared::register(module)?;
    module.add("page_size", hetmem::memory::page_size())?;
    Ok(())
}
