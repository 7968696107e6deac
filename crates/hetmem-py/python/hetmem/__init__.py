"""hetmem for Python: host memory shared with the GPU without copies.

Pin a NumPy array (or a PyTorch CPU tensor in shared memory, or a writable memoryview) in place, allocate
pinned or mapped memory, or map windows of a file, and hand the same bytes to NumPy,
PyTorch and CuPy: host views through the array interface and DLPack (``kDLCPU``), and, where
the memory is mapped for a GPU, device views through DLPack (``kDLCUDA``) and the CUDA array
interface. Nothing is copied.

The hand-off rule: while a buffer is lent to the GPU (``with buf.lend(stream): ...`` or a
``Lease``), every host view hetmem hands out raises ``LentError`` instead of racing the GPU.
NumPy arrays exported *before* the lease cannot be revoked by hetmem (NumPy has no way to do
that): do not touch them while the buffer is lent. A device view taken with ``buf.cuda()``
outside a lease is outside the hand-off (see ``Buffer.cuda``).

Whatever the views, memory outlives the GPU work that may use it: when the last view dies, a
buffer's memory is reused (``PinnedPool``), written back (a staged file window) or freed only
after that work, on the consumer's stream where hetmem can follow it (DLPack ``stream=1``, or
a ``hetmem.stream()``), else on the whole device.

Without a GPU, hetmem runs on its CPU backend: everything but the device views and streams
works.

Streams go both ways: ``buf.lend(stream)`` takes a PyTorch or CuPy stream, and
``hetmem.stream()`` makes one of hetmem's that they take (``ExternalStream(s.handle)``).

Example::

    import numpy as np, torch, hetmem
    frames = np.zeros((64, 224, 224, 3), np.uint8)
    buf = hetmem.register(frames)                        # pinned in place, no copy
    gpu = torch.from_dlpack(buf.cuda())                  # the same bytes, as a CUDA tensor
"""

from __future__ import annotations

import math
import operator
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import HetmemError, page_size

__all__ = [
    "Buffer",
    "Device",
    "DeviceView",
    "FrameRing",
    "HetmemError",
    "Lease",
    "LentError",
    "LoadReport",
    "LoadedTensors",
    "MappedFile",
    "PeerGone",
    "PinnedPool",
    "SharedRing",
    "StageError",
    "Stream",
    "bfloat16",
    "cuda_device",
    "cuda_devices",
    "device",
    "doctor",
    "load",
    "page_size",
    "pinned",
    "register",
    "stream",
]

Device = _native.Device
Stream = _native.Stream

# DLPack's device types and type codes.
_KDL_CPU = 1
_KDL_CUDA = 2
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_DL_BFLOAT = 4
_DL_KINDS = {code: kind for kind, code in _DL_CODES.items()}

#: bfloat16 as hetmem's buffers carry it: NumPy has no bfloat16, so host NumPy views show the
#: raw bits as uint16, while DLPack exports it as bfloat16 (``torch.from_dlpack`` gives a
#: ``torch.bfloat16`` tensor). ``ml_dtypes.bfloat16`` is accepted as well.
bfloat16 = np.dtype(np.uint16, metadata={"hetmem": "bfloat16"})

_default_device: Optional[_native.Device] = None
#: CUDA devices other than the default, opened by ``cuda_device``.
_cuda_devices: Dict[int, _native.Device] = {}
_devices_lock = threading.Lock()


class LentError(RuntimeError):
    """A host view of a buffer was asked for while the buffer is lent to the GPU."""


def device() -> _native.Device:
    """The device hetmem uses by default: CUDA device 0, or the CPU backend where no GPU can
    be used (``device().fallback_reason`` says why; ``cuda_device(N)`` opens another GPU). Opened once per process; ``HETMEM_BACKEND=cpu``
    or ``cuda`` forces the choice."""
    global _default_device
    with _devices_lock:
        if _default_device is None:
            _default_device = _native.Device.open_best()
        return _default_device


def cuda_devices() -> List[str]:
    """The names of the CUDA devices present, by ordinal (as ``CUDA_VISIBLE_DEVICES`` numbers
    them); empty where CUDA cannot run.

    Example::

        for ordinal, name in enumerate(hetmem.cuda_devices()):
            print(f"cuda:{ordinal}", name)
    """
    return _native.Device.cuda_names()


