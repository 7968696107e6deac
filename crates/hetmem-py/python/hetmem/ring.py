"""``hetmem.FrameRing``: frames streamed through a Python stage by one of hetmem's strategies.

The ring is hetmem's own (the Rust ``FrameRing``: its slots, strategies, in-order delivery and
hand-off); this module gives it NumPy host views, torch (or CUDA array interface) device views
for the stage, and Python errors.

Example::

    import numpy as np, torch, hetmem

    def invert(frame, out, stream):          # runs on the ring's stream, once per frame
        torch.sub(255, frame, out=out)

    ring = hetmem.FrameRing((1080, 1920, 3), np.uint8, stage=invert, strategy="zero-copy")
    for index, out in ring.map(frames):      # frames: an iterable of (1080, 1920, 3) uint8 arrays
        use(np.asarray(out))                 # valid until the next frame comes out
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple

import numpy as np

from . import Buffer, LentError, _native, device as _default_device

__all__ = ["FrameRing", "StageError", "STRATEGIES"]

#: Every strategy name a ring takes, with its one-line meaning, as hetmem defines them.
STRATEGIES = dict(_native.ring_strategies())


class StageError(RuntimeError):
    """The stage failed on frame ``index``: the exception it raised is ``__cause__``. Frames
    before ``index`` came out intact; the ring goes on with frame ``index + 1``."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"the ring's stage failed on frame {index} (counting from 0): "
                         f"{type(cause).__name__}: {cause}; the frames before it came out intact, "
                         f"and the next result is frame {index + 1}")
        self.index = index


class _Hold:
    """Why a ring view may not be touched now (the slot is the GPU's or the ring's)."""

    def __init__(self, why: str):
        self.why = why


class RingView(Buffer):
    """A slot's host bytes as a frame: a ``hetmem.Buffer`` (``numpy()``, ``np.asarray``,
    DLPack) that raises ``LentError`` once the slot is no longer the caller's: an input after
    it was submitted (the GPU owns it), an output after the next result was asked for (the
    ring took it back). NumPy arrays taken from it before then are not revoked: do not keep
    them past that point."""

    def _check_host(self, what: str) -> None:
        hold = self._state.lease
        if hold is not None:
            raise LentError(f"{what}: {hold.why}")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.numpy()[key] = value

    def _lend(self, why: str) -> None:
        self._state.lease = _Hold(why)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _adapter(views: str, frame: Tuple[Tuple[int, ...], np.dtype], out: Tuple[Tuple[int, ...], np.dtype]):
    """What the native stage calls once per slot to turn a raw view into what the stage gets."""
    torch = _torch() if views == "torch" else None

    def adapt(role: str, view: Any) -> Any:
        if role == "stream":
            if torch is None:
                return view.handle  # cupy.cuda.ExternalStream(stream), ...: valid while the ring lives
            with warnings.catch_warnings():
                # torch 2.11 deprecates ExternalStream for Stream.from_external; both wrap it.
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = torch.cuda.ExternalStream(view.handle)
            # The wrapper does not own the handle: it keeps the ring (and so the stream) alive,
            # as the tensors keep its memory, should the stage keep it past the ring.
            stream._hetmem_ring = view
            return stream
        if isinstance(view, _native.DeviceFrame):
            if torch is None:
                return view  # the CUDA array interface (CuPy: cupy.asarray(view))
            return torch.as_tensor(view, device=f"cuda:{view.device_ordinal}")
        shape, dtype = frame if role == "frame" else out
        array = np.asarray(Buffer(view, shape, dtype))
        if torch is None:
            return array
        with warnings.catch_warnings():
            # The input view is read-only, which torch.from_numpy warns of: the stage reads it.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)

    return adapt


