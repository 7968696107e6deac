"""Training input bench: torch DataLoader against hetmem's WorkerLoader, both running the same
map-style dataset in N worker processes, feeding ResNet-50 (bf16, channels-last) and ResNet-18
training steps at batch 256, or (``--loader-only``) no model at all.

Two datasets (``--dataset``):

- ``jpeg``: decode-bound. 500x375 RGB JPEGs of about 110 KB (ImageNet-like), PIL decode,
  random resized crop to 224x224, random flip: milliseconds of CPU a sample, so the host
  copies a loader saves are a few per cent of the work.
- ``arrays``: copy-bound. 375x500 uint8 images preloaded in one ``.npy`` (memory-mapped), a
  random 224x224 crop and flip by NumPy slicing, made into a fresh array with one strided copy:
  tens of microseconds a sample, so the loader's own machinery (DataLoader: collate into shared
  memory, unpickling, the pin-memory copy; WorkerLoader: the slot write, the ring) is the
  limit. This is the input-bound case where WorkerLoader's saved copies should show.

Make the data once::

    python bench/worker_loader.py --make /tmp/jpegs --dataset jpeg --count 1500
    python bench/worker_loader.py --make /tmp/arrays --dataset arrays --count 500

then run (torch, and torchvision for the models; a GPU, or ``--loader-only`` on the CPU
backend)::

    python bench/worker_loader.py --dataset jpeg --data /tmp/jpegs --workers 4,8,12 --json jpeg.json
    python bench/worker_loader.py --dataset arrays --data /tmp/arrays --workers 4,8,12 --loader-only

Every row is one fresh loader running one epoch of exactly ``warm-up + iters`` batches for one
model: nothing is shared between rows but the files (warm in the page cache). The warm-up is
``max(--warmup, 2 N)`` batches, so every worker has delivered at least two batches before the
clock starts (spawned workers start later and more staggered than DataLoader's forked ones).
Each row gives ms per iteration over the timed window (the mean: wall time / iters), the
median of the per-iteration times (on a GPU from CUDA events recorded after each step, the
GPU's clock, which a host running ahead of the GPU does not blur; on the CPU the host clock),
samples/s (from the mean), the CPU cores used over the window (this process's and its
children's user + system time from /proc and getrusage, over the wall time) and the CPU time
per sample that makes (the figure to compare where other work shares the cores), the minor
page faults per sample (all those processes: fresh memory for each batch or sample shows
here), the host
bytes copied per sample after ``__getitem__`` returned it (WorkerLoader: its own counter, the
worker's one write into the slot, plus the trainer's copy out of it on the CPU backend;
DataLoader: collate into the batch's shared memory, plus the pin-memory thread's copy on a GPU,
worked out rather than measured; DALI: not counted). ``vs_torch`` on a hetmem or dali row is
DataLoader's ms/iter over that loader's at the same N, model and dataset (above 1: faster). A
``synthetic`` row (a batch already on the GPU, no loader) gives the compute bound.
DataLoader runs as users run it: pin_memory on a GPU, its default (fork) start,
prefetch_factor 2; WorkerLoader with its defaults (spawn, prefetch 2). ``--loaders ...,dali``
adds NVIDIA DALI (jpeg only, on a GPU) with its CPU decoder, N threads in the trainer's process,
as its ImageNet examples build the pipeline (a fused decode and random crop: see
``_dali_batches``).

``--loader-only``: each batch is moved to the GPU (DataLoader: ``.cuda(non_blocking=True)``
from its pinned batch; WorkerLoader: its own copy) and nothing else, or on the CPU backend one
byte of each page is read: the loader's own ceiling in samples/s.
"""

from __future__ import annotations

import argparse
import io
import gc
import json
import math
import os
import random
import resource
import statistics
import sys
import time

import numpy as np

CROP = 224
SOURCE_SIZE = (500, 375)  # width, height, as PIL gives it
TARGET_BYTES = 110_000
MEAN = np.array([0.485, 0.456, 0.406]) * 255
STD = np.array([0.229, 0.224, 0.225]) * 255


# -- the images ------------------------------------------------------------------------------


