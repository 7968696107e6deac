"""``hetmem.register``: pinning an existing array in place.

An array reaches hetmem through NumPy's array interface (NumPy arrays, memoryviews, anything
``numpy.asarray`` views without copying) or, for what NumPy cannot hold (a ``torch.bfloat16``
tensor), through DLPack. Registration pins whole pages, and the driver registers a page once:
hetmem keeps a table of its live registrations, so an array whose pages a live registration
covers already shares that registration, and one that overlaps it only in part is refused
with the cause and the remedy.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, List, NamedTuple, Tuple

import numpy as np

from . import (_DL_BFLOAT, _DL_KINDS, _KDL_CPU, Buffer, HetmemError, _contiguous_strides, _native, bfloat16,
               device, page_size)

# DLPack's pinned host memory device (kDLCUDAHost): host memory all the same.
_KDL_CUDA_HOST = 3


class _Array(NamedTuple):
    """What registration needs of an array: who keeps its bytes alive, where they are, and
    the shape and dtype its buffer takes."""

    owner: Any
    address: int
    nbytes: int
    shape: Tuple[int, ...]
    dtype: np.dtype


class _Registration(NamedTuple):
    """A live registration of hetmem's: the pages it pins, and how."""

    first: int  # the first page's address
    end: int  # past the last page
    memory: "weakref.ref[_native.Memory]"
    mapped: bool
    portable: bool


class _SharedPages:
    """The memory of an array whose pages a live registration pins already: that
    registration's pages (kept registered while this lives), this array's bytes. It reads as
    ``_native.Memory`` does."""

    readonly = False

    def __init__(self, registration: _native.Memory, owner: Any, address: int, nbytes: int):
        self._registration = registration
        self._owner = owner
        self.host_ptr = address
        self.nbytes = nbytes
        base = registration.device_ptr
        # The registration maps its pages as one range: device addresses follow host ones.
        self.device_ptr = None if base is None else base + (address - registration.host_ptr)
        self.device_ordinal = registration.device_ordinal
        self.kind = registration.kind


_live: List[_Registration] = []
_live_lock = threading.Lock()


