#!/usr/bin/env python3
"""The seed's deep-learning input case (issue 15): torchvision ResNet training iterations
(bf16 autocast, channels-last, SGD) fed by

  hetmem-mapped   hetmem.loader.RecordLoader, mode "mapped": the GPU gathers each batch from
                  the registered memmap (no CPU copy), flips and normalises on the GPU
  hetmem-staged   RecordLoader, mode "staged": one thread gathers into pinned mapped staging
  dataloader-N    torch.utils.data.DataLoader over the same memmap, pin_memory=True,
                  num_workers=N (each N of --workers), the same normalisation on the GPU
  synthetic       one batch already on the GPU (the compute-only bound)

For each model and batch size: ms per iteration (median over --iters after --warmup), the
time the GPU waited for input (the iteration time less the synthetic one), and the CPU time
used per iteration by the process and its children (cores used = CPU time / wall time).
Output: JSON lines on stdout, one per cell, and a markdown table on stderr.

    python3 bench/peers/resnet_loader.py --data /dev/shm/hetmem-records --records 8192
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

try:
    import torch
    import torchvision
except ImportError as error:  # pragma: no cover - depends on the machine
    sys.exit(f"resnet_loader.py: needs PyTorch and torchvision ({error})")

from hetmem import loader as hetmem_loader

MEAN = torch.tensor(hetmem_loader.IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(hetmem_loader.IMAGENET_STD).view(1, 3, 1, 1)


class Records(torch.utils.data.Dataset):
    """The same records as a map-style dataset over np.memmap (opened lazily per worker)."""

    def __init__(self, images, labels, shape):
        self.images_path, self.shape = images, shape
        self.labels = np.fromfile(labels, np.int64)
        self.images = None

    def __len__(self):
        return self.labels.size

    def __getitem__(self, index):
        if self.images is None:
            self.images = np.memmap(self.images_path, np.uint8, "r").reshape((-1,) + self.shape)
        return torch.from_numpy(np.array(self.images[index])), int(self.labels[index])


def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def dataloader_batches(dataset, batch, workers, seed, device):
    generator = torch.Generator().manual_seed(seed)
    feed = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                       pin_memory=True, drop_last=True, generator=generator,
                                       persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    mean, std = MEAN.to(device), STD.to(device)
    while True:
        for images, labels in feed:
            images = images.to(device, non_blocking=True).permute(0, 3, 1, 2)
            flips = torch.rand(images.shape[0], device=device) < 0.5
            images = torch.where(flips.view(-1, 1, 1, 1), images.flip(3), images)
            images = images.to(torch.bfloat16, memory_format=torch.channels_last)
            images = ((images / 255.0) - mean.to(torch.bfloat16)) / std.to(torch.bfloat16)
            yield images, labels.to(device, non_blocking=True)


def hetmem_batches(args, batch, mode):
    feed = hetmem_loader.RecordLoader(args.data + ".u8", args.data + ".i64", batch, seed=args.seed, mode=mode)
    while True:
        yield from feed


def synthetic_batches(batch, device):
    images = torch.randn(batch, 3, 224, 224, device=device).to(torch.bfloat16, memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    while True:
        yield images, labels


def measure(model_name, batch, source, batches, args, device):
    model = getattr(torchvision.models, model_name)(num_classes=1000).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    cpu_start = wall_start = None
    for step in range(args.warmup + args.iters):
        if step == args.warmup:
            torch.cuda.synchronize()
            cpu_start, wall_start = cpu_seconds(), time.perf_counter()
        begin = time.perf_counter()
        images, labels = next(batches)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - begin) * 1e3)
    wall = time.perf_counter() - wall_start
    return {"model": model_name, "batch": batch, "source": source, "ms_per_iter": statistics.median(times),
            "ms_mean": statistics.fmean(times), "cpu_cores_used": (cpu_seconds() - cpu_start) / wall,
            "iters": args.iters}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/dev/shm/hetmem-records", help="path prefix: PREFIX.u8 and PREFIX.i64")
    parser.add_argument("--records", type=int, default=8192, help="records written when the data set is missing")
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--workers", default="2,8", help="DataLoader num_workers values to measure")
    parser.add_argument("--sources", default="synthetic,hetmem-mapped,hetmem-staged,dataloader")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    if not os.path.exists(args.data + ".u8"):
        hetmem_loader.write_records(args.data + ".u8", args.data + ".i64", args.records, seed=args.seed)
    dataset = Records(args.data + ".u8", args.data + ".i64", (224, 224, 3))
    rows = []
    for model_name in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            sources = []
            for source in args.sources.split(","):
                if source == "synthetic":
                    sources.append(("synthetic", lambda b=batch: synthetic_batches(b, device)))
                elif source.startswith("hetmem-"):
                    mode = source.split("-", 1)[1]
                    sources.append((source, lambda b=batch, m=mode: hetmem_batches(args, b, m)))
                elif source == "dataloader":
                    for workers in map(int, args.workers.split(",")):
                        sources.append((f"dataloader-{workers}",
                                        lambda b=batch, w=workers: dataloader_batches(dataset, b, w, args.seed, device)))
            bound = None
            for name, make in sources:
                row = measure(model_name, batch, name, make(), args, device)
                bound = row["ms_per_iter"] if name == "synthetic" else bound
                row["input_wait_ms"] = None if bound is None else max(0.0, row["ms_per_iter"] - bound)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("| model | batch | source | ms/iter | input wait ms | CPU cores |", file=sys.stderr)
    print("|---|---|---|---|---|---|", file=sys.stderr)
    for row in rows:
        wait = "" if row["input_wait_ms"] is None else f"{row['input_wait_ms']:.1f}"
        print(f"| {row['model']} | {row['batch']} | {row['source']} | {row['ms_per_iter']:.1f} | {wait} | "
              f"{row['cpu_cores_used']:.2f} |", file=sys.stderr)


if __name__ == "__main__":
    main()
