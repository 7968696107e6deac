"""Ctrl-C (SIGINT) ends the calls that wait with the interpreter released: a FrameRing's takes
on a full ring whose consumer is gone or an empty ring whose producer is, and a long
hetmem.load. Each runs in a child interpreter that says when it starts waiting; the test
sends SIGINT a moment later and expects KeyboardInterrupt within a couple of seconds (a hang
is a TimeoutExpired, a failure), then checks that the ring, or the next load, still works."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

#: What the child prints just before the call that waits.
WAITING = "waiting"
#: How long after that line the SIGINT is sent: the call is inside its wait by then.
SETTLE = 0.3
#: How long the child may take to raise KeyboardInterrupt after the SIGINT.
PROMPT = 2.0


def interrupt_child(body: str, timeout: float = 60) -> tuple:
    """Runs `body` in a fresh interpreter, sends it SIGINT `SETTLE` s after it printed
    `WAITING`, and returns (the time.monotonic() of the SIGINT, exit status, stdout, stderr);
    a child that does not exit in `timeout` s fails the test. The child calls `caught()` when
    the exception reaches it, which prints "KeyboardInterrupt at T", T its own time.monotonic()
    (one clock for every process): what it does after (its checks, its exit) is not timed."""
    prelude = ("import sys, time, numpy as np, hetmem\ndef invert(f, o, s): np.subtract(255, f, out=o)\n"
               "def caught(): print(f'KeyboardInterrupt at {time.monotonic()}', flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(body)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while True:
            line = child.stdout.readline()
            if not line:
                _, err = child.communicate(timeout=timeout)
                pytest.fail(f"the child ended before it waited: {''.join(lines)}\n{err}")
            lines.append(line)
            if line.strip() == WAITING:
                break
        time.sleep(SETTLE)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still waiting {timeout} s after SIGINT: the wait does not hear Ctrl-C")
        return sent, child.returncode, "".join(lines) + out, err
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def check_interrupted(result: tuple, after: str) -> None:
    """The child caught KeyboardInterrupt promptly, then printed `after` (its check that what
    it waited on still works) and exited 0."""
    sent, status, out, err = result
    caught = re.search(r"^KeyboardInterrupt at ([0-9.]+)$", out, re.MULTILINE)
    assert caught, f"no KeyboardInterrupt: status {status}\n{out}\n{err}"
    seconds = float(caught.group(1)) - sent
    assert 0 <= seconds < PROMPT, f"KeyboardInterrupt came {seconds:.3f} s after SIGINT:\n{out}\n{err}"
    assert status == 0 and after in out, f"status {status}\n{out}\n{err}"


def test_submit_to_a_full_ring_with_no_consumer_is_interrupted_and_the_ring_still_works():
    check_interrupted(interrupt_child(f"""
        rng = np.random.default_rng()
        frames = [rng.integers(0, 256, (5, 7), dtype=np.uint8) for _ in range(2)]
        ring = hetmem.FrameRing((5, 7), stage=invert, strategy="cpu", slots=1, views="raw")
        ring.submit(frames[0])
        print("{WAITING}", flush=True)
        try:
            ring.submit(frames[1])
            print("submitted into a full ring")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        # Nothing was taken: frame 0 is the ring's one frame, and it takes frame 1 once drained.
        assert (ring.submitted, ring.delivered) == (1, 0), (ring.submitted, ring.delivered)
        index, out = ring.next_result()
        assert index == 0 and np.array_equal(np.asarray(out), 255 - frames[0])
        assert ring.submit(frames[1]) == 1
        index, out = ring.next_result()
        assert index == 1 and np.array_equal(np.asarray(out), 255 - frames[1])
        print("ring ok")
    """), "ring ok")


def test_a_slot_of_a_full_ring_is_interrupted_and_the_ring_still_works():
    check_interrupted(interrupt_child(f"""
        rng = np.random.default_rng()
        frame = rng.integers(0, 256, (5, 7), dtype=np.uint8)
        ring = hetmem.FrameRing((5, 7), stage=invert, strategy="cpu", slots=1, views="raw")
        ring.submit(frame)
        print("{WAITING}", flush=True)
        try:
            with ring.slot():
                print("a slot of a full ring")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        index, out = ring.next_result()
        assert index == 0 and np.array_equal(np.asarray(out), 255 - frame)
        with ring.slot() as slot:
            slot[...] = frame
        print("ring ok")
    """), "ring ok")


@pytest.mark.parametrize("wait", ["next_result", "results"])
def test_a_result_of_an_empty_ring_is_interrupted_and_the_ring_still_works(wait):
    take = "ring.next_result()" if wait == "next_result" else "next(iter(ring.results()))"
    check_interrupted(interrupt_child(f"""
        rng = np.random.default_rng()
        frame = rng.integers(0, 256, (5, 7), dtype=np.uint8)
        ring = hetmem.FrameRing((5, 7), stage=invert, strategy="cpu", slots=2, views="raw")
        print("{WAITING}", flush=True)
        try:
            {take}
            print("a result of an empty ring")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        assert (ring.submitted, ring.delivered) == (0, 0)
        assert ring.submit(frame) == 0
        index, out = {take}
        assert index == 0 and np.array_equal(np.asarray(out), 255 - frame)
        print("ring ok")
    """), "ring ok")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("call", ["feed", "map_file"])
def test_a_fifo_waiting_for_its_writer_is_interrupted_and_read_after(tmp_path, call):
    fifo = tmp_path / "frames.fifo"
    os.mkfifo(fifo)
    take = (f"ring.feed({str(fifo)!r}, format='raw', close=False)" if call == "feed"
            else f"next(iter(ring.map_file({str(fifo)!r}, format='raw')))")
    check_interrupted(interrupt_child(f"""
        import threading
        rng = np.random.default_rng()
        frames = rng.integers(0, 256, (3, 5, 7), dtype=np.uint8)
        ring = hetmem.FrameRing((5, 7), stage=invert, strategy="cpu", slots=4, views="raw")
        print("{WAITING}", flush=True)
        try:
            {take}  # no writer: the open waits
            print("the FIFO opened without a writer")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        # Nothing stays behind: the FIFO opens and reads whole once a writer comes.
        def write():
            with open({str(fifo)!r}, "wb") as out:
                out.write(frames.tobytes())
        threading.Thread(target=write, daemon=True).start()
        ring = hetmem.FrameRing((5, 7), stage=invert, strategy="cpu", slots=4, views="raw")  # map_file closed its own
        assert ring.feed({str(fifo)!r}, format="raw") == 3
        got = [np.array(out) for _, out in ring.results()]
        assert len(got) == 3 and all(np.array_equal(g, 255 - f) for g, f in zip(got, frames))
        print("fifo ok")
    """), "fifo ok")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("format", ["raw", "y4m"])
def test_a_read_waiting_on_a_stalled_writer_is_interrupted_and_the_ring_still_works(tmp_path, format):
    """A writer that sends a frame and a half, then stalls with the FIFO open: the read of the
    second frame waits in read(2), which Ctrl-C used to leave waiting."""
    fifo = tmp_path / "stalled.fifo"
    os.mkfifo(fifo)
    check_interrupted(interrupt_child(f"""
        import threading
        rng = np.random.default_rng()
        frames = rng.integers(0, 256, (2, 6, 8), dtype=np.uint8)
        head = b"YUV4MPEG2 W8 H6 F25:1 Ip A1:1 Cmono\\n" if {format!r} == "y4m" else b""
        line = b"FRAME\\n" if {format!r} == "y4m" else b""
        stalled = threading.Event()
        def write():
            with open({str(fifo)!r}, "wb", buffering=0) as out:
                out.write(head + line + frames[0].tobytes() + line + frames[1].tobytes()[:20])
                stalled.wait()  # the FIFO stays open: the reader waits for the rest
        threading.Thread(target=write, daemon=True).start()
        ring = hetmem.FrameRing((6, 8), stage=invert, strategy="cpu", slots=4, views="raw")
        print("{WAITING}", flush=True)
        try:
            ring.feed({str(fifo)!r}, format={"raw" if format == "raw" else None!r}, close=False)
            print("the feed ended without the second frame")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        stalled.set()
        # The first frame went in whole, and the ring still works.
        ring.close()
        got = [np.array(out) for _, out in ring.results()]
        assert len(got) == 1 and np.array_equal(got[0], 255 - frames[0]), len(got)
        ring = hetmem.FrameRing((6, 8), stage=invert, strategy="cpu", slots=4, views="raw")
        ring.submit(frames[1]); ring.close()
        assert np.array_equal(np.array(next(ring.results())[1]), 255 - frames[1])
        print("ring ok")
    """), "ring ok")


def safetensors_file(path, name, data: bytes) -> str:
    """A safetensors file of one U8 tensor `name` holding `data`."""
    header = json.dumps({name: {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(header)) + header)
        file.write(data)
    return str(path)


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory):
    """A 384 MiB tensor: read in 4 KiB pieces by one thread, seconds on the CPU backend."""
    path = tmp_path_factory.mktemp("interrupts") / "big.safetensors"
    return safetensors_file(path, "big", np.random.default_rng().bytes(384 << 20))


@pytest.mark.parametrize("progress", ["callback", "none"])
def test_a_long_load_is_interrupted_and_the_next_load_works(slow_checkpoint, tmp_path, rng, progress):
    small = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    small_path = safetensors_file(tmp_path / "small.safetensors", "small", small.tobytes())
    np.save(tmp_path / "small.npy", small)
    callback = "lambda done, total: seen.append((done, total))" if progress == "callback" else "False"
    result = interrupt_child(f"""
        seen = []
        print("{WAITING}", flush=True)
        started = time.monotonic()
        try:
            hetmem.load({slow_checkpoint!r}, device="cpu", threads=1, chunk_bytes=4096, progress={callback})
            print(f"the load ended after {{time.monotonic() - started:.2f}} s, uninterrupted")
            sys.exit(1)
        except KeyboardInterrupt:
            caught()
        if seen:
            done, total = seen[-1]
            print(f"progress {{done}} of {{total}}")
            assert done < total * 0.9, "the load had (nearly) finished: the test proves nothing"
        again = time.monotonic()
        loaded = hetmem.load({small_path!r}, device="cpu", progress=False)
        got = np.asarray(loaded["small"])
        expected = np.load({str(tmp_path / "small.npy")!r})
        assert np.array_equal(got, expected), "the load after the interrupt differs"
        print(f"load ok (the next load took {{time.monotonic() - again:.2f}} s)")
    """)
    check_interrupted(result, "load ok")
    if progress == "callback":
        assert "progress " in result[2], "the callback was never called during the load"
