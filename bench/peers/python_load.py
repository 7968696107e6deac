#!/usr/bin/env python3
"""`hetmem.load` against the Python peers: a sharded, Llama-shaped safetensors checkpoint into
GPU memory, warm (page cache) and cold (evicted), with the link's ceiling from the same run.

The checkpoint (``--make DIR --gib N``): Llama-3-8B-shaped bf16 tensors of random bytes (fixed
seed) in shards of about ``--shard-gib`` GiB, and ``model.safetensors.index.json``. Each load
runs from the first open to the last byte on the GPU (device synchronised); GB/s is the
tensors' bytes over that time (10^9). Cold runs evict every shard first (drop_caches when
root, else posix_fadvise(DONTNEED) per file); warm runs read every shard once before.

Loaders (each skipped, with the reason, when its package is missing):
  hetmem            hetmem.load(index, device="cuda", method=auto|staged|staged-direct)
  hetmem_cli        `hetmem load --json` on the shards (--cli PATH), the CLI's own rate
  safetensors       safetensors.torch.load_file(shard, device="cuda") per shard
  torch_pread       --threads threads, each preads 64 MiB pieces into two pinned buffers of
                    its own and copies them non_blocking on its own stream into one device
                    allocation (the careful PyTorch loop)
  fastsafetensors   SafeTensorsFileLoader(nogds=True) -> copy_files_to_device
  runai             runai_model_streamer.SafetensorsStreamer -> each tensor .to("cuda")
  kvikio            kvikio.CuFile.pread per shard into one CuPy allocation (threaded reads)
  hetmem_spread     hetmem.load(index, device_map="balanced"): a run of tensors per GPU present
  hetmem_every_gpu  the whole checkpoint onto every GPU present, a hetmem.load per GPU at once
                    (GB/s counts every GPU's bytes)
The link: a pinned 1 GiB torch tensor copied to the device (median of 5), in the same run; with
several GPUs, also one such copy to every GPU at once (the host-side limit they share).

Every loader's result is checked: the first, middle and last tensor of each shard compared byte
for byte with the file. Prints a JSON report (and writes it with --json).

    python_load.py --make /data/ckpt8 --gib 8
    python_load.py --dir /data/ckpt8 [--loaders a,b] [--cold 1] [--warm 3] [--cli ./hetmem] [--json OUT]
"""

import argparse
import json
import os
import queue
import statistics
import struct
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from file_load import GIB, MIB, evict, model_shapes, warm  # noqa: E402

INDEX = "model.safetensors.index.json"
PIECE = 64 * MIB


def make_checkpoint(folder, gib, shard_gib):
    """Writes the shards and the index: Llama-shaped bf16 tensors, random bytes, seed 2026."""
    os.makedirs(folder, exist_ok=True)
    shapes = model_shapes(int(gib * GIB))
    groups, current, size = [], [], 0
    for name, shape in shapes:
        current.append((name, shape))
        size += 2 * int(np.prod(shape))
        if size >= shard_gib * GIB:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    rng = np.random.default_rng(2026)
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {}, 0
        for name, shape in group:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(folder, file), "wb") as out:
            out.write(struct.pack("<Q", len(text)) + text)
            written = 0
            while written < offset:
                n = min(PIECE, offset - written)
                out.write(rng.integers(1, 256, n, dtype=np.uint8).tobytes())
                written += n
    with open(os.path.join(folder, INDEX), "w") as out:
        json.dump({"metadata": {"total_size": sum(2 * int(np.prod(s)) for _, s in shapes)},
                   "weight_map": weight_map}, out)
    print(f"wrote {folder}: {len(groups)} shards, {len(shapes)} tensors", file=sys.stderr)


def headers(folder):
    """Each shard: (path, data offset, header without metadata), in index order."""
    with open(os.path.join(folder, INDEX)) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = []
    for file in files:
        path = os.path.join(folder, file)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        out.append((path, 8 + n, header))
    return out


