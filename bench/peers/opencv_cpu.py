#!/usr/bin/env python3
"""OpenCV peer for hetmem's CPU backend: cv2.GaussianBlur 5x5 of 1080p and 4K frames, RGB and gray.

What is measured: the wall time of one cv2.GaussianBlur call (ksize 5, sigma 0, so OpenCV's
fixed-point 8-bit path with its [1, 4, 6, 4, 1] table; BORDER_REFLECT_101), into a
preallocated output, with cv2.setNumThreads(--threads): the same arithmetic as hetmem's
gaussian_cpu, which is bit-exact with it. Each case blurs one random frame (never zeros)
--runs times after --warmup untimed calls; the median, minimum and 90th percentile of the wall
time are reported, and the median CPU time of the whole process per call (all threads
together: on a machine shared with other work it shows what the blur itself costs, where the
wall time also counts the time its threads waited for a core).

One JSON object per case and line, with the same fields as hetmem's
`cargo run --release -p hetmem --example cpu_gaussian_speed`; compare the two at the same
thread count (RAYON_NUM_THREADS for hetmem). --sixteen-bit adds CV_16U cases (16-bit samples,
OpenCV's 16-bit fixed-point path).

Pinned versions (as .ci/run): opencv-python-headless==5.0.0.93 numpy==2.4.6.
"""

import argparse
import json
import statistics
import time

import cv2
import numpy as np

SIZES = [(1920, 1080), (3840, 2160)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, required=True,
                   help="cv2.setNumThreads: give the same count as hetmem's RAYON_NUM_THREADS")
    p.add_argument("--runs", type=int, default=200, help="timed calls per case (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    p.add_argument("--sixteen-bit", action="store_true", help="add 16-bit (CV_16U) cases")
    a = p.parse_args()
    if a.threads < 1 or a.runs < 1 or a.warmup < 0:
        p.error("--threads and --runs must be at least 1, --warmup at least 0")
    return a


def measure(frame, runs, warmup):
    """Wall and process CPU times of cv2.GaussianBlur on frame, in milliseconds."""
    out = np.empty_like(frame)
    walls, cpus = [], []
    for run in range(warmup + runs):
        start, cpu_start = time.perf_counter(), time.process_time()
        cv2.GaussianBlur(frame, (5, 5), 0, dst=out, borderType=cv2.BORDER_REFLECT_101)
        if run >= warmup:
            walls.append((time.perf_counter() - start) * 1e3)
            cpus.append((time.process_time() - cpu_start) * 1e3)
    return sorted(walls), cpus


def main():
    a = parse_args()
    cv2.setNumThreads(a.threads)
    if cv2.getNumThreads() != a.threads:
        raise SystemExit(f"opencv_cpu.py: cv2.setNumThreads({a.threads}) left {cv2.getNumThreads()} threads")
    rng = np.random.default_rng()
    for bits in [8, 16] if a.sixteen_bit else [8]:
        dtype, top = (np.uint8, 256) if bits == 8 else (np.uint16, 65536)
        for width, height in SIZES:
            for channels in [3, 1]:
                shape = (height, width, channels) if channels > 1 else (height, width)
                frame = rng.integers(1, top, shape, dtype=dtype)
                walls, cpus = measure(frame, a.runs, a.warmup)
                print(json.dumps({
                    "library": "opencv",
                    "version": cv2.__version__,
                    "width": width,
                    "height": height,
                    "channels": channels,
                    "bits": bits,
                    "ksize": 5,
                    "border": "reflect101",
                    "threads": cv2.getNumThreads(),
                    "runs": a.runs,
                    "median_ms": statistics.median(walls),
                    "min_ms": walls[0],
                    "p90_ms": walls[len(walls) * 9 // 10],
                    "cpu_median_ms": statistics.median(cpus),
                }), flush=True)


if __name__ == "__main__":
    main()
