"""hetmem.SharedRing: frames between processes (multiprocessing, spawn) through shared memory.

Every test is bounded: child processes are joined with a timeout and killed in ``finally``, a
waiting parent is woken by the watchdog killing its child (the ring then raises PeerGone), and
``faulthandler`` ends the run with a traceback should anything hang past that.
"""

import faulthandler
import hashlib
import multiprocessing
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

import hetmem

SHAPE = (64, 48)
DTYPE = np.float32
CONNECT = 60.0  # seconds a side waits for the other to appear (spawn imports numpy and hetmem)

spawn = multiprocessing.get_context("spawn")


@pytest.fixture(autouse=True)
def hang_guard():
    """A hang fails the run with every thread's traceback instead of blocking CI."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def frames(seed, count):
    """The frames a producer of ``seed`` sends: fresh random data, never zeros."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield rng.standard_normal(SHAPE).astype(DTYPE) + 10.0


def shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


class Child:
    """A spawned process, killed and reaped whatever the test does."""

    def __init__(self, target, *args):
        self.process = spawn.Process(target=target, args=args, daemon=True)
        self.process.start()

    def kill(self):
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.join(30)
        self.kill()


def watchdog(child, seconds):
    """Kills ``child`` after ``seconds``: a parent waiting on it then gets PeerGone, not a hang."""
    timer = threading.Timer(seconds, child.kill)
    timer.daemon = True
    timer.start()
    return timer


# -- the children ---------------------------------------------------------------------------


def produce(path, seed, count):
    with hetmem.SharedRing.create(path, SHAPE, DTYPE, slots=4, timeout=CONNECT) as ring:
        for k, frame in enumerate(frames(seed, count)):
            if k % 2:
                ring.send(frame)  # copied in
            else:
                with ring.slot() as slot:  # written in place
                    slot[...] = frame


