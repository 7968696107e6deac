//! `Memory`: host memory hetmem made or registered, kept alive while Python (or a DLPack
//! consumer) holds it, and let go only after the GPU work that may use it has finished.

use std::any::Any;
use std::mem::ManuallyDrop;

use hetmem::{HostBuf, PinOptions, memory::HostKind};
use pyo3::prelude::*;

use crate::device::Device;
use crate::release::GpuUses;
use crate::size::Int;
use crate::view::Range;
use crate::{HetmemError, to_py_err};

/// Bytes of host memory that hetmem holds: pinned, registered in place, or a file window.
/// Views of it (the array interface, the CUDA array interface, DLPack) are made here, in
/// Rust, each checked to lie inside it; the memory lives as long as this object and every
/// view. When it goes, it first waits for the GPU work that may still use it (see
/// `release`), so a pooled block is not reused, a staged window not written back, and
/// pinned memory not freed under a kernel.
#[pyclass(frozen, weakref, module = "hetmem._native")]
pub struct Memory {
    /// What owns or pins the memory (a hetmem buffer or window, or a registration's share):
    /// only dropped, by `Drop`, after `uses` has been waited for.
    holder: ManuallyDrop<Box<dyn Any + Send + Sync>>,
    /// None for device memory, which the CPU cannot address.
    host_ptr: Option<usize>,
    nbytes: usize,
    device_ptr: Option<u64>,
    device_ordinal: Option<usize>,
    readonly: bool,
    /// A read-only window whose device view may go out in an unversioned capsule, which
    /// cannot say read-only (see `WindowedFile.window`).
    unflagged_device_view: bool,
    kind: &'static str,
    pub(crate) uses: GpuUses,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").field("nbytes", &self.nbytes).field("kind", &self.kind).finish()
    }
}

/// What a memory is, apart from what holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// The CPU address of the first byte, taken from a mutable slice or a registration's
    /// writable pointer where the memory is writable.
    pub(crate) host_ptr: usize,
    pub(crate) nbytes: usize,
    pub(crate) device_ptr: Option<u64>,
    pub(crate) readonly: bool,
    pub(crate) kind: &'static str,
}

impl Layout {
    /// A writable host buffer's layout.
    pub(crate) fn of_host(buffer: &mut HostBuf<u8>) -> Layout {
        Layout {
            // Taken from the mutable slice: Python and GPU consumers write through it.
            host_ptr: buffer.as_mut_slice().as_mut_ptr() as usize,
            nbytes: buffer.len(),
            device_ptr: buffer.device_ptr(),
            readonly: false,
            kind: kind_name(buffer.kind()),
        }
    }
}

/// The name Python sees for a host buffer's kind.
fn kind_name(kind: HostKind) -> &'static str {
    match kind {
        HostKind::Plain => "plain",
        HostKind::DriverPinned => "pinned",
        HostKind::Registered => "registered",
    }
}

impl Memory {
    /// Memory held by `holder`, described by `layout`, of `device`.
    pub(crate) fn new(holder: Box<dyn Any + Send + Sync>, layout: Layout, device: &hetmem::Device) -> Memory {
        Memory {
            holder: ManuallyDrop::new(holder),
            host_ptr: Some(layout.host_ptr),
            nbytes: layout.nbytes,
            device_ptr: layout.device_ptr,
            device_ordinal: device.as_cuda().map(|cuda| cuda.ordinal()),
            readonly: layout.readonly,
            unflagged_device_view: false,
            kind: layout.kind,
            uses: GpuUses::new(device),
        }
    }

    pub(crate) fn from_host(mut buffer: HostBuf<u8>, device: &hetmem::Device) -> Memory {
        let layout = Layout::of_host(&mut buffer);
        Memory::new(Box::new(buffer), layout, device)
    }

    /// A file window's memory, of no device until [`Memory::on_device`] says which;
    /// `unflagged_device_view` only for a read-only window (see `WindowedFile.window`).
    pub(crate) fn from_window(
        window: Box<dyn Any + Send + Sync>,
        host_ptr: usize,
        nbytes: usize,
        device_ptr: Option<u64>,
        readonly: bool,
        unflagged_device_view: bool,
    ) -> Memory {
        Memory {
            holder: ManuallyDrop::new(window),
            host_ptr: Some(host_ptr),
            nbytes,
            device_ptr,
            device_ordinal: None,
            readonly,
            unflagged_device_view: readonly && unflagged_device_view,
            kind: "file",
            uses: GpuUses::none(),
        }
    }

    /// The memory, belonging to `device`: its release waits for that device's work.
    pub(crate) fn on_device(mut self, device: &hetmem::Device) -> Memory {
        self.device_ordinal = device.as_cuda().map(|cuda| cuda.ordinal());
        self.uses = GpuUses::new(device);
        self
    }

    /// A device allocation's memory (`"device"`): no host views, only device views (on a GPU;
    /// the CPU backend's allocations are host memory, made with [`Memory::from_host`]).
    pub(crate) fn from_device(buffer: hetmem::DeviceBuf<u8>, device: &hetmem::Device) -> Memory {
        let (nbytes, device_ptr) = (buffer.len(), buffer.device_ptr());
        Memory {
            holder: ManuallyDrop::new(Box::new(buffer)),
            host_ptr: None,
            nbytes,
            device_ptr,
            device_ordinal: device.as_cuda().map(|cuda| cuda.ordinal()),
            readonly: false,
            unflagged_device_view: false,
            kind: "device",
            uses: GpuUses::new(device),
        }
    }

