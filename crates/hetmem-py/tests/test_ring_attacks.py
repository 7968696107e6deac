"""hetmem.FrameRing under misuse, as an attacker would try it from Python (the CPU backend):
views and holds kept past the ring, holds used twice or from another thread, the ring entered
again from its own stage, takes that could only wait for the calling thread itself, sizes no
machine holds. Each must end in an error or in valid memory, never in a hang, an abort or a
read of freed memory. Hangs and aborts are probed in a child interpreter with a time limit."""

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

import hetmem

SHAPE = (5, 7)
from test_ring import ON_GPU, cuda_torch


def invert(frame, out, stream):
    np.subtract(255, frame, out=out)


def frame_of(rng):
    return rng.integers(0, 256, SHAPE, dtype=np.uint8)


def in_child(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter: a hang becomes a TimeoutExpired, an abort a signal."""
    prelude = "import numpy as np, hetmem\nSHAPE = (5, 7)\ndef invert(f, o, s): np.subtract(255, f, out=o)\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=timeout)


def within(seconds: float, body) -> None:
    """Runs `body` on a daemon thread (holds are bound to the thread that took them): a regression
    that waits for ever fails the test and leaves the thread behind instead of hanging the run."""
    failed = []

    def run():
        try:
            body()
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: the ring waits for this thread itself"
    if failed:
        raise failed[0]


def test_views_and_holds_kept_past_the_ring_read_valid_memory(rng):
    frames = [frame_of(rng) for _ in range(2)]
    kept = []

    def stage(frame, out, stream):
        invert(frame, out, stream)
        kept.append((frame, out))  # the stage's own views, kept past the call

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", slots=2, views="raw")
    ring.submit(frames[0])
    hold = ring._ring.take_output(True)
    memory = hold.memory()
    held_input = ring._ring.take_input(True)
    ring.close()
    del ring
    gc.collect()
    # The ring object is gone; every view and hold still names live memory.
    out = np.asarray(hetmem.Buffer(memory, SHAPE, np.uint8))
    np.testing.assert_array_equal(out, 255 - frames[0])
    np.testing.assert_array_equal(kept[0][0], frames[0])
    np.testing.assert_array_equal(kept[0][1], 255 - frames[0])
    hold.release()
    view = np.asarray(hetmem.Buffer(held_input.memory(), SHAPE, np.uint8))
    view[...] = frames[1]
    assert held_input.submit() == 1  # its stage still runs: the ring lives while its holds do
    np.testing.assert_array_equal(kept[1][1], 255 - frames[1])
    del hold, held_input, memory, kept
    gc.collect()
    np.testing.assert_array_equal(out, 255 - frames[0])  # a NumPy view alone keeps it too


def test_holds_used_twice_raise_and_lose_nothing(rng):
    frame = frame_of(rng)
    ring = hetmem.FrameRing(SHAPE, stage=invert, strategy="cpu", slots=2, views="raw")
    hold = ring._ring.take_input(True)
    np.asarray(hetmem.Buffer(hold.memory(), SHAPE, np.uint8))[...] = frame
    assert hold.submit() == 0
    with pytest.raises(ValueError, match="already submitted"):
        hold.submit()
    with pytest.raises(ValueError, match="already submitted"):
        hold.memory()
    hold.cancel()  # after a submit: nothing to give back
    cancelled = ring._ring.take_input(True)
    cancelled.cancel()
    cancelled.cancel()
    with pytest.raises(ValueError, match="already submitted or cancelled"):
        cancelled.submit()
    out = ring._ring.take_output(True)
    np.testing.assert_array_equal(np.asarray(hetmem.Buffer(out.memory(), SHAPE, np.uint8)), 255 - frame)
    out.release()
    out.release()
    with pytest.raises(ValueError, match="released"):
        out.memory()
    assert ring.submitted == 1 and ring.delivered == 1


def test_a_hold_used_from_another_thread_is_refused_and_stays_usable(rng):
    frame = frame_of(rng)
    ring = hetmem.FrameRing(SHAPE, stage=invert, strategy="cpu", slots=2, views="raw")
    hold = ring._ring.take_input(True)
    caught = []

    def elsewhere():
        try:
            hold.submit()
        except BaseException as error:  # PyO3 refuses an unsendable object's use as a panic
            caught.append(error)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(caught) == 1 and "unsendable" in str(caught[0])
    np.asarray(hetmem.Buffer(hold.memory(), SHAPE, np.uint8))[...] = frame
    assert hold.submit() == 0
    out = ring._ring.take_output(True)
    np.testing.assert_array_equal(np.asarray(hetmem.Buffer(out.memory(), SHAPE, np.uint8)), 255 - frame)


def test_the_ring_entered_again_from_its_stage_raises(rng):
    within(30, lambda: entered_again_from_the_stage(rng))


def entered_again_from_the_stage(rng):
    seen = {}

    def stage(frame, out, stream):
        invert(frame, out, stream)
        for name, take in [("input", lambda: ring._ring.take_input(True)),
                           ("output", lambda: ring._ring.take_output(True))]:
            try:
                take()
            except hetmem.HetmemError as error:
                seen[name] = str(error)

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", slots=2, views="raw")
    frame = frame_of(rng)
    ring.submit(frame)
    assert "still held" in seen["input"]
    assert "wait for ever" in seen["output"] and "stage" in seen["output"]
    _, out = ring.next_result()
    np.testing.assert_array_equal(out.numpy(), 255 - frame)
    ring._release()  # on this thread: the hold is bound to it


def test_a_stage_that_takes_a_result_inside_hangs_no_interpreter():
    # Before the fix this waited for ever, the interpreter let go (deaf to Ctrl-C).
    done = in_child("""
        ring = None
        def stage(frame, out, stream):
            ring.next_result()
        ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", slots=2, views="raw")
        ring.submit(np.ones(SHAPE, np.uint8))
        try:
            ring.next_result()
        except hetmem.StageError as error:
            print("failed:", error.__cause__)
    """)
    assert done.returncode == 0, done.stderr
    assert "wait for ever" in done.stdout


def test_taking_a_result_while_holding_the_slot_it_needs_raises(rng):
    within(30, lambda: result_while_holding_its_slot(rng))


def result_while_holding_its_slot(rng):
    ring = hetmem.FrameRing(SHAPE, stage=invert, strategy="cpu", slots=2, views="raw")
    with ring.slot() as view:
        view[...] = frame_of(rng)
        with pytest.raises(hetmem.HetmemError, match="wait for ever.*submit it first"):
            ring.next_result()
    assert ring.next_result()[0] == 0
    ring._release()


def test_taking_a_slot_of_a_full_ring_while_holding_its_oldest_result_raises(rng):
    within(30, lambda: slot_while_holding_the_oldest_result(rng))


def slot_while_holding_the_oldest_result(rng):
    ring = hetmem.FrameRing(SHAPE, stage=invert, strategy="cpu", slots=1, views="raw")
    frame = frame_of(rng)
    ring.submit(frame)
    out = ring._ring.take_output(True)
    with pytest.raises(hetmem.HetmemError, match="wait for ever.*release it first"):
        ring._ring.take_input(True)
    np.testing.assert_array_equal(np.asarray(hetmem.Buffer(out.memory(), SHAPE, np.uint8)), 255 - frame)
    out.release()
    ring._ring.take_input(True).cancel()


def test_another_thread_may_still_wait_for_a_frame_being_filled(rng):
    ring = hetmem.FrameRing(SHAPE, stage=invert, strategy="cpu", slots=2, views="raw")
    frame = frame_of(rng)
    got = []

    def consume():
        got.append(np.array(ring.next_result()[1]))
        ring._release()  # on this thread: the hold is bound to it

    consumer = threading.Thread(target=consume)
    with ring.slot() as view:
        consumer.start()  # waits for this frame: legitimate, the producer is another thread
        view[...] = frame
    consumer.join(timeout=30)
    assert not consumer.is_alive()
    np.testing.assert_array_equal(got[0], 255 - frame)


@pytest.mark.parametrize("shape, slots", [((1,), 1 << 40), ((1 << 38,), 1)])
def test_sizes_no_machine_holds_raise_instead_of_aborting(shape, slots):
    done = in_child(f"""
        try:
            hetmem.FrameRing({shape!r}, stage=invert, strategy="cpu", slots={slots}, views="raw")
        except (MemoryError, ValueError, hetmem.HetmemError) as error:
            print("refused:", type(error).__name__, error)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout


class _Pipeline:
    """An object holding a ring whose stage is its own bound method: a cycle through the ring."""

    def __init__(self):
        self.ring = hetmem.FrameRing(SHAPE, stage=self.stage, strategy="cpu", slots=2, views="raw")
        self.frames = 0

    def stage(self, frame, out, stream):
        self.frames += 1
        invert(frame, out, stream)


def test_a_ring_whose_stage_refers_to_it_is_collected(rng):
    pipeline = _Pipeline()
    frame = frame_of(rng)
    pipeline.ring.submit(frame)
    _, out = pipeline.ring.next_result()
    kept = out.numpy()  # a view of the ring's memory, kept past the cycle's collection
    pipeline.ring._release()
    gone = weakref.ref(pipeline)
    del pipeline, out
    gc.collect()
    assert gone() is None, "the ring and its stage's owner leak: the collector cannot see the cycle"
    np.testing.assert_array_equal(kept, 255 - frame)


def test_a_held_slot_keeps_the_cycle_and_its_stage_intact(rng):
    pipeline = _Pipeline()
    hold = pipeline.ring._ring.take_input(True)
    gone = weakref.ref(pipeline)
    del pipeline
    gc.collect()
    assert gone() is not None  # the hold may still submit: its stage must be whole
    frame = frame_of(rng)
    np.asarray(hetmem.Buffer(hold.memory(), SHAPE, np.uint8))[...] = frame
    assert hold.submit() == 0
    assert gone().frames == 1
    out = gone().ring._ring.take_output(True)
    np.testing.assert_array_equal(np.asarray(hetmem.Buffer(out.memory(), SHAPE, np.uint8)), 255 - frame)
    del hold, out
    gc.collect()
    assert gone() is None


def test_a_slot_submitted_after_its_ring_is_gone_leaks_nothing(rng):
    seen = []

    def stage(frame, out, stream):
        invert(frame, out, stream)
        seen.append(weakref.ref(frame.base))  # the view the stage was given (a hetmem.Buffer)
        raise KeyError("failed after the ring went")  # kept for no consumer: must not hold it

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", slots=2, views="raw")
    hold = ring._ring.take_input(True)
    del ring
    gc.collect()
    np.asarray(hetmem.Buffer(hold.memory(), SHAPE, np.uint8))[...] = frame_of(rng)
    hold.submit()
    del hold
    gc.collect()
    assert len(seen) == 1 and seen[0]() is None, "the stage's views keep the ring they view alive"


@pytest.mark.skipif(not ON_GPU, reason="skipped: no CUDA device")
@pytest.mark.parametrize("strategy", ["pinned-async", "zero-copy"])
def test_a_stream_and_tensors_kept_past_the_ring_still_work(rng, strategy):
    """The stage's torch stream wraps the ring's CUDA stream without owning it: kept past the ring,
    it must keep the stream alive (as the tensors keep the slots' memory), not name a destroyed one."""
    torch = cuda_torch()
    kept = {}

    def stage(frame, out, stream):
        torch.sub(255, frame, out=out)
        kept.update(stream=stream, out=out)

    frame = frame_of(rng)
    with hetmem.FrameRing(SHAPE, stage=stage, strategy=strategy, slots=2, views="torch") as ring:
        ring.submit(frame)
        _, out = ring.next_result()
        np.testing.assert_array_equal(out.numpy(), 255 - frame)
    del ring, out
    gc.collect()
    torch.cuda.synchronize()
    stream, tensor = kept["stream"], kept["out"]
    with torch.cuda.stream(stream):
        doubled = tensor.to(torch.int32) * 2  # queued on the kept stream, reading the kept memory
    stream.synchronize()
    np.testing.assert_array_equal(doubled.cpu().numpy(), (255 - frame).astype(np.int32) * 2)
