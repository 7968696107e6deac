//! Other producers' DLPack capsules: consumed (registration keeps the tensor, and calls the
//! producer's deleter when it is done), or their fields read for inspection alone.

use std::ffi::CStr;
use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack::{
    DlManagedTensor, DlManagedTensorVersioned, DlTensor, FLAG_READ_ONLY, KDL_CPU, KDL_CUDA_HOST, NAME,
    NAME_VERSIONED, VERSION,
};

/// What a producer's capsule describes.
#[pyclass(frozen, get_all, module = "hetmem._native")]
#[derive(Debug, Clone)]
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

/// The most dimensions hetmem reads from a producer's capsule (NumPy's limit).
const MAX_IMPORT_DIMS: usize = 64;

const NAME_USED: &CStr = c"used_dltensor";
const NAME_USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// A producer's tensor behind a capsule, as its pointer and kind.
#[derive(Clone, Copy)]
enum Managed {
    Unversioned(NonNull<DlManagedTensor>),
    Versioned(NonNull<DlManagedTensorVersioned>),
}

/// The managed tensor inside `capsule`, if it is an unconsumed DLPack capsule, and the name it
/// has.
fn managed(capsule: &Bound<'_, PyAny>) -> Option<(Managed, &'static CStr)> {
    let raw = capsule.as_ptr();
    for (name, versioned) in [(NAME, false), (NAME_VERSIONED, true)] {
        // SAFETY: `raw` is a live object (borrowed from `capsule`); PyCapsule_IsValid accepts any
        // object and sets no exception.
        if unsafe { ffi::PyCapsule_IsValid(raw, name.as_ptr()) } != 1 {
            continue;
        }
        // SAFETY: a valid capsule of this name (checked above): its pointer is not null.
        let pointer = NonNull::new(unsafe { ffi::PyCapsule_GetPointer(raw, name.as_ptr()) })?;
        let managed =
            if versioned { Managed::Versioned(pointer.cast()) } else { Managed::Unversioned(pointer.cast()) };
        return Some((managed, name));
    }
    None
}

/// Refuses a versioned tensor of a major version hetmem does not read, before any other field
/// is read (DLPack's rule: the layout past `version` may differ).
fn check_version(managed: Managed) -> PyResult<()> {
    if let Managed::Versioned(tensor) = managed {
        // SAFETY: a `dltensor_versioned` capsule's pointer is a DLManagedTensorVersioned (the
        // DLPack contract), alive while the capsule is unconsumed; `version` comes first in
        // every version's layout.
        let version = unsafe { &(*tensor.as_ptr()).version };
        if version.major != VERSION.major {
            return Err(PyBufferError::new_err(format!(
                "DLPack import: a capsule of DLPack {}.{}; hetmem reads major version {}",
                version.major, version.minor, VERSION.major
            )));
        }
    }
    Ok(())
}

/// The tensor and flags of a managed tensor of a version hetmem reads.
///
/// # Safety
/// `managed` points to a live managed tensor of its kind, of a version [`check_version`]
/// took, which stays alive while the returned reference is used.
unsafe fn fields<'a>(managed: Managed) -> (&'a DlTensor, u64) {
    match managed {
        // SAFETY: the caller's contract.
        Managed::Unversioned(tensor) => (unsafe { &(*tensor.as_ptr()).dl_tensor }, 0),
        Managed::Versioned(tensor) => {
            // SAFETY: the caller's contract.
            let tensor = unsafe { &*tensor.as_ptr() };
            (&tensor.dl_tensor, tensor.flags)
        }
    }
}

fn not_a_capsule() -> PyErr {
    PyBufferError::new_err(
        "DLPack import: not an unconsumed DLPack capsule (`dltensor` or `dltensor_versioned`); pass the object \
         itself, not a capsule taken from it already",
    )
}

/// A producer's tensor that hetmem consumed: its capsule was renamed `used_dltensor` (or
/// `used_dltensor_versioned`), so no other consumer can take it and the capsule's destructor
/// leaves it alone, and the producer's deleter runs once, attached to the interpreter, when
/// this drops. By DLPack's contract the producer keeps the tensor's memory until then.
pub(crate) struct ConsumedTensor(Managed);