def _page_span(address: int, nbytes: int) -> Tuple[int, int]:
    first = address - address % page_size
    end = -(-(address + nbytes) // page_size) * page_size
    return first, end


def _from_array_interface(array: Any) -> _Array:
    if isinstance(array, memoryview) and array.readonly:
        raise ValueError("register: a read-only memoryview; registered memory must be writable")
    view = np.asarray(array)
    if not view.flags.c_contiguous:
        raise ValueError("register: the array is not C-contiguous; register np.ascontiguousarray(array) "
                         "(a copy) or the array it is a view of")
    if not view.flags.writeable:
        raise ValueError("register: a read-only array; registered memory must be writable")
    return _Array((array, view), view.__array_interface__["data"][0], view.nbytes, view.shape, view.dtype)


def _dtype_of(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes == 1 and code == _DL_BFLOAT and bits == 16:
        return bfloat16
    kind = _DL_KINDS.get(code)
    if lanes != 1 or kind is None or bits % 8:
        raise ValueError(f"register: DLPack element type (code {code}, {bits} bits, {lanes} lanes) has no NumPy "
                         "equivalent hetmem knows; convert the tensor to a plain numeric type first")
    return np.dtype(f"{kind}{bits // 8}")


def _from_dlpack(array: Any) -> _Array:
    device_type, device_id = array.__dlpack_device__()
    if device_type not in (_KDL_CPU, _KDL_CUDA_HOST):
        raise ValueError(f"register: an array on DLPack device ({device_type}, {device_id}), not in host memory; "
                         "register pins host memory: pass a CPU array or tensor")
    try:
        capsule = array.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer of DLPack 0.x only
        capsule = array.__dlpack__()
    info = _native.tensor_info(capsule)
    shape = tuple(info.shape)
    dtype = _dtype_of(info.code, info.bits, info.lanes)
    if info.readonly:
        raise ValueError("register: a read-only tensor (DLPack flags it read-only); registered memory must be "
                         "writable")
    contiguous = _contiguous_strides(shape)
    if info.strides is not None and any(extent > 1 and stride != expected for extent, stride, expected
                                        in zip(shape, info.strides, contiguous)):
        raise ValueError(f"register: the tensor is not C-contiguous (strides {tuple(info.strides)} for shape {shape}); "
                         "register tensor.contiguous() (a copy) or the tensor it is a view of")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    # The capsule stays unconsumed and alive: its producer keeps the memory while it lives.
    return _Array((array, capsule), info.address, nbytes, shape, dtype)


def register(array: Any, *, mapped: bool = True, portable: bool = False) -> Buffer:
    """Pins ``array`` in place and returns a ``Buffer`` over the same memory: a C-contiguous,
    writable NumPy array, memoryview, or anything ``numpy.asarray`` views without copying, or
    a CPU tensor through DLPack (a PyTorch tensor of any dtype, ``torch.bfloat16`` included:
    its buffer's dtype is ``hetmem.bfloat16``). No byte is copied: the array and the buffer
    share it. The pages covering the array are registered with the GPU; an array whose pages
    a live registration of hetmem's covers already shares it (small arrays share pages), one
    that overlaps one in part is refused. The array is kept alive, and unregistered when the
    buffer and its views die."""
    if isinstance(array, Buffer):
        raise ValueError("register: a hetmem buffer, whose memory hetmem holds already (pinned, registered or a "
                         "file window); use the buffer itself, or buf.numpy() for a NumPy view")
    is_array = isinstance(array, (np.ndarray, memoryview, bytearray)) or not hasattr(array, "__dlpack__")
    found = _from_array_interface(array) if is_array else _from_dlpack(array)
    if found.nbytes == 0:
        raise ValueError("register: an empty array; register at least one element")
    first, end = _page_span(found.address, found.nbytes)
    with _live_lock:
        _live[:] = [entry for entry in _live if entry.memory() is not None]
        for entry in _live:
            if entry.first >= end or first >= entry.end:
                continue
            memory = entry.memory()
            covered = entry.first <= first and end <= entry.end
            if covered and memory is not None and (entry.mapped or not mapped) and (entry.portable or not portable):
                shared = _SharedPages(memory, found.owner, found.address, found.nbytes)
                return Buffer(shared, found.shape, found.dtype)  # type: ignore[arg-type]
            raise HetmemError(_overlap_message(first, end, entry, covered))
        memory = _register_pages(found, mapped, portable)
        _live.append(_Registration(first, end, weakref.ref(memory), mapped, portable))
    return Buffer(memory, found.shape, found.dtype)


def _overlap_message(first: int, end: int, entry: _Registration, covered: bool) -> str:
    if covered:
        return (f"register: this array's pages [{first:#x}, {end:#x}) lie in a live registration of hetmem's "
                f"made with mapped={entry.mapped}, portable={entry.portable}, which cannot give what was asked "
                "(a page is registered once, with one set of options): register with the same options, or let "
                "the other buffer and its views die first")
    return (f"register: this array's pages [{first:#x}, {end:#x}) overlap a live registration of hetmem's, "
            f"[{entry.first:#x}, {entry.end:#x}), without lying inside it (registration pins whole pages, and "
            "a page is registered once): register one array holding both, keep the arrays on pages of their "
            "own (allocate them with hetmem.pinned), or let the other buffer and its views die first")


def _register_pages(found: _Array, mapped: bool, portable: bool) -> _native.Memory:
    try:
        return _native.register(device(), found.owner, found.address, found.nbytes, mapped=mapped,
                                portable=portable)
    except HetmemError as error:
        if "ALREADY_REGISTERED" not in str(error):
            raise
        raise HetmemError(f"{error}; from Python: a page under this array is registered already, outside "
                          "hetmem (PyTorch's pin_memory or CuPy's cudaHostRegister): register memory that "
                          "library has not pinned, or allocate with hetmem.pinned") from error

