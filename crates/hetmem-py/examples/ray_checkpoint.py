#!/usr/bin/env python3
"""A checkpoint shared by two Ray actors: each loads its half with ``hetmem.load`` and hands its
tensors to the other through Ray's direct tensor transport over NIXL, every byte checked.

A local Ray cluster (``ray.init()``) with two actors. Actor ``k`` loads the tensors of the
checkpoint whose index is ``k`` modulo 2 (``hetmem.load(path, device, names=...)``: into one
allocation, on the GPU where there is one, else in host memory), and returns them from a method
marked ``@ray.method(tensor_transport="nixl")``: Ray moves them by NIXL from one actor's memory
into the other's, not through its object store. The other actor compares every tensor it
receives with its own read of the file (safetensors), and says how long the hand-over took.

    python3 ray_checkpoint.py [--checkpoint PATH | --make-mib N] [--device cpu|cuda] [--json]

Needs ``ray`` (2.49 or newer: ``enable_tensor_transport``), ``torch``, ``safetensors``, hetmem,
and NIXL's ``nixl`` package (``pip install nixl-cu13==1.5.1 && pip install --no-deps
nixl==1.5.1``: Ray imports ``nixl._api``). On a machine without RDMA give UCX tcp beside shared
memory (``UCX_TLS=tcp,sm,self``, or leave it unset): NIXL refuses ``sm,self`` alone, which cannot
tell a dead peer. Every ``UCX_*`` and ``NIXL_*`` variable is passed on to the actors.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def make_checkpoint(path: str, mib: int, seed: int) -> None:
    """A checkpoint of 8 random uint8 and float32 tensors, about ``mib`` MiB in all."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    each = max(1, (mib << 20) // 8)
    tensors = {}
    for index in range(8):
        if index % 2:
            tensors[f"layers.{index}.weight"] = rng.standard_normal(each // 4, dtype=np.float32).reshape(-1, 4)
        else:
            tensors[f"layers.{index}.bias"] = rng.integers(0, 256, each, dtype=np.uint8)
    save_file(tensors, path)


def names_of(path: str):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as file:
        return sorted(file.keys())


def actor_class(ray):
    @ray.remote(enable_tensor_transport=True)  # the receiver's side of the transport needs it
    class CheckpointPart:
        def __init__(self, path: str, rank: int, device: str):
            import hetmem

            self.path, self.rank, self.device = path, rank, device
            names = [name for index, name in enumerate(names_of(path)) if index % 2 == rank]
            start = time.perf_counter()
            self.loaded = hetmem.load(path, device, names=names, progress=False)
            self.load_seconds = time.perf_counter() - start
            self.tensors = dict(self.loaded)

        def loaded_report(self) -> dict:
            return {"rank": self.rank, "tensors": len(self.tensors), "bytes": self.loaded.nbytes,
                    "load_s": round(self.load_seconds, 4), "device": str(next(iter(self.tensors.values())).device)}

        @ray.method(tensor_transport="nixl")
        def part(self):
            return self.tensors

        def receive(self, tensors: dict, sent_at: float) -> dict:
            """Checks every tensor received against this actor's own read of the file."""
            import torch
            from safetensors.torch import load_file

            arrived = time.time() - sent_at
            want = load_file(self.path)
            wrong = [name for name, tensor in tensors.items()
                     if not torch.equal(tensor.cpu(), want[name])]
            return {"rank": self.rank, "received": sorted(tensors), "wrong": wrong,
                    "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                    "devices": sorted({str(t.device) for t in tensors.values()}),
                    "handover_s": round(arrived, 4)}

    return CheckpointPart


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a .safetensors file (default: make one)")
    parser.add_argument("--make-mib", type=int, default=64, help="size of the checkpoint made (MiB)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda where torch sees a GPU)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    import ray
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    with tempfile.TemporaryDirectory() as folder:
        path = args.checkpoint
        if path is None:
            path = os.path.join(folder, "checkpoint.safetensors")
            make_checkpoint(path, args.make_mib, seed)
        env = {k: v for k, v in os.environ.items() if k.startswith(("UCX_", "NIXL_"))}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env} if env else None)
        try:
            part = actor_class(ray)
            gpus = 0.5 if device == "cuda" else 0
            actors = [part.options(num_gpus=gpus).remote(path, rank, device) for rank in (0, 1)]
            loaded = ray.get([actor.loaded_report.remote() for actor in actors], timeout=300)
            sent_at = time.time()
            # Each actor's part goes to the other: Ray moves the tensors by NIXL, actor to actor.
            received = ray.get([actors[1 - rank].receive.remote(actors[rank].part.remote(), sent_at)
                                for rank in (0, 1)], timeout=300)
        finally:
            ray.shutdown()
    every = names_of(path) if args.checkpoint else None
    ok = all(not r["wrong"] for r in received) and sum(len(r["received"]) for r in received) == sum(
        l["tensors"] for l in loaded)
    result = {"ok": ok, "seed": seed, "device": device, "loaded": loaded, "received": received,
              "ray": ray.__version__, "UCX_TLS": os.environ.get("UCX_TLS")}
    if every is not None:
        result["tensors_in_file"] = len(every)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