def produce_then_hang(path, seed, published, ready):
    ring = hetmem.SharedRing.create(path, SHAPE, DTYPE, slots=4, timeout=CONNECT)
    source = frames(seed, published + 1)
    for _ in range(published):
        ring.send(next(source))
    slot = ring.slot()  # the next frame, half written when the kill comes
    slot[: SHAPE[0] // 2] = next(source)[: SHAPE[0] // 2]
    ready.set()
    time.sleep(600)


def consume_then_hang(path, taken, report, ready):
    ring = hetmem.SharedRing.connect(path, SHAPE, DTYPE, timeout=CONNECT)
    for _ in range(taken):
        with ring.next() as frame:
            report.put(hashlib.sha256(frame.numpy().tobytes()).hexdigest())
    ready.set()
    time.sleep(600)


def create_reporting(path, shape, dtype, report):
    try:
        hetmem.SharedRing.create(path, shape, dtype, timeout=CONNECT)
        report.put("created")
    except Exception as error:  # noqa: BLE001 - the parent checks what it was
        report.put(f"{type(error).__name__}: {error}")


# -- the tests ------------------------------------------------------------------------------


def test_frames_cross_in_order_none_lost_or_repeated(tmp_path, rng):
    path = str(tmp_path / "ring.sock")
    seed, count = int(rng.integers(2**32)), 200
    before = shm_names()
    with Child(produce, path, seed, count) as child:
        watchdog(child, 180)
        with hetmem.SharedRing.connect(path, SHAPE, DTYPE, timeout=CONNECT) as ring:
            assert ring.peer_pid == child.process.pid
            assert not os.path.exists(path), "the socket path is removed once the consumer came"
            assert shm_names() == before, "the ring's memory is a memfd: nothing named in /dev/shm"
            got = []
            for frame in ring:
                assert frame.readonly and frame.shape == SHAPE and frame.dtype == DTYPE
                assert frame.index == len(got)
                got.append(hashlib.sha256(frame.numpy().tobytes()).hexdigest())
            assert ring.ended
            with pytest.raises(StopIteration):
                ring.next()
        child.process.join(30)
        assert child.process.exitcode == 0
    expected = [hashlib.sha256(frame.tobytes()).hexdigest() for frame in frames(seed, count)]
    assert len(set(expected)) == count
    assert got == expected
    assert shm_names() == before


def test_producer_killed_mid_stream_raises_naming_its_pid(tmp_path, rng):
    path = str(tmp_path / "ring.sock")
    seed, published = int(rng.integers(2**32)), 5
    ready = spawn.Event()
    with Child(produce_then_hang, path, seed, published, ready) as child:
        watchdog(child, 180)
        ring = hetmem.SharedRing.connect(path, SHAPE, DTYPE, timeout=CONNECT)
        for k, expected in enumerate(frames(seed, published)):
            with ring.next() as frame:
                assert frame.index == k
                np.testing.assert_array_equal(frame.numpy(), expected)
        assert ready.wait(120)
        child.kill()
        started = time.monotonic()
        with pytest.raises(hetmem.PeerGone) as raised:
            ring.next()
        elapsed = time.monotonic() - started
    assert isinstance(raised.value, hetmem.HetmemError)
    assert raised.value.pid == child.process.pid and raised.value.role == "producer"
    assert f"pid {child.process.pid}" in str(raised.value)
    assert f"frame {published}" in str(raised.value)
    # Noticed through the pidfd, at once; generous for a loaded CI machine.
    assert elapsed < 10, elapsed


def test_consumer_killed_makes_the_producer_raise(tmp_path, rng):
    path = str(tmp_path / "ring.sock")
    taken = 3
    ready, report = spawn.Event(), spawn.Queue()
    with Child(consume_then_hang, path, taken, report, ready) as child:
        watchdog(child, 180)
        ring = hetmem.SharedRing.create(path, SHAPE, DTYPE, slots=4, timeout=CONNECT)
        sent = [rng.standard_normal(SHAPE).astype(DTYPE) for _ in range(taken)]
        for frame in sent:
            ring.send(frame)
        assert ready.wait(120)
        assert [report.get(timeout=30) for _ in range(taken)] == [
            hashlib.sha256(frame.tobytes()).hexdigest() for frame in sent]
        child.kill()
        with pytest.raises(hetmem.PeerGone) as raised:
            # The free slots take frames without the consumer; the first wait hears it is gone.
            for _ in range(ring.slots + 1):
                ring.send(rng.standard_normal(SHAPE).astype(DTYPE))
    assert raised.value.pid == child.process.pid and raised.value.role == "consumer"
    assert f"pid {child.process.pid}" in str(raised.value)


def test_shape_or_dtype_mismatch_is_refused_naming_both(tmp_path):
    for shape, dtype in [((64, 48), np.float64), ((48, 64), np.float32)]:
        path = str(tmp_path / f"ring-{np.dtype(dtype).name}.sock")
        report = spawn.Queue()
        with Child(create_reporting, path, SHAPE, DTYPE, report) as child:
            watchdog(child, 180)
            with pytest.raises(ValueError) as raised:
                hetmem.SharedRing.connect(path, shape, dtype, timeout=CONNECT)
            theirs = report.get(timeout=60)
        mine = f"shape {shape} dtype {np.dtype(dtype).str}"
        producers = f"shape {SHAPE} dtype {np.dtype(DTYPE).str}"
        for message in (str(raised.value), theirs):
            assert mine in message and producers in message, message
        assert theirs.startswith("ValueError")
        assert not os.path.exists(path)


def socket_ring(slots=2):
    """Both sides in this process, one thread each, over a socket pair."""
    left, right = socket.socketpair()
    made = {}
    consumer = threading.Thread(
        target=lambda: made.setdefault("consumer", hetmem.SharedRing.connect(right, SHAPE, DTYPE, timeout=30)))
    consumer.start()
    producer = hetmem.SharedRing.create(left, SHAPE, DTYPE, slots=slots, timeout=30)
    consumer.join(30)
    left.close(), right.close()  # the rings hold their own descriptors
    return producer, made["consumer"]


def test_views_are_revoked_at_the_hand_off(rng):
    producer, consumer = socket_ring()
    data = rng.standard_normal(SHAPE).astype(DTYPE)
    slot = producer.slot()
    slot[...] = data
    assert producer.publish() == 0
    for use in (slot.numpy, lambda: np.asarray(slot), lambda: slot.__setitem__(0, 1.0), slot.__dlpack__):
        with pytest.raises(hetmem.LentError, match="published"):
            use()
    with pytest.raises(ValueError, match="no slot is being filled"):
        producer.publish()
    with producer.slot():
        with pytest.raises(ValueError, match="still being filled"):
            producer.slot()
        producer.cancel()
    frame = consumer.next()
    np.testing.assert_array_equal(frame.numpy(), data)
    with pytest.raises(ValueError):
        frame.numpy()[0, 0] = 0.0  # read-only
    frame.release()
    with pytest.raises(hetmem.LentError, match="released"):
        frame.numpy()
    producer.close()
    with pytest.raises(StopIteration):
        consumer.next()
    consumer.close()


def test_frames_held_at_once_up_to_the_slots_in_any_order(rng):
    producer, consumer = socket_ring(slots=2)
    sent = [rng.standard_normal(SHAPE).astype(DTYPE) for _ in range(3)]
    producer.send(sent[0]), producer.send(sent[1])
    first, second = consumer.next(), consumer.next()
    with pytest.raises(ValueError, match="all 2 slots are held here"):
        consumer.next()  # would wait for ever: only this process can free a slot
    second.release()
    np.testing.assert_array_equal(first.numpy(), sent[0])  # still this side's
    first.release()
    producer.send(sent[2])
    with consumer.next() as third:
        assert third.index == 2
        np.testing.assert_array_equal(third.numpy(), sent[2])
    producer.close()
    assert list(consumer) == [] and consumer.ended
    consumer.close()


def test_a_producer_left_by_an_error_is_a_peer_gone(rng):
    producer, consumer = socket_ring()
    data = rng.standard_normal(SHAPE).astype(DTYPE)
    with pytest.raises(KeyError):
        with producer:
            producer.send(data)
            with producer.slot() as slot:
                slot[...] = 1.0
                raise KeyError("the producer's own failure")
    with pytest.raises(hetmem.LentError):
        slot.numpy()
    with consumer.next() as frame:  # the frame published before the failure comes out
        np.testing.assert_array_equal(frame.numpy(), data)
    with pytest.raises(hetmem.PeerGone, match="without closing") as raised:
        consumer.next()
    assert raised.value.pid == os.getpid() and raised.value.role == "producer"
    consumer.close()


@pytest.mark.parametrize("shape, slots, error", [
    ((4, 4), 0, "slots: 0"),
    ((4, 4), 65, "slots: 65"),
    ((4, 4), -1, "slots"),
    ((4, 4), 2**70, "slots"),
    ((-1, 4), 4, "shape"),
    ((0, 4), 4, "no element"),
    ((2**40, 2**40), 4, "frame"),
    ((2**62, 2**62, 2**62), 4, "frame"),
    ((2**31, 2**31), 64, "slots x frame bytes"),
])
def test_bad_sizes_are_refused_before_listening(tmp_path, shape, slots, error):
    path = tmp_path / "ring.sock"
    with pytest.raises(ValueError, match=error):
        hetmem.SharedRing.create(str(path), shape, np.uint8, slots=slots, timeout=0)
    assert not path.exists()


def test_bad_peers_and_timeouts_are_refused(tmp_path):
    with pytest.raises(TypeError, match="socket path"):
        hetmem.SharedRing.create(3, SHAPE, DTYPE, timeout=0)  # never an integer descriptor
    with pytest.raises(TypeError, match="socket path"):  # nor does the native half take one
        hetmem._native.SharedRingProducer(hetmem.device(), 3, ([4], "<f4", 4), 4, 0.0)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with tcp, pytest.raises(ValueError, match="not a connected Unix stream socket"):
        hetmem.SharedRing.create(tcp, SHAPE, DTYPE, timeout=0)
    for timeout in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            hetmem.SharedRing.connect(str(tmp_path / "x.sock"), SHAPE, DTYPE, timeout=timeout)
    with pytest.raises(TimeoutError, match="no peer came"):
        hetmem.SharedRing.connect(str(tmp_path / "nobody.sock"), SHAPE, DTYPE, timeout=0.1)
    with pytest.raises(TimeoutError, match="no peer came"):
        hetmem.SharedRing.create(str(tmp_path / "alone.sock"), SHAPE, DTYPE, timeout=0.1)
    assert not (tmp_path / "alone.sock").exists()
    with pytest.raises(TypeError, match="SharedRing.create"):
        hetmem.SharedRing()


def test_a_peer_that_agrees_then_says_nothing_is_a_timeout_on_either_side():
    # The peer sends the frames' description a hetmem ring would (so the agreement passes),
    # then nothing: no ring (for a consumer), no answer (for a producer).
    description = f"shape ({SHAPE[0]}, {SHAPE[1]}) dtype {np.dtype(DTYPE).str}".encode()
    for side in ("create", "connect"):
        mine, theirs = socket.socketpair()
        with mine, theirs:
            theirs.sendall(len(description).to_bytes(4, "little") + description)
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="did not finish the set-up"):
                getattr(hetmem.SharedRing, side)(mine, SHAPE, DTYPE, timeout=0.5)
            assert time.monotonic() - started < 10, side


