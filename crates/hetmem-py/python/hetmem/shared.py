"""``hetmem.SharedRing``: frames from one process to another through shared memory, no copy.

The ring is hetmem's own (the Rust ``shared_ring``: a sealed memfd of slots, handed over a
Unix socket, frames in order, none lost or repeated, a dead peer noticed at once, nothing left
in ``/dev/shm``); this module gives its slots and frames NumPy views that follow the hand-off
rule (``LentError`` once a slot is the other process's) and Python errors (``PeerGone``).

Example, with ``multiprocessing`` (``spawn`` or ``fork``)::

    import multiprocessing as mp, numpy as np, hetmem

    def produce(path):
        with hetmem.SharedRing.create(path, (480, 640, 3), np.uint8, slots=4) as ring:
            for k in range(100):
                with ring.slot() as frame:       # the slot's bytes, written in place
                    frame[...] = k % 256         # published when the block ends

    if __name__ == "__main__":
        path = "/tmp/frames.sock"
        mp.get_context("spawn").Process(target=produce, args=(path,)).start()
        with hetmem.SharedRing.connect(path, (480, 640, 3), np.uint8, timeout=30) as ring:
            for frame in ring:                   # read-only, valid until the next frame
                use(np.asarray(frame))
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Iterator, Optional, Union

import numpy as np

from . import _native, device as _default_device
from ._native import PeerGone
from .ring import RingView, _spec

__all__ = ["PeerGone", "SharedFrame", "SharedRing", "SharedRingConsumer", "SharedRingProducer", "SharedSlot"]

Peer = Union[str, "os.PathLike[str]", Any]


class SharedSlot(RingView):
    """The slot of the next frame, writable (``numpy()``, ``np.asarray``, ``slot[...] = x``)
    until it is published or given back; then its views raise ``LentError``. As a context
    manager, it is published when the block ends (given back unused if the block raises). A
    NumPy array taken from it is not revoked: do not keep it past the publish."""

    index: int

    def __enter__(self) -> "SharedSlot":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        ring: SharedRingProducer = self._ring
        if ring._slot is not self:
            return  # published or given back inside the block already
        if kind is not None:
            ring.cancel()
        else:
            ring.publish()


class SharedFrame(RingView):
    """A frame the consumer holds, read-only (``numpy()``, ``np.asarray``); ``release()`` (or
    the end of its ``with`` block) frees its slot for the producer, after which its views raise
    ``LentError``. A NumPy array taken from it is not revoked: copy what you keep
    (``np.array(frame)``) before the release."""

    index: int

    def release(self) -> None:
        """Frees the frame's slot for the producer (again: nothing)."""
        if self._hold is not None:
            self._lend(f"frame {self.index} was released: its slot went back to the producer, which writes later "
                       "frames into it; copy what you keep (np.array(frame)) before releasing it")
            hold, self._hold = self._hold, None
            hold.release()

    def __enter__(self) -> "SharedFrame":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


# Timeouts longer than this (about 31 years) are waited for ever: the native clock cannot hold
# a deadline much past 2^63 ns, and no wait of such a length can end before the process does.
LONGEST_TIMEOUT = 1e9


def _timeout(timeout: Optional[float]) -> Optional[float]:
    """``timeout`` as seconds for the native half: None (for ever) for None and for anything
    longer than ``LONGEST_TIMEOUT``; a TypeError or ValueError saying what to give."""
    if timeout is None:
        return None
    if isinstance(timeout, (bool, np.bool_)) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout {timeout!r}: give a number of seconds, or None to wait for ever")
    try:
        seconds = float(timeout) + 0.0  # + 0.0: -0.0 is 0
    except OverflowError:  # an integer past float's range: for ever, or below 0
        if timeout > 0:
            return None
        seconds = float("-inf")
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"timeout {timeout!r}: give a finite number of seconds >= 0, or None to wait for ever")
    return None if seconds > LONGEST_TIMEOUT else seconds


def _peer(peer: Peer) -> Any:
    """A path as a ``str`` (``os.fspath``); a socket object as it is (the native half takes its
    descriptor through ``fileno()``)."""
    import socket

    if isinstance(peer, socket.socket):
        return peer
    try:
        return os.fspath(peer)
    except TypeError:
        raise TypeError(f"{peer!r}: give a socket path (str or os.PathLike) or a connected socket.socket "
                        "(never a raw descriptor)") from None


