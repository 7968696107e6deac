"""``Agent``: a NIXL agent, its backends, peers and registrations, and the transfers it starts."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .. import Buffer, DeviceView, LentError, cuda_device
from .. import device as default_device
from .._load import LoadedTensors
from ._errors import NixlError, _nixl, _wrap
from ._handoff import Incoming, Offered
from ._registration import FileRegistration, Registration, RemoteRegion
from ._staged import StagedWrite, Staging, _torch, check_staged
from ._transfer import Transfer


class Agent:
    """A NIXL agent, named ``name`` (unique among the agents that talk to each other), with
    ``backends`` started (``params``: each backend's initialisation parameters, as strings;
    UCX's include ``ucx_error_handling_mode``, ``num_workers``, ``ucx_devices``).

    UCX reads its own settings (``UCX_TLS``, ``UCX_LOG_LEVEL``) from the environment when the
    backend starts. Between processes of one host, device memory moved fastest on the H200
    machine with ``UCX_TLS=cuda_copy,cuda_ipc,sm,self`` and
    ``params={"UCX": {"ucx_error_handling_mode": "none"}}`` (those transports cannot detect a
    peer that dies, which NIXL's default mode asks for).

    Example::

        os.environ.setdefault("UCX_TLS", "cuda_copy,cuda_ipc,sm,self")  # before the agent
        agent = hetmem.nixl.Agent("loader", params={"UCX": {"ucx_error_handling_mode": "none"}})
    """

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
        # write_staged's device memory, by CUDA device, registered once and used again.
        self._staging: Dict[int, Staging] = {}
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

    def register(self, memory: Union[Buffer, DeviceView, LoadedTensors]) -> Registration:
        """Registers hetmem memory with every backend that takes it: a host buffer
        (``DRAM_SEG``), or device memory (``VRAM_SEG``, with its CUDA device id): the
        allocation of a ``hetmem.load`` (its ``LoadedTensors``), or a ``DeviceView`` of it.
        Moving device memory over UCX needs UCX's CUDA transports (``UCX_TLS`` with
        ``cuda_copy``, and ``cuda_ipc`` between processes; see docs/cluster.md).

        Example::

            loaded = hetmem.load("model.safetensors", "cuda")
            weights = agent.register(loaded)             # VRAM_SEG, device 0
            peer_agent.read(host_registration, weights.remote()).wait()
        """
        return Registration(self, memory)

    def register_file(self, path: Union[str, "os.PathLike[str]"], *, writable: bool = False) -> FileRegistration:
        """Registers a file (``FILE_SEG``) with the storage backends started (POSIX, GDS)."""
        return FileRegistration(self, path, writable)

    def write(self, source: Registration, destination: RemoteRegion, *, notify: bytes = b"") -> Transfer:
        """Writes all of ``source`` (shared meanwhile) into ``destination``, a peer's region of
        the same size; the peer gets ``notify`` once the bytes are there (``Incoming``)."""
        self._check_pair(source, destination, "write")
        return Transfer(self, "WRITE", source, source._descriptor, destination.agent, destination.kind,
                        destination._descriptor(), bytes(notify), writes_local=False)

    def write_staged(self, source: Registration, destination: RemoteRegion, *, pieces: int = 8,
                     notify: bytes = b"", device: Optional[int] = None) -> StagedWrite:
        """Writes all of ``source``, host memory, into ``destination``, a peer's device memory of
        the same size, in two hops: this process's copy engine lands the bytes in device memory
        of its own (on CUDA device ``device``, default hetmem's), ``pieces`` at a time, and
        NIXL moves each piece on device to device as it lands (CUDA IPC between processes of
        one host). UCX has no zero-copy path from host memory into another process's device
        memory on one machine (it emulates the put, about 0.9 GB/s on the H200 machine); the
        two hops on PyTorch's memory moved 0.92-0.94 of the link there. The staging memory is
        PyTorch's (through hetmem's own device memory the same hops moved 0.57-0.68 GB/s; see
        docs/cluster.md), as large as the biggest write, allocated and registered on first use
        and kept for the next. Pieces are at least 64 KiB (fewer than asked for a small
        source), at most 1024;
        ``write`` stays the call for every other pair of kinds. Needs PyTorch with CUDA (its
        streams do the copies) and UCX's CUDA transports (``UCX_TLS`` with ``cuda_copy`` and
        ``cuda_ipc``). The source is shared until copied; the peer gets ``notify`` once every
        piece is there.

        Example::

            frame = agent.register(hetmem.pinned(nbytes))      # host memory, filled by the CPU
            agent.write_staged(frame, peer_region, notify=b"frame 7").wait()
        """
        pieces = check_staged(self, source, destination, pieces)
        # Everything that can refuse the write is asked before staging memory is made for it.
        gpu = default_device() if device is None else cuda_device(device)
        if gpu.ordinal is None:
            raise NixlError("write_staged: hetmem runs on the CPU backend "
                            f"({gpu.fallback_reason or 'no GPU'}), and the staged write needs device memory of "
                            "this process; use write() on a machine without a GPU")
        torch = _torch("write_staged")
        if source._buffer._state.lease is not None:
            raise LentError("write_staged: the source is lent (to the GPU or to a transfer that writes it); "
                            "reclaim it before a transfer reads it")
        staging = self._staging_for(torch, source.nbytes, gpu.ordinal)
        return StagedWrite(self, source, destination, staging, pieces, bytes(notify))

    def _staging_for(self, torch: Any, nbytes: int, ordinal: int) -> Staging:
        cached = self._staging.get(ordinal)
        if cached is not None and cached.user is not None:
            # A write nobody waits for (or one interrupted) moves on only when polled.
            try:
                cached.user.done()
            except Exception:  # its own caller hears of it; this write needs only the memory
                pass
        if cached is not None and (cached.closed or (cached._active == 0 and cached.nbytes < nbytes)):
            cached.close()  # closed, or too small: gone before a larger one is made
            del self._staging[ordinal]
            cached = None
        if cached is not None and cached._active == 0:
            return cached
        fresh = Staging(self, torch, nbytes, ordinal)
        if cached is None:
            self._staging[ordinal] = fresh
        return fresh  # else a one-off, freed with its write: the cached one is in use

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
                        file._part_descriptor(offset, destination.nbytes), b"", writes_local=True, file=file)

    def write_file(self, source: Registration, file: FileRegistration, offset: int) -> Transfer:
        """Writes all of ``source`` (shared meanwhile) into ``file`` from ``offset`` (inside the
        file's size when registered), through this agent's storage backend."""
        self._check_file(file, source, "write_file")
        if not file._writable:
            raise ValueError(f"write_file: {file.path} was registered read-only; register_file(path, writable=True)")
        return Transfer(self, "WRITE", source, source._descriptor, self._name, "FILE",
                        file._part_descriptor(offset, source.nbytes), b"", writes_local=False, file=file)

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
                        f"{kind}", (kind,)) from error

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
                        f"preparing a {operation} of {local[1]} bytes ({local_kind} with {remote_kind}) with "
                        f"{remote_name!r}", (local_kind, remote_kind)) from error

    def _backend_of(self, handle: Any) -> str:
        try:
            return str(self._agent.query_xfer_backend(handle))
        except Exception:  # only for messages: the agent's backends name it well enough
            return self._label()

    def _post(self, handle: Any, backend: str, what: str, memory: Tuple[str, ...] = ()) -> str:
        try:
            return self._agent.transfer(handle)
        except Exception as error:
            raise _wrap(error, backend, "post", f"posting the {what}", memory) from error

    def _progress(self, handle: Any, backend: str, what: str, memory: Tuple[str, ...] = ()) -> str:
        try:
            return self._agent.check_xfer_state(handle)
        except Exception as error:
            raise _wrap(error, backend, "progress", f"the {what}", memory) from error

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
