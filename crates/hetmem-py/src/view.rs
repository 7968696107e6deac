//! The views a `Memory` hands out (array interface, CUDA array interface, DLPack), each a
//! range of it: an offset, a C-contiguous shape and an element size, checked here, in Rust,
//! against the bytes the memory holds, whatever the Python layer computed; and `View`, the
//! object that exports the array interfaces.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::memory::Memory;
use crate::size::{Int, checked_add, product, sizes};

/// A checked range of a memory: `shape` elements, C-contiguous, from byte `offset`.
#[derive(Debug, Clone)]
pub(crate) struct Range {
    pub(crate) offset: usize,
    pub(crate) shape: Vec<usize>,
}

/// The most dimensions a view may have (NumPy's limit).
const MAX_DIMS: usize = 64;

impl Range {
    /// Checks that `shape` elements of `itemsize` bytes from byte `offset` lie inside a memory
    /// of `nbytes` bytes.
    ///
    /// # Errors
    /// `ValueError` for a negative offset or extent, a byte count that overflows, or a range
    /// that leaves the memory.
    pub(crate) fn new(nbytes: usize, offset: Int, shape: &[Int], itemsize: usize) -> PyResult<Range> {
        if shape.len() > MAX_DIMS {
            return Err(PyValueError::new_err(format!(
                "view: {} dimensions; at most {MAX_DIMS}",
                shape.len()
            )));
        }
        let offset = offset.size("view offset")?;
        let shape = sizes(shape, "view shape")?;
        Range::checked(nbytes, offset, shape, itemsize)
    }

    /// As [`Range::new`], for sizes already taken.
    ///
    /// # Errors
    /// As [`Range::new`].
    pub(crate) fn checked(
        nbytes: usize,
        offset: usize,
        shape: Vec<usize>,
        itemsize: usize,
    ) -> PyResult<Range> {
        if shape.len() > MAX_DIMS {
            return Err(PyValueError::new_err(format!(
                "view: {} dimensions; at most {MAX_DIMS}",
                shape.len()
            )));
        }
        if itemsize == 0 {
            return Err(PyValueError::new_err("view: elements of 0 bytes; use a dtype with a size"));
        }
        let bytes = product(shape.iter().copied().chain([itemsize]), "view")?;
        let end = checked_add(offset, bytes, "view offset + size")?;
        if end > nbytes {
            return Err(PyValueError::new_err(format!(
                "view: shape {shape:?} of {itemsize}-byte elements needs {bytes} bytes from byte {offset}; the \
                 memory holds {nbytes}: give a shape and offset inside it"
            )));
        }
        Ok(Range { offset, shape })
    }

    /// The C-contiguous strides, in elements. They fit unless an extent is 0 (the view is
    /// empty and its strides are never followed): those are clamped.
    pub(crate) fn strides_in_elements(&self) -> Vec<i64> {
        let mut strides = vec![0i64; self.shape.len()];
        let mut step = 1usize;
        for (stride, &extent) in strides.iter_mut().zip(&self.shape).rev() {
            *stride = i64::try_from(step).unwrap_or(i64::MAX);
            step = step.saturating_mul(extent);
        }
        strides
    }
}

/// An array interface type string, parsed: its byte order, kind, and size in bytes. Only the
/// kinds whose elements are plain bytes are taken; the canonical string is rebuilt from the
/// parts, so the consumer reads exactly the element size checked here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeStr {
    order: char,
    kind: char,
    /// The number in the string: bytes, or characters for `U`.
    count: usize,
    /// A datetime's unit (`[ns]`), kept as given (letters only).
    unit: String,
    pub(crate) itemsize: usize,
}

