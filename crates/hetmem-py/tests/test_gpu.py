"""Zero-copy both ways with a GPU: DLPack and CUDA array interface round trips with PyTorch
and CuPy, writes seen from both sides. Skipped (visibly) without a GPU, PyTorch or CuPy; with
HETMEM_REQUIRE_GPU=1 a missing GPU fails instead."""

import gc
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


# -- releases wait for the GPU work that may still use the memory --------------------------------
# Each queues a long kernel (torch.cuda._sleep) and then a write through a view, drops every view
# and the buffer at once, and checks that the release waited: the write is complete (its event
# has fired) by the time the drop returns, and what is reused or written back holds its result.

SLEEP_CYCLES = 2_000_000_000  # about a second at the H200's clock: far longer than a drop


def queue_slow_fill(torch, tensor, value, stream=None):
    """Queues a long sleep, then `tensor.fill_(value)`, on `stream` (default: the current one);
    returns the event recorded after the fill."""
    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        tensor.fill_(value)
        done = torch.cuda.Event()
        done.record(stream)
    assert not done.query(), "the fill finished before the drop: lengthen SLEEP_CYCLES"
    return done


def consumer_streams(torch):
    """The consumer streams hetmem follows differently: the default stream (DLPack stream 1,
    followed by an event), a side stream of PyTorch's (not followed: the device), hetmem's own
    stream (followed by an event)."""
    own = hetmem.stream()
    return {
        "default": (lambda: torch.cuda.current_stream(), None),
        "torch-side": (lambda: torch.cuda.Stream(), None),
        "hetmem": (lambda: torch.cuda.ExternalStream(own.handle), own),
    }


@pytest.mark.parametrize("consumer", ["default", "torch-side", "hetmem"])
def test_a_pooled_block_is_not_reused_while_a_kernel_still_writes_it(torch, consumer):
    make_stream, keep = consumer_streams(torch)[consumer]
    stream = make_stream()
    pool = hetmem.PinnedPool(256 << 20)
    buf = pool.acquire((16 << 20,), np.float32)
    with torch.cuda.stream(stream):
        gpu = torch.from_dlpack(buf.cuda())  # the consumer's stream goes to __dlpack__
    done = queue_slow_fill(torch, gpu, 7.0, stream)
    del gpu, buf
    gc.collect()
    assert done.query(), "the block went back to the pool while the kernel could still write it"
    again = pool.acquire((16 << 20,), np.float32)
    assert pool.stats()["hits"] == 1
    assert (again.numpy() == 7.0).all()
    del keep


def test_a_pooled_block_seen_through_the_cuda_array_interface_waits_for_the_device(cupy):
    pool = hetmem.PinnedPool(256 << 20)
    buf = pool.acquire((16 << 20,), np.float32)
    seen = cupy.asarray(buf.cuda())  # the interface names no consumer stream: the device is waited for
    spin_then_fill = cupy.RawKernel(r"""
        extern "C" __global__ void spin_then_fill(long long cycles, float* out, float value, long long n) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
            for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
        }""", "spin_then_fill")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        spin_then_fill((1,), (256,), (np.int64(SLEEP_CYCLES), seen, np.float32(5.0), np.int64(seen.size)))
        done = stream.record()
    assert not done.done, "the kernel finished before the drop: lengthen SLEEP_CYCLES"
    del seen, buf
    gc.collect()
    assert done.done, "the block went back to the pool while the kernel could still write it"
    again = pool.acquire((16 << 20,), np.float32)
    assert (again.numpy() == 5.0).all()


def test_a_host_view_copied_asynchronously_is_not_reused_before_the_copy(torch, rng):
    pool = hetmem.PinnedPool(256 << 20)
    buf = pool.acquire((16 << 20,), np.float32)
    values = rng.standard_normal(16 << 20).astype(np.float32)
    buf.numpy()[...] = values
    host = torch.from_dlpack(buf)  # a CPU tensor over pinned memory: PyTorch copies it asynchronously
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        device_copy = host.to("cuda", non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    assert not done.query()
    del host, buf
    gc.collect()
    assert done.query(), "the block went back to the pool while a copy engine could still read it"
    reused = pool.acquire((16 << 20,), np.float32)
    reused.numpy()[...] = 0.0  # the next user overwrites it: the copy has what was there before
    np.testing.assert_array_equal(device_copy.cpu().numpy(), values)


def test_a_staged_window_is_written_back_after_the_kernel(torch, tmp_path):
    path = tmp_path / "data.bin"
    np.zeros(16 << 20, np.float32).tofile(path)
    window = hetmem.MappedFile(path, writable=True).window(0, (16 << 20,), np.float32, writable=True)
    gpu = torch.from_dlpack(window.cuda())
    done = queue_slow_fill(torch, gpu, 3.0)
    del gpu, window
    gc.collect()
    assert done.query(), "the window was written back while the kernel could still write it"
    assert (np.fromfile(path, np.float32) == 3.0).all()


def test_pinned_memory_is_freed_only_after_the_kernel(torch):
    buf = hetmem.pinned((16 << 20,), np.float32)
    gpu = torch.from_dlpack(buf.cuda())
    done = queue_slow_fill(torch, gpu, 1.0, torch.cuda.Stream())
    del gpu, buf
    gc.collect()
    assert done.query(), "pinned memory was freed while the kernel could still write it"


def test_a_device_view_from_a_lease_and_one_without(torch, rng):
    # Both work; only the lease keeps host views off the memory while the GPU works.
    values = rng.standard_normal(1 << 20).astype(np.float32)
    buf = hetmem.register(values.copy())
    stream = torch.cuda.Stream()
    with buf.lend(stream) as view, torch.cuda.stream(stream):
        torch.from_dlpack(view).mul_(2.0)
        with pytest.raises(hetmem.LentError):
            buf.numpy()
    np.testing.assert_array_equal(buf.numpy(), values * 2.0)
    outside = torch.from_dlpack(buf.cuda())  # outside the hand-off: host views stay available
    outside.mul_(0.5)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(buf.numpy(), values)


def test_registrations_racing_an_unregistration_of_their_pages_succeed(rng):
    # Once: an entry whose last buffer was dying was skipped, and the new registration of the
    # same page failed in the driver (ALREADY_REGISTERED), reported as pinned outside hetmem.
    import threading

    page = hetmem.page_size
    backing = rng.integers(0, 255, size=3 * page, dtype=np.uint8)
    start = -backing.ctypes.data % page
    parts = [backing[start:start + 100], backing[start + 200:start + 300]]
    errors = []

    def churn(part):
        try:
            for _ in range(300):
                buf = hetmem.register(part)
                np.testing.assert_array_equal(buf.numpy(), part)
                del buf
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=churn, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
