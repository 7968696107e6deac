#!/usr/bin/env python3
"""CuPy peer for `hetmem bench link`: pinned copies and zero-copy kernels through CuPy's runtime API.

Cells (names and sizes as in hetmem's JSON):
  bandwidth  pinned_async_h2d    ndarray.set(pinned numpy array, stream), CUDA events
             pinned_async_d2h    ndarray.get(stream, out=pinned numpy array)
             zero_copy_read      a RawKernel reading mapped pinned memory (cudaHostAlloc with
                                 cudaHostAllocMapped; the device pointer from
                                 cudaHostGetDevicePointer where CuPy has it, else the UVA
                                 address, which is the same on a UVA system)
             zero_copy_write     the RawKernel writing mapped pinned memory
             zero_copy_read_write  reading one mapped buffer and writing another
  latency    pinned_async_h2d (+ stream synchronize), zero_copy_kernel_read (launch + synchronize)

The kernels are hetmem's own (crates/hetmem-bench/kernels/bench.cu, read from this checkout), with the
same grid (SMs x 8 blocks of 512 threads, grid-stride; SMs / 4 for read+write, as hetmem's
copy_blocks explains), so the comparison is of the memory path, not of kernel code. Reads fold
every word into an XOR checksum checked against NumPy; writes and copies are compared word for
word: a wrong result exits with an error.
Output: the same JSON shape as torch_link.py.
"""

import argparse
import ctypes
import pathlib
import sys

import numpy as np

from link_common import MIB, emit, latency_us, plan, summary

try:
    import cupy as cp
    from cupy.cuda import runtime
except ImportError as error:  # pragma: no cover - depends on the machine
    sys.exit(f"cupy_link.py: CuPy is not installed ({error}); this peer needs CuPy and an NVIDIA GPU")

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "crates" / "hetmem-bench" / "kernels" / "bench.cu"
HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped


def bench_word(i, seed):
    """hetmem's bench_word (kernels/bench.cu) over an index array, in NumPy uint32 arithmetic."""
    i = i.astype(np.uint64)
    x = (i & 0xFFFFFFFF).astype(np.uint32) ^ ((i >> np.uint64(32)).astype(np.uint32) * np.uint32(0x9E3779B9)) ^ np.uint32(seed)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


