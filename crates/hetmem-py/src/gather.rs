//! The data loader's staged gather: whole records of a window copied into a pinned batch, with
//! a truncation of the window's file while it runs recovered (an exception, not SIGBUS). NumPy's
//! `take` over a window's view would read the mapping unguarded.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::memory::Memory;
use crate::size::{Int, product, sizes};
use crate::truncation;

/// Copies record `indices[i]` of `records` (`record_bytes` each, back to back) to record `i`
/// of `out`. Every integer is checked here, every size derived with checked arithmetic. Only
/// hetmem's own windows are guarded against truncation: memory registered over another
/// library's file mapping (an `np.memmap`) is read as it is, and faults as it would in NumPy.
#[pyfunction]
pub fn gather_records(
    py: Python<'_>,
    records: &Memory,
    record_bytes: Int,
    indices: Vec<Int>,
    out: &Memory,
) -> PyResult<()> {
    let record_bytes = record_bytes.size("gather record_bytes")?;
    let indices = sizes(&indices, "gather indices")?;
    if record_bytes == 0 {
        return Err(PyValueError::new_err("gather: record_bytes is 0; a record holds at least one byte"));
    }
    let (records_ptr, records_bytes, _) = records.host_range()?;
    let count = records_bytes / record_bytes;
    if let Some(&index) = indices.iter().find(|&&index| index >= count) {
        return Err(PyValueError::new_err(format!("gather: record {index} of {count}")));
    }
    let needed = product([indices.len(), record_bytes], "gather output")?;
    let out_ptr = out.output_for(needed, records, "gather")?;
    let gather = || {
        for (slot, &index) in indices.iter().enumerate() {
            // index < count and slot < indices.len(): both products lie inside their memory.
            let source = records_ptr + index * record_bytes;
            let target = out_ptr + slot * record_bytes;
            // SAFETY: the record lies inside `records` and the slot inside `out` (checked
            // above, with checked arithmetic), which the caller's references keep alive; they
            // do not overlap and `out` is writable (`output_for`). Another
            // thread writing the memory meanwhile would be the caller's race on its contents,
            // as with any NumPy array; it cannot move or free it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    std::ptr::with_exposed_provenance::<u8>(source),
                    std::ptr::with_exposed_provenance_mut::<u8>(target),
                    record_bytes,
                );
            }
        }
    };
    py.detach(|| truncation::guarded(records, || truncation::guarded(out, gather)))
        .and_then(|inner| inner)
        .map_err(crate::to_py_err)
}
