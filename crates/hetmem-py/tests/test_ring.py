"""hetmem.FrameRing: frames through a Python stage by every strategy, in order, against a NumPy
reference of the stage; the hand-off (LentError); stage exceptions with the frame's index;
bad arguments; closing with frames in flight.

The CPU strategy runs everywhere (CI's CPU backend). The GPU strategies run where a CUDA device
is (skipped otherwise, visibly; HETMEM_REQUIRE_GPU=1 makes a missing GPU a failure), with torch
stages when torch has CUDA and with CUDA-array-interface stages through CuPy otherwise."""

import gc
import os
import threading

import numpy as np
import pytest

import hetmem

ON_GPU = hetmem.device().backend == "cuda"
if not ON_GPU and os.environ.get("HETMEM_REQUIRE_GPU") == "1":
    raise RuntimeError(f"HETMEM_REQUIRE_GPU=1 but no GPU: {hetmem.device().fallback_reason}")

GPU_STRATEGIES = ["copy", "pinned-async", "zero-copy", "managed", "hybrid"]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="skipped: no CUDA device")
REQUIRED = os.environ.get("HETMEM_REQUIRE_GPU") == "1"


def cuda_torch():
    """torch with CUDA: skipped without it, a failure where the GPU run is required."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        if REQUIRED:
            pytest.fail("HETMEM_REQUIRE_GPU=1: the ring's GPU tests need torch with CUDA")
        pytest.skip("torch with CUDA is not installed")
    return torch

SHAPE = (37, 53, 3)  # odd sizes: no alignment hides an off-by-one


def box3_reference(frame: np.ndarray) -> np.ndarray:
    """The 3x3 box blur the stages compute, in float64: edge-replicated, rounded half up."""
    pad = np.pad(frame.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="edge")
    total = sum(pad[i:i + frame.shape[0], j:j + frame.shape[1]] for i in range(3) for j in range(3))
    return np.floor(total / 9.0 + 0.5).astype(np.uint8)


def box3_numpy(frame, out, stream):
    """The box blur as a NumPy stage (the CPU path), integer arithmetic."""
    pad = np.pad(frame.astype(np.uint32), ((1, 1), (1, 1), (0, 0)), mode="edge")
    total = sum(pad[i:i + frame.shape[0], j:j + frame.shape[1]] for i in range(3) for j in range(3))
    out[...] = (total * 2 + 9) // 18


def invert_numpy(frame, out, stream):
    np.subtract(255, frame, out=out)


def frames_of(rng, count, shape=SHAPE):
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(count)]


def stream_all(ring, frames):
    """Every result of `frames` through `ring` (from one thread), copied out, in order."""
    return [(index, np.array(out)) for index, out in ring.map(frames)]


# -- the CPU strategy (every machine) --------------------------------------------------------

def test_strategies_are_hetmem_s_own():
    assert set(hetmem.ring.STRATEGIES) == {"cpu", "copy", "pinned-async", "zero-copy", "managed", "hybrid", "auto"}
    assert "mapped" in hetmem.ring.STRATEGIES["zero-copy"]


@pytest.mark.parametrize("slots", [1, 3, 5])
def test_cpu_ring_delivers_every_frame_in_order_matching_numpy(rng, slots):
    frames = frames_of(rng, 40)
    ring = hetmem.FrameRing(SHAPE, np.uint8, stage=box3_numpy, strategy="cpu", slots=slots, views="raw")
    assert ring.strategy == "cpu" and ring.slots == slots
    got = stream_all(ring, frames)
    assert [index for index, _ in got] == list(range(40))
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, box3_reference(frame), err_msg=f"frame {index}")
    assert ring.submitted == 40 and ring.delivered == 40


def test_auto_on_the_cpu_backend_is_cpu(rng):
    if ON_GPU:
        pytest.skip("auto resolves to a GPU strategy here")
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, views="raw")
    assert ring.strategy == "cpu"


def test_outputs_of_another_dtype_and_shape(rng):
    def channel_sum(frame, out, stream):
        out[...] = frame.astype(np.float32).sum(axis=2)
    frames = frames_of(rng, 7)
    ring = hetmem.FrameRing(SHAPE, stage=channel_sum, strategy="cpu", out_shape=SHAPE[:2], out_dtype=np.float32,
                            views="raw")
    for (index, out), frame in zip(stream_all(ring, frames), frames):
        assert out.dtype == np.float32 and out.shape == SHAPE[:2]
        np.testing.assert_array_equal(out, frame.astype(np.float32).sum(axis=2))


def test_a_slot_is_written_in_place_and_lent_once_submitted(rng):
    frame = frames_of(rng, 1)[0]
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=2, views="raw")
    with ring.slot() as view:
        view[...] = frame
        np.testing.assert_array_equal(view.numpy(), frame)
    with pytest.raises(hetmem.LentError, match="frame 0 was submitted"):
        view.numpy()
    with pytest.raises(hetmem.LentError):
        np.asarray(view)
    with pytest.raises(hetmem.LentError):
        view[0, 0, 0] = 1
    index, out = ring.next_result()
    assert index == 0
    np.testing.assert_array_equal(np.asarray(out), 255 - frame)
    with pytest.raises(ValueError):
        np.asarray(out)[0, 0, 0] = 0  # results are read-only


def test_a_released_result_raises_lent_error(rng):
    frames = frames_of(rng, 2)
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=2, views="raw")
    for frame in frames:
        ring.submit(frame)
    _, first = ring.next_result()
    kept = np.array(first)
    _, second = ring.next_result()
    with pytest.raises(hetmem.LentError, match="frame 0's result was released"):
        np.asarray(first)
    np.testing.assert_array_equal(kept, 255 - frames[0])
    np.testing.assert_array_equal(np.asarray(second), 255 - frames[1])


def test_one_thread_taking_results_and_slots_in_turn_on_a_full_ring(rng):
    frames = frames_of(rng, 6)
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=2, views="raw")
    ring.submit(frames[0])
    ring.submit(frames[1])
    got = []
    for frame in frames[2:]:
        index, out = ring.next_result()  # the ring is full, and this thread holds frame `index`
        got.append((index, np.array(out)))
        ring.submit(frame)  # releases it first: the slot it frees is the one the frame needs
        with pytest.raises(hetmem.LentError, match="this thread took a slot"):
            np.asarray(out)
    ring.close()
    got += [(index, np.array(out)) for index, out in ring.results()]
    assert [index for index, _ in got] == list(range(6))
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, 255 - frame)


def test_an_empty_ring_does_not_block_when_asked_not_to():
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=1, views="raw")
    with pytest.raises(BlockingIOError):
        ring.next_result(block=False)
    ring.submit(np.zeros(SHAPE, np.uint8) + 3)
    with pytest.raises(BlockingIOError, match="full"):
        ring.submit(np.zeros(SHAPE, np.uint8), block=False)


def test_a_block_that_raises_gives_its_slot_back_unused(rng):
    frames = frames_of(rng, 2)
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=1, views="raw")
    with pytest.raises(KeyError):
        with ring.slot() as view:
            view[...] = frames[0]
            raise KeyError("the producer failed")
    with pytest.raises(hetmem.LentError, match="given back unused"):
        view.numpy()
    assert ring.submitted == 0
    ring.submit(frames[1])
    index, out = ring.next_result()
    assert index == 0
    np.testing.assert_array_equal(np.asarray(out), 255 - frames[1])


@pytest.mark.parametrize("strategy", ["cpu"] + (GPU_STRATEGIES if ON_GPU else []))
def test_a_stage_exception_names_its_frame_and_loses_no_earlier_frame(rng, strategy):
    k = 5
    frames = frames_of(rng, 9)
    seen = []

    def stage(frame, out, stream):
        seen.append(len(seen))
        if len(seen) - 1 == k:
            raise ZeroDivisionError("frame k is bad")
        if strategy == "cpu":
            invert_numpy(frame, out, stream)
        else:
            import torch
            torch.sub(255, frame, out=out)

    if strategy != "cpu":
        cuda_torch()
    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy=strategy, slots=3,
                            views="raw" if strategy == "cpu" else "torch")
    delivered = []
    with pytest.raises(hetmem.StageError) as error:
        for index, out in ring.map(frames):
            delivered.append((index, np.array(out)))
    assert error.value.index == k
    assert isinstance(error.value.__cause__, ZeroDivisionError)
    assert f"frame {k}" in str(error.value)
    assert [index for index, _ in delivered] == list(range(k))
    for index, out in delivered:
        np.testing.assert_array_equal(out, 255 - frames[index])
    # The ring goes on with the frames after k.
    rest = list(ring.results())
    assert [index for index, _ in rest] == list(range(k + 1, len(frames)))[:len(rest)]


def test_closing_with_frames_in_flight_still_delivers_them(rng):
    frames = frames_of(rng, 3)
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=3, views="raw")
    for frame in frames:
        ring.submit(frame)
    ring.close()
    with pytest.raises(hetmem.HetmemError, match="closed"):
        ring.submit(frames[0])
    got = [(index, np.array(out)) for index, out in ring.results()]
    assert [index for index, _ in got] == [0, 1, 2]
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, 255 - frame)
    assert ring.next_result() is None


def test_dropping_a_ring_with_frames_in_flight_and_views_kept(rng):
    frames = frames_of(rng, 2)
    ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=2, views="raw")
    ring.submit(frames[0])
    ring.submit(frames[1])
    _, out = ring.next_result()
    array = out.numpy()  # a NumPy view that holds the ring's memory
    del ring, out
    gc.collect()
    np.testing.assert_array_equal(array, 255 - frames[0])


def test_a_producer_thread_and_a_consumer(rng):
    frames = frames_of(rng, 30)
    ring = hetmem.FrameRing(SHAPE, stage=box3_numpy, strategy="cpu", slots=2, views="raw")

    def produce():
        for frame in frames:
            with ring.slot() as view:  # waits, the interpreter let go, while the ring is full
                view[...] = frame
        ring.close()

    producer = threading.Thread(target=produce)
    producer.start()
    got = [(index, np.array(out)) for index, out in ring.results()]
    producer.join()
    assert [index for index, _ in got] == list(range(30))
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, box3_reference(frame))


@pytest.mark.parametrize("shape, dtype, match", [
    ((0, 4), np.uint8, "holds no element"),
    ((-1, 4), np.uint8, "negative"),
    ((1 << 40, 1 << 40), np.uint8, "overflows"),
    ((2, 2), np.dtype([("a", np.uint8)]), "plain numeric dtype"),
    ((2, 2), object, "plain numeric dtype"),
    ((2, 2), ">f4", "native byte order"),
])
def test_bad_shapes_and_dtypes_are_refused(shape, dtype, match):
    with pytest.raises(ValueError, match=match):
        hetmem.FrameRing(shape, dtype, stage=invert_numpy, strategy="cpu", views="raw")


def test_bad_slot_counts_strategies_and_stages_are_refused():
    with pytest.raises(ValueError, match="at least one slot"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=0, views="raw")
    with pytest.raises(ValueError, match="negative"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", slots=-2, views="raw")
    with pytest.raises(ValueError, match="overflows"):
        hetmem.FrameRing((1 << 30, 1 << 30), stage=invert_numpy, strategy="cpu", slots=1 << 40, views="raw")
    with pytest.raises(ValueError, match="teleport.*pinned-async"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="teleport", views="raw")
    with pytest.raises(TypeError, match="not callable"):
        hetmem.FrameRing(SHAPE, stage=42, strategy="cpu", views="raw")
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        ring = hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="cpu", views="raw")
        ring.submit(np.zeros((2, 3), np.uint8))


def test_the_native_half_checks_what_it_is_given():
    native = hetmem._native.FrameRing
    dev = hetmem.device()
    good = ([4, 4], "|u1", 1)
    with pytest.raises(ValueError, match="says 1 bytes"):
        native(dev, "cpu", ([4, 4], "|u1", 8), good, 1, invert_numpy, lambda role, view: view)
    with pytest.raises(ValueError):
        native(dev, "cpu", ([4, 4], "|O8", 8), good, 1, invert_numpy, lambda role, view: view)
    with pytest.raises(ValueError, match="negative"):
        native(dev, "cpu", ([4, -4], "|u1", 1), good, 1, invert_numpy, lambda role, view: view)
    with pytest.raises(ValueError, match="not callable"):
        native(dev, "cpu", good, good, 1, 42, lambda role, view: view)


def test_graph_needs_torch_views_and_a_bool():
    with pytest.raises(ValueError, match="views='torch'"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="auto", views="raw", graph=True)
    with pytest.raises(TypeError, match="True or False"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy="auto", views="raw", graph="yes")


@pytest.mark.skipif(ON_GPU, reason="the CPU path, where graph=True changes nothing")
def test_graph_on_the_cpu_path_calls_the_stage_every_frame(rng):
    torch = pytest.importorskip("torch")
    frames = frames_of(rng, 9)
    calls = []

    def stage(frame, out, stream):
        calls.append(1)
        torch.sub(255, frame, out=out)

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", slots=2, views="torch", graph=True)
    got = stream_all(ring, frames)
    assert len(calls) == 9
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, 255 - frame)


@pytest.mark.skipif(ON_GPU, reason="the CPU backend's refusal of GPU strategies")
@pytest.mark.parametrize("strategy", GPU_STRATEGIES)
def test_gpu_strategies_on_the_cpu_backend_say_they_need_a_gpu(strategy):
    with pytest.raises(hetmem.HetmemError, match="needs a GPU"):
        hetmem.FrameRing(SHAPE, stage=invert_numpy, strategy=strategy, views="raw")


def test_torch_cpu_tensors_reach_a_cpu_stage(rng):
    torch = pytest.importorskip("torch")
    frames = frames_of(rng, 6)

    def stage(frame, out, stream):
        assert isinstance(frame, torch.Tensor) and isinstance(out, torch.Tensor) and stream is None
        torch.sub(255, frame, out=out)

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="cpu", views="torch")
    for (index, out), frame in zip(stream_all(ring, frames), frames):
        np.testing.assert_array_equal(out, 255 - frame)


# -- the GPU strategies ------------------------------------------------------------------------

def box3_torch(frame, out, stream):
    """The box blur as a torch stage: integer sums on the GPU, the reference's rounding."""
    import torch
    import torch.nn.functional as F
    x = frame.permute(2, 0, 1).unsqueeze(0).to(torch.int32)
    x = F.pad(x.to(torch.float32), (1, 1, 1, 1), mode="replicate").to(torch.int32)
    total = sum(x[:, :, i:i + frame.shape[0], j:j + frame.shape[1]] for i in range(3) for j in range(3))
    out.copy_(((total * 2 + 9) // 18).to(torch.uint8)[0].permute(1, 2, 0))


@needs_gpu
@pytest.mark.parametrize("strategy", GPU_STRATEGIES)
def test_every_gpu_strategy_matches_numpy_in_order(rng, strategy):
    torch = cuda_torch()
    frames = frames_of(rng, 64)

    def stage(frame, out, stream):
        assert frame.is_cuda and out.is_cuda
        assert torch.cuda.current_stream().cuda_stream == stream.cuda_stream
        box3_torch(frame, out, stream)

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy=strategy, slots=3, views="torch")
    assert ring.strategy == strategy
    got = stream_all(ring, frames)
    assert [index for index, _ in got] == list(range(64))
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, box3_reference(frame), err_msg=f"{strategy} frame {index}")


