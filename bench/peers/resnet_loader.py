#!/usr/bin/env python3
"""The seed's deep-learning input case: torchvision ResNet training iterations
(bf16 autocast, channels-last, SGD) fed by

  hetmem-mapped   hetmem.loader.RecordLoader, mode "mapped": the GPU gathers each batch's crops
                  from the registered memmap (no CPU copy), flips and normalises on the GPU, on
                  the loader's own stream
  hetmem-copied   RecordLoader, mode "copied": copy engines bring each chosen record from the
                  registered memmap into device memory, the crop reads it there
  hetmem-staged   RecordLoader, mode "staged": one thread gathers into pinned mapped staging
  dataloader-N    torch.utils.data.DataLoader over the same memmap, pin_memory=True,
                  num_workers=N (each N of --workers): crop and flip in the workers, as
                  torchvision's transforms do, normalisation on the GPU
  dataloader-best the fastest of the dataloader-N rows (the DataLoader at its best num_workers)
  synthetic       one batch already on the GPU (the compute-only bound)

For each model and batch size, over --iters iterations after --warmup, with no
synchronisation inside the measured window (as in real training, so input and compute overlap
where the loader lets them):
  ms_per_iter     wall time per iteration (the window's wall time / iterations)
  ms_gpu_median   the median iteration on the GPU's timeline (CUDA events between iterations)
  input_wait_ms   the time per iteration the GPU's training stream waited for input: from an
                  event recorded before fetching the batch to one recorded once it is handed
                  over (the wait for the loader's event, or the DataLoader's copy and
                  normalisation on the training stream, or the GPU idling for the CPU)
  over_bound_ms   ms_per_iter less the synthetic row's
  cpu_cores_used  CPU time of the process and all its children alive (DataLoader workers) per
                  wall second, from /proc
Output: JSON lines on stdout, one per row, and a markdown table on stderr.

    python3 bench/peers/resnet_loader.py                # the full grid, about 3 minutes on an H200
    python3 bench/peers/resnet_loader.py --quick        # fewer iterations and worker counts
"""

import argparse
import json
import os
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


class Records(torch.utils.data.Dataset):
    """The same records as a map-style dataset over np.memmap (opened lazily per worker): each
    item a random crop, flipped at random, as torchvision's RandomCrop and RandomHorizontalFlip
    would give it (uint8, HWC)."""

    def __init__(self, images, labels, shape, crop):
        self.images_path, self.shape, self.crop = images, shape, crop
        self.labels = np.fromfile(labels, np.int64)
        self.images = None

    def __len__(self):
        return self.labels.size

    def __getitem__(self, index):
        if self.images is None:
            self.images = np.memmap(self.images_path, np.uint8, "r").reshape((-1,) + self.shape)
        top = int(torch.randint(0, self.shape[0] - self.crop[0] + 1, ()))
        left = int(torch.randint(0, self.shape[1] - self.crop[1] + 1, ()))
        image = self.images[index, top:top + self.crop[0], left:left + self.crop[1]]
        if torch.rand(()) < 0.5:
            image = image[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image)), int(self.labels[index])


