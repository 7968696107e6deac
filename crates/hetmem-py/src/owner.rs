//! What keeps a registered array's memory alive and in place: the object that owns the
//! memory, found by Rust, and checked to hold the bytes that are registered.
//!
//! DLPack promises that a tensor's memory lives until its deleter runs, not that it stays
//! where it is, and any object can answer `__dlpack__` with any capsule. So the capsule is
//! taken only from the two producers whose memory hetmem can pin in place, by calling their
//! type's own method (not an attribute the object may override), and consumed:
//!
//! - a NumPy array (any other object goes through `numpy.asarray` first, which must view it
//!   in place): its C-level base chain (`ndarray.base` as NumPy itself stores it, not a
//!   `base` attribute a subclass defines; through `memoryview.obj`; bounded) must end in an
//!   array that owns its memory, which gets a weak reference (NumPy refuses to resize an
//!   array that has one, whatever `refcheck` says), or in an exporter that cannot resize or
//!   close while a buffer of it is exported (a `bytearray`, an `mmap.mmap`), of which the
//!   registration holds an export of its own;
//! - a PyTorch CPU tensor whose storage PyTorch can neither resize nor move: in shared
//!   memory already (`is_shared()`, so `share_memory_()` does nothing) and not resizable.
//!   Any other storage is refused: a resizable one is moved by `resize_`, and
//!   `share_memory_()` moves any other into shared memory, letting its memory go (a
//!   `torch.from_numpy` tensor's NumPy array, which PyTorch does not say how to find, so
//!   hetmem cannot pin it).
//!
//! The capsule's bytes must lie inside what that owner holds. NumPy's own
//! `ndarray.__setstate__` frees an array's memory under every view of it, NumPy's included,
//! whatever holds it: like `ctypes`, it is outside what hetmem can guard.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyWeakrefReference};

use crate::attached::Attached;
use crate::import::{ConsumedTensor, HostTensor, TensorInfo, consume};
use crate::memory::Memory;
use crate::view::View;

/// What a registration holds so that its memory stays alive and in place: the producer's
/// tensor, consumed (its deleter runs when this drops, after unregistering), and the objects
/// that pin the memory (the object registered, the array owning the memory and a weak
/// reference to it, an export of a locking exporter, a tensor's storage).
pub(crate) struct Kept {
    _tensor: ConsumedTensor,
    _objects: Attached<Vec<Py<PyAny>>>,
}

/// An array taken for registration: what its capsule describes, its bytes (checked to lie
/// inside its owner's memory), and what keeps them.
pub(crate) struct Taken {
    pub(crate) info: TensorInfo,
    pub(crate) tensor: HostTensor,
    pub(crate) kept: Kept,
}

/// How many bases the walk follows before it gives up (NumPy collapses chains of views, so
/// real chains are a few long).
const MAX_BASES: usize = 64;

/// The memory an owner holds in place, `[start, end)`, and what holds it.
struct Guard {
    start: i128,
    end: i128,
    objects: Vec<Py<PyAny>>,
}

fn refuse(message: String) -> PyErr {
    PyValueError::new_err(message)
}

const COPY_REMEDY: &str = "or copy the data into hetmem.pinned memory";

/// Takes `owner` (a NumPy array, a PyTorch CPU tensor, or an object NumPy views in place) for
/// registration.
///
/// # Errors
/// `ValueError` (or `TypeError` for an object that is no array at all) naming why the
/// memory cannot be pinned in place and what to register instead; the producer's own errors.
pub(crate) fn take(owner: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let py = owner.py();
    let numpy = py.import("numpy")?;
    let ndarray = numpy.getattr("ndarray")?;
    if owner.is_instance(&ndarray)? {
        return take_ndarray(owner, owner, &numpy);
    }
    if let Some(tensor_type) = torch_tensor_type(py)? {
        if owner.get_type().is(&tensor_type) {
            return take_tensor(owner, &tensor_type);
        }
        if owner.is_instance(&tensor_type)? {
            return Err(refuse(format!(
                "register: a {}, a subclass of torch.Tensor, whose methods may answer for memory it does not \
                 hold: register tensor.as_subclass(torch.Tensor), {COPY_REMEDY}",
                owner.get_type().name()?
            )));
        }
    }
    if owner.is_instance_of::<View>() || owner.is_instance_of::<Memory>() {
        return Err(already_hetmem());
    }
    let array = numpy.call_method1("asarray", (owner,))?;
    if !array.is_instance(&ndarray)? || c_attr(&ndarray, "base", &array)?.is_none() {
        let kind = owner.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "register: a {kind} is not an array in memory that NumPy views in place (NumPy made an array of its \
             own); hetmem takes a NumPy array, an object NumPy views without copying (a memoryview, a \
             bytearray), or a PyTorch CPU tensor (a DLPack capsule of any other producer says nothing of what \
             keeps its memory in place): register the array that holds the memory, {COPY_REMEDY}"
        )));
    }
    take_ndarray(&array, owner, &numpy)
}

