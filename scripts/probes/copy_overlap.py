#!/usr/bin/env python3
"""Do uploads and downloads of one frame overlap on the copy engines? (CuPy, on the GPU machine)

Times, with CUDA events: one 6.2 MB frame uploaded whole then downloaded whole; the same frame
cut into N segments, each segment's download waiting (cudaStreamWaitEvent) for its upload on
another stream; and an independent upload and download at once. Prints microseconds.
"""
import cupy as cp
import numpy as np

FRAME = 1920 * 1080 * 3
REPS = 200


def pinned(nbytes):
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    array = np.frombuffer(mem, np.uint8, nbytes)
    array[:] = np.random.randint(1, 255, nbytes, dtype=np.uint8)
    return array


host_in, host_out = pinned(FRAME), pinned(FRAME)
dev = cp.empty(FRAME, cp.uint8)
up, down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)


def timed(body):
    samples = []
    for _ in range(REPS):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(up)
        down.wait_event(start)
        body()
        done = cp.cuda.Event()
        done.record(down)
        up.wait_event(done)
        end.record(up)
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1000)
    return float(np.median(samples))


def segmented(n):
    size = -(-FRAME // n)

    def body():
        for s in range(n):
            lo, hi = s * size, min(FRAME, (s + 1) * size)
            dev[lo:hi].set(host_in[lo:hi], stream=up)
            arrived = cp.cuda.Event(disable_timing=True)
            arrived.record(up)
            down.wait_event(arrived)
            dev[lo:hi].get(out=host_out[lo:hi], stream=down, blocking=False)

    return body


def both():
    dev2 = both.dev2
    dev[:].set(host_in, stream=up)
    dev2.get(out=host_out, stream=down, blocking=False)


both.dev2 = cp.empty(FRAME, cp.uint8)
for n in (1, 2, 3, 6, 12):
    print(f"segments {n:2}: upload then download {timed(segmented(n)):7.1f} us")
print(f"independent upload and download at once: {timed(both):7.1f} us")


def ring_like(streams_per_direction):
    """Four frames in flight: each frame's upload then download, on one stream per frame
    (streams_per_direction False) or on a shared upload and a shared download stream."""
    frames = 4
    devs = [cp.empty(FRAME, cp.uint8) for _ in range(frames)]
    slot_streams = [cp.cuda.Stream(non_blocking=True) for _ in range(frames)]

    def body():
        for k in range(frames):
            if streams_per_direction:
                devs[k].set(host_in, stream=up)
                arrived = cp.cuda.Event(disable_timing=True)
                arrived.record(up)
                down.wait_event(arrived)
                devs[k].get(out=host_out, stream=down, blocking=False)
            else:
                stream = slot_streams[k]
                stream.wait_event(ring_like.start)
                devs[k].set(host_in, stream=stream)
                devs[k].get(out=host_out, stream=stream, blocking=False)
                done = cp.cuda.Event(disable_timing=True)
                done.record(stream)
                down.wait_event(done)

    return body


ring_like.start = cp.cuda.Event(disable_timing=True)
ring_like.start.record(up)
print(f"4 frames, a stream per frame (up then down on it): {timed(ring_like(False)) / 4:7.1f} us/frame")
print(f"4 frames, one upload and one download stream:      {timed(ring_like(True)) / 4:7.1f} us/frame")
