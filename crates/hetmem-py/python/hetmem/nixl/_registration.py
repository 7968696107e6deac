"""Memory registered with an agent: hetmem buffers (``DRAM_SEG``), files (``FILE_SEG``), and
a peer's registered memory as it described it (``RemoteRegion``)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

from .. import Buffer, DeviceView, _native
from .._native import View
from ._errors import NixlError
from ._ranges import _part

if TYPE_CHECKING:
    from ._agent import Agent


class RemoteRegion:
    """A peer's registered memory (or a part of it), as the peer described it: where a transfer
    may write or read. Made by ``Registration.remote()`` and sent to the other side (it
    pickles); NIXL refuses a range the peer did not register."""

    __slots__ = ("_agent", "_kind", "_base", "_nbytes", "_device", "_offset")
    _agent: str
    _kind: str
    _base: int
    _nbytes: int
    _device: int
    _offset: int

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("a RemoteRegion is made by the peer's Registration.remote(), then sent over, not built "
                        "from an address")

    @classmethod
    def _make(cls, agent: str, kind: str, base: int, nbytes: int, device: int, offset: int = 0) -> "RemoteRegion":
        region = object.__new__(cls)
        for name, value in (("_agent", agent), ("_kind", kind), ("_base", base), ("_nbytes", nbytes),
                            ("_device", device), ("_offset", offset)):
            object.__setattr__(region, name, value)
        return region

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a RemoteRegion is fixed when made; take a part with region.part(offset, nbytes)")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (RemoteRegion._make, (self._agent, self._kind, self._base, self._nbytes, self._device, self._offset))

    @property
    def agent(self) -> str:
        """The name of the agent that registered the memory."""
        return self._agent

    @property
    def kind(self) -> str:
        """NIXL's memory kind: ``"DRAM"`` (host memory), ``"VRAM"`` (device memory) or ``"FILE"``."""
        return self._kind

    @property
    def nbytes(self) -> int:
        """The bytes the region covers."""
        return self._nbytes

    def part(self, offset: int, nbytes: Optional[int] = None) -> "RemoteRegion":
        """Bytes ``offset .. offset + nbytes`` of the region (default: to its end), checked."""
        offset, nbytes = _part(self._nbytes, offset, nbytes, "RemoteRegion.part")
        return RemoteRegion._make(self._agent, self._kind, self._base, nbytes, self._device, self._offset + offset)

    def _descriptor(self) -> Tuple[int, int, int]:
        return (self._base + self._offset, self._nbytes, self._device)

    def __repr__(self) -> str:
        return f"hetmem.nixl.RemoteRegion(agent={self._agent!r}, kind={self._kind!r}, nbytes={self._nbytes})"


def _what_to_register(source: Any) -> Tuple[Buffer, View]:
    """The hand-off buffer and the fixed native view of what ``register`` was given: a hetmem
    Buffer (host memory, or device memory), a DeviceView of device memory, or the allocation of
    a ``hetmem.load`` (its ``LoadedTensors``). Nothing else: hetmem registers only memory it
    holds, at the address it recorded when it made it."""
    # Imported here: hetmem._load imports the package, which imports nothing of hetmem.nixl.
    from .._load import LoadedTensors

    if isinstance(source, LoadedTensors):
        whole = source._whole
        if whole is None and source.parts is not None:
            raise TypeError("register: these tensors are spread over devices (device_map=), one allocation each; "
                            "register each of loaded.parts.values()")
        if whole is None:
            raise TypeError("register: these tensors were cast (dtype=) or copied into given tensors (into=), so "
                            "they are not hetmem's allocation; register a load without dtype=/into=")
        return whole, whole
    if isinstance(source, DeviceView):
        if _native.View._memory.__get__(source).kind != "device":
            raise TypeError("register: this DeviceView is mapped host memory; register its buffer (host memory, "
                            "DRAM_SEG) instead: agent.register(buffer)")
        # The view's range is fixed in its native half; the buffer it came from carries the
        # hand-off (the lease and the readers every view of the memory shares).
        buffer = source._buffer
        if not isinstance(buffer, Buffer):
            raise TypeError("register: this DeviceView has no hetmem buffer behind it")
        return buffer, source
    if isinstance(source, Buffer):
        return source, source
    hint = ""
    if type(source).__module__.startswith("torch"):
        hint = (" (a torch tensor's memory is torch's: hetmem cannot keep the hand-off on it; register the "
                "hetmem memory it views, e.g. the LoadedTensors of hetmem.load, or use NIXL's own API)")
    raise TypeError(f"register takes a hetmem Buffer (hetmem.pinned, hetmem.register, a MappedFile window), a "
                    f"DeviceView of device memory, or the LoadedTensors of hetmem.load, not a "
                    f"{type(source).__name__}: hetmem registers only memory it holds{hint}")


