"""hetmem.load: safetensors files, lists of them and sharded checkpoints into one allocation,
every dtype the format has, scalars and empty tensors, tensors chosen by name or prefix, and
bad files refused naming the file, the tensor and a remedy. Every value is compared with NumPy
reading the same bytes. The GPU part is skipped without a GPU and required with
HETMEM_REQUIRE_GPU=1; it compares the device tensors with the CPU load of the same files."""

import json
import os

import numpy as np
import pytest

import hetmem

on_gpu = hetmem.device().backend == "cuda"
if not on_gpu and os.environ.get("HETMEM_REQUIRE_GPU") == "1":
    raise RuntimeError(f"HETMEM_REQUIRE_GPU=1 but no GPU: {hetmem.device().fallback_reason}")
needs_gpu = pytest.mark.skipif(not on_gpu, reason="skipped: no CUDA device")

# Each safetensors dtype and the NumPy dtype of its raw bits (what hetmem's NumPy views carry).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "C64": np.complex64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
}
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "C64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def random_bytes(rng, dtype, shape):
    """Fresh random bytes for a tensor: valid values (bools 0/1, finite floats)."""
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == "BOOL":
        return rng.integers(0, 2, count, dtype=np.uint8).tobytes()
    if dtype in ("F64", "F32", "F16", "C64"):
        return rng.standard_normal(count * (2 if dtype == "C64" else 1)).astype(
            {"F64": np.float64, "F32": np.float32, "F16": np.float16, "C64": np.float32}[dtype]).tobytes()
    return rng.integers(0, 256, count * SIZES[dtype], dtype=np.uint8).tobytes()


def write(path, tensors, header_extra=None, pad=True):
    """A safetensors file of `tensors` (name -> (dtype, shape, bytes)), in order, written by
    hand (the format is 8 bytes of header length, a JSON header, the data)."""
    header, data, at = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    header.update(header_extra or {})
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little") + text + data)
    return path


def expected(tensors):
    return {name: np.frombuffer(raw, DTYPES[dtype]).reshape(shape) for name, (dtype, shape, raw) in tensors.items()}


def every_dtype(rng, prefix=""):
    tensors = {}
    for index, dtype in enumerate(DTYPES):
        shape = [(3, 5), (7,), (), (0, 4), (2, 3, 2)][index % 5]
        tensors[f"{prefix}{dtype.lower()}.t"] = (dtype, shape, random_bytes(rng, dtype, shape))
    return tensors


def check_values(loaded, tensors):
    assert set(loaded) == set(tensors)
    for name, want in expected(tensors).items():
        got = loaded[name]
        if hasattr(got, "numpy"):  # a torch tensor
            got = got.cpu()
            raw = got.view(-1).view(__import__("torch").uint8).numpy() if got.numel() else np.zeros(0, np.uint8)
            assert raw.tobytes() == want.tobytes(), name
            assert tuple(got.shape) == want.shape, name
        else:
            got = np.asarray(got)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_every_dtype_scalars_and_empty_tensors_load_as_numpy_reads_them(tmp_path, rng):
    tensors = every_dtype(rng)
    path = write(tmp_path / "every.safetensors", tensors, {"__metadata__": {"format": "pt"}})
    loaded = hetmem.load(path, device="cpu")
    check_values(loaded, tensors)
    assert loaded.device == "cpu" and len(loaded) == len(DTYPES)
    assert loaded.report.bytes == sum(len(raw) for _, _, raw in tensors.values())
    assert loaded.report.method in ("staged", "staged-direct") and loaded.report.gb_per_s >= 0
    shares = hetmem.load(path, device="cpu", link_gb_per_s=50.0, storage_gb_per_s=5.0, measure_link=True)
    assert shares.report.link_gb_per_s == 50.0 and shares.report.storage_gb_per_s == 5.0
    assert shares.report.setup_seconds == 0.0, "the second load reuses the first one's staging ring"
    assert shares.report.of_link == pytest.approx(shares.report.gb_per_s / 50.0)
    assert shares.report.of_storage == pytest.approx(shares.report.gb_per_s / 5.0)