// SAFETY: the pointer is only handed to the producer's deleter, once, attached to the
// interpreter (DLPack lets a consumer call the deleter from any thread); nothing reads
// through it after `consume`.
unsafe impl Send for ConsumedTensor {}
// SAFETY: as above: a shared `ConsumedTensor` gives no access to the tensor.
unsafe impl Sync for ConsumedTensor {}

impl Drop for ConsumedTensor {
    fn drop(&mut self) {
        // SAFETY: Py_IsInitialized may be called at any time, attached or not.
        if unsafe { ffi::Py_IsInitialized() } == 0 {
            // The interpreter is shutting down: the producer's objects go with it.
            return;
        }
        Python::attach(|_| match self.0 {
            Managed::Unversioned(tensor) => {
                // SAFETY: consumed (renamed) by `consume`, so only this value calls the deleter,
                // once; the deleter may be null (DLPack allows it).
                if let Some(deleter) = unsafe { (*tensor.as_ptr()).deleter } {
                    // SAFETY: DLPack's deleter, called once with its own tensor.
                    unsafe { deleter(tensor.as_ptr()) };
                }
            }
            Managed::Versioned(tensor) => {
                // SAFETY: as above.
                if let Some(deleter) = unsafe { (*tensor.as_ptr()).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(tensor.as_ptr()) };
                }
            }
        });
    }
}

/// Consumes a producer's `dltensor` or `dltensor_versioned` capsule (renaming it, as DLPack
/// asks of a consumer) and reads its tensor, now hetmem's: the fields are read only once no
/// other consumer can take it.
///
/// # Errors
/// `BufferError` for an object that is not an unconsumed DLPack capsule (the capsule is left
/// as it was), a major version hetmem does not read (left unconsumed, as DLPack asks), or
/// fields no tensor can have (consumed: the deleter runs as the error is returned).
pub(crate) fn consume(capsule: &Bound<'_, PyAny>) -> PyResult<(TensorInfo, ConsumedTensor)> {
    let (managed, name) = managed(capsule).ok_or_else(not_a_capsule)?;
    check_version(managed)?;
    let used = if name == NAME { NAME_USED } else { NAME_USED_VERSIONED };
    // SAFETY: `capsule` is a valid capsule (checked by `managed`); the new name is static, as
    // the capsule keeps the pointer.
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(capsule.py()));
    }
    let consumed = ConsumedTensor(managed);
    // SAFETY: the tensor is hetmem's now and lives until `consumed` drops, after this read; its
    // version was checked.
    let (tensor, flags) = unsafe { fields(managed) };
    let info = read_tensor(tensor, flags)?;
    Ok((info, consumed))
}

/// Reads the tensor a `dltensor` or `dltensor_versioned` capsule describes, without consuming
/// it: for inspection only (what is read says nothing of how long the memory lives).
///
/// # Errors
/// As [`consume`], the capsule left as it was.
pub(crate) fn read(capsule: &Bound<'_, PyAny>) -> PyResult<TensorInfo> {
    let (managed, _) = managed(capsule).ok_or_else(not_a_capsule)?;
    check_version(managed)?;
    // SAFETY: the unconsumed capsule, held by the caller (`capsule` borrows it) and not
    // consumed meanwhile (the interpreter is held, and nothing here runs Python code), keeps
    // the tensor alive; its version was checked.
    let (tensor, flags) = unsafe { fields(managed) };
    read_tensor(tensor, flags)
}

