"""Training input bench: torch DataLoader(pin_memory=True) against hetmem's WorkerLoader, both
running the same JPEG decode + random resized crop + flip in N worker processes, feeding
ResNet-50 (bf16, channels-last) and ResNet-18 training steps at batch 256.

Make the images once (ImageNet-like: 500x375 RGB JPEGs of about 110 KB)::

    python bench/worker_loader.py --make /tmp/jpegs --count 2000

then run (a GPU, torch and torchvision; a few minutes)::

    python bench/worker_loader.py --data /tmp/jpegs --workers 4,8,12 --iters 30 --json out.json

Each row: ms per training iteration (after warm-up), CPU cores used over the timed window (this
process's and all its children's user + system time, from /proc and getrusage, divided by the
wall time), and host bytes copied per sample after ``__getitem__`` made it (WorkerLoader: its
own counter, one write into the registered slot; DataLoader: collate into the batch's shared
memory, then the pin-memory thread's copy into pinned memory, two writes, worked out rather
than measured). A ``synthetic`` row (a batch already on the GPU, no loader) gives the compute
bound. Without torchvision the models are skipped, saying so.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import resource
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


def make_images(directory: str, count: int, seed: int = 0) -> None:
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
            raise SystemExit(f"no .jpg files in {directory}: make them with --make {directory}")
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


def _ticks(pid) -> int:
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds() -> float:
    """This process's, its live descendants' and its reaped children's CPU time."""
    hertz = os.sysconf("SC_CLK_TCK")
    live = sum(_ticks(pid) for pid in _descendants(os.getpid()))
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (_ticks("self") + live) / hertz + reaped.ru_utime + reaped.ru_stime


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


def _time(torch, step, batches, warmup: int, iters: int):
    for _ in range(warmup):
        step(*next(batches))
    torch.cuda.synchronize()
    cpu, wall = cpu_seconds(), time.perf_counter()
    for _ in range(iters):
        step(*next(batches))
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    return 1e3 * wall / iters, (cpu_seconds() - cpu) / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make", metavar="DIR", help="write --count JPEGs into DIR and stop")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--data", metavar="DIR", help="the JPEGs to read")
    parser.add_argument("--workers", default="4,8,12")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--json", metavar="FILE", help="write the rows here as JSON")
    args = parser.parse_args()
    if args.make:
        make_images(args.make, args.count)
        return 0
    if not args.data:
        parser.error("give --data DIR (make it first with --make DIR)")
    import torch

    import hetmem
    from hetmem.loader import WorkerLoader

    if not torch.cuda.is_available() or hetmem.device().backend != "cuda":
        print(f"no GPU for the bench (torch: {torch.cuda.is_available()}, hetmem: {hetmem.device().backend})")
        return 1
    torch.backends.cudnn.benchmark = True
    counts = [int(n) for n in args.workers.split(",")]
    models = _models(torch)
    wanted = [name for name in args.models.split(",") if name in models]
    steps = {name: _trainer(torch, models[name]) for name in wanted}
    per_loader = len(wanted) * (args.warmup + args.iters)
    length = per_loader * args.batch
    sample_bytes = CROP * CROP * 3
    rows = []

    def report(row):
        rows.append(row)
        print(f"{row['model']:9} {row['loader']:11} workers {row['workers']:>3}: {row['ms_per_iter']:8.1f} ms/iter, "
              f"{row['cpu_cores']:5.1f} cores, {row['host_bytes_per_sample']} host bytes copied/sample", flush=True)

    for name in wanted:  # the compute bound: a batch already on the GPU
        images = torch.randint(0, 256, (args.batch, CROP, CROP, 3), dtype=torch.uint8, device="cuda")
        labels = torch.randint(0, 1000, (args.batch,), device="cuda")
        ms, cores = _time(torch, steps[name], iter(lambda: (images, labels), None), args.warmup, args.iters)
        report({"model": name, "loader": "synthetic", "workers": 0, "ms_per_iter": ms, "cpu_cores": cores,
                "host_bytes_per_sample": 0})

    for workers in counts:
        dataset = JpegCrops(args.data, length)
        torch_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, num_workers=workers,
                                                   pin_memory=True, persistent_workers=True, prefetch_factor=2,
                                                   drop_last=True)

        def torch_batches():
            for images, labels in torch_loader:
                yield images.cuda(non_blocking=True), labels.cuda(non_blocking=True)

        batches = torch_batches()
        for name in wanted:
            ms, cores = _time(torch, steps[name], batches, args.warmup, args.iters)
            # collate into the batch's shared memory, then the pin-memory thread's copy.
            report({"model": name, "loader": "torch", "workers": workers, "ms_per_iter": ms, "cpu_cores": cores,
                    "host_bytes_per_sample": 2 * sample_bytes, "host_bytes_measured": False})
        del batches, torch_loader

        with WorkerLoader(dataset, args.batch, workers=workers, sample_shape=(CROP, CROP, 3),
                          sample_dtype=np.uint8, labels=True, drop_last=True) as loader:
            batches = iter(loader)
            for name in wanted:
                ms, cores = _time(torch, steps[name], batches, args.warmup, args.iters)
                stats = loader.stats()
                report({"model": name, "loader": "hetmem", "workers": workers, "ms_per_iter": ms,
                        "cpu_cores": cores, "host_bytes_per_sample": stats["host_bytes_per_sample"],
                        "host_bytes_measured": True})
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"batch": args.batch, "iters": args.iters, "rows": rows}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