def test_a_peer_that_is_not_a_ring_is_refused():
    silent, other = socket.socketpair()
    with silent, other, pytest.raises(hetmem.HetmemError, match="agreeing on the frames"):
        hetmem.SharedRing.create(silent, SHAPE, DTYPE, timeout=0.2)  # the other end says nothing
    talker, other = socket.socketpair()
    with talker, other:
        other.sendall((1 << 30).to_bytes(4, "little"))  # a description of 1 GiB: refused unread
        with pytest.raises(hetmem.HetmemError, match="not a hetmem shared ring"):
            hetmem.SharedRing.connect(talker, SHAPE, DTYPE, timeout=5)


def test_socket_kinds_other_than_a_unix_stream_are_refused():
    for kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        mine, other = socket.socketpair(socket.AF_UNIX, kind)
        with mine, other, pytest.raises(ValueError, match="not a connected Unix stream socket"):
            hetmem.SharedRing.create(mine, SHAPE, DTYPE, timeout=0.2)


class LyingSocket(socket.socket):
    """A socket whose fileno() names another descriptor than its own."""

    def __init__(self, real, lie):
        super().__init__(real.family, real.type, fileno=real.detach())
        self.lie = lie

    def fileno(self):
        return self.lie


def test_an_overridden_fileno_is_not_trusted(tmp_path, rng):
    left, right = socket.socketpair()
    with open(tmp_path / "not-a-socket", "wb") as decoy:
        liar = LyingSocket(left, decoy.fileno())  # the ring must use the socket's own descriptor
        made = {}
        consumer = threading.Thread(
            target=lambda: made.setdefault("consumer", hetmem.SharedRing.connect(right, SHAPE, DTYPE, timeout=30)))
        consumer.start()
        producer = hetmem.SharedRing.create(liar, SHAPE, DTYPE, slots=2, timeout=30)
        consumer.join(30)
    socket.socket.close(liar), right.close()
    data = rng.standard_normal(SHAPE).astype(DTYPE)
    producer.send(data)
    with made["consumer"].next() as frame:
        np.testing.assert_array_equal(frame.numpy(), data)
    producer.close(), made["consumer"].close()


