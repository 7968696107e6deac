//! DLPack's structures, and capsules exported: over memory a Python object owns, either the
//! unversioned `DLManagedTensor` (`dltensor`, what every DLPack consumer takes) or, for a
//! consumer that asks for DLPack 1.x, `DLManagedTensorVersioned` (`dltensor_versioned`, which
//! can say read-only); the capsule keeps the owner alive until the consumer calls the deleter,
//! or until the capsule dies unconsumed. Other producers' capsules are read in `import`.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use hetmem::backend::cuda::Stream;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::memory::Memory;
use crate::release::followed_stream;
use crate::size::Int;

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DlDevice {
    pub(crate) device_type: i32,
    pub(crate) device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DlDataType {
    pub(crate) code: u8,
    pub(crate) bits: u8,
    pub(crate) lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
pub(crate) struct DlTensor {
    pub(crate) data: *mut c_void,
    pub(crate) device: DlDevice,
    pub(crate) ndim: i32,
    pub(crate) dtype: DlDataType,
    pub(crate) shape: *mut i64,
    pub(crate) strides: *mut i64,
    pub(crate) byte_offset: u64,
}

/// DLPack's `DLManagedTensor` (DLPack 0.x).
#[repr(C)]
pub(crate) struct DlManagedTensor {
    pub(crate) dl_tensor: DlTensor,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// DLPack's `DLPackVersion`.
#[repr(C)]
pub(crate) struct DlPackVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

/// DLPack's `DLManagedTensorVersioned` (DLPack 1.x).
#[repr(C)]
pub(crate) struct DlManagedTensorVersioned {
    pub(crate) version: DlPackVersion,
    pub(crate) manager_ctx: *mut c_void,
    pub(crate) deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    pub(crate) flags: u64,
    pub(crate) dl_tensor: DlTensor,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
pub(crate) const FLAG_READ_ONLY: u64 = 1;

/// The DLPack version hetmem's versioned capsules declare.
pub(crate) const VERSION: DlPackVersion = DlPackVersion { major: 1, minor: 0 };

/// What a capsule's tensor points into, freed by its deleter.
struct Context {
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Keeps the memory alive; only dropped, after noting the consumer's stream.
    memory: Py<Memory>,
    /// The consumer's stream, when hetmem can follow it: the memory's release waits for the
    /// work queued on it until the consumer's view died.
    consumer: Option<Arc<Stream>>,
}

pub(crate) const NAME: &CStr = c"dltensor";
pub(crate) const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// Drops a capsule's context, attached to the interpreter (consumers may call deleters from
/// any thread), or leaks it while the interpreter is shutting down.
fn release_context(context: Box<Context>) {
    // SAFETY: Py_IsInitialized may be called at any time, attached or not.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        // The interpreter is shutting down (a consumer's array freed at exit): it frees every
        // object itself, and attaching to it is no longer possible.
        std::mem::forget(context);
        return;
    }
    Python::attach(|_| {
        if let Some(stream) = &context.consumer {
            context.memory.get().uses.note_stream(stream);
        }
        drop(context);
    });
}

/// The unversioned tensor's deleter: called once, by the consumer or by the unconsumed capsule.
unsafe extern "C" fn delete_tensor(tensor: *mut DlManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: `tensor` and its context were made by `capsule` with Box::into_raw, and DLPack
    // calls the deleter once.
    let tensor = unsafe { Box::from_raw(tensor) };
    // SAFETY: as above.
    release_context(unsafe { Box::from_raw(tensor.manager_ctx.cast::<Context>()) });
}

/// The versioned tensor's deleter: as [`delete_tensor`].
unsafe extern "C" fn delete_versioned(tensor: *mut DlManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: `tensor` and its context were made by `capsule` with Box::into_raw, and DLPack
    // calls the deleter once.
    let tensor = unsafe { Box::from_raw(tensor) };
    // SAFETY: as above.
    release_context(unsafe { Box::from_raw(tensor.manager_ctx.cast::<Context>()) });
}

/// The unversioned capsule's destructor: frees the tensor only if no consumer took it (a
/// consumer renames the capsule `used_dltensor` and calls the deleter itself).
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is the capsule being destroyed; PyCapsule_IsValid sets no exception.
    if unsafe { ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) } != 1 {
        return;
    }
    // SAFETY: valid with this name (checked above), so the pointer is the tensor made by
    // `capsule`, not yet consumed.
    let tensor = unsafe { ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) }.cast::<DlManagedTensor>();
    // SAFETY: the tensor is unconsumed, so its deleter has not run.
    unsafe { delete_tensor(tensor) };
}

