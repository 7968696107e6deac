#!/usr/bin/env python3
"""hetmem.FrameRing from Python against the best plain PyTorch loop: 1080p RGB uint8 frames
through a 5x5 Gaussian conv in fp16 (the kernel of bench/peers/torch_gaussian.py: reflect-101
padding, OpenCV's ksize-5 taps, depthwise conv2d, rounded back to uint8).

Methods, each streaming the same random frames (fresh each run, cycled from a pool) and doing
the same host work per frame, timed two ways: ``fps``, the producer stamping one pixel of a
frame already in the method's host input (as a camera or decoder writing in place would leave
it: the link, the GPU and the Python overhead are measured, not a host memcpy), and
``fps_host_copy``, the producer copying the whole source frame into the host input first (one
6 MB memcpy a frame on the CPU, the same for every method). Results are read where they lie.
- ``ring-<strategy>``: ``hetmem.FrameRing`` with a torch stage, ``--slots`` frames in flight, by
  ``pinned-async`` (device buffers, copy engines), ``zero-copy`` and ``hybrid`` (the conv reads
  and writes mapped host memory in place); frames in through ``with ring.slot()``, results out
  in order.
- ``torch-3-streams``: the peer: 3 CUDA streams round robin, each with its pinned host input and
  output and device buffers; per frame, on its stream: ``copy_(non_blocking=True)`` in, the same
  conv, ``copy_(non_blocking=True)`` out, an event; a frame is delivered (in order) once its
  event completes, and its stream's buffers are reused only then.

Also timed: ``conv-alone`` (and ``conv-alone-graph``), the same conv on frames already in device
memory with no transfer, back to back on one stream: the compute bound of every method, since
each runs this conv once a frame.

Reported: frames/s per method (after ``--warmup`` frames), each ring's ratio to the peer, and
the largest difference of each method's output from the peer's on ``--check`` random frames
(0 expected: the same torch ops on the same bytes). JSON with ``--json``. ``--device cpu`` only
tests the script without a GPU (the ring's cpu strategy against the same loop on the CPU); its
figures mean nothing.
"""

import argparse
import datetime
import json
import sys
import time

import numpy as np

K1 = [1.0, 4.0, 6.0, 4.0, 1.0]  # /16: OpenCV's getGaussianKernel(5, sigma<=0)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--frames", type=int, default=3000, help="timed frames per method (default 3000)")
    p.add_argument("--warmup", type=int, default=200, help="untimed frames first (default 200)")
    p.add_argument("--slots", type=int, default=4, help="ring slots (default 4)")
    p.add_argument("--pool", type=int, default=16, help="distinct random frames cycled (default 16)")
    p.add_argument("--check", type=int, default=16, help="frames compared with the peer (default 16)")
    p.add_argument("--strategies", default="pinned-async,zero-copy,hybrid")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method; the best is kept")
    p.add_argument("--no-graph", action="store_true", help="no CUDA-graph rows (ring graph=True, the peer's graphs)")
    p.add_argument("--naive-mapped", action="store_true",
                   help="mapped strategies run the conv on the mapped frame as is (one-byte strided reads "
                        "over the link), not on a wide copy of it")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", metavar="PATH")
    return p.parse_args()


def make_conv(torch, dev):
    import torch.nn.functional as F
    k1 = torch.tensor(K1, dtype=torch.float64) / 16.0
    weight = torch.outer(k1, k1).to(dev, torch.float16 if dev.type == "cuda" else torch.float32)
    weight = weight.expand(3, 1, 5, 5).contiguous()

    def conv(frame, out):
        """(H, W, 3) uint8 -> 5x5 Gaussian -> (H, W, 3) uint8 into `out`."""
        x = frame.permute(2, 0, 1).unsqueeze(0).to(weight.dtype)
        x = F.pad(x, (2, 2, 2, 2), mode="reflect")
        y = F.conv2d(x, weight, groups=3)
        out.copy_(y.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0))

    return conv


def wide(torch, conv):
    """The same conv for a frame in mapped host memory: its bytes read once across the link in
    wide loads (a contiguous clone into device memory), the result written back once the same
    way; the conv's permuted one-byte accesses then touch device memory only."""
    def run(frame, out):
        staged_out = torch.empty_like(out, device=out.device)
        conv(frame.clone(), staged_out)
        out.copy_(staged_out)
    return run


def fill(host, frames, i, copy):
    """The producer's work on frame `i`: the whole source frame, or a stamp on the one there."""
    if copy:
        host[...] = frames[i % len(frames)]
    else:
        host[0, 0, 0] = i & 0xFF


