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
