"""hetmem memory moved by NVIDIA NIXL, with the hand-off kept.

NIXL (the ``nixl`` package: ``pip install nixl-cu13``, or ``nixl-cu12``) moves registered
memory between agents, in one process, across processes, or across machines, over UCX, and
between memory and files through its storage backends (POSIX, GDS). This module registers
hetmem's own memory with an agent and keeps hetmem's rule while NIXL works on it:

- a buffer a transfer **writes** is lent for the transfer's duration: its host views raise
  ``LentError`` until NIXL reports the transfer complete (``Transfer.wait()``, or
  ``Transfer.done()`` returning True), when it is reclaimed;
- a buffer a transfer **reads** is shared: its host views stay usable for reading, and no
  transfer may write it until every transfer reading it is done (``LentError``). Writing it
  through a NumPy view meanwhile races the transfer, as writing any array under a reader does;
  a buffer lent to the GPU (``buf.lend()``) cannot be shared or lent to a transfer.

A peer's transfer into or out of this process's memory is announced to it by the peer's
notification: ``Agent.expect`` lends a buffer until the peer's write says it is done,
``Agent.offer`` shares one until the peer's read says so.

Memory is only ever named by hetmem's objects: a ``Registration`` is made from a ``Buffer``
(pinned, registered in place, or a window of a mapped file: host memory, NIXL's ``DRAM_SEG``),
or from a file path (``FILE_SEG``, for the storage backends); a peer's memory is a
``RemoteRegion`` that the peer made from its own registration and sent over (it pickles).
NIXL checks every remote range against what the peer registered, and refuses the rest.

A registration lives while it is used: it is deregistered when dropped (or ``close()``-d),
and every transfer in flight holds it, so that is after every transfer that uses it is done.
Transfers in flight are kept by this module until they complete, whatever the caller drops.

Errors from NIXL and UCX come as ``NixlError`` (a ``HetmemError``) naming the backend, the call
and a remedy. An ``Agent`` is used from one thread at a time.

Example (two agents; across processes, send ``metadata()`` and the ``RemoteRegion`` over)::

    import numpy as np, hetmem, hetmem.nixl as hn
    sender, receiver = hn.Agent("sender"), hn.Agent("receiver")
    sender.add_peer(receiver.metadata())
    src, dst = hetmem.pinned(1 << 20), hetmem.pinned(1 << 20)
    src.numpy()[:] = np.random.default_rng().integers(0, 256, 1 << 20, dtype=np.uint8)
    src_reg, dst_reg = sender.register(src), receiver.register(dst)
    incoming = receiver.expect(dst_reg, "sender", b"frame 0")   # dst is lent from here
    sender.write(src_reg, dst_reg.remote(), notify=b"frame 0").wait()
    incoming.wait()                                             # dst is reclaimed
    assert (dst.numpy() == src.numpy()).all()
"""

from __future__ import annotations

import importlib
import operator
import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import Buffer, HetmemError, Lease, LentError

__all__ = [
    "Agent",
    "FileRegistration",
    "Incoming",
    "NixlError",
    "Offered",
    "Registration",
    "RemoteRegion",
    "Transfer",
    "available",
]

#: What ``Agent()`` loads, in order: the meta package, then its CUDA 13 and 12 builds.
_MODULES = ("nixl", "nixl_cu13", "nixl_cu12")


class NixlError(HetmemError):
    """A NIXL or UCX call failed; the message names the backend, the call and a remedy."""


_loaded: Optional[Any] = None
_load_error: Optional[str] = None


def _nixl() -> Any:
    """The nixl package (its ``nixl_agent`` API), imported once."""
    global _loaded, _load_error
    if _loaded is None and _load_error is None:
        failures = []
        for name in _MODULES:
            try:
                module = importlib.import_module(name)
                if hasattr(module, "nixl_agent"):
                    _loaded = module
                    break
                failures.append(f"{name}: no nixl_agent")
            except ImportError as error:
                failures.append(f"{name}: {error}")
        if _loaded is None:
            _load_error = "; ".join(failures)
    if _loaded is None:
        raise NixlError(f"NIXL is not installed ({_load_error}): install it with `pip install nixl-cu13` "
                        "(CUDA 13 drivers) or `pip install nixl-cu12`; it needs no GPU for host memory")
    return _loaded


