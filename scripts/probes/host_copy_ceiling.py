"""The host's half of a staged load, alone: threads preadv a checkpoint's warm shards in 4 MiB
pieces into a ring of pinned memory (no GPU copy), for rings of a few sizes, so a staged load's
rate can be set against what the host's copy out of the page cache allows on its own. Also
splits `hetmem.load`'s wall time into the stream's own seconds and the rest.

    host_copy_ceiling.py --dir /tmp/ck8 [--threads 8,12,16] [--rings-mib 96,1024] [--json out.json]
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import time

MIB = 1 << 20


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 * MIB):
            pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--threads", default="8,12,16")
    parser.add_argument("--rings-mib", default="96,1024")
    parser.add_argument("--piece-mib", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    paths = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".safetensors"))
    for path in paths:
        warm(path)
    piece = args.piece_mib * MIB
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    pieces = [(fd, at, min(piece, os.path.getsize(p) - at))
              for fd, p in zip(fds, paths) for at in range(0, os.path.getsize(p), piece)]
    total = sum(length for _, _, length in pieces)
    results = {"bytes": total, "piece_mib": args.piece_mib, "host_copy": {}}
    for ring_mib in (int(r) for r in args.rings_mib.split(",")):
        ring = torch.empty(ring_mib * MIB, dtype=torch.uint8, pin_memory=True).random_()
        view = memoryview(ring.numpy())
        slots = ring_mib * MIB // piece
        for threads in (int(t) for t in args.threads.split(",")):
            def one(i):
                fd, at, length = pieces[i]
                slot = (i % slots) * piece
                return os.preadv(fd, [view[slot:slot + length]], at)
            rates = []
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                for _ in range(args.reps):
                    start = time.perf_counter()
                    done = sum(pool.map(one, range(len(pieces))))
                    rates.append(done / (time.perf_counter() - start) / 1e9)
            label = f"{threads} threads, {ring_mib} MiB ring"
            results["host_copy"][label] = {"median": statistics.median(rates), "reps": rates}
            print(f"page cache into pinned, {label}: {statistics.median(rates):.1f} GB/s "
                  f"({min(rates):.1f}-{max(rates):.1f})", flush=True)
        del view, ring
    for fd in fds:
        os.close(fd)

    import hetmem
    index = os.path.join(args.dir, "model.safetensors.index.json")
    rows = []
    for _ in range(args.reps + 1):
        start = time.perf_counter()
        loaded = hetmem.load(index, device="cuda", progress=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        report = loaded.report
        rows.append({"wall_s": wall, "stream_s": report.seconds, "gb_per_s_wall": report.bytes / wall / 1e9,
                     "gb_per_s_own": report.gb_per_s})
        print(f"hetmem.load: wall {wall * 1e3:.1f} ms, the stream's own {report.seconds * 1e3:.1f} ms, "
              f"the rest {(wall - report.seconds) * 1e3:.1f} ms ({report.bytes / wall / 1e9:.1f} / "
              f"{report.gb_per_s:.1f} GB/s)", flush=True)
        del loaded
    results["hetmem_load"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