impl TypeStr {
    /// Parses `text` (`"<f4"`, `"|u1"`, `"|V16"`, `"<M8[ns]"`); `device` keeps only the kinds
    /// the CUDA array interface's consumers take (b, i, u, f, c).
    ///
    /// # Errors
    /// `ValueError` for a malformed string, an object dtype (its elements are pointers, which
    /// raw memory cannot hold), or a kind the view cannot carry.
    pub(crate) fn parse(text: &str, device: bool) -> PyResult<TypeStr> {
        let malformed = || {
            PyValueError::new_err(format!(
                "view: type string {text:?} is not one of the array interface's (\"<f4\", \"|u1\", ...)"
            ))
        };
        let mut chars = text.chars();
        let order = chars.next().ok_or_else(malformed)?;
        let kind = chars.next().ok_or_else(malformed)?;
        if !matches!(order, '<' | '>' | '|' | '=') {
            return Err(malformed());
        }
        if kind == 'O' {
            return Err(PyValueError::new_err(
                "view: an object dtype: its elements are pointers to Python objects, which raw memory cannot \
                 hold; view the memory as a numeric dtype",
            ));
        }
        let rest = chars.as_str();
        let (digits, unit) = match rest.find('[') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(malformed());
        }
        let count: usize = digits.parse().map_err(|_| malformed())?;
        let unit = if unit.is_empty() {
            String::new()
        } else {
            let inner =
                unit.strip_prefix('[').and_then(|unit| unit.strip_suffix(']')).ok_or_else(malformed)?;
            if !matches!(kind, 'M' | 'm')
                || inner.is_empty()
                || !inner.bytes().all(|byte| byte.is_ascii_alphanumeric())
            {
                return Err(malformed());
            }
            unit.to_string()
        };
        let itemsize = match kind {
            'b' | 'i' | 'u' | 'f' | 'c' => count,
            'V' | 'S' | 'M' | 'm' if !device => count,
            'U' if !device => count.checked_mul(4).ok_or_else(malformed)?,
            other => {
                return Err(PyValueError::new_err(format!(
                    "view: type string {text:?} (kind {other:?}) cannot be carried by this view; use a numeric \
                     dtype (b, i, u, f, c){}",
                    if device { "" } else { ", or V, S, U, M, m" }
                )));
            }
        };
        if itemsize == 0 {
            return Err(PyValueError::new_err(format!("view: type string {text:?} has elements of 0 bytes")));
        }
        Ok(TypeStr { order, kind, count, unit, itemsize })
    }

    /// The canonical string for the consumer.
    pub(crate) fn text(&self) -> String {
        format!("{}{}{}{}", self.order, self.kind, self.count, self.unit)
    }
}

/// A typed range of a `Memory` that exports itself through NumPy's array interface
/// (`_host_interface`) and the CUDA array interface (`_device_interface`). NumPy keeps the
/// object whose `__array_interface__` it read as the base of the array it makes, and CuPy and
/// PyTorch keep the object whose `__cuda_array_interface__` they read: what those interfaces
/// name must live as long as that object, and stay what it names. So this object is frozen,
/// its memory held here, in Rust, its range checked once against it: no attribute or second
/// `__init__` can point it at other memory. `hetmem.Buffer` and `hetmem.DeviceView` are its
/// Python subclasses.
#[pyclass(frozen, subclass, module = "hetmem._native")]
pub struct View {
    memory: Py<Memory>,
    offset: usize,
    shape: Vec<usize>,
    /// The NumPy dtype, as given (a bfloat16's metadata kept).
    dtype: Py<PyAny>,
    /// The shape the interfaces give: a subarray dtype's dimensions appended, as NumPy does.
    interface_shape: Vec<usize>,
    /// The interfaces' element type: the dtype, or a subarray dtype's base.
    element: Py<PyAny>,
    typestr: TypeStr,
    /// Whether the element is structured: its fields go in the array interface's `descr`.
    structured: bool,
}