def test_the_tensors_are_views_of_one_allocation(tmp_path, rng):
    tensors = {f"w{k}": ("F32", (64, 3), random_bytes(rng, "F32", (64, 3))) for k in range(4)}
    loaded = hetmem.load(write(tmp_path / "one.safetensors", tensors), device="cpu", progress=False)
    if hasattr(loaded["w0"], "data_ptr"):
        addresses = [loaded[name].data_ptr() for name in sorted(loaded)]
    else:
        addresses = [loaded[name].__array_interface__["data"][0] for name in sorted(loaded)]
    assert max(addresses) + 64 * 3 * 4 - min(addresses) <= loaded.nbytes
    assert addresses == sorted(addresses) and len(set(addresses)) == 4


def test_tensors_at_offsets_their_element_size_does_not_divide_load(tmp_path, rng):
    # A 3-byte tensor first: every tensor after it starts off its alignment.
    tensors = {"a.odd": ("U8", (3,), random_bytes(rng, "U8", (3,))),
               "b.f32": ("F32", (5, 2), random_bytes(rng, "F32", (5, 2))),
               "c.bf16": ("BF16", (7,), random_bytes(rng, "BF16", (7,))),
               "d.i64": ("I64", (), random_bytes(rng, "I64", ()))}
    check_values(hetmem.load(write(tmp_path / "odd.safetensors", tensors), device="cpu"), tensors)


def test_a_file_written_by_the_safetensors_package_loads(tmp_path, rng):
    numpy_io = pytest.importorskip("safetensors.numpy")
    arrays = {"a.w": rng.standard_normal((17, 9)).astype(np.float32),
              "a.i": rng.integers(-9, 9, (5,), dtype=np.int64), "a.s": np.array(rng.standard_normal())}
    numpy_io.save_file(arrays, str(tmp_path / "pkg.safetensors"))
    loaded = hetmem.load(tmp_path / "pkg.safetensors", device="cpu")
    for name, array in arrays.items():
        np.testing.assert_array_equal(np.asarray(loaded[name]), array)


def shards(tmp_path, rng):
    """Three shards of every dtype, their index, and every tensor."""
    everything, weight_map = {}, {}
    for k in range(3):
        file = f"model-{k + 1:05d}-of-00003.safetensors"
        tensors = every_dtype(rng, prefix=f"layers.{k}.")
        write(tmp_path / file, tensors)
        everything.update(tensors)
        weight_map.update({name: file for name in tensors})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index, everything


def test_a_sharded_checkpoint_loads_by_its_index_or_its_files(tmp_path, rng):
    index, everything = shards(tmp_path, rng)
    check_values(hetmem.load(index, device="cpu"), everything)
    files = sorted(str(path) for path in tmp_path.glob("*.safetensors"))
    check_values(hetmem.load(files, device="cpu"), everything)


def test_names_and_prefixes_choose_what_is_read(tmp_path, rng):
    index, everything = shards(tmp_path, rng)
    chosen = ["layers.1.bf16.t", "layers.0.f32.t", "layers.2.u8.t"]
    loaded = hetmem.load(index, device="cpu", names=chosen)
    check_values(loaded, {name: everything[name] for name in chosen})
    assert loaded.report.bytes == sum(len(everything[name][2]) for name in chosen)
    by_prefix = hetmem.load(index, device="cpu", prefix=("layers.2.", "layers.0.i"))
    want = {name: value for name, value in everything.items()
            if name.startswith("layers.2.") or name.startswith("layers.0.i")}
    check_values(by_prefix, want)
    with pytest.raises(ValueError, match="layers.9.nothing"):
        hetmem.load(index, device="cpu", names=["layers.0.f32.t", "layers.9.nothing"])
    with pytest.raises(ValueError, match="check the prefix"):
        hetmem.load(index, device="cpu", prefix="decoder.")
    with pytest.raises(ValueError, match="not both"):
        hetmem.load(index, device="cpu", names=chosen, prefix="layers.")


