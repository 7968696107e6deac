"""``hetmem.register``: pinning an existing array in place.

The native half finds the array's bytes itself, from the array's own DLPack capsule, which
it consumes (NumPy arrays, and PyTorch tensors of any dtype, ``torch.bfloat16`` included);
memoryviews, bytearrays and other objects NumPy views without copying are viewed as NumPy
arrays first. It finds what owns the memory and pins it in place (an array that owns its
memory cannot be resized while the registration lives; a bytearray or mmap cannot be resized
or closed; a PyTorch tensor is taken only in shared, non-resizable storage), and keeps the
table of live registrations: registration pins whole pages, and the driver registers a page
once, so an array whose pages a live registration covers shares it, and one that overlaps
one in part is refused with the cause and the remedy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _DL_BFLOAT, _DL_KINDS, Buffer, _native, bfloat16, device


def _dtype_of(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes == 1 and code == _DL_BFLOAT and bits == 16:
        return bfloat16
    kind = _DL_KINDS.get(code)
    if lanes != 1 or kind is None or bits % 8:
        raise ValueError(f"register: DLPack element type (code {code}, {bits} bits, {lanes} lanes) has no NumPy "
                         "equivalent hetmem knows; convert the tensor to a plain numeric type first")
    return np.dtype(f"{kind}{bits // 8}")


def _host_array(array: Any) -> np.ndarray:
    """``array`` as a NumPy array over the same memory, checked for what registration needs
    (the native half checks again; these messages say more)."""
    if isinstance(array, memoryview) and array.readonly:
        raise ValueError("register: a read-only memoryview; registered memory must be writable")
    view = np.asarray(array)
    if view is not array and view.base is None:
        raise ValueError(f"register: a {type(array).__name__} is not an array in memory (NumPy had to copy it); "
                         "register a NumPy array, a writable memoryview or bytearray, or a CPU tensor")
    if not view.flags.c_contiguous:
        raise ValueError("register: the array is not C-contiguous; register np.ascontiguousarray(array) "
                         "(a copy) or the array it is a view of")
    if not view.flags.writeable:
        raise ValueError("register: a read-only array; registered memory must be writable")
    if view.dtype.hasobject:
        raise ValueError(f"register: an array of dtype {view.dtype} holds Python objects, not data; register "
                         "an array of a numeric dtype")
    return view


def register(array: Any, *, mapped: bool = True, portable: bool = False) -> Buffer:
    """Pins ``array`` in place and returns a ``Buffer`` over the same memory: a C-contiguous,
    writable NumPy array, memoryview, bytearray, or anything ``numpy.asarray`` views without
    copying, or a PyTorch CPU tensor in shared memory (of any dtype, ``torch.bfloat16``
    included: its buffer's dtype is ``hetmem.bfloat16``). No byte is copied: the array and the
    buffer share it. The pages covering the array are registered with the GPU; an array whose
    pages a live registration of hetmem's covers already shares it (small arrays share
    pages), one that overlaps one in part is refused. The array is kept alive, and
    unregistered when the buffer and its views die (after the GPU work that may use it).

    The memory must stay where it is, so registration pins what owns it, found from NumPy's
    own record of the array's base (through memoryviews): a NumPy array that owns the memory
    cannot be resized while registered (``resize`` raises, even with ``refcheck=False``); a
    bytearray or mmap cannot be resized or closed; memory owned by anything else (``bytes``,
    another library's object) is refused. A PyTorch tensor is taken only where PyTorch cannot
    move it: in shared memory and not resizable (``t.is_shared()``, not
    ``t.untyped_storage().resizable()``). Others are refused: ``t.resize_()`` moves a resizable
    one, and ``t.share_memory_()`` moves any other off its memory (for ``torch.from_numpy``,
    the NumPy array, which PyTorch does not say how to find). Register the NumPy array itself
    and view the buffer with ``torch.from_dlpack(buf)``, or allocate with ``hetmem.pinned``.
    Only NumPy's and PyTorch's DLPack capsules are taken: another producer's capsule says
    nothing of what keeps its memory in place. (NumPy's ``ndarray.__setstate__`` frees an
    array's memory under every view of it, NumPy's own too: like ``ctypes``, out of reach.)"""
    if isinstance(array, Buffer):
        raise ValueError("register: a hetmem buffer, whose memory hetmem holds already (pinned, registered or a "
                         "file window); use the buffer itself, or buf.numpy() for a NumPy view")
    if isinstance(array, (np.ndarray, memoryview, bytearray)) or not hasattr(array, "__dlpack__"):
        view = _host_array(array)
        # NumPy's DLPack export takes only some dtypes in native byte order: the bytes alone
        # go across, and the buffer keeps the array's own shape and dtype.
        memory, _ = _native.register(device(), view.reshape(-1).view(np.uint8), mapped=mapped, portable=portable)
        return Buffer(memory, view.shape, view.dtype)
    memory, info = _native.register(device(), array, mapped=mapped, portable=portable)
    return Buffer(memory, tuple(info.shape), _dtype_of(info.code, info.bits, info.lanes))