#[pymethods]
impl View {
    /// `shape` elements of `dtype` (a NumPy dtype, or what `numpy.dtype` takes) from byte
    /// `offset` of `memory`, checked to lie inside it.
    #[new]
    #[pyo3(signature = (memory, shape, dtype, offset = None))]
    fn new(
        py: Python<'_>,
        memory: Py<Memory>,
        shape: Vec<Int>,
        dtype: &Bound<'_, PyAny>,
        offset: Option<Int>,
    ) -> PyResult<View> {
        let numpy = py.import("numpy")?;
        let dtype = numpy.getattr("dtype")?.call1((dtype,))?;
        if dtype.getattr("hasobject")?.is_truthy()? {
            return Err(PyValueError::new_err(format!(
                "view: dtype {dtype} holds Python objects (pointers), which raw memory cannot hold; use a numeric \
                 dtype"
            )));
        }
        let shape = sizes(&shape, "view shape")?;
        let offset = offset.map_or(Ok(0), |offset| offset.size("view offset"))?;
        let mut interface_shape = shape.clone();
        let mut element = dtype.clone();
        let subdtype = dtype.getattr("subdtype")?;
        if !subdtype.is_none() {
            let (base, extents): (Bound<'_, PyAny>, Vec<Int>) = subdtype.extract()?;
            interface_shape.extend(sizes(&extents, "view dtype's subarray shape")?);
            element = base;
        }
        let text: String = element.getattr("str")?.extract()?;
        let typestr = TypeStr::parse(&text, false)?;
        let itemsize: usize = element.getattr("itemsize")?.extract()?;
        if typestr.itemsize != itemsize {
            return Err(PyValueError::new_err(format!(
                "view: dtype {dtype}: its type string {text:?} says {} bytes, the dtype {itemsize}",
                typestr.itemsize
            )));
        }
        let structured = !element.getattr("fields")?.is_none();
        let view = View {
            memory,
            offset,
            shape,
            dtype: dtype.unbind(),
            interface_shape,
            element: element.unbind(),
            typestr,
            structured,
        };
        // Checked here, so that a view that exists names only its memory's bytes.
        view.range()?;
        if view.structured {
            view.descr(py)?;
        }
        Ok(view)
    }

    /// The memory the view is of.
    #[getter]
    fn _memory(&self, py: Python<'_>) -> Py<Memory> {
        self.memory.clone_ref(py)
    }

    /// The byte offset of the first element in the memory.
    #[getter]
    fn _offset(&self) -> usize {
        self.offset
    }

    /// The shape, as given.
    #[getter]
    fn _shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The NumPy dtype, as given.
    #[getter]
    fn _dtype(&self, py: Python<'_>) -> Py<PyAny> {
        self.dtype.clone_ref(py)
    }

    /// NumPy's array interface (version 3) of the view's host memory (a structured dtype's
    /// fields in `descr`). On a GPU machine the memory's release then waits for the device (a
    /// host view may feed an asynchronous copy).
    fn _host_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let range = self.range()?;
        let memory = self.memory.get();
        let (host_ptr, _, readonly) = memory.host_range()?;
        memory.uses.note_unknown();
        let dict = interface(py, (host_ptr + range.offset) as u64, readonly, &range, &self.typestr)?;
        if self.structured {
            dict.set_item("descr", self.descr(py)?)?;
        }
        Ok(dict)
    }

    /// The CUDA array interface (version 3) of the same range through the memory's device
    /// address; an error where the memory is not mapped. The interface names no consumer
    /// stream, so the memory's release then waits for the device.
    fn _device_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let typestr = TypeStr::parse(&self.typestr.text(), true)?;
        let memory = self.memory.get();
        let base = memory.device_base()?;
        let range = self.range()?;
        memory.uses.note_unknown();
        let dict = interface(py, base + range.offset as u64, memory.is_readonly(), &range, &typestr)?;
        // Nothing of hetmem's is pending on the memory: the consumer need not wait.
        dict.set_item("stream", py.None())?;
        Ok(dict)
    }
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View").field("offset", &self.offset).field("shape", &self.shape).finish()
    }
}

impl View {
    fn range(&self) -> PyResult<Range> {
        let nbytes = self.memory.get().len();
        Range::checked(nbytes, self.offset, self.interface_shape.clone(), self.typestr.itemsize)
    }

    /// A structured element's fields as the array interface's `descr`: a new list each time
    /// (a consumer may change the one it got), checked to describe elements of the size the
    /// range was checked with and no Python objects, since NumPy builds its dtype from `descr`
    /// without comparing sizes.
    fn descr<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let element = self.element.bind(py);
        let descr = element.getattr("descr").map_err(|error| {
            PyValueError::new_err(format!(
                "view: dtype {element}: {error}, so the array interface cannot describe it; view the memory as a \
                 dtype without overlapping or out-of-order fields"
            ))
        })?;
        let rebuilt = py.import("numpy")?.getattr("dtype")?.call1((&descr,))?;
        let itemsize: usize = rebuilt.getattr("itemsize")?.extract()?;
        if itemsize != self.typestr.itemsize || rebuilt.getattr("hasobject")?.is_truthy()? {
            return Err(PyValueError::new_err(format!(
                "view: dtype {element}: its fields describe {itemsize}-byte elements, not {}; the array interface \
                 cannot carry it: view the memory as a plain dtype",
                self.typestr.itemsize
            )));
        }
        Ok(descr)
    }
}

/// An array interface dict (version 3): C-contiguous `range` of `typestr` elements at `address`.
fn interface<'py>(
    py: Python<'py>,
    address: u64,
    readonly: bool,
    range: &Range,
    typestr: &TypeStr,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("version", 3)?;
    dict.set_item("shape", PyTuple::new(py, &range.shape)?)?;
    dict.set_item("typestr", typestr.text())?;
    dict.set_item("data", (address, readonly))?;
    dict.set_item("strides", py.None())?;
    Ok(dict)
}