def test_options_unknown_are_refused(tmp_path, rng):
    path = write(tmp_path / "small.safetensors", {"w": ("F32", (4,), random_bytes(rng, "F32", (4,)))})
    with pytest.raises(ValueError, match="windows"):
        hetmem.load(path, device="cpu", method="windows")
    with pytest.raises(ValueError, match="teleport"):
        hetmem.load(path, device="cpu", method="teleport")
    with pytest.raises(ValueError, match="device="):
        hetmem.load(path, device="tpu")
    with pytest.raises(ValueError, match="index"):
        hetmem.load([path, tmp_path / "model.safetensors.index.json"], device="cpu")


def test_counts_of_threads_or_bytes_out_of_range_are_refused_before_anything_runs(tmp_path, rng):
    data = random_bytes(rng, "F32", (4,))
    path = write(tmp_path / "small.safetensors", {"w": ("F32", (4,), data)})
    # A million reader threads (two million pinned staging chunks) would exhaust the process.
    for keywords, words in [
        (dict(threads=10**6), "at most 1024 threads"),
        (dict(threads=0), "at least 1"),
        (dict(threads=-1), "threads"),
        (dict(threads=2**70), "threads"),
        (dict(chunk_bytes=-4096), "chunk_bytes"),
        (dict(chunk_bytes=4097), "multiple of 4096"),
    ]:
        with pytest.raises((hetmem.HetmemError, ValueError, OverflowError)) as caught:
            hetmem.load(path, device="cpu", **keywords)
        assert words in str(caught.value), (keywords, str(caught.value))
    with pytest.raises(TypeError):
        hetmem.load(path, device="cpu", threads="4")
    assert as_bytes(hetmem.load(path, device="cpu", threads=2)["w"]) == data


