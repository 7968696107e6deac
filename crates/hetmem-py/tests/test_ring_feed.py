"""FrameRing.feed and map_file: video files, FIFOs and stdin read straight into the ring's slots
by the native readers (hetmem-media's, as ``hetmem filter`` reads them). Every test streams
fresh random frames through a stage that copies its input to its output and checks every result
byte for byte, in order, against the frames written; results are copied into poisoned arrays, so
a frame that never came out cannot pass. Mismatched geometry is refused before any frame goes
in; a truncated or corrupt frame (from a file or a pipe closed mid-stream) raises naming the
file and the frame, after every earlier frame came out."""

import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import hetmem

POISON = 0xA5
W, H = 64, 48  # even sides: 4:2:0 and 4:2:2 frames stack as (H*3/2, W) and (2*H, W)


def copy_stage(frame, out, stream):
    """The frame as it is, on whatever the ring's strategy hands the stage: NumPy arrays on the
    CPU backend, tensors (CUDA ones on a GPU strategy, run on the ring's stream) with PyTorch,
    copied as bytes (PyTorch's uint16 has few kernels)."""
    if isinstance(frame, np.ndarray):
        np.copyto(out, frame)
    else:
        import torch
        out.view(torch.uint8).copy_(frame.view(torch.uint8))