def available() -> Optional[str]:
    """None where NIXL can be loaded, else why not."""
    try:
        _nixl()
        return None
    except NixlError as error:
        return str(error)


# -- errors ------------------------------------------------------------------------------------

def _ucx_tls() -> str:
    return os.environ.get("UCX_TLS", "(unset: UCX picks)")


def _remedy(kind: str, backend: str, call: str) -> str:
    """What to do about NIXL's status ``kind`` (its exception's name) from ``call``."""
    if call == "create_backend":
        if kind == "nixlNotFoundError":
            return f"this nixl build has no {backend} plugin, or it could not be loaded (its libraries are missing)"
        if backend == "UCX":
            return (f"UCX could not start with UCX_TLS={_ucx_tls()}: NIXL asks UCX for peer failure handling "
                    "(ucx_error_handling_mode='peer'), which its shared-memory and CUDA transports lack; add tcp "
                    "to UCX_TLS, or unset it, or pass params={'UCX': {'ucx_error_handling_mode': 'none'}} "
                    "(no detection of a peer that dies); UCX_LOG_LEVEL=info shows what UCX found")
        return (f"the {backend} plugin would not start: GDS and GDS_MT need libcufile and a GPU, LIBFABRIC needs "
                "libfabric; NIXL's log above says which")
    if call == "register":
        return (f"{backend} would not register the memory: for a file, the storage backend must take its file "
                "system (GDS needs a cuFile-capable one, POSIX takes any); NIXL's log above says why")
    if call == "add_peer":
        return "pass the bytes of the peer's Agent.metadata() unchanged (they were refused as metadata)"
    if call == "prepare":
        if kind == "nixlNotFoundError":
            return ("no backend of this agent can reach the range: the peer's metadata is not loaded "
                    "(add_peer), the peer registered no memory holding the range (or dropped it), or no backend "
                    "both agents have moves these kinds of memory")
        return "the two ranges must be of the same size and of kinds the backend moves"
    if call == "post" or call == "progress":
        if kind == "nixlRemoteDisconnectError":
            return "the peer went away during the transfer; the destination's bytes are undefined: send them again"
        return (f"the transfer failed in {backend} (UCX_TLS={_ucx_tls()}); a transport may refuse the memory kind "
                "or the peer may have gone: the destination's bytes are undefined; UCX_LOG_LEVEL=info says more")
    return "NIXL's log above says why"


def _wrap(error: BaseException, backend: str, call: str, what: str) -> NixlError:
    kind = type(error).__name__
    return NixlError(f"NIXL {backend}: {what} failed ({kind}: {error}); {_remedy(kind, backend, call)}")


# -- checked ranges ----------------------------------------------------------------------------