def _caller(stage: Callable[..., Any], views: str, graph: bool) -> Callable[[Any, Any, Any], None]:
    torch = _torch() if views == "torch" else None
    # With graph=True: each slot's stage work, captured once (by its views' addresses and the
    # stream: a slot's are the same for every frame) and replayed for every later frame.
    graphs: dict = {}

    def call(frame: Any, out: Any, stream: Any) -> None:
        if torch is None or stream is None:
            stage(frame, out, stream)
            return
        if not graph:
            with torch.cuda.stream(stream):
                stage(frame, out, stream)
            return
        key = (frame.data_ptr(), out.data_ptr(), stream.cuda_stream)
        captured = graphs.get(key)
        if captured is not None:
            with torch.cuda.stream(stream):
                captured.replay()
            return
        # The slot's first frame: run eagerly (it is this frame's result, and it settles lazy
        # initialisation and cuDNN's choice of algorithm), then capture the same calls. A
        # capture runs nothing. Thread-local capture mode: the ring's other threads may call
        # CUDA meanwhile. Each slot's graph keeps its own memory pool: nothing is shared.
        with torch.cuda.stream(stream):
            stage(frame, out, stream)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured, stream=stream, capture_error_mode="thread_local"):
            stage(frame, out, stream)
        graphs[key] = captured

    return call


def _spec(shape: Any, dtype: Any, what: str) -> Tuple[Tuple[int, ...], np.dtype]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(extent) for extent in shape)
    except TypeError:
        raise TypeError(f"{what} shape {shape!r}: give a tuple of ints") from None
    dtype = np.dtype(dtype)
    if dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject or not dtype.isnative:
        raise ValueError(f"{what} dtype {dtype}: give a plain numeric dtype of native byte order (uint8, "
                         "float16, ...)")
    return shape, dtype