@needs_gpu
@pytest.mark.parametrize("strategy", ["pinned-async", "zero-copy", "hybrid"])
def test_a_graphed_stage_is_captured_once_a_slot_and_replayed_matching_numpy(rng, strategy):
    cuda_torch()
    frames = frames_of(rng, 48)
    calls = []

    def stage(frame, out, stream):
        calls.append(frame.data_ptr())
        box3_torch(frame, out, stream)

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy=strategy, slots=3, views="torch", graph=True)
    got = stream_all(ring, frames)
    assert [index for index, _ in got] == list(range(48))
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, box3_reference(frame), err_msg=f"{strategy} graphed frame {index}")
    # Each slot's stage ran twice in Python (its first frame eagerly, then the capture); every
    # later frame was a replay.
    assert len(calls) == 2 * ring.slots, len(calls)


@needs_gpu
@pytest.mark.parametrize("strategy", ["zero-copy", "hybrid"])
def test_mapped_strategies_hand_the_stage_the_host_bytes_in_place(rng, strategy):
    cuda_torch()
    ring = hetmem.FrameRing(SHAPE, stage=lambda f, o, s: o.copy_(f), strategy=strategy, views="torch")
    assert ring.device_bytes == 0  # no device buffer: the stage reads and writes mapped host memory
    pinned = hetmem.FrameRing(SHAPE, stage=lambda f, o, s: o.copy_(f), strategy="pinned-async", views="torch")
    assert pinned.device_bytes > 0
    frame = frames_of(rng, 1)[0]
    (index, out), = stream_all(ring, [frame])
    np.testing.assert_array_equal(out, frame)