def test_arrays_kept_past_close_and_delete_stay_mapped(rng):
    import gc

    producer, consumer = socket_ring()
    slot = producer.slot()
    written = np.asarray(slot)  # not revoked: kept against the rule, but never unmapped
    data = rng.standard_normal(SHAPE).astype(DTYPE)
    written[...] = data
    producer.publish()
    frame = consumer.next()
    kept = frame.numpy()
    frame.release()
    producer.close(), consumer.close()
    del producer, consumer, slot, frame
    gc.collect()
    np.testing.assert_array_equal(kept, data)  # the mapping is still there
    written[...] = -data
    np.testing.assert_array_equal(kept, -data)


def test_every_order_of_producer_calls_after_close():
    producer, consumer = socket_ring()
    producer.close()
    producer.close()  # again: nothing
    with pytest.raises(hetmem.HetmemError, match="closed"):
        producer.slot()
    with pytest.raises(ValueError, match="no slot is being filled"):
        producer.publish()
    producer.cancel()
    with pytest.raises(StopIteration):
        consumer.next()
    consumer.close()
    consumer.close()
    with pytest.raises(hetmem.HetmemError, match="closed"):
        consumer._native.next_frame()


def _settings(sock):
    """What the ring may not change of a caller's socket: its file flags (O_NONBLOCK), its
    receive timeout at the OS level, and Python's own timeout."""
    import fcntl
    return (fcntl.fcntl(sock.fileno(), fcntl.F_GETFL),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16),
            sock.gettimeout())


