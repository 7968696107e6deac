"""Host memory of one process to device memory of another and back, through hetmem.nixl
(VRAM_SEG over UCX), against PyTorch's pinned copy (``.to('cuda')`` and back) in the same run.

    UCX_TLS=cuda_copy,cuda_ipc,sm,self python3 nixl_vram.py --ucx-none [--reps 5] [--json]

The other process loads a file of random bytes (``hetmem.load``, to the GPU) and registers the
allocation; this one writes fresh random bytes from pinned host memory into it (host -> device)
and reads it into poisoned pinned host memory (device -> host), 1 MiB to 1 GiB, each timed
from posting to NIXL's completion, and each checked byte for byte (a write by reading it
back, untimed). ``--ucx-none`` starts UCX with ``ucx_error_handling_mode=none``, which the
CUDA and shared-memory transports need (set UCX_TLS yourself, before the run). ``--device cpu``
runs the same over host memory (no GPU: a check of the script, not of the link).

Prints a line a size (GB/s: 10^9 bytes a second, the median of ``--reps``), or with ``--json``
one JSON document: the settings and a row a size.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

import numpy as np

MiB = 1 << 20
POISON = 0xA5


def write_checkpoint(path: str, nbytes: int) -> None:
    """A safetensors file of one U8 tensor of ``nbytes`` random bytes."""
    header = json.dumps({"data": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    rng = np.random.default_rng()
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(header)) + header)
        for start in range(0, nbytes, 64 * MiB):
            file.write(rng.integers(0, 256, min(64 * MiB, nbytes - start), dtype=np.uint8).tobytes())


def params_of(ucx_none: bool) -> Optional[Dict[str, Dict[str, str]]]:
    return {"UCX": {"ucx_error_handling_mode": "none"}} if ucx_none else None


def serve(name: str, path: str, device: str, ucx_none: bool, commands: Any, replies: Any) -> None:
    """The device side: loads ``path`` to ``device``, registers it, then for each command lends
    it to the parent's write (``expect``) or shares it with its read (``offer``) until the
    parent's notification."""
    import hetmem
    import hetmem.nixl as hn

    try:
        agent = hn.Agent(name, params=params_of(ucx_none))
        loaded = hetmem.load(path, device, progress=False)
        registration = agent.register(loaded)
        parent_name, parent_metadata = commands.get(timeout=300)
        agent.add_peer(parent_metadata)
        replies.put(("ready", (agent.metadata(), registration.remote(), registration.kind)))
        while True:
            command, notification = commands.get(timeout=600)
            if command == "stop":
                break
            use = (agent.expect if command == "expect" else agent.offer)(registration, parent_name, notification)
            replies.put(("ok", None))
            use.wait(timeout=600)
        replies.put(("done", None))
    except BaseException as error:  # the parent reports it
        replies.put(("error", f"{type(error).__name__}: {error}"))


def reply(replies: Any, expected: str) -> Any:
    status, value = replies.get(timeout=600)
    if status != expected:
        raise SystemExit(f"the device process: {status}: {value}")
    return value