/// The fields of a producer's tensor, checked.
///
/// # Errors
/// `BufferError` for fields no tensor can have (a negative or huge `ndim`, a null shape, an
/// address that wraps).
fn read_tensor(tensor: &DlTensor, flags: u64) -> PyResult<TensorInfo> {
    let ndim =
        usize::try_from(tensor.ndim).ok().filter(|&ndim| ndim <= MAX_IMPORT_DIMS).ok_or_else(|| {
            PyBufferError::new_err(format!(
                "DLPack import: ndim {}; a tensor has 0 to {MAX_IMPORT_DIMS} dimensions",
                tensor.ndim
            ))
        })?;
    if ndim > 0 && tensor.shape.is_null() {
        return Err(PyBufferError::new_err("DLPack import: a null shape for a tensor of dimensions"));
    }
    let shape = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack's contract: `shape` (not null, checked above) holds `ndim` extents,
        // alive while the tensor is (the caller's borrow).
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }.to_vec()
    };
    let strides = (!tensor.strides.is_null() && ndim > 0)
        // SAFETY: DLPack's contract: a non-null `strides` holds `ndim` strides, alive while
        // the tensor is (the caller's borrow).
        .then(|| unsafe { std::slice::from_raw_parts(tensor.strides, ndim) }.to_vec());
    let address = (tensor.data as u64).checked_add(tensor.byte_offset).ok_or_else(|| {
        PyBufferError::new_err("DLPack import: data + byte_offset wraps around the address space")
    })?;
    Ok(TensorInfo {
        address,
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

/// Reads the tensor a `dltensor` or `dltensor_versioned` capsule describes, without consuming
/// it (for inspection: the capsule stays unconsumed, for one consumer to take).
#[pyfunction]
pub fn tensor_info(capsule: &Bound<'_, PyAny>) -> PyResult<TensorInfo> {
    read(capsule)
}

/// Where a producer's tensor lies in host memory, and how many bytes it covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostTensor {
    /// The address of the first byte, not 0; `address + nbytes` does not overflow.
    pub(crate) address: usize,
    pub(crate) nbytes: usize,
}

impl HostTensor {
    /// The first byte, as a pointer the CPU and GPU may write through (the producer's tensor
    /// is writable: [`TensorInfo::writable_host_bytes`]).
    pub(crate) fn ptr(&self) -> std::ptr::NonNull<u8> {
        std::ptr::NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(self.address))
            .expect("checked non-null when read")
    }
}

impl TensorInfo {
    /// The tensor's bytes, when it is what registration pins in place: writable, C-contiguous,
    /// non-empty host memory (`kDLCPU`, or `kDLCUDAHost`: pinned, host memory all the same),
    /// of whole-byte elements; its byte count checked.
    ///
    /// # Errors
    /// `ValueError` naming what is wrong and what to register instead.
    pub(crate) fn writable_host_bytes(&self) -> PyResult<HostTensor> {
        if !matches!(self.device_type, KDL_CPU | KDL_CUDA_HOST) {
            return Err(PyValueError::new_err(format!(
                "register: an array on DLPack device ({}, {}), not in host memory; register pins host memory: \
                 pass a CPU array or tensor",
                self.device_type, self.device_id
            )));
        }
        if self.readonly {
            return Err(PyValueError::new_err(
                "register: a read-only tensor (DLPack flags it read-only); registered memory must be writable",
            ));
        }
        if self.lanes != 1 || self.bits == 0 || !self.bits.is_multiple_of(8) {
            return Err(PyValueError::new_err(format!(
                "register: DLPack element type (code {}, {} bits, {} lanes) is not whole bytes in one lane; \
                 convert the tensor to a plain numeric type first",
                self.code, self.bits, self.lanes
            )));
        }
        let mut expected = 1i64;
        let mut elements = 1usize;
        for (at, &extent) in self.shape.iter().enumerate().rev() {
            let extent = usize::try_from(extent).map_err(|_| {
                PyValueError::new_err(format!("register: DLPack extent {extent} is negative"))
            })?;
            if let Some(strides) = &self.strides
                && extent > 1
                && strides[at] != expected
            {
                return Err(PyValueError::new_err(format!(
                    "register: the tensor is not C-contiguous (strides {strides:?} for shape {:?}); register \
                     tensor.contiguous() (a copy) or the tensor it is a view of",
                    self.shape
                )));
            }
            elements = elements.checked_mul(extent).ok_or_else(too_large)?;
            expected =
                expected.checked_mul(i64::try_from(extent).map_err(|_| too_large())?).unwrap_or(i64::MAX);
        }
        let nbytes = elements.checked_mul(usize::from(self.bits / 8)).ok_or_else(too_large)?;
        if nbytes == 0 {
            return Err(PyValueError::new_err("register: an empty array; register at least one element"));
        }
        let address = usize::try_from(self.address)
            .ok()
            .filter(|&address| address != 0)
            .ok_or_else(|| PyValueError::new_err("register: the tensor's data pointer is null"))?;
        if address.checked_add(nbytes).is_none() {
            return Err(too_large());
        }
        Ok(HostTensor { address, nbytes })
    }
}

fn too_large() -> PyErr {
    PyValueError::new_err("register: the tensor's byte count overflows the address space")
}
