//! `doctor_json`: the report `hetmem doctor` gathers (hetmem-bench's `doctor::Report`: the
//! backend, the driver, each GPU, the pairs, the host, and every check with its remedy), as
//! the JSON `hetmem doctor --json` prints.

use pyo3::prelude::*;

use crate::HetmemError;
use crate::device::Device;

/// The doctor's report on `device`'s machine as JSON (the field names of
/// `hetmem doctor --json`, without its schema line), gathered with the interpreter released.
#[pyfunction]
pub fn doctor_json(py: Python<'_>, device: &Device) -> PyResult<String> {
    let report = py.detach(|| hetmem_bench::doctor::Report::gather(&device.inner));
    serde_json::to_string(&report).map_err(|error| HetmemError::new_err(format!("doctor: {error}")))
}
