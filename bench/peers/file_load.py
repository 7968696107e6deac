#!/usr/bin/env python3
"""Peers for `hetmem bench file` / `hetmem load`: a safetensors file from storage into GPU memory.

Each peer loads every tensor of one safetensors file into device memory; the time runs from
opening the file to the last byte on the GPU (device synchronised). GB/s is the file's size over
that time (10^9 bytes). Cold runs evict the file from the page cache first (drop_caches when
root, else posix_fadvise(DONTNEED), which frees a file's clean pages without root); warm runs
read the file once beforehand.

Peers (each skipped with a reason when its package is missing):
  numpy_pinned     numpy memmap -> two 256 MiB pinned torch buffers, alternating, -> cuda
                   (non_blocking copies on one stream), one tensor per byte range; one thread
  safetensors      safetensors.safe_open(path, "pt", device="cuda"), every tensor
  kvikio           kvikio.CuFile.pread into one cupy device allocation (compatibility mode
                   when GPUDirect Storage is absent), --threads threads
  fastsafetensors  SafeTensorsFileLoader(nogds=True, max_threads) -> copy_files_to_device
  runai            runai_model_streamer.SafetensorsStreamer (RUNAI_STREAMER_CONCURRENCY set to
                   --threads) -> each tensor .to("cuda")

Every peer's result is checked: a sample of tensors (first, middle, last) is compared byte for
byte with the file read through numpy; a mismatch exits with an error.

    file_load.py --file model.safetensors [--peers a,b] [--cold N] [--warm N] [--json OUT]
    file_load.py --make model.safetensors --gib 8      (a random file with Llama-style shapes)
"""

import argparse
import json
import mmap
import os
import struct
import sys
import time

import numpy as np

GIB, MIB = 1 << 30, 1 << 20
# Reader threads for the peers that take a number (KvikIO, fastsafetensors, Run:ai): --threads.
THREADS = 16

# Llama-3-8B's tensor shapes (bf16); repeated layers until the target size.
EMBED = ("model.embed_tokens.weight", (128256, 4096))
LAYER = [
    ("self_attn.q_proj.weight", (4096, 4096)),
    ("self_attn.k_proj.weight", (1024, 4096)),
    ("self_attn.v_proj.weight", (1024, 4096)),
    ("self_attn.o_proj.weight", (4096, 4096)),
    ("mlp.gate_proj.weight", (14336, 4096)),
    ("mlp.up_proj.weight", (14336, 4096)),
    ("mlp.down_proj.weight", (4096, 14336)),
    ("input_layernorm.weight", (4096,)),
    ("post_attention_layernorm.weight", (4096,)),
]


def model_shapes(target_bytes):
    """(name, shape) in file order, Llama-style, until the bf16 total reaches target_bytes."""
    out, total, layer = [EMBED], 2 * EMBED[1][0] * EMBED[1][1], 0
    while total < target_bytes:
        for name, shape in LAYER:
            out.append((f"model.layers.{layer}.{name}", shape))
            total += 2 * int(np.prod(shape))
        layer += 1
    return out