def run_peer(torch, conv, frames, count, cuda, keep=None, copy=True, graph=False):
    """The 3-stream PyTorch loop over `count` frames; returns (seconds, kept outputs). With
    `graph`, each lane's copy in, conv and copy out are captured once (torch.cuda.CUDAGraph on
    the lane's stream, over its fixed buffers) and replayed per frame."""
    h, w, c = frames[0].shape
    lanes = []
    for lane in range(3):
        # Each lane's input starts as a whole random frame, as each ring slot does.
        host_in = torch.from_numpy(frames[lane % len(frames)].copy())
        lanes.append({
            "stream": torch.cuda.Stream() if cuda else None,
            "host_in": host_in.pin_memory() if cuda else host_in,
            "host_out": torch.empty((h, w, c), dtype=torch.uint8, pin_memory=cuda),
            "dev_in": torch.empty((h, w, c), dtype=torch.uint8, device="cuda" if cuda else "cpu"),
            "dev_out": torch.empty((h, w, c), dtype=torch.uint8, device="cuda" if cuda else "cpu"),
            "event": None, "index": None,
        })
    kept = []

    def deliver(lane):
        if lane["event"] is not None:
            lane["event"].synchronize()
        if lane["index"] is not None and keep is not None and lane["index"] < keep:
            kept.append(lane["host_out"].numpy().copy())
        lane["index"] = None

    if cuda and graph:
        for lane in lanes:
            with torch.cuda.stream(lane["stream"]):  # warm-up, then the capture
                conv(lane["dev_in"], lane["dev_out"])
            torch.cuda.synchronize()
            lane["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(lane["graph"], stream=lane["stream"]):
                lane["dev_in"].copy_(lane["host_in"], non_blocking=True)
                conv(lane["dev_in"], lane["dev_out"])
                lane["host_out"].copy_(lane["dev_out"], non_blocking=True)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(count):
        lane = lanes[i % 3]
        deliver(lane)  # in order: lane i % 3 holds frame i - 3, the oldest
        fill(lane["host_in"].numpy(), frames, i, copy)
        if cuda and graph:
            with torch.cuda.stream(lane["stream"]):
                lane["graph"].replay()
                lane["event"] = torch.cuda.Event()
                lane["event"].record()
        elif cuda:
            with torch.cuda.stream(lane["stream"]):
                lane["dev_in"].copy_(lane["host_in"], non_blocking=True)
                conv(lane["dev_in"], lane["dev_out"])
                lane["host_out"].copy_(lane["dev_out"], non_blocking=True)
                lane["event"] = torch.cuda.Event()
                lane["event"].record()
        else:
            conv(lane["host_in"], lane["host_out"])
        lane["index"] = i
    for j in range(count, count + 3):
        deliver(lanes[j % 3])
    return time.perf_counter() - start, kept


def run_conv_alone(torch, conv, frames, count, graph=False):
    """The conv alone on frames already in device memory, back to back on one stream (with
    `graph`, one captured conv replayed): the compute bound no transfer strategy can beat, as
    each method runs this conv once a frame; seconds for `count` frames."""
    dev_in = [torch.from_numpy(frame).cuda() for frame in frames[:3]]
    dev_out = torch.empty_like(dev_in[0])
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        conv(dev_in[0], dev_out)  # warm-up (and cuDNN's choice of algorithm)
    torch.cuda.synchronize()
    replay = None
    if graph:
        replay = torch.cuda.CUDAGraph()
        with torch.cuda.graph(replay, stream=stream):
            conv(dev_in[0], dev_out)
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.stream(stream):
        for i in range(count):
            if replay is not None:
                replay.replay()
            else:
                conv(dev_in[i % len(dev_in)], dev_out)
    stream.synchronize()
    return time.perf_counter() - start


def run_ring(hetmem, conv, strategy, slots, frames, count, keep=None, copy=True, graph=False):
    """`count` frames through a FrameRing with the conv as its stage (graph=True: the ring
    captures and replays it); (seconds, kept outputs)."""
    shape = frames[0].shape

    def stage(frame, out, stream):
        conv(frame, out)

    ring = hetmem.FrameRing(shape, np.uint8, stage=stage, strategy=strategy, slots=slots, views="torch",
                            graph=graph)
    kept = []

    def drain_one():
        index, out = ring.next_result()
        if keep is not None and index < keep:
            kept.append(np.array(out))

    start = time.perf_counter()
    in_flight = 0
    for i in range(count):
        if in_flight == ring.slots:
            drain_one()
            in_flight -= 1
        with ring.slot() as frame:
            if copy or i < ring.slots:  # each slot holds a whole random frame before stamping
                frame[...] = frames[i % len(frames)]
            else:
                frame[0, 0, 0] = i & 0xFF
        in_flight += 1
    for _ in range(in_flight):
        drain_one()
    seconds = time.perf_counter() - start
    ring.close()
    assert ring.next_result() is None  # releases the last result
    assert ring.submitted == count and ring.delivered == count, (ring.submitted, ring.delivered, count)
    return seconds, kept, ring.strategy


def main():
    a = parse_args()
    import torch
    import hetmem
    cuda = a.device == "cuda"
    if cuda and (not torch.cuda.is_available() or hetmem.device().backend != "cuda"):
        sys.exit("ring_conv.py: needs CUDA in both torch and hetmem "
                 f"(torch.cuda: {torch.cuda.is_available()}, hetmem: {hetmem.device().backend}); "
                 "--device cpu only tests the script")
    if cuda:
        torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    conv = make_conv(torch, dev)
    rng = np.random.default_rng()
    shape = (a.height, a.width, 3)
    frames = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(a.pool)]
    strategies = a.strategies.split(",") if cuda else ["cpu"]
    mapped = {"zero-copy", "hybrid", "managed"}
    conv_wide = wide(torch, conv)

    def stage_conv(strategy):
        return conv_wide if strategy in mapped and not a.naive_mapped else conv
    graphs = [False] if a.no_graph or not cuda else [False, True]
    rows = [(strategy, graph) for strategy in strategies for graph in graphs]

    def row(name, graph):
        return name + ("-graph" if graph else "")

    # Outputs compared with the peer's on the first --check frames.
    _, reference = run_peer(torch, conv, frames, a.check, cuda, keep=a.check)
    check = {}
    if True in graphs:
        _, outputs = run_peer(torch, conv, frames, a.check, cuda, keep=a.check, graph=True)
        check["torch-3-streams-graph"] = int(max(np.abs(o.astype(np.int16) - r.astype(np.int16)).max()
                                                 for o, r in zip(outputs, reference)))
    for strategy, graph in rows:
        _, outputs, _ = run_ring(hetmem, stage_conv(strategy), strategy, a.slots, frames, a.check, keep=a.check,
                                 graph=graph)
        assert len(outputs) == len(reference) == a.check
        check[row(f"ring-{strategy}", graph)] = int(max(np.abs(o.astype(np.int16) - r.astype(np.int16)).max()
                                            for o, r in zip(outputs, reference)))

    results = {"fps": {}, "fps_host_copy": {}}
    for _ in range(a.repeats):
        for mode, copy in (("fps", False), ("fps_host_copy", True)):
            best = results[mode]
            run_peer(torch, conv, frames, a.warmup, cuda, copy=copy)
            seconds, _ = run_peer(torch, conv, frames, a.frames, cuda, copy=copy)
            best["torch-3-streams"] = max(best.get("torch-3-streams", 0.0), a.frames / seconds)
            if True in graphs:
                seconds, _ = run_peer(torch, conv, frames, a.frames, cuda, copy=copy, graph=True)
                best["torch-3-streams-graph"] = max(best.get("torch-3-streams-graph", 0.0), a.frames / seconds)
            for strategy, graph in rows:
                run_ring(hetmem, stage_conv(strategy), strategy, a.slots, frames, a.warmup, copy=copy, graph=graph)
                seconds, _, resolved = run_ring(hetmem, stage_conv(strategy), strategy, a.slots, frames, a.frames,
                                                copy=copy, graph=graph)
                key = row(f"ring-{resolved}", graph)
                best[key] = max(best.get(key, 0.0), a.frames / seconds)

    # The compute bound of the same call: the conv with no transfer at all.
    bound = {}
    if cuda:
        for graph in graphs:
            name = row("conv-alone", graph)
            run_conv_alone(torch, conv, frames, a.warmup, graph=graph)
            bound[name] = max(a.frames / run_conv_alone(torch, conv, frames, a.frames, graph=graph)
                              for _ in range(a.repeats))

    ratios = {mode: {name: fps / best["torch-3-streams"] for name, fps in best.items() if name != "torch-3-streams"}
              for mode, best in results.items()}
    report = {
        "bench": "ring_conv",
        "shape": list(shape),
        "dtype": "fp16" if cuda else "fp32",
        "frames": a.frames,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "slots": a.slots,
        "mapped_stage": "naive" if a.naive_mapped else "wide (a contiguous clone in, one copy out)",
        "device": a.device,
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "fps": results["fps"],
        "fps_host_copy": results["fps_host_copy"],
        "ratio_to_peer": ratios["fps"],
        "ratio_to_peer_host_copy": ratios["fps_host_copy"],
        "ratio_to_graph_peer": {name: fps / results["fps"]["torch-3-streams-graph"]
                                for name, fps in results["fps"].items()} if True in graphs else None,
        "max_abs_diff_vs_peer": check,
        "conv_alone_fps": bound,
        "conv_alone_ratio_to_peer": {name: fps / results["fps"]["torch-3-streams"] for name, fps in bound.items()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    for mode, best in results.items():
        print(f"{mode}:")
        for name, fps in best.items():
            ratio = "" if name == "torch-3-streams" else f"  {ratios[mode][name]:.2f}x the peer"
            diff = "" if name not in check else f"  max |diff| vs peer {check[name]}"
            print(f"  {name:22s} {fps:9.1f} frames/s{ratio}{diff}")
    for name, fps in bound.items():
        print(f"bound: {name:15s} {fps:9.1f} frames/s  {fps / results['fps']['torch-3-streams']:.2f}x the peer "
              "(the conv on device-resident frames, no transfer)")
    if any(diff > 0 for diff in check.values()):
        print("WARNING: a ring's output differs from the peer's", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 1 if any(diff > 0 for diff in check.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