fn already_hetmem() -> PyErr {
    refuse(
        "register: the memory is hetmem's already (a buffer's view, pinned, registered or a file window); use \
         the buffer itself"
            .to_string(),
    )
}

/// `torch.Tensor`, where PyTorch is imported (an array of another library is no tensor).
fn torch_tensor_type<'py>(py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let modules = py.import("sys")?.getattr("modules")?;
    match modules.get_item("torch") {
        Ok(torch) => Ok(torch.getattr("Tensor").ok()),
        Err(_) => Ok(None),
    }
}

/// `type.name.__get__(obj)`: the attribute as the C type defines it, whatever a subclass
/// defines under the same name.
fn c_attr<'py>(
    base_type: &Bound<'py, PyAny>,
    name: &str,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    base_type.getattr(name)?.call_method1("__get__", (obj,))
}

/// `type.__dlpack__(obj)`, asking for DLPack 1.x and falling back to the old call for a
/// producer that takes no `max_version`.
fn capsule_of<'py>(base_type: &Bound<'py, PyAny>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let method = base_type.getattr("__dlpack__")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (1, 0))?;
    match method.call((obj,), Some(&kwargs)) {
        Ok(capsule) => Ok(capsule),
        Err(error) if error.is_instance_of::<PyTypeError>(py) => method.call1((obj,)),
        Err(error) => Err(error),
    }
}

/// The capsule's tensor, consumed, its bytes checked to lie inside `guard`.
fn finish(capsule: &Bound<'_, PyAny>, guard: Guard) -> PyResult<Taken> {
    let (info, consumed) = consume(capsule)?;
    let kept = Kept { _tensor: consumed, _objects: Attached::new(guard.objects) };
    let tensor = info.writable_host_bytes()?;
    let start = tensor.address as i128;
    let end = start + tensor.nbytes as i128;
    if start < guard.start || end > guard.end {
        return Err(refuse(format!(
            "register: the array's capsule names bytes [{start:#x}, {end:#x}) outside the memory of the object \
             that owns it, [{:#x}, {:#x}): register the array that owns the memory, {COPY_REMEDY}",
            guard.start, guard.end
        )));
    }
    Ok(Taken { info, tensor, kept })
}

fn take_ndarray(
    array: &Bound<'_, PyAny>,
    owner: &Bound<'_, PyAny>,
    numpy: &Bound<'_, PyAny>,
) -> PyResult<Taken> {
    let ndarray = numpy.getattr("ndarray")?;
    if c_attr(&ndarray, "dtype", array)?.getattr("hasobject")?.is_truthy()? {
        return Err(refuse(
            "register: an array of Python objects, not data; register an array of a numeric dtype"
                .to_string(),
        ));
    }
    let mut guard = owner_of(array, numpy)?;
    guard.objects.push(owner.clone().unbind());
    guard.objects.push(array.clone().unbind());
    finish(&capsule_of(&ndarray, array)?, guard)
}

/// Walks `array`'s C-level base chain to what owns its memory, and pins that in place.
fn owner_of(array: &Bound<'_, PyAny>, numpy: &Bound<'_, PyAny>) -> PyResult<Guard> {
    let py = array.py();
    let ndarray = numpy.getattr("ndarray")?;
    let builtins = py.import("builtins")?;
    let memoryview = builtins.getattr("memoryview")?;
    let bytearray = builtins.getattr("bytearray")?;
    let mmap = py.import("mmap")?.getattr("mmap")?;
    let mut current = array.clone();
    let mut objects = Vec::new();
    for _ in 0..MAX_BASES {
        if current.is_instance(&ndarray)? {
            let base = c_attr(&ndarray, "base", &current)?;
            if !base.is_none() {
                current = base;
                continue;
            }
            if !c_attr(&ndarray, "flags", &current)?.getattr("owndata")?.is_truthy()? {
                return Err(refuse(format!(
                    "register: the array's memory belongs to no object NumPy knows of (an array with no base that \
                     does not own its data, as made from a raw pointer): hetmem cannot keep it in place; \
                     {COPY_REMEDY}"
                )));
            }
            let (start, end) = ndarray_bounds(&ndarray, &current)?;
            // The weak reference is what makes NumPy refuse `resize`, even with refcheck=False.
            objects.push(PyWeakrefReference::new(&current)?.into_any().unbind());
            objects.push(current.unbind());
            return Ok(Guard { start, end, objects });
        }
        let kind = current.get_type();
        if kind.is(&memoryview) {
            let obj = c_attr(&memoryview, "obj", &current).map_err(|_| {
                refuse(format!("register: the array's memory is a released memoryview's; {COPY_REMEDY}"))
            })?;
            if obj.is_none() {
                return Err(refuse(format!(
                    "register: the array's memory is a memoryview's that names no exporter; {COPY_REMEDY}"
                )));
            }
            current = obj;
            continue;
        }
        if kind.is(&bytearray) || kind.is(&mmap) {
            // An export of the registration's own: while it lives, the exporter refuses to
            // resize (a bytearray) or to close or resize (an mmap), whatever becomes of the
            // memoryviews others hold.
            let export = memoryview.call1((&current,))?;
            if c_attr(&memoryview, "readonly", &export)?.is_truthy()? {
                return Err(refuse(format!(
                    "register: the array's memory is a read-only {}'s; registered memory must be writable",
                    kind.name()?
                )));
            }
            let nbytes: i128 = c_attr(&memoryview, "nbytes", &export)?.extract()?;
            let start: i128 = if nbytes == 0 {
                0
            } else {
                let bytes = numpy.call_method1("frombuffer", (&export, numpy.getattr("uint8")?))?;
                ndarray_bounds(&ndarray, &bytes)?.0
            };
            objects.push(export.unbind());
            objects.push(current.unbind());
            return Ok(Guard { start, end: start + nbytes, objects });
        }
        if current.is_instance_of::<View>() || current.is_instance_of::<Memory>() {
            return Err(already_hetmem());
        }
        return Err(refuse(format!(
            "register: the array's memory belongs to a {}, which hetmem cannot keep from moving or freeing it \
             (hetmem pins NumPy arrays that own their memory, bytearrays and mmaps in place); {COPY_REMEDY}",
            kind.name()?
        )));
    }
    Err(refuse(format!(
        "register: the array's chain of bases is longer than {MAX_BASES}; register the array that owns the memory, \
         {COPY_REMEDY}"
    )))
}