def bad(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(source, *words):
    with pytest.raises((hetmem.HetmemError, ValueError)) as caught:
        hetmem.load(source, device="cpu")
    text = str(caught.value)
    for word in words:
        assert word in text, text
    return text


def test_bad_files_are_refused_naming_the_file_the_tensor_and_a_remedy(tmp_path, rng):
    tensors = {"a": ("F32", (8,), random_bytes(rng, "F32", (8,))), "b": ("I16", (5,), random_bytes(rng, "I16", (5,)))}
    good = write(tmp_path / "good.safetensors", tensors).read_bytes()
    header_len = int.from_bytes(good[:8], "little")
    refused(bad(tmp_path, "cut.safetensors", good[:-3]), "cut.safetensors", "remedy")
    refused(bad(tmp_path, "tiny.safetensors", good[:5]), "tiny.safetensors", "8-byte")
    lying = (len(good) * 2).to_bytes(8, "little") + good[8:]
    refused(bad(tmp_path, "lying.safetensors", lying), "lying.safetensors", "truncated?")
    refused(bad(tmp_path, "json.safetensors", good[:8] + b"{" * header_len + good[8 + header_len:]),
            "json.safetensors", "header:")
    header = json.loads(good[8:8 + header_len])

    def with_header(name, change):
        edited = json.loads(json.dumps(header))
        change(edited)
        text = json.dumps(edited).encode()
        return bad(tmp_path, name, len(text).to_bytes(8, "little") + text + good[8 + header_len:])

    def overlap(h):
        h["b"]["data_offsets"] = [28, 38]
    refused(with_header("overlap.safetensors", overlap), "overlap.safetensors", '"b"', "overlap")

    def past_end(h):
        h["b"]["data_offsets"] = [32, 32 + 10 * 2**40]
        h["b"]["shape"] = [5 * 2**40]
    refused(with_header("past.safetensors", past_end), "past.safetensors", "describes")

    def shape_lies(h):
        h["a"]["shape"] = [9]
    refused(with_header("shape.safetensors", shape_lies), "shape.safetensors", '"a"', "36 bytes")

    def overflow(h):
        h["a"]["shape"] = [2**62, 2**62]
    refused(with_header("overflow.safetensors", overflow), "overflow.safetensors", '"a"', "larger than")

    def unknown(h):
        h["a"]["dtype"] = "F12"
    refused(with_header("dtype.safetensors", unknown), "dtype.safetensors", '"a"', "unknown dtype")


def test_collisions_and_missing_shards_are_refused(tmp_path, rng):
    index, _ = shards(tmp_path, rng)
    files = sorted(str(path) for path in tmp_path.glob("*.safetensors"))
    again = write(tmp_path / "again.safetensors", {"layers.1.f32.t": ("U8", (3,), random_bytes(rng, "U8", (3,)))})
    refused(files + [str(again)], '"layers.1.f32.t"', "again.safetensors", "00002-of-00003", "drop the file")
    os.remove(files[2])
    refused(index, "model-00003-of-00003.safetensors", "download it", "index.json", "layers.2.")
    bad(tmp_path, "broken.index.json", b'{"weight_map": [1, 2]}')
    refused(tmp_path / "broken.index.json", "broken.index.json", "weight_map")


def test_a_load_state_dict_takes_the_tensors_in_place(tmp_path, rng):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    fresh = {name: torch.from_numpy(rng.standard_normal(tuple(value.shape)).astype(np.float32))
             for name, value in model.state_dict().items()}
    tensors = {name: ("F32", tuple(value.shape), value.numpy().tobytes()) for name, value in fresh.items()}
    loaded = hetmem.load(write(tmp_path / "model.safetensors", tensors), device="cpu")
    model.load_state_dict(loaded, assign=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, fresh[name]), name
        assert value.data_ptr() == loaded[name].data_ptr(), f"{name} is the loaded view, not a copy"
    x = torch.from_numpy(rng.standard_normal((4, 12)).astype(np.float32))
    assert model(x).shape == (4, 3)


def test_torch_tensors_carry_every_dtype(tmp_path, rng):
    torch = pytest.importorskip("torch")
    tensors = every_dtype(rng)
    loaded = hetmem.load(write(tmp_path / "torch.safetensors", tensors), device="cpu")
    assert loaded["bf16.t"].dtype == torch.bfloat16 and loaded["f8_e4m3.t"].dtype == torch.float8_e4m3fn
    assert loaded["bool.t"].dtype == torch.bool and loaded["c64.t"].dtype == torch.complex64
    check_values(loaded, tensors)


@needs_gpu
def test_the_gpu_load_matches_the_cpu_load(tmp_path, rng):
    torch = pytest.importorskip("torch")
    index, everything = shards(tmp_path, rng)
    # A tensor of a few MiB, so the load runs several pieces through the staging ring.
    big = {"big.w": ("BF16", (1024, 3000), random_bytes(rng, "BF16", (1024, 3000)))}
    write(tmp_path / "big.safetensors", big)
    for method in ("auto", "staged", "staged-direct"):
        on_cpu = hetmem.load(index, device="cpu", method=method)
        on_device = hetmem.load(index, device="cuda", method=method, measure_link=True)
        assert on_device.report.link_gb_per_s > 1 and on_device.report.of_link > 0
        assert on_device.device == "cuda" and set(on_device) == set(on_cpu)
        for name in on_cpu:
            gpu = on_device[name]
            assert gpu.is_cuda, name
            assert torch.equal(gpu.cpu().view(-1).view(torch.uint8) if gpu.numel() else gpu.cpu(),
                               on_cpu[name].view(-1).view(torch.uint8) if gpu.numel() else on_cpu[name]), name
        check_values(on_device, everything)
        check_values(hetmem.load(tmp_path / "big.safetensors", device="cuda", method=method), big)


@needs_gpu
def test_a_gpu_model_loads_its_state_dict_in_place(tmp_path, rng):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).cuda()
    # Poisoned: every parameter holds NaN before the load.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    fresh = {name: rng.standard_normal(tuple(value.shape)).astype(np.float32) for name, value in model.state_dict().items()}
    tensors = {name: ("F32", value.shape, value.tobytes()) for name, value in fresh.items()}
    loaded = hetmem.load(write(tmp_path / "gpu.safetensors", tensors), device="cuda")
    model.load_state_dict(loaded, assign=True)
    for name, value in model.state_dict().items():
        assert value.is_cuda and torch.equal(value.cpu(), torch.from_numpy(fresh[name])), name
    x = torch.from_numpy(rng.standard_normal((5, 64)).astype(np.float32))
    reference = torch.nn.functional.linear(
        torch.nn.functional.gelu(torch.nn.functional.linear(x, torch.from_numpy(fresh["0.weight"]),
                                                            torch.from_numpy(fresh["0.bias"]))),
        torch.from_numpy(fresh["2.weight"]), torch.from_numpy(fresh["2.bias"]))
    torch.testing.assert_close(model(x.cuda()).cpu(), reference, rtol=1e-4, atol=1e-4)


