//! DLPack capsules (the unversioned `DLManagedTensor` every DLPack consumer takes) over memory
//! a Python object owns: the capsule keeps the owner alive until the consumer calls the
//! deleter, or until the capsule dies unconsumed.

use std::ffi::{CStr, c_void};

use pyo3::ffi;
use pyo3::prelude::*;

/// DLPack's `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
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

/// DLPack's `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What a capsule's tensor points into, freed by its deleter.
struct Context {
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Keeps the memory alive; only dropped.
    _owner: Py<PyAny>,
}

const NAME: &CStr = c"dltensor";

/// The tensor's deleter: called once, by the consumer or by the unconsumed capsule.
unsafe extern "C" fn delete_tensor(tensor: *mut DlManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: `tensor` and its context were made by `capsule` with Box::into_raw, and DLPack
    // calls the deleter once.
    let tensor = unsafe { Box::from_raw(tensor) };
    // SAFETY: as above.
    let context = unsafe { Box::from_raw(tensor.manager_ctx.cast::<Context>()) };
    // SAFETY: Py_IsInitialized may be called at any time, attached or not.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        // The interpreter is shutting down (a consumer's array freed at exit): it frees every
        // object itself, and attaching to it is no longer possible.
        std::mem::forget(context);
        return;
    }
    // Consumers may call the deleter from any thread: the owner is released with the
    // interpreter attached.
    Python::attach(|_| drop(context));
}

/// The capsule's destructor: frees the tensor only if no consumer took it (a consumer renames
/// the capsule `used_dltensor` and calls the deleter itself).
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

/// A `dltensor` capsule of the memory at `address` (owned by `owner`, kept alive until the
/// consumer is done), on DLPack device `(device_type, device_id)`, with `shape` and `strides`
/// in elements and the element type `(code, bits)`.
#[pyfunction]
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
) -> PyResult<Py<PyAny>> {
    if shape.len() != strides.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "DLPack export: {} dimensions but {} strides",
            shape.len(),
            strides.len()
        )));
    }
    let ndim = i32::try_from(shape.len())
        .map_err(|_| pyo3::exceptions::PyValueError::new_err("DLPack export: too many dimensions"))?;
    let mut context = Box::new(Context { shape, strides, _owner: owner });
    let tensor = Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: address as *mut c_void,
            device: DlDevice { device_type, device_id },
            ndim,
            dtype: DlDataType { code, bits, lanes: 1 },
            // The vectors' heap blocks do not move when the box holding them does.
            shape: context.shape.as_mut_ptr(),
            strides: context.strides.as_mut_ptr(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_tensor),
    });
    let tensor = Box::into_raw(tensor);
    // SAFETY: `tensor` was just made by Box::into_raw and is not shared yet.
    unsafe { (*tensor).manager_ctx = Box::into_raw(context).cast() };
    // SAFETY: the capsule takes the tensor; its destructor frees it unless a consumer took it.
    let raw = unsafe { ffi::PyCapsule_New(tensor.cast(), NAME.as_ptr(), Some(destroy_capsule)) };
    if raw.is_null() {
        // SAFETY: no capsule holds the tensor, so it is freed here, once.
        unsafe { delete_tensor(tensor) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new, owned reference (checked non-null above).
    Ok(unsafe { Bound::from_owned_ptr(py, raw) }.unbind())
}
