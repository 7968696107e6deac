"""``hetmem.loader.WorkerLoader``: a map-style dataset run in worker processes, each sample
written once, by its worker, straight into memory the trainer registered with the GPU.

Each worker owns one ``hetmem.SharedRing`` to the trainer whose frame is one whole batch
(``batch_size`` samples of ``sample_shape`` / ``sample_dtype``, then their int64 labels). A
worker builds the batches ``w, w + workers, w + 2 workers, ...`` of each epoch: it takes a free
slot of its ring and writes each sample its dataset's ``__getitem__`` returns into that slot's
row, in place. Nothing is pickled per sample, no pin-memory thread copies it again: the slot's
pages are the trainer's registered (pinned) memory. The trainer takes batch ``k`` from ring
``k % workers`` (so batches come out in the sampler's order), brings it to the GPU with one
asynchronous copy on its own stream, and frees the slot for the worker only once that copy
completed (an event), never while the GPU still reads it.

Without a GPU (hetmem's CPU backend) the trainer copies each batch out of its slot into a
fresh array (torch CPU tensors, or NumPy with ``output="numpy"``) before freeing the slot.

The dataset contract:

- ``dataset[i]`` for ``i`` in ``range(len(dataset))`` returns a NumPy array (or a CPU torch
  tensor) of exactly ``sample_shape`` and ``sample_dtype`` (no casting: a mismatch is an
  error naming the index); with ``labels=True`` it returns ``(sample, label)`` with ``label``
  an integer, and the loader yields ``(samples, labels)`` (labels int64).
- The dataset (and ``worker_init``) are pickled once per worker at start, so define them at
  module level. Workers are started with ``multiprocessing``'s ``"spawn"`` context by default
  (``"forkserver"`` works too; ``"fork"`` is refused: a forked child of a process that holds
  CUDA state or threads is not safe), so the training script needs the usual
  ``if __name__ == "__main__":`` guard.

Errors reach the trainer as ``WorkerError`` at the batch where they happened (the batches
before it come out intact): an exception raised by ``__getitem__`` (its traceback text in the
message and in ``.traceback``), a sample of the wrong shape, dtype or label, and a worker that
died (killed by a signal, ``os._exit``...), named by number and pid, noticed at once through
the ring (no polling timeout). A worker that is alive but stuck (a ``__getitem__`` that hangs
on a network file system, a deadlock) is only noticed with ``timeout=``: a batch not ready
within that many seconds of being asked for raises ``WorkerTimeout`` (a ``WorkerError`` and a
``TimeoutError``) naming the worker, its pid and the batch. A loader whose worker failed or
timed out is closed (its workers stopped: a stuck one cannot be trusted to come back in a
known state); make a new one. The rings are sealed memfds, so nothing is left in
``/dev/shm`` whatever happens to any process.

The pipeline: each worker has ``prefetch`` slots, so it can have that many batches ready or
being built while the trainer works. The trainer gives a batch's slot back as soon as it asks
for the next batch (on a GPU: once that batch's copy completed, long since as a rule), before
it waits for that next batch, so a worker is never kept from its next slot by a trainer that
is itself waiting. With the default ``prefetch=2`` a worker thus builds one batch ahead of the
one the trainer holds, as ``torch.utils.data.DataLoader``'s ``prefetch_factor=2`` does.

Example::

    import numpy as np, hetmem.loader

    class Noise:                                  # at module level: pickled to the workers
        def __len__(self):
            return 10_000
        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            return rng.integers(0, 255, (224, 224, 3), dtype=np.uint8), i % 1000

    if __name__ == "__main__":
        loader = hetmem.loader.WorkerLoader(Noise(), 256, workers=8, sample_shape=(224, 224, 3),
                                            sample_dtype=np.uint8, labels=True, shuffle=True, seed=0,
                                            timeout=120)    # a stuck worker: WorkerTimeout
        with loader:
            for epoch in range(2):
                for images, labels in loader:     # CUDA uint8 (256, 224, 224, 3), int64 (256,)
                    train_step(images, labels)
        print(loader.stats()["host_bytes_per_sample"])   # 150528: one write per sample
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import socket
import traceback
import warnings
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Tuple

import numpy as np

from . import _native, device as _default_device
from .ring import _spec
from .shared import LONGEST_TIMEOUT, PeerGone, SharedRing

__all__ = ["WorkerError", "WorkerLoader", "WorkerTimeout"]

# A worker's traceback text is cut to this many characters: it travels in one pipe message.
_MAX_TRACEBACK = 16_000
# Label bytes per sample (int64).
_LABEL_BYTES = 8


class WorkerError(RuntimeError):
    """A worker failed: ``worker`` and ``pid`` name it; ``index`` is the dataset index it was
    on (None if it died between samples or before starting); ``traceback`` is its traceback
    text (None for a worker that was killed). The batches before the failed one came out
    intact; the loader is closed."""

    def __init__(self, message: str, *, worker: int, pid: Optional[int], index: Optional[int] = None,
                 batch: Optional[int] = None, traceback: Optional[str] = None):
        super().__init__(message)
        self.worker, self.pid, self.index, self.batch, self.traceback = worker, pid, index, batch, traceback


class WorkerTimeout(WorkerError, TimeoutError):
    """A batch was not ready within the loader's ``timeout``: ``worker``, ``pid`` and ``batch``
    name the worker that owed it (alive but slow or stuck). The loader is closed."""


def _timeout_seconds(timeout: Any) -> Optional[float]:
    """``timeout`` as seconds (None: wait for ever, as is anything longer than about 31 years,
    ``shared.LONGEST_TIMEOUT``), or a ValueError saying what to give."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise ValueError(f"timeout {timeout!r}: give a number of seconds >= 0, or None to wait for ever")
    try:
        seconds = float(timeout) + 0.0  # + 0.0: -0.0 is 0
    except OverflowError:  # an integer past float's range: for ever, or below 0
        if timeout > 0:
            return None
        seconds = -math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"timeout {timeout!r}: give a finite number of seconds >= 0, or None to wait for ever")
    return None if seconds > LONGEST_TIMEOUT else seconds


