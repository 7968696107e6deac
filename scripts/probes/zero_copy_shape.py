#!/usr/bin/env python3
"""Probe: how the launch shape sets mid-size zero-copy bandwidth.

Runs hetmem's bench kernels (crates/hetmem-bench/kernels/bench.cu) on mapped pinned memory
through CuPy with several grids (blocks per SM) and block sizes, at 1-64 MiB, and prints the
median GB/s of read, write and read+write (each way) over 30 repetitions, timed with events.
A grid that covers the whole buffer in one pass issues every read before any write (each thread
reads, then writes once); a smaller grid makes each thread loop, so later reads overlap earlier
writes. Reads are checked against NumPy's XOR, copies word for word.

    python3 scripts/probes/zero_copy_shape.py [--reps 30]
"""

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers"))
from cupy_link import KERNELS, Mapped  # noqa: E402

import cupy as cp  # noqa: E402
from cupy.cuda import runtime  # noqa: E402

MIB = 1 << 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    module = cp.RawModule(code=KERNELS.read_text())
    read, copy = module.get_function("bench_read_u4"), module.get_function("bench_copy_u4")
    sms = runtime.getDeviceProperties(0)["multiProcessorCount"]
    largest = 64 * MIB
    src, dst = Mapped(largest), Mapped(largest)
    rng = np.random.default_rng()
    src.host[:] = rng.integers(0, 1 << 32, size=largest // 4, dtype=np.uint32)
    sums = cp.zeros(4096, dtype=cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def timed(n, launch):
        rates = []
        for rep in range(3 + a.reps):
            start.record(stream)
            launch(rep)
            end.record(stream)
            end.synchronize()
            if rep >= 3:
                rates.append(n / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9)
        return float(np.median(rates))

    # Read+write with K loads in flight per thread before its K stores (unrolled grid-stride).
    unrolled = cp.RawKernel(
        r"""
extern "C" __global__ void copy_ilp(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                    unsigned long long n16, unsigned int key, unsigned int k) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (k - 1) * stride < n16; i += k * stride) {
        uint4 v[4];
        for (unsigned int u = 0; u < 4; ++u) if (u < k) v[u] = src[i + u * stride];
        for (unsigned int u = 0; u < 4; ++u) if (u < k)
            dst[i + u * stride] = make_uint4(v[u].x ^ key, v[u].y ^ key, v[u].z ^ key, v[u].w ^ key);
    }
    for (; i < n16; i += stride) {
        const uint4 v = src[i];
        dst[i] = make_uint4(v.x ^ key, v.y ^ key, v.z ^ key, v.w ^ key);
    }
}""",
        "copy_ilp",
    )
    print(f"{'MiB':>4} {'threads':>7} {'blocks/SM':>9} {'ilp':>3} {'rw each way':>11}")
    for n in (1 * MIB, 4 * MIB, 8 * MIB, 64 * MIB):
        w, n16 = n // 4, np.uint64(n // 16)
        for per_sm in (0.25, 0.5, 1, 2):
            for k in (1, 2, 4):
                grid = (max(1, int(sms * per_sm)),)
                key = np.uint32(rng.integers(1, 1 << 32))
                dst.host[:w] = 0xA5A5A5A5
                rw = timed(n, lambda rep: unrolled(grid, (512,), (src.device, dst.device, n16, key, np.uint32(k))))
                stream.synchronize()
                if not np.array_equal(dst.host[:w], src.host[:w] ^ key):
                    sys.exit(f"copy_ilp differs at {n} {per_sm} {k}")
                print(f"{n // MIB:>4} {512:>7} {per_sm:>9} {k:>3} {rw:11.1f}")
    print(f"{'MiB':>4} {'threads':>7} {'blocks/SM':>9} {'read':>6} {'rw each way':>11}")
    for n in (1 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 64 * MIB):
        w, n16 = n // 4, np.uint64(n // 16)
        want = np.bitwise_xor.reduce(src.host[:w])
        for threads in (512,):
            for per_sm in (1, 8):
                grid = (max(1, min(sms * per_sm * 512 // threads, (n // 16 + threads - 1) // threads)),)
                sums.fill(0)
                r = timed(n, lambda rep: read(grid, (threads,), (src.device, n16, sums[rep:])))
                stream.synchronize()
                if not (sums[: 3 + a.reps].get() == want).all():
                    sys.exit(f"read checksum differs at {n} {threads} {per_sm}")
                key = np.uint32(rng.integers(1, 1 << 32))
                dst.host[:w] = 0xA5A5A5A5
                rw = timed(n, lambda rep: copy(grid, (threads,), (src.device, dst.device, n16, key)))
                stream.synchronize()
                if not np.array_equal(dst.host[:w], src.host[:w] ^ key):
                    sys.exit(f"copy differs at {n} {threads} {per_sm}")
                print(f"{n // MIB:>4} {threads:>7} {per_sm:>9} {r:6.1f} {rw:11.1f}")
    src.free()
    dst.free()


if __name__ == "__main__":
    main()