def check(shards, tensors):
    import torch

    for path, base, header in shards:
        names = sorted(header, key=lambda name: header[name]["data_offsets"][0])
        for name in {names[0], names[len(names) // 2], names[-1]}:
            lo, hi = header[name]["data_offsets"]
            want = np.fromfile(path, dtype=np.uint8, count=hi - lo, offset=base + lo)
            got = tensors[name].contiguous().view(-1).view(torch.uint8).cpu().numpy()
            if not np.array_equal(want, got):
                sys.exit(f"python_load.py: {name} of {path} differs from the file")


def loader_hetmem(method):
    def run(folder, shards, threads):
        import hetmem

        # hetmem's own default threads (the CPUs, at most 12), as a user calls it; --threads is
        # the peers' (their best settings were 16 on the H200 machine).
        loaded = hetmem.load(os.path.join(folder, INDEX), device="cuda", method=method, progress=False)
        return dict(loaded), {"method": loaded.report.method, "read_mode": loaded.report.read_mode,
                              "own_gb_per_s": loaded.report.gb_per_s}
    return run


def loader_hetmem_spread(folder, shards, threads):
    """The checkpoint spread over every GPU present (device_map="balanced"): each GPU reads and
    keeps its own run of tensors, all at once."""
    import hetmem

    loaded = hetmem.load(os.path.join(folder, INDEX), device_map="balanced", progress=False)
    return dict(loaded), {"devices": sorted(loaded.report.per_device),
                          "per_device_gb_per_s": {key: each.gb_per_s
                                                  for key, each in loaded.report.per_device.items()}}


def loader_hetmem_every_gpu(folder, shards, threads):
    """The whole checkpoint onto every GPU present, one load per GPU at once (what a user does
    without a device map): the rate counts every GPU's bytes. Only the first GPU's tensors are
    checked (the others are loads of the same bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    import hetmem

    gpus = [f"cuda:{ordinal}" for ordinal in range(len(hetmem.cuda_devices()))]
    with ThreadPoolExecutor(len(gpus)) as pool:
        loads = list(pool.map(lambda gpu: hetmem.load(os.path.join(folder, INDEX), device=gpu, progress=False),
                              gpus))
    return dict(loads[0]), {"devices": gpus, "bytes_counted": "every GPU's",
                            "copies": len(gpus), "per_device_gb_per_s": {gpu: each.report.gb_per_s
                                                                         for gpu, each in zip(gpus, loads)}}


def loader_safetensors(folder, shards, threads):
    from safetensors.torch import load_file

    out = {}
    for path, _, _ in shards:
        out.update(load_file(path, device="cuda"))
    return out, {}


def loader_torch_pread(folder, shards, threads):
    import torch

    total = sum(os.path.getsize(path) - base for path, base, _ in shards)
    device = torch.empty(total, dtype=torch.uint8, device="cuda")
    work, at = queue.Queue(), 0
    places = []
    for path, base, header in shards:
        length = os.path.getsize(path) - base
        for lo in range(0, length, PIECE):
            work.put((path, base + lo, at + lo, min(PIECE, length - lo)))
        places.append((at, header))
        at += length
    failures = []

    def reader():
        try:
            stream = torch.cuda.Stream()
            buffers = [torch.empty(PIECE, dtype=torch.uint8).pin_memory() for _ in range(2)]
            events = [None, None]
            fds, slot = {}, 0
            while True:
                try:
                    path, offset, to, n = work.get_nowait()
                except queue.Empty:
                    break
                if events[slot] is not None:
                    events[slot].synchronize()
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY)
                fd = fds[path]
                view, got = memoryview(buffers[slot].numpy())[:n], 0
                while got < n:
                    got += os.preadv(fd, [view[got:]], offset + got)
                with torch.cuda.stream(stream):
                    device[to:to + n].copy_(buffers[slot][:n], non_blocking=True)
                    events[slot] = torch.cuda.Event()
                    events[slot].record(stream)
                slot ^= 1
            stream.synchronize()
            for fd in fds.values():
                os.close(fd)
        except BaseException as error:  # reported by the caller
            failures.append(error)

    workers = [threading.Thread(target=reader) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    out = {}
    for start, header in places:
        for name, t in header.items():
            lo, hi = t["data_offsets"]
            out[name] = device[start + lo:start + hi].view(torch.bfloat16).reshape(t["shape"])
    return out, {}


def loader_fastsafetensors(folder, shards, threads):
    from fastsafetensors import SafeTensorsFileLoader

    # Buffered reads, its documented switch: by default it opens local files O_DIRECT, which
    # reads storage on every load (1.3 GB/s warm in the last run, the same as cold).
    os.environ["FASTSAFETENSORS_ODIRECT"] = "0"
    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True, max_threads=threads)
    loader.add_filenames({0: [path for path, _, _ in shards]})
    buffers = loader.copy_files_to_device()
    return {name: buffers.get_tensor(name) for _, _, header in shards for name in header}, {}


def loader_runai(folder, shards, threads):
    from runai_model_streamer import SafetensorsStreamer

    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(threads)
    out = {}
    with SafetensorsStreamer() as streamer:
        paths = [path for path, _, _ in shards]
        if hasattr(streamer, "stream_files"):
            streamer.stream_files(paths)
        else:
            for path in paths[:-1]:
                streamer.stream_file(path)
                for name, tensor in streamer.get_tensors():
                    out[name] = tensor.to("cuda", non_blocking=True)
            streamer.stream_file(paths[-1])
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.to("cuda", non_blocking=True)
    return out, {}


def loader_kvikio(folder, shards, threads):
    import cupy as cp
    import kvikio
    import kvikio.defaults
    import torch

    kvikio.defaults.set("num_threads", threads)
    total = sum(os.path.getsize(path) - base for path, base, _ in shards)
    device = cp.empty(total, dtype=cp.uint8)
    futures, at, places = [], 0, []
    files = [kvikio.CuFile(path, "r") for path, _, _ in shards]
    for file, (path, base, header) in zip(files, shards):
        length = os.path.getsize(path) - base
        futures.append(file.pread(device[at:at + length], length, base))
        places.append((at, header))
        at += length
    for future in futures:
        future.get()
    for file in files:
        file.close()
    cp.cuda.runtime.deviceSynchronize()
    as_torch = torch.as_tensor(device, device="cuda")
    out = {}
    for start, header in places:
        for name, t in header.items():
            lo, hi = t["data_offsets"]
            out[name] = as_torch[start + lo:start + hi].view(torch.bfloat16).reshape(t["shape"])
    return out, {}


def loader_cli(cli, link):
    def run(folder, shards, threads):
        # The link rate given: the CLI would measure it again inside the timed run.
        command = [cli, "load", "--json", "--threads", str(threads), "--link-rate", f"{link:.3f}"]
        command += [path for path, _, _ in shards]
        report = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        return None, {"method": report.get("method"), "own_gb_per_s": report.get("gb_per_s"),
                      "link_gb_per_s": report.get("link_gb_per_s")}
    return run


def link_gb_per_s():
    """A pinned 1 GiB torch tensor copied to the device: the median of 5, GB/s."""
    import torch

    host = torch.empty(GIB, dtype=torch.uint8).pin_memory()
    device = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(GIB / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def link_all_gpus_gb_per_s():
    """The host-side limit the GPUs share: a pinned 1 GiB tensor per GPU, all copied to their
    devices at once, each on its own stream; the median of 5 of the summed rate, GB/s (None
    with one GPU)."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        return None
    hosts = [torch.empty(GIB, dtype=torch.uint8).pin_memory() for _ in range(count)]
    devices = [torch.empty(GIB, dtype=torch.uint8, device=f"cuda:{k}") for k in range(count)]
    streams = [torch.cuda.Stream(device=f"cuda:{k}") for k in range(count)]
    rates = []
    for _ in range(6):
        for k in range(count):
            torch.cuda.synchronize(k)
        start = time.perf_counter()
        for host, device, stream in zip(hosts, devices, streams):
            with torch.cuda.stream(stream):
                device.copy_(host, non_blocking=True)
        for stream in streams:
            stream.synchronize()
        rates.append(count * GIB / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir")
    parser.add_argument("--make", help="write a checkpoint of --gib GiB into this folder and exit")
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--shard-gib", type=float, default=4.0)
    parser.add_argument("--loaders", default="hetmem,hetmem_staged,hetmem_direct,hetmem_cli,safetensors,"
                        "torch_pread,fastsafetensors,runai,kvikio")
    parser.add_argument("--cold", type=int, default=1)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--cli", help="the hetmem binary, for the hetmem_cli loader")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.make:
        make_checkpoint(args.make, args.gib, args.shard_gib)
        return
    if not args.dir:
        parser.error("--dir or --make is required")
    import torch

    if not torch.cuda.is_available():
        sys.exit("python_load.py: no CUDA device: these loaders load into GPU memory")
    loaders = {
        "hetmem": loader_hetmem("auto"), "hetmem_staged": loader_hetmem("staged"),
        "hetmem_direct": loader_hetmem("staged-direct"), "safetensors": loader_safetensors,
        "torch_pread": loader_torch_pread, "fastsafetensors": loader_fastsafetensors, "runai": loader_runai,
        "kvikio": loader_kvikio, "hetmem_spread": loader_hetmem_spread,
        "hetmem_every_gpu": loader_hetmem_every_gpu,
    }
    shards = headers(args.dir)
    nbytes = sum(os.path.getsize(path) - base for path, base, _ in shards)
    link = link_gb_per_s()
    if args.cli:
        loaders["hetmem_cli"] = loader_cli(args.cli, link)
    print(f"link (pinned torch H2D, 1 GiB): {link:.1f} GB/s", file=sys.stderr)
    link_all = link_all_gpus_gb_per_s()
    if link_all is not None:
        print(f"all {torch.cuda.device_count()} GPUs at once (pinned torch H2D, 1 GiB each): {link_all:.1f} GB/s",
              file=sys.stderr)
    rows, skipped = [], {}
    for name in args.loaders.split(","):
        if name not in loaders:
            skipped[name] = "no --cli given" if name == "hetmem_cli" else "unknown loader"
            continue
        for cache, runs in (("cold", args.cold), ("warm", args.warm)):
            for run in range(runs):
                if cache == "cold":
                    how = [evict(path) for path, _, _ in shards][0]
                else:
                    for path, _, _ in shards:
                        warm(path)
                    how = "read_before"
                torch.cuda.synchronize()
                start = time.perf_counter()
                try:
                    tensors, extra = loaders[name](args.dir, shards, args.threads)
                    torch.cuda.synchronize()
                except ImportError as error:
                    skipped[name] = f"not installed: {error}"
                    break
                seconds = time.perf_counter() - start
                if tensors is not None:
                    check(shards, tensors)
                del tensors
                torch.cuda.empty_cache()
                rate = nbytes * extra.get("copies", 1) / seconds / 1e9
                rows.append({"loader": name, "cache": cache, "how": how, "run": run, "bytes": nbytes,
                             "seconds": seconds, "gb_per_s": rate, "of_link": rate / link, **extra})
                print(f"{name:16} {cache} {seconds:8.3f} s {rate:7.2f} GB/s ({rate / link:.0%} of the link)",
                      file=sys.stderr)
            if name in skipped:
                print(f"{name:16} skipped: {skipped[name]}", file=sys.stderr)
                break
    report = {"dir": args.dir, "bytes": nbytes, "shards": len(shards), "threads": args.threads,
              "link_gb_per_s": link, "link_all_gpus_gb_per_s": link_all, "gpus": torch.cuda.device_count(),
              "rows": rows, "skipped": skipped}
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