class Mapped:
    """`nbytes` of mapped pinned host memory: a NumPy view for the CPU, a CuPy view for kernels."""

    def __init__(self, nbytes):
        self.ptr = runtime.hostAlloc(nbytes, HOST_ALLOC_MAPPED)
        get_device_pointer = getattr(runtime, "hostGetDevicePointer", None)
        self.device_ptr = get_device_pointer(self.ptr, 0) if get_device_pointer else self.ptr
        buffer = (ctypes.c_uint32 * (nbytes // 4)).from_address(self.ptr)
        self.host = np.frombuffer(buffer, dtype=np.uint32)
        memory = cp.cuda.UnownedMemory(self.device_ptr, nbytes, owner=self)
        self.device = cp.ndarray((nbytes // 4,), dtype=cp.uint32, memptr=cp.cuda.MemoryPointer(memory, 0))

    def free(self):
        runtime.freeHost(self.ptr)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="hetmem's --quick sizes and repeats")
    p.add_argument("--json", metavar="PATH", help="also write the JSON to PATH")
    return p.parse_args()


def main():
    a = parse_args()
    if runtime.getDeviceCount() == 0:
        sys.exit("cupy_link.py: no CUDA device")
    sizes, repeats, warmup, lat_sizes, lat_samples = plan(a.quick)
    largest = max(sizes)
    module = cp.RawModule(code=KERNELS.read_text())
    read = module.get_function("bench_read_u4")
    write = module.get_function("bench_write_u4")
    copy = module.get_function("bench_copy_u4")
    sms = runtime.getDeviceProperties(0)["multiProcessorCount"]
    rng = np.random.default_rng()

    pinned_mem = cp.cuda.alloc_pinned_memory(largest)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint32, count=largest // 4)
    pinned[:] = rng.integers(0, 1 << 32, size=largest // 4, dtype=np.uint32)
    pinned_out_mem = cp.cuda.alloc_pinned_memory(largest)
    pinned_out = np.frombuffer(pinned_out_mem, dtype=np.uint32, count=largest // 4)
    gpu = cp.empty(largest // 4, dtype=cp.uint32)
    gpu_src = cp.asarray(rng.integers(0, 1 << 32, size=largest // 4, dtype=np.uint32))
    src, dst = Mapped(largest), Mapped(largest)
    src.host[:] = rng.integers(0, 1 << 32, size=largest // 4, dtype=np.uint32)
    sums = cp.zeros(1024, dtype=cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    # RawKernel launches on the current stream: make it this one for the whole run.
    stream.use()
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def reps_at(n):
        # hetmem's LinkOptions::repeats_at: up to 5x the repeats for small cells, at least 3.
        return max(min(repeats, 3), min(5 * repeats, repeats * 64 * MIB // max(n, 1)))

    def grid(items, max_blocks=sms * 8):
        return (max(1, min(max_blocks, (items + 511) // 512)),)

    def timed(n, work):
        rates = []
        for rep in range(warmup + reps_at(n)):
            start.record(stream)
            work(rep)
            end.record(stream)
            end.synchronize()
            if rep >= warmup:
                rates.append(n / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9)
        return summary(rates), warmup + reps_at(n)

    def fail(name, n, what):
        sys.exit(f"cupy_link.py: {name} at {n} bytes: {what}")

    bandwidth = []
    for n in sizes:
        w = n // 4
        n16 = np.uint64(n // 16)
        gb_s, _ = timed(n, lambda rep: gpu[:w].set(pinned[:w], stream=stream))
        stream.synchronize()
        if not np.array_equal(gpu[:w].get(), pinned[:w]):
            fail("pinned_async_h2d", n, "the device copy differs")
        bandwidth.append({"path": "pinned_async_h2d", "bytes": n, "gb_s": gb_s})

        pinned_out[:w] = 0xA5A5A5A5
        gb_s, _ = timed(n, lambda rep: gpu_src[:w].get(stream=stream, out=pinned_out[:w], blocking=False))
        stream.synchronize()
        if not np.array_equal(pinned_out[:w], gpu_src[:w].get()):
            fail("pinned_async_d2h", n, "the host copy differs")
        bandwidth.append({"path": "pinned_async_d2h", "bytes": n, "gb_s": gb_s})

        sums.fill(0)
        stream.synchronize()
        gb_s, count = timed(n, lambda rep: read(grid(n // 16), (512,), (src.device, n16, sums[rep:])))
        stream.synchronize()
        want = np.bitwise_xor.reduce(src.host[:w])
        if not (sums[:count].get() == want).all():
            fail("zero_copy_read", n, "a kernel checksum differs from NumPy's")
        bandwidth.append({"path": "zero_copy_read", "bytes": n, "gb_s": gb_s})

        dst.host[:w] = 0xA5A5A5A5
        seed = np.uint32(rng.integers(1, 1 << 32))
        gb_s, _ = timed(n, lambda rep: write(grid(n // 16), (512,), (dst.device, n16, seed)))
        stream.synchronize()
        if not np.array_equal(dst.host[:w], bench_word(np.arange(w, dtype=np.uint64), seed)):
            fail("zero_copy_write", n, "the written words differ from the pattern")
        bandwidth.append({"path": "zero_copy_write", "bytes": n, "gb_s": gb_s})

        dst.host[:w] = 0xA5A5A5A5
        key = np.uint32(rng.integers(1, 1 << 32))
        gb_s, _ = timed(n, lambda rep: copy(grid(n // 16, max(1, sms // 4)), (512,), (src.device, dst.device, n16, key)))
        stream.synchronize()
        if not np.array_equal(dst.host[:w], src.host[:w] ^ key):
            fail("zero_copy_read_write", n, "the output differs from input ^ key")
        bandwidth.append({"path": "zero_copy_read_write", "bytes": n, "gb_s": gb_s})

    latency = []
    for n in lat_sizes:
        w = max(1, n // 4)
        n16 = np.uint64((n + 15) // 16)
        cells = {
            "pinned_async_h2d": lambda: (gpu[:w].set(pinned[:w], stream=stream), stream.synchronize()),
            "zero_copy_kernel_read": lambda: (
                read(grid(int(n16)), (512,), (src.device, n16, sums)),
                stream.synchronize(),
            ),
        }
        for name, work in cells.items():
            latency.append({"path": name, "bytes": n, "us": latency_us(work, lat_samples)})

    src.free()
    dst.free()
    report = {
        "peer": f"cupy {cp.__version__}",
        "device": runtime.getDeviceProperties(0)["name"].decode(),
        "repeats": repeats,
        "device_pointer": "cudaHostGetDevicePointer" if hasattr(runtime, "hostGetDevicePointer") else "UVA address",
        "bandwidth": bandwidth,
        "latency": latency,
    }
    emit(report, a.json)


if __name__ == "__main__":
    main()