@pytest.mark.parametrize("left_timeout, right_timeout", [(0.0, 7.5), (None, 0.0), (3.0, None)])
def test_the_callers_socket_settings_are_left_as_they_were(rng, left_timeout, right_timeout):
    left, right = socket.socketpair()
    left.settimeout(left_timeout), right.settimeout(right_timeout)
    before = (_settings(left), _settings(right))
    made = {}
    consumer = threading.Thread(
        target=lambda: made.setdefault("consumer", hetmem.SharedRing.connect(right, SHAPE, DTYPE, timeout=30)))
    consumer.start()
    producer = hetmem.SharedRing.create(left, SHAPE, DTYPE, slots=2, timeout=30)
    consumer.join(30)
    assert (_settings(left), _settings(right)) == before
    data = rng.standard_normal(SHAPE).astype(DTYPE)
    producer.send(data)
    with made["consumer"].next() as frame:
        np.testing.assert_array_equal(frame.numpy(), data)
    producer.close(), made["consumer"].close()
    assert (_settings(left), _settings(right)) == before
    left.close(), right.close()


def _interrupted_within(wait, seconds=0.3):
    """Runs `wait` (which would block for ever) with SIGINT sent to this process after
    `seconds`; how long until KeyboardInterrupt came out of it."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            wait()
    finally:
        timer.cancel()
    return time.monotonic() - start


def test_ctrl_c_interrupts_a_wait_for_a_frame_a_slot_or_a_peer():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    producer, consumer = socket_ring(slots=1)
    # A frame that never comes (timeout=None: for ever).
    took = _interrupted_within(consumer.next)
    assert 0.3 <= took < 3.0, took
    # A slot that never comes free: the one slot holds a frame nobody takes.
    producer.send(np.ones(SHAPE, DTYPE))
    took = _interrupted_within(producer.slot)
    assert 0.3 <= took < 3.0, took
    # Both rings still work after the interrupt.
    with consumer.next() as frame:
        np.testing.assert_array_equal(frame.numpy(), np.ones(SHAPE, DTYPE))
    producer.close(), consumer.close()
    # A peer that connected but never says a word, waited for with no timeout.
    silent, other = socket.socketpair()
    took = _interrupted_within(lambda: hetmem.SharedRing.create(silent, SHAPE, DTYPE, timeout=None))
    assert 0.3 <= took < 3.0, took
    silent.close(), other.close()


def test_next_with_a_timeout_leaves_the_ring_as_it_was(rng):
    producer, consumer = socket_ring()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"pid {os.getpid()}"):
            consumer.next(timeout=0.3)
        waited = time.monotonic() - started
        assert 0.29 <= waited < 5.0, waited
        with pytest.raises(TimeoutError):
            consumer.next(timeout=0)  # only looks
        data = [rng.standard_normal(SHAPE).astype(DTYPE) for _ in range(2)]
        producer.send(data[0])
        with consumer.next(timeout=0) as frame:  # there already: no wait
            assert frame.index == 0
            np.testing.assert_array_equal(frame.numpy(), data[0])
        # A frame published while the consumer waits comes out within its timeout.
        later = threading.Timer(0.2, lambda: producer.send(data[1]))
        later.start()
        with consumer.next(timeout=30) as frame:
            assert frame.index == 1
            np.testing.assert_array_equal(frame.numpy(), data[1])
        later.join()
        for timeout in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="timeout"):
                consumer.next(timeout=timeout)
        for timeout in ("1", True):
            with pytest.raises(TypeError, match="timeout"):
                consumer.next(timeout=timeout)
        producer.close()
        with pytest.raises(StopIteration):
            consumer.next(timeout=5)
    finally:
        producer.close()
        consumer.close()


def test_a_ring_of_more_slots_than_the_consumer_takes_is_refused_before_registering():
    # The producer is another process: each slot it offers would be registered (pinned) here.
    left, right = socket.socketpair()
    made = {}

    def produce():
        try:
            hetmem.SharedRing.create(left, SHAPE, DTYPE, slots=8, timeout=30)
        except Exception as error:  # noqa: BLE001 - the refusal is what is checked
            made["producer"] = error

    producer = threading.Thread(target=produce)
    producer.start()
    with pytest.raises(ValueError, match="offers 8 slots .* takes at most 3"):
        hetmem.SharedRing.connect(right, SHAPE, DTYPE, timeout=30, max_slots=3)
    producer.join(30)
    assert "refused" in str(made["producer"]), made
    left.close(), right.close()
    for bad, kind in ((0, ValueError), (65, ValueError), (-1, ValueError), (2.5, TypeError)):
        mine, theirs = socket.socketpair()
        with pytest.raises(kind, match="max_slots"):
            hetmem.SharedRing.connect(mine, SHAPE, DTYPE, timeout=1, max_slots=bad)
        mine.close(), theirs.close()


def test_timeouts_too_long_for_the_clock_wait_for_ever_and_the_native_half_agrees(rng):
    # 1e300 s and 10**400 s are finite numbers of seconds: they were refused as if they were not
    # (1e300: "give a finite number", from the native half) or raised an OverflowError with no
    # word of the timeout (10**400); any wait longer than the clock holds is a wait for ever.
    producer, consumer = socket_ring()
    try:
        data = [rng.standard_normal(SHAPE).astype(DTYPE) for _ in range(4)]
        for index, timeout in enumerate((1e300, 10**400, 10**19, np.float64(1e12))):
            later = threading.Timer(0.1, lambda: producer.send(data[index]))
            later.start()
            with consumer.next(timeout=timeout) as frame:
                assert frame.index == index
                np.testing.assert_array_equal(frame.numpy(), data[index])
            later.join()
        for timeout in (-(10**400), -1e-300):
            with pytest.raises(ValueError, match="finite number of seconds >= 0"):
                consumer.next(timeout=timeout)
        with pytest.raises(TimeoutError, match=r"within 0 s"):
            consumer.next(timeout=-0.0)  # -0.0 is 0: only looks
        # The native half, given such a float straight, waits too; NaN and inf it refuses.
        later = threading.Timer(0.1, lambda: producer.send(data[0]))
        later.start()
        index, _, hold = consumer._native.next_frame(1e300)
        assert index == 4
        hold.release()
        later.join()
        for timeout in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match="finite number of seconds >= 0"):
                consumer._native.next_frame(timeout)
    finally:
        producer.close()
        consumer.close()