def _size(value: Any, what: str) -> int:
    """A non-negative integer, or a clear error (Python integers do not overflow: the sums of
    two such values are exact, and each is checked against what it indexes)."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None
    if number < 0:
        raise ValueError(f"{what} {number}: it must be >= 0")
    return number


def _part(total: int, offset: Any, nbytes: Any, what: str) -> Tuple[int, int]:
    offset = _size(offset, f"{what} offset")
    nbytes = total - offset if nbytes is None else _size(nbytes, f"{what} nbytes")
    if nbytes <= 0 or offset + nbytes > total:
        raise ValueError(f"{what}: bytes {offset}..{offset + nbytes} of {total}: a part must hold at least one byte "
                         "and lie inside the registration")
    return offset, nbytes


# -- transfers in flight -----------------------------------------------------------------------

#: Every transfer and expected write not yet complete: held here so that what they use (the
#: registrations, the buffers, the memory, the agent) outlives them, whatever the caller drops.
_IN_FLIGHT: Set[Any] = set()
_IN_FLIGHT_LOCK = threading.Lock()


def _hold(item: Any) -> None:
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(item)


def _let_go(item: Any) -> None:
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.discard(item)


class _Readers:
    """How many transfers read a buffer now (kept on the buffer's shared hand-off state)."""

    def __init__(self) -> None:
        self.count = 0


def _readers(buffer: Buffer) -> _Readers:
    state = buffer._state
    readers = getattr(state, "nixl_readers", None)
    if readers is None:
        readers = _Readers()
        # Kept on the state every view of the memory shares, as the lease is.
        setattr(state, "nixl_readers", readers)
    return readers


class _TransferLease(Lease):
    """A buffer lent to a NIXL transfer (or to a peer's expected write): reclaiming it waits
    for NIXL to report the transfer complete."""

    def __init__(self, buffer: Buffer, what: str):
        if _readers(buffer).count:
            raise LentError(f"{what}: the buffer is being read by a transfer (shared); wait for that transfer "
                            "before writing into the buffer")
        super().__init__(buffer, None)
        self.until: Optional[Any] = None  # the Transfer or Incoming that reclaims it

    def reclaim(self) -> Buffer:
        if self._buffer._state.lease is self and self.until is not None:
            self.until.wait()
        return self._buffer

    def give_back(self) -> None:
        """NIXL is done with the buffer: host views work again."""
        if self._buffer._state.lease is self:
            self._buffer._state.lease = None


class _Share:
    """A buffer read by a transfer: counted while the transfer runs."""

    def __init__(self, buffer: Buffer, what: str):
        if buffer._state.lease is not None:
            raise LentError(f"{what}: the buffer is lent (to the GPU or to a transfer that writes it); reclaim it "
                            "before a transfer reads it")
        self._buffer: Optional[Buffer] = buffer
        _readers(buffer).count += 1

    def give_back(self) -> None:
        if self._buffer is not None:
            _readers(self._buffer).count -= 1
            self._buffer = None


# -- registrations -----------------------------------------------------------------------------

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
        """NIXL's memory kind: ``"DRAM"`` (host memory) or ``"FILE"``."""
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


class Registration:
    """A hetmem buffer registered with an agent as host memory (``DRAM_SEG``): pinned,
    registered in place, or a mapped file window. Holds the buffer (its memory lives while the
    registration does); deregistered when dropped or closed, which no transfer in flight
    allows before it is done (each holds the registration)."""

    _kind = "DRAM"

    def __init__(self, agent: "Agent", buffer: Buffer):
        if not isinstance(buffer, Buffer):
            raise TypeError(f"register takes a hetmem Buffer (hetmem.pinned, hetmem.register, a MappedFile window), "
                            f"not a {type(buffer).__name__}: hetmem registers only memory it holds")
        nbytes = buffer.nbytes
        memory = buffer._memory
        if nbytes == 0:
            raise ValueError("register: an empty buffer has no bytes to register")
        offset = _size(buffer._offset, "the buffer's offset")
        if offset + nbytes > memory.nbytes:  # the Buffer checked it when made; the address trusts it
            raise ValueError(f"register: the buffer's bytes {offset}..{offset + nbytes} lie outside its memory of "
                             f"{memory.nbytes} bytes")
        self._agent = agent
        self._buffer = buffer
        self._nbytes = nbytes
        # Host memory is DRAM_SEG whatever the GPU can do with it (device id 0: NIXL's
        # convention for host memory).
        self._descriptor = (memory.host_ptr + offset, nbytes, 0)
        self._active = 0
        self._dlist = agent._register([self._descriptor + ("",)], self._kind)

    @property
    def buffer(self) -> Buffer:
        """The registered buffer."""
        return self._buffer

    @property
    def nbytes(self) -> int:
        """The bytes registered."""
        return self._nbytes

    @property
    def kind(self) -> str:
        """NIXL's memory kind: ``"DRAM"``."""
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

    def _local(self) -> Tuple[str, Tuple[int, int, int]]:
        return self._kind, self._descriptor

    def __del__(self) -> None:
        try:
            self._deregister()
        except Exception:  # deregistration at interpreter exit, with NIXL half gone: nothing to do
            pass

    def __repr__(self) -> str:
        return f"hetmem.nixl.Registration({self._buffer!r}, agent={self._agent.name!r}, closed={self.closed})"


class FileRegistration(Registration):
    """A file registered with an agent as ``FILE_SEG``, for its storage backends (POSIX, GDS):
    transfers read it into memory, or write memory into it, at checked offsets. The file is
    opened here (read-only unless ``writable``) and closed when deregistered."""

    _kind = "FILE"

    def __init__(self, agent: "Agent", path: Union[str, "os.PathLike[str]"], writable: bool = False):
        self._agent = agent
        self._dlist = None
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


# -- transfers ---------------------------------------------------------------------------------

class Transfer:
    """A NIXL transfer in flight. ``done()`` polls it, ``wait()`` waits for it; when NIXL
    reports it complete the buffer it wrote is reclaimed and the one it read is no longer
    shared. A failed transfer raises ``NixlError`` (and gives its buffers back: NIXL touches
    them no more; a written one holds undefined bytes). A context manager: leaving the block
    waits."""

    def __init__(self, agent: "Agent", operation: str, local: Registration, local_desc: Tuple[int, int, int],
                 remote_name: str, remote_kind: str, remote_desc: Tuple[int, int, int], notify: bytes,
                 writes_local: bool):
        what = f"{operation} of {local_desc[1]} bytes"
        self._agent = agent
        self._what = what
        self._state = "PROC"
        self._local = local
        buffer = None if isinstance(local, FileRegistration) else local._buffer
        self._hand_off: Optional[Union[_TransferLease, _Share]] = None
        if buffer is not None:
            if writes_local and buffer.readonly:
                raise ValueError(f"{what}: the buffer is read-only (a read-only file window); a transfer cannot "
                                 "write it")
            self._hand_off = _TransferLease(buffer, what) if writes_local else _Share(buffer, what)
        self._handle = None
        self._backend = agent._label()
        self._counted = False
        try:
            self._handle = agent._prepare(operation, local._kind, local_desc, remote_name, remote_kind,
                                          remote_desc, notify)
            self._backend = agent._backend_of(self._handle)
            local._active += 1
            self._counted = True
            state = agent._post(self._handle, self._backend, what)
        except BaseException:
            # Not posted: NIXL holds none of the memory, so the request and the buffers go.
            handle, self._handle = self._handle, None
            try:
                if handle is not None:
                    handle.release()
            finally:
                self._give_back()
            raise
        if isinstance(self._hand_off, _TransferLease):
            self._hand_off.until = self
        _hold(self)
        self._settle(state)

    @property
    def backend(self) -> str:
        """The NIXL backend that moves the bytes."""
        return self._backend

    def done(self) -> bool:
        """Whether the transfer is complete (its buffers given back); raises ``NixlError`` if
        it failed."""
        if self._state == "PROC":
            self._settle(self._agent._progress(self._handle, self._backend, self._what))
        return self._state == "DONE"

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits until complete (``TimeoutError`` after ``timeout`` seconds, the transfer still
        in flight and its buffers still held)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self._what} through {self._backend}: not complete after {timeout} s; it is "
                                   "still in flight (its buffers still lent or shared)")
            time.sleep(0)

    def _settle(self, state: str) -> None:
        if state == "PROC":
            return
        self._state = state
        try:
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.release()
        finally:
            self._give_back()
            _let_go(self)
        if state != "DONE":
            raise NixlError(f"NIXL {self._backend}: the {self._what} failed (state {state}); "
                            f"{_remedy('', self._backend, 'progress')}")

    def _give_back(self) -> None:
        hand_off, self._hand_off = self._hand_off, None
        if hand_off is not None:
            hand_off.give_back()
        if self._counted:
            self._local._active -= 1
            self._counted = False

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait()

    def __repr__(self) -> str:
        return f"hetmem.nixl.Transfer({self._what}, backend={getattr(self, '_backend', None)!r}, state={self._state})"


