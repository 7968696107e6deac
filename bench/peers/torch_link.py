#!/usr/bin/env python3
"""PyTorch peer for `hetmem bench link`: the copies a competent PyTorch user writes.

Cells (names and sizes as in hetmem's JSON, so the two can be put side by side):
  bandwidth  pinned_async_h2d   gpu.copy_(pinned, non_blocking=True), timed with CUDA events
             pinned_async_d2h   pinned.copy_(gpu, non_blocking=True)
             pinned_async_both  both at once on two streams; GB/s per direction
             pinned_sync_h2d    gpu.copy_(pinned) (blocking), CPU clock
             pinned_sync_d2h    pinned.copy_(gpu) (blocking), CPU clock
             pageable_h2d       gpu.copy_(plain CPU tensor), CPU clock
             pageable_d2h       plain.copy_(gpu), CPU clock
  latency    pinned_sync_h2d, pinned_sync_d2h, pinned_async_h2d (+ torch.cuda.synchronize()),
             pinned_async_d2h, pageable_sync_h2d, for small sizes (4 B to 64 KiB)

Data is random bytes (never zeros). After each bandwidth cell the destination is compared with
the source (a wrong copy exits with an error, so no figure is reported for work not done).
Prints (and with --json writes) {"peer", "device", "bandwidth": [...], "latency": [...]} where
each cell is {"path", "bytes", "gb_s" or "us": {"samples", "min", "median", "p90", "p99"}}:
hetmem's Summary. "min" of a rate is the slowest repetition, as in hetmem.
"""

import argparse
import sys
import time

import torch

from link_common import MIB, emit, latency_us, plan, summary



def parse_size(text):
    text = text.strip().lower()
    for suffix, shift in (("gib", 30), ("mib", 20), ("kib", 10), ("g", 30), ("m", 20), ("k", 10)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) << shift
    return int(text.rstrip("b"))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="hetmem's --quick sizes and repeats")
    p.add_argument("--sizes", help="comma-separated bandwidth sizes (default: hetmem's)")
    p.add_argument("--json", metavar="PATH", help="also write the JSON to PATH")
    return p.parse_args()


def main():
    a = parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"torch_link.py: CUDA is not available to PyTorch (torch {torch.__version__}); "
                 "this peer needs an NVIDIA GPU")
    sizes, repeats, warmup, lat_sizes, lat_samples = plan(a.quick)
    if a.sizes:
        sizes = [parse_size(t) for t in a.sizes.split(",")]
    largest = max(sizes)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(time.time_ns() & 0xFFFFFFFF)
    src = torch.randint(0, 256, (largest,), dtype=torch.uint8, generator=gen).pin_memory()
    dst = torch.empty(largest, dtype=torch.uint8).pin_memory()
    pageable = torch.randint(0, 256, (largest,), dtype=torch.uint8, generator=gen)
    pageable_out = torch.empty(largest, dtype=torch.uint8)
    gpu_in = torch.empty(largest, dtype=torch.uint8, device=dev)
    gpu_out = torch.randint(0, 256, (largest,), dtype=torch.uint8, device=dev)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    start, end, end2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))

    def reps_at(n):
        # hetmem's LinkOptions::repeats_at: up to 5x the repeats for small cells, at least 3.
        return max(min(repeats, 3), min(5 * repeats, repeats * 64 * MIB // max(n, 1)))

    def timed_events(n, work):
        rates = []
        for rep in range(warmup + reps_at(n)):
            with torch.cuda.stream(s1):
                start.record(s1)
                work()
                end.record(s1)
            end.synchronize()
            if rep >= warmup:
                rates.append(n / (start.elapsed_time(end) / 1e3) / 1e9)
        return summary(rates)

    def timed_cpu(n, work):
        rates = []
        for rep in range(warmup + reps_at(n)):
            t = time.perf_counter()
            work()
            dt = time.perf_counter() - t
            if rep >= warmup:
                rates.append(n / dt / 1e9)
        return summary(rates)

    def both(n):
        rates = []
        for rep in range(warmup + reps_at(n)):
            start.record(s1)
            s2.wait_event(start)
            with torch.cuda.stream(s1):
                gpu_in[:n].copy_(src[:n], non_blocking=True)
                end.record(s1)
            with torch.cuda.stream(s2):
                dst[:n].copy_(gpu_out[:n], non_blocking=True)
                end2.record(s2)
            end.synchronize()
            end2.synchronize()
            ms = max(start.elapsed_time(end), start.elapsed_time(end2))
            if rep >= warmup:
                rates.append(n / (ms / 1e3) / 1e9)
        return summary(rates)

    def check(name, n, got, want):
        if not torch.equal(got[:n].cpu(), want[:n].cpu()):
            sys.exit(f"torch_link.py: {name} at {n} bytes copied the wrong bytes")

    bandwidth = []
    for n in sizes:
        cells = {
            "pageable_h2d": (lambda: timed_cpu(n, lambda: gpu_in[:n].copy_(pageable[:n])), gpu_in, pageable),
            "pageable_d2h": (lambda: timed_cpu(n, lambda: pageable_out[:n].copy_(gpu_out[:n])), pageable_out, gpu_out),
            "pinned_sync_h2d": (lambda: timed_cpu(n, lambda: gpu_in[:n].copy_(src[:n])), gpu_in, src),
            "pinned_sync_d2h": (lambda: timed_cpu(n, lambda: dst[:n].copy_(gpu_out[:n])), dst, gpu_out),
            "pinned_async_h2d": (lambda: timed_events(n, lambda: gpu_in[:n].copy_(src[:n], non_blocking=True)),
                                 gpu_in, src),
            "pinned_async_d2h": (lambda: timed_events(n, lambda: dst[:n].copy_(gpu_out[:n], non_blocking=True)),
                                 dst, gpu_out),
            "pinned_async_both": (lambda: both(n), dst, gpu_out),
        }
        for name, (measure, got, want) in cells.items():
            got[:n].fill_(0xA5)
            torch.cuda.synchronize()
            gb_s = measure()
            torch.cuda.synchronize()
            check(name, n, got, want)
            bandwidth.append({"path": name, "bytes": n, "gb_s": gb_s})

    latency = []
    for n in lat_sizes:
        cells = {
            "pinned_sync_h2d": lambda: gpu_in[:n].copy_(src[:n]),
            "pinned_sync_d2h": lambda: dst[:n].copy_(gpu_out[:n]),
            "pinned_async_h2d": lambda: (gpu_in[:n].copy_(src[:n], non_blocking=True), torch.cuda.synchronize()),
            "pinned_async_d2h": lambda: (dst[:n].copy_(gpu_out[:n], non_blocking=True), torch.cuda.synchronize()),
            "pageable_sync_h2d": lambda: gpu_in[:n].copy_(pageable[:n]),
        }
        for name, work in cells.items():
            latency.append({"path": name, "bytes": n, "us": latency_us(work, lat_samples)})

    report = {
        "peer": f"torch {torch.__version__}",
        "device": torch.cuda.get_device_name(0),
        "repeats": repeats,
        "bandwidth": bandwidth,
        "latency": latency,
    }
    emit(report, a.json)


if __name__ == "__main__":
    main()