class _Layout:
    """Where a batch's samples and labels lie in its frame (one slot of a worker's ring)."""

    def __init__(self, batch_size: int, shape: Tuple[int, ...], dtype: np.dtype):
        self.batch_size, self.shape, self.dtype = batch_size, shape, dtype
        self.sample_bytes = math.prod(shape) * dtype.itemsize
        samples = batch_size * self.sample_bytes
        # The labels start on an 8-byte boundary (the frame itself starts on a page).
        self.labels_at = -(-samples // _LABEL_BYTES) * _LABEL_BYTES
        self.frame_bytes = self.labels_at + batch_size * _LABEL_BYTES

    def samples(self, frame: np.ndarray) -> np.ndarray:
        return frame[: self.batch_size * self.sample_bytes].view(self.dtype).reshape((self.batch_size,) + self.shape)

    def labels(self, frame: np.ndarray) -> np.ndarray:
        return frame[self.labels_at: self.frame_bytes].view(np.int64)


def _as_array(sample: Any) -> np.ndarray:
    """A NumPy array of the sample, without a copy: a torch tensor through ``.numpy()``."""
    if isinstance(sample, np.ndarray):
        return sample
    if type(sample).__module__.startswith("torch") and hasattr(sample, "numpy"):
        return sample.detach().numpy()  # a CUDA tensor raises here: samples are made on the host
    raise TypeError(f"__getitem__ returned a {type(sample).__name__}: return a numpy.ndarray or a CPU "
                    "torch.Tensor")


def _check_sample(item: Any, layout: _Layout, labels: bool, index: int) -> Tuple[np.ndarray, int]:
    """The sample array and label of ``item``, or an exception saying what is wrong with it."""
    label = 0
    if labels:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"dataset[{index}] returned a {type(item).__name__}: with labels=True return a "
                            "(sample, label) tuple")
        item, label = item
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
            if type(label).__module__.startswith("torch") and getattr(label, "ndim", None) == 0 \
                    and not label.is_floating_point():
                label = int(label)
            else:
                raise TypeError(f"dataset[{index}]'s label is a {type(label).__name__}: give an int")
        label = int(label)
        if not -(2**63) <= label < 2**63:
            raise ValueError(f"dataset[{index}]'s label {label} does not fit an int64")
    elif isinstance(item, tuple):
        raise TypeError(f"dataset[{index}] returned a tuple: give labels=True to take (sample, label) tuples, "
                        "or return the sample alone")
    sample = _as_array(item)
    if sample.shape != layout.shape:
        raise ValueError(f"dataset[{index}] has shape {sample.shape}: the loader was declared with "
                         f"sample_shape={layout.shape}")
    if sample.dtype != layout.dtype:
        raise TypeError(f"dataset[{index}] has dtype {sample.dtype}: the loader was declared with "
                        f"sample_dtype={layout.dtype} (convert in __getitem__; the loader does not cast)")
    return sample, label