class FrameRing:
    """Frames of ``shape`` and ``dtype`` through ``stage`` by ``strategy``, ``slots`` frames in
    flight, results out in order.

    ``strategy``: any name of ``hetmem.ring.STRATEGIES`` (``cpu``, ``copy``, ``pinned-async``,
    ``zero-copy``, ``managed``, ``hybrid``, ``auto``), meaning what it means in hetmem: where the
    slots' frames live and how they reach the stage (mapped strategies: the stage reads and
    writes the host bytes in place; ``pinned-async``: device buffers, copied in and out by the
    copy engines). ``auto``: ``hybrid`` on a GPU that maps host memory, ``cpu`` on the CPU
    backend.

    ``stage(frame, out, stream)``: called once per frame, at submit, with the frame's views:
    on a GPU, torch CUDA tensors (``views="torch"``, the default where torch imports) or objects
    with ``__cuda_array_interface__`` (``views="raw"``), and the ring's stream (a
    ``torch.cuda.ExternalStream``, made current for the call, or its handle, valid while the ring lives); on the CPU path,
    NumPy arrays (or torch CPU tensors) and ``None``. It reads ``frame`` and writes ``out`` (of
    ``out_shape``/``out_dtype``, default the frame's), queueing its GPU work on the stream: the
    slot goes back to the CPU only after that work is done. The views are valid for the call;
    kept past it, they see later frames' bytes.

    ``graph=True`` (torch views): each slot's stage is run eagerly on its first frame, then
    captured into a CUDA graph (``torch.cuda.CUDAGraph``) and replayed for every later frame of
    that slot, so a stage of many small torch calls costs one replay of CPU time a frame. The
    stage must then do the same GPU work on every call: no host synchronisation, no Python
    branch on the data, no new tensors kept past the call; a slot's views (and so the graph's
    addresses) are the same for every frame. On the CPU path it changes nothing.

    An exception in the stage comes out of the results at its frame, as ``StageError`` (its
    ``index``, the exception chained); the frames before it are delivered first.

    Frames in: ``with ring.slot() as frame: frame[...] = ...`` (written in place, no copy) or
    ``ring.submit(array)`` (copied in). Results out: ``ring.next_result()``, ``ring.results()``,
    or ``ring.map(frames)`` (one thread doing both). The hand-off holds: a submitted frame's
    view and a released result's raise ``LentError``.
    """

    def __init__(self, shape: Any, dtype: Any = np.uint8, *, stage: Callable[..., Any],
                 strategy: str = "auto", slots: int = 3, device: Optional[_native.Device] = None,
                 out_shape: Any = None, out_dtype: Any = None, views: Optional[str] = None,
                 graph: bool = False):
        frame = _spec(shape, dtype, "frame")
        out = _spec(frame[0] if out_shape is None else out_shape, frame[1] if out_dtype is None else out_dtype,
                    "out")
        if views is None:
            views = "torch" if _torch() is not None else "raw"
        if views not in ("torch", "raw"):
            raise ValueError(f"views={views!r}: 'torch' (tensors) or 'raw' (CUDA array interface objects on a "
                             "GPU, NumPy arrays on the CPU)")
        if views == "torch" and _torch() is None:
            raise ImportError("views='torch' needs PyTorch; install it, or pass views='raw'")
        if not isinstance(graph, bool):
            raise TypeError(f"graph={graph!r}: give True or False")
        if graph and views != "torch":
            raise ValueError("graph=True captures the stage with torch.cuda.CUDAGraph: it needs views='torch'")
        if not callable(stage):
            raise TypeError(f"stage {stage!r}: not callable; give a function stage(frame, out, stream)")
        if not isinstance(strategy, str):
            raise TypeError(f"strategy {strategy!r}: give one of {', '.join(STRATEGIES)}")
        self._frame, self._out = frame, out
        self._ring = _native.FrameRing(
            device if device is not None else _default_device(), strategy,
            (list(frame[0]), frame[1].str, frame[1].itemsize), (list(out[0]), out[1].str, out[1].itemsize),
            slots, _caller(stage, views, graph), _adapter(views, frame, out))
        # The result out now: its hold, its view, and the thread that took it.
        self._result: Optional[Tuple[Any, RingView, int]] = None

    # -- what it is ------------------------------------------------------------------------
    @property
    def strategy(self) -> str:
        """The strategy the ring runs by (``auto`` resolved)."""
        return self._ring.strategy

    @property
    def slots(self) -> int:
        """Frames in the ring at once."""
        return self._ring.slots

    @property
    def submitted(self) -> int:
        """Frames submitted so far."""
        return self._ring.submitted

    @property
    def delivered(self) -> int:
        """Results the consumer has finished with so far."""
        return self._ring.drained

    @property
    def host_bytes(self) -> int:
        """Host memory the slots take."""
        return self._ring.host_bytes

    @property
    def device_bytes(self) -> int:
        """Device memory the slots take."""
        return self._ring.device_bytes

    @property
    def link_bytes_per_frame(self) -> int:
        """Bytes that cross the host-GPU link per frame."""
        return self._ring.link_bytes_per_frame

    def __repr__(self) -> str:
        return (f"hetmem.FrameRing(shape={self._frame[0]}, dtype={self._frame[1]}, strategy={self.strategy!r}, "
                f"slots={self.slots}, submitted={self.submitted})")

    # -- frames in -------------------------------------------------------------------------
    def slot(self, block: bool = True) -> "_Slot":
        """The next frame's slot, as a context manager: ``with ring.slot() as frame:`` gives its
        host view (a ``RingView``); leaving the block submits it (an exception in the block
        gives the slot back unused). On the thread that took the last result, that result is
        released first (its slot may be the one the ring needs). Waits while the ring is full
        (the interpreter let go, so a consumer thread can drain it); ``block=False`` raises
        ``BlockingIOError`` instead. From one thread, take a result whenever ``slots`` frames
        are in flight, or use ``map``: a full ring that only this thread drains never frees."""
        if self._result is not None and self._result[2] == threading.get_ident():
            # This thread holds the last result: were the ring full, it would wait for itself.
            self._release()
        hold = self._ring.take_input(block)
        if hold is None:
            raise BlockingIOError("the ring is full: take a result (next_result) before the next frame")
        return _Slot(self, hold)

    def submit(self, array: Any, block: bool = True) -> int:
        """Copies ``array`` (the frame's shape exactly, any dtype that casts safely) into the next
        slot and submits it; returns its index. Waits as ``slot`` does."""
        array = np.asarray(array)
        if array.shape != self._frame[0]:
            raise ValueError(f"frame of shape {array.shape}: the ring takes {self._frame[0]}")
        slot = self.slot(block)
        with slot as frame:
            np.copyto(frame.numpy(), array, casting="same_kind")
        return slot.index

    def close(self) -> None:
        """Takes no more frames; the frames in flight still come out (``results`` ends after
        them)."""
        self._ring.close()

    # -- results out -----------------------------------------------------------------------
    def _release(self) -> None:
        if self._result is not None:
            hold, view, _ = self._result
            self._result = None
            view._lend(f"frame {hold.index}'s result was released (the next result was asked for, this thread "
                       "took a slot, or the ring closed): its slot went back to the ring; copy what you keep "
                       "(np.array(out)) before that")
            hold.release()

    def next_result(self, block: bool = True) -> Optional[Tuple[int, RingView]]:
        """The oldest frame's ``(index, out)``, ``out`` its read-only host view, valid until the
        next call, or this thread's next ``slot``/``submit`` (the slot then goes back to the
        ring). Waits (the interpreter let go) for the
        frame and its GPU work; ``block=False`` raises ``BlockingIOError`` instead. None after
        the last frame of a closed ring. Raises ``StageError`` for a frame whose stage failed;
        the next call returns the frame after it."""
        self._release()
        taken = self._ring.take_output(block)
        if taken is None:
            return None
        if isinstance(taken, tuple):
            index, cause = taken
            raise StageError(index, cause) from cause
        view = RingView(taken.memory(), self._out[0], self._out[1])
        self._result = (taken, view, threading.get_ident())
        return taken.index, view

    def results(self) -> Iterator[Tuple[int, RingView]]:
        """``next_result`` until the ring is closed and drained (another thread submits and
        closes). A ``StageError`` ends the loop; call ``results()`` again to go on."""
        while True:
            result = self.next_result()
            if result is None:
                return
            yield result

    def map(self, frames: Iterable[Any]) -> Iterator[Tuple[int, RingView]]:
        """Streams ``frames`` (arrays of the frame's shape) through the ring from this thread:
        keeps every slot busy, yields each ``(index, out)`` in order (``out`` valid until the
        next one), then closes the ring. A ``StageError`` closes it too; the frames submitted
        after the failed one then come out of ``results()``."""
        pending = 0
        try:
            for array in frames:
                while True:
                    # The result yielded last is done with once the generator resumes: its slot
                    # goes back first, or a one-slot ring could never take the next frame.
                    self._release()
                    try:
                        self.submit(array, block=False)
                    except BlockingIOError:
                        pending -= 1
                        yield self.next_result()
                        continue
                    pending += 1
                    break
        finally:
            # Also when a frame fails (StageError) or the caller stops early: the frames in flight
            # still come out of results().
            self.close()
        for _ in range(pending):
            yield self.next_result()
        self._release()

    def __enter__(self) -> "FrameRing":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release()
        self.close()


class _Slot:
    """``ring.slot()``: the next frame's host view, submitted when the ``with`` block ends."""

    def __init__(self, ring: FrameRing, hold: Any):
        self._hold = hold
        self.index: int = hold.index
        self.view = RingView(hold.memory(), ring._frame[0], ring._frame[1])

    def __enter__(self) -> RingView:
        return self.view

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is not None:
            self.view._lend(f"frame {self.index} was given back unused (its with block raised)")
            self._hold.cancel()
            return
        self.view._lend(f"frame {self.index} was submitted: its slot is lent to the GPU (or the stage) until "
                        "its result comes out; write the next frame into a new slot (ring.slot())")
        self._hold.submit()