def process_tree_cpu_seconds():
    """User + system CPU time of this process and every descendant alive, from /proc (getrusage's
    RUSAGE_CHILDREN counts only children already waited for, not running DataLoader workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    total, frontier, seen = 0, [os.getpid()], set()
    while frontier:
        pid = frontier.pop()
        if pid in seen or pid not in times:
            continue
        seen.add(pid)
        total += times[pid]
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total / ticks


def dataloader_batches(dataset, batch, workers, seed, device, mean, std):
    generator = torch.Generator().manual_seed(seed)
    feed = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                       pin_memory=True, drop_last=True, generator=generator,
                                       persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    scale, shift = (torch.from_numpy(part).to(device) for part in hetmem_loader.normalisation(mean, std))
    while True:
        for images, labels in feed:
            images = images.to(device, non_blocking=True)
            # The same normalisation as hetmem's loader: float32, rounded once; NHWC memory
            # seen as NCHW (channels-last).
            images = torch.addcmul(shift, images.float(), scale).to(torch.bfloat16).permute(0, 3, 1, 2)
            yield images, labels.to(device, non_blocking=True)


def hetmem_batches(args, batch, mode):
    feed = hetmem_loader.RecordLoader(args.data + ".u8", args.data + ".i64", batch, args.record_shape,
                                      seed=args.seed, mode=mode, crop=args.crop)
    while True:
        yield from feed


def synthetic_batches(batch, crop, device):
    images = torch.randn(batch, 3, *crop, device=device).to(torch.bfloat16, memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    while True:
        yield images, labels


def measure(model_name, batch, source, batches, args, device):
    model = getattr(torchvision.models, model_name)(num_classes=1000).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    stream = torch.cuda.current_stream()
    # Per measured iteration: an event at its start, one once its input is handed over.
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters + 1)]
    inputs = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
    for step in range(args.warmup + args.iters):
        measured = step - args.warmup
        if measured == 0:
            torch.cuda.synchronize()
            cpu_start, wall_start = process_tree_cpu_seconds(), time.perf_counter()
        if measured >= 0:
            starts[measured].record(stream)
        images, labels = next(batches)
        if measured >= 0:
            inputs[measured].record(stream)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    starts[args.iters].record(stream)
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall_start
    cpu = process_tree_cpu_seconds() - cpu_start
    gpu_iters = [starts[k].elapsed_time(starts[k + 1]) for k in range(args.iters)]
    waits = [starts[k].elapsed_time(inputs[k]) for k in range(args.iters)]
    return {"model": model_name, "batch": batch, "source": source, "ms_per_iter": wall * 1e3 / args.iters,
            "ms_gpu_median": statistics.median(gpu_iters), "input_wait_ms": statistics.fmean(waits),
            "cpu_cores_used": cpu / wall, "iters": args.iters}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/dev/shm/hetmem-records", help="path prefix: PREFIX.u8 and PREFIX.i64")
    parser.add_argument("--records", type=int, default=8192, help="records written when the data set is missing")
    parser.add_argument("--record", type=int, default=224, help="record height and width (uint8, 3 channels)")
    parser.add_argument("--crop", type=int, default=224, help="random crop height and width fed to the model")
    parser.add_argument("--models", default="resnet50,resnet18")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--workers", default="2,4,8,12", help="DataLoader num_workers values to measure")
    parser.add_argument("--sources", default="synthetic,hetmem-mapped,hetmem-copied,hetmem-staged,dataloader")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="20 iterations after 5, DataLoader at 2 and 8 workers")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.warmup, args.workers = 20, 5, "2,8"
    if not 0 < args.crop <= args.record:
        parser.error(f"--crop {args.crop}: at least 1 and at most --record ({args.record})")
    args.record_shape = (args.record, args.record, 3)
    args.crop = (args.crop, args.crop)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    record_bytes = args.record * args.record * 3
    images_path, labels_path = args.data + ".u8", args.data + ".i64"
    # A data set left by an earlier run is reused only if it holds records of this size.
    if not (os.path.exists(images_path) and os.path.exists(labels_path)
            and os.path.getsize(images_path) == os.path.getsize(labels_path) // 8 * record_bytes):
        hetmem_loader.write_records(args.data + ".u8", args.data + ".i64", args.records, args.record_shape,
                                    seed=args.seed)
    dataset = Records(args.data + ".u8", args.data + ".i64", args.record_shape, args.crop)
    mean, std = hetmem_loader.IMAGENET_MEAN, hetmem_loader.IMAGENET_STD
    rows = []
    for model_name in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            sources = []
            for source in args.sources.split(","):
                if source == "synthetic":
                    sources.append(("synthetic", lambda b=batch: synthetic_batches(b, args.crop, device)))
                elif source.startswith("hetmem-"):
                    mode = source.split("-", 1)[1]
                    sources.append((source, lambda b=batch, m=mode: hetmem_batches(args, b, m)))
                elif source == "dataloader":
                    for workers in map(int, args.workers.split(",")):
                        sources.append((f"dataloader-{workers}", lambda b=batch, w=workers: dataloader_batches(
                            dataset, b, w, args.seed, device, mean, std)))
                else:
                    parser.error(f"--sources: unknown source {source!r}")
            cell = []
            for name, make in sources:
                batches = make()
                cell.append(measure(model_name, batch, name, batches, args, device))
                batches.close()  # stops the DataLoader's workers before the next row
            loaders = [row for row in cell if row["source"].startswith("dataloader-")]
            if loaders:
                best = min(loaders, key=lambda row: row["ms_per_iter"])
                cell.append({**best, "source": "dataloader-best", "workers": int(best["source"].split("-")[1])})
            bound = next((row["ms_per_iter"] for row in cell if row["source"] == "synthetic"), None)
            for row in cell:
                row["over_bound_ms"] = None if bound is None else row["ms_per_iter"] - bound
                print(json.dumps(row), flush=True)
            rows.extend(cell)
    print("| model | batch | source | ms/iter | GPU median ms | input wait ms | over bound ms | CPU cores |",
          file=sys.stderr)
    print("|---|---|---|---|---|---|---|---|", file=sys.stderr)
    for row in rows:
        over = "" if row["over_bound_ms"] is None else f"{row['over_bound_ms']:+.1f}"
        print(f"| {row['model']} | {row['batch']} | {row['source']} | {row['ms_per_iter']:.1f} | "
              f"{row['ms_gpu_median']:.1f} | {row['input_wait_ms']:.2f} | {over} | {row['cpu_cores_used']:.2f} |",
              file=sys.stderr)


if __name__ == "__main__":
    main()