def _picture(rng: np.random.Generator) -> np.ndarray:
    """A photo-like picture: smooth colour fields plus fine texture (so JPEG sizes look real)."""
    from PIL import Image

    width, height = SOURCE_SIZE
    coarse = rng.integers(0, 256, (height // 25, width // 25, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
    texture = rng.normal(0, 28, (height, width, 3))
    return np.clip(smooth + texture, 0, 255).astype(np.uint8)


def _jpeg(picture: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(picture).save(out, "JPEG", quality=quality)
    return out.getvalue()


def make_jpegs(directory: str, count: int, seed: int = 0) -> None:
    """``count`` JPEGs of about TARGET_BYTES in ``directory`` (the quality found on the first)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    first = _picture(rng)
    low, high = 5, 98
    while low < high:  # the lowest quality whose file reaches the target size
        middle = (low + high) // 2
        if len(_jpeg(first, middle)) < TARGET_BYTES:
            low = middle + 1
        else:
            high = middle
    sizes = []
    for number in range(count):
        data = _jpeg(first if number == 0 else _picture(rng), low)
        with open(os.path.join(directory, f"{number:07d}.jpg"), "wb") as file:
            file.write(data)
        sizes.append(len(data))
    print(f"{count} JPEGs in {directory}: quality {low}, {np.mean(sizes) / 1e3:.0f} KB each on average")


class JpegCrops:
    """A map-style dataset: file ``i % count``, decoded, a random resized crop to 224x224 (scale
    0.08-1, ratio 3/4-4/3, as torchvision's RandomResizedCrop) and a random horizontal flip;
    uint8 HWC, label ``i % 1000``. ``length`` may exceed the files (they are cycled), so one
    epoch spans the whole run."""

    def __init__(self, directory: str, length: int):
        self.files = sorted(os.path.join(directory, name) for name in os.listdir(directory)
                            if name.endswith(".jpg"))
        if not self.files:
            raise SystemExit(f"no .jpg files in {directory}: make them with --make {directory} --dataset jpeg")
        self.length = length
        self.random, self.pid = random.Random(), None

    def __len__(self) -> int:
        return self.length

    def _box(self, width: int, height: int):
        area = width * height
        for _ in range(10):
            target = area * self.random.uniform(0.08, 1.0)
            ratio = math.exp(self.random.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                left, top = self.random.randint(0, width - w), self.random.randint(0, height - h)
                return left, top, left + w, top + h
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return left, top, left + side, top + side

    def __getitem__(self, index: int):
        from PIL import Image

        if self.pid != os.getpid():  # a new worker: its own crops, not a copy of another's stream
            self.random.seed(int.from_bytes(os.urandom(8), "little"))
            self.pid = os.getpid()
        with Image.open(self.files[index % len(self.files)]) as image:
            image = image.convert("RGB")
            crop = image.resize((CROP, CROP), Image.BILINEAR, box=self._box(*image.size))
        if self.random.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(crop, dtype=np.uint8), index % 1000


ARRAYS_FILE = "images.npy"


def make_arrays(directory: str, count: int, seed: int = 0) -> None:
    """``count`` photo-like 375x500 RGB uint8 images in ``directory/images.npy``."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    width, height = SOURCE_SIZE
    path = os.path.join(directory, ARRAYS_FILE)
    images = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(count, height, width, 3))
    for number in range(count):
        images[number] = _picture(rng)
    images.flush()
    del images
    print(f"{count} images of {height}x{width}x3 uint8 in {path} ({count * height * width * 3 / 1e6:.0f} MB)")


class ArrayCrops:
    """A map-style dataset, copy-bound: image ``i % count`` of a memory-mapped ``.npy`` of
    375x500x3 uint8 images, a random 224x224 crop and a random horizontal flip by slicing, made
    into a fresh array with one strided copy (DataLoader's collate needs positive strides);
    label ``i % 1000``. Only the path is pickled: each process maps the file itself."""

    def __init__(self, directory: str, length: int):
        self.path = os.path.join(directory, ARRAYS_FILE)
        if not os.path.exists(self.path):
            raise SystemExit(f"no {self.path}: make it with --make {directory} --dataset arrays")
        self.length = length
        self.images, self.random, self.pid = None, random.Random(), None

    def __getstate__(self):
        return {"path": self.path, "length": self.length}

    def __setstate__(self, state):
        self.path, self.length = state["path"], state["length"]
        self.images, self.random, self.pid = None, random.Random(), None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.pid != os.getpid():  # a new worker (forked or spawned): its own crops and mapping
            self.random.seed(int.from_bytes(os.urandom(8), "little"))
            self.images = np.load(self.path, mmap_mode="r")
            self.pid = os.getpid()
        image = self.images[index % len(self.images)]
        top = self.random.randint(0, image.shape[0] - CROP)
        left = self.random.randint(0, image.shape[1] - CROP)
        crop = image[top: top + CROP, left: left + CROP]
        if self.random.random() < 0.5:
            crop = crop[:, ::-1]
        return np.ascontiguousarray(crop), index % 1000


DATASETS = {"jpeg": (JpegCrops, make_jpegs), "arrays": (ArrayCrops, make_arrays)}


# -- CPU time --------------------------------------------------------------------------------


def _descendants(pid: int):
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as file:
                    children = [int(child) for child in file.read().split()]
                found.extend(children)
                stack.extend(children)
        except OSError:
            continue
    return found


def _ticks_faults(pid):
    """A process's CPU ticks (user + system) and minor page faults."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), int(fields[7])  # utime + stime, minflt
    except (OSError, IndexError, ValueError):
        return 0, 0


def cpu_seconds_faults():
    """This process's, its live descendants' and its reaped children's CPU time and minor page
    faults (a sample's buffers mapped anew each time show here)."""
    hertz = os.sysconf("SC_CLK_TCK")
    ticks, faults = _ticks_faults("self")
    for pid in _descendants(os.getpid()):
        more = _ticks_faults(pid)
        ticks, faults = ticks + more[0], faults + more[1]
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ticks / hertz + reaped.ru_utime + reaped.ru_stime, faults + reaped.ru_minflt


# -- the models ------------------------------------------------------------------------------


def _models(torch):
    try:
        import torchvision
    except ImportError:
        print("torchvision is not importable: the ResNet rows are skipped (pip install torchvision)")
        return {}
    return {"resnet50": torchvision.models.resnet50, "resnet18": torchvision.models.resnet18}


def _trainer(torch, make):
    model = make().cuda().to(memory_format=torch.channels_last).to(torch.bfloat16)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor(MEAN, device="cuda", dtype=torch.float32).view(1, 3, 1, 1)
    scale = torch.tensor(1 / STD, device="cuda", dtype=torch.float32).view(1, 3, 1, 1)

    def step(images, labels):
        # NHWC uint8 seen as NCHW is channels-last memory already; normalise in fp32, once to bf16.
        x = ((images.permute(0, 3, 1, 2).float() - mean) * scale).to(torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        optimiser.zero_grad(set_to_none=True)
        loss = loss_fn(model(x).float(), labels)
        loss.backward()
        optimiser.step()

    return step


def _touch(images, labels):
    """The loader-only step: the batch is on the GPU already (a copy each loader made); on the
    CPU backend one byte of each page is read, so a lazily made batch is paid for here."""
    if not images.is_cuda:
        flat = images.reshape(-1)
        int(flat[:: 4096].sum()) + int(labels[0])


# -- timing ----------------------------------------------------------------------------------


class _Clock:
    """Per-iteration times: CUDA events recorded after each step on a GPU (the GPU's clock, so
    a host running ahead of the GPU does not blur them), the host clock on the CPU."""

    def __init__(self, torch, on_gpu: bool):
        self.torch, self.on_gpu, self.marks = torch, on_gpu, []

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def mark(self) -> None:
        if self.on_gpu:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def deltas_ms(self):
        if self.on_gpu:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [1e3 * (b - a) for a, b in zip(self.marks, self.marks[1:])]


def _time(torch, on_gpu: bool, step, batches, warmup: int, iters: int):
    """Mean ms/iter (wall / iters), median ms/iter, CPU cores and minor page faults per
    iteration over the timed window."""
    clock = _Clock(torch, on_gpu)
    for _ in range(warmup):
        step(*next(batches))
    clock.sync()
    clock.mark()  # the start of the first timed iteration
    (cpu, faults), wall = cpu_seconds_faults(), time.perf_counter()
    for _ in range(iters):
        step(*next(batches))
        clock.mark()
    clock.sync()
    wall = time.perf_counter() - wall
    cpu_after, faults_after = cpu_seconds_faults()
    return 1e3 * wall / iters, statistics.median(clock.deltas_ms()), (cpu_after - cpu) / wall, \
        (faults_after - faults) / iters


# -- the loaders -----------------------------------------------------------------------------


def _torch_batches(torch, dataset, batch: int, workers: int, on_gpu: bool):
    """DataLoader as users run it; returns (iterator of (images, labels) where the step wants
    them, the loader to drop after)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers, pin_memory=on_gpu,
                                         prefetch_factor=2, drop_last=True)

    def batches():
        for images, labels in loader:
            if on_gpu:
                yield images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            else:
                yield images, labels

    return batches(), loader


def _dali_batches(torch, directory: str, batch: int, threads: int):
    """NVIDIA DALI as its ImageNet examples run it, with its CPU decoder: a file reader, a fused
    decode and random crop (scale 0.08-1, ratio 3/4-4/3: only the crop's part of the JPEG is
    decoded, a saving PIL's path does not get), a resize to 224x224, a random horizontal flip,
    all on the CPU with ``threads`` threads in this process; the batch then copied to the GPU.
    Returns (iterator of (images NHWC uint8, labels int64) on the GPU, the pipeline)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    files = sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".jpg"))
    if not files:
        raise SystemExit(f"no .jpg files in {directory}: make them with --make {directory} --dataset jpeg")

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0, prefetch_queue_depth=2,
                  seed=int.from_bytes(os.urandom(4), "little") >> 1)
    def crops():
        jpegs, labels = fn.readers.file(files=files, labels=[i % 1000 for i in range(len(files))],
                                        random_shuffle=False, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=CROP, resize_y=CROP, interp_type=types.INTERP_LINEAR)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images.gpu(), labels.gpu()

    pipe = crops()
    pipe.build()
    loader = DALIGenericIterator(pipe, ["images", "labels"], reader_name="reader",
                                 last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)

    def batches():
        while True:  # the files are cycled, as the other loaders' datasets cycle them
            for (out,) in loader:
                yield out["images"], out["labels"].view(-1).long()

    return batches(), pipe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make", metavar="DIR", help="write --count items of --dataset into DIR and stop")
    parser.add_argument("--count", type=int, default=None, help="items to make (jpeg: 1500, arrays: 500)")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="jpeg")
    parser.add_argument("--data", metavar="DIR", help="the data --make wrote")
    parser.add_argument("--workers", default="4,8,12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="warm-up batches (at least 2 x workers are run)")
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--loader-only", action="store_true", help="no model: each batch to the GPU (or touched)")
    parser.add_argument("--loaders", default="torch,hetmem",
                        help="which loaders to run: torch, hetmem, dali (jpeg on a GPU: N is its threads)")
    parser.add_argument("--json", metavar="FILE", help="write the rows here as JSON")
    args = parser.parse_args()
    dataset_class, make = DATASETS[args.dataset]
    if args.make:
        make(args.make, args.count or (1500 if args.dataset == "jpeg" else 500))
        return 0
    if not args.data:
        parser.error("give --data DIR (make it first with --make DIR --dataset NAME)")
    if args.iters < 2 or args.batch < 1:
        parser.error("give --iters >= 2 and --batch >= 1")
    import torch

    import hetmem
    from hetmem.loader import WorkerLoader

    backend = hetmem.device().backend
    on_gpu = torch.cuda.is_available() and backend == "cuda"
    if not on_gpu and (torch.cuda.is_available() or backend == "cuda"):
        print(f"torch and hetmem disagree on the GPU (torch: {torch.cuda.is_available()}, hetmem: {backend})")
        return 1
    if not on_gpu and not args.loader_only:
        print("no GPU: the training steps need one; give --loader-only to measure the loaders on the CPU backend")
        return 1
    counts = [int(n) for n in args.workers.split(",")]
    loaders = args.loaders.split(",")
    steps = {}
    if args.loader_only:
        steps["loader-only"] = _touch
    else:
        torch.backends.cudnn.benchmark = True
        models = _models(torch)
        steps = {name: _trainer(torch, models[name]) for name in args.models.split(",") if name in models}
    sample_bytes = CROP * CROP * 3
    rows = []

    def report(row):
        row.update(dataset=args.dataset, batch=args.batch, iters=args.iters, backend=backend,
                   samples_per_s=1e3 * args.batch / row["ms_per_iter"],
                   cpu_ms_per_sample=row["cpu_cores"] * row["ms_per_iter"] / args.batch)
        if row["loader"] not in ("torch", "synthetic"):
            for other in rows:
                if (other["loader"], other["model"], other["workers"]) == ("torch", row["model"], row["workers"]):
                    row["vs_torch"] = other["ms_per_iter"] / row["ms_per_iter"]
        rows.append(row)
        ratio = f", {row['vs_torch']:.2f}x DataLoader" if "vs_torch" in row else ""
        host_bytes = "uncounted" if row["host_bytes_per_sample"] is None else round(row["host_bytes_per_sample"])
        print(f"{row['model']:11} {row['loader']:9} N={row['workers']:<3} warm-up {row['warmup']:>3}: "
              f"{row['ms_per_iter']:7.1f} ms/iter (median {row['ms_per_iter_median']:7.1f}), "
              f"{row['samples_per_s']:7.0f} samples/s, {row['cpu_cores']:5.1f} cores "
              f"({row['cpu_ms_per_sample']:.2f} CPU ms, {row['faults_per_sample']:.0f} faults /sample), "
              f"{host_bytes} host B/sample{ratio}", flush=True)

    if on_gpu and not args.loader_only:
        for name, step in steps.items():  # the compute bound: a batch already on the GPU
            images = torch.randint(0, 256, (args.batch, CROP, CROP, 3), dtype=torch.uint8, device="cuda")
            labels = torch.randint(0, 1000, (args.batch,), device="cuda")
            ms, median, cores, faults = _time(torch, on_gpu, step, iter(lambda: (images, labels), None), args.warmup,
                                      args.iters)
            report({"model": name, "loader": "synthetic", "workers": 0, "warmup": args.warmup, "ms_per_iter": ms,
                    "ms_per_iter_median": median, "cpu_cores": cores, "faults_per_sample": faults / args.batch,
                    "host_bytes_per_sample": 0})

    for workers in counts:
        warmup = max(args.warmup, 2 * workers)
        length = (warmup + args.iters) * args.batch  # one epoch: no epoch boundary in the window
        for name, step in steps.items():
            base = {"model": name, "workers": workers, "warmup": warmup}
            # Both loaders fork their workers: a garbage collection in a child that frees a CUDA
            # tensor inherited from this process kills it (cudaErrorInitializationError, seen on
            # the H200 at N=12). Freezing what exists now keeps the children's collections off it.
            gc.collect()
            gc.freeze()
            if "torch" in loaders:
                batches, loader = _torch_batches(torch, dataset_class(args.data, length), args.batch, workers,
                                                 on_gpu)
                ms, median, cores, faults = _time(torch, on_gpu, step, batches, warmup, args.iters)
                # collate into the batch's shared memory, then (GPU) the pin-memory thread's copy.
                report(dict(base, loader="torch", ms_per_iter=ms, ms_per_iter_median=median, cpu_cores=cores,
                            faults_per_sample=faults / args.batch,
                            host_bytes_per_sample=(2 if on_gpu else 1) * sample_bytes, host_bytes_measured=False))
                del batches, loader
            if "hetmem" in loaders:
                with WorkerLoader(dataset_class(args.data, length), args.batch, workers=workers,
                                  sample_shape=(CROP, CROP, 3), sample_dtype=np.uint8, labels=True,
                                  drop_last=True, timeout=120) as loader:
                    ms, median, cores, faults = _time(torch, on_gpu, step, iter(loader), warmup, args.iters)
                    stats = loader.stats()
                report(dict(base, loader="hetmem", ms_per_iter=ms, ms_per_iter_median=median, cpu_cores=cores,
                            faults_per_sample=faults / args.batch,
                            host_bytes_per_sample=stats["host_bytes_per_sample"], host_bytes_measured=True))
    # DALI last: once it has run in this process, DataLoader's forked workers fail to start
    # CUDA (cudaErrorInitializationError, seen on the H200).
    dali_counts = counts if "dali" in loaders and args.dataset == "jpeg" and on_gpu else []
    for workers in dali_counts:
        warmup = max(args.warmup, 2 * workers)
        for name, step in steps.items():
            batches, pipe = _dali_batches(torch, args.data, args.batch, workers)
            ms, median, cores, faults = _time(torch, on_gpu, step, batches, warmup, args.iters)
            # DALI's own buffers: not counted (None), unlike the two loaders above.
            report(dict(model=name, workers=workers, warmup=warmup, loader="dali", threads=workers, ms_per_iter=ms,
                        ms_per_iter_median=median, cpu_cores=cores, faults_per_sample=faults / args.batch,
                        host_bytes_per_sample=None, host_bytes_measured=False))
            del batches, pipe
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"dataset": args.dataset, "batch": args.batch, "iters": args.iters,
                       "loader_only": args.loader_only, "backend": backend, "cpus": os.cpu_count(), "rows": rows},
                      file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