def cuda_device(ordinal: int) -> _native.Device:
    """CUDA device ``ordinal`` (its primary context, shared with PyTorch and CuPy), opened once
    per process. Raises ``HetmemError`` naming the devices present where there is no such
    device, and where ``HETMEM_BACKEND=cpu`` or no GPU can be used.

    Example::

        second = hetmem.cuda_device(1)
        print(second.name)
    """
    if isinstance(ordinal, bool) or not isinstance(ordinal, int):
        raise TypeError(f"cuda_device: ordinal {ordinal!r} is a {type(ordinal).__name__}; give an int")
    chosen = device()
    if chosen.backend != "cuda":
        raise HetmemError(f"cuda_device({ordinal}): no GPU can be used ({chosen.fallback_reason}); "
                          "use the CPU backend's memory instead")
    if ordinal == chosen.ordinal:
        return chosen
    with _devices_lock:
        opened = _cuda_devices.get(ordinal)
        if opened is None:
            opened = _cuda_devices[ordinal] = _native.Device.open_cuda(ordinal)
        return opened


def _is_bfloat16(dtype: np.dtype) -> bool:
    return (dtype.metadata or {}).get("hetmem") == "bfloat16" or dtype.name == "bfloat16"


def _dl_dtype(dtype: np.dtype) -> Tuple[int, int]:
    if _is_bfloat16(dtype):
        return _DL_BFLOAT, 16
    code = _DL_CODES.get(dtype.kind)
    if code is None or dtype.fields is not None or not dtype.isnative:
        raise BufferError(f"DLPack export: dtype {dtype} has no DLPack type; view the buffer as a plain "
                          "numeric dtype of native byte order (uint8, float32, ...)")
    return code, dtype.itemsize * 8


def _wants_versioned(max_version: Any) -> bool:
    """Whether the consumer takes DLPack 1.x capsules (it passed ``max_version >= (1, 0)``)."""
    return max_version is not None and tuple(max_version)[0] >= 1


def _refuse_copy(copy: Optional[bool]) -> None:
    if copy:
        raise BufferError("DLPack export: hetmem shares memory and never copies (copy=True was asked)")


class _LendState:
    """Whether some memory is lent to the GPU now: the lease, or None."""

    def __init__(self) -> None:
        self.lease: Optional["Lease"] = None


#: Each memory's hand-off state, shared by every Buffer over it however it was made (a view, a
#: slice, or another ``Buffer(memory, ...)``): lending one lends them all.
_lend_states: "weakref.WeakKeyDictionary[_native.Memory, _LendState]" = weakref.WeakKeyDictionary()
_lend_states_lock = threading.Lock()


def _lend_state(memory: _native.Memory) -> _LendState:
    with _lend_states_lock:
        state = _lend_states.get(memory)
        if state is None:
            state = _lend_states[memory] = _LendState()
        return state


