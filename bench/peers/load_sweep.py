"""Where hetmem.load's warm rate goes: one call sweeps hetmem.load's threads and chunk size,
KvikIO's threads and task size, and measures the two halves of a staged load apart (page cache
into pinned memory by N threads, no GPU; pinned memory to the device, one stream), so the rates
sit beside their ceilings of the same run.

    python3 bench/peers/load_sweep.py --dir /tmp/ck8 [--reps 3] [--json out.json]

The checkpoint is one written by python_load.py --make; it is read once first (warm).
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_load import INDEX, headers, warm  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def timed(run, reps):
    """`run` returns (bytes, what to drop): the drop (freeing the result) is not timed."""
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        nbytes, result = run()
        rates.append(nbytes / (time.perf_counter() - start) / 1e9)
        del result
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "reps": rates}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", default="4,8,12,16,24")
    parser.add_argument("--chunks-mib", default="4,8,16")
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch
    import hetmem

    shards = headers(args.dir)
    paths = [path for path, _, _ in shards]
    for path in paths:
        warm(path)
    total = sum(os.path.getsize(p) for p in paths)
    threads = [int(t) for t in args.threads.split(",")]
    chunks = [int(c) * MIB for c in args.chunks_mib.split(",")]
    results = {"bytes": total, "cpus": os.cpu_count()}

    # The link: pinned to device, one stream, 1 GiB.
    host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True).random_()
    dev = torch.empty(GIB, dtype=torch.uint8, device="cuda")

    def h2d():
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        return GIB, None
    h2d()
    results["link_h2d"] = timed(h2d, 5)
    print(f"link H2D (torch, 1 GiB pinned): {results['link_h2d']['median']:.1f} GB/s", flush=True)

    # Page cache into pinned memory, N threads, 8 MiB preads, no GPU (the CPU half's ceiling).
    view = memoryview(host.numpy())
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    pieces = []
    for fd, p in zip(fds, paths):
        size = os.path.getsize(p)
        pieces += [(fd, off, min(8 * MIB, size - off)) for off in range(0, size, 8 * MIB)]
    slots = GIB // (8 * MIB)
    results["pread_pinned"] = {}
    for n in threads:
        def reads():
            def one(i):
                fd, off, length = pieces[i]
                at = (i % slots) * 8 * MIB
                return os.preadv(fd, [view[at:at + length]], off)
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                return sum(pool.map(one, range(len(pieces)))), None
        results["pread_pinned"][n] = timed(reads, args.reps)
        print(f"pread into pinned, {n} threads: {results['pread_pinned'][n]['median']:.1f} GB/s", flush=True)
    for fd in fds:
        os.close(fd)
    del host, dev, view
    torch.cuda.empty_cache()

    index = os.path.join(args.dir, INDEX)
    results["hetmem"] = {}
    for n, chunk in [(None, None)] + [(n, c) for n in threads for c in chunks]:
        def load():
            loaded = hetmem.load(index, device="cuda", threads=n, chunk_bytes=chunk, progress=False)
            torch.cuda.synchronize()
            load.own.append(loaded.report.gb_per_s)
            return loaded.report.bytes, loaded
        load.own = []
        cell = timed(load, args.reps)
        cell["own_gb_per_s"] = load.own
        label = "default" if n is None else f"{n}x{chunk // MIB}MiB"
        results["hetmem"][label] = cell
        print(f"hetmem.load {label}: {cell['median']:.1f} GB/s "
              f"(own report {statistics.median(load.own):.1f})", flush=True)

    try:
        import cupy as cp
        import kvikio
        import kvikio.defaults
    except ImportError as error:
        print(f"KvikIO: not run ({error})")
    else:
        results["kvikio"] = {}
        for n in threads:
            for task in (4 * MIB, 16 * MIB):
                kvikio.defaults.set("num_threads", n)
                kvikio.defaults.set("task_size", task)
                def load():
                    device = cp.empty(total, dtype=cp.uint8)
                    at, futures, files = 0, [], [kvikio.CuFile(p, "r") for p in paths]
                    for f, p in zip(files, paths):
                        size = os.path.getsize(p)
                        futures.append(f.pread(device[at:at + size], size, 0))
                        at += size
                    for fut in futures:
                        fut.get()
                    for f in files:
                        f.close()
                    cp.cuda.runtime.deviceSynchronize()
                    return total, device
                cell = timed(load, args.reps)
                results["kvikio"][f"{n}x{task // MIB}MiB"] = cell
                print(f"KvikIO threads={n} task={task // MIB} MiB: {cell['median']:.1f} GB/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
