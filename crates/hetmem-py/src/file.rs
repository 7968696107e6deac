//! `WindowedFile`: a file whose byte ranges are mapped and registered on demand.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::device::Device;
use crate::memory::Memory;
use crate::size::Int;
use crate::to_py_err;

/// A file opened for windows (`hetmem::memory::WindowedFile`): each window maps a byte range
/// and registers it with the GPU, so kernels read (or write) the page cache in place.
///
/// As for any file mapping, the file must not be truncated or changed by others while a
/// window of it lives.
#[pyclass(frozen, module = "hetmem._native")]
#[derive(Debug)]
pub struct WindowedFile {
    inner: hetmem::memory::WindowedFile,
    device: Py<Device>,
}

#[pymethods]
impl WindowedFile {
    /// Opens `path` read-only, or read-write with `writable=True`.
    #[new]
    #[pyo3(signature = (device, path, writable = false))]
    fn new(device: Py<Device>, path: PathBuf, writable: bool) -> PyResult<WindowedFile> {
        let opened = {
            let inner = &device.get().inner;
            // SAFETY: the documented contract of this class (and of hetmem.MappedFile): the
            // file is not truncated or modified by others while a window lives.
            unsafe {
                if writable {
                    hetmem::memory::WindowedFile::open_rw(inner, &path)
                } else {
                    hetmem::memory::WindowedFile::open(inner, &path)
                }
            }
        };
        Ok(WindowedFile { inner: opened.map_err(to_py_err)?, device })
    }

    /// The file's size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.len_bytes()
    }

    /// Whether read-write windows can be made.
    #[getter]
    fn writable(&self) -> bool {
        self.inner.is_writable()
    }

    /// Maps and registers the bytes `[offset, offset + nbytes)`; read-write (`MAP_SHARED`, so
    /// writes reach the file through the page cache) with `writable=True`.
    ///
    /// `unflagged_device_view` (read-only windows only) lets the window's device view go out
    /// in an unversioned DLPack capsule (`capsule(..., unflagged_readonly=True)`), which cannot
    /// say read-only, for a consumer that only reads but takes no other kind (the data
    /// loader's PyTorch view). The consumer's tensor then looks writable: a GPU write to it
    /// faults the kernel (the file is not changed) and leaves the CUDA context unusable for
    /// the rest of the process. Other windows are exported to device consumers only in
    /// capsules flagged read-only.
    #[pyo3(signature = (offset, nbytes, writable = false, unflagged_device_view = false))]
    fn window(
        &self,
        py: Python<'_>,
        offset: Int,
        nbytes: Int,
        writable: bool,
        unflagged_device_view: bool,
    ) -> PyResult<Memory> {
        let (offset, nbytes) = window_range(offset, nbytes)?;
        let end = offset.checked_add(nbytes).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err("file window: offset + nbytes overflows")
        })?;
        let memory = if writable {
            let mut window = py.detach(|| self.inner.window_mut::<u8>(offset..end)).map_err(to_py_err)?;
            let host_ptr = window.as_mut_slice().as_mut_ptr() as usize;
            let device_ptr = window.device_ptr();
            Memory::from_window(Box::new(window), host_ptr, nbytes as usize, device_ptr, false, false)
        } else {
            let window = py.detach(|| self.inner.window::<u8>(offset..end)).map_err(to_py_err)?;
            let host_ptr = window.as_slice().as_ptr() as usize;
            let device_ptr = window.device_ptr();
            Memory::from_window(
                Box::new(window),
                host_ptr,
                nbytes as usize,
                device_ptr,
                true,
                unflagged_device_view,
            )
        };
        Ok(memory.on_device(&self.device.get().inner))
    }
}

/// A window's offset and size from Python, checked (the window itself checks the file).
fn window_range(offset: Int, nbytes: Int) -> PyResult<(u64, u64)> {
    Ok((offset.size("file window offset")? as u64, nbytes.size("file window nbytes")? as u64))
}