class _PeerUse:
    """A buffer a peer's transfer uses, until the peer's notification arrives (the peer sends
    it with ``write(..., notify=...)`` or ``read(..., notify=...)``, which NIXL delivers once
    the transfer is complete). ``wait()`` waits for it; ``done()`` polls."""

    _writes = True

    def __init__(self, agent: "Agent", registration: Registration, peer: str, notification: bytes, what: str):
        if isinstance(registration, FileRegistration) or not isinstance(registration, Registration):
            raise TypeError(f"{what} takes a Registration of a hetmem buffer")
        if registration._agent is not agent:
            raise ValueError(f"{what}: the registration belongs to another agent")
        registration._check_open(what)
        buffer = registration._buffer
        if self._writes and buffer.readonly:
            raise ValueError(f"{what}: the buffer is read-only (a read-only file window); a peer cannot write it")
        self._agent = agent
        self._registration = registration
        self._peer = peer
        self._notification = bytes(notification)
        hand_off: Union[_TransferLease, _Share]
        if self._writes:
            hand_off = _TransferLease(buffer, what)
            hand_off.until = self
        else:
            hand_off = _Share(buffer, what)
        self._hand_off: Optional[Union[_TransferLease, _Share]] = hand_off
        registration._active += 1
        _hold(self)

    def done(self) -> bool:
        """Whether the peer's notification has arrived (the buffer given back)."""
        if self._hand_off is not None and self._agent._take_notification(self._peer, self._notification):
            self._finish()
        return self._hand_off is None

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for the notification (``TimeoutError`` after ``timeout`` seconds, the buffer
        still held for the peer)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no notification {self._notification!r} from {self._peer!r} after {timeout} s; "
                                   "the buffer stays held for the peer (it may still use it)")
            time.sleep(0)

    def cancel(self) -> None:
        """Gives the buffer back without the notification: only when the peer will not use it
        (it has exited, or was told not to); a transfer still on its way would race the CPU."""
        if self._hand_off is not None:
            self._finish()

    def _finish(self) -> None:
        hand_off, self._hand_off = self._hand_off, None
        if hand_off is not None:
            hand_off.give_back()
            self._registration._active -= 1
        _let_go(self)

    def __repr__(self) -> str:
        return (f"hetmem.nixl.{type(self).__name__}(peer={self._peer!r}, notification={self._notification!r}, "
                f"done={self._hand_off is None})")


