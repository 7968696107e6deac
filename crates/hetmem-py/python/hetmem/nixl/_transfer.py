"""A NIXL transfer in flight, and the hand-off of the buffer it uses."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

from ._errors import NixlError, _remedy
from ._handoff import _hold, _let_go, _Share, _TransferLease
from ._registration import FileRegistration, Registration

if TYPE_CHECKING:
    from ._agent import Agent


class Transfer:
    """A NIXL transfer in flight. ``done()`` polls it, ``wait()`` waits for it; when NIXL
    reports it complete the buffer it wrote is reclaimed and the one it read is no longer
    shared. A failed transfer raises ``NixlError`` (and gives its buffers back: NIXL touches
    them no more; a written one holds undefined bytes). A context manager: leaving the block
    waits."""

    def __init__(self, agent: "Agent", operation: str, local: Registration, local_desc: Tuple[int, int, int],
                 remote_name: str, remote_kind: str, remote_desc: Tuple[int, int, int], notify: bytes,
                 writes_local: bool, file: Optional[FileRegistration] = None):
        what = f"{operation} of {local_desc[1]} bytes"
        self._agent = agent
        self._what = what
        self._memory_kinds = (local._kind, remote_kind)
        self._state = "PROC"
        self._final = "PROC"  # the state a transfer whose release failed ended in
        self._error: Optional[BaseException] = None
        # What the transfer uses, each counted active (so close() refuses) and held here (so
        # dropping it deregisters nothing) until NIXL is done: the memory's registration, and
        # the file's, whose descriptor NIXL reads and writes through (closed, its number could
        # name another file by the time the backend gets to it).
        self._registrations = (local,) if file is None else (local, file)
        buffer = None if isinstance(local, FileRegistration) else local._buffer
        self._hand_off: Optional[Union[_TransferLease, _Share]] = None
        if buffer is not None:
            if writes_local and local._readonly:
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
            for registration in self._registrations:
                registration._active += 1
            self._counted = True
            state = agent._post(self._handle, self._backend, what, self._memory_kinds)
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
        try:
            self._settle(state)
        except NixlError:
            # Complete at once, but its request could not be released: the caller gets the
            # transfer, whose next done() or wait() tries again (raising from here would leave
            # the buffers held by an object nobody has).
            if self._state != "RELEASING":
                raise

    @property
    def backend(self) -> str:
        """The NIXL backend that moves the bytes."""
        return self._backend

    def done(self) -> bool:
        """Whether the transfer is complete (its buffers given back); raises ``NixlError`` if
        it failed, on this and every later call."""
        if self._state == "PROC":
            try:
                state = self._agent._progress(self._handle, self._backend, self._what, self._memory_kinds)
            except Exception as error:
                # NIXL reports a failed transfer by raising: it is over, its buffers go back.
                # (Ctrl-C is not caught: the transfer stays in flight, polled again later.)
                self._error = error
                self._settle("ERR")
            else:
                self._settle(state)
        elif self._state == "RELEASING":
            self._settle(self._final)
        elif self._state != "DONE":
            raise self._failure().with_traceback(None)
        return self._state == "DONE"

    def _failure(self) -> BaseException:
        return self._error or NixlError(f"NIXL {self._backend}: the {self._what} failed (state {self._state}); "
                                        f"{_remedy('', self._backend, 'progress', self._memory_kinds)}")

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
        if self._handle is not None:
            try:
                self._handle.release()
            except Exception as error:
                # NIXL could not let go of the request (a cancel that failed): UCX may still use
                # the memory, so nothing is given back; the next done() tries again.
                self._state, self._final = "RELEASING", state
                self._error = self._error or error
                raise NixlError(f"NIXL {self._backend}: the {self._what} ended ({state}) but its request could not "
                                f"be released ({type(error).__name__}: {error}); its buffers stay held until a "
                                "later done() or wait() releases it") from None
            self._handle = None
        self._state = state
        self._give_back()
        _let_go(self)
        if state != "DONE":
            raise self._failure().with_traceback(None)

    def _give_back(self) -> None:
        hand_off, self._hand_off = self._hand_off, None
        if hand_off is not None:
            hand_off.give_back()
        if self._counted:
            for registration in self._registrations:
                registration._active -= 1
            self._counted = False

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait()

    def __repr__(self) -> str:
        return f"hetmem.nixl.Transfer({self._what}, backend={getattr(self, '_backend', None)!r}, state={self._state})"
