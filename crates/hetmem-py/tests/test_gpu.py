"""Zero-copy both ways with a GPU: DLPack and CUDA array interface round trips with PyTorch
and CuPy, writes seen from both sides. Skipped (visibly) without a GPU, PyTorch or CuPy; with
HETMEM_REQUIRE_GPU=1 a missing GPU fails instead."""

import os

import numpy as np
import pytest

import hetmem

on_gpu = hetmem.device().backend == "cuda"
if not on_gpu and os.environ.get("HETMEM_REQUIRE_GPU") == "1":
    raise RuntimeError(f"HETMEM_REQUIRE_GPU=1 but no GPU: {hetmem.device().fallback_reason}")
pytestmark = pytest.mark.skipif(not on_gpu, reason="skipped: no CUDA device")


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")


def test_registered_array_is_a_cuda_tensor_without_a_copy(rng, torch):
    array = rng.standard_normal((256, 1024)).astype(np.float32)
    buf = hetmem.register(array)
    assert buf.kind == "registered" and buf.is_mapped
    with buf.lend() as view:
        gpu = torch.from_dlpack(view)
        assert gpu.is_cuda and gpu.data_ptr() == buf.device_ptr
        assert torch.equal(gpu.cpu(), torch.from_numpy(array.copy()))
        gpu.mul_(2.0)  # a kernel writes the host memory in place
        torch.cuda.synchronize()
    np.testing.assert_array_equal(array, buf.numpy())
    expected = (rng.standard_normal((256, 1024)).astype(np.float32))
    array[...] = expected  # the CPU writes; the GPU view sees it
    assert torch.equal(gpu.cpu(), torch.from_numpy(expected))


def test_pinned_mapped_memory_round_trips_with_torch(rng, torch):
    buf = hetmem.pinned((64, 64), np.int32)
    fresh = rng.integers(-(2**31), 2**31 - 1, size=(64, 64), dtype=np.int32)
    buf.numpy()[...] = fresh
    gpu = torch.from_dlpack(buf.cuda())
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu.cpu(), torch.from_numpy(fresh))
    gpu.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(buf.numpy(), fresh + 1)
    host = torch.from_dlpack(buf)  # the host view as a CPU tensor
    assert host.device.type == "cpu" and host.data_ptr() == buf.numpy().ctypes.data


def test_torch_stream_in_a_lease(rng, torch):
    original = rng.integers(0, 255, size=1 << 20, dtype=np.uint8)
    buf = hetmem.register(original.copy())
    stream = torch.cuda.Stream()
    with buf.lend(stream) as view, torch.cuda.stream(stream):
        torch.from_dlpack(view).bitwise_not_()
        with pytest.raises(hetmem.LentError):
            buf.numpy()
    assert not buf.lent
    np.testing.assert_array_equal(buf.numpy(), 255 - original)


def test_cupy_sees_the_same_memory_both_ways(rng, cupy):
    array = rng.standard_normal(4096).astype(np.float64)
    expected = array * 3.0
    buf = hetmem.register(array)
    through_cai = cupy.asarray(buf.cuda())
    assert through_cai.data.ptr == buf.device_ptr
    through_dlpack = cupy.from_dlpack(buf.cuda())
    through_cai *= 3.0
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(array, expected)
    np.testing.assert_array_equal(cupy.asnumpy(through_dlpack), expected)


def test_a_file_window_reaches_torch_in_place(rng, torch, tmp_path):
    data = rng.integers(0, 255, size=(16, 3, 32, 32), dtype=np.uint8)
    path = tmp_path / "images.bin"
    data.tofile(path)
    window = hetmem.MappedFile(path, writable=True).window(0, data.shape, writable=True)
    gpu = torch.from_dlpack(window.cuda())
    assert torch.equal(gpu.cpu(), torch.from_numpy(data))
    gpu.bitwise_not_()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(window.numpy(), 255 - data)


def test_hetmem_stream_drives_torch_work(rng, torch):
    stream = hetmem.stream()
    assert stream.__cuda_stream__() == (0, stream.handle) and stream.handle != 0
    values = rng.standard_normal(1 << 16).astype(np.float32)
    buf = hetmem.register(values.copy())
    external = torch.cuda.ExternalStream(stream.handle)
    assert external.cuda_stream == stream.handle
    with buf.lend(stream) as view, torch.cuda.stream(external):
        torch.from_dlpack(view).mul_(-3.0)  # queued on hetmem's stream; the lease waits for it
    np.testing.assert_array_equal(buf.numpy(), values * -3.0)
    assert stream.query()


def test_hetmem_stream_drives_cupy_work(rng, cupy):
    stream = hetmem.stream()
    values = rng.integers(0, 2**31, size=4096, dtype=np.int64)
    buf = hetmem.register(values.copy())
    with cupy.cuda.ExternalStream(stream.handle):
        seen = cupy.asarray(buf.cuda())
        seen += 7
    stream.synchronize()
    np.testing.assert_array_equal(buf.numpy(), values + 7)


def test_a_read_only_window_exports_a_read_only_versioned_device_capsule(rng, tmp_path):
    data = rng.integers(0, 255, size=(8, 4096), dtype=np.uint8)
    path = tmp_path / "records.bin"
    data.tofile(path)
    window = hetmem.MappedFile(path).window(0, data.shape)
    info = hetmem._native.tensor_info(window.cuda().__dlpack__(max_version=(1, 0)))
    assert info.readonly and (info.device_type, info.device_id) == window.cuda().__dlpack_device__()
    assert info.address == window.device_ptr and info.shape == list(data.shape)
    with pytest.raises(BufferError, match="no read-only flag"):
        window.cuda().__dlpack__()
