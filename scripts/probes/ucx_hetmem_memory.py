"""Probe: why NIXL's UCX moves hetmem's device memory at the emulated rate (about 1 GB/s) where
it moves PyTorch's device memory through cuda_ipc (hundreds of GB/s) between two processes.

Hypothesis: UCX's CUDA transports work on the calling thread's current CUDA context. PyTorch
leaves its primary context current on the thread that used it; hetmem pushes its context around
its own calls and pops it, so a thread that only used hetmem has no current context when NIXL
registers or moves the memory, and UCX falls back.

Two processes, device to device WRITE of 256 MiB (UCX_TLS=cuda_copy,cuda_ipc,sm,self), every
transfer checked byte for byte. Each side's buffer is one of:
  torch      a PyTorch CUDA tensor (its context current on the thread)
  hetmem     hetmem.load of a one-tensor safetensors file, no PyTorch CUDA call before NIXL
             registers it (so no context current, unless hetmem leaves one)
  hetmem+ctx the same, with the device's primary context made current first (ctypes)
Each line says whether a context was current on the thread at registration (cuCtxGetCurrent).

    python3 scripts/probes/ucx_hetmem_memory.py [SRC:DST ...]    (default: a matrix of five)
"""
import ctypes
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

NBYTES = 256 << 20
REPS = 5
os.environ.setdefault("UCX_TLS", "cuda_copy,cuda_ipc,sm,self")


def cuda_driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    return cuda


def current_context() -> bool:
    ctx = ctypes.c_void_p()
    assert cuda_driver().cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return bool(ctx.value)


def make_primary_current() -> None:
    cuda = cuda_driver()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0


def buffer(kind: str, folder: str):
    """(tensor, keep-alive) of NBYTES on the GPU by `kind`."""
    import torch
    if kind == "torch":
        return torch.empty(NBYTES, dtype=torch.uint8, device="cuda"), None
    import numpy as np
    import hetmem
    from safetensors.numpy import save_file
    path = os.path.join(folder, f"{kind}-{os.getpid()}.safetensors")
    save_file({"x": np.full(NBYTES, 7, dtype=np.uint8)}, path)
    if kind == "hetmem+ctx":
        make_primary_current()
    loaded = hetmem.load(path, "cuda", progress=False)
    return loaded["x"], loaded


def agent(name: str):
    from nixl_cu13 import nixl_agent, nixl_agent_config
    nixl = nixl_agent(name, nixl_agent_config(backends=[]))
    nixl.create_backend("UCX", {})
    return nixl


def register(nixl, tensor):
    had = current_context()
    nixl.register_memory([(tensor.data_ptr(), tensor.numel(), tensor.get_device(), "")], "VRAM")
    return had


def target(kind: str, folder: str, commands, replies) -> None:
    import torch
    nixl = agent("target")
    tensor, keep = buffer(kind, folder)
    had = register(nixl, tensor)
    replies.put((nixl.get_agent_metadata(), [(tensor.data_ptr(), NBYTES, tensor.get_device())], had))
    while True:
        command, seed = commands.get()
        if command == "poison":
            tensor.fill_(0xA5)
            torch.cuda.synchronize()
            replies.put(True)
        elif command == "check":
            expected = torch.randint(0, 256, (NBYTES,), dtype=torch.uint8,
                                     generator=torch.Generator().manual_seed(seed)).cuda()
            replies.put(bool(torch.equal(tensor, expected)))
        else:
            return


def pair(src: str, dst: str, folder: str) -> dict:
    import torch
    context = mp.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    peer = context.Process(target=target, args=(dst, folder, commands, replies))
    peer.start()
    try:
        nixl = agent("initiator")
        tensor, keep = buffer(src, folder)
        had_src = register(nixl, tensor)
        metadata, remote, had_dst = replies.get(timeout=120)
        name = nixl.add_remote_agent(metadata)
        local_descs = nixl.get_xfer_descs([(tensor.data_ptr(), NBYTES, tensor.get_device())], "VRAM")
        remote_descs = nixl.get_xfer_descs(remote, "VRAM")
        rates, ok = [], True
        for seed in range(300, 301 + REPS):
            data = torch.randint(0, 256, (NBYTES,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
            tensor.copy_(data.cuda())
            torch.cuda.synchronize()
            commands.put(("poison", 0))
            replies.get(timeout=60)
            handle = nixl.initialize_xfer("WRITE", local_descs, remote_descs, name, b"")
            start = time.perf_counter()
            state = nixl.transfer(handle)
            while state in ("PROC", "PENDING"):
                state = nixl.check_xfer_state(handle)
            elapsed = time.perf_counter() - start
            handle.release()
            commands.put(("check", seed))
            ok = ok and state == "DONE" and replies.get(timeout=60)
            rates.append(NBYTES / elapsed / 1e9)
        rates = sorted(rates[1:])
        return {"src": src, "dst": dst, "ctx_at_register": {"src": had_src, "dst": had_dst},
                "GBps_median": round(rates[len(rates) // 2], 2), "GBps": [round(r, 2) for r in rates],
                "bit_exact": ok}
    finally:
        commands.put(("stop", 0))
        peer.join(20)
        if peer.is_alive():
            peer.kill()


def main() -> None:
    pairs = sys.argv[1:] or ["torch:torch", "torch:hetmem", "torch:hetmem+ctx", "hetmem:torch", "hetmem+ctx:torch"]
    with tempfile.TemporaryDirectory() as folder:
        for text in pairs:
            src, dst = text.split(":")
            try:
                print(json.dumps(pair(src, dst, folder)), flush=True)
            except Exception as error:  # one pair's failure says what failed; the others still run
                print(json.dumps({"src": src, "dst": dst, "error": f"{type(error).__name__}: {error}"}), flush=True)


if __name__ == "__main__":
    main()
