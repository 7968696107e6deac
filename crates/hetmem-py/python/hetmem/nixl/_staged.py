"""Host memory into a peer's device memory in two hops: this process's copy engine lands each
piece in device memory of its own, and NIXL moves it on device to device.

Why: on one machine UCX has no zero-copy path from host memory into another process's device
memory (no RDMA NIC to write VRAM): it emulates the put in 8 KiB pieces through shared memory,
about 0.9 GB/s on the H200 machine. Device to device between processes it uses CUDA IPC,
hundreds of GB/s. The two hops, pipelined, moved the host bytes at 0.92-0.94 of the link there
on PyTorch's memory (``bench/results/2026-12-04-h200/``); through hetmem's own device memory
as the staging, 0.57-0.68 GB/s in one call, so the staging is PyTorch's (``Staging``).
"""

from __future__ import annotations

import operator
import time
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import numpy as np

from .. import Buffer, HetmemError
from ._errors import NixlError, _remedy
from ._handoff import _hold, _let_go, _Share
from ._registration import FileRegistration, Registration, RemoteRegion

if TYPE_CHECKING:
    from ._agent import Agent


#: The smallest piece a staged write cuts (a smaller source moves in fewer pieces than asked).
MIN_PIECE = 64 << 10
#: The most pieces a staged write cuts: every poll looks at each.
MAX_PIECES = 1024


def _torch(what: str) -> Any:
    try:
        import torch
    except ImportError as error:
        raise HetmemError(f"{what}: the staged write copies with PyTorch's CUDA streams; install torch with CUDA "
                          "(or use Agent.write, which needs neither)") from error
    if not torch.cuda.is_available():
        raise HetmemError(f"{what}: PyTorch sees no CUDA device; the staged write needs the GPU its device memory "
                          "is on (Agent.write needs none)")
    return torch


