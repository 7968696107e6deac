#!/usr/bin/env python3
"""Peer for `hetmem bench ct`: the same per-organ statistics in PyTorch, on the same volume.

`hetmem bench ct --write-volume DIR` writes the volume it measured (DIR/hu.i16, little-endian
int16), its label template (DIR/labels.u8) and DIR/volume.json (shape, HU windows, organ labels,
and the CPU's statistics for every pass). This script reads them, runs the statistics passes
(for each window, for each organ: count, sum and sum of squares of the organ's HU, and a
256-bin histogram of those within the window, bin = (v - lo) * 256 // (hi - lo + 1)) on the
GPU, checks every pass against hetmem's CPU results word for word, and reports seconds per
study (the whole sweep over the stack, divided by the studies stacked), median of --repeats.

Modes (each timed from pinned host tensors to results on the host):
  resident        hu and labels copied to the GPU once, then every pass (PyTorch's usual way)
  per_pass_copy   hu and labels copied to the GPU before every pass (hetmem's all_copy row)

Only the statistics: the masked Gaussian and the projection of hetmem's rows are not in the
peer, so compare it with `hetmem bench ct --studies N` rows (statistics and projection) or
read it as a lower bound.

    ct_stats_torch.py --dir DIR [--repeats 3] [--modes resident,per_pass_copy] [--json OUT]
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

BINS = 256


def load(directory):
    meta = json.loads((directory / "volume.json").read_text())
    voxels = meta["depth"] * meta["height"] * meta["width"]
    hu = np.fromfile(directory / "hu.i16", dtype="<i2")
    labels = np.fromfile(directory / "labels.u8", dtype=np.uint8)
    if hu.size != voxels or labels.size != voxels:
        sys.exit(f"{directory}: {hu.size} HU values and {labels.size} labels for {voxels} voxels in volume.json")
    return meta, hu, labels


def passes(torch, hu, labels, meta, copy_each_pass, hu_host, labels_host):
    out = []
    for lo, hi in meta["windows"]:
        span = hi - lo + 1
        for organ in meta["organs"]:
            if copy_each_pass:
                hu = hu_host.to("cuda", non_blocking=True)
                labels = labels_host.to("cuda", non_blocking=True)
            values = hu[labels == organ].to(torch.int64)
            inside = values[(values >= lo) & (values <= hi)]
            histogram = torch.bincount((inside - lo) * BINS // span, minlength=BINS)
            out.append(torch.cat([
                torch.stack([values.numel() * torch.ones((), dtype=torch.int64, device="cuda"),
                             values.sum(), (values * values).sum()]),
                histogram,
            ]))
    return torch.stack(out).cpu()


def run_mode(torch, mode, hu_host, labels_host, meta, repeats):
    expected = np.array(meta["expected_stats"], dtype=np.uint64)
    seconds = []
    for repeat in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if mode == "resident":
            hu = hu_host.to("cuda", non_blocking=True)
            labels = labels_host.to("cuda", non_blocking=True)
            got = passes(torch, hu, labels, meta, False, hu_host, labels_host)
        else:
            got = passes(torch, None, None, meta, True, hu_host, labels_host)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if repeat == 0:
            got = got.numpy().astype(np.uint64)
            if got.shape != expected.shape or not np.array_equal(got, expected):
                bad = int(np.argwhere((got != expected).any(axis=1))[0][0]) if got.shape == expected.shape else -1
                sys.exit(f"{mode}: pass {bad} differs from hetmem's CPU statistics")
        else:
            seconds.append(elapsed / meta["studies"])
    return {"mode": mode, "seconds_per_study": {"median": statistics.median(seconds), "min": min(seconds),
                                                "samples": len(seconds)},
            "checked": "every pass equals hetmem's CPU statistics word for word"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", required=True, type=pathlib.Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="resident,per_pass_copy")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("skipped: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("skipped: PyTorch sees no CUDA device")
    meta, hu, labels = load(args.dir)
    hu_host = torch.from_numpy(hu.astype(np.int16)).pin_memory()
    labels_host = torch.from_numpy(labels).pin_memory()
    report = {
        "peer": "torch",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "shape": [meta["depth"], meta["height"], meta["width"]],
        "studies": meta["studies"],
        "passes": len(meta["windows"]) * len(meta["organs"]),
        "rows": [run_mode(torch, mode, hu_host, labels_host, meta, args.repeats) for mode in args.modes.split(",")],
    }
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