def torch_bytes(tensor):
    """A torch tensor's bytes, as a NumPy uint8 array."""
    torch = __import__("torch")
    tensor = tensor.detach().cpu().contiguous()
    return tensor.view(-1).view(torch.uint8).numpy() if tensor.numel() else np.zeros(0, np.uint8)


def as_bytes(value):
    return torch_bytes(value).tobytes() if hasattr(value, "data_ptr") else np.ascontiguousarray(value).tobytes()


def sharded_model(tmp_path, rng):
    """One file of tensors of 0 to 3 dimensions, sizes the worlds do not all divide."""
    shapes = {"attn.q": ("F32", (12, 10)), "attn.bias": ("BF16", (10,)), "mlp.w": ("F16", (5, 7, 3)),
              "step": ("I64", ()), "empty": ("U8", (0, 6)), "mask": ("BOOL", (6, 4))}
    tensors = {name: (dtype, shape, random_bytes(rng, dtype, shape)) for name, (dtype, shape) in shapes.items()}
    return write(tmp_path / "sharded.safetensors", tensors), tensors


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_rank_gets_its_torch_chunk_and_reads_only_its_bytes(tmp_path, rng, dim, world):
    path, tensors = sharded_model(tmp_path, rng)
    want_all = expected(tensors)
    total = 0
    for rank in range(world):
        loaded = hetmem.load(path, device="cpu", shard=(rank, world, dim))
        assert set(loaded) == set(tensors)
        read = 0
        for name, whole in want_all.items():
            if whole.ndim > dim:
                # NumPy's version of torch.chunk: chunks of ceil(size / world).
                chunk = -(-whole.shape[dim] // world)
                want = np.take(whole, range(min(rank * chunk, whole.shape[dim]),
                                            min((rank + 1) * chunk, whole.shape[dim])), axis=dim)
                read += want.nbytes
            else:
                want = whole
            got = loaded[name]
            assert tuple(got.shape) == want.shape, (name, rank, world, dim)
            assert as_bytes(got) == want.tobytes(), (name, rank, world, dim)
        assert loaded.report.bytes == read + sum(w.nbytes for w in want_all.values() if w.ndim <= dim)
        total += read
    assert total == sum(w.nbytes for w in want_all.values() if w.ndim > dim), "the ranks together read each slice once"


def test_a_two_rank_load_reads_at_most_55_percent_of_the_file_per_rank(tmp_path, rng):
    tensors = {"q": ("BF16", (128, 256), random_bytes(rng, "BF16", (128, 256))),
               "k": ("BF16", (128, 256), random_bytes(rng, "BF16", (128, 256))),
               "norm": ("F32", (256,), random_bytes(rng, "F32", (256,)))}
    path = write(tmp_path / "tp.safetensors", tensors)
    size = sum(len(raw) for _, _, raw in tensors.values())
    for dim in (0, 1):
        halves = [hetmem.load(path, device="cpu", shard=(rank, 2, dim)) for rank in (0, 1)]
        for half in halves:
            assert half.report.bytes <= 0.55 * size, (dim, half.report.bytes, size)
        joined = np.concatenate([np.asarray(h["q"]).view(np.uint16) if not hasattr(h["q"], "data_ptr")
                                 else torch_bytes(h["q"]).view(np.uint16).reshape(h["q"].shape) for h in halves],
                                axis=dim)
        assert joined.tobytes() == tensors["q"][2]


def test_bad_shards_are_refused_naming_the_remedy(tmp_path, rng):
    path, _ = sharded_model(tmp_path, rng)
    for shard, words in [((2, 2, 0), "count from 0 to 1"), ((0, 0, 0), "at least 1"), ((-1, 2, 0), "count from 0"),
                         ((0, 2, -1), "counted from the front"), ((0, 2), "three ints"), ("0,2,0", "three ints"),
                         ((0.5, 2, 0), "three ints")]:
        with pytest.raises(ValueError, match=words):
            hetmem.load(path, device="cpu", shard=shard)


def test_dtype_and_into_without_torch_say_they_need_it(tmp_path, rng):
    if hetmem._load._torch() is not None:
        pytest.skip("skipped: PyTorch is installed, so dtype= and into= work")
    path, _ = sharded_model(tmp_path, rng)
    for keywords in (dict(dtype="float16"), dict(into={})):
        with pytest.raises(hetmem.HetmemError, match="needs PyTorch"):
            hetmem.load(path, device="cpu", **keywords)


@pytest.mark.parametrize("target", ["bfloat16", "float16", "float32"])
def test_dtype_casts_floating_tensors_and_leaves_integers(tmp_path, rng, target):
    torch = pytest.importorskip("torch")
    path, tensors = sharded_model(tmp_path, rng)
    for dtype in (target, getattr(torch, target)):
        cast = hetmem.load(path, device="cpu", dtype=dtype, shard=(1, 2, 0))
        plain = hetmem.load(path, device="cpu", shard=(1, 2, 0))
        for name, tensor in plain.items():
            got = cast[name]
            if tensor.dtype.is_floating_point:
                assert got.dtype == getattr(torch, target), name
                # As bytes: random bits hold NaNs, which torch.equal calls unequal to themselves.
                assert as_bytes(got) == as_bytes(tensor.to(getattr(torch, target))), name
            else:
                assert got.dtype == tensor.dtype and as_bytes(got) == as_bytes(tensor), name
            if tensor.numel():
                assert got.data_ptr() != tensor.data_ptr(), f"{name} is in the cast's own allocation"
    for bad in ("int32", torch.int8, "float8_e4m3fn", "complex64", "nonsense"):
        with pytest.raises(ValueError, match="dtype="):
            hetmem.load(path, device="cpu", dtype=bad)


def test_into_fills_the_given_tensors_after_checking_them_all(tmp_path, rng):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4))
    fresh = {name: rng.standard_normal(tuple(value.shape)).astype(np.float32)
             for name, value in model.state_dict().items()}
    path = write(tmp_path / "m.safetensors", {name: ("F32", v.shape, v.tobytes()) for name, v in fresh.items()})
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    params = dict(model.named_parameters())
    loaded = hetmem.load(path, into=params)
    for name, value in params.items():
        assert loaded[name] is value and torch.equal(value.detach(), torch.from_numpy(fresh[name])), name
    # A half model: floating tensors cast on the way in.
    half = {name: torch.full(v.shape, float("nan"), dtype=torch.bfloat16) for name, v in fresh.items()}
    hetmem.load(path, into=half)
    for name, value in half.items():
        assert torch.equal(value, torch.from_numpy(fresh[name]).to(torch.bfloat16)), name
    # A wrong shape: nothing is copied, the error names the tensor and both shapes.
    poisoned = {name: torch.full(v.shape, float("nan")) for name, v in fresh.items()}
    poisoned["2.weight"] = torch.full((4, 9), float("nan"))
    with pytest.raises(ValueError, match=r"'2.weight'.*\(4, 8\).*\(4, 9\)"):
        hetmem.load(path, into=poisoned)
    assert all(torch.isnan(value).all() for value in poisoned.values()), "no partial result"
    missing = {name: v for name, v in poisoned.items() if name != "0.bias"}
    with pytest.raises(ValueError, match="'0.bias'.*names= or prefix="):
        hetmem.load(path, into=missing)
    only_first = hetmem.load(path, into=missing, prefix="0.weight")
    assert list(only_first) == ["0.weight"] and torch.equal(missing["0.weight"], torch.from_numpy(fresh["0.weight"]))
    ints = {name: torch.zeros(v.shape, dtype=torch.int32) for name, v in fresh.items()}
    with pytest.raises(ValueError, match="only floating tensors are cast"):
        hetmem.load(path, into=ints)
    with pytest.raises(ValueError, match="not both"):
        hetmem.load(path, into=params, dtype="float16")