class StagedWrite:
    """A write of host memory (a ``DRAM`` registration) into a peer's device memory (a ``VRAM``
    region), through device memory of this process: made by ``Agent.write_staged``. The copies
    into the staging memory are queued when it is made; ``wait()`` (or ``done()`` until it says
    True) hands each piece to NIXL as it lands and waits for NIXL to move it: a staged write
    nobody waits for moves nothing to the peer, and holds its memory until a later
    ``write_staged`` on the agent polls it. The source is shared until the last piece has been
    copied out of it; the peer gets ``notify`` once every piece is there. A failed piece
    raises ``NixlError`` (on this and every later call) once no piece is in flight any more.
    A context manager: leaving the block waits."""

    def __init__(self, agent: "Agent", source: Registration, destination: RemoteRegion, staging: "Staging",
                 pieces: int, notify: bytes):
        # The registered range, as the registration fixed it when made (its descriptor), and
        # the memory it lies in: the bytes the copies read are checked against that memory
        # below, and the share is taken on that same memory's hand-off state.
        base, nbytes, _ = source._descriptor
        self._what = f"staged write of {nbytes} bytes"
        torch = _torch(self._what)
        self._agent = agent
        self._destination = destination
        self._notify = notify
        self._notified = False
        self._staging: Optional[Staging] = staging
        self._source: Optional[Registration] = source
        self._error: Optional[BaseException] = None
        self._state = "PROC"
        piece = -(-nbytes // pieces)
        self._pieces = [(at, min(piece, nbytes - at)) for at in range(0, nbytes, piece)]
        # (NIXL handle, backend) of each piece handed over, None once NIXL is done with it.
        self._posted: List[Optional[Tuple[Any, str]]] = []
        self._landed: List[Any] = []
        memory = source._memory
        if memory is None or memory.host_ptr is None:
            raise TypeError("write_staged: the source registration holds no host memory")
        host_bytes = Buffer(memory, (nbytes,), np.uint8, offset=base - memory.host_ptr)
        self._share: Optional[_Share] = _Share(host_bytes, self._what)
        source._active += 1
        staging._active += 1
        staging.user = self
        self._stream = None
        try:
            self._stream = torch.cuda.Stream(device=staging.device)
            # The staging's block may have been in use on the device's current stream (PyTorch's
            # allocator hands blocks back per stream): the copies wait for that stream's work.
            self._stream.wait_stream(torch.cuda.current_stream(staging.device))
            host = torch.from_dlpack(host_bytes)
            landing = staging.tensor[:nbytes]
            with torch.cuda.stream(self._stream):
                for at, length in self._pieces:
                    landing[at:at + length].copy_(host[at:at + length], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(self._stream)
                    self._landed.append(event)
            del host, landing
        except BaseException:
            # Copies already queued may still read the source and write the staging: nothing
            # is given back before they are done (even if waiting for them fails).
            try:
                if self._stream is not None:
                    self._stream.synchronize()
            finally:
                self._give_back_source()
                self._let_go_of_staging()
            raise
        _hold(self)

    @property
    def pieces(self) -> int:
        """How many pieces the bytes move in."""
        return len(self._pieces)

    def done(self) -> bool:
        """Hands over the pieces that have landed, polls the ones NIXL moves; whether every
        piece is at the peer (raises ``NixlError``, on this and every later call, if one
        failed, once no piece is in flight any more)."""
        if self._state == "PROC":
            self._advance()
        if self._state == "FAILED":
            assert self._error is not None
            raise self._error.with_traceback(None)
        return self._state == "DONE"

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits until every piece is at the peer (``TimeoutError`` after ``timeout`` seconds,
        the write still in flight and its memory still held)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self._what}: not complete after {timeout} s; it is still in flight (its "
                                   "memory still held)")
            time.sleep(0)

    def _advance(self) -> None:
        agent, what = self._agent, self._what
        assert self._staging is not None
        base, _, device = self._staging._descriptor
        # Pieces in order, each once its copy has landed (and none after a failure).
        while self._error is None and len(self._posted) < len(self._pieces):
            index = len(self._posted)
            if not self._landed[index].query():
                break
            at, length = self._pieces[index]
            remote = self._destination.part(at, length)._descriptor()
            try:
                handle = agent._prepare("WRITE", "VRAM", (base + at, length, device), self._destination.agent,
                                        "VRAM", remote, b"")
            except Exception as error:
                self._error = error
                break
            backend = agent._backend_of(handle)
            self._posted.append((handle, backend))
            try:
                state = agent._post(handle, backend, f"{what}, piece {index}", ("VRAM",))
            except Exception as error:  # not posted: NIXL holds none of it
                self._error = error
                state = "ERR"
            self._settle_piece(index, state)
        # The source is read by the copies only: shared until the last has landed.
        landed = all(event.query() for event in self._landed)
        if self._share is not None and landed:
            self._give_back_source()
        for index, posted in enumerate(self._posted):
            if posted is None:
                continue
            handle, backend = posted
            # Ctrl-C here propagates and leaves the piece in flight: a later done() polls it.
            try:
                state = agent._progress(handle, backend, f"{what}, piece {index}", ("VRAM",))
            except Exception as error:  # NIXL reports a failed transfer by raising
                self._error = self._error or error
                state = "ERR"
            self._settle_piece(index, state)
        if any(posted is not None for posted in self._posted):
            return
        if self._error is None and len(self._posted) < len(self._pieces):
            return  # pieces still to land and hand over
        if not landed:
            return  # after a failure: copies not handed over still run into the staging
        if self._error is None and self._notify and not self._notified:
            # Sent once every piece is complete: pieces may complete out of order, so a
            # notification riding on the last one could reach the peer before an earlier one.
            self._notified = True
            try:
                agent._agent.send_notif(self._destination.agent, self._notify)
            except BaseException as error:
                self._error = NixlError(f"NIXL: {what}: every piece arrived but the notification to "
                                        f"{self._destination.agent!r} may not have gone "
                                        f"({type(error).__name__}: {error}); the peer's expect() may not end: "
                                        "tell it by other means")
                self._finish()
                if not isinstance(error, Exception):
                    raise
                return
        self._finish()

    def _settle_piece(self, index: int, state: str) -> None:
        if state == "PROC":
            return
        posted = self._posted[index]
        backend = self._agent._label()
        if posted is not None:
            handle, backend = posted
            handle.release()  # complete or failed: NIXL is done with it (kept if this raises)
            self._posted[index] = None
        if state != "DONE" and self._error is None:
            self._error = NixlError(f"NIXL {backend}: piece {index} of the {self._what} failed (state {state}); "
                                    f"{_remedy('', backend, 'progress', ('VRAM',))}")

    def _give_back_source(self) -> None:
        share, self._share = self._share, None
        if share is not None:
            share.give_back()
        source, self._source = self._source, None
        if source is not None:
            source._active -= 1

    def _let_go_of_staging(self) -> None:
        # Let go of here, so that a one-off staging is freed once its write is over.
        staging, self._staging = self._staging, None
        if staging is not None:
            staging._active -= 1
            if staging.user is self:
                staging.user = None

    def _finish(self) -> None:
        self._give_back_source()
        self._let_go_of_staging()
        self._state = "DONE" if self._error is None else "FAILED"
        _let_go(self)

    def __enter__(self) -> "StagedWrite":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait()

    def __repr__(self) -> str:
        return f"hetmem.nixl.StagedWrite({self._what}, {len(self._pieces)} pieces, state={self._state})"


def check_staged(agent: "Agent", source: Any, destination: Any, pieces: Any) -> int:
    """The piece count of a staged write of ``source`` into ``destination``, checked."""
    if isinstance(source, FileRegistration) or not isinstance(source, Registration) or source.kind != "DRAM":
        raise TypeError("write_staged: the source is a Registration of host memory (agent.register(buffer) of a "
                        "hetmem.pinned or registered buffer); for device memory use write()")
    if not isinstance(destination, RemoteRegion) or destination.kind != "VRAM":
        kind = destination.kind if isinstance(destination, RemoteRegion) else type(destination).__name__
        raise TypeError(f"write_staged: the destination is a peer's device memory (a VRAM RemoteRegion), not "
                        f"{kind}; for host memory use write(), which is as fast there")
    agent._check_pair(source, destination, "write_staged")
    if isinstance(pieces, bool):
        raise TypeError("write_staged: pieces is a count of pieces (an int >= 1), not a bool")
    try:
        pieces = operator.index(pieces)
    except TypeError:
        raise TypeError(f"write_staged: pieces={pieces!r}; give an integer count >= 1 (8 moved fastest on the "
                        "H200 machine)") from None
    if pieces < 1:
        raise ValueError(f"write_staged: pieces={pieces}; give 1 or more (8 moved fastest on the H200 machine)")
    # Pieces of at least MIN_PIECE bytes (fewer than asked for a small source): each costs an
    # event and a NIXL request.
    return max(1, min(pieces, MAX_PIECES, source.nbytes // MIN_PIECE))


class Staging:
    """Device memory a staged write lands host bytes in: a PyTorch allocation of this
    module's own (no caller ever sees it, so no hand-off is kept on it beyond the writes'
    count), registered with the agent as ``VRAM`` for as long as this object lives. PyTorch's
    and not hetmem's: the same two hops through hetmem's ``cuMemAlloc`` memory moved 0.57-0.68
    GB/s on the H200 machine where PyTorch's moved 39.7-44.0, in one call (UCX appears not to
    take the former for CUDA memory it can map by IPC; docs/cluster.md)."""

    def __init__(self, agent: "Agent", torch: Any, nbytes: int, ordinal: int):
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{ordinal}")
        self.device = ordinal
        self.nbytes = nbytes
        self._active = 0
        #: The staged write using it now, polled by a later write_staged that finds it busy.
        self.user: Optional[StagedWrite] = None
        self._agent = agent
        self._descriptor = (self.tensor.data_ptr(), nbytes, ordinal)
        self._dlist: Any = None
        self._dlist = agent._register([self._descriptor + ("",)], "VRAM")

    @property
    def closed(self) -> bool:
        return self._dlist is None

    def close(self) -> None:
        """Deregisters now; refused while a write uses it."""
        if self._active:
            raise NixlError("the staging memory is in use by a staged write in flight; wait() for it first")
        dlist, self._dlist = self._dlist, None
        if dlist is not None:
            self._agent._deregister(dlist)

    def __del__(self) -> None:
        try:
            if not self._active:
                self.close()
        except Exception:  # at interpreter exit, with NIXL half gone: nothing to do
            pass