    /// The host address of the first byte, the size in bytes, and whether it is read-only.
    ///
    /// # Errors
    /// `HetmemError` for device memory, which has no host address.
    pub(crate) fn host_range(&self) -> PyResult<(usize, usize, bool)> {
        let host_ptr = self.host_ptr.ok_or_else(|| {
            HetmemError::new_err(
                "no host view: the memory is a device allocation the CPU cannot address; copy the tensor to the \
                 host (tensor.cpu())",
            )
        })?;
        Ok((host_ptr, self.nbytes, self.readonly))
    }

    /// The size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.nbytes
    }

    /// Whether the memory is read-only.
    pub(crate) fn is_readonly(&self) -> bool {
        self.readonly
    }

    /// The host address of an output `needed` bytes long written from `source`: an error
    /// (`what` names the loop) unless this memory is writable, holds them and does not overlap
    /// `source`.
    pub(crate) fn output_for(&self, needed: usize, source: &Memory, what: &str) -> PyResult<usize> {
        let (host_ptr, source_ptr) = (self.host_range()?.0, source.host_range()?.0);
        if self.readonly || needed > self.nbytes {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{what}: the output holds {} bytes{}; {needed} writable bytes are needed",
                self.nbytes,
                if self.readonly { ", read-only" } else { "" }
            )));
        }
        // Both ranges lie inside their memories (each ends at an address that exists), so
        // these sums do not overflow.
        if source_ptr < host_ptr + needed && host_ptr < source_ptr + source.nbytes {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{what}: the output overlaps the records; write the batch elsewhere"
            )));
        }
        Ok(host_ptr)
    }

    /// Whether this read-only window's device view may be exported in an unversioned capsule.
    pub(crate) fn unflagged_device_view(&self) -> bool {
        self.unflagged_device_view
    }

    /// The hetmem buffer or window that holds the memory (`truncation` looks for windows).
    pub(crate) fn owner(&self) -> &(dyn Any + Send + Sync) {
        &**self.holder
    }

    /// The device address of the first byte, or an error naming why there is none.
    pub(crate) fn device_base(&self) -> PyResult<u64> {
        self.device_ptr.ok_or_else(|| {
            HetmemError::new_err(
                "no device view: the memory is not mapped for a GPU (the CPU backend, or made with mapped=False)",
            )
        })
    }

    /// The CUDA device ordinal as DLPack's `device_id` (0 on the CPU backend, which has no
    /// device views).
    pub(crate) fn device_ordinal_i32(&self) -> i32 {
        self.device_ordinal.and_then(|ordinal| i32::try_from(ordinal).ok()).unwrap_or(0)
    }

    /// A checked range of this memory.
    pub(crate) fn range(&self, offset: Int, shape: &[Int], itemsize: usize) -> PyResult<Range> {
        Range::new(self.nbytes, offset, shape, itemsize)
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // Waiting can take as long as the GPU's queued work, and letting the memory go (freeing
        // or unregistering pinned memory, writing a staged window back) takes milliseconds:
        // other Python threads run meanwhile. The holder's Python parts drop attached
        // (`attached`).
        let released = Python::try_attach(|py| py.detach(|| release(&self.uses, &mut self.holder)))
            .unwrap_or_else(|| release(&self.uses, &mut self.holder));
        if let Err(why) = released {
            let message = format!(
                "hetmem: {why}; the {} bytes of {} memory are leaked rather than released while GPU work may \
                 still use them",
                self.nbytes, self.kind
            );
            Python::try_attach(|py| HetmemError::new_err(message.clone()).write_unraisable(py, None))
                .unwrap_or_else(|| eprintln!("{message}"));
        }
    }
}

/// Waits for the GPU work that may use the memory, then drops its holder; after a failed
/// wait the holder is kept (leaked), since that work may still use the memory.
fn release(uses: &GpuUses, holder: &mut ManuallyDrop<Box<dyn Any + Send + Sync>>) -> Result<(), String> {
    uses.wait()?;
    // SAFETY: called once, from drop, and `holder` is not used after it.
    unsafe { ManuallyDrop::drop(holder) };
    Ok(())
}

#[pymethods]
impl Memory {
    /// The CPU address of the first byte, or None for device memory.
    #[getter]
    fn host_ptr(&self) -> Option<usize> {
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

    /// `"pinned"` (driver-allocated), `"registered"`, `"plain"` (the CPU backend), `"file"` or
    /// `"device"` (a device allocation: device views only).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn __repr__(&self) -> String {
        format!("hetmem._native.Memory(nbytes={}, kind={:?})", self.nbytes, self.kind)
    }
}

/// `nbytes` zeroed bytes of pinned host memory (plain memory on the CPU backend).
#[pyfunction]
#[pyo3(signature = (device, nbytes, mapped = true, portable = false, write_combined = false))]
pub fn pinned(
    py: Python<'_>,
    device: &Device,
    nbytes: Int,
    mapped: bool,
    portable: bool,
    write_combined: bool,
) -> PyResult<Memory> {
    let nbytes = nbytes.size("pinned nbytes")?;
    let options = PinOptions { mapped, portable, write_combined, ..PinOptions::default() };
    let buffer = py.detach(|| HostBuf::<u8>::pinned(&device.inner, nbytes, options)).map_err(to_py_err)?;
    Ok(Memory::from_host(buffer, &device.inner))
}
