"""The hand-off while NIXL works: what is in flight (kept alive here), buffers lent to a
transfer that writes them and shared with one that reads them, and a peer's transfers
announced by its notification (``Incoming``, ``Offered``)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Set, Union

from .. import Buffer, Lease, LentError
from ._registration import FileRegistration, Registration

if TYPE_CHECKING:
    from ._agent import Agent


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
    for NIXL to report the transfer complete. Its host views and, for device memory, its
    device views raise ``LentError`` meanwhile."""

    blocks_device_views = True

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
        if self._writes and registration._readonly:
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
