"""hetmem.load(device_map=...): tensors placed by name or prefix (longest key wins, "" the
default) or "balanced", one load per device at once, merged into one mapping whose bytes are
a plain load's, with a report per device; and the errors: an unmapped tensor, device= with
device_map=, into= with device_map=, a bad device. On the CPU backend every device is "cpu";
the GPU part (skipped without a GPU, required with HETMEM_REQUIRE_GPU=1) maps some prefixes
to cuda:0 and the rest to cpu and compares the bytes with the file's."""

import gc
import threading
import weakref

import numpy as np
import pytest

import hetmem
from hetmem import _device_map, _native
from test_load import check_values, every_dtype, needs_gpu, on_gpu, random_bytes, write


def raw_bytes(tensor):
    """A tensor's bytes (a torch tensor's by its uint8 view: bfloat16 has no NumPy type)."""
    if hasattr(tensor, "data_ptr"):
        import torch
        tensor = tensor.detach().cpu().contiguous().reshape(-1)
        return tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    return np.asarray(tensor).tobytes()


def model(tmp_path, rng):
    """A file with an embedding, two layers of every dtype (raw random bits: NaNs among the
    floats) and a head, and its tensors."""
    tensors = {"embed.w": ("F32", (16, 8), rng.integers(0, 256, 16 * 8 * 4, dtype=np.uint8).tobytes())}
    for layer in range(2):
        tensors.update(every_dtype(rng, prefix=f"layers.{layer}."))
        tensors[f"layers.{layer}.raw"] = ("F32", (33, 5), rng.integers(0, 256, 33 * 5 * 4, dtype=np.uint8).tobytes())
    tensors["head.w"] = ("BF16", (9, 8), random_bytes(rng, "BF16", (9, 8)))
    return write(tmp_path / "model.safetensors", tensors), tensors


def test_several_prefixes_to_cpu_load_the_bytes_a_plain_load_does(tmp_path, rng):
    path, tensors = model(tmp_path, rng)
    mapped = hetmem.load(path, device_map={"embed": "cpu", "layers.0": "cpu", "layers.": "cpu", "head.w": "cpu"})
    check_values(mapped, tensors)
    plain = hetmem.load(path, device="cpu")
    assert list(mapped) == list(plain), "the same names in the same order as a plain load"
    assert mapped.device == "cpu" and set(mapped.parts) == {"cpu"}
    report = mapped.report
    assert report.bytes == plain.report.bytes == sum(len(raw) for _, _, raw in tensors.values())
    assert set(report.per_device) == {"cpu"}
    assert sum(each.bytes for each in report.per_device.values()) == report.bytes
    assert report.seconds >= max(each.seconds for each in report.per_device.values())
    assert report.gb_per_s == pytest.approx(report.bytes / report.seconds / 1e9)
    assert mapped.nbytes == sum(part.nbytes for part in mapped.parts.values())


def test_device_spellings_and_the_default_key(tmp_path, rng):
    path, tensors = model(tmp_path, rng)
    torch = pytest.importorskip("torch")
    cpu = torch.device("cpu")
    check_values(hetmem.load(path, device_map={"": cpu}), tensors)
    check_values(hetmem.load(path, device_map={"layers.1.raw": "cpu", "": "cpu"}), tensors)


def test_filters_and_shards_choose_first_then_the_map_places(tmp_path, rng):
    path, tensors = model(tmp_path, rng)
    chosen = {name: each for name, each in tensors.items() if name.startswith("layers.1.")}
    # Only layers.1 is chosen, so a map that leaves the rest out is enough.
    check_values(hetmem.load(path, prefix="layers.1.", device_map={"layers.1": "cpu"}), chosen)
    names = ["head.w", "embed.w"]
    check_values(hetmem.load(path, names=names, device_map={"head": "cpu", "embed": "cpu"}),
                 {name: tensors[name] for name in names})
    sharded = hetmem.load(path, shard=(1, 3, 0), device_map={"": "cpu"})
    plain = hetmem.load(path, shard=(1, 3, 0), device="cpu")
    assert list(sharded) == list(plain) and sharded.report.bytes == plain.report.bytes
    for name in plain:
        assert raw_bytes(sharded[name]) == raw_bytes(plain[name]), name
        assert tuple(sharded[name].shape) == tuple(plain[name].shape), name