class Incoming(_PeerUse):
    """A buffer lent to a peer's write (``Agent.expect``): its host views raise ``LentError``
    until the peer's notification arrives."""


class Offered(_PeerUse):
    """A buffer shared with a peer's read (``Agent.offer``): host views work, no transfer may
    write it, until the peer's notification arrives."""

    _writes = False


# -- the agent ---------------------------------------------------------------------------------

class Agent:
    """A NIXL agent, named ``name`` (unique among the agents that talk to each other), with
    ``backends`` started (``params``: each backend's initialisation parameters, as strings;
    UCX's include ``ucx_error_handling_mode``, ``num_workers``, ``ucx_devices``)."""

    def __init__(self, name: str, backends: Sequence[str] = ("UCX",),
                 params: Optional[Mapping[str, Mapping[str, str]]] = None, *, progress_thread: bool = True):
        if not isinstance(name, str) or not name:
            raise ValueError("an agent needs a non-empty name (unique among the agents that talk to each other)")
        nixl = _nixl()
        params = dict(params or {})
        unknown = set(params) - set(backends)
        if unknown:
            raise ValueError(f"params for {sorted(unknown)}, which are not in backends {list(backends)}")
        self._name = name
        self._inbox: Dict[str, List[bytes]] = {}
        try:
            config = nixl.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
            self._agent = nixl.nixl_agent(name, config)
        except Exception as error:
            raise _wrap(error, "agent", "agent", f"making agent {name!r}") from error
        self._backends: List[str] = []
        plugins = list(self._agent.get_plugin_list())
        for backend in backends:
            if backend not in plugins:
                raise NixlError(f"NIXL {backend}: no such plugin in this nixl build (it has {plugins}); use one of "
                                "those, or install a build with it")
            try:
                self._agent.create_backend(backend, {str(k): str(v) for k, v in params.get(backend, {}).items()})
            except Exception as error:
                raise _wrap(error, backend, "create_backend", f"starting the {backend} backend") from error
            self._backends.append(backend)

    @property
    def name(self) -> str:
        """The agent's name, as peers name it."""
        return self._name

    @property
    def backends(self) -> List[str]:
        """The backends started."""
        return list(self._backends)

    def _label(self) -> str:
        return "/".join(self._backends) or "no backend"

    def metadata(self) -> bytes:
        """What a peer needs to reach this agent (``add_peer``), including the memory
        registered so far: send it after registering what the peer will use."""
        try:
            return self._agent.get_agent_metadata()
        except Exception as error:
            raise _wrap(error, self._label(), "metadata", "get_agent_metadata") from error

    def add_peer(self, metadata: bytes) -> str:
        """Loads a peer's ``metadata()``; returns the peer's name. Load it again after the peer
        registers more memory."""
        if not isinstance(metadata, (bytes, bytearray)):
            raise TypeError(f"add_peer takes the bytes of the peer's Agent.metadata(), not a {type(metadata).__name__}")
        try:
            name = self._agent.add_remote_agent(bytes(metadata))
        except Exception as error:
            raise _wrap(error, self._label(), "add_peer", "add_remote_agent") from error
        return name.decode() if isinstance(name, bytes) else str(name)

    def remove_peer(self, name: str) -> None:
        """Forgets a peer (its connection and metadata)."""
        try:
            self._agent.remove_remote_agent(name)
        except Exception as error:
            raise _wrap(error, self._label(), "remove_peer", f"remove_remote_agent({name!r})") from error

    def register(self, buffer: Buffer) -> Registration:
        """Registers a hetmem buffer's host memory (``DRAM_SEG``) with every backend that takes it."""
        return Registration(self, buffer)

    def register_file(self, path: Union[str, "os.PathLike[str]"], *, writable: bool = False) -> FileRegistration:
        """Registers a file (``FILE_SEG``) with the storage backends started (POSIX, GDS)."""
        return FileRegistration(self, path, writable)

    def write(self, source: Registration, destination: RemoteRegion, *, notify: bytes = b"") -> Transfer:
        """Writes all of ``source`` (shared meanwhile) into ``destination``, a peer's region of
        the same size; the peer gets ``notify`` once the bytes are there (``Incoming``)."""
        self._check_pair(source, destination, "write")
        return Transfer(self, "WRITE", source, source._descriptor, destination.agent, destination.kind,
                        destination._descriptor(), bytes(notify), writes_local=False)

    def read(self, destination: Registration, source: RemoteRegion, *, notify: bytes = b"") -> Transfer:
        """Reads a peer's ``source`` region into all of ``destination`` (lent meanwhile)."""
        self._check_pair(destination, source, "read")
        return Transfer(self, "READ", destination, destination._descriptor, source.agent, source.kind,
                        source._descriptor(), bytes(notify), writes_local=True)

    def expect(self, destination: Registration, peer: str, notification: bytes) -> Incoming:
        """Lends ``destination`` to ``peer``'s write until its ``notification`` arrives: call it
        before sending the peer the region (``destination.remote()``)."""
        return Incoming(self, destination, peer, notification, "expect")

    def offer(self, source: Registration, peer: str, notification: bytes) -> Offered:
        """Shares ``source`` with ``peer``'s read until its ``notification`` arrives: call it
        before sending the peer the region (``source.remote()``)."""
        return Offered(self, source, peer, notification, "offer")

    def read_file(self, file: FileRegistration, offset: int, destination: Registration) -> Transfer:
        """Reads ``destination.nbytes`` bytes of ``file`` from ``offset`` into ``destination``
        (lent meanwhile), through this agent's storage backend."""
        self._check_file(file, destination, "read_file")
        return Transfer(self, "READ", destination, destination._descriptor, self._name, "FILE",
                        file._part_descriptor(offset, destination.nbytes), b"", writes_local=True)

    def write_file(self, source: Registration, file: FileRegistration, offset: int) -> Transfer:
        """Writes all of ``source`` (shared meanwhile) into ``file`` from ``offset`` (inside the
        file's size when registered), through this agent's storage backend."""
        self._check_file(file, source, "write_file")
        if not file._writable:
            raise ValueError(f"write_file: {file.path} was registered read-only; register_file(path, writable=True)")
        return Transfer(self, "WRITE", source, source._descriptor, self._name, "FILE",
                        file._part_descriptor(offset, source.nbytes), b"", writes_local=False)

    # -- what the registrations and transfers call ---------------------------------------------

    def _check_pair(self, local: Registration, remote: RemoteRegion, what: str) -> None:
        if isinstance(local, FileRegistration) or not isinstance(local, Registration):
            raise TypeError(f"{what}: the local side is a Registration of a hetmem buffer (agent.register(buffer))")
        if not isinstance(remote, RemoteRegion):
            raise TypeError(f"{what}: the remote side is a RemoteRegion (the peer's registration.remote()), not a "
                            f"{type(remote).__name__}")
        if local._agent is not self:
            raise ValueError(f"{what}: the registration belongs to agent {local._agent.name!r}, not {self._name!r}")
        local._check_open(what)
        if local.nbytes != remote.nbytes:
            raise ValueError(f"{what}: the registration holds {local.nbytes} bytes and the remote region "
                             f"{remote.nbytes}; take a part of the region of the same size (region.part(offset, "
                             f"{local.nbytes}))")

    def _check_file(self, file: FileRegistration, memory: Registration, what: str) -> None:
        if not isinstance(file, FileRegistration):
            raise TypeError(f"{what}: the file is a FileRegistration (agent.register_file(path))")
        if isinstance(memory, FileRegistration) or not isinstance(memory, Registration):
            raise TypeError(f"{what}: the memory is a Registration of a hetmem buffer")
        for registration in (file, memory):
            if registration._agent is not self:
                raise ValueError(f"{what}: both registrations must belong to this agent")
            registration._check_open(what)

    def _register(self, descriptors: List[Tuple[int, int, int, str]], kind: str) -> Any:
        try:
            return self._agent.register_memory(descriptors, kind)
        except Exception as error:
            raise _wrap(error, self._label(), "register", f"register_memory of {descriptors[0][1]} bytes of "
                        f"{kind}") from error

    def _deregister(self, dlist: Any) -> None:
        try:
            self._agent.deregister_memory(dlist)
        except Exception as error:
            raise _wrap(error, self._label(), "deregister", "deregister_memory") from error

    def _prepare(self, operation: str, local_kind: str, local: Tuple[int, int, int], remote_name: str,
                 remote_kind: str, remote: Tuple[int, int, int], notify: bytes) -> Any:
        try:
            local_descs = self._agent.get_xfer_descs([local], local_kind)
            remote_descs = self._agent.get_xfer_descs([remote], remote_kind)
            return self._agent.initialize_xfer(operation, local_descs, remote_descs, remote_name, notify)
        except Exception as error:
            raise _wrap(error, self._label(), "prepare",
                        f"preparing a {operation} of {local[1]} bytes with {remote_name!r}") from error

    def _backend_of(self, handle: Any) -> str:
        try:
            return str(self._agent.query_xfer_backend(handle))
        except Exception:  # only for messages: the agent's backends name it well enough
            return self._label()

    def _post(self, handle: Any, backend: str, what: str) -> str:
        try:
            return self._agent.transfer(handle)
        except Exception as error:
            raise _wrap(error, backend, "post", f"posting the {what}") from error

    def _progress(self, handle: Any, backend: str, what: str) -> str:
        try:
            return self._agent.check_xfer_state(handle)
        except Exception as error:
            raise _wrap(error, backend, "progress", f"the {what}") from error

    def _take_notification(self, peer: str, notification: bytes) -> bool:
        try:
            for name, messages in self._agent.get_new_notifs().items():
                key = name.decode() if isinstance(name, bytes) else str(name)
                self._inbox.setdefault(key, []).extend(bytes(message) for message in messages)
        except Exception as error:
            raise _wrap(error, self._label(), "progress", "get_new_notifs") from error
        waiting = self._inbox.get(peer, [])
        if notification in waiting:
            waiting.remove(notification)
            return True
        return False

    def __repr__(self) -> str:
        return f"hetmem.nixl.Agent({self._name!r}, backends={self._backends})"