def torch_rates(nbytes: int, reps: int) -> Optional[Dict[str, float]]:
    """PyTorch's pinned copies, host -> device (``.to('cuda')``) and back (``copy_`` into
    pinned memory), median GB/s, each checked; None without PyTorch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).pin_memory()
    back = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    times: Dict[str, List[float]] = {"h2d": [], "d2h": []}
    for rep in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        gpu = host.to("cuda")
        torch.cuda.synchronize()
        h2d = time.perf_counter() - start
        back.fill_(POISON)
        start = time.perf_counter()
        back.copy_(gpu)  # synchronous: pinned destination, default stream
        torch.cuda.synchronize()
        d2h = time.perf_counter() - start
        if not torch.equal(back, host):
            raise SystemExit(f"torch: {nbytes} bytes came back changed")
        if rep:  # the first is a warm-up
            times["h2d"].append(h2d)
            times["d2h"].append(d2h)
        del gpu
    return {key: round(nbytes / statistics.median(value) / 1e9, 3) for key, value in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ucx-none", action="store_true", help="ucx_error_handling_mode=none")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-mib", type=int, default=1024, help="the largest size (sizes go x4 from 1 MiB)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dir", default=None, help="where the file the device side loads is written")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.reps < 1 or args.max_mib < 1:
        parser.error("--reps and --max-mib must be at least 1")

    import hetmem
    import hetmem.nixl as hn
    from hetmem.nixl._errors import _nixl

    sizes = [MiB << shift for shift in range(0, 31, 2) if (MiB << shift) <= args.max_mib * MiB]
    largest = sizes[-1]
    rng = np.random.default_rng()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        path = os.path.join(scratch, "bench.safetensors")
        write_checkpoint(path, largest)
        tag = uuid.uuid4().hex[:6]
        agent = hn.Agent(f"host-{tag}", params=params_of(args.ucx_none))
        source, destination = hetmem.pinned(largest), hetmem.pinned(largest)
        context = multiprocessing.get_context("spawn")
        commands, replies = context.Queue(), context.Queue()
        child = context.Process(target=serve, args=(f"device-{tag}", path, args.device, args.ucx_none,
                                                    commands, replies))
        child.start()
        rows = []
        try:
            commands.put((agent.name, agent.metadata()))
            metadata, region, kind = reply(replies, "ready")
            agent.add_peer(metadata)
            notes = iter(range(1 << 62))

            for nbytes in sizes:
                # The host memory is allocated once, at the largest size; each size registers
                # its first bytes (a view sharing the hand-off) and moves them.
                part = region.part(0, nbytes)
                small_source = hetmem.Buffer(source._memory, (nbytes,), np.uint8, keep=source)
                small_destination = hetmem.Buffer(destination._memory, (nbytes,), np.uint8, keep=destination)
                source_part, destination_part = agent.register(small_source), agent.register(small_destination)
                times: Dict[str, List[float]] = {"h2d": [], "d2h": []}
                for rep in range(args.reps + 1):
                    small_source.numpy()[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
                    for operation, local, key in (("write", source_part, "h2d"), ("read", destination_part, "d2h")):
                        small_destination.numpy()[:] = POISON
                        note = f"{operation} {next(notes)}".encode()
                        commands.put(("expect" if operation == "write" else "offer", note))
                        reply(replies, "ok")
                        start = time.perf_counter()
                        (agent.write if operation == "write" else agent.read)(local, part, notify=note).wait()
                        elapsed = time.perf_counter() - start
                        if operation == "write":
                            # Checked by reading it back, untimed (the timed read below does it again).
                            note = f"check {next(notes)}".encode()
                            commands.put(("offer", note))
                            reply(replies, "ok")
                            agent.read(destination_part, part, notify=note).wait()
                        if not np.array_equal(small_destination.numpy(), small_source.numpy()):
                            raise SystemExit(f"{operation} of {nbytes} bytes: the bytes came back changed")
                        if rep:  # the first is a warm-up
                            times[key].append(elapsed)
                source_part.close()
                destination_part.close()
                row: Dict[str, Any] = {"MiB": nbytes // MiB}
                for key, value in times.items():
                    row[f"nixl_{key}_GBps"] = round(nbytes / statistics.median(value) / 1e9, 3)
                baseline = torch_rates(nbytes, args.reps) if args.device == "cuda" else None
                for key in ("h2d", "d2h"):
                    row[f"torch_{key}_GBps"] = None if baseline is None else baseline[key]
                rows.append(row)
                if not args.json:
                    print(f"{row['MiB']:>5} MiB  nixl h2d {row['nixl_h2d_GBps']:>7} GB/s  d2h "
                          f"{row['nixl_d2h_GBps']:>7} GB/s   torch h2d {row['torch_h2d_GBps']} d2h "
                          f"{row['torch_d2h_GBps']}", flush=True)
            commands.put(("stop", None))
            reply(replies, "done")
        finally:
            child.join(timeout=120)
            if child.is_alive():
                child.kill()
    settings = {"nixl": _nixl().__name__, "device_memory": kind, "backend": hetmem.device().backend,
                "UCX_TLS": os.environ.get("UCX_TLS"),
                "ucx_error_handling_mode": "none" if args.ucx_none else "peer", "reps": args.reps,
                "checked": "every byte"}
    if args.json:
        json.dump({"settings": settings, "rows": rows}, sys.stdout, indent=1)
        print()
    else:
        print(json.dumps(settings))


if __name__ == "__main__":
    main()