def test_dtype_casts_each_devices_tensors(tmp_path, rng):
    torch = pytest.importorskip("torch")
    path, tensors = model(tmp_path, rng)
    mapped = hetmem.load(path, device_map={"layers.0.": "cpu", "": "cpu"}, dtype="float16")
    plain = hetmem.load(path, device="cpu", dtype="float16")
    for name in plain:
        assert mapped[name].dtype == plain[name].dtype, name
        assert raw_bytes(mapped[name]) == raw_bytes(plain[name]), name


def test_an_unmapped_tensor_is_named_with_the_remedy(tmp_path, rng):
    path, _ = model(tmp_path, rng)
    with pytest.raises(ValueError, match=r"'head\.w' is not in device_map.*\"\": \"cpu\""):
        hetmem.load(path, device_map={"embed": "cpu", "layers.": "cpu"})
    # "layers.1" covers the names under layers.1, not those under layers.10 (nor "layers.1x").
    with pytest.raises(ValueError, match=r"'layers\.0\.f64\.t' is not in device_map"):
        hetmem.load(path, device_map={"embed": "cpu", "layers.1": "cpu", "head": "cpu"})


def test_bad_arguments_are_refused_with_a_remedy(tmp_path, rng):
    path, _ = model(tmp_path, rng)
    with pytest.raises(ValueError, match="device= or device_map=, not both"):
        hetmem.load(path, device="cpu", device_map={"": "cpu"})
    with pytest.raises(ValueError, match="into= and device_map= do not go together"):
        hetmem.load(path, device_map={"": "cpu"}, into={})
    with pytest.raises(ValueError, match=r"device_map\['layers\.'\]: load: device='tpu:3'"):
        hetmem.load(path, device_map={"layers.": "tpu:3", "": "cpu"})
    with pytest.raises((ValueError, hetmem.HetmemError), match=r"device_map\[''\]"):
        hetmem.load(path, device_map={"": "cuda:7"})
    with pytest.raises(ValueError, match=r"device_map\[''\] is None"):
        hetmem.load(path, device_map={"": None})
    with pytest.raises(TypeError, match="device_map key 0 is a int"):
        hetmem.load(path, device_map={0: "cpu"})
    with pytest.raises(ValueError, match="device_map='sequential'"):
        hetmem.load(path, device_map="sequential")
    with pytest.raises(TypeError, match="device_map is a list"):
        hetmem.load(path, device_map=["cpu"])
    with pytest.raises(ValueError, match="shard rank 3 of a world of 2"):
        hetmem.load(path, device_map={"": "cpu"}, shard=(3, 2, 0))
    with pytest.raises(ValueError, match="not_there"):
        hetmem.load(path, device_map={"": "cpu"}, names=["not_there"])


def test_a_failing_device_load_raises_its_error_and_returns_nothing(tmp_path, rng):
    path, tensors = model(tmp_path, rng)
    other = write(tmp_path / "other.safetensors", {"extra.w": ("F32", (64, 64), random_bytes(rng, "F32", (64, 64)))})
    with open(other, "r+b") as file:  # the header stays whole, the data is cut short
        file.truncate(other.stat().st_size - 100)
    with pytest.raises((hetmem.HetmemError, ValueError), match="other.safetensors"):
        hetmem.load([path, other], device_map={"extra": "cpu", "": "cpu"})


def test_a_generator_of_files_is_read_once_for_every_device(tmp_path, rng):
    path, tensors = model(tmp_path, rng)
    check_values(hetmem.load((each for each in [path]), device_map={"layers.": "cpu", "": "cpu"}), tensors)


@pytest.mark.parametrize("failing", ["layers.", "embed"], ids=["failing-device-mapped-last", "failing-device-mapped-first"])
def test_a_failed_spread_load_lets_the_other_devices_tensors_go_and_reports_no_more(tmp_path, rng, monkeypatch,
                                                                                    failing):
    path, _ = model(tmp_path, rng)
    # Two devices on the CPU backend: "cuda:9" stands for a second one, whose load fails once
    # the first device's has finished.
    monkeypatch.setattr(_device_map, "device_key", lambda value, where: str(value))
    real, kept, first_done = _device_map.load, [], threading.Event()

    def load(source, *, device, **options):
        if device == "cuda:9":
            first_done.wait(timeout=30)
            raise hetmem.HetmemError("the load on cuda:9 failed")
        loaded = real(source, device="cpu", **options)
        kept.append(weakref.ref(loaded))
        first_done.set()
        return loaded

    monkeypatch.setattr(_device_map, "load", load)
    calls_after = []
    raised = threading.Event()

    def progress(done, total):
        if raised.is_set():
            calls_after.append(done)

    with pytest.raises(hetmem.HetmemError, match="cuda:9") as caught:
        hetmem.load(path, device_map={failing: "cuda:9", "": "cpu"}, progress=progress)
    raised.set()
    gc.collect()
    assert kept, "the first device loaded"
    assert all(ref() is None for ref in kept), "its tensors are let go while the error is still held"
    assert caught.value is not None
    assert calls_after == [], "no progress after the error"