@needs_gpu
def test_raw_views_carry_the_cuda_array_interface(rng):
    cupy = pytest.importorskip("cupy")
    frames = frames_of(rng, 8)

    def stage(frame, out, stream):
        with cupy.cuda.ExternalStream(stream):
            cupy.subtract(255, cupy.asarray(frame), out=cupy.asarray(out))

    ring = hetmem.FrameRing(SHAPE, stage=stage, strategy="zero-copy", views="raw")
    for (index, out), frame in zip(stream_all(ring, frames), frames):
        np.testing.assert_array_equal(out, 255 - frame)


@needs_gpu
def test_a_gpu_slot_is_lent_until_its_result_comes_out(rng):
    torch = cuda_torch()
    frame = frames_of(rng, 1)[0]

    def slow(frame_view, out, stream):
        torch.cuda._sleep(50_000_000)  # keeps the GPU busy on the ring's stream
        torch.sub(255, frame_view, out=out)

    ring = hetmem.FrameRing(SHAPE, stage=slow, strategy="zero-copy", slots=2, views="torch")
    with ring.slot() as view:
        view[...] = frame
    with pytest.raises(hetmem.LentError):
        view.numpy()
    with pytest.raises(BlockingIOError):
        ring.next_result(block=False)
    index, out = ring.next_result()
    np.testing.assert_array_equal(np.asarray(out), 255 - frame)


