#!/usr/bin/env python3
"""The registration goal: pinning 1 GiB in place with `hetmem.register` against
`tensor.pin_memory()` (which allocates pinned memory and copies), and against the bare
driver call hetmem makes, so the note can say how much of hetmem's time is the driver's.

Each repeat takes a fresh, already-touched array (pages faulted in, as a real data set is)
and times, on that same array, one after the other (their order alternating between repeats):
  hetmem      hetmem.register(array) (mapped, as by default), from Python
  driver      cuMemHostRegister(DEVICEMAP) of the same covering pages, then
              cuMemHostGetDevicePointer, through ctypes into libcuda on the primary context
              hetmem and PyTorch share: exactly the driver work hetmem.register does
  driver-xN   the same pages cut into N page-aligned pieces registered by N threads at once
              (--threads N; ctypes lets go of the GIL in foreign calls): whether the driver's
              pinning scales across threads, which hetmem's piecewise registration could use
  pin_memory  torch.from_numpy(array).pin_memory()
Each registration is undone (untimed) before the next. The medians, their ratios, every
sample, and how much of the array transparent huge pages back (AnonHugePages, which changes
what pinning costs) go to stdout as JSON. The registered view is checked to hold the bytes.

    python3 bench/peers/register_vs_pin.py --gib 1
"""

import argparse
import concurrent.futures
import ctypes
import json
import statistics
import time

import numpy as np
import torch

import hetmem

# CU_MEMHOSTREGISTER_DEVICEMAP: what hetmem.register passes (mapped=True, portable=False).
DEVICEMAP = 0x02


class Driver:
    """cuMemHostRegister and friends from libcuda, on device 0's primary context."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        lib = self.lib
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        self.check(lib.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "cuDevicePrimaryCtxRetain")

    @staticmethod
    def check(result, call):
        if result != 0:
            raise RuntimeError(f"{call} failed: CUresult {result}")

    def register(self, address, nbytes):
        """Registers and maps the range; returns its device address."""
        lib = self.lib
        self.check(lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.check(lib.cuMemHostRegister_v2(address, nbytes, DEVICEMAP), "cuMemHostRegister")
        device = ctypes.c_uint64()
        self.check(lib.cuMemHostGetDevicePointer_v2(ctypes.byref(device), address, 0), "cuMemHostGetDevicePointer")
        return device.value

    def unregister(self, address):
        self.check(self.lib.cuMemHostUnregister(address), "cuMemHostUnregister")


def covering_pages(array):
    """The page-aligned range hetmem registers for the array: its covering pages."""
    page = hetmem.page_size
    address = array.ctypes.data
    first = address - address % page
    end = -(-(address + array.nbytes) // page) * page
    return first, end - first


def huge_page_fraction(array):
    """The share of the array's mapping that transparent huge pages back (from smaps)."""
    address = array.ctypes.data
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024 / array.nbytes
    return 0.0


def pieces(first, span, count):
    """`count` page-aligned (address, length) pieces covering [first, first + span)."""
    page = hetmem.page_size
    step = -(-span // count // page) * page
    return [(first + offset, min(step, span - offset)) for offset in range(0, span, step)]


def huge_page_mode():
    """The machine's transparent huge page setting (the bracketed word), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            text = setting.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip()


def time_ms(action):
    start = time.perf_counter()
    result = action()
    return (time.perf_counter() - start) * 1e3, result


def hetmem_once(array, probe):
    elapsed, buf = time_ms(lambda: hetmem.register(array))
    assert np.array_equal(buf.numpy()[probe], array[probe]), "the registered view differs"
    del buf  # unregisters
    return elapsed


def driver_once(driver, array):
    first, span = covering_pages(array)
    elapsed, device_ptr = time_ms(lambda: driver.register(first, span))
    assert device_ptr != 0
    driver.unregister(first)
    return elapsed


def parallel_once(driver, threads, array, count):
    parts = pieces(*covering_pages(array), count)
    elapsed, device_ptrs = time_ms(lambda: list(threads.map(lambda part: driver.register(*part), parts)))
    assert all(device_ptrs)
    for address, _ in parts:
        driver.unregister(address)
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=4, help="threads (and pieces) of the driver-xN timing")
    args = parser.parse_args()
    if hetmem.device().backend != "cuda":
        raise SystemExit(f"register_vs_pin.py needs a GPU: {hetmem.device().fallback_reason}")
    nbytes = int(args.gib * (1 << 30))
    rng = np.random.default_rng()
    driver = Driver()
    parallel_name = f"driver-x{args.threads}"
    samples = {"hetmem": [], "driver": [], parallel_name: [], "pin_memory": []}
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=args.threads)
    huge = []
    for repeat in range(args.repeats):
        array = rng.integers(0, 255, size=nbytes, dtype=np.uint8)
        huge.append(huge_page_fraction(array))
        probe = rng.integers(0, nbytes, size=64)
        order = [("hetmem", hetmem_once, (array, probe)), ("driver", driver_once, (driver, array)),
                 (parallel_name, parallel_once, (driver, threads, array, args.threads))]
        for name, once, arguments in order if repeat % 2 == 0 else reversed(order):
            samples[name].append(once(*arguments))
        del order  # it holds the array
        tensor = torch.from_numpy(array)
        elapsed, pinned = time_ms(tensor.pin_memory)
        samples["pin_memory"].append(elapsed)
        del pinned, tensor, array
    median = {name: statistics.median(values) for name, values in samples.items()}
    print(json.dumps({
        "bytes": nbytes,
        "register_ms": median["hetmem"],
        "driver_register_ms": median["driver"],
        "pin_memory_ms": median["pin_memory"],
        "speedup_vs_pin_memory": median["pin_memory"] / median["hetmem"],
        "driver_share_of_register": median["driver"] / median["hetmem"],
        "driver_speedup_vs_pin_memory": median["pin_memory"] / median["driver"],
        "threads": args.threads,
        "driver_parallel_register_ms": median[parallel_name],
        "driver_parallel_speedup_vs_pin_memory": median["pin_memory"] / median[parallel_name],
        "huge_page_mode": huge_page_mode(),
        "huge_page_fraction": huge,
        "register_all_ms": samples["hetmem"],
        "driver_all_ms": samples["driver"],
        "driver_parallel_all_ms": samples[parallel_name],
        "pin_memory_all_ms": samples["pin_memory"],
    }))


if __name__ == "__main__":
    main()