def test_a_failed_spread_load_stops_the_other_devices_loads_instead_of_waiting_them_out(tmp_path, rng, monkeypatch):
    # A long load on "cpu" (256 MiB in 4 KiB pieces on one thread: seconds) and a second
    # device, "cuda:9", whose load fails once the first has begun: the first must be stopped at
    # its next progress call, not read to its end before the error goes up.
    big = rng.integers(0, 256, 256 << 20, dtype=np.uint8).tobytes()
    path = write(tmp_path / "slow.safetensors",
                 {"big": ("U8", (len(big),), big), "layers.0.w": ("F32", (4, 4), random_bytes(rng, "F32", (4, 4)))})
    monkeypatch.setattr(_device_map, "device_key", lambda value, where: str(value))
    real, began, ended = _device_map.load, threading.Event(), {}

    def load(source, *, device, progress, **options):
        if device == "cuda:9":
            began.wait(timeout=30)
            raise hetmem.HetmemError("the load on cuda:9 failed")

        def progress_then_begun(done, total):
            began.set()
            progress(done, total)
        try:
            return real(source, device="cpu", progress=progress_then_begun, **options)
        except BaseException as error:
            ended["cpu"] = error
            raise
        finally:
            began.set()

    monkeypatch.setattr(_device_map, "load", load)
    with pytest.raises(hetmem.HetmemError, match="cuda:9"):
        hetmem.load(path, device_map={"layers.": "cuda:9", "": "cpu"}, threads=1, chunk_bytes=4096, progress=False)
    assert type(ended.get("cpu")).__name__ == "_LoadStopped", f"the cpu load was not stopped: {ended!r}"


@pytest.mark.skipif(on_gpu, reason="on a GPU \"balanced\" places on it (see the GPU test)")
def test_balanced_needs_a_gpu_and_says_so(tmp_path, rng):
    path, _ = model(tmp_path, rng)
    with pytest.raises(hetmem.HetmemError, match="balanced.*CUDA devices.*device=\"cpu\""):
        hetmem.load(path, device_map="balanced")


def test_balanced_cuts_the_file_order_into_contiguous_runs_of_about_equal_bytes(rng):
    sizes = rng.integers(1, 1000, 200)
    tensors = [(f"t{k:03d}", int(size)) for k, size in enumerate(sizes)]
    devices = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    placed = _device_map.balanced(tensors, devices)
    order = [devices.index(placed[name]) for name, _ in tensors]
    assert order == sorted(order) and set(order) == set(range(4)), "one contiguous run per device, in order"
    total = int(sizes.sum())
    for index, device in enumerate(devices):
        share = sum(size for name, size in tensors if placed[name] == device)
        assert abs(share - total / 4) <= int(sizes.max()), (device, share, total)
    assert set(_device_map.balanced(tensors, ["cuda:0"]).values()) == {"cuda:0"}
    assert _device_map.balanced([("a", 0), ("b", 0)], devices) == {"a": "cuda:0", "b": "cuda:0"}
    # Sizes past 64 bits and negative ones are refused by the native rule, with the argument.
    for bad in ([-1], [2**70]):
        with pytest.raises(ValueError, match="size"):
            _native.balanced_devices(bad, 2)
    with pytest.raises(ValueError, match="at least 1 device"):
        _native.balanced_devices([1, 2], 0)
    # Sizes whose sum passes 64 bits still place (the rule sums in 128 bits).
    assert _native.balanced_devices([2**62] * 8, 2) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_keys_cover_names_at_dots_and_the_longest_wins():
    assert _device_map.matches("", "anything")
    assert _device_map.matches("layers.1", "layers.1") and _device_map.matches("layers.1", "layers.1.w")
    assert not _device_map.matches("layers.1", "layers.10.w") and not _device_map.matches("layers.1", "layers.1x")
    assert _device_map.matches("layers.", "layers.10.w") and not _device_map.matches("layers.2", "layers.1.w")


