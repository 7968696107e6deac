"""The other process of test_nixl's two-process test (started with multiprocessing's spawn):
it writes its fresh random bytes into the parent's lent buffer over UCX, then registers a
second buffer and offers it to the parent's read until the parent says it is done."""

import numpy as np


def random_bytes(seed: int, nbytes: int) -> np.ndarray:
    """The bytes both processes derive from ``seed``."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def serve(name: str, commands, replies) -> None:
    import hetmem
    import hetmem.nixl as hn

    try:
        parent_name, parent_metadata, destination, seed, nbytes = commands.get(timeout=120)
        agent = hn.Agent(name)
        source = hetmem.pinned(nbytes)
        source.numpy()[:] = random_bytes(seed, nbytes)
        source_registration = agent.register(source)
        agent.add_peer(parent_metadata)
        agent.write(source_registration, destination, notify=b"written").wait(timeout=120)

        readable = hetmem.pinned(nbytes)
        readable.numpy()[:] = random_bytes(seed + 1, nbytes)
        readable_registration = agent.register(readable)
        offered = agent.offer(readable_registration, parent_name, b"read")
        replies.put(("ready", agent.metadata(), readable_registration.remote()))
        offered.wait(timeout=120)  # the parent's read is done: the buffer and registration may go
        replies.put(("done", None, None))
    except BaseException as error:  # the parent reports it
        replies.put(("error", f"{type(error).__name__}: {error}", None))


def serve_readable(name: str, commands, replies) -> None:
    """Registers a buffer of ``random_bytes(seed, nbytes)`` and offers it to the parent's reads
    until the parent says it is done; the parent stops this process (SIGSTOP) meanwhile, so
    that a read of it stays in flight."""
    import hetmem
    import hetmem.nixl as hn

    try:
        seed, nbytes = commands.get(timeout=120)
        agent = hn.Agent(name)
        readable = hetmem.pinned(nbytes)
        readable.numpy()[:] = random_bytes(seed, nbytes)
        registration = agent.register(readable)
        replies.put(("ready", agent.metadata(), registration.remote()))
        assert commands.get(timeout=300) == "done"
    except BaseException as error:  # the parent reports it
        replies.put(("error", f"{type(error).__name__}: {error}", None))


def write_checkpoint(path, seed: int, nbytes: int) -> None:
    """A safetensors file of one U8 tensor, ``data``, of ``random_bytes(seed, nbytes)``: what
    ``serve_loaded`` loads (to the GPU, or to host memory) and registers."""
    import json
    import struct

    header = json.dumps({"data": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(header)) + header)
        file.write(random_bytes(seed, nbytes).tobytes())


def ucx_params() -> dict:
    """UCX's parameters for these tests: peer failure handling off where UCX_TLS names
    transports without it (cuda_copy, cuda_ipc, sm, self: no tcp), as the GPU runs set it."""
    import os

    tls = os.environ.get("UCX_TLS")
    return {"UCX": {"ucx_error_handling_mode": "none"}} if tls and "tcp" not in tls else {}


def serve_loaded(name: str, commands, replies) -> None:
    """Loads a checkpoint (``hetmem.load``) to ``device`` and registers its allocation (VRAM_SEG
    on a GPU, DRAM_SEG on the CPU), then: offers it to the parent's read of the file's bytes,
    lends it to the parent's write, and offers it again to the parent's read-back."""
    import hetmem
    import hetmem.nixl as hn

    try:
        parent_name, parent_metadata, path, device = commands.get(timeout=120)
        agent = hn.Agent(name, params=ucx_params())
        loaded = hetmem.load(path, device, progress=False)
        registration = agent.register(loaded)
        agent.add_peer(parent_metadata)
        offered = agent.offer(registration, parent_name, b"read")
        replies.put(("ready", (agent.metadata(), registration.remote(), registration.kind, registration.device)))
        offered.wait(timeout=300)
        incoming = agent.expect(registration, parent_name, b"written")
        replies.put(("expecting", None))
        incoming.wait(timeout=300)
        offered = agent.offer(registration, parent_name, b"read back")
        replies.put(("offered", None))
        offered.wait(timeout=300)
        replies.put(("done", None))
    except BaseException as error:  # the parent reports it
        replies.put(("error", f"{type(error).__name__}: {error}"))


def serve_device(name: str, commands, replies) -> None:
    """Device memory of this process (a ``hetmem.load`` allocation), registered (VRAM_SEG) and
    lent to the parent's staged writes, one round each: poisoned, expected, then read back to
    the host and compared with the seed the parent sends after its write."""
    import hetmem
    import hetmem.nixl as hn

    try:
        parent_name, parent_metadata, path, nbytes, rounds = commands.get(timeout=120)
        agent = hn.Agent(name, params=ucx_params())
        loaded = hetmem.load(path, "cuda", progress=False)
        tensor = loaded["data"]
        registration = agent.register(loaded)
        agent.add_peer(parent_metadata)
        for round_ in range(rounds):
            tensor.fill_(0xA5)
            tensor.cpu()  # the poison is in place before the write is expected
            incoming = agent.expect(registration, parent_name, f"staged {round_}".encode())
            replies.put(("expecting", (agent.metadata(), registration.remote())))
            incoming.wait(timeout=300)
            seed = commands.get(timeout=120)
            landed = tensor.cpu().numpy()
            replies.put(("checked", bool(np.array_equal(landed, random_bytes(seed, nbytes)))))
        replies.put(("done", None))
    except BaseException as error:  # the parent reports it
        replies.put(("error", f"{type(error).__name__}: {error}"))