def frame_samples(colour_space, width=W, height=H):
    """Samples a frame of a Y4M colour space holds, and their dtype."""
    cw, ch = -(-width // 2), -(-height // 2)
    chroma = {"mono": 0, "444": 2 * width * height, "422": 2 * cw * height}.get(colour_space, 2 * cw * ch)
    dtype = np.uint16 if colour_space.endswith("p10") else np.uint8
    return width * height + chroma, dtype


def random_frames(rng, count, shape, dtype=np.uint8):
    high = 1024 if np.dtype(dtype) == np.uint16 else 256
    frames = rng.integers(0, high, size=(count, *shape), dtype=dtype)
    assert len(np.unique(frames)) > 1, "random frames came out constant"
    return frames


def y4m_bytes(frames, colour_space="420jpeg", width=W, height=H, frame_params=False):
    """A Y4M stream of ``frames`` (each frame's samples in order); some FRAME lines carry
    parameters, as encoders may write them."""
    stream = bytearray(f"YUV4MPEG2 W{width} H{height} F25:1 Ip A1:1 C{colour_space} XCOLORRANGE=FULL\n".encode())
    for index, frame in enumerate(frames):
        stream += b"FRAME Ixyz\n" if frame_params and index % 2 else b"FRAME\n"
        stream += np.ascontiguousarray(frame).astype(frame.dtype.newbyteorder("<"), copy=False).tobytes()
    return bytes(stream)


def collect(results, count, shape, dtype):
    """Every result copied into a poisoned array, in order; the indices seen."""
    got = np.full((count, *shape), POISON, dtype=dtype)
    indices = []
    for index, out in results:
        assert index < count, f"result {index}: more results than frames"
        got[index] = np.asarray(out)
        indices.append(index)
    return got, indices


def write_file(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("colour_space, shape", [
    ("420jpeg", (H * 3 // 2, W)),
    ("420", ((W * H + 2 * (W // 2) * (H // 2)),)),  # the flat frame fits every format
    ("422", (2 * H, W)),
    ("444", (3, H, W)),
    ("mono", (H, W)),
    ("420p10", (H * 3 // 2, W)),
])
@pytest.mark.parametrize("slots", [1, 3])
def test_map_file_delivers_every_y4m_frame_byte_for_byte_in_order(tmp_path, rng, colour_space, shape, slots):
    samples, dtype = frame_samples(colour_space)
    assert int(np.prod(shape)) == samples
    frames = random_frames(rng, 7, shape, dtype)
    path = write_file(tmp_path, "in.y4m", y4m_bytes(frames, colour_space, frame_params=True))
    ring = hetmem.FrameRing(shape, dtype, stage=copy_stage, slots=slots)
    got, indices = collect(ring.map_file(path), len(frames), shape, dtype)
    assert indices == list(range(len(frames)))
    assert np.array_equal(got, frames)
    assert ring.submitted == len(frames)


def test_feed_from_a_producer_thread_returns_the_count_and_closes_the_ring(tmp_path, rng):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 9, shape)
    path = write_file(tmp_path, "in.y4m", y4m_bytes(frames))
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=2)
    collected = {}
    consumer = threading.Thread(target=lambda: collected.update(
        zip(("got", "indices"), collect(ring.results(), len(frames), shape, np.uint8))))
    consumer.start()
    assert ring.feed(str(path)) == len(frames)
    consumer.join(timeout=60)
    assert not consumer.is_alive(), "results() did not end: feed did not close the ring"
    assert collected["indices"] == list(range(len(frames)))
    assert np.array_equal(collected["got"], frames)


def test_limit_and_close_false_feed_part_of_a_file_then_more(tmp_path, rng):
    shape = (H, W)
    frames = random_frames(rng, 6, shape)
    path = write_file(tmp_path, "in.y4m", y4m_bytes(frames, "mono"))
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=8)
    assert ring.feed(path, limit=4, close=False) == 4
    assert ring.feed(path, limit=1, close=False) == 1  # opened again: from its first frame
    assert ring.feed(path, limit=0) == 0
    got, indices = collect(ring.results(), 5, shape, np.uint8)
    assert indices == list(range(5))
    assert np.array_equal(got[:4], frames[:4]) and np.array_equal(got[4], frames[0])
    with pytest.raises(ValueError, match="limit"):
        ring.feed(path, limit=-1)


def fifo_writer(path, data, chunk=1000):
    """Writes ``data`` into the FIFO ``path`` a chunk at a time (a pipe hands frames over in
    pieces), then closes it. A Python thread: the reader must let go of the interpreter while
    it opens and reads, or this thread never writes and the test hangs."""
    def write():
        with open(path, "wb", buffering=0) as fifo:
            for start in range(0, len(data), chunk):
                fifo.write(data[start:start + chunk])
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


@needs_fifo
def test_map_file_reads_a_fifo_as_a_file(tmp_path, rng):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 8, shape)
    fifo = tmp_path / "frames.fifo"
    os.mkfifo(fifo)
    writer = fifo_writer(fifo, y4m_bytes(frames, frame_params=True))
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=3)
    got, indices = collect(ring.map_file(fifo), len(frames), shape, np.uint8)
    writer.join(timeout=60)
    assert indices == list(range(len(frames)))
    assert np.array_equal(got, frames)


@needs_fifo
def test_a_fifo_closed_mid_frame_raises_after_every_earlier_frame(tmp_path, rng):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 3, shape)
    stream = y4m_bytes(frames)
    cut = len(stream) - frames[2].nbytes // 2  # inside frame 2's samples
    fifo = tmp_path / "cut.fifo"
    os.mkfifo(fifo)
    writer = fifo_writer(fifo, stream[:cut])
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=3)
    got = np.full((3, *shape), POISON, dtype=np.uint8)
    indices = []
    with pytest.raises(hetmem.HetmemError, match=r"cut\.fifo: frame 2 \(counting from 0\) is truncated") as raised:
        for index, out in ring.map_file(fifo):
            got[index] = np.asarray(out)
            indices.append(index)
    writer.join(timeout=60)
    assert "frames 0 to 1 went into the ring" in str(raised.value)
    assert indices == [0, 1]
    assert np.array_equal(got[:2], frames[:2])
    assert (got[2] == POISON).all()
    assert ring.submitted == 2


def test_a_truncated_file_keeps_its_earlier_frames_through_feed(tmp_path, rng):
    shape = (H, W)
    frames = random_frames(rng, 4, shape)
    stream = y4m_bytes(frames, "mono")
    path = write_file(tmp_path, "short.y4m", stream[:-100])  # frame 3 is 100 bytes short
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=2)
    collected = {}
    consumer = threading.Thread(target=lambda: collected.update(
        zip(("got", "indices"), collect(ring.results(), 4, shape, np.uint8))))
    consumer.start()
    with pytest.raises(hetmem.HetmemError) as raised:
        ring.feed(path)
    consumer.join(timeout=60)
    message = str(raised.value)
    assert "short.y4m" in message and "frame 3 (counting from 0) is truncated" in message, message
    assert f"after {frames[3].nbytes - 100} of its {frames[3].nbytes} bytes" in message, message
    assert collected["indices"] == [0, 1, 2]
    assert np.array_equal(collected["got"][:3], frames[:3])
    assert (collected["got"][3] == POISON).all()


def test_a_corrupt_frame_line_names_the_frame_after_the_earlier_ones(tmp_path, rng):
    shape = (H, W)
    frames = random_frames(rng, 3, shape)
    stream = bytearray(y4m_bytes(frames, "mono"))
    second = stream.index(b"FRAME\n", stream.index(b"FRAME\n") + 1)
    stream[second:second + 5] = b"FRAMX"
    path = write_file(tmp_path, "bad.y4m", bytes(stream))
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=3)
    results = ring.map_file(path)
    index, out = next(results)
    assert index == 0 and np.array_equal(np.asarray(out), frames[0])
    with pytest.raises(hetmem.HetmemError, match=r"bad\.y4m: frame 1 \(counting from 0\) is corrupt"):
        next(results)


@pytest.mark.parametrize("shape, dtype, said", [
    ((H, W, 3), np.uint8, r"\(48, 64, 3\) uint8"),
    ((H * 3 // 2, W), np.uint16, r"\(72, 64\) uint16"),
    ((W * 3 // 2, H), np.uint8, r"\(96, 48\) uint8"),  # the frame's bytes, but portrait
])
def test_mismatched_geometry_is_refused_before_any_frame(tmp_path, rng, shape, dtype, said):
    frames = random_frames(rng, 2, (H * 3 // 2, W))
    path = write_file(tmp_path, "clip.y4m", y4m_bytes(frames))
    ring = hetmem.FrameRing(shape, dtype, stage=copy_stage)
    with pytest.raises(ValueError) as raised:
        ring.feed(path)
    message = str(raised.value)
    assert "clip.y4m" in message and "64x48 C420jpeg Y4M" in message, message
    assert "FrameRing((72, 64), np.uint8, ...)" in message, message
    assert pytest.importorskip("re").search(said, message), message
    assert ring.submitted == 0
    with pytest.raises(ValueError, match="clip.y4m"):
        next(hetmem.FrameRing(shape, dtype, stage=copy_stage).map_file(path))


def test_raw_frames_of_the_ring_s_size_whatever_its_dtype(tmp_path, rng):
    shape = (5, 7, 3)
    frames = rng.standard_normal((6, *shape)).astype(np.float32)
    path = write_file(tmp_path, "frames.f32", frames.tobytes())
    ring = hetmem.FrameRing(shape, np.float32, stage=copy_stage, slots=2)
    got, indices = collect(ring.map_file(path, format="raw"), len(frames), shape, np.float32)
    assert indices == list(range(6)) and np.array_equal(got, frames)
    # One byte short of a seventh frame: a truncated frame, the file named.
    short = write_file(tmp_path, "short.f32", frames.tobytes()[:-1])
    ring = hetmem.FrameRing(shape, np.float32, stage=copy_stage, slots=2)
    with pytest.raises(hetmem.HetmemError, match=r"short\.f32: frame 5 \(counting from 0\) is truncated"):
        collect(ring.map_file(short, format="raw"), len(frames), shape, np.float32)


def test_raw_nv12_is_de_interleaved_into_planar_4_2_0(tmp_path, rng):
    luma = random_frames(rng, 3, (H, W))
    chroma = random_frames(rng, 3, (H // 2, W // 2, 2))  # U and V interleaved, as nv12 holds them
    stream = b"".join(y.tobytes() + uv.tobytes() for y, uv in zip(luma, chroma))
    path = write_file(tmp_path, "in.nv12", stream)
    shape = (H * 3 // 2, W)
    ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage)
    got, indices = collect(ring.map_file(path, format=f"raw:{W}x{H}:nv12"), 3, shape, np.uint8)
    assert indices == [0, 1, 2]
    expected = np.concatenate(
        [luma.reshape(3, -1), chroma[..., 0].reshape(3, -1), chroma[..., 1].reshape(3, -1)], axis=1)
    assert np.array_equal(got.reshape(3, -1), expected)
    # rgb24 of a declared size fits (H, W, 3) only.
    with pytest.raises(ValueError, match=r"FrameRing\(\(48, 64, 3\), np.uint8"):
        hetmem.FrameRing(shape, np.uint8, stage=copy_stage).feed(path, format=f"raw:{W}x{H}:rgb24")


def test_formats_that_do_not_fit_say_what_to_give(tmp_path, rng):
    frames = random_frames(rng, 1, (H, W))
    y4m = write_file(tmp_path, "in.y4m", y4m_bytes(frames, "mono"))
    headerless = write_file(tmp_path, "in.bin", frames.tobytes())
    ring = hetmem.FrameRing((H, W), np.uint8, stage=copy_stage)
    with pytest.raises(ValueError, match=r"in\.bin: not a Y4M stream.*format='raw'"):
        ring.feed(headerless, close=False)
    with pytest.raises(ValueError, match=r"in\.y4m is a Y4M stream, not raw video"):
        ring.feed(y4m, format="raw", close=False)
    with pytest.raises(ValueError, match=r"format='mp4'.*'raw:WxH:pix_fmt'"):
        ring.feed(y4m, format="mp4", close=False)
    with pytest.raises(ValueError, match=r"unknown pixel format `yuv410p`"):
        ring.feed(headerless, format="raw:64x48:yuv410p", close=False)
    with pytest.raises(FileNotFoundError, match=r"missing\.y4m"):
        ring.feed(tmp_path / "missing.y4m", close=False)
    with pytest.raises(ValueError, match=r"empty\.y4m is empty"):
        ring.feed(write_file(tmp_path, "empty.y4m", b""), close=False)
    with pytest.raises(TypeError, match="format"):
        ring.feed(y4m, format=420, close=False)
    assert ring.submitted == 0
    assert ring.feed(y4m) == 1


def check_records(stdout: bytes, frames) -> None:
    """A child's results, as it wrote them (each frame's index, 4 bytes little-endian, then its
    bytes): every frame once, in order, byte for byte."""
    record = 4 + frames[0].nbytes
    assert len(stdout) == record * len(frames)
    for index in range(len(frames)):
        chunk = stdout[index * record:(index + 1) * record]
        assert int.from_bytes(chunk[:4], "little") == index
        assert chunk[4:] == frames[index].tobytes(), f"frame {index} differs"


# The child's stage is this module's copy_stage, its source sent along.
STDIN_CONSUMER = """
import sys, numpy as np, hetmem
""" + inspect.getsource(copy_stage) + """
shape = (int(sys.argv[1]), int(sys.argv[2]))
ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=2)
for index, out in ring.map_file("-"):
    sys.stdout.buffer.write(index.to_bytes(4, "little") + np.asarray(out).tobytes())
"""


@pytest.mark.parametrize("stdin_is", ["a pipe", "a regular file"])
def test_stdin_as_dash_through_a_subprocess(tmp_path, rng, stdin_is):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 5, shape)
    if stdin_is == "a pipe":
        given = {"input": y4m_bytes(frames)}
    else:  # `< in.y4m`: read by position from where stdin stands
        given = {"stdin": open(write_file(tmp_path, "in.y4m", y4m_bytes(frames)), "rb")}
    with given.get("stdin") or open(os.devnull, "rb"):
        done = subprocess.run([sys.executable, "-c", STDIN_CONSUMER, *map(str, shape)], **given,
                              capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    check_records(done.stdout, frames)


# Two feeds of stdin one after the other: the first stops at its limit, the second goes on
# from the next frame (no frame lost to the first reader's buffer, none read twice).
STDIN_TWICE = """
import sys, numpy as np, hetmem
""" + inspect.getsource(copy_stage) + """
shape = (int(sys.argv[1]), int(sys.argv[2]))
ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=64)  # every frame in flight at once
results = ring.results()
fed = ring.feed("-", format="raw", limit=2, close=False)
fed += ring.feed("-", format="raw")
for index, out in results:
    sys.stdout.buffer.write(index.to_bytes(4, "little") + np.asarray(out).tobytes())
sys.stderr.write(f"fed {fed}")
"""


@pytest.mark.parametrize("stdin_is", ["a pipe", "a regular file"])
def test_a_second_feed_of_stdin_goes_on_where_the_first_stopped(tmp_path, rng, stdin_is):
    shape = (H, W)
    frames = random_frames(rng, 40, shape)  # far more than the first reader's buffer holds
    data = frames.tobytes()
    if stdin_is == "a pipe":
        given = {"input": data}
    else:
        given = {"stdin": open(write_file(tmp_path, "in.raw", data), "rb")}
    with given.get("stdin") or open(os.devnull, "rb"):
        done = subprocess.run([sys.executable, "-c", STDIN_TWICE, *map(str, shape)], **given,
                              capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr.decode().endswith(f"fed {len(frames)}"), done.stderr.decode()
    check_records(done.stdout, frames)


# A ring of the wrong shape refuses stdin's Y4M before any frame, and a ring of the right one
# then reads it from its header; a second feed of a Y4M stdin says why it cannot.
STDIN_Y4M_RETRY = """
import sys, numpy as np, hetmem
""" + inspect.getsource(copy_stage) + """
shape = (int(sys.argv[1]), int(sys.argv[2]))
wrong = hetmem.FrameRing((shape[0] + 2, shape[1]), np.uint8, stage=copy_stage, slots=2)
try:
    wrong.feed("-")
except ValueError as error:
    sys.stderr.write(f"refused: {error}\\n")
ring = hetmem.FrameRing(shape, np.uint8, stage=copy_stage, slots=64)
results = ring.results()
fed = ring.feed("-", limit=3, close=False)
try:
    ring.feed("-", close=False)
except Exception as error:
    sys.stderr.write(f"second: {type(error).__name__}: {error}\\n")
ring.close()
for index, out in results:
    sys.stdout.buffer.write(index.to_bytes(4, "little") + np.asarray(out).tobytes())
"""


def test_stdin_y4m_refused_by_geometry_is_read_whole_by_the_next_ring(rng):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 5, shape)
    done = subprocess.run([sys.executable, "-c", STDIN_Y4M_RETRY, *map(str, shape)], input=y4m_bytes(frames),
                          capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "refused:" in err
    assert "an earlier feed of it read the header" in err and len(err) < 2000, err
    check_records(done.stdout, frames[:3])


def test_stdin_cut_mid_frame_names_stdin(rng):
    shape = (H * 3 // 2, W)
    frames = random_frames(rng, 2, shape)
    stream = y4m_bytes(frames)[:-10]
    done = subprocess.run([sys.executable, "-c", STDIN_CONSUMER, *map(str, shape)], input=stream,
                          capture_output=True, timeout=120)
    assert done.returncode != 0
    assert "stdin: frame 1 (counting from 0) is truncated" in done.stderr.decode(), done.stderr.decode()
    assert done.stdout[4:] == frames[0].tobytes()
