"""hetmem.nixl on the CPU path: hetmem buffers, file windows and files registered with NIXL
agents and moved over UCX (two agents in one process, and two processes) or POSIX, with the
hand-off kept (a buffer a transfer writes is lent until NIXL says it is done; one it reads
is shared), and NIXL's errors named. Every transfer's destination is poisoned first and
compared byte for byte with fresh random bytes.

Skipped where the nixl package is not installed, unless HETMEM_REQUIRE_NIXL=1 (CI installs
it), which makes its absence a failure."""

import gc
import multiprocessing
import os
import signal
import uuid

import numpy as np
import pytest

import hetmem
import hetmem.nixl as hn
from nixl_peer import random_bytes, serve, serve_readable, ucx_params

MiB = 1 << 20
POISON = 0xA5
_MISSING = hn.available()

needs_nixl = pytest.mark.skipif(_MISSING is not None, reason=f"NIXL is not installed: {_MISSING}")


def test_nixl_is_installed_where_required():
    if os.environ.get("HETMEM_REQUIRE_NIXL") == "1":
        assert _MISSING is None, _MISSING
    elif _MISSING is not None:
        pytest.skip(f"NIXL is not installed: {_MISSING}")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def filled(rng, nbytes: int) -> hetmem.Buffer:
    buffer = hetmem.pinned(nbytes)
    buffer.numpy()[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    return buffer


def poisoned(nbytes: int) -> hetmem.Buffer:
    buffer = hetmem.pinned(nbytes)
    buffer.numpy()[:] = POISON
    return buffer


@pytest.fixture
def pair():
    """Two agents of this process that know each other (metadata is loaded again by the tests
    after they register what the peer uses). Where UCX_TLS leaves TCP out (the GPU machine's
    run over shared memory and CUDA copies), without peer failure handling, which those
    transports lack."""
    tls = os.environ.get("UCX_TLS")
    params = {"UCX": {"ucx_error_handling_mode": "none"}} if tls and "tcp" not in tls else None
    return hn.Agent(unique("sender"), params=params), hn.Agent(unique("receiver"), params=params)


@needs_nixl
@pytest.mark.parametrize("nbytes", [1 * MiB, 16 * MiB])
def test_two_agents_write_then_read_every_byte(rng, pair, nbytes):
    sender, receiver = pair
    source, destination, back = filled(rng, nbytes), poisoned(nbytes), poisoned(nbytes)
    expected = source.numpy().copy()
    source_registration, destination_registration = sender.register(source), receiver.register(destination)
    back_registration = sender.register(back)
    sender.add_peer(receiver.metadata())

    incoming = receiver.expect(destination_registration, sender.name, b"written")
    assert destination.lent
    with pytest.raises(hetmem.LentError):
        destination.numpy()
    transfer = sender.write(source_registration, destination_registration.remote(), notify=b"written")
    assert transfer.backend == "UCX"
    assert not source.lent  # read by the transfer: shared, its host views still work
    assert np.array_equal(source.numpy(), expected)
    transfer.wait(timeout=60)
    incoming.wait(timeout=60)
    assert not destination.lent
    assert np.array_equal(destination.numpy(), expected)

    # Back the other way: this agent reads the peer's buffer into its own.
    reading = sender.read(back_registration, destination_registration.remote())
    reading.wait(timeout=60)
    assert not back.lent
    assert np.array_equal(back.numpy(), expected)


@needs_nixl
def test_parts_of_a_remote_region(rng, pair):
    sender, receiver = pair
    nbytes = 4 * MiB
    destination = poisoned(nbytes)
    destination_registration = receiver.register(destination)
    sender.add_peer(receiver.metadata())
    region = destination_registration.remote()
    pieces = [filled(rng, MiB), filled(rng, 2 * MiB)]
    incoming = [receiver.expect(destination_registration, sender.name, b"part 0")]
    sender.write(sender.register(pieces[0]), region.part(MiB, MiB), notify=b"part 0").wait(timeout=60)
    incoming[0].wait(timeout=60)
    incoming.append(receiver.expect(destination_registration, sender.name, b"part 1"))
    sender.write(sender.register(pieces[1]), region.part(2 * MiB), notify=b"part 1").wait(timeout=60)
    incoming[1].wait(timeout=60)
    got = destination.numpy()
    assert (got[:MiB] == POISON).all()
    assert np.array_equal(got[MiB:2 * MiB], pieces[0].numpy())
    assert np.array_equal(got[2 * MiB:], pieces[1].numpy())
    for offset, size in ((0, 0), (4 * MiB, None), (3 * MiB, 2 * MiB), (-1, 1)):
        with pytest.raises(ValueError):
            region.part(offset, size)


@needs_nixl
@pytest.mark.parametrize("nbytes", [1 * MiB, 8 * MiB, 64 * MiB])
def test_two_processes_host_to_host_every_byte(rng, nbytes):
    seed = int(rng.integers(0, 2**31))
    agent = hn.Agent(unique("parent"))
    destination, back = poisoned(nbytes), poisoned(nbytes)
    destination_registration, back_registration = agent.register(destination), agent.register(back)
    peer = unique("child")
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    child = context.Process(target=serve, args=(peer, commands, replies))
    child.start()
    try:
        incoming = agent.expect(destination_registration, peer, b"written")
        commands.put((agent.name, agent.metadata(), destination_registration.remote(), seed, nbytes))
        status, metadata, readable = replies.get(timeout=180)
        assert status == "ready", metadata
        incoming.wait(timeout=60)
        assert np.array_equal(destination.numpy(), random_bytes(seed, nbytes))

        agent.add_peer(metadata)
        agent.read(back_registration, readable, notify=b"read").wait(timeout=60)
        assert np.array_equal(back.numpy(), random_bytes(seed + 1, nbytes))
        assert replies.get(timeout=60)[0] == "done"
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


@needs_nixl
def test_hand_off_while_a_transfer_is_in_flight(rng, monkeypatch):
    # The read's peer is another process, stopped (SIGSTOP) once a first read has set up the
    # connection. Over TCP the peer's side must answer a read, so the read stays in flight until
    # the peer runs again. (UCX's shared-memory transports read the peer's memory without it.)
    # With a GPU, NIXL refuses a UCX_TLS without cuda_copy; it copies within one process only,
    # so the read between the two still goes over TCP.
    on_gpu = hetmem.device().backend == "cuda"
    monkeypatch.setenv("UCX_TLS", "tcp,cuda_copy" if on_gpu else "tcp")
    nbytes = 64 * MiB
    seed = int(rng.integers(0, 2**31))
    sender = hn.Agent(unique("sender"))
    other, warm_up = poisoned(nbytes), poisoned(nbytes)
    other_registration, warm_up_registration = sender.register(other), sender.register(warm_up)
    peer = unique("stopped")
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    child = context.Process(target=serve_readable, args=(peer, commands, replies))
    child.start()
    stopped = False
    try:
        commands.put((seed, nbytes))
        status, metadata, readable = replies.get(timeout=180)
        assert status == "ready", metadata
        sender.add_peer(metadata)
        sender.read(warm_up_registration, readable).wait(timeout=60)
        assert np.array_equal(warm_up.numpy(), random_bytes(seed, nbytes))

        os.kill(child.pid, signal.SIGSTOP)
        stopped = True
        reading = sender.read(other_registration, readable)
        assert not reading.done(), "UCX finished a read over TCP while its peer was stopped"
        assert other.lent
        with pytest.raises(hetmem.LentError):
            other.numpy()
        with pytest.raises(hetmem.LentError):
            np.asarray(other)
        with pytest.raises(hetmem.LentError):  # a second transfer cannot take it either
            sender.read(other_registration, readable)
        with pytest.raises(hn.NixlError, match="in flight"):
            other_registration.close()
        assert not reading.done()
        os.kill(child.pid, signal.SIGCONT)
        stopped = False
        reading.wait(timeout=60)
        assert not other.lent
        assert np.array_equal(other.numpy(), random_bytes(seed, nbytes))
    finally:
        if stopped:
            os.kill(child.pid, signal.SIGCONT)
        commands.put("done")
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


@needs_nixl
def test_a_buffer_offered_to_a_read_is_shared_until_it_is_done(rng):
    sender = hn.Agent(unique("sender"))
    receiver = hn.Agent(unique("receiver"))
    nbytes = 16 * MiB
    source, destination, other = filled(rng, nbytes), poisoned(nbytes), poisoned(nbytes)
    source_registration, destination_registration = sender.register(source), receiver.register(destination)
    other_registration = sender.register(other)
    sender.add_peer(receiver.metadata())

    # A buffer offered to a peer's read is shared until the peer's notification: readable here,
    # written by no transfer.
    offered = receiver.offer(destination_registration, sender.name, b"read it")
    assert not destination.lent
    assert (destination.numpy() == POISON).all()
    with pytest.raises(hetmem.LentError, match="being read"):
        receiver.expect(destination_registration, sender.name, b"write")
    with pytest.raises(hetmem.LentError, match="being read"):
        receiver.read(destination_registration, source_registration.remote())
    sender.read(other_registration, destination_registration.remote(), notify=b"read it").wait(timeout=60)
    offered.wait(timeout=60)
    incoming = receiver.expect(destination_registration, sender.name, b"written")  # no longer shared
    sender.write(source_registration, destination_registration.remote(), notify=b"written").wait(timeout=60)
    incoming.wait(timeout=60)
    assert np.array_equal(destination.numpy(), source.numpy())


@needs_nixl
def test_a_buffer_lent_to_the_gpu_is_not_given_to_a_transfer(rng, pair):
    sender, receiver = pair
    source, destination = filled(rng, MiB), poisoned(MiB)
    source_registration, destination_registration = sender.register(source), receiver.register(destination)
    sender.add_peer(receiver.metadata())
    with source.lend():
        with pytest.raises(hetmem.LentError, match="reclaim it"):
            sender.write(source_registration, destination_registration.remote())
    with destination.lend():
        with pytest.raises(hetmem.LentError):
            receiver.expect(destination_registration, sender.name, b"x")
    sender.write(source_registration, destination_registration.remote()).wait(timeout=60)
    assert np.array_equal(destination.numpy(), source.numpy())


@needs_nixl
def test_a_file_window_is_host_memory_a_transfer_reads(rng, pair, tmp_path):
    sender, receiver = pair
    data = rng.integers(0, 256, 3 * MiB, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    window = hetmem.MappedFile(path).window(MiB, 2 * MiB)
    destination = poisoned(2 * MiB)
    window_registration, destination_registration = sender.register(window), receiver.register(destination)
    assert window_registration.kind == "DRAM"
    sender.add_peer(receiver.metadata())
    sender.write(window_registration, destination_registration.remote()).wait(timeout=60)
    assert np.array_equal(destination.numpy(), data[MiB:])
    with pytest.raises(ValueError, match="read-only"):
        sender.read(window_registration, destination_registration.remote())


@needs_nixl
def test_files_through_posix(rng, tmp_path):
    agent = hn.Agent(unique("files"), backends=("POSIX",))
    data = rng.integers(0, 256, 4 * MiB, dtype=np.uint8)
    path = tmp_path / "shard.bin"
    data.tofile(path)
    file = agent.register_file(path)
    assert file.kind == "FILE"
    destination = poisoned(MiB)
    destination_registration = agent.register(destination)
    agent.read_file(file, 3 * MiB, destination_registration).wait(timeout=60)
    assert np.array_equal(destination.numpy(), data[3 * MiB:])
    with pytest.raises(ValueError, match="inside the registration"):
        agent.read_file(file, 3 * MiB + 1, destination_registration)
    with pytest.raises(ValueError, match="read-only"):
        agent.write_file(destination_registration, file, 0)

    out_path = tmp_path / "out.bin"
    np.full(4 * MiB, POISON, np.uint8).tofile(out_path)
    out = agent.register_file(out_path, writable=True)
    source = filled(rng, MiB)
    agent.write_file(agent.register(source), out, MiB).wait(timeout=60)
    out.close()
    written = np.fromfile(out_path, np.uint8)
    assert (written[:MiB] == POISON).all() and (written[2 * MiB:] == POISON).all()
    assert np.array_equal(written[MiB:2 * MiB], source.numpy())


@needs_nixl
def test_deregistered_when_closed_or_dropped_and_not_before(rng, pair):
    sender, receiver = pair
    source, destination = filled(rng, MiB), poisoned(MiB)
    destination_registration = receiver.register(destination)
    sender.add_peer(receiver.metadata())
    region = destination_registration.remote()

    def raw_write(descriptor):
        # What a transfer prepares, without the registration that checks it.
        handle = sender._prepare("WRITE", "DRAM", descriptor, receiver.name, "DRAM", region._descriptor(), b"")
        handle.release()

    registration = sender.register(source)
    descriptor = registration._descriptor
    raw_write(descriptor)  # registered: NIXL prepares it
    registration.close()
    assert registration.closed
    with pytest.raises(hn.NixlError, match="registered no memory"):
        raw_write(descriptor)
    with pytest.raises(hn.NixlError, match="closed"):
        sender.write(registration, region)

    # A registration an expected write holds outlives the caller's reference to it.
    incoming = receiver.expect(destination_registration, sender.name, b"late")
    del destination_registration
    sender.write(sender.register(source), region, notify=b"late").wait(timeout=60)
    incoming.wait(timeout=60)
    assert np.array_equal(destination.numpy(), source.numpy())


@needs_nixl
def test_only_hetmem_memory_is_registered(pair):
    sender, _ = pair
    with pytest.raises(TypeError, match="hetmem Buffer"):
        sender.register(np.zeros(16, np.uint8))
    with pytest.raises(TypeError, match="hetmem Buffer"):
        sender.register(0x7F0000000000)
    with pytest.raises(ValueError, match="empty"):
        sender.register(hetmem.pinned(16)[0:0])
    with pytest.raises(TypeError, match="Registration.remote"):
        hn.RemoteRegion(0x7F0000000000, 4096)


@needs_nixl
def test_errors_name_the_backend_the_call_and_a_remedy(rng, pair, monkeypatch):
    sender, receiver = pair
    source = filled(rng, MiB)
    source_registration = sender.register(source)
    destination_registration = receiver.register(poisoned(2 * MiB))

    with pytest.raises(ValueError, match="region.part"):
        sender.write(source_registration, destination_registration.remote())
    with pytest.raises(hn.NixlError, match=r"NIXL UCX: preparing a WRITE .*add_peer"):
        sender.write(source_registration, destination_registration.remote().part(0, MiB))  # no metadata yet
    sender.add_peer(receiver.metadata())
    region = destination_registration.remote()
    forged = hn.RemoteRegion._make(region.agent, "DRAM", region._base + 2 * MiB, MiB, 0)  # past what it registered
    with pytest.raises(hn.NixlError, match="registered no memory holding the range"):
        sender.write(source_registration, forged)
    assert not source.lent and source_registration._active == 0  # nothing is left held
    with pytest.raises(hn.NixlError, match="Agent.metadata"):
        sender.add_peer(b"not metadata")
    with pytest.raises(hn.NixlError, match=r"NIXL NOPE: no such plugin .*UCX"):
        hn.Agent(unique("nope"), backends=("NOPE",))
    with pytest.raises(ValueError, match="not in backends"):
        hn.Agent(unique("params"), params={"POSIX": {}})

    # With a GPU, UCX needs its CUDA transports beside shared memory to start at all (the H200
    # machine refused sm,self alone even without peer failure handling).
    on_gpu = hetmem.device().backend == "cuda"
    monkeypatch.setenv("UCX_TLS", "cuda_copy,cuda_ipc,sm,self" if on_gpu else "sm,self")
    with pytest.raises(hn.NixlError, match=r"NIXL UCX: starting the UCX backend .*ucx_error_handling_mode"):
        hn.Agent(unique("shm"))
    quiet = hn.Agent(unique("shm"), params={"UCX": {"ucx_error_handling_mode": "none"}})
    assert quiet.backends == ["UCX"]


# -- the hand-off against a NIXL that records what it is given --------------------------------
# These run without NIXL: the agent below records the descriptors hetmem hands it and keeps
# every transfer in flight until the test says it is done, so what hetmem registers, holds and
# refuses meanwhile is checked exactly.

class _Handle:
    released = 0

    def release(self) -> None:
        self.released += 1


class _RecordingAgent(hn.Agent):
    def __init__(self) -> None:  # no NIXL: only what the registrations and transfers call
        self._name = unique("recording")
        self._backends = ["RECORDED"]
        self._inbox = {}
        self._staging = {}
        self.registered = []
        self.deregistered = []
        self.state = "PROC"

    def _register(self, descriptors, kind):
        dlist = [kind, tuple(descriptors)]  # compared by identity: a file's number is reused
        self.registered.append(dlist)
        return dlist

    def _deregister(self, dlist) -> None:
        self.deregistered.append(dlist)

    def _prepare(self, *args):
        return _Handle()

    def _backend_of(self, handle) -> str:
        return "RECORDED"

    def _post(self, handle, backend, what, memory=()) -> str:
        return "PROC"

    def _progress(self, handle, backend, what, memory=()) -> str:
        return self.state


def test_a_buffer_subclass_cannot_point_a_registration_at_other_memory(rng):
    buffer = filled(rng, 4096)
    expected = (buffer._memory.host_ptr, 4096, 0)

    class Elsewhere(hetmem.Buffer):
        # Shadows what the native view fixed: a fresh allocation (freed as soon as it is
        # read), further in, for more bytes.
        @property
        def _memory(self):
            return hetmem.pinned(1 << 20)._memory

        _offset = 8192
        nbytes = 1 << 16

    class Raw:
        host_ptr, nbytes, readonly = 0x7F0000000000, 1 << 40, False

    class Address(hetmem.Buffer):
        _memory = Raw()

    agent = _RecordingAgent()
    for cls in (Elsewhere, Address):
        shadowing = cls(buffer._memory, (4096,), np.uint8, keep=buffer)
        registration = agent.register(shadowing)
        assert registration._descriptor == expected, cls.__name__
        assert agent.registered[-1] == ["DRAM", (expected + ("",),)], cls.__name__
        assert registration.nbytes == 4096

    class Impostor:  # passes isinstance(..., Buffer) by its __class__, with no native view
        __class__ = property(lambda self: hetmem.Buffer)
        _memory, _offset, nbytes, _state = Raw(), 0, 4096, buffer._state

    with pytest.raises(TypeError):
        agent.register(Impostor())
    assert len(agent.registered) == 2


def test_a_subclass_cannot_make_a_read_only_window_writable(rng, tmp_path):
    path = tmp_path / "window.bin"
    rng.integers(0, 256, 8192, dtype=np.uint8).tofile(path)
    window = hetmem.MappedFile(path).window(0, 8192)
    assert window.readonly

    class Writable(hetmem.Buffer):
        readonly = False

    agent = _RecordingAgent()
    registration = agent.register(Writable(window._memory, (8192,), np.uint8, keep=window))
    with pytest.raises(ValueError, match="read-only"):
        agent.read(registration, hn.RemoteRegion._make("peer", "DRAM", 1 << 30, 8192, 0))
    with pytest.raises(ValueError, match="read-only"):
        agent.expect(registration, "peer", b"write")


def test_a_file_registration_outlives_the_transfers_that_use_it(rng, tmp_path):
    path = tmp_path / "shard.bin"
    rng.integers(0, 256, 3 * MiB, dtype=np.uint8).tofile(path)
    agent = _RecordingAgent()
    destination = agent.register(poisoned(MiB))
    for transfer_of in (lambda file: agent.read_file(file, 2 * MiB, destination),
                        lambda file: agent.write_file(agent.register(filled(rng, MiB)), file, MiB)):
        agent.state = "PROC"
        file = agent.register_file(path, writable=True)
        fd, dlist = file._fd, agent.registered[-1]
        transfer = transfer_of(file)
        with pytest.raises(hn.NixlError, match="in flight"):
            file.close()
        del file
        gc.collect()
        # The backend still reads or writes through the descriptor: it stays open, registered.
        os.fstat(fd)
        assert not any(gone is dlist for gone in agent.deregistered)
        agent.state = "DONE"
        transfer.wait(timeout=10)
        del transfer
        gc.collect()
        assert any(gone is dlist for gone in agent.deregistered)
        with pytest.raises(OSError):
            os.fstat(fd)
    assert not destination.buffer.lent


def test_a_buffer_a_transfer_reads_is_not_lent_to_the_gpu(rng):
    agent = _RecordingAgent()
    source = filled(rng, MiB)
    transfer = agent.write(agent.register(source), hn.RemoteRegion._make("peer", "DRAM", 1 << 30, MiB, 0))
    with pytest.raises(hetmem.LentError, match="being read"):
        source.lend()
    with pytest.raises(hetmem.LentError, match="being read"):
        source[0:16].lend()  # a view shares the hand-off
    agent.state = "DONE"
    transfer.wait(timeout=10)
    with source.lend():
        assert source.lent
    assert not source.lent


# -- device memory (VRAM_SEG) between two processes ----------------------------------------------

def _gpu_reason():
    """None where hetmem has a GPU, else why the device-memory tests skip."""
    chosen = hetmem.device()
    return None if chosen.backend == "cuda" else f"no GPU: {chosen.fallback_reason}"


def _end(child) -> None:
    """Waits for a peer process to end (killed after two minutes: a hang fails its exit code)."""
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        child.join()


def _loaded_round_trip(rng, tmp_path, device, nbytes):
    """The child loads a file of seeded bytes to ``device`` and registers the allocation; this
    process reads all of it into poisoned host memory (device -> host), writes fresh random
    bytes over it (host -> device), and reads them back into other poisoned host memory, each
    checked byte for byte."""
    from nixl_peer import serve_loaded, write_checkpoint

    seed = int(rng.integers(0, 2**31))
    path = tmp_path / "weights.safetensors"
    write_checkpoint(path, seed, nbytes)
    agent = hn.Agent(unique("parent"), params=ucx_params())
    read, back = poisoned(nbytes), poisoned(nbytes)
    source = filled(rng, nbytes)
    read_registration, back_registration = agent.register(read), agent.register(back)
    source_registration = agent.register(source)
    peer = unique("loader")
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    child = context.Process(target=serve_loaded, args=(peer, commands, replies))
    child.start()
    try:
        commands.put((agent.name, agent.metadata(), str(path), device))
        status, reply = replies.get(timeout=300)
        assert status == "ready", reply
        metadata, region, kind, device_id = reply
        assert (kind, device_id) == (("VRAM", 0) if device == "cuda" else ("DRAM", None))
        assert region.kind == kind and region.nbytes == nbytes
        agent.add_peer(metadata)

        agent.read(read_registration, region, notify=b"read").wait(timeout=300)
        assert np.array_equal(read.numpy(), random_bytes(seed, nbytes))

        status, reply = replies.get(timeout=120)
        assert status == "expecting", reply
        agent.write(source_registration, region, notify=b"written").wait(timeout=300)
        status, reply = replies.get(timeout=120)
        assert status == "offered", reply
        agent.read(back_registration, region, notify=b"read back").wait(timeout=300)
        assert np.array_equal(back.numpy(), source.numpy())
        assert not np.array_equal(back.numpy(), read.numpy())  # the write landed, not the file's bytes
        status, reply = replies.get(timeout=120)
        assert status == "done", reply
    finally:
        _end(child)
    assert child.exitcode == 0


@needs_nixl
@pytest.mark.parametrize("nbytes", [1 * MiB, 16 * MiB])
def test_a_loaded_allocation_on_the_cpu_is_host_memory_between_processes(rng, tmp_path, nbytes):
    _loaded_round_trip(rng, tmp_path, "cpu", nbytes)


@needs_nixl
@pytest.mark.parametrize("nbytes", [1 * MiB, 64 * MiB, 1 << 30])
def test_two_processes_host_to_device_and_back_every_byte(rng, tmp_path, nbytes):
    reason = _gpu_reason()
    if reason is not None:
        if os.environ.get("HETMEM_REQUIRE_GPU") == "1":
            pytest.fail(f"HETMEM_REQUIRE_GPU=1 but {reason}")
        pytest.skip(f"device memory (VRAM_SEG) needs a GPU ({reason})")
    _loaded_round_trip(rng, tmp_path, "cuda", nbytes)


@needs_nixl
def test_only_hetmem_device_memory_is_registered(pair):
    sender, _ = pair
    with pytest.raises(TypeError, match="LoadedTensors"):
        sender.register(object())

    class FakeTensor:  # what a torch tensor looks like to the array protocols
        __module__ = "torch"
        __cuda_array_interface__ = {"data": (0x7F0000000000, False), "shape": (16,), "typestr": "|u1",
                                    "version": 3}

    with pytest.raises(TypeError, match="torch's"):
        sender.register(FakeTensor())


def test_a_device_view_of_memory_a_transfer_writes_is_lent(rng):
    # The hand-off on device memory, against the recording agent: a DeviceView's exports
    # raise LentError while a transfer writes the memory, and not while one reads it. The
    # CPU backend has no device memory, so a host buffer stands in for the lease's check.
    agent = _RecordingAgent()
    buffer = filled(rng, MiB)
    registration = agent.register(buffer)
    region = hn.RemoteRegion._make("peer", "DRAM", 0x1000, MiB, 0)
    transfer = agent.read(registration, region)
    assert buffer._state.lease.blocks_device_views
    if buffer.is_mapped:  # a GPU: the mapped view goes through the same check
        with pytest.raises(hetmem.LentError, match="NIXL transfer"):
            hetmem.DeviceView(buffer).__cuda_array_interface__
    agent.state = "DONE"
    transfer.wait()
    assert buffer._state.lease is None


# -- host memory into a peer's device memory, staged through this process's device memory ------

def test_a_staged_write_checks_what_it_is_given(rng, tmp_path):
    agent = _RecordingAgent()
    source = agent.register(filled(rng, MiB))
    vram = hn.RemoteRegion._make("peer", "VRAM", 0x1000, MiB, 0)
    with pytest.raises(TypeError, match="device memory"):
        agent.write_staged(source, hn.RemoteRegion._make("peer", "DRAM", 0x1000, MiB, 0))
    with pytest.raises(ValueError, match="pieces=0"):
        agent.write_staged(source, vram, pieces=0)
    with pytest.raises(TypeError, match="integer"):
        agent.write_staged(source, vram, pieces=2.5)
    with pytest.raises(TypeError, match="bool"):
        agent.write_staged(source, vram, pieces=True)
    with pytest.raises(ValueError, match="same size"):
        agent.write_staged(source, vram.part(0, MiB // 2))
    path = tmp_path / "file.bin"
    path.write_bytes(b"x" * 4096)
    with pytest.raises(TypeError, match="host memory"):
        agent.write_staged(agent.register_file(path), vram)
    with pytest.raises(TypeError, match="host memory"):
        agent.write_staged(object(), vram)
    if _gpu_reason() is not None:  # the CPU backend has no device memory to stage in
        with pytest.raises(hn.NixlError, match="CPU backend"):
            agent.write_staged(source, vram)
    assert not source.buffer.lent and hn._handoff._readers(source.buffer).count == 0


@needs_nixl
@pytest.mark.parametrize("nbytes", [MiB + 3, 64 * MiB])
def test_two_processes_staged_host_to_device_every_byte(rng, tmp_path, nbytes):
    reason = _gpu_reason()
    if reason is not None:
        if os.environ.get("HETMEM_REQUIRE_GPU") == "1":
            pytest.fail(f"HETMEM_REQUIRE_GPU=1 but {reason}")
        pytest.skip(f"a staged write needs a GPU ({reason})")
    pytest.importorskip("torch")
    from nixl_peer import serve_device, write_checkpoint

    path = tmp_path / "destination.safetensors"
    write_checkpoint(path, int(rng.integers(0, 2**31)), nbytes)

    agent = hn.Agent(unique("parent"), params=ucx_params())
    source = filled(rng, nbytes)
    registration = agent.register(source)
    peer = unique("device")
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    child = context.Process(target=serve_device, args=(peer, commands, replies))
    child.start()
    stagings = []
    try:
        commands.put((agent.name, agent.metadata(), str(path), nbytes, 2))
        for round_ in range(2):
            status, reply = replies.get(timeout=300)
            assert status == "expecting", reply
            metadata, region = reply
            agent.add_peer(metadata)
            seed = int(rng.integers(0, 2**31))
            source.numpy()[:] = random_bytes(seed, nbytes)
            write = agent.write_staged(registration, region, pieces=5, notify=f"staged {round_}".encode())
            assert write.pieces == 5
            write.wait(timeout=300)
            assert hn._handoff._readers(source).count == 0 and registration._active == 0
            stagings.append(agent._staging[0])
            commands.put(seed)
            status, reply = replies.get(timeout=300)
            assert (status, reply) == ("checked", True)
        status, reply = replies.get(timeout=120)
        assert status == "done", reply
    finally:
        _end(child)
    assert child.exitcode == 0
    assert stagings[0] is stagings[1] and stagings[0]._active == 0  # registered once, used again


class _FakeEvent:
    def __init__(self) -> None:
        self.landed = False

    def record(self, stream) -> None:
        pass

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.landed = True


class _FakeTensor:
    def __init__(self, torch, name, lo=0, hi=None):
        self.torch, self.name, self.lo, self.hi = torch, name, lo, hi

    def __getitem__(self, part: slice) -> "_FakeTensor":
        lo = self.lo + (part.start or 0)
        hi = self.lo + part.stop if part.stop is not None else self.hi
        return _FakeTensor(self.torch, self.name, lo, hi)

    def data_ptr(self) -> int:
        return 0x7000000 + self.lo

    def copy_(self, other, non_blocking=False) -> None:
        self.torch.copies.append((other.name, other.lo, other.hi, self.name, self.lo, self.hi, non_blocking))


class _FakeTorch:
    """What a staged write uses of torch (its CUDA streams, events and DLPack import), with
    copies recorded and events landed when the test says: the hand-off and the order of the
    pieces checked exactly, without a GPU."""

    def __init__(self) -> None:
        self.cuda = self
        self.events = []
        self.copies = []
        self.synchronized = 0
        self.waited_for = []
        self.readers = lambda: None

    def is_available(self) -> bool:
        return True

    def Stream(self, device=None):
        torch = self

        class Stream:
            def synchronize(self) -> None:
                torch.synchronized += 1
                torch.readers_at_synchronize = torch.readers()
                for event in torch.events:
                    event.landed = True

            def wait_stream(self, other) -> None:
                torch.waited_for.append(other)
        return Stream()

    def current_stream(self, device=None):
        return ("current stream", device)

    uint8 = "uint8"

    def empty(self, nbytes, dtype=None, device=None) -> _FakeTensor:
        assert dtype == "uint8" and device.startswith("cuda:")
        return _FakeTensor(self, f"empty on {device}", 0, nbytes)

    def stream(self, stream):
        import contextlib
        return contextlib.nullcontext()

    def Event(self) -> _FakeEvent:
        self.events.append(_FakeEvent())
        return self.events[-1]

    def from_dlpack(self, view) -> _FakeTensor:
        return _FakeTensor(self, "host")


class _FakeStaging:
    def __init__(self, torch, nbytes: int) -> None:
        self._descriptor = (0x20000, nbytes, 0)
        self.device = 0
        self._active = 0
        self.user = None
        self.tensor = _FakeTensor(torch, "staging", 0, nbytes)


class _Notifier:
    def __init__(self) -> None:
        self.sent = []

    def send_notif(self, peer, message) -> None:
        self.sent.append((peer, message))


def _staged(monkeypatch, rng, nbytes, pieces, notify=b"staged"):
    import sys
    from hetmem.nixl._staged import StagedWrite, check_staged

    torch = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    agent = _RecordingAgent()
    agent._agent = _Notifier()
    source = filled(rng, nbytes)
    registration = agent.register(source)
    region = hn.RemoteRegion._make("peer", "VRAM", 0x900000, nbytes, 0)
    staging = _FakeStaging(torch, nbytes)
    write = StagedWrite(agent, registration, region, staging, check_staged(agent, registration, region, pieces),
                        notify)
    return torch, agent, source, registration, staging, write


def test_a_staged_write_shares_its_source_until_every_copy_landed(rng, monkeypatch):
    torch, agent, source, registration, staging, write = _staged(monkeypatch, rng, MiB + 3, 4)
    assert write.pieces == 4 and len(torch.events) == 4
    assert torch.waited_for == [("current stream", 0)]  # after what the staging's block last held
    assert staging.user is write
    # Every piece copied in order, host range to the same staging range, asynchronously.
    piece = -(-(MiB + 3) // 4)
    assert [(c[1], c[2]) for c in torch.copies] == [(at, min(at + piece, MiB + 3)) for at in range(0, MiB + 3, piece)]
    assert all(c[0] == "host" and c[3] == "staging" and c[1:3] == c[4:6] and c[6] for c in torch.copies)
    assert hn._handoff._readers(source).count == 1 and registration._active == 1 and staging._active == 1
    with pytest.raises(hetmem.LentError):
        source.lend()
    assert not write.done()
    torch.events[0].landed = torch.events[1].landed = True
    assert not write.done()
    assert sum(posted is not None for posted in write._posted) == 2  # handed over as they land, in order
    assert hn._handoff._readers(source).count == 1
    torch.events[3].landed = True  # out of order: piece 3 waits for piece 2
    assert not write.done() and len(write._posted) == 2
    torch.events[2].landed = True
    assert not write.done() and len(write._posted) == 4
    assert hn._handoff._readers(source).count == 0 and registration._active == 0  # read no more
    assert staging._active == 1 and agent._agent.sent == []  # NIXL still moves the pieces
    handles = [posted[0] for posted in write._posted]
    agent.state = "DONE"
    assert write.done() and write.done()
    assert staging._active == 0 and agent._agent.sent == [("peer", b"staged")]  # once, after every piece
    assert [handle.released for handle in handles] == [1, 1, 1, 1] and staging.user is None
    write.wait()


def test_a_failed_staged_piece_raises_every_time_and_gives_everything_back(rng, monkeypatch):
    torch, agent, source, registration, staging, write = _staged(monkeypatch, rng, MiB, 3)
    for event in torch.events:
        event.landed = True
    agent.state = "ERR"
    for _ in range(2):
        with pytest.raises(hn.NixlError, match="piece 0 of the staged write"):
            write.done()
    with pytest.raises(hn.NixlError):
        write.wait()
    assert hn._handoff._readers(source).count == 0 and registration._active == 0 and staging._active == 0
    assert agent._agent.sent == []  # no notification for bytes that did not all arrive


def test_a_staged_piece_whose_poll_raises_fails_the_write_and_gives_everything_back(rng, monkeypatch):
    # NIXL reports a failed transfer by raising from check_xfer_state.
    torch, agent, source, registration, staging, write = _staged(monkeypatch, rng, MiB, 2)
    for event in torch.events:
        event.landed = True

    def failing(handle, backend, what, memory=()):
        raise hn.NixlError(f"NIXL {backend}: {what} failed (nixlRemoteDisconnectError)")

    monkeypatch.setattr(agent, "_progress", failing)
    with pytest.raises(hn.NixlError, match="piece 0"):
        write.done()
    with pytest.raises(hn.NixlError, match="piece 0"):
        write.wait()
    assert write._posted == [None, None]  # both released, none left in flight
    assert hn._handoff._readers(source).count == 0 and registration._active == 0 and staging._active == 0
    assert agent._agent.sent == []


def test_an_interrupted_poll_of_a_staged_write_keeps_its_pieces_in_flight(rng, monkeypatch):
    torch, agent, source, registration, staging, write = _staged(monkeypatch, rng, MiB, 2)
    for event in torch.events:
        event.landed = True
    calls = []

    def interrupted(*args):
        calls.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(agent, "_progress", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write.done()
    assert calls and all(posted is not None for posted in write._posted)  # nothing released
    assert staging._active == 1
    monkeypatch.undo()
    agent.state = "DONE"
    assert write.done() and staging._active == 0


def test_a_staged_write_that_fails_to_queue_waits_for_the_copies_it_queued(rng, monkeypatch):
    import sys
    from hetmem.nixl._staged import StagedWrite

    torch = _FakeTorch()
    made = []

    def failing_event():
        if len(made) == 2:
            raise RuntimeError("CUDA error: out of memory (a test)")
        made.append(_FakeEvent())
        torch.events.append(made[-1])
        return made[-1]

    torch.Event = failing_event
    monkeypatch.setitem(sys.modules, "torch", torch)
    agent = _RecordingAgent()
    source = filled(rng, MiB)
    registration = agent.register(source)
    torch.readers = lambda: hn._handoff._readers(source).count
    region = hn.RemoteRegion._make("peer", "VRAM", 0x900000, MiB, 0)
    staging = _FakeStaging(torch, MiB)
    with pytest.raises(RuntimeError, match="a test"):
        StagedWrite(agent, registration, region, staging, 4, b"")
    assert torch.synchronized == 1 and torch.readers_at_synchronize == 1  # waited for, then given back
    assert hn._handoff._readers(source).count == 0 and registration._active == 0 and staging._active == 0


def test_the_staging_is_kept_per_device_used_again_and_replaced_only_when_idle():
    torch = _FakeTorch()
    agent = _RecordingAgent()
    first = agent._staging_for(torch, MiB, 0)
    assert agent.registered[-1][0] == "VRAM" and agent.registered[-1][1][0][1:3] == (MiB, 0)
    assert agent._staging_for(torch, MiB // 2, 0) is first  # big enough and idle: used again

    class Poller:
        polled = 0

        def done(self):
            self.polled += 1
            return False

    first._active, first.user = 1, Poller()
    one_off = agent._staging_for(torch, MiB, 0)
    assert one_off is not first and agent._staging[0] is first  # busy: a one-off, the cache kept
    assert first.user.polled == 1  # the write holding it was polled first
    with pytest.raises(hn.NixlError, match="in use"):
        first.close()
    first._active, first.user = 0, None
    bigger = agent._staging_for(torch, 2 * MiB, 0)
    assert first.closed and agent._staging[0] is bigger and bigger.nbytes == 2 * MiB
    assert len(agent.deregistered) == 1  # the small one, deregistered before the larger was made
    other = agent._staging_for(torch, MiB, 1)
    assert other is not bigger and agent._staging[1] is other and other.device == 1


def test_a_transfer_whose_poll_raises_fails_gives_its_buffer_back_and_raises_again(rng, monkeypatch):
    # NIXL 1.5 reports a failed transfer by raising from check_xfer_state: the transfer is over
    # (its buffer no longer lent), and every later done() or wait() says so instead of spinning.
    agent = _RecordingAgent()
    buffer = poisoned(MiB)
    registration = agent.register(buffer)
    transfer = agent.read(registration, hn.RemoteRegion._make("peer", "DRAM", 0x1000, MiB, 0))
    assert buffer.lent

    def failing(handle, backend, what, memory=()):
        raise hn.NixlError(f"NIXL {backend}: {what} failed (nixlRemoteDisconnectError: the peer went away)")

    monkeypatch.setattr(agent, "_progress", failing)
    with pytest.raises(hn.NixlError, match="the peer went away"):
        transfer.done()
    assert not buffer.lent and registration._active == 0
    with pytest.raises(hn.NixlError, match="the peer went away"):
        transfer.done()
    with pytest.raises(hn.NixlError, match="the peer went away"):
        transfer.wait(timeout=5)
    registration.close()  # nothing holds it any more


def test_a_transfer_complete_at_once_whose_request_cannot_be_released_is_still_handed_over(rng, monkeypatch):
    """A transfer that NIXL completes as it is posted, whose request then refuses release: the
    caller still gets the transfer (the buffer stays lent), and its done() releases it later."""
    agent = _RecordingAgent()
    buffer = poisoned(MiB)
    registration = agent.register(buffer)
    refusals = []

    class Refusing(_Handle):
        def release(self) -> None:
            if not refusals:
                refusals.append(1)
                raise RuntimeError("nixlRepostActiveError: the request is still active (a test)")
            super().release()

    handles = []
    monkeypatch.setattr(agent, "_prepare", lambda *args: handles.append(Refusing()) or handles[-1])
    monkeypatch.setattr(agent, "_post", lambda handle, backend, what, memory=(): "DONE")
    transfer = agent.read(registration, hn.RemoteRegion._make("peer", "DRAM", 0x1000, MiB, 0))
    assert refusals and buffer.lent and registration._active == 1  # UCX may still use it
    assert transfer.done()  # released now
    assert not buffer.lent and registration._active == 0 and handles[0].released == 1


def test_a_transfer_whose_request_cannot_be_released_keeps_its_buffer_until_it_is(rng, monkeypatch):
    agent = _RecordingAgent()
    buffer = poisoned(MiB)
    registration = agent.register(buffer)
    transfer = agent.read(registration, hn.RemoteRegion._make("peer", "DRAM", 0x1000, MiB, 0))
    handle = transfer._handle
    refusals = []

    def release():
        if not refusals:
            refusals.append(1)
            raise RuntimeError("nixlRepostActiveError: the request is still active (a test)")
        _Handle.release(handle)

    monkeypatch.setattr(handle, "release", release)
    agent.state = "DONE"
    with pytest.raises(hn.NixlError, match="could not be released"):
        transfer.done()
    assert buffer.lent and registration._active == 1  # UCX may still use it: nothing given back
    assert transfer.done()  # released now
    assert not buffer.lent and registration._active == 0 and handle.released == 1
