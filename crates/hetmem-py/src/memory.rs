//! `Memory`: host memory hetmem made or registered, kept alive while Python (or a DLPack
//! consumer) holds it.

use std::any::Any;
use std::ptr::NonNull;

use hetmem::{HostBuf, HostKind, PinOptions, RegisterOptions};
use pyo3::prelude::*;

use crate::device::Device;
use crate::to_py_err;

/// Bytes of host memory that hetmem holds: pinned, registered in place, or a file window.
/// Its addresses are what the buffer protocols (array interface, DLPack, CUDA array
/// interface) hand to NumPy, PyTorch and CuPy; the memory lives as long as this object.
/// Weak references to it let the Python layer find a live registration covering a page.
#[pyclass(frozen, weakref, module = "hetmem._native")]
pub struct Memory {
    /// The hetmem buffer (or window) that owns or pins the memory; only dropped.
    _buffer: Box<dyn Any + Send + Sync>,
    host_ptr: usize,
    nbytes: usize,
    device_ptr: Option<u64>,
    device_ordinal: Option<usize>,
    readonly: bool,
    kind: &'static str,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").field("nbytes", &self.nbytes).field("kind", &self.kind).finish()
    }
}

impl Memory {
    pub(crate) fn from_host(mut buffer: HostBuf<u8>) -> Memory {
        // Taken from the mutable slice: Python and GPU consumers write through it.
        let host_ptr = buffer.as_mut_slice().as_mut_ptr() as usize;
        let kind = match buffer.kind() {
            HostKind::Plain => "plain",
            HostKind::DriverPinned => "pinned",
            HostKind::Registered => "registered",
        };
        Memory {
            host_ptr,
            nbytes: buffer.len(),
            device_ptr: buffer.device_ptr(),
            device_ordinal: None,
            readonly: false,
            kind,
            _buffer: Box::new(buffer),
        }
    }

    pub(crate) fn from_window(
        buffer: Box<dyn Any + Send + Sync>,
        host_ptr: usize,
        nbytes: usize,
        device_ptr: Option<u64>,
        readonly: bool,
    ) -> Memory {
        Memory { _buffer: buffer, host_ptr, nbytes, device_ptr, device_ordinal: None, readonly, kind: "file" }
    }

    /// The host address of the first byte, the size in bytes, and whether it is read-only.
    pub(crate) fn host_range(&self) -> (usize, usize, bool) {
        (self.host_ptr, self.nbytes, self.readonly)
    }

    /// The memory, noted as mapped for CUDA device `ordinal` (None: the CPU backend).
    pub(crate) fn on_ordinal(mut self, ordinal: Option<usize>) -> Memory {
        self.device_ordinal = ordinal;
        self
    }
}

#[pymethods]
impl Memory {
    /// The CPU address of the first byte.
    #[getter]
    fn host_ptr(&self) -> usize {
        self.host_ptr
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The address kernels use (zero-copy), or None when the memory is not mapped (the CPU
    /// backend, or `mapped=False`).
    #[getter]
    fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// The CUDA device the memory is mapped for, or None on the CPU backend.
    #[getter]
    fn device_ordinal(&self) -> Option<usize> {
        self.device_ordinal
    }

    /// Whether the memory is read-only (a read-only file window).
    #[getter]
    fn readonly(&self) -> bool {
        self.readonly
    }

    /// `"pinned"` (driver-allocated), `"registered"`, `"plain"` (the CPU backend) or `"file"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }
}

/// `nbytes` zeroed bytes of pinned host memory (plain memory on the CPU backend).
#[pyfunction]
#[pyo3(signature = (device, nbytes, mapped = true, portable = false, write_combined = false))]
pub fn pinned(
    py: Python<'_>,
    device: &Device,
    nbytes: usize,
    mapped: bool,
    portable: bool,
    write_combined: bool,
) -> PyResult<Memory> {
    let options = PinOptions { mapped, portable, write_combined, ..PinOptions::default() };
    let buffer = py.detach(|| HostBuf::<u8>::pinned(&device.inner, nbytes, options)).map_err(to_py_err)?;
    Ok(Memory::from_host(buffer).on_ordinal(device.inner.as_cuda().map(|cuda| cuda.ordinal())))
}

/// Registers `nbytes` at `address`, memory that `owner` keeps alive, in place (the pages
/// covering it are pinned). The Python layer takes `address` and `nbytes` from the owner's own
/// array interface or DLPack capsule.
#[pyfunction]
#[pyo3(signature = (device, owner, address, nbytes, mapped = true, portable = false))]
pub fn register(
    py: Python<'_>,
    device: &Device,
    owner: Py<PyAny>,
    address: usize,
    nbytes: usize,
    mapped: bool,
    portable: bool,
) -> PyResult<Memory> {
    if address == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err("registration: a null address"));
    }
    let options = RegisterOptions { mapped, portable, ..RegisterOptions::default() };
    let registered = py.detach(|| {
        let ptr = NonNull::new(address as *mut u8).expect("checked non-null above");
        // SAFETY: `address` and `nbytes` come from `owner`'s array interface or DLPack capsule
        // (a C-contiguous, writable array in host memory): the bytes live while `owner` does, and `owner` moves into the
        // buffer, which lets it go only after unregistering. A page already registered is
        // refused by the driver.
        unsafe { HostBuf::register_in_place(&device.inner, owner, ptr, nbytes, options) }
    });
    let buffer = registered.map_err(|failure| to_py_err(failure.error))?;
    Ok(Memory::from_host(buffer).on_ordinal(device.inner.as_cuda().map(|cuda| cuda.ordinal())))
}
