//! DLPack capsules both ways. Export: over memory a Python object owns, either the unversioned
//! `DLManagedTensor` (`dltensor`, what every DLPack consumer takes) or, for a consumer that asks
//! for DLPack 1.x, `DLManagedTensorVersioned` (`dltensor_versioned`, which can say read-only);
//! the capsule keeps the owner alive until the consumer calls the deleter, or until the capsule
//! dies unconsumed. Import: the fields of a producer's capsule, read without consuming it.

use std::ffi::{CStr, c_void};

use pyo3::ffi;
use pyo3::prelude::*;

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensor` (DLPack 0.x).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// DLPack's `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// DLPack's `DLManagedTensorVersioned` (DLPack 1.x).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
const FLAG_READ_ONLY: u64 = 1;

/// The DLPack version hetmem's versioned capsules declare.
const VERSION: DlPackVersion = DlPackVersion { major: 1, minor: 0 };

/// What a capsule's tensor points into, freed by its deleter.
struct Context {
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Keeps the memory alive; only dropped.
    _owner: Py<PyAny>,
}

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

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
    Python::attach(|_| drop(context));
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

/// A capsule of the memory at `address` (owned by `owner`, kept alive until the consumer is
/// done), on DLPack device `(device_type, device_id)`, with `shape` and `strides` in elements
/// and the element type `(code, bits)`: `dltensor_versioned` (DLPack 1.0, flagged read-only
/// when `readonly`) when `versioned`, else `dltensor` (which cannot say read-only, so a
/// read-only export is refused by the Python layer before it gets here).
#[pyfunction]
#[pyo3(signature = (owner, address, device_type, device_id, shape, strides, code, bits, versioned = false, readonly = false))]
#[allow(
    clippy::too_many_arguments,
    reason = "mirrors DLTensor's fields, called by hetmem's Python half only"
)]
pub fn capsule(
    py: Python<'_>,
    owner: Py<PyAny>,
    address: u64,
    device_type: i32,
    device_id: i32,
    shape: Vec<i64>,
    strides: Vec<i64>,
    code: u8,
    bits: u8,
    versioned: bool,
    readonly: bool,
) -> PyResult<Py<PyAny>> {
    if shape.len() != strides.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "DLPack export: {} dimensions but {} strides",
            shape.len(),
            strides.len()
        )));
    }
    if readonly && !versioned {
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "DLPack export: read-only memory in an unversioned capsule (DLPack 0.x has no read-only flag); \
             ask for max_version=(1, 0) or later",
        ));
    }
    let ndim = i32::try_from(shape.len())
        .map_err(|_| pyo3::exceptions::PyValueError::new_err("DLPack export: too many dimensions"))?;
    let mut context = Box::new(Context { shape, strides, _owner: owner });
    let dl_tensor = DlTensor {
        data: address as *mut c_void,
        device: DlDevice { device_type, device_id },
        ndim,
        dtype: DlDataType { code, bits, lanes: 1 },
        // The vectors' heap blocks do not move when the box holding them does.
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let context = Box::into_raw(context).cast::<c_void>();
    let raw = if versioned {
        let flags = if readonly { FLAG_READ_ONLY } else { 0 };
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

/// What a producer's capsule describes, read without consuming it (the capsule stays the
/// producer's: keeping it alive keeps the memory alive, and its destructor gives it back).
#[pyclass(frozen, get_all, module = "hetmem._native")]
#[derive(Debug)]
pub struct TensorInfo {
    /// The address of the first element (`data + byte_offset`).
    address: u64,
    device_type: i32,
    device_id: i32,
    shape: Vec<i64>,
    /// In elements; None where the producer left them out (C-contiguous).
    strides: Option<Vec<i64>>,
    code: u8,
    bits: u8,
    lanes: u16,
    /// Flagged read-only by a versioned producer.
    readonly: bool,
}

/// Reads the tensor a `dltensor` or `dltensor_versioned` capsule describes, without consuming it.
#[pyfunction]
pub fn tensor_info(capsule: &Bound<'_, PyAny>) -> PyResult<TensorInfo> {
    let raw = capsule.as_ptr();
    // SAFETY: `raw` is a live object (borrowed from `capsule`); PyCapsule_IsValid accepts any
    // object and sets no exception.
    let unversioned = unsafe { ffi::PyCapsule_IsValid(raw, NAME.as_ptr()) } == 1;
    // SAFETY: as above.
    let versioned = unsafe { ffi::PyCapsule_IsValid(raw, NAME_VERSIONED.as_ptr()) } == 1;
    let (tensor, flags) = if unversioned {
        // SAFETY: a valid capsule of this name holds a DLManagedTensor (the DLPack contract).
        let managed = unsafe { ffi::PyCapsule_GetPointer(raw, NAME.as_ptr()) }.cast::<DlManagedTensor>();
        // SAFETY: as above; the tensor lives while the unconsumed capsule does.
        (unsafe { &(*managed).dl_tensor }, 0)
    } else if versioned {
        // SAFETY: a valid capsule of this name holds a DLManagedTensorVersioned.
        let managed = unsafe { ffi::PyCapsule_GetPointer(raw, NAME_VERSIONED.as_ptr()) }
            .cast::<DlManagedTensorVersioned>();
        // SAFETY: as above; the tensor lives while the unconsumed capsule does.
        let managed = unsafe { &*managed };
        if managed.version.major != VERSION.major {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "DLPack import: a capsule of DLPack {}.{}; hetmem reads major version {}",
                managed.version.major, managed.version.minor, VERSION.major
            )));
        }
        (&managed.dl_tensor, managed.flags)
    } else {
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "DLPack import: not an unconsumed DLPack capsule (`dltensor` or `dltensor_versioned`); pass the \
             object itself, not a capsule taken from it already",
        ));
    };
    let ndim = usize::try_from(tensor.ndim)
        .map_err(|_| pyo3::exceptions::PyBufferError::new_err("DLPack import: a negative ndim"))?;
    let shape = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack's contract: `shape` holds `ndim` extents, alive while the capsule is.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }.to_vec()
    };
    let strides = (!tensor.strides.is_null() && ndim > 0)
        // SAFETY: DLPack's contract: a non-null `strides` holds `ndim` strides, alive while
        // the capsule is.
        .then(|| unsafe { std::slice::from_raw_parts(tensor.strides, ndim) }.to_vec());
    Ok(TensorInfo {
        address: (tensor.data as u64).wrapping_add(tensor.byte_offset),
        device_type: tensor.device.device_type,
        device_id: tensor.device.device_id,
        shape,
        strides,
        code: tensor.dtype.code,
        bits: tensor.dtype.bits,
        lanes: tensor.dtype.lanes,
        readonly: flags & FLAG_READ_ONLY != 0,
    })
}
