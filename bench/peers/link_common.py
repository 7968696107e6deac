"""What the link peers (torch_link.py, cupy_link.py) share: hetmem's sizes, the statistics,
the small-transfer timing loop, and writing the report, so their JSON matches hetmem's."""

import json
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def summary(samples):
    s = sorted(samples)
    at = lambda q: s[round((len(s) - 1) * q)]
    return {"samples": len(s), "min": s[0], "median": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def log_steps(lo, hi, factor):
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return out


def plan(quick):
    """hetmem bench link's sizes and repeats: (sizes, repeats, warmup, latency sizes, latency samples)."""
    if quick:
        return [64 * KIB, 4 * MIB, 256 * MIB], 5, 1, [4, 64 * KIB], 200
    return log_steps(4 * KIB, GIB, 4), 20, 3, log_steps(4, 64 * KIB, 4), 1000


def latency_us(work, samples):
    """`work` timed `samples` times in microseconds after as many untimed runs, summarised."""
    times = []
    for sample in range(2 * samples):
        t = time.perf_counter()
        work()
        dt = (time.perf_counter() - t) * 1e6
        if sample >= samples:
            times.append(dt)
    return summary(times)


def emit(report, path):
    """Prints the report as JSON, and writes it to `path` too when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
