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

Frames from a Y4M or raw video file, FIFO or stdin, read straight into the slots::

    ring = hetmem.FrameRing((1620, 1920), np.uint8, stage=denoise)   # 1920x1080 4:2:0 as (H*3/2, W)
    for index, out in ring.map_file("in.y4m"):   # or ffmpeg ... -f yuv4mpegpipe - | python app.py -
        use(np.asarray(out))
"""

from __future__ import annotations

import os
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

    Frames in: ``with ring.slot() as frame: frame[...] = ...`` (written in place, no copy),
    ``ring.submit(array)`` (copied in), or from a video file, FIFO or stdin read straight into
    the slots: ``ring.feed(path)`` (a producer thread) or ``ring.map_file(path)`` (one thread
    doing both). Results out: ``ring.next_result()``, ``ring.results()``, or ``ring.map(frames)``
    (one thread doing both). The hand-off holds: a submitted frame's
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
        (the interpreter let go, so a consumer thread can drain it; Ctrl-C raises
        ``KeyboardInterrupt`` with nothing taken); ``block=False`` raises
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

    # -- frames from a file ------------------------------------------------------------------
    def _open_file(self, path: Any, format: Optional[str]) -> Any:
        """``path`` opened as video whose frames fit this ring, checked before any is read."""
        if format is not None and not isinstance(format, str):
            raise TypeError(f"format={format!r}: give None, 'y4m', 'raw' or 'raw:WxH:pix_fmt'")
        path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        shape, dtype = self._frame
        source = _native.FrameFile(path, format, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        if source.shapes is None:
            return source  # raw frames of the ring's own size
        file_dtype = np.dtype(source.typestr)
        shapes = [tuple(each) for each in source.shapes]
        if dtype != file_dtype or shape not in shapes:
            source.close()
            fits = " or ".join(f"FrameRing({each}, np.{file_dtype.name}, ...)" for each in shapes)
            raise ValueError(
                f"{source.name}: its frames are {source.description}; this ring's are {shape} {dtype} "
                f"({int(np.prod(shape, dtype=np.int64)) * dtype.itemsize} bytes): nothing was fed. Make the "
                f"ring for the file's frames, {fits} (the planes one after another), or convert the file "
                "(e.g. ffmpeg -pix_fmt, -s)")
        return source

    def _feed_one(self, source: Any, block: bool) -> Any:
        """The next frame of ``source`` read straight into the next slot and submitted: True;
        False at the file's end; None when the ring is full and ``block`` is False; the
        exception reading raised (the slot given back unused), for the caller to raise once
        the frames before it are out."""
        if self._result is not None and self._result[2] == threading.get_ident():
            # This thread holds the last result: were the ring full, it would wait for itself.
            self._release()
        hold = self._ring.take_input(block)
        if hold is None:
            return None
        try:
            read = source.read_into(hold)
        except (OSError, ValueError, _native.HetmemError) as error:
            hold.cancel()
            return error
        except BaseException:
            hold.cancel()
            raise
        if not read:
            hold.cancel()
            return False
        hold.submit()
        return True

    @staticmethod
    def _check_limit(limit: Optional[int]) -> Optional[int]:
        if limit is None:
            return None
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise ValueError(f"limit={limit!r}: give None (every frame) or a count of frames, 0 or more")
        return int(limit)

    def feed(self, path: Any, *, format: Optional[str] = None, limit: Optional[int] = None,
             close: bool = True) -> int:
        """Reads the frames of a video file (a path, a FIFO, ``"-"`` for stdin) straight into the
        ring's slots, each submitted to the stage as it is read, from this thread; returns the
        frames fed. The producer half, as ``submit`` is: take the results on another thread
        (``results()``), or use ``map_file`` from one thread (a full ring that only this thread
        drains never frees).

        Each frame is read by native code into a free slot's host memory, with no copy between
        (a regular file's large frames by several threads at once), the interpreter let go while
        it reads and while it waits for a free slot. The file is opened once and read front to
        back, so pipes work as files do.

        ``format``: None tells it by the first bytes (Y4M); ``"y4m"``; ``"raw"``: headerless
        frames of the ring's size back to back (ffmpeg's ``-f rawvideo``, whatever the ring's
        shape and dtype); ``"raw:WxH:pix_fmt"`` (``gray``, ``rgb24``, ``yuv420p``, ``nv12``, its
        chroma de-interleaved into planar 4:2:0 as it is read). The file's frames must be the
        ring's, checked before any frame is fed (``ValueError`` naming both and the ring to
        make): Y4M ``Cmono`` as ``(H, W)``, ``C444`` as ``(3, H, W)``, 4:2:0 as ``(H*3/2, W)``
        (even sides), 4:2:2 as ``(2*H, W)``, raw ``rgb24`` as ``(H, W, 3)``, or any of them flat
        as ``(samples,)``; ``uint8``, or ``uint16`` for 9- to 16-bit Y4M (``C420p10``, ...).

        ``limit``: at most that many frames. ``close``: the ring is closed once the file ends (or
        fails), so ``results()`` ends after the last frame; ``close=False`` leaves it open for
        more. A truncated or corrupt frame, or a failed read, raises (``HetmemError``, or
        ``OSError`` of the system's error) naming the file and the frame, counting from 0; the
        frames before it were submitted whole and their results come out as usual.

        Example::

            consumer = threading.Thread(target=lambda: [save(np.asarray(out)) for _, out in ring.results()])
            consumer.start()
            fed = ring.feed("in.y4m")   # closes the ring at the end: results() then ends
            consumer.join()
        """
        limit = self._check_limit(limit)
        try:
            source = self._open_file(path, format)
        except BaseException:
            if close:
                self.close()
            raise
        fed = 0
        try:
            while limit is None or fed < limit:
                read = self._feed_one(source, block=True)
                if isinstance(read, BaseException):
                    raise read
                if not read:
                    break
                fed += 1
        finally:
            source.close()
            if close:
                self.close()
        return fed

    def map_file(self, path: Any, *, format: Optional[str] = None,
                 limit: Optional[int] = None) -> Iterator[Tuple[int, RingView]]:
        """``map`` for a video file: streams the frames of ``path`` (a file, a FIFO, ``"-"`` for
        stdin) through the ring from this thread, each read straight into a slot as ``feed``
        reads it (same ``format`` and ``limit``, same checks), keeping every slot busy, and
        yields each ``(index, out)`` in order (``out`` valid until the next one); then closes
        the ring. The file is opened, and its frames checked against the ring's, before the
        first result (at the first ``next``). A truncated or corrupt frame, or a failed read,
        is raised after the results of every frame before it were yielded.

        Example::

            ring = hetmem.FrameRing((1620, 1920), np.uint8, stage=denoise)   # 1920x1080 4:2:0
            for index, out in ring.map_file("in.y4m"):
                write(np.asarray(out))
        """
        limit = self._check_limit(limit)
        try:
            source = self._open_file(path, format)
        except BaseException:
            self.close()
            raise
        pending, fed, failed = 0, 0, None
        try:
            while limit is None or fed < limit:
                # The result yielded last is done with once the generator resumes (as in map).
                self._release()
                read = self._feed_one(source, block=False)
                if read is None:
                    pending -= 1
                    yield self.next_result()
                    continue
                if isinstance(read, BaseException):
                    failed = read
                    break
                if not read:
                    break
                pending += 1
                fed += 1
        finally:
            source.close()
            self.close()
        for _ in range(pending):
            yield self.next_result()
        self._release()
        if failed is not None:
            raise failed

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
        ring). Waits (the interpreter let go; Ctrl-C raises ``KeyboardInterrupt`` with nothing
        taken) for the frame and its GPU work; ``block=False`` raises ``BlockingIOError`` instead. None after
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