@needs_gpu
def test_on_the_gpu_some_prefixes_to_cuda_and_the_rest_to_cpu(tmp_path, rng):
    torch = pytest.importorskip("torch")
    path, tensors = model(tmp_path, rng)
    mapped = hetmem.load(path, device_map={"embed": "cuda:0", "layers.1": 0, "layers.1.raw": "cpu", "": "cpu"})
    check_values(mapped, tensors)
    for name in tensors:
        on_cuda = name.startswith("embed") or (name.startswith("layers.1.") and name != "layers.1.raw")
        assert mapped[name].is_cuda == on_cuda, name
    assert mapped.device == "mixed" and set(mapped.parts) == {"cpu", "cuda:0"}
    assert set(mapped.report.per_device) == {"cpu", "cuda:0"}
    assert sum(each.bytes for each in mapped.report.per_device.values()) == mapped.report.bytes == \
        sum(len(raw) for _, _, raw in tensors.values())
    balanced = hetmem.load(path, device_map="balanced")
    check_values(balanced, tensors)
    gpus = {f"cuda:{ordinal}" for ordinal in range(len(hetmem.cuda_devices()))}
    assert all(tensor.is_cuda for tensor in balanced.values()) and set(balanced.parts) <= gpus
    assert len(balanced.parts) == min(len(gpus), len(tensors)), "every GPU present takes a run"
    assert torch.cuda.is_available()
    missing = len(hetmem.cuda_devices())
    with pytest.raises(hetmem.HetmemError, match=f"CUDA device {missing} does not exist; present: cuda:0"):
        hetmem.load(path, device=f"cuda:{missing}")


@needs_gpu
def test_on_two_gpus_each_tensor_lands_on_the_gpu_its_key_names(tmp_path, rng):
    torch = pytest.importorskip("torch")
    if len(hetmem.cuda_devices()) < 2:
        pytest.skip("one GPU present: this needs two")
    path, tensors = model(tmp_path, rng)
    mapped = hetmem.load(path, device_map={"embed": torch.device("cuda:1"), "layers.0": 0, "layers.1": "cuda:1",
                                           "": "cuda:0"})
    check_values(mapped, tensors)
    for name in tensors:
        wanted = 1 if name.startswith(("embed", "layers.1.")) else 0
        assert mapped[name].device == torch.device("cuda", wanted), name
    assert set(mapped.parts) == {"cuda:0", "cuda:1"}
    assert hetmem.cuda_device(1).ordinal == 1 and hetmem.cuda_device(1) is hetmem.cuda_device(1)


def test_device_spellings_that_name_no_device_are_refused(tmp_path, rng):
    path, _ = model(tmp_path, rng)
    with pytest.raises(TypeError, match="device=True"):
        hetmem.load(path, device=True)
    with pytest.raises(ValueError, match="'cuda:x'.*'cuda:N'"):
        hetmem.load(path, device="cuda:x")
    with pytest.raises(ValueError, match="0 or more"):
        hetmem.load(path, device=-1)
    with pytest.raises(TypeError, match="give an int"):
        hetmem.cuda_device("1")
    with pytest.raises(TypeError, match="bool"):
        hetmem.cuda_device(False)


@pytest.mark.skipif(on_gpu, reason="on a GPU the ordinals name devices")
def test_without_a_gpu_every_ordinal_is_refused_naming_the_cause(tmp_path, rng):
    path, _ = model(tmp_path, rng)
    assert hetmem.cuda_devices() == [] or hetmem.device().backend == "cpu"
    for device in ("cuda:1", 1, "cuda"):
        with pytest.raises(hetmem.HetmemError, match="no GPU can be used"):
            hetmem.load(path, device=device)
    with pytest.raises(hetmem.HetmemError, match="no GPU can be used"):
        hetmem.cuda_device(1)
    with pytest.raises(hetmem.HetmemError, match="no GPU can be used"):
        hetmem.load(path, device=np.int64(0))
    with pytest.raises(hetmem.HetmemError, match="no GPU can be used"):
        hetmem.load(path, device_map={"": "cuda:1"})