class Registration:
    """hetmem memory registered with an agent: host memory (``DRAM_SEG``: pinned, registered
    in place, or a mapped file window) or device memory (``VRAM_SEG``, with its device's id: a
    ``hetmem.load`` allocation, or a ``DeviceView`` of one). Holds the memory (it lives while
    the registration does); deregistered when dropped or closed, which no transfer in flight
    allows before it is done (each holds the registration)."""

    _kind = "DRAM"

    def __init__(self, agent: "Agent", source: Any):
        buffer, view = _what_to_register(source)
        # What the view covers, read through the native half that fixed it when the view was
        # made: a subclass may shadow _memory, _offset or nbytes, and none of those may choose
        # the address NIXL is given (or memory the registration does not hold).
        memory = _native.View._memory.__get__(view)
        offset = _native.View._offset.__get__(view)
        nbytes = math.prod(_native.View._shape.__get__(view)) * _native.View._dtype.__get__(view).itemsize
        if nbytes == 0:
            raise ValueError("register: an empty buffer has no bytes to register")
        if offset + nbytes > memory.nbytes:  # the native view checked it when made; the address trusts it
            raise ValueError(f"register: the buffer's bytes {offset}..{offset + nbytes} lie outside its memory of "
                             f"{memory.nbytes} bytes")
        if memory.host_ptr is not None:
            # Host memory is DRAM_SEG whatever the GPU can do with it (device id 0: NIXL's
            # convention for host memory).
            descriptor = (memory.host_ptr + offset, nbytes, 0)
        elif memory.kind == "device" and memory.device_ptr is not None and memory.device_ordinal is not None:
            self._kind = "VRAM"
            descriptor = (memory.device_ptr + offset, nbytes, memory.device_ordinal)
        else:
            raise ValueError(f"register: memory of kind {memory.kind!r} has neither a host address nor a device "
                             "allocation of hetmem's to register")
        self._agent = agent
        self._source = source
        self._buffer = buffer
        self._memory: Optional[_native.Memory] = memory
        self._nbytes = nbytes
        self._descriptor = descriptor
        self._active = 0
        self._dlist = None
        self._dlist = agent._register([self._descriptor + ("",)], self._kind)

    @property
    def buffer(self) -> Any:
        """What was registered (a Buffer, a DeviceView or a LoadedTensors)."""
        return self._source

    @property
    def device(self) -> Optional[int]:
        """The CUDA device id of device memory (``VRAM``), None for host memory."""
        return self._descriptor[2] if self._kind == "VRAM" else None

    @property
    def nbytes(self) -> int:
        """The bytes registered."""
        return self._nbytes

    @property
    def kind(self) -> str:
        """NIXL's memory kind: ``"DRAM"`` (host memory) or ``"VRAM"`` (device memory)."""
        return self._kind

    @property
    def closed(self) -> bool:
        """Whether the memory has been deregistered."""
        return self._dlist is None

    def remote(self) -> RemoteRegion:
        """This registration as the peer names it, to send over (``pickle``)."""
        self._check_open("remote")
        base, nbytes, device = self._descriptor
        return RemoteRegion._make(self._agent.name, self._kind, base, nbytes, device)

    def close(self) -> None:
        """Deregisters now. Refused while a transfer that uses it is in flight (wait for it);
        dropping the registration deregisters it too, once no transfer holds it."""
        if self._active:
            raise NixlError(f"close: {self._active} transfer(s) using this registration are in flight; wait() for "
                            "them first (dropping the registration deregisters it once they are done)")
        self._deregister()

    def _deregister(self) -> None:
        dlist, self._dlist = self._dlist, None
        if dlist is not None:
            self._agent._deregister(dlist)

    def _check_open(self, what: str) -> None:
        if self._dlist is None:
            raise NixlError(f"{what}: the registration is closed; register the buffer again")

    @property
    def _readonly(self) -> bool:
        """Whether the registered memory is read-only (a read-only file window), as the native
        memory says."""
        return self._memory is not None and self._memory.readonly

    def _local(self) -> Tuple[str, Tuple[int, int, int]]:
        return self._kind, self._descriptor

    def __del__(self) -> None:
        try:
            self._deregister()
        except Exception:  # deregistration at interpreter exit, with NIXL half gone: nothing to do
            pass

    def __repr__(self) -> str:
        return (f"hetmem.nixl.Registration({self._source!r}, kind={self._kind!r}, agent={self._agent.name!r}, "
                f"closed={self.closed})")


class FileRegistration(Registration):
    """A file registered with an agent as ``FILE_SEG``, for its storage backends (POSIX, GDS):
    transfers read it into memory, or write memory into it, at checked offsets. The file is
    opened here (read-only unless ``writable``) and closed when deregistered."""

    _kind = "FILE"

    def __init__(self, agent: "Agent", path: Union[str, "os.PathLike[str]"], writable: bool = False):
        self._agent = agent
        self._source = None
        self._dlist = None
        self._memory = None
        self._active = 0
        self._fd: Optional[int] = None
        self._fd = os.open(os.fspath(path), os.O_RDWR if writable else os.O_RDONLY)
        self._path = os.fspath(path)
        self._writable = writable
        self._nbytes = os.fstat(self._fd).st_size
        if self._nbytes == 0:
            self._close_fd()
            raise ValueError(f"register_file: {self._path} is empty; give it its size first (os.truncate)")
        # FILE_SEG's descriptor: (offset in the file, length, file descriptor).
        self._descriptor = (0, self._nbytes, self._fd)
        try:
            self._dlist = agent._register([self._descriptor + ("",)], self._kind)
        except BaseException:
            self._close_fd()
            raise

    @property
    def buffer(self) -> Buffer:
        raise AttributeError("a file registration has no buffer; its path is .path")

    @property
    def path(self) -> str:
        """The file's path."""
        return self._path

    def remote(self) -> RemoteRegion:
        raise NixlError("remote: a file registration is moved by this agent's own storage backends "
                        "(read_file/write_file); a peer reads it through memory this agent registers")

    def _part_descriptor(self, offset: Any, nbytes: int) -> Tuple[int, int, int]:
        if self._fd is None:
            raise NixlError(f"{self._path}: the file registration is closed; register the file again")
        offset, nbytes = _part(self._nbytes, offset, nbytes, f"{self._path}")
        return (offset, nbytes, self._fd)

    def _deregister(self) -> None:
        try:
            super()._deregister()
        finally:
            self._close_fd()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"hetmem.nixl.FileRegistration({self._path!r}, nbytes={self._nbytes}, closed={self.closed})"