@needs_gpu
def test_gpu_shards_casts_and_into_match_the_cpu_load(tmp_path, rng):
    torch = pytest.importorskip("torch")
    path, tensors = sharded_model(tmp_path, rng)
    big = {"big.w": ("BF16", (1024, 3000), random_bytes(rng, "BF16", (1024, 3000)))}
    big_path = write(tmp_path / "big.safetensors", big)
    for source in (path, big_path):
        for dim in (0, 1):
            for rank in range(3):
                on_cpu = hetmem.load(source, device="cpu", shard=(rank, 3, dim))
                on_gpu = hetmem.load(source, device="cuda", shard=(rank, 3, dim))
                assert on_gpu.report.bytes == on_cpu.report.bytes
                for name in on_cpu:
                    assert on_gpu[name].is_cuda and as_bytes(on_gpu[name]) == as_bytes(on_cpu[name]), name
        cast = hetmem.load(source, device="cuda", dtype="float32", shard=(0, 2, 1))
        plain = hetmem.load(source, device="cpu", dtype="float32", shard=(0, 2, 1))
        for name in plain:
            # As bytes: random bits hold NaNs, which torch.equal calls unequal to themselves.
            assert cast[name].is_cuda and as_bytes(cast[name]) == as_bytes(plain[name]), name
        cpu_whole = hetmem.load(source, device="cpu")
        targets = {name: torch.full_like(t, 7, device="cuda") if t.numel() else t.cuda()
                   for name, t in cpu_whole.items()}
        hetmem.load(source, into=targets)
        for name, t in cpu_whole.items():
            assert as_bytes(targets[name]) == as_bytes(t), name  # as bytes: NaN bits again


def test_the_copies_out_of_a_load_are_waited_for_on_every_device_they_ran_on():
    # A stand-in for torch: which devices' current streams were synchronized. The loaded
    # tensors are on cuda:0 while the caller's current device (and into='s tensors) may be
    # another: waiting on the current device's stream alone would let the allocation go while
    # a copy on cuda:0 still reads it.
    from hetmem._load import _synchronized

    class Tensor:
        def __init__(self, device):
            self.device, self.is_cuda = device, device.startswith("cuda")

    synced = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            synced.append(self.device)

    class Cuda:
        @staticmethod
        def current_stream(device=None):
            if device is None:
                raise AssertionError("the current device's stream: name the tensors' device")
            return Stream(device)

    class Torch:
        cuda = Cuda

    rng = np.random.default_rng()
    devices = [f"cuda:{int(i)}" for i in rng.integers(0, 4, size=12)] + ["cpu"] * int(rng.integers(1, 4))
    _synchronized(Torch, [Tensor(device) for device in devices])
    assert sorted(synced) == sorted({d for d in devices if d != "cpu"})
    synced.clear()
    _synchronized(Torch, [Tensor("cpu"), Tensor("cpu")])
    assert synced == [], "host copies are done when copy_ returns: nothing to wait for"