def _host_device() -> _native.Device:
    """hetmem's CPU backend, for a worker's side of its ring: only the trainer registers the
    slots with the GPU, so a worker opens no CUDA context (none of its memory, none of its
    start-up time). ``HETMEM_BACKEND`` is set only while the device is opened."""
    before = os.environ.get("HETMEM_BACKEND")
    os.environ["HETMEM_BACKEND"] = "cpu"
    try:
        return _native.Device.open_best()
    finally:
        if before is None:
            del os.environ["HETMEM_BACKEND"]
        else:
            os.environ["HETMEM_BACKEND"] = before


# glibc's malloc tunables (malloc.h) and the values its own dynamic threshold reaches at most
# on 64-bit systems: blocks up to 32 MiB come from the heap, and up to 64 MiB of freed heap
# is kept for reuse instead of being handed back to the kernel.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES, _TRIM_THRESHOLD_BYTES = 32 << 20, 64 << 20


def _keep_freed_memory() -> None:
    """Lets a worker reuse the memory its samples were made in, sample after sample.

    A fresh (spawned) process gives every allocation above 128 KiB (a decoded image, a crop)
    its own ``mmap`` and hands it back at ``free``, so each sample's buffers are page-faulted in
    anew: 200-400 faults and a fifth to a quarter of the CPU time of the bench's JPEG sample,
    measured. A worker forked from a trainer that had imported torch inherits a raised
    threshold and pays none of that; this gives spawned workers the same (glibc only;
    elsewhere nothing). ``worker_init`` runs after it, so it may set its own."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def _worker_main(number: int, dataset: Any, layout: _Layout, labels: bool, slots: int, ring_socket: socket.socket,
                 tasks: Any, worker_init: Optional[Callable[[int], None]]) -> None:
    """A worker: builds the batches it is sent, each sample written into its ring's slot."""
    # The trainer handles Ctrl-C and closes the workers; a worker dying of it first would only
    # turn a clean stop into a WorkerError.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    index: Optional[int] = None
    batch: Optional[int] = None
    try:
        _keep_freed_memory()
        if worker_init is not None:
            worker_init(number)
        ring = SharedRing.create(ring_socket, (layout.frame_bytes,), np.uint8, slots=slots, device=_host_device())
        ring_socket.close()  # the ring keeps its own descriptor
        while True:
            try:
                task = tasks.recv()
            except EOFError:  # the trainer went: nothing to build for
                return
            if task is None:
                ring.close()
                return
            for batch, indices in task:
                slot = ring.slot()
                frame = slot.numpy()
                samples, label_row = layout.samples(frame), layout.labels(frame)
                for row, index in enumerate(indices):
                    sample, label = _check_sample(dataset[index], layout, labels, index)
                    samples[row] = sample  # the one host write of the sample
                    label_row[row] = label
                index = None
                ring.publish()
            batch = None
    except PeerGone:
        return  # the trainer closed its side: the loader was closed or dropped
    except BaseException as error:  # noqa: BLE001 - every failure is the trainer's to report
        text = traceback.format_exc()
        if len(text) > _MAX_TRACEBACK:
            text = "...\n" + text[-_MAX_TRACEBACK:]
        try:
            # A pipe send is written before it returns, so the report is there when the
            # trainer hears (through the ring) that this process went.
            tasks.send(("error", index, batch, f"{type(error).__name__}: {error}", text))
        except OSError:
            pass
        # Leave without closing the ring: the trainer hears the stream broke off (PeerGone).
        os._exit(1)