class SharedRing:
    """A ring of shared-memory slots between two processes: frames of ``shape`` and ``dtype``
    go from the producer (``SharedRing.create``) to the consumer (``SharedRing.connect``) in
    order, with no copy. Both sides declare the same shape and dtype; a mismatch is refused at
    connect, naming both. A side whose peer exits or is killed gets ``PeerGone`` (its ``pid``
    and ``role`` say which), after the frames the peer finished; the producer's ``close()``
    ends the stream cleanly (the consumer's iteration stops). Waits let go of the interpreter.
    """

    _native: Any

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("make a shared ring with SharedRing.create(...) (producer) or SharedRing.connect(...) "
                        "(consumer)")

    @staticmethod
    def create(path: Peer, shape: Any, dtype: Any = np.uint8, slots: int = 4, *,
               timeout: Optional[float] = None, device: Optional[_native.Device] = None) -> "SharedRingProducer":
        """The producing side: listens at the Unix socket ``path`` (a new file, removed once the
        consumer came; or a connected ``socket.socket``, e.g. one end of ``socket.socketpair()``),
        waits up to ``timeout`` seconds (None: for ever) for the consumer, agrees on the frames
        and hands it a ring of ``slots`` slots (1 to 64). A socket given keeps its settings
        (blocking or not, its timeouts), but belongs to the ring from then on: it carries the
        ring's wake-ups, so read or write nothing on it. ``timeout`` bounds the whole set-up:
        a consumer that agrees on the frames and then says nothing more is a ``TimeoutError``.
        Every wait, here and in ``slot()``, hears Ctrl-C (``KeyboardInterrupt``), with or
        without a timeout, but for the set-up's last step (the ring's hand-over, after the
        agreement): give a timeout where the peer is not trusted.

        Example::

            with hetmem.SharedRing.create("/tmp/frames.sock", (1024,), np.float32) as ring:
                ring.send(np.random.rand(1024).astype(np.float32))     # copied in
                with ring.slot() as frame:                               # or written in place
                    frame[...] = 1.0
        """
        frame = _spec(shape, dtype, "frame")
        ring = object.__new__(SharedRingProducer)
        ring._frame = frame
        ring._slot = None
        ring._native = _native.SharedRingProducer(
            device if device is not None else _default_device(), _peer(path),
            (list(frame[0]), frame[1].str, frame[1].itemsize), slots, _timeout(timeout))
        return ring

    @staticmethod
    def connect(path: Peer, shape: Any, dtype: Any = np.uint8, *, timeout: Optional[float] = None,
                device: Optional[_native.Device] = None, max_slots: int = 64) -> "SharedRingConsumer":
        """The consuming side: connects to the producer listening at ``path`` (waiting up to
        ``timeout`` seconds, None: for ever, for it to appear; or a connected ``socket.socket``),
        agrees on the frames and takes its ring, if it has at most ``max_slots`` slots (1 to
        64) of frames of that size: the producer is another process, and every slot it offers
        is registered (pinned) here, so a ring beyond that is refused, before any of it is
        registered, with a ``ValueError`` saying so. A socket given keeps its settings and
        belongs to the ring from then on, as in ``create``; ``timeout`` bounds the whole
        set-up, as there. Waits, here and in ``next()``, hear Ctrl-C (the ring's hand-over
        after the agreement aside, as in ``create``).

        Example::

            with hetmem.SharedRing.connect("/tmp/frames.sock", (1024,), np.float32, timeout=30) as ring:
                for frame in ring:                     # each released when the next is asked for
                    total += np.asarray(frame).sum()
        """
        frame = _spec(shape, dtype, "frame")
        ring = object.__new__(SharedRingConsumer)
        ring._frame = frame
        ring._iterated = None
        ring._native = _native.SharedRingConsumer(
            device if device is not None else _default_device(), _peer(path),
            (list(frame[0]), frame[1].str, frame[1].itemsize), _timeout(timeout), max_slots)
        return ring

    @property
    def shape(self) -> tuple:
        """A frame's shape."""
        return self._frame[0]

    @property
    def dtype(self) -> np.dtype:
        """A frame's dtype."""
        return self._frame[1]

    @property
    def slots(self) -> int:
        """The number of slots."""
        return self._native.slots

    @property
    def peer_pid(self) -> int:
        """The other process's id."""
        return self._native.peer_pid

    def __enter__(self) -> Any:
        return self

    def __repr__(self) -> str:
        return (f"hetmem.{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, slots={self.slots}, "
                f"peer_pid={self.peer_pid})")