/// The versioned capsule's destructor (a consumer renames it `used_dltensor_versioned`).
unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is the capsule being destroyed; PyCapsule_IsValid sets no exception.
    if unsafe { ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) } != 1 {
        return;
    }
    // SAFETY: valid with this name (checked above): the unconsumed tensor made by `capsule`.
    let tensor = unsafe { ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr()) }
        .cast::<DlManagedTensorVersioned>();
    // SAFETY: the tensor is unconsumed, so its deleter has not run.
    unsafe { delete_versioned(tensor) };
}

/// DLPack's device types.
pub(crate) const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
pub(crate) const KDL_CUDA_HOST: i32 = 3;

/// DLPack type `(code, bits)` checked, with its element size (lanes are always 1 here).
///
/// # Errors
/// A type code DLPack does not define, or a bit count that is not whole bytes.
fn element_type(code: Int, bits: Int) -> PyResult<(u8, u8, usize)> {
    // Int, UInt, Float, Bfloat, Complex, Bool.
    let code = code
        .value()
        .and_then(|code| u8::try_from(code).ok())
        .filter(|code| matches!(code, 0 | 1 | 2 | 4 | 5 | 6))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "DLPack export: type code {code} is not one of DLPack's (0 int, 1 uint, 2 float, 4 bfloat, 5 \
                 complex, 6 bool)"
            ))
        })?;
    let bits = bits
        .value()
        .and_then(|bits| u8::try_from(bits).ok())
        .filter(|bits| *bits != 0 && bits.is_multiple_of(8))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "DLPack export: {bits}-bit elements; give whole bytes (8, 16, 32, 64 or 128 bits)"
            ))
        })?;
    Ok((code, bits, usize::from(bits / 8)))
}

