#!/usr/bin/env python3
"""Probe: does registering a cached file's pages with the GPU scale with threads?

`hetmem load`'s windows method registers the page cache's pages in place (no CPU copy) and
reached about 8 GB/s warm on the H200, below the staged path's 40-49 GB/s. One thread
registers there. If `cuMemHostRegister` (read-only) of disjoint pieces ran in parallel at
several times one thread's rate, register-then-DMA could beat a CPU copy into staging.

Maps FILE read-only, then for each thread count T: T threads each register (READ_ONLY) and
unregister their own pieces of PIECE bytes, the whole file once; prints GB/s registered. Then,
at the best T, registers and copies each piece to device memory at once (cuMemcpyHtoD from
the registered pages, on the thread's own stream) and prints the end-to-end GB/s, against a
plain pinned-buffer copy of the same size (the link). Uses only the driver API through
ctypes (which lets go of the GIL in each call).

    python3 scripts/probes/register_parallel.py FILE [--piece-mib 64] [--threads 1,2,4,8,16]
"""

import argparse
import ctypes
import mmap
import os
import threading
import time

CU_MEMHOSTREGISTER_READ_ONLY = 0x08
cuda = ctypes.CDLL("libcuda.so.1")


def check(code, call):
    if code != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError(f"{call}: {name.value.decode() if name.value else code}")


def context():
    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def run_threads(threads, pieces, work):
    """Runs work(piece) for every piece, pieces dealt round-robin to `threads` threads."""
    errors = []

    def body(mine):
        try:
            check(cuda.cuCtxSetCurrent(CTX), "cuCtxSetCurrent")
            state = {}
            for piece in mine:
                work(piece, state)
            if "done" in state:
                state["done"]()
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    workers = [threading.Thread(target=body, args=(pieces[t::threads],)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def main():
    global CTX
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--piece-mib", type=int, default=64)
    parser.add_argument("--threads", default="1,2,4,8,16")
    args = parser.parse_args()
    CTX = context()
    size = os.path.getsize(args.file)
    piece = args.piece_mib << 20
    size -= size % piece
    # The mapping's address is needed (cuMemHostRegister takes it): mmap through libc.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(args.file, os.O_RDONLY)
    base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if base is None or base == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap")
    pieces = list(range(0, size, piece))
    print(f"{size / 2**30:.1f} GiB file, pieces of {args.piece_mib} MiB, {len(pieces)} pieces")

    def register_only(offset, state):
        address = ctypes.c_void_p(base + offset)
        check(cuda.cuMemHostRegister_v2(address, ctypes.c_size_t(piece), CU_MEMHOSTREGISTER_READ_ONLY),
              "cuMemHostRegister")
        check(cuda.cuMemHostUnregister(address), "cuMemHostUnregister")

    best = (0.0, 1)
    for threads in [int(t) for t in args.threads.split(",")]:
        seconds = run_threads(threads, pieces, register_only)
        rate = size / seconds / 1e9
        best = max(best, (rate, threads))
        print(f"register+unregister, {threads:2} threads: {rate:6.1f} GB/s ({seconds * 1e3 / len(pieces):.1f} ms per piece per thread-slot)",
              flush=True)

    device = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(device), ctypes.c_size_t(size)), "cuMemAlloc")

    def register_and_copy(offset, state):
        if "stream" not in state:
            stream = ctypes.c_void_p()
            check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
            state["stream"] = stream
            state["held"] = []

            def done():
                check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
                for address in state["held"]:
                    check(cuda.cuMemHostUnregister(address), "cuMemHostUnregister")
                check(cuda.cuStreamDestroy_v2(stream), "cuStreamDestroy")
            state["done"] = done
        address = ctypes.c_void_p(base + offset)
        check(cuda.cuMemHostRegister_v2(address, ctypes.c_size_t(piece), CU_MEMHOSTREGISTER_READ_ONLY),
              "cuMemHostRegister")
        check(cuda.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(device.value + offset), address, ctypes.c_size_t(piece),
                                        state["stream"]), "cuMemcpyHtoDAsync")
        state["held"].append(address)

    for threads in sorted({best[1], max(1, best[1] // 2), min(16, best[1] * 2)}):
        seconds = run_threads(threads, pieces, register_and_copy)
        print(f"register+copy to the GPU, {threads:2} threads: {size / seconds / 1e9:6.1f} GB/s end to end", flush=True)

    host = sum(ctypes.string_at(base + offset, 1)[0] for offset in pieces)
    copied = ctypes.create_string_buffer(1)
    device_sum = 0
    for offset in pieces:
        check(cuda.cuMemcpyDtoH_v2(copied, ctypes.c_uint64(device.value + offset), ctypes.c_size_t(1)), "cuMemcpyDtoH")
        device_sum += copied.raw[0]
    print(f"first byte of every piece: host sum {host}, device sum {device_sum} ({'match' if host == device_sum else 'MISMATCH'})")

    # The link: one pinned buffer of a piece, copied size / piece times.
    pinned = ctypes.c_void_p()
    check(cuda.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(piece)), "cuMemAllocHost")
    ctypes.memset(pinned, 0x5A, piece)
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    start = time.perf_counter()
    for offset in pieces:
        check(cuda.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(device.value + offset), pinned, ctypes.c_size_t(piece), None),
              "cuMemcpyHtoDAsync")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    print(f"link (pinned {args.piece_mib} MiB copies, same total): {size / (time.perf_counter() - start) / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
