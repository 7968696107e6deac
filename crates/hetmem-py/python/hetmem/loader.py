"""A data loader for fixed-size uint8 image records (N x H x W x C, plus int64 labels) read
through hetmem: batches go to GPU tensors without a worker pool.

Two paths, both with one CPU thread:

- ``"mapped"``: the records file is one registered window; the GPU gathers each batch's
  records straight from the page cache (an index_select over the mapped memory), so the CPU
  copies nothing.
- ``"staged"``: one background thread gathers each batch's records into one of two pinned,
  mapped staging buffers while the GPU reads the other in place.

On the GPU, on the loader's own stream (overlapped with training on the current stream): a
random horizontal flip per image, the conversion to ``dtype`` (bf16 by default), the
normalisation ``(x / 255 - mean) / std``, in channels-last memory (logical NCHW). Shuffling
and flips follow ``seed`` and the epoch: two loaders with the same seed give the same batches.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from . import _KDL_CUDA, Buffer, MappedFile, _contiguous_strides, _native, pinned

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - the message is the point
        raise ImportError("hetmem.loader needs PyTorch (pip install torch)") from error
    return torch


class RecordLoader:
    """Batches ``(images, labels)`` from ``images_path`` (raw uint8 records of
    ``record_shape``, H x W x C, back to back) and ``labels_path`` (raw int64, one per record),
    as CUDA tensors: images ``batch x C x H x W`` in channels-last memory, normalised, of
    ``dtype``; labels int64. Iterable (one epoch per ``iter``); ``len`` is the batch count.

    The files must not be changed while the loader lives."""

    def __init__(self, images_path: Union[str, "os.PathLike[str]"], labels_path: Union[str, "os.PathLike[str]"],
                 batch_size: int, record_shape: Sequence[int] = (224, 224, 3), *, seed: int = 0,
                 mode: str = "mapped", dtype: Any = None, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD, flip: bool = True, shuffle: bool = True,
                 drop_last: bool = True):
        torch = _torch()
        if mode not in ("mapped", "staged"):
            raise ValueError(f"mode {mode!r}: use 'mapped' (the GPU gathers from the file) or 'staged'")
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: at least 1")
        self.record_shape = tuple(int(extent) for extent in record_shape)
        record_bytes = int(np.prod(self.record_shape))
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
        self.epoch = 0
        self.dtype = torch.bfloat16 if dtype is None else dtype
        self._device = torch.device("cuda", torch.cuda.current_device())
        channels = self.record_shape[-1]
        self._scale = (1.0 / (255.0 * torch.tensor(std, dtype=torch.float32))).view(1, channels, 1, 1).to(self._device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / torch.tensor(std, dtype=torch.float32)).view(
            1, channels, 1, 1).to(self._device)
        self._stream = torch.cuda.Stream()
        self._window: Buffer = self._file.window(0, (self.records,) + self.record_shape)
        if mode == "mapped":
            # The loader only reads: a read-only window's device view, taken through the
            # private export (public DLPack refuses read-only memory).
            self._records_gpu = torch.from_dlpack(_ReadOnlyView(self._window))
        else:
            self._staging = [pinned((batch_size,) + self.record_shape, np.uint8) for _ in range(2)]
            self._staging_gpu = [torch.from_dlpack(slot.cuda()) for slot in self._staging]
            self._staging_free = [None, None]  # the event after which the GPU is done reading a slot
            self._pending: Optional[concurrent.futures.Future] = None  # the gather in flight
            self._gatherer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetmem-loader")

    def __len__(self) -> int:
        full, rest = divmod(self.records, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order and flips the next ``iter`` gives."""
        self.epoch = epoch

    def order(self, epoch: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The record indices and flip choices of an epoch (deterministic: seed and epoch)."""
        rng = np.random.default_rng([self.seed, self.epoch if epoch is None else epoch])
        indices = rng.permutation(self.records) if self.shuffle else np.arange(self.records)
        flips = rng.random(self.records) < 0.5 if self.flip else np.zeros(self.records, bool)
        return indices, flips

    def _batches(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        indices, flips = self.order()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            chosen = indices[start:start + self.batch_size]
            yield chosen, flips[start:start + self.batch_size]

    def _prepare(self, raw: Any, chosen: np.ndarray, flips: np.ndarray) -> Tuple[Any, Any]:
        """On the loader's stream: flip, convert, normalise; channels-last NCHW."""
        torch = _torch()
        flip_mask = torch.from_numpy(flips).to(self._device, non_blocking=True).view(-1, 1, 1, 1)
        images = raw.permute(0, 3, 1, 2)  # NHWC memory, NCHW view: channels-last
        images = torch.where(flip_mask, images.flip(3), images)
        images = images.to(self.dtype, memory_format=torch.channels_last)
        images = images.mul_(self._scale.to(self.dtype)).add_(self._shift.to(self.dtype))
        labels = torch.from_numpy(self.labels[chosen]).to(self._device, non_blocking=True)
        return images, labels

    def _gather(self, slot: int, chosen: np.ndarray) -> None:
        done = self._staging_free[slot]
        if done is not None:
            done.synchronize()  # the GPU has read this slot's last batch
        host = self._staging[slot].numpy()
        np.take(self._window.numpy(), chosen, axis=0, out=host[:len(chosen)])

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        torch = _torch()
        consumer = torch.cuda.current_stream()
        batches = list(self._batches())
        if self.mode == "staged" and batches:
            self._pending = self._gatherer.submit(self._gather, 0, batches[0][0])
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
        self.epoch += 1

    def _launch(self, number: int, batches: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[Any, Any, Any]:
        """Queues batch ``number``'s gather and preparation on the loader's stream; returns
        its images, labels and the event that marks them ready."""
        torch = _torch()
        chosen, flips = batches[number]
        with torch.cuda.stream(self._stream):
            if self.mode == "mapped":
                index = torch.from_numpy(chosen).to(self._device, non_blocking=True)
                raw = self._records_gpu.index_select(0, index)
            else:
                slot = number % 2
                self._pending.result()  # the thread has gathered this batch into the slot
                if number + 1 < len(batches):
                    self._pending = self._gatherer.submit(self._gather, 1 - slot, batches[number + 1][0])
                # One read of the staged batch over the link, into device memory; the flip
                # and the conversion then read it there.
                raw = self._staging_gpu[slot][:len(chosen)].clone()
            images, labels = self._prepare(raw, chosen, flips)
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
    """A read-only window's device view for the loader's own reads (DLPack 0.x has no
    read-only flag, so the public ``cuda()`` refuses it)."""

    def __init__(self, buffer: Buffer):
        buffer.cuda()  # raises where the window is not mapped for a GPU
        self._buffer = buffer

    def __dlpack__(self, **_: Any) -> Any:
        buffer = self._buffer
        return _native.capsule(buffer, buffer.device_ptr, _KDL_CUDA, buffer._memory.device_ordinal,
                               list(buffer.shape), list(_contiguous_strides(buffer.shape)), 1, 8)

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