def make_file(path, gib):
    """Writes a safetensors file of about `gib` GiB: Llama-style bf16 tensors, random bytes."""
    shapes = model_shapes(int(gib * GIB))
    header, offset = {}, 0
    for name, shape in shapes:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    block = np.random.default_rng(2026).integers(0, 2**63, size=64 * MIB // 8, dtype=np.uint64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        written, chunk = 0, 0
        while written < offset:
            # A different pattern per 64 MiB block, never zeros.
            data = (block ^ np.uint64(0x9E3779B97F4A7C15 * (chunk + 1) % 2**64)).view(np.uint8)
            n = min(len(data), offset - written)
            f.write(data[:n].tobytes())
            written, chunk = written + n, chunk + 1
    print(f"wrote {path}: {len(shapes)} tensors, {(8 + len(text) + offset) / GIB:.2f} GiB", file=sys.stderr)


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def evict(path):
    """Drops the file from the page cache; says how."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            os.sync()
            f.write("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise_dontneed"


def warm(path):
    """Reads the file once so the page cache holds it."""
    buf = bytearray(64 * MIB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def sample_names(header):
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    return [names[0], names[len(names) // 2], names[-1]]


def check(path, base, header, tensors):
    """Compares a sample of the loaded tensors (name -> torch cuda tensor) with the file."""
    import torch

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for name in sample_names(header):
            lo, hi = header[name]["data_offsets"]
            want = np.frombuffer(m, dtype=np.uint8, count=hi - lo, offset=base + lo).copy()
            got = tensors[name].contiguous().view(torch.uint8).reshape(-1).cpu().numpy()
            if not np.array_equal(want, got):
                sys.exit(f"file_load.py: {name} differs from the file")


def peer_numpy_pinned(path, base, header):
    import torch

    staging = [torch.empty(256 * MIB, dtype=torch.uint8).pin_memory() for _ in range(2)]
    done = [None, None]
    stream = torch.cuda.Stream()
    total = os.path.getsize(path) - base
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=base, shape=(total,))
    device = torch.empty(total, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(stream):
        for i, lo in enumerate(range(0, total, 256 * MIB)):
            slot, n = i % 2, min(256 * MIB, total - lo)
            if done[slot] is not None:
                done[slot].synchronize()
            staging[slot][:n].numpy()[:] = data[lo : lo + n]
            device[lo : lo + n].copy_(staging[slot][:n], non_blocking=True)
            done[slot] = torch.cuda.Event()
            done[slot].record(stream)
    stream.synchronize()
    return {name: device[t["data_offsets"][0] : t["data_offsets"][1]] for name, t in header.items()}


def peer_safetensors(path, base, header):
    from safetensors import safe_open

    with safe_open(path, "pt", device="cuda") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def peer_kvikio(path, base, header):
    import cupy as cp
    import kvikio
    import torch

    import kvikio.defaults

    kvikio.defaults.set("num_threads", THREADS)
    total = os.path.getsize(path) - base
    device = cp.empty(total, dtype=cp.uint8)
    with kvikio.CuFile(path, "r") as f:
        f.pread(device, total, base).get()
    cp.cuda.runtime.deviceSynchronize()
    as_torch = torch.as_tensor(device, device="cuda")
    return {name: as_torch[t["data_offsets"][0] : t["data_offsets"][1]] for name, t in header.items()}


def peer_fastsafetensors(path, base, header):
    from fastsafetensors import SafeTensorsFileLoader

    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True, max_threads=THREADS)
    loader.add_filenames({0: [path]})
    buffers = loader.copy_files_to_device()
    tensors = {name: buffers.get_tensor(name) for name in header}
    return tensors


def peer_runai(path, base, header):
    from runai_model_streamer import SafetensorsStreamer

    os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(THREADS)
    out = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(path)
        for name, tensor in streamer.get_tensors():
            out[name] = tensor.to("cuda", non_blocking=True)
    return out


PEERS = {
    "numpy_pinned": peer_numpy_pinned,
    "safetensors": peer_safetensors,
    "kvikio": peer_kvikio,
    "fastsafetensors": peer_fastsafetensors,
    "runai": peer_runai,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file")
    parser.add_argument("--make", help="write a random Llama-shaped safetensors file here and exit")
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--cold", type=int, default=1, help="cold runs per peer")
    parser.add_argument("--warm", type=int, default=2, help="warm runs per peer")
    parser.add_argument("--threads", type=int, default=16, help="reader threads where a peer takes a number")
    parser.add_argument("--json")
    args = parser.parse_args()
    global THREADS
    THREADS = args.threads
    if args.make:
        make_file(args.make, args.gib)
        return
    if not args.file:
        parser.error("--file or --make is required")

    import torch

    if not torch.cuda.is_available():
        sys.exit("file_load.py: no CUDA device: these peers load into GPU memory")
    size = os.path.getsize(args.file)
    base, header = read_header(args.file)
    rows, skipped = [], {}
    for name in args.peers.split(","):
        peer = PEERS[name]
        for cache, runs in (("cold", args.cold), ("warm", args.warm)):
            for run in range(runs):
                how = evict(args.file) if cache == "cold" else (warm(args.file) or "read_before")
                torch.cuda.synchronize()
                start = time.perf_counter()
                try:
                    tensors = peer(args.file, base, header)
                    torch.cuda.synchronize()
                except ImportError as error:
                    skipped[name] = f"not installed: {error}"
                    break
                seconds = time.perf_counter() - start
                check(args.file, base, header, tensors)
                del tensors
                torch.cuda.empty_cache()
                row = {"peer": name, "cache": cache, "how": how, "run": run, "bytes": size,
                       "seconds": seconds, "gb_per_s": size / seconds / 1e9}
                rows.append(row)
                print(f"{name:16} {cache} {seconds:8.3f} s {row['gb_per_s']:7.2f} GB/s ({how})", file=sys.stderr)
            if name in skipped:
                print(f"{name:16} skipped: {skipped[name]}", file=sys.stderr)
                break
    report = {"file": args.file, "bytes": size, "tensors": len(header), "threads": THREADS, "rows": rows,
              "skipped": skipped}
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