@needs_gpu
def test_closing_a_gpu_ring_with_frames_in_flight(rng):
    cuda_torch()
    frames = frames_of(rng, 3)
    ring = hetmem.FrameRing(SHAPE, stage=lambda f, o, s: o.copy_(255 - f), strategy="pinned-async", views="torch")
    for frame in frames:
        ring.submit(frame)
    ring.close()
    got = [(index, np.array(out)) for index, out in ring.results()]
    assert [index for index, _ in got] == [0, 1, 2]
    for (index, out), frame in zip(got, frames):
        np.testing.assert_array_equal(out, 255 - frame)
    again = hetmem.FrameRing(SHAPE, stage=lambda f, o, s: o.copy_(f), strategy="zero-copy", views="torch")
    again.submit(frames[0])
    del again  # dropped with a frame on the GPU: waits for it, frees nothing under it
    gc.collect()


@needs_gpu
def test_auto_on_a_gpu_that_maps_host_memory_is_hybrid(rng):
    cuda_torch()
    frame = frames_of(rng, 1)[0]
    ring = hetmem.FrameRing(SHAPE, stage=lambda f, o, s: o.copy_(255 - f), views="torch")
    assert ring.strategy == "hybrid"
    (index, out), = stream_all(ring, [frame])
    np.testing.assert_array_equal(out, 255 - frame)