class WorkerLoader:
    """Batches of ``dataset`` built by ``workers`` processes, each sample written by its worker
    straight into registered host memory, then one copy per batch to the GPU.

    ``batch_size`` samples per batch, in the sampler's order: ``range(len(dataset))``, or a
    permutation from ``seed`` and the epoch with ``shuffle=True``; every index exactly once per
    epoch; ``drop_last=True`` leaves out a last, short batch (else it comes out shorter).
    ``prefetch`` is each worker's number of slots (batches it can have ready ahead).
    ``output``: ``"torch"`` (CUDA tensors on a GPU, CPU tensors on the CPU backend) or
    ``"numpy"`` (CPU backend only). ``context``: ``"spawn"`` (default) or ``"forkserver"``.
    ``worker_init(number)`` runs first in each worker (seed its augmentation there).
    ``timeout``: seconds a batch may take to be ready once asked for (None, or more than about
    31 years: for ever); past it
    ``WorkerTimeout`` names the worker, its pid and the batch, and the loader is closed.

    Iterating gives one epoch (the next epoch each time, or the one ``set_epoch`` chose). The
    workers stay up between epochs; ``close()`` (or the end of a ``with`` block) stops them.
    See the module's documentation for the dataset contract and the errors.

    Example::

        with WorkerLoader(dataset, 256, workers=8, sample_shape=(224, 224, 3),
                          sample_dtype=np.uint8, labels=True, shuffle=True, seed=1) as loader:
            for images, labels in loader:
                ...
    """

    def __init__(self, dataset: Any, batch_size: int, *, workers: int, sample_shape: Any, sample_dtype: Any,
                 labels: bool = False, shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 prefetch: int = 2, output: str = "torch", context: str = "spawn",
                 worker_init: Optional[Callable[[int], None]] = None, timeout: Optional[float] = None,
                 device: Optional[_native.Device] = None):
        self._workers: List[Any] = []
        self._closed = False
        self._failed: Optional[WorkerError] = None
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r}: give a whole number >= 1")
        if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or not 1 <= workers <= 256:
            raise ValueError(f"workers {workers!r}: give 1 to 256 worker processes")
        most = 64  # hetmem's shared ring holds at most 64 slots
        if not isinstance(prefetch, (int, np.integer)) or isinstance(prefetch, bool) or not 1 <= prefetch <= most:
            raise ValueError(f"prefetch {prefetch!r}: give 1 to {most} batches per worker (2 keeps a worker busy "
                             "while the GPU copies its last batch)")
        if output not in ("torch", "numpy"):
            raise ValueError(f"output {output!r}: use 'torch' (tensors) or 'numpy' (arrays, CPU backend)")
        if context not in ("spawn", "forkserver"):
            raise ValueError(f"context {context!r}: use 'spawn' or 'forkserver' (a forked child of a process "
                             "holding CUDA state or threads is not safe)")
        self.timeout = _timeout_seconds(timeout)
        length = len(dataset)
        if not isinstance(length, (int, np.integer)) or length < 0:
            raise ValueError(f"len(dataset) is {length!r}: a map-style dataset has a length >= 0")
        shape, dtype = _spec(sample_shape, sample_dtype, "sample")
        if dtype.hasobject:
            raise TypeError(f"sample_dtype {dtype}: give a plain numeric dtype")
        self._layout = _Layout(int(batch_size), shape, dtype)
        self._dataset_len = int(length)
        self.batch_size, self.workers, self.prefetch = int(batch_size), int(workers), int(prefetch)
        self.labels, self.shuffle, self.seed, self.drop_last = bool(labels), bool(shuffle), int(seed), bool(drop_last)
        self.output = output
        self.device = device if device is not None else _default_device()
        self.on_gpu = self.device.backend == "cuda"
        if self.on_gpu and output != "torch":
            raise ValueError("output='numpy' is the CPU backend's; on a GPU the loader yields CUDA tensors")
        self._torch = None
        if output == "torch":
            try:
                import torch
            except ImportError as error:
                raise ImportError("WorkerLoader(output='torch') needs PyTorch (pip install torch); without it "
                                  "use output='numpy' on the CPU backend") from error
            self._torch = torch
        self._epoch = 0
        #: The last epoch's iterator, closed when the next begins.
        self._live: Optional[Generator[Any, None, None]] = None
        self._batches_out = 0
        self._samples_out = 0
        self._trainer_bytes = 0
        self._outstanding = [0] * self.workers  # frames assigned to each ring and not yet taken
        self._start(dataset, context, worker_init)

    # -- workers ------------------------------------------------------------------------------

    def _start(self, dataset: Any, context: str, worker_init: Optional[Callable[[int], None]]) -> None:
        ctx = multiprocessing.get_context(context)
        try:
            for number in range(self.workers):
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                tasks, their_tasks = ctx.Pipe(duplex=True)
                process = ctx.Process(target=_worker_main, name=f"hetmem-worker-{number}", daemon=True,
                                      args=(number, dataset, self._layout, self.labels, self.prefetch, theirs,
                                            their_tasks, worker_init))
                process.start()
                # Only the worker keeps its ends: its death is then an end of stream here.
                theirs.close()
                their_tasks.close()
                self._workers.append(_Worker(number, process, mine, tasks))
            for worker in self._workers:
                try:
                    # The slots asked for, no more: each is registered (pinned) here.
                    worker.ring = SharedRing.connect(worker.socket, (self._layout.frame_bytes,), np.uint8,
                                                     device=self.device, max_slots=self.prefetch)
                except Exception as error:  # noqa: BLE001 - a worker that died before its ring
                    raise self._worker_failed(worker, None) from error
                finally:
                    worker.socket.close()
        except BaseException:
            self._shutdown(kill=True)
            raise

    def _worker_failed(self, worker: "_Worker", batch: Optional[int]) -> WorkerError:
        """What went wrong with ``worker``: its own report if it sent one, else how it died."""
        report = None
        try:
            if worker.tasks.poll(1.0):
                message = worker.tasks.recv()
                if message[0] == "error":
                    report = message
        except (EOFError, OSError):
            pass
        process = worker.process
        process.join(1.0)
        pid = process.pid
        if report is not None:
            _, index, failed_batch, what, text = report
            where = f"dataset index {index}" if index is not None else "starting"
            if failed_batch is not None:
                where += f" (batch {failed_batch})"
            error = WorkerError(f"worker {worker.number} (pid {pid}) failed on {where}: {what}\n"
                                f"the worker's traceback:\n{text}", worker=worker.number, pid=pid, index=index,
                                batch=failed_batch, traceback=text)
        else:
            code = process.exitcode
            if code is None:
                how = "stopped answering (its ring broke off while it is still running)"
            elif code < 0:
                try:
                    how = f"was killed by {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            else:
                how = f"exited with status {code}"
            at = f" before batch {batch} was finished" if batch is not None else " before its ring was set up"
            error = WorkerError(f"worker {worker.number} (pid {pid}) {how}{at}; the batches before it came out "
                                "intact. Make a new loader to go on", worker=worker.number, pid=pid, batch=batch)
        self._failed = error
        self._shutdown(kill=True)
        return error

    def _shutdown(self, kill: bool) -> None:
        for worker in self._workers:
            if worker.ring is not None:
                worker.ring.close()  # a worker waiting for a slot hears it and leaves
                worker.ring = None
            if not kill:
                try:
                    worker.tasks.send(None)
                except OSError:
                    pass
        for worker in self._workers:
            process = worker.process
            process.join(0.0 if kill else 5.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)
            worker.tasks.close()
            worker.socket.close()
        self._closed = True

    def close(self) -> None:
        """Stops the workers (killed if they do not stop within seconds) and frees the rings.
        Again: nothing."""
        if not self._closed:
            self._shutdown(kill=False)

    def __enter__(self) -> "WorkerLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_workers", None) and not getattr(self, "_closed", True):
            self._shutdown(kill=True)

    # -- the sampler --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self._dataset_len, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration gives (its shuffle); after it, the next one."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch {epoch!r}: give a whole number >= 0")
        self._epoch = int(epoch)

    def order(self, epoch: Optional[int] = None) -> np.ndarray:
        """The dataset indices of ``epoch`` (default: the next) in the order batches give them
        (without the indices ``drop_last`` leaves out)."""
        epoch = self._epoch if epoch is None else int(epoch)
        if self.shuffle:
            indices = np.random.default_rng([self.seed, epoch]).permutation(self._dataset_len)
        else:
            indices = np.arange(self._dataset_len)
        return indices[: len(self) * self.batch_size] if self.drop_last else indices

    # -- the trainer --------------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """Counters: ``batches`` and ``samples`` given so far, ``worker_bytes`` (host bytes the
        workers wrote: each sample once), ``trainer_host_bytes`` (host bytes the trainer copied:
        none on a GPU, each batch out of its slot on the CPU backend), ``host_bytes_per_sample``
        (both, per sample given), ``workers``, ``backend``."""
        samples = self._samples_out
        worker_bytes = samples * self._layout.sample_bytes
        return {
            "batches": self._batches_out,
            "samples": samples,
            "worker_bytes": worker_bytes,
            "trainer_host_bytes": self._trainer_bytes,
            "host_bytes_per_sample": (worker_bytes + self._trainer_bytes) / samples if samples else 0.0,
            "workers": self.workers,
            "backend": self.device.backend,
        }

    def _check_open(self) -> None:
        if self._failed is not None:
            raise WorkerError(f"the loader is closed after a worker failed ({self._failed}); make a new one",
                              worker=self._failed.worker, pid=self._failed.pid, index=self._failed.index,
                              batch=self._failed.batch, traceback=self._failed.traceback)
        if self._closed:
            raise ValueError("the loader was closed: make a new one")

    def _drain(self) -> None:
        """Takes and frees the frames of an epoch left before its end (a ``break``)."""
        for worker in self._workers:
            while self._outstanding[worker.number]:
                self._take(worker, None).release()
                self._outstanding[worker.number] -= 1

    def _take(self, worker: "_Worker", batch: Optional[int]) -> Any:
        try:
            return worker.ring.next(timeout=self.timeout)
        except (PeerGone, StopIteration) as error:
            raise self._worker_failed(worker, batch) from error
        except TimeoutError as error:
            raise self._worker_late(worker, batch) from error

    def _worker_late(self, worker: "_Worker", batch: Optional[int]) -> WorkerTimeout:
        """``worker`` did not deliver ``batch`` within the timeout: the loader is closed."""
        pid = worker.process.pid
        what = f"batch {batch}" if batch is not None else "a batch of the epoch left early"
        state = "is still running (slow or stuck)" if worker.process.is_alive() else "is no longer running"
        error = WorkerTimeout(f"worker {worker.number} (pid {pid}) did not deliver {what} within the timeout of "
                              f"{self.timeout:g} s; it {state}. The loader is closed (its workers stopped): make "
                              "a new one, or give a longer timeout", worker=worker.number, pid=pid, batch=batch)
        self._failed = error
        self._shutdown(kill=True)
        return error

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        # An earlier epoch's iterator still alive (left with a break, or kept) may hold a slot
        # its worker needs to go on: closed first, which gives the slot back.
        live, self._live = self._live, None
        if live is not None:
            try:
                live.close()
            except ValueError as error:  # running on another thread
                raise WorkerError("a new epoch began while the last one's iterator is being advanced on another "
                                  "thread; iterate the loader from one thread at a time") from error
        self._drain()
        epoch = self._epoch
        self._epoch = epoch + 1
        indices = self.order(epoch)
        batches = [indices[start: start + self.batch_size] for start in range(0, len(self) * self.batch_size,
                                                                               self.batch_size)]
        for worker in self._workers:
            mine = [(number, [int(i) for i in batches[number]])
                    for number in range(worker.number, len(batches), self.workers)]
            self._outstanding[worker.number] += len(mine)
            try:
                worker.tasks.send(mine)
            except OSError as error:
                raise self._worker_failed(worker, mine[0][0] if mine else None) from error
        self._live = self._gpu_epoch(batches) if self.on_gpu else self._cpu_epoch(batches)
        return self._live

    def _cpu_epoch(self, batches: List[List[int]]) -> Iterator[Any]:
        layout = self._layout
        for number, chosen in enumerate(batches):
            worker = self._workers[number % self.workers]
            frame = self._take(worker, number)
            self._outstanding[worker.number] -= 1
            try:
                count = len(chosen)
                raw = frame.numpy()
                samples = np.array(layout.samples(raw)[:count])
                labels = np.array(layout.labels(raw)[:count]) if self.labels else None
            finally:
                frame.release()
            self._trainer_bytes += samples.nbytes
            self._batches_out += 1
            self._samples_out += count
            if self.output == "torch":
                torch = self._torch
                samples = torch.from_numpy(samples)
                labels = torch.from_numpy(labels) if labels is not None else None
            yield (samples, labels) if self.labels else samples

    def _gpu_epoch(self, batches: List[List[int]]) -> Iterator[Any]:
        torch, layout = self._torch, self._layout
        target = torch.device("cuda", self.device.ordinal or 0)
        copies = torch.cuda.Stream(device=target)
        # (frame, its copy's event, or the copy stream before that): the slot the GPU may read.
        pending: List[Tuple[Any, Any]] = []
        try:
            for number, chosen in enumerate(batches):
                worker = self._workers[number % self.workers]
                # The last batch's slot goes back before this one is waited for: its worker
                # (this one too, with one worker or prefetch=1) may need it to go on. Its copy
                # completed long since as a rule (the event only makes sure).
                pending = self._give_back(pending)
                frame = self._take(worker, number)
                self._outstanding[worker.number] -= 1
                # Held from here on: should anything below fail (a CUDA allocation, Ctrl-C)
                # after the copy was queued but before its event, the slot still goes back
                # only once the copy stream is idle, never under the copy reading it.
                pending = [(frame, copies)]
                count = len(chosen)
                raw = frame.numpy()
                with warnings.catch_warnings():
                    # The slot is read-only to the trainer; the tensor is only ever read (copied from).
                    warnings.simplefilter("ignore", UserWarning)
                    host_samples = torch.from_numpy(layout.samples(raw)[:count])
                    host_labels = torch.from_numpy(layout.labels(raw)[:count]) if self.labels else None
                consumer = torch.cuda.current_stream(target)
                with torch.cuda.stream(copies):
                    samples = torch.empty(host_samples.shape, dtype=host_samples.dtype, device=target)
                    samples.copy_(host_samples, non_blocking=True)  # registered memory: a DMA, no staging
                    labels = None
                    if host_labels is not None:
                        labels = torch.empty(count, dtype=torch.int64, device=target)
                        labels.copy_(host_labels, non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(copies)
                consumer.wait_event(copied)
                samples.record_stream(consumer)
                if labels is not None:
                    labels.record_stream(consumer)
                # This batch's slot stays the GPU's until the next batch is asked for.
                pending = [(frame, copied)]
                self._batches_out += 1
                self._samples_out += count
                yield (samples, labels) if self.labels else samples
        finally:
            self._give_back(pending)

    @staticmethod
    def _give_back(pending: List[Tuple[Any, Any]]) -> List[Tuple[Any, Any]]:
        """Gives back the slots in ``pending`` once their copies completed (each waited for by
        its event, or by the copy stream itself); returns none left."""
        for frame, copied in pending:
            copied.synchronize()
            frame.release()
        return []

    def __repr__(self) -> str:
        return (f"hetmem.loader.WorkerLoader(batch_size={self.batch_size}, workers={self.workers}, "
                f"sample_shape={self._layout.shape}, sample_dtype={self._layout.dtype}, labels={self.labels}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, backend={self.device.backend!r})")


class _Worker:
    """The trainer's handles on one worker: its process, its ring, its task pipe."""

    def __init__(self, number: int, process: Any, ring_socket: socket.socket, tasks: Any):
        self.number, self.process, self.socket, self.tasks = number, process, ring_socket, tasks
        self.ring: Any = None
