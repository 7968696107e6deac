"""NIXL on one machine: pinned host memory to device memory and back through NIXL's UCX
backend (and file to memory through GDS and POSIX), on plain PyTorch tensors, with a PyTorch
pinned copy in the same run as the link ceiling.

Every case runs in a subprocess of its own with a time limit (a UCX configuration can hang
rather than fail), and prints one JSON line. Every byte of every timed transfer is checked:
the destination is poisoned before the transfer, and compared with the source after it.

    python3 nixl_link.py explore            # configurations at 256 MiB, one and two processes
    python3 nixl_link.py sweep TLS MODE     # 1 MiB .. 1 GiB, two processes, one configuration
    python3 nixl_link.py variant TLS MODE [one|two] [h2d|d2h|both|d2d|h2d_staged|h2d_hetmem]
                                            # 256 MiB; UCX_* variables from the environment

NIXL_LINK_UCX_PARAMS='{"num_workers": "4"}' adds UCX backend parameters to every agent.

Needs torch with CUDA and the ``nixl_cu13`` package importable (PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
STARTED = time.perf_counter()
#: The driver starts no new case after this many seconds (device time is scarce).
BUDGET_S = float(os.environ.get("NIXL_LINK_BUDGET_S", "200"))
HERE = os.path.abspath(__file__)


def _torch():
    import torch
    return torch


def random_bytes(seed: int, nbytes: int):
    """The same fresh random bytes (on the GPU) in every process that asks with the same seed."""
    torch = _torch()
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator, device="cuda")


def link_ceiling(nbytes: int) -> dict:
    """PyTorch pinned copies, host to device and device to host (GB/s, best of 5)."""
    torch = _torch()
    host = random_bytes(1, nbytes).cpu().pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    result = {}
    for name, copy in (("h2d", lambda: device.copy_(host, non_blocking=True)),
                       ("d2h", lambda: host.copy_(device, non_blocking=True))):
        copy()
        torch.cuda.synchronize()
        best = 0.0
        for _ in range(5):
            start = time.perf_counter()
            copy()
            torch.cuda.synchronize()
            best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        result[name] = round(best, 2)
    assert torch.equal(host.cuda(), device)
    return result


def make_agent(name: str, mode: str, backends=("UCX",)):
    from nixl_cu13 import nixl_agent, nixl_agent_config
    agent = nixl_agent(name, nixl_agent_config(backends=[]))
    for backend in backends:
        params = {"ucx_error_handling_mode": mode} if backend == "UCX" and mode else {}
        if backend == "UCX":  # more UCX backend parameters (num_workers, ...) for a variant
            params.update(json.loads(os.environ.get("NIXL_LINK_UCX_PARAMS", "{}")))
        agent.create_backend(backend, params)
    return agent


def wait(agent, handle) -> str:
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    return state


def region(tensor):
    kind = "VRAM" if tensor.is_cuda else "DRAM"
    return kind, [(tensor.data_ptr(), tensor.numel(), tensor.get_device() if tensor.is_cuda else 0)]


def buffers(direction: str, nbytes: int):
    """(source, destination) in the direction's order: pinned host and device memory (h2d,
    d2h), device and device (d2d), or for h2d_staged pinned host memory and device memory (the
    initiator copies the host bytes into a device buffer of its own, then NIXL moves them
    device to device)."""
    torch = _torch()
    if direction == "d2d":
        return (torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
                torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return (host, device) if direction in ("h2d", "h2d_staged", "h2d_hetmem") else (device, host)


def timed_writes(agent, source, remote_name: str, remote_descs, poison, check, seeds) -> list:
    """WRITEs of source into the remote descriptors, one per seed: the source gets the seed's
    bytes, the destination is poisoned first and checked after; GB/s of each."""
    torch = _torch()
    kind, local = region(source)
    local_descs = agent.get_xfer_descs(local, kind)
    rates = []
    for seed in seeds:
        source.copy_(random_bytes(seed, source.numel()))
        torch.cuda.synchronize()
        poison()
        handle = agent.initialize_xfer("WRITE", local_descs, remote_descs, remote_name, b"")
        start = time.perf_counter()
        state = wait(agent, handle)
        elapsed = time.perf_counter() - start
        handle.release()
        if state != "DONE":
            raise RuntimeError(f"transfer state {state}")
        if not check(seed):
            raise RuntimeError(f"bytes differ after the transfer of seed {seed}")
        rates.append(source.numel() / elapsed / 1e9)
    return rates


STAGE_PIECES = int(os.environ.get("NIXL_LINK_STAGE_PIECES", "8"))


def staged_writes(agent, source, remote_name: str, remote_raw, poison, check, seeds) -> list:
    """As timed_writes for host memory into a peer's device memory, through a device buffer
    of this process: each piece is copied up by the copy engine, then written to the peer by
    NIXL (device to device: cuda_ipc) while the next piece is copied; timed from the first
    copy to the last write's completion."""
    torch = _torch()
    nbytes = source.numel()
    staging = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    kind, whole = region(staging)
    registered = agent.register_memory([d + ("",) for d in whole], kind)
    (remote_base, remote_len, remote_dev), = remote_raw
    assert remote_len == nbytes, (remote_len, nbytes)
    piece = -(-nbytes // STAGE_PIECES)
    pieces = [(at, min(piece, nbytes - at)) for at in range(0, nbytes, piece)]
    copy_stream = torch.cuda.Stream()
    rates = []
    try:
        for seed in seeds:
            source.copy_(random_bytes(seed, nbytes))
            staging.fill_(0x5A)
            torch.cuda.synchronize()
            poison()
            start = time.perf_counter()
            events, handles = [], []
            with torch.cuda.stream(copy_stream):
                for at, length in pieces:
                    staging[at:at + length].copy_(source[at:at + length], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(copy_stream)
                    events.append(event)
            for (at, length), event in zip(pieces, events):
                event.synchronize()
                local = agent.get_xfer_descs([(staging.data_ptr() + at, length, staging.get_device())], kind)
                remote = agent.get_xfer_descs([(remote_base + at, length, remote_dev)], "VRAM")
                handle = agent.initialize_xfer("WRITE", local, remote, remote_name, b"")
                state = agent.transfer(handle)
                if state not in ("PROC", "DONE"):
                    raise RuntimeError(f"transfer state {state}")
                handles.append(handle)
            for handle in handles:
                state = "PROC"
                while state == "PROC":
                    state = agent.check_xfer_state(handle)
                if state != "DONE":
                    raise RuntimeError(f"transfer state {state}")
            elapsed = time.perf_counter() - start
            for handle in handles:
                handle.release()
            if not check(seed):
                raise RuntimeError(f"bytes differ after the staged transfer of seed {seed}")
            rates.append(nbytes / elapsed / 1e9)
    finally:
        agent.deregister_memory(registered)
    return rates


def hetmem_staged_writes(mode: str, metadata, remote_raw, poison, check, seeds) -> list:
    """As staged_writes, through hetmem's own API: a hetmem pinned buffer registered with a
    hetmem.nixl agent, written into the peer's device memory with Agent.write_staged (the
    peer's region rebuilt from the descriptor it sent, as its Registration.remote() would be)."""
    import hetmem
    import hetmem.nixl as hn
    from hetmem.nixl import RemoteRegion

    (base, nbytes, device), = remote_raw
    agent = hn.Agent("initiator-hetmem", params={"UCX": {"ucx_error_handling_mode": mode}} if mode else None)
    name = agent.add_peer(metadata)
    region = RemoteRegion._make(name, "VRAM", base, nbytes, device)
    source = hetmem.pinned(nbytes)
    registration = agent.register(source)
    pieces = int(os.environ.get("NIXL_LINK_STAGE_PIECES", "8"))
    rates = []
    for seed in seeds:
        source.numpy()[:] = random_bytes(seed, nbytes).cpu().numpy()
        poison()
        start = time.perf_counter()
        agent.write_staged(registration, region, pieces=pieces).wait()
        elapsed = time.perf_counter() - start
        if not check(seed):
            raise RuntimeError(f"bytes differ after hetmem's staged write of seed {seed}")
        rates.append(nbytes / elapsed / 1e9)
    return rates


def one_process(direction: str, nbytes: int, mode: str, reps: int) -> dict:
    torch = _torch()
    initiator, target = make_agent(f"initiator-{direction}", mode), make_agent(f"target-{direction}", mode)
    source, destination = buffers(direction, nbytes)
    for agent, tensor in ((initiator, source), (target, destination)):
        kind, descs = region(tensor)
        agent.register_memory([d + ("",) for d in descs], kind)
    initiator.add_remote_agent(target.get_agent_metadata())
    kind, descs = region(destination)
    remote = initiator.get_xfer_descs(descs, kind)

    def poison():
        destination.fill_(0xA5)
        torch.cuda.synchronize()

    def check(seed):
        return torch.equal(destination.cuda(), random_bytes(seed, nbytes))

    writes = staged_writes if direction == "h2d_staged" else timed_writes
    remote_arg = descs if direction == "h2d_staged" else remote
    rates = writes(initiator, source, f"target-{direction}", remote_arg, poison, check, range(100, 101 + reps))
    return {"rates": rates[1:]}  # the first one warms the connection


def _target_process(direction: str, nbytes: int, mode: str, commands, replies) -> None:
    torch = _torch()
    agent = make_agent(f"target-{direction}", mode)
    _, destination = buffers(direction, nbytes)
    kind, descs = region(destination)
    agent.register_memory([d + ("",) for d in descs], kind)
    replies.put((agent.get_agent_metadata(), kind, descs))
    while True:
        command, seed = commands.get()
        if command == "poison":
            destination.fill_(0xA5)
            torch.cuda.synchronize()
            replies.put(True)
        elif command == "check":
            replies.put(torch.equal(destination.cuda(), random_bytes(seed, nbytes)))
        else:
            return


def two_processes(direction: str, nbytes: int, mode: str, reps: int) -> dict:
    import multiprocessing as mp
    context = mp.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    target = context.Process(target=_target_process, args=(direction, nbytes, mode, commands, replies))
    target.start()
    try:
        if direction == "h2d_hetmem":  # hetmem's agent, buffer and staged write against the same peer
            metadata, _, remote_descs = replies.get(timeout=60)

            def ask_hetmem(command, seed=0):
                commands.put((command, seed))
                return replies.get(timeout=60)

            rates = hetmem_staged_writes(mode, metadata, remote_descs, lambda: ask_hetmem("poison"),
                                         lambda s: ask_hetmem("check", s), range(200, 201 + reps))
            return {"rates": rates[1:]}
        initiator = make_agent(f"initiator-{direction}", mode)
        source, _ = buffers(direction, nbytes)
        del _
        kind, descs = region(source)
        initiator.register_memory([d + ("",) for d in descs], kind)
        metadata, remote_kind, remote_descs = replies.get(timeout=60)
        name = initiator.add_remote_agent(metadata)
        remote = initiator.get_xfer_descs(remote_descs, remote_kind)

        def ask(command, seed=0):
            commands.put((command, seed))
            return replies.get(timeout=60)

        writes = staged_writes if direction == "h2d_staged" else timed_writes
        remote_arg = remote_descs if direction == "h2d_staged" else remote
        rates = writes(initiator, source, name, remote_arg, lambda: ask("poison"), lambda s: ask("check", s),
                       range(200, 201 + reps))
        return {"rates": rates[1:]}
    finally:
        commands.put(("stop", 0))
        target.join(10)
        if target.is_alive():
            target.kill()


def file_read(backend: str, nbytes: int) -> dict:
    """A file's bytes into memory through a storage backend (GDS: into device memory; POSIX:
    into pinned host memory), checked; the page cache is warm (the file was just written)."""
    torch = _torch()
    agent = make_agent("files", "", backends=(backend,))
    path = f"/tmp/nixl-link-{backend}.bin"
    expected = random_bytes(300, nbytes)
    with open(path, "wb") as file:
        file.write(expected.cpu().numpy().tobytes())
    fd = os.open(path, os.O_RDWR)
    try:
        if backend.startswith("GDS"):
            destination = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        else:
            destination = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        kind, descs = region(destination)
        agent.register_memory([d + ("",) for d in descs], kind)
        file_descs = [(0, nbytes, fd, "")]
        agent.register_memory(file_descs, "FILE")
        rates = []
        for _ in range(3):
            destination.fill_(0xA5)
            torch.cuda.synchronize()
            local = agent.get_xfer_descs(descs, kind)
            remote = agent.get_xfer_descs([(0, nbytes, fd)], "FILE")
            handle = agent.initialize_xfer("READ", local, remote, "files")
            start = time.perf_counter()
            state = wait(agent, handle)
            elapsed = time.perf_counter() - start
            handle.release()
            if state != "DONE":
                raise RuntimeError(f"transfer state {state}")
            if not torch.equal(destination.cuda(), expected):
                raise RuntimeError("bytes differ after the read")
            rates.append(nbytes / elapsed / 1e9)
        return {"rates": rates}
    finally:
        os.close(fd)
        os.unlink(path)


def case(argv) -> None:
    """One case, in this process (both directions where asked): prints a JSON line each."""
    what, direction, nbytes, mode = argv[0], argv[1], int(argv[2]), argv[3]
    for direction in (("h2d", "d2h") if direction == "both" else (direction,)):
        result = {"case": what, "direction": direction, "bytes": nbytes, "mode": mode,
                  "UCX_TLS": os.environ.get("UCX_TLS", "(unset)")}
        start = time.perf_counter()
        try:
            if what == "one":
                result.update(one_process(direction, nbytes, mode, reps=3))
            elif what == "two":
                result.update(two_processes(direction, nbytes, mode, reps=3))
            else:
                result.update(file_read(what, nbytes))
            result["GBps_median"] = round(sorted(result["rates"])[len(result["rates"]) // 2], 3)
            result["rates"] = [round(rate, 3) for rate in result["rates"]]
            result["bytes_checked"] = "all"
        except Exception as error:  # reported, not raised: the driver goes on to the next case
            result["error"] = f"{type(error).__name__}: {error}"
        result["wall_s"] = round(time.perf_counter() - start, 1)
        print("RESULT " + json.dumps(result), flush=True)


def run_case(args, tls, limit_s=45) -> None:
    env = dict(os.environ)
    if tls is None:
        env.pop("UCX_TLS", None)
    else:
        env["UCX_TLS"] = tls
    try:
        done = subprocess.run([sys.executable, HERE, "case", *map(str, args)], env=env, capture_output=True,
                              text=True, timeout=limit_s)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        for line in lines:
            print(line[7:], flush=True)
        if not lines:
            tail = " | ".join((done.stderr or "").strip().splitlines()[-4:])
            print(json.dumps({"case": args, "UCX_TLS": tls, "error": f"rc {done.returncode}: {tail}"}), flush=True)
        errors = [line for line in done.stderr.splitlines() if "rror" in line and "INFO" not in line]
        if errors:
            print("  stderr: " + " | ".join(errors[-3:])[:600], flush=True)
    except subprocess.TimeoutExpired:
        print(json.dumps({"case": args, "UCX_TLS": tls, "error": f"timed out after {limit_s} s (hung)"}), flush=True)


def versions() -> dict:
    import ctypes
    import importlib.metadata
    import glob
    torch = _torch()
    info = {"nixl_cu13": importlib.metadata.version("nixl_cu13"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0]}
    import nixl_cu13
    root = os.path.dirname(os.path.dirname(nixl_cu13.__file__))
    for path in glob.glob(os.path.join(root, "nixl_cu13.libs", "libucp-*.so*")):
        ucp = ctypes.CDLL(path)
        ucp.ucp_get_version_string.restype = ctypes.c_char_p
        info["ucx"] = ucp.ucp_get_version_string().decode()
    agent = make_agent("probe", "", backends=())
    info["plugins"] = agent.get_plugin_list()
    info["ucx_params"] = agent.get_plugin_params("UCX")
    return info


def main() -> None:
    if sys.argv[1] == "case":
        case(sys.argv[2:])
        return
    print("VERSIONS " + json.dumps(versions()), flush=True)
    print("ARGS " + json.dumps(sys.argv[1:]) + " UCX_ENV " + json.dumps({k: v for k, v in os.environ.items() if k.startswith("UCX_")}), flush=True)
    print("CEILING_256MiB " + json.dumps(link_ceiling(256 * MiB)), flush=True)
    if sys.argv[1] == "explore":
        configurations = [
            (None, "peer"),  # the defaults: what NIXL does out of the box
            ("cuda_copy,cuda_ipc,sm,self", "none"),
            (None, "none"),
            ("cuda_copy,cuda_ipc,sm,self", "peer"),  # refused on 2026-12-01: the error, again
            ("cuda_copy,sm,self", "none"),
            ("cuda_copy,cuda_ipc,tcp,self", "peer"),
        ]
        for index, (tls, mode) in enumerate(configurations):
            if index == 3:
                for backend in ("GDS", "GDS_MT", "POSIX"):
                    run_case((backend, "file", 256 * MiB, ""), None, limit_s=30)
            for where in ("one", "two"):
                if time.perf_counter() - STARTED > BUDGET_S:
                    print(f"SKIPPED {where} {tls} {mode}: over the run's budget of {BUDGET_S} s", flush=True)
                    continue
                run_case((where, "both", 256 * MiB, mode), tls)
    elif sys.argv[1] == "variant":  # one configuration, 256 MiB (UCX_* tuning from the environment)
        tls, mode = sys.argv[2], sys.argv[3]
        where = sys.argv[4] if len(sys.argv) > 4 else "one"
        direction = sys.argv[5] if len(sys.argv) > 5 else "both"
        run_case((where, direction, 256 * MiB, mode), None if tls == "unset" else tls)
    else:
        tls, mode = sys.argv[2], sys.argv[3]
        tls = None if tls == "unset" else tls
        sizes = [int(size) for size in os.environ.get("NIXL_LINK_SIZES_MIB", "1,4,16,64,256,1024").split(",")]
        for size in sizes:
            if time.perf_counter() - STARTED > BUDGET_S:
                print(f"SKIPPED {size} MiB: over the run's budget of {BUDGET_S} s", flush=True)
                continue
            run_case(("two", os.environ.get("NIXL_LINK_DIRECTION", "both"), size * MiB, mode), tls, limit_s=60)
    print("CEILING_256MiB_END " + json.dumps(link_ceiling(256 * MiB)), flush=True)


if __name__ == "__main__":
    main()
