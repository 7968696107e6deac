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


def test_options_not_implemented_or_unknown_are_refused(tmp_path, rng):
    path = write(tmp_path / "small.safetensors", {"w": ("F32", (4,), random_bytes(rng, "F32", (4,)))})
    for option in ("dtype", "into", "shard"):
        with pytest.raises(NotImplementedError, match=f"{option}="):
            hetmem.load(path, device="cpu", **{option: (0, 2, 0)})
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
    assert bytes(hetmem.load(path, device="cpu", threads=2)["w"].tobytes()) == data


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