class Buffer(_native.View):
    """Host memory held by hetmem (pinned, registered in place, or a file window), seen as an
    array of ``shape`` and ``dtype``.

    Host views: ``numpy()``, ``np.asarray(buf)`` (``__array_interface__``), and
    ``np.from_dlpack(buf)`` / ``torch.from_dlpack(buf)`` (``__dlpack__``, ``kDLCPU``). The
    device view, where mapped: ``cuda()``. The memory lives while the buffer or any view of it
    does (a DLPack consumer holds it until its tensor dies). What a buffer is a view of (its
    memory, offset, shape and dtype) is fixed when it is made, in the native half: NumPy keeps
    the buffer as its array's base, so nothing may point the buffer elsewhere.
    """

    def __new__(cls, memory: _native.Memory, shape: Sequence[int], dtype: Any, keep: Any = None,
                offset: int = 0) -> "Buffer":
        if not isinstance(memory, _native.Memory):
            raise TypeError(f"a Buffer is a view of hetmem memory (hetmem._native.Memory), not a {type(memory).__name__}")
        dtype = np.dtype(dtype)
        shape = tuple(operator.index(extent) for extent in shape)
        offset = operator.index(offset)
        if any(extent < 0 for extent in shape):
            raise ValueError(f"shape {shape}: extents must be >= 0")
        if offset < 0:
            raise ValueError(f"offset {offset}: a buffer starts at byte 0 of its memory or later")
        if dtype.hasobject:
            raise ValueError(f"dtype {dtype} holds Python objects, which raw memory cannot hold; use a numeric dtype")
        needed = math.prod(shape) * dtype.itemsize
        if offset + needed > memory.nbytes:
            raise ValueError(f"shape {shape} of {dtype} needs {needed} bytes from byte {offset}; the memory "
                             f"holds {memory.nbytes}")
        # The native half checks the same again, in Rust: these checks give the clearer message.
        return super().__new__(cls, memory, shape, dtype, offset)

    def __init__(self, memory: _native.Memory, shape: Sequence[int], dtype: Any, keep: Any = None,
                 offset: int = 0):
        if "_state" in self.__dict__:
            raise TypeError("a Buffer is made once: make a new one (hetmem.Buffer(memory, shape, dtype)) "
                            "rather than calling __init__ again")
        self._keep = keep
        self._state: _LendState = _lend_state(memory)

    # -- what it is ------------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        """The array shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The element type."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """The bytes the array covers."""
        return math.prod(self._shape) * self._dtype.itemsize

    @property
    def kind(self) -> str:
        """``"pinned"``, ``"registered"``, ``"plain"`` (CPU backend) or ``"file"``."""
        return self._memory.kind

    @property
    def readonly(self) -> bool:
        """Whether the memory is read-only (a read-only file window)."""
        return self._memory.readonly

    @property
    def is_mapped(self) -> bool:
        """Whether kernels can read and write the memory in place (a device view exists)."""
        return self._memory.device_ptr is not None

    @property
    def device_ptr(self) -> Optional[int]:
        """The address kernels use, or None when not mapped."""
        base = self._memory.device_ptr
        return None if base is None else base + self._offset

    @property
    def host_ptr(self) -> Optional[int]:
        """The CPU address of the first element, or None for device memory."""
        base = self._memory.host_ptr
        return None if base is None else base + self._offset

    @property
    def lent(self) -> bool:
        """Whether the buffer is lent to the GPU now (host views raise ``LentError``)."""
        return self._state.lease is not None

    def view(self, dtype: Any, shape: Optional[Sequence[int]] = None) -> "Buffer":
        """The same memory as another dtype and shape (default: as many elements as fit)."""
        dtype = np.dtype(dtype)
        if shape is None:
            if self.nbytes % dtype.itemsize:
                raise ValueError(f"{self.nbytes} bytes are not a whole number of {dtype} elements")
            shape = (self.nbytes // dtype.itemsize,)
        return Buffer(self._memory, shape, dtype, keep=self, offset=self._offset)

    def __copy__(self) -> "Buffer":
        """Another buffer over the same memory (no byte copied), sharing the hand-off state."""
        return Buffer(self._memory, self._shape, self._dtype, keep=self, offset=self._offset)

    def __getitem__(self, rows: slice) -> "Buffer":
        """A range of the first axis (``buf[start:stop]``, step 1): the same memory, no copy.
        It shares the buffer's hand-off state: lending either lends both."""
        if not isinstance(rows, slice) or not self._shape:
            raise TypeError("a Buffer is cut by a slice of its first axis (buf[start:stop]); for "
                            "anything else take a host view (buf.numpy()[...])")
        start, stop, step = rows.indices(self._shape[0])
        if step != 1:
            raise ValueError(f"step {step}: a range of a buffer is contiguous (step 1)")
        stop = max(start, stop)
        row_bytes = math.prod(self._shape[1:]) * self._dtype.itemsize
        return Buffer(self._memory, (stop - start,) + self._shape[1:], self._dtype, keep=self,
                      offset=self._offset + start * row_bytes)

    def __repr__(self) -> str:
        return (f"hetmem.Buffer(shape={self._shape}, dtype={self._dtype}, kind={self.kind!r}, "
                f"mapped={self.is_mapped}, lent={self.lent})")

    # -- host views ------------------------------------------------------------------------
    def _check_host(self, what: str) -> None:
        if self._state.lease is not None:
            raise LentError(f"{what}: the buffer is lent to the GPU; reclaim it first "
                            "(leave the `with buf.lend(...)` block, or call lease.reclaim())")
        if isinstance(self._memory, _native.Memory) and self._memory.kind == "file":
            # A window of a file truncated since it was made raises here, not SIGBUS when read.
            _native.check_file(self._memory)

    @property
    def __array_interface__(self) -> dict:
        """NumPy's array interface over the host memory (raises ``LentError`` while lent); a
        structured dtype's fields go in ``descr``, a subarray dtype's dimensions are appended
        to the shape (as NumPy does)."""
        self._check_host("host view")
        # Made in Rust, from what the buffer holds there.
        return self._host_interface()

    def numpy(self) -> np.ndarray:
        """A NumPy array over the host memory, no copy (raises ``LentError`` while lent), of
        the buffer's dtype (a structured dtype's padding included, which the array interface
        spells as fields of its own)."""
        array = np.asarray(self)
        if self._dtype.fields is not None and array.dtype != self._dtype:
            array = array.view(self._dtype)
        return array

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the host memory (``kDLCPU``); raises ``LentError`` while lent.
        ``dltensor_versioned`` (DLPack 1.0, flagged read-only for a read-only window) when the
        consumer passes ``max_version >= (1, 0)``, else the unversioned ``dltensor``."""
        self._check_host("DLPack host export")
        _refuse_copy(copy)
        if dl_device is not None and tuple(dl_device) != (_KDL_CPU, 0):
            if tuple(dl_device)[0] == _KDL_CUDA:
                return self.cuda().__dlpack__(stream=stream, max_version=max_version, copy=copy)
            raise BufferError(f"DLPack export: no view of this buffer on device {dl_device}")
        return _export(self, False, max_version, None)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(kDLCPU, 0)``: this object is the host view; ``cuda()`` is the device view."""
        return (_KDL_CPU, 0)

    # -- the device view and the hand-off --------------------------------------------------
    def cuda(self) -> "DeviceView":
        """The mapped device view (DLPack ``kDLCUDA``, ``__cuda_array_interface__``) of the
        same memory. Raises ``HetmemError`` where the memory is not mapped for a GPU.

        A device view taken here is outside the hand-off: nothing stops the CPU (through
        host views) and GPU work (through this view) from touching the memory at once, which
        is a data race on its contents, as with any CUDA program. Take the view from a lease
        instead (``with buf.lend(stream) as view:``) to have host views raise ``LentError``
        until the GPU work is done. Either way the memory itself stays valid: it is not
        reused, written back or freed until the GPU work that may use it has finished (the
        consumer's stream where hetmem can follow it, else the whole device)."""
        if self._memory.device_ptr is None:
            reason = device().fallback_reason
            why = (f"hetmem runs on the CPU backend ({reason})" if reason else
                   "the memory was not mapped (made with mapped=False), or there is no GPU")
            raise HetmemError(f"no device view: {why}")
        return DeviceView(self)

    def lend(self, stream: Any = None) -> "Lease":
        """Lends the buffer to GPU work: until the lease is reclaimed (leaving its ``with``
        block, or ``reclaim()``), host views raise ``LentError``. Reclaiming waits for the GPU:
        ``stream.synchronize()`` when a stream (``torch.cuda.Stream``, ``cupy.cuda.Stream``,
        ``hetmem.stream()``) is given, else the whole device."""
        return Lease(self, stream)


class DeviceView(_native.View):
    """A buffer's memory as the GPU addresses it (mapped, zero-copy): hand it to
    ``torch.from_dlpack``, ``cupy.from_dlpack`` or ``cupy.asarray`` (CUDA array interface). It
    keeps the buffer's memory alive; like the buffer, what it is a view of is fixed in the
    native half (CuPy keeps this object as its array's owner)."""

    def __new__(cls, buffer: Buffer) -> "DeviceView":
        return super().__new__(cls, buffer._memory, buffer._shape, buffer._dtype, buffer._offset)

    def __init__(self, buffer: Buffer):
        if "_buffer" in self.__dict__:
            raise TypeError("a DeviceView is made once: take a new one with buffer.cuda()")
        self._buffer = buffer

    def _check_not_written(self) -> None:
        # A device view of memory a NIXL transfer writes (VRAM_SEG) would race the transfer;
        # the GPU's own lease (buf.lend) hands device views out, so only that lease blocks them.
        lease = self._buffer._state.lease
        if getattr(lease, "blocks_device_views", False):
            raise LentError("the memory is lent to a NIXL transfer that writes it; wait for the transfer "
                            "(Transfer.wait(), Incoming.wait()) before taking a device view")

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface (version 3) of the memory (``LentError`` while a NIXL
        transfer writes it)."""
        self._check_not_written()
        # Made in Rust, from what the view holds there; the interface names no consumer
        # stream, so the memory's release waits for the whole device.
        return self._device_interface()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the mapped memory (``kDLCUDA``), versioned as the host view's.
        hetmem has no work pending on it, so the consumer's ``stream`` needs no
        synchronisation; it tells hetmem what to wait for before the memory is reused, written
        back or freed: ``stream=1`` (the legacy default stream, PyTorch's default) or a
        stream of hetmem's (``hetmem.stream()``) is followed (an event recorded on it when the
        consumer's tensor dies); any other stream, whose handle may be gone by then, makes the
        release wait for the whole device. ``LentError`` while a NIXL transfer writes the
        memory."""
        _refuse_copy(copy)
        self._check_not_written()
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DLPack export: this is the device view {self.__dlpack_device__()}; the host "
                              f"view is the buffer itself (asked for {tuple(dl_device)})")
        return _export(self, True, max_version, None if stream is None else operator.index(stream))

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(kDLCUDA, ordinal)``."""
        return (_KDL_CUDA, self._memory.device_ordinal)

    def __repr__(self) -> str:
        return f"hetmem.DeviceView({self._buffer!r})"


def _export(view: _native.View, cuda: bool, max_version: Any, stream: Optional[int]) -> Any:
    versioned = _wants_versioned(max_version)
    if view._memory.readonly and not versioned:
        raise BufferError("DLPack export: a read-only window, and the consumer takes only DLPack 0.x capsules, "
                          "which have no read-only flag; use a consumer of DLPack 1.x (NumPy >= 2.1 passes "
                          "max_version), or the array interfaces (np.asarray(buf), cupy.asarray(buf.cuda())), "
                          "which mark it read-only")
    code, bits = _dl_dtype(view._dtype)
    # Made in Rust, which checks the range against the memory and keeps the memory alive.
    return _native.capsule(view._memory, view._offset, list(view._shape), code, bits, cuda=cuda,
                           versioned=versioned, stream=stream)


class Lease:
    """A buffer lent to the GPU: its host views raise ``LentError`` until ``reclaim()``. A
    context manager: ``with buf.lend(stream) as gpu:`` gives the device view and reclaims on
    exit (waiting for ``stream``, or the device)."""

    #: Whether device views raise ``LentError`` too (a NIXL transfer's lease: the GPU's own
    #: lease hands them out).
    blocks_device_views = False

    def __init__(self, buffer: Buffer, stream: Any = None):
        if buffer._state.lease is not None:
            raise LentError("the buffer is already lent; reclaim the first lease before lending it again")
        readers = getattr(buffer._state, "nixl_readers", None)  # kept there by hetmem.nixl
        if readers is not None and readers.count:
            raise LentError(f"the buffer is being read by {readers.count} NIXL transfer(s) (shared); wait for them "
                            "before lending it, so that nothing writes it under them")
        self._buffer = buffer
        self._stream = stream
        buffer._state.lease = self

    @property
    def device_view(self) -> DeviceView:
        """The device view of the lent buffer."""
        return self._buffer.cuda()

    def reclaim(self) -> Buffer:
        """Waits for the GPU work (the stream, or the device) and gives the buffer back to the
        CPU. Calling it again does nothing."""
        if self._buffer._state.lease is self:
            try:
                if self._stream is not None:
                    self._stream.synchronize()
                else:
                    device().synchronize()
            finally:
                self._buffer._state.lease = None
        return self._buffer

    def __enter__(self) -> Optional[DeviceView]:
        # None where there is no device view (the CPU backend): the rule holds all the same.
        return self.device_view if self._buffer.is_mapped else None

    def __exit__(self, *exc: Any) -> None:
        self.reclaim()


def _shape_of(shape_or_nbytes: Union[int, Sequence[int]], dtype: Any) -> Tuple[Tuple[int, ...], np.dtype]:
    dtype = np.dtype(dtype)
    if isinstance(shape_or_nbytes, (int, np.integer)):
        shape: Tuple[int, ...] = (int(shape_or_nbytes),)
    else:
        shape = tuple(int(extent) for extent in shape_or_nbytes)
    return shape, dtype


def pinned(shape: Union[int, Sequence[int]], dtype: Any = np.uint8, *, mapped: bool = True,
           portable: bool = False, write_combined: bool = False) -> Buffer:
    """Zeroed pinned host memory of ``shape`` (a length is a 1-D shape: a byte count with the
    default dtype uint8) and ``dtype``; mapped for the GPU (zero-copy) by default. ``portable``: usable from every
    GPU's context. ``write_combined``: fast for the GPU to read, very slow for the CPU to read
    (only for memory the CPU writes once). Plain memory on the CPU backend."""
    shape, dtype = _shape_of(shape, dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    memory = _native.pinned(device(), nbytes, mapped=mapped, portable=portable, write_combined=write_combined)
    return Buffer(memory, shape, dtype)


class PinnedPool:
    """Pinned host memory reused instead of pinned again, within ``budget_bytes``: a buffer
    whose views have all died goes back to the pool, still pinned, for the next ``acquire`` of
    its size class, once the GPU work that may use it has finished. A reused buffer holds what
    its last user left (new ones are zeroed)."""

    def __init__(self, budget_bytes: int):
        self._pool = _native.PinnedPool(device(), budget_bytes)

    def acquire(self, shape: Union[int, Sequence[int]], dtype: Any = np.uint8, *, mapped: bool = True,
                portable: bool = False, write_combined: bool = False) -> Buffer:
        """A buffer of ``shape`` and ``dtype`` (options as for ``hetmem.pinned``)."""
        shape, dtype = _shape_of(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        memory = self._pool.acquire(nbytes, mapped=mapped, portable=portable, write_combined=write_combined)
        return Buffer(memory, shape, dtype)

    def stats(self) -> dict:
        """hits, misses, evictions, bytes_pinned, bytes_in_use, blocks_cached."""
        return self._pool.stats()

    def trim(self) -> None:
        """Frees every cached block."""
        self._pool.trim()


class MappedFile:
    """A file whose byte ranges are mapped and registered on demand (windows): kernels read
    (or, opened ``writable``, write) the page cache in place.

    The file must not be truncated or changed by other processes while a window lives. If it
    is truncated anyway, hetmem raises ``HetmemError`` (naming the file) where it can: making a
    window past the file's end, taking a host view (``numpy()``, ``__array_interface__``,
    ``__dlpack__``) of a window the file no longer holds, each epoch of the loader, and the
    loader's native batch preparation and staged gather (which recover a truncation while they
    read). A NumPy view taken before the truncation and read after it still ends the process
    with SIGBUS, as with ``numpy.memmap``; GPU work reading a window reads the pages as they
    were when it was registered. The recovery is a SIGBUS handler installed at the first
    native read of a window: enable ``faulthandler`` before that (pytest does, at start-up),
    not after, or its handler runs first and ends the process with a traceback. Overlapping windows are refused when either writes, within one
    ``MappedFile``: two ``MappedFile`` objects of the same path do not see each other's
    windows, so open a file once when its windows write."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], writable: bool = False):
        self._file = _native.WindowedFile(device(), os.fspath(path), writable=writable)

    @property
    def nbytes(self) -> int:
        """The file's size in bytes."""
        return self._file.nbytes

    def window(self, offset: int = 0, shape: Union[int, Sequence[int], None] = None, dtype: Any = np.uint8,
               *, writable: bool = False) -> Buffer:
        """The bytes from ``offset`` as an array of ``shape`` and ``dtype`` (default: to the
        end of the file), mapped read-only, or read-write with ``writable=True``. Two windows
        that overlap cannot both live when either writes."""
        return self._window(offset, shape, dtype, writable, False)

    def _window(self, offset: int, shape: Union[int, Sequence[int], None], dtype: Any, writable: bool,
                unflagged_device_view: bool) -> Buffer:
        # unflagged_device_view: the data loader's read-only records, whose device view goes to
        # PyTorch in a capsule that cannot say read-only (see _native.WindowedFile.window).
        dtype = np.dtype(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dtype.itemsize,)
        elif isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        shape = tuple(int(extent) for extent in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        memory = self._file.window(offset, nbytes, writable=writable, unflagged_device_view=unflagged_device_view)
        return Buffer(memory, shape, dtype, keep=self)

    def __repr__(self) -> str:
        return f"hetmem.MappedFile(nbytes={self.nbytes}, writable={self._file.writable})"


def stream() -> Stream:
    """A new CUDA stream of hetmem's on ``device()`` (a ``HetmemError`` on the CPU backend).
    Hand it to PyTorch or CuPy by its handle: ``torch.cuda.ExternalStream(s.handle)``,
    ``cupy.cuda.ExternalStream(s.handle)``; it also speaks the CUDA stream protocol
    (``__cuda_stream__``). Keep it alive while theirs is in use."""
    return _native.Stream(device())


# Registration needs Buffer and device() above.
from ._register import register  # noqa: E402
# hetmem.nixl: NIXL transfers that keep the hand-off (NIXL itself is loaded only when used).
from . import nixl  # noqa: E402,F401

# Loading needs Buffer, DeviceView and device() above.
from ._load import LoadedTensors, LoadReport, load  # noqa: E402
from ._doctor import doctor  # noqa: E402

# The frame ring needs Buffer, LentError and device() above.
from .ring import FrameRing, StageError  # noqa: E402
from .shared import PeerGone, SharedRing  # noqa: E402