/// A capsule of `shape` elements of DLPack type `(code, bits)` from byte `offset` of `memory`
/// (C-contiguous; checked to lie inside it), the host view (`kDLCPU`) or, with `cuda`, the
/// mapped device view (`kDLCUDA`). The capsule keeps the memory alive until the consumer is
/// done: `dltensor_versioned` (DLPack 1.0, flagged read-only for read-only memory) when
/// `versioned`, else `dltensor`, which cannot say read-only, so read-only memory is refused
/// unless `unflagged_readonly`: device views only, of a read-only window opened for it
/// (`WindowedFile.window(..., unflagged_device_view=True)`, the data loader's), for a
/// consumer that only reads; a GPU write to it faults the kernel (the memory is not changed)
/// and leaves the CUDA context unusable.
///
/// `stream` is the consumer's, as `__dlpack__(stream=...)` gives it: `1` (the legacy default
/// stream) and hetmem's own streams are followed (the memory's release waits for the work
/// queued on them until the consumer's tensor died); any other value makes the release wait
/// for the whole device. `0` is refused, as DLPack asks.
#[pyfunction]
#[pyo3(signature = (memory, offset, shape, code, bits, *, cuda = false, versioned = false, stream = None, unflagged_readonly = false))]
#[allow(clippy::too_many_arguments, reason = "mirrors DLTensor's fields and __dlpack__'s keywords")]
pub fn capsule(
    py: Python<'_>,
    memory: Bound<'_, Memory>,
    offset: Int,
    shape: Vec<Int>,
    code: Int,
    bits: Int,
    cuda: bool,
    versioned: bool,
    stream: Option<Int>,
    unflagged_readonly: bool,
) -> PyResult<Py<PyAny>> {
    let held = memory.get();
    let (code, bits, itemsize) = element_type(code, bits)?;
    let range = held.range(offset, &shape, itemsize)?;
    let readonly = held.is_readonly();
    if unflagged_readonly && !cuda {
        return Err(PyValueError::new_err(
            "DLPack export: unflagged_readonly is for device views only (a CPU write to read-only host memory \
             would crash the process)",
        ));
    }
    if unflagged_readonly && readonly && !held.unflagged_device_view() {
        return Err(PyBufferError::new_err(
            "DLPack export: unflagged_readonly for a read-only window not opened for it: a GPU write through the \
             unflagged (writable-looking) tensor would fault and lose the CUDA context; ask for max_version=(1, 0) \
             for a capsule flagged read-only, or open the window with unflagged_device_view=True (what the data \
             loader does) if the consumer only reads",
        ));
    }
    if readonly && !versioned && !unflagged_readonly {
        return Err(PyBufferError::new_err(
            "DLPack export: read-only memory in an unversioned capsule (DLPack 0.x has no read-only flag); \
             ask for max_version=(1, 0) or later",
        ));
    }
    let (address, device) = if cuda {
        let base = held.device_base()?;
        let ordinal = held.device_ordinal_i32();
        (base + range.offset as u64, DlDevice { device_type: KDL_CUDA, device_id: ordinal })
    } else {
        ((held.host_range()?.0 + range.offset) as u64, DlDevice { device_type: KDL_CPU, device_id: 0 })
    };
    // An int past 128 bits names no stream hetmem can follow, as any other unknown handle.
    let stream = stream.map(|stream| stream.value().unwrap_or(i128::MAX));
    if cuda && stream == Some(0) {
        return Err(PyBufferError::new_err(
            "DLPack export: stream 0 is ambiguous for CUDA, so DLPack forbids it; pass 1 for the legacy default \
             stream, 2 for the per-thread one, or the stream's handle",
        ));
    }
    let consumer = match (cuda, held.uses.cuda_device()) {
        (true, Some(device)) => followed_stream(device, stream),
        _ => None,
    };
    let shape_i64 = range
        .shape
        .iter()
        .map(|&extent| i64::try_from(extent))
        .collect::<Result<Vec<i64>, _>>()
        .map_err(|_| PyValueError::new_err("DLPack export: an extent past DLPack's 64-bit range"))?;
    let ndim = i32::try_from(shape_i64.len())
        .map_err(|_| PyValueError::new_err("DLPack export: too many dimensions"))?;
    let strides = range.strides_in_elements();
    if consumer.is_none() {
        held.uses.note_unknown();
    }
    let mut context =
        Box::new(Context { shape: shape_i64, strides, memory: memory.clone().unbind(), consumer });
    let dl_tensor = DlTensor {
        data: std::ptr::with_exposed_provenance_mut::<c_void>(address as usize),
        device,
        ndim,
        dtype: DlDataType { code, bits, lanes: 1 },
        // The vectors' heap blocks do not move when the box holding them does.
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let flags = if readonly && versioned { FLAG_READ_ONLY } else { 0 };
    let context = Box::into_raw(context).cast::<c_void>();
    let raw = if versioned {
        let tensor = Box::into_raw(Box::new(DlManagedTensorVersioned {
            version: VERSION,
            manager_ctx: context,
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        }));
        // SAFETY: the capsule takes the tensor; its destructor frees it unless a consumer took it.
        let raw = unsafe {
            ffi::PyCapsule_New(tensor.cast(), NAME_VERSIONED.as_ptr(), Some(destroy_versioned_capsule))
        };
        if raw.is_null() {
            // SAFETY: no capsule holds the tensor, so it is freed here, once.
            unsafe { delete_versioned(tensor) };
        }
        raw
    } else {
        let tensor = Box::into_raw(Box::new(DlManagedTensor {
            dl_tensor,
            manager_ctx: context,
            deleter: Some(delete_tensor),
        }));
        // SAFETY: the capsule takes the tensor; its destructor frees it unless a consumer took it.
        let raw = unsafe { ffi::PyCapsule_New(tensor.cast(), NAME.as_ptr(), Some(destroy_capsule)) };
        if raw.is_null() {
            // SAFETY: no capsule holds the tensor, so it is freed here, once.
            unsafe { delete_tensor(tensor) };
        }
        raw
    };
    if raw.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new, owned reference (checked non-null above).
    Ok(unsafe { Bound::from_owned_ptr(py, raw) }.unbind())
}
