"""A data loader for fixed-size uint8 image records (N x H x W x C, plus int64 labels) read
through hetmem: batches go to GPU tensors without a worker pool.

Three paths on a GPU, each with one CPU thread:

- ``"mapped"``: the records file is one registered window; the GPU gathers each batch's
  crops straight from the page cache (one indexing kernel over the mapped memory), so the
  CPU copies nothing.
- ``"staged"``: one background thread gathers each batch's records into one of two pinned,
  mapped staging buffers while the GPU reads the other in place.
- ``"copied"`` (the default): the records file is one registered window, as for
  ``"mapped"``, but a copy engine brings each chosen record whole into device memory (one
  asynchronous copy per record, on the loader's stream) and the crop reads device memory. The
  SMs then spend nothing on the link: on the H200 machine the mapped gather, one byte per
  thread over the link, took 2-3 ms of GPU time per batch of 64 from the training running
  beside it, and ResNet-18 ran 10.0 ms per iteration copied against 12.7 mapped.

On the GPU, on the loader's own stream (overlapped with training on the current stream): a
random crop of ``crop`` (height, width) and a random horizontal flip per image, read in the
same gather; the normalisation ``x * scale + shift`` in float32 (``scale = 1 / (255 std)``,
``shift = -mean / std``, see ``normalisation``), rounded once to ``dtype`` (bf16 by default,
or fp16, fp32), in channels-last memory (logical NCHW). Shuffling, crops and flips follow
``seed`` and the epoch: two loaders with the same seed give the same batches.

Without a GPU (hetmem's CPU backend) the loader does the same on the CPU, in hetmem's native
code, one batch at a time; it yields PyTorch CPU tensors, or, with ``output="buffer"`` (no
PyTorch needed), ``hetmem.Buffer`` batches of batch x H x W x C (channels last; bf16 as
``hetmem.bfloat16``) and NumPy labels.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _KDL_CUDA, Buffer, MappedFile, _native, bfloat16, device, pinned

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The output element types, by name: their NumPy dtypes for hetmem buffers.
_ELEMENTS = {"bfloat16": bfloat16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}


def _torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - the message is the point
        raise ImportError("hetmem.loader needs PyTorch (pip install torch) for tensors; without it use "
                          "output=\"buffer\" on the CPU backend") from error
    return torch


def normalisation(mean: Sequence[float], std: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """The per-channel ``scale`` and ``shift`` (float32) of ``(x / 255 - mean) / std`` as the
    loader computes it, ``x * scale + shift``: worked out in float64, rounded once to float32."""
    mean64, std64 = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    if mean64.shape != std64.shape or mean64.ndim != 1 or not np.all(std64 > 0):
        raise ValueError(f"mean {tuple(mean)} and std {tuple(std)}: one of each per channel, std > 0")
    return (1.0 / (255.0 * std64)).astype(np.float32), (-mean64 / std64).astype(np.float32)


class EpochPlan(NamedTuple):
    """An epoch's random choices, all from the seed and the epoch number: the record order,
    each position's horizontal flip, and each position's crop origin (top, left)."""

    indices: np.ndarray
    flips: np.ndarray
    tops: np.ndarray
    lefts: np.ndarray


class RecordLoader:
    """Batches ``(images, labels)`` from ``images_path`` (raw uint8 records of
    ``record_shape``, H x W x C, back to back) and ``labels_path`` (raw int64, one per record):
    images ``batch x C x crop_h x crop_w`` in channels-last memory, normalised, of ``dtype``
    (``"bfloat16"``, ``"float16"``, ``"float32"``, or the torch dtypes); labels int64. CUDA
    tensors on a GPU; see the module's documentation for the CPU backend. Iterable (one epoch
    per ``iter``); ``len`` is the batch count. ``crop`` defaults to the whole record.

    The files must not be changed while the loader lives."""

    def __init__(self, images_path: Union[str, "os.PathLike[str]"], labels_path: Union[str, "os.PathLike[str]"],
                 batch_size: int, record_shape: Sequence[int] = (224, 224, 3), *, seed: int = 0,
                 mode: str = "copied", dtype: Any = "bfloat16", crop: Optional[Sequence[int]] = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, flip: bool = True,
                 shuffle: bool = True, drop_last: bool = True, output: str = "torch"):
        if mode not in ("mapped", "staged", "copied"):
            raise ValueError(f"mode {mode!r}: use 'mapped' (the GPU gathers from the file), 'copied' (copy "
                             "engines bring the records into device memory) or 'staged'")
        if output not in ("torch", "buffer"):
            raise ValueError(f"output {output!r}: use 'torch' (tensors) or 'buffer' (hetmem buffers, CPU backend)")
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: at least 1")
        self.record_shape = tuple(int(extent) for extent in record_shape)
        if len(self.record_shape) != 3:
            raise ValueError(f"record_shape {self.record_shape}: height, width, channels")
        height, width, channels = self.record_shape
        self.crop = (height, width) if crop is None else tuple(int(extent) for extent in crop)
        if len(self.crop) != 2 or not (0 < self.crop[0] <= height and 0 < self.crop[1] <= width):
            raise ValueError(f"crop {self.crop}: (height, width), at least 1 x 1 and at most the record's "
                             f"{height} x {width}")
        self.element = str(dtype).replace("torch.", "")
        if self.element not in _ELEMENTS:
            raise ValueError(f"dtype {dtype}: use bfloat16, float16 or float32")
        self.scale, self.shift = normalisation(mean, std)
        if self.scale.size != channels:
            raise ValueError(f"{self.scale.size} means and stds for {channels} channels")
        record_bytes = height * width * channels
        self._file = MappedFile(images_path)
        if self._file.nbytes % record_bytes:
            raise ValueError(f"{images_path}: {self._file.nbytes} bytes are not whole records of "
                             f"{self.record_shape} uint8 ({record_bytes} bytes)")
        self.records = self._file.nbytes // record_bytes
        self.labels = np.fromfile(labels_path, dtype=np.int64)
        if self.labels.size != self.records:
            raise ValueError(f"{labels_path}: {self.labels.size} labels for {self.records} records")
        self.batch_size = batch_size
        self.seed = seed
        self.mode = mode
        self.flip = flip
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.output = output
        self.epoch = 0
        self.on_gpu = device().backend == "cuda"
        if self.on_gpu and output != "torch":
            raise ValueError("output='buffer' is the CPU backend's; on a GPU the loader yields CUDA tensors")
        # Opened for the unflagged device view _ReadOnlyView exports (PyTorch takes no other kind).
        self._window: Buffer = self._file._window(0, (self.records,) + self.record_shape, np.uint8, False, True)
        if self.on_gpu:
            self._setup_gpu()

    def _setup_gpu(self) -> None:
        torch = _torch()
        self._device = torch.device("cuda", torch.cuda.current_device())
        self._torch_dtype = getattr(torch, self.element)
        self._scale_gpu = torch.from_numpy(self.scale).to(self._device)
        self._shift_gpu = torch.from_numpy(self.shift).to(self._device)
        self._stream = torch.cuda.Stream()
        self._crop_rows = torch.arange(self.crop[0], device=self._device)
        self._crop_columns = torch.arange(self.crop[1], device=self._device)
        if self.mode in ("mapped", "copied"):
            # The loader only reads: a read-only window's device view, taken through the
            # private export (an unversioned capsule, which PyTorch reads, cannot say read-only).
            self._records_gpu = torch.from_dlpack(_ReadOnlyView(self._window))
        if self.mode == "copied":
            # One batch of whole records in device memory, reused batch after batch: its copies
            # and the crop that reads it are all on the loader's stream, in order. The views are
            # made once: a copy per record is then one call.
            self._records_each = self._records_gpu.unbind(0)
            self._batch_gpu = torch.empty((self.batch_size,) + self.record_shape, dtype=torch.uint8,
                                          device=self._device)
            self._batch_each = self._batch_gpu.unbind(0)
        elif self.mode == "staged":
            self._staging = [pinned((self.batch_size,) + self.record_shape, np.uint8) for _ in range(2)]
            self._staging_gpu = [torch.from_dlpack(slot.cuda()) for slot in self._staging]
            self._staging_free = [None, None]  # the event after which the GPU is done reading a slot
            self._pending: Optional[concurrent.futures.Future] = None  # the gather in flight
            self._gatherer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetmem-loader")

    def __len__(self) -> int:
        full, rest = divmod(self.records, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order, crops and flips the next ``iter`` gives."""
        self.epoch = epoch

    def order(self, epoch: Optional[int] = None) -> EpochPlan:
        """An epoch's record order, flips and crop origins (deterministic: seed and epoch)."""
        rng = np.random.default_rng([self.seed, self.epoch if epoch is None else epoch])
        indices = rng.permutation(self.records) if self.shuffle else np.arange(self.records)
        flips = rng.random(self.records) < 0.5 if self.flip else np.zeros(self.records, bool)
        height, width, _ = self.record_shape
        tops = rng.integers(0, height - self.crop[0] + 1, size=self.records)
        lefts = rng.integers(0, width - self.crop[1] + 1, size=self.records)
        return EpochPlan(indices, flips, tops, lefts)

    def _batches(self) -> Iterator[EpochPlan]:
        plan = self.order()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield EpochPlan(*(part[start:start + self.batch_size] for part in plan))

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        # Each epoch starts with the file checked: one truncated since the last is reported
        # here, before GPU work reads the window (which no SIGBUS handler guards).
        _native.check_file(self._window._memory)
        batches = list(self._batches())
        self.epoch += 1
        return self._gpu_epoch(batches) if self.on_gpu else self._cpu_epoch(batches)

    # -- the CPU backend ---------------------------------------------------------------------
    def _cpu_epoch(self, batches: Sequence[EpochPlan]) -> Iterator[Tuple[Any, Any]]:
        for batch in batches:
            count = len(batch.indices)
            out = pinned((count,) + self.crop + (self.record_shape[2],), _ELEMENTS[self.element])
            _native.prepare_batch(self._window._memory, self.record_shape, batch.indices.tolist(),
                                  list(zip(batch.tops.tolist(), batch.lefts.tolist())), batch.flips.tolist(),
                                  self.crop, self.scale.tolist(), self.shift.tolist(), out._memory, self.element)
            labels = self.labels[batch.indices]
            if self.output == "buffer":
                yield out, labels
            else:
                torch = _torch()
                # NHWC memory seen as NCHW: channels-last, as on the GPU.
                yield torch.from_dlpack(out).permute(0, 3, 1, 2), torch.from_numpy(labels)

    # -- the GPU -----------------------------------------------------------------------------
    def _gpu_epoch(self, batches: Sequence[EpochPlan]) -> Iterator[Tuple[Any, Any]]:
        torch = _torch()
        consumer = torch.cuda.current_stream()
        if self.mode == "staged" and batches:
            self._pending = self._gatherer.submit(self._gather, 0, batches[0].indices)
        # One batch ahead: batch k + 1 is prepared on the loader's stream while the consumer's
        # stream trains on batch k.
        ahead = None
        for number in range(len(batches)):
            launched = self._launch(number, batches)
            if ahead is not None:
                yield self._hand_over(ahead, consumer)
            ahead = launched
        if ahead is not None:
            yield self._hand_over(ahead, consumer)

    def _gather(self, slot: int, chosen: np.ndarray) -> None:
        done = self._staging_free[slot]
        if done is not None:
            done.synchronize()  # the GPU has read this slot's last batch
        # Natively, with a truncation of the file while it copies raised as HetmemError (NumPy's
        # take over the window's view would read the mapping unguarded: SIGBUS).
        _native.gather_records(self._window._memory, self._window.nbytes // self.records, chosen.tolist(),
                               self._staging[slot]._memory)

    def _prepare(self, source: Any, rows: np.ndarray, batch: EpochPlan) -> Tuple[Any, Any]:
        """On the loader's stream: crop and flip (one gather from ``source``'s records
        ``rows``), normalise in float32, round to the dtype; channels-last NCHW."""
        torch = _torch()
        # One host-to-device copy of the batch's choices: rows, tops, lefts, flips.
        choices = np.stack([rows, batch.tops, batch.lefts, batch.flips]).astype(np.int64)
        choices = torch.from_numpy(choices).to(self._device, non_blocking=True)
        records, tops, lefts, flips = choices
        y = (tops[:, None] + self._crop_rows)[:, :, None]
        forward = lefts[:, None] + self._crop_columns
        backward = lefts[:, None] + (self.crop[1] - 1 - self._crop_columns)
        x = torch.where(flips[:, None].bool(), backward, forward)[:, None, :]
        crops = source[records[:, None, None], y, x]  # batch x crop_h x crop_w x C, uint8
        images = torch.addcmul(self._shift_gpu, crops.float(), self._scale_gpu).to(self._torch_dtype)
        labels = torch.from_numpy(self.labels[batch.indices]).to(self._device, non_blocking=True)
        return images.permute(0, 3, 1, 2), labels  # NHWC memory, NCHW view: channels-last

    def _launch(self, number: int, batches: Sequence[EpochPlan]) -> Tuple[Any, Any, Any]:
        """Queues batch ``number``'s gather and preparation on the loader's stream; returns
        its images, labels and the event that marks them ready."""
        torch = _torch()
        batch = batches[number]
        with torch.cuda.stream(self._stream):
            if self.mode == "mapped":
                images, labels = self._prepare(self._records_gpu, batch.indices, batch)
            elif self.mode == "copied":
                # Device-to-device copies by torch; the source is host memory, so a copy engine
                # moves each record across the link at its full rate.
                for slot, record in enumerate(batch.indices.tolist()):
                    self._batch_each[slot].copy_(self._records_each[record], non_blocking=True)
                images, labels = self._prepare(self._batch_gpu, np.arange(len(batch.indices)), batch)
            else:
                slot = number % 2
                self._pending.result()  # the thread has gathered this batch into the slot
                if number + 1 < len(batches):
                    self._pending = self._gatherer.submit(self._gather, 1 - slot, batches[number + 1].indices)
                rows = np.arange(len(batch.indices))
                images, labels = self._prepare(self._staging_gpu[slot], rows, batch)
            ready = torch.cuda.Event()
            ready.record(self._stream)
            if self.mode == "staged":
                self._staging_free[slot] = ready
        return images, labels, ready

    @staticmethod
    def _hand_over(launched: Tuple[Any, Any, Any], consumer: Any) -> Tuple[Any, Any]:
        images, labels, ready = launched
        consumer.wait_event(ready)
        # Made on the loader's stream, used on the consumer's: the allocator must not reuse
        # them before the consumer's work is done.
        images.record_stream(consumer)
        labels.record_stream(consumer)
        return images, labels