/// The bytes an array's elements cover, `[start, end)`, from its C-level interface.
fn ndarray_bounds(ndarray: &Bound<'_, PyAny>, array: &Bound<'_, PyAny>) -> PyResult<(i128, i128)> {
    let interface = c_attr(ndarray, "__array_interface__", array)?;
    let (data, _readonly): (i128, bool) = interface.get_item("data")?.extract()?;
    let shape: Vec<i128> = interface.get_item("shape")?.extract()?;
    let strides: Option<Vec<i128>> = interface.get_item("strides")?.extract()?;
    let itemsize: i128 = c_attr(ndarray, "itemsize", array)?.extract()?;
    let overflow = || refuse("register: the array's extent overflows".to_string());
    if shape.contains(&0) {
        return Ok((data, data));
    }
    let strides = match strides {
        Some(strides) => strides,
        None => {
            let mut strides = vec![0i128; shape.len()];
            let mut step = itemsize;
            for (stride, &extent) in strides.iter_mut().zip(&shape).rev() {
                *stride = step;
                step = step.checked_mul(extent).ok_or_else(overflow)?;
            }
            strides
        }
    };
    let (mut low, mut high) = (data, data.checked_add(itemsize).ok_or_else(overflow)?);
    for (&extent, &stride) in shape.iter().zip(&strides) {
        let reach = stride.checked_mul(extent - 1).ok_or_else(overflow)?;
        if reach < 0 {
            low = low.checked_add(reach).ok_or_else(overflow)?;
        } else {
            high = high.checked_add(reach).ok_or_else(overflow)?;
        }
    }
    Ok((low, high))
}

const TENSOR_REMEDY: &str = "register the NumPy array itself (hetmem.register(array)) and view the buffer as a \
                             tensor with torch.from_dlpack(buf), or allocate with hetmem.pinned (any dtype, \
                             hetmem.bfloat16 too) and view it the same way";

fn take_tensor(tensor: &Bound<'_, PyAny>, tensor_type: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let storage = tensor_type.getattr("untyped_storage")?.call1((tensor,))?;
    let device: String = storage.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(refuse(format!(
            "register: a tensor on {device}, not in host memory; register pins host memory: pass a CPU tensor"
        )));
    }
    if storage.call_method0("resizable")?.is_truthy()? {
        return Err(refuse(format!(
            "register: the tensor's storage is resizable (t.untyped_storage().resizable() is True, as for tensors \
             PyTorch allocated), so t.resize_() or t.share_memory_() could move its memory and leave the \
             registration and every view on freed memory, and PyTorch cannot pin a storage against that: \
             {TENSOR_REMEDY}"
        )));
    }
    if !storage.call_method0("is_shared")?.is_truthy()? {
        return Err(refuse(format!(
            "register: the tensor's memory belongs to what PyTorch took it from (the NumPy array of \
             torch.from_numpy, another DLPack producer), which PyTorch does not say how to find, so hetmem cannot \
             keep it in place, and t.share_memory_() would move the tensor off it: {TENSOR_REMEDY}"
        )));
    }
    let start: i128 = storage.call_method0("data_ptr")?.extract()?;
    let nbytes: i128 = storage.call_method0("nbytes")?.extract()?;
    // The consumed capsule holds the storage itself (PyTorch's tensor inside it), which no
    // Python call can take from it; the objects are held for the registration's users.
    let objects = vec![tensor.clone().unbind(), storage.unbind()];
    finish(&capsule_of(tensor_type, tensor)?, Guard { start, end: start + nbytes, objects })
}