class SharedRingProducer(SharedRing):
    """The producing side of a ``SharedRing`` (``SharedRing.create``)."""

    def slot(self) -> SharedSlot:
        """Waits for the next frame's slot to be free (the consumer released it) and gives it,
        writable: fill it, then ``publish()`` (or leave its ``with`` block). Raises ``PeerGone``
        when the consumer went."""
        if self._slot is not None:
            raise ValueError(f"frame {self._slot.index}'s slot is still being filled: publish() or cancel() it "
                             "before taking the next")
        index, memory = self._native.slot()
        view = SharedSlot(memory, self._frame[0], self._frame[1])
        view.index, view._ring = index, self
        self._slot = view
        return view

    def publish(self) -> int:
        """Hands the slot being filled to the consumer; returns its frame's index. Its views raise
        ``LentError`` from now on."""
        view = self._slot
        if view is None:
            raise ValueError("no slot is being filled: take one with slot() first")
        self._slot = None
        view._lend(f"frame {view.index} was published: its slot is the consumer's now; write the next frame "
                   "into a new slot (ring.slot())")
        return self._native.publish()

    def cancel(self) -> None:
        """Gives the slot being filled back unused; the next ``slot()`` is the same frame."""
        view = self._slot
        if view is not None:
            self._slot = None
            view._lend(f"frame {view.index} was given back unused; take a new slot (ring.slot())")
            self._native.cancel()

    def send(self, array: Any) -> int:
        """Copies ``array`` (the frame's shape exactly, any dtype that casts safely) into the next
        slot and publishes it; returns its index."""
        array = np.asarray(array)
        if array.shape != self._frame[0]:
            raise ValueError(f"frame of shape {array.shape}: the ring takes {self._frame[0]}")
        with self.slot() as frame:
            np.copyto(frame.numpy(), array, casting="same_kind")
        return frame.index

    @property
    def published(self) -> int:
        """Frames published so far."""
        return self._native.published

    def close(self) -> None:
        """Ends the stream: the consumer takes the frames published so far, then its iteration
        stops. A slot being filled is given back unused."""
        self.cancel()
        self._native.close()

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.close()
        else:
            # The stream broke off: the consumer hears it (PeerGone), not a clean end.
            self.cancel()
            self._native = _Abandoned(self._native)


class _Abandoned:
    """A producer whose ring was let go without closing: what is left of it to read."""

    def __init__(self, ring: Any):
        self.slots, self.peer_pid, self.published = ring.slots, ring.peer_pid, ring.published

    def __getattr__(self, name: str) -> Any:
        raise _native.HetmemError("the shared ring was let go after an error in its with block; make a new ring")


class SharedRingConsumer(SharedRing):
    """The consuming side of a ``SharedRing`` (``SharedRing.connect``)."""

    def next(self, timeout: Optional[float] = None) -> SharedFrame:
        """Waits up to ``timeout`` seconds (None, or more than ``LONGEST_TIMEOUT``, about 31
        years: for ever; 0: only looks) for the next frame
        and gives it, read-only; ``release()`` it (or use it in a ``with`` block) to free its
        slot. Raises ``StopIteration`` after the last frame of a closed stream, ``PeerGone``
        when the producer went without closing it (after the frames it finished), and
        ``TimeoutError`` when neither a frame nor the end came in time: the ring is as it was,
        so calling again goes on waiting for the same frame.

        Example::

            try:
                frame = ring.next(timeout=5.0)
            except TimeoutError:
                ...                                # the producer is slow or stuck: decide here
        """
        taken = self._native.next_frame(_timeout(timeout))
        if taken is None:
            raise StopIteration
        index, memory, hold = taken
        view = SharedFrame(memory, self._frame[0], self._frame[1])
        view.index, view._hold = index, hold
        return view

    def __iter__(self) -> Iterator[SharedFrame]:
        return self

    def __next__(self) -> SharedFrame:
        """The next frame; the one this iteration gave before is released first."""
        if self._iterated is not None:
            self._iterated.release()
            self._iterated = None
        self._iterated = self.next()
        return self._iterated

    @property
    def ended(self) -> bool:
        """Whether the producer closed the stream and every frame was taken."""
        return self._native.ended

    def close(self) -> None:
        """Lets go of the ring: the producer hears that no more frames are taken (its next
        ``slot()`` raises ``PeerGone``). Frames still held stay readable until released."""
        if self._iterated is not None:
            self._iterated.release()
            self._iterated = None
        self._native.close()

    def __exit__(self, *exc: Any) -> None:
        self.close()