class _ReadOnlyView:
    """A read-only window's device view for the loader's own reads, as an unversioned
    capsule (which cannot say read-only, so the public ``cuda()`` exports it only to DLPack
    1.x consumers). Only the device view may be exported so: a GPU write to the read-only
    mapping faults the kernel instead of reaching the file."""

    def __init__(self, buffer: Buffer):
        buffer.cuda()  # raises where the window is not mapped for a GPU
        self._buffer = buffer

    def __dlpack__(self, *, stream: Any = None, **_: Any) -> Any:
        buffer = self._buffer
        # Not the consumer's `stream` (PyTorch passes 1, its default stream): every read of the
        # loader's runs on its own stream, which the release would not wait for. None makes the
        # window's release, at the loader's teardown only, wait for the whole device.
        return _native.capsule(buffer._memory, buffer._offset, list(buffer.shape), 1, 8, cuda=True, stream=None,
                               unflagged_readonly=True)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_KDL_CUDA, self._buffer._memory.device_ordinal)


def write_records(images_path: Union[str, "os.PathLike[str]"], labels_path: Union[str, "os.PathLike[str]"],
                  count: int, record_shape: Sequence[int] = (224, 224, 3), classes: int = 1000,
                  seed: int = 0) -> None:
    """Writes a data set of ``count`` random uint8 records and labels (for benchmarks and tests)."""
    rng = np.random.default_rng(seed)
    record_shape = tuple(record_shape)
    with open(images_path, "wb") as out:
        for start in range(0, count, 256):
            n = min(256, count - start)
            rng.integers(0, 256, size=(n,) + record_shape, dtype=np.uint8).tofile(out)
    rng.integers(0, classes, size=count, dtype=np.int64).tofile(labels_path)


# The multi-process loader for map-style datasets lives in its own module; it is part of this one.
from .worker_loader import WorkerError, WorkerLoader, WorkerTimeout  # noqa: E402 - after the records loader it sits beside
