"""The binding on any machine (the CPU backend where there is no GPU): registration in place,
pinned memory, file windows, host DLPack, and the lend rule."""

import copy
import gc
import weakref

import numpy as np
import pytest

import hetmem

# NumPy speaks DLPack 1.x (versioned capsules, the read-only flag) from 2.1 on.
numpy_dlpack_1 = pytest.mark.skipif(np.lib.NumpyVersion(np.__version__) < "2.1.0",
                                    reason="skipped: NumPy < 2.1 has no DLPack 1.x")


def random_array(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 250, size=shape).astype(dtype)


def test_import_and_device_work_without_a_gpu():
    device = hetmem.device()
    assert device.backend in ("cpu", "cuda")
    if device.backend == "cpu":
        assert device.ordinal is None
    assert hetmem.page_size >= 4096


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32, np.float64])
def test_register_shares_the_array_in_place(rng, dtype):
    array = random_array(rng, (37, 11), dtype)
    expected = array.copy()
    buf = hetmem.register(array)
    assert buf.shape == array.shape and buf.dtype == array.dtype
    view = buf.numpy()
    assert np.shares_memory(view, array)
    np.testing.assert_array_equal(view, expected)
    # A write through either side is seen by the other.
    fresh = random_array(rng, (37, 11), dtype)
    view[...] = fresh
    np.testing.assert_array_equal(array, fresh)


def test_register_an_unaligned_slice_covers_its_pages(rng):
    backing = random_array(rng, 10_000, np.uint8)
    part = backing[3:9003]  # starts off any page boundary
    buf = hetmem.register(part)
    np.testing.assert_array_equal(buf.numpy(), backing[3:9003])
    assert buf.numpy().__array_interface__["data"][0] == part.__array_interface__["data"][0]


def test_register_a_writable_memoryview(rng):
    data = bytearray(random_array(rng, 5000, np.uint8).tobytes())
    buf = hetmem.register(memoryview(data))
    view = buf.numpy()
    flipped = 255 - int(view[17])
    view[17] = flipped
    assert data[17] == flipped


def test_register_refuses_what_it_cannot_pin_in_place(rng):
    array = random_array(rng, (20, 20), np.float32)
    with pytest.raises(ValueError, match="not C-contiguous"):
        hetmem.register(array[:, ::2])
    readonly = array.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        hetmem.register(readonly)
    with pytest.raises(ValueError, match="read-only memoryview"):
        hetmem.register(memoryview(b"immutable bytes"))
    with pytest.raises(ValueError, match="empty"):
        hetmem.register(np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="hetmem buffer.*use the buffer itself"):
        hetmem.register(hetmem.pinned(64))


def test_registration_keeps_the_array_alive_until_the_buffer_dies(rng):
    array = random_array(rng, 4096, np.int32)
    expected = array.copy()
    alive = weakref.ref(array)
    buf = hetmem.register(array)
    del array
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(buf.numpy(), expected)
    del buf
    gc.collect()
    assert alive() is None


def test_pinned_memory_is_zeroed_and_shaped(rng):
    buf = hetmem.pinned((64, 3), np.float32)
    view = buf.numpy()
    assert view.shape == (64, 3) and view.dtype == np.float32
    assert not view.any()
    fresh = random_array(rng, (64, 3), np.float32)
    view[...] = fresh
    np.testing.assert_array_equal(buf.numpy(), fresh)
    assert hetmem.pinned(4096).numpy().shape == (4096,)
    if hetmem.device().backend == "cpu":
        assert buf.kind == "plain" and not buf.is_mapped


def test_host_dlpack_round_trip_shares_memory(rng):
    array = random_array(rng, (8, 9, 3), np.uint16)
    buf = hetmem.register(array)
    assert buf.__dlpack_device__() == (1, 0)
    seen = np.from_dlpack(buf)
    assert np.shares_memory(seen, array)
    np.testing.assert_array_equal(seen, array)
    # The consumer's array keeps the memory alive after the buffer and the array are gone,
    # and lets it go when it dies (the DLPack deleter).
    expected = array.copy()
    alive = weakref.ref(array)
    del buf, array
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(seen, expected)
    del seen
    gc.collect()
    assert alive() is None


def test_an_unconsumed_capsule_lets_the_memory_go(rng):
    array = random_array(rng, 100, np.uint8)
    alive = weakref.ref(array)
    buf = hetmem.register(array)
    capsule = buf.__dlpack__()
    assert "dltensor" in repr(capsule)
    del buf, array
    gc.collect()
    assert alive() is not None
    del capsule
    gc.collect()
    assert alive() is None


def test_dlpack_refuses_a_copy_and_foreign_byte_order(rng):
    with pytest.raises(BufferError, match="never copies"):
        hetmem.pinned(16).__dlpack__(copy=True)
    swapped = hetmem.register(random_array(rng, 64, np.int32).astype(">i4"))
    with pytest.raises(BufferError, match="native byte order"):
        np.from_dlpack(swapped)
    assert swapped.numpy().dtype == np.dtype(">i4")  # the array interface carries it


def test_views_reinterpret_the_same_memory(rng):
    array = random_array(rng, 64, np.uint8)
    buf = hetmem.register(array)
    as_words = buf.view(np.uint32, (4, 4))
    np.testing.assert_array_equal(as_words.numpy().reshape(-1), array.view(np.uint32))
    with pytest.raises(ValueError, match="needs"):
        buf.view(np.uint32, (5, 4))


def test_host_views_raise_while_lent(rng):
    array = random_array(rng, 1000, np.float32)
    buf = hetmem.register(array)
    alias = buf.view(np.uint8)
    lease = buf.lend()
    assert buf.lent and alias.lent
    for access in (buf.numpy, lambda: np.asarray(buf), lambda: np.from_dlpack(buf), alias.numpy):
        with pytest.raises(hetmem.LentError, match="lent to the GPU"):
            access()
    with pytest.raises(hetmem.LentError, match="already lent"):
        buf.lend()
    assert lease.reclaim() is buf
    assert not buf.lent
    np.testing.assert_array_equal(buf.numpy(), array)


def test_lend_as_a_context_manager_reclaims_on_exit(rng):
    buf = hetmem.register(random_array(rng, 256, np.int64))

    class Stream:
        synchronized = 0

        def synchronize(self):
            Stream.synchronized += 1

    with buf.lend(Stream()):
        with pytest.raises(hetmem.LentError):
            buf.numpy()
    assert Stream.synchronized == 1
    assert not buf.lent


def test_device_view_needs_mapped_memory():
    if hetmem.device().backend != "cpu":
        pytest.skip("the CPU backend's behaviour")
    with pytest.raises(hetmem.HetmemError, match="CPU backend"):
        hetmem.pinned(64).cuda()


def test_file_windows_read_and_write_the_file(rng, tmp_path):
    data = random_array(rng, 3 * 8192, np.uint8)
    path = tmp_path / "records.bin"
    data.tofile(path)
    mapped = hetmem.MappedFile(path)
    assert mapped.nbytes == data.size
    window = mapped.window(5000, (100, 10))
    assert window.readonly
    np.testing.assert_array_equal(window.numpy(), data[5000:6000].reshape(100, 10))
    assert not window.numpy().flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        window.__dlpack__()
    with pytest.raises(ValueError, match="read-only"):
        mapped.window(0, 16, writable=True)

    writable = hetmem.MappedFile(path, writable=True)
    fresh = random_array(rng, 4096, np.uint8)
    window = writable.window(8192, 4096, writable=True)
    window.numpy()[...] = fresh
    del window
    gc.collect()
    np.testing.assert_array_equal(np.fromfile(path, np.uint8)[8192:12288], fresh)


def test_a_window_past_the_end_is_a_clear_error(tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(bytes(range(200)))
    with pytest.raises(ValueError, match="small.bin|past|beyond|end"):
        hetmem.MappedFile(path).window(100, 200)


def test_ranges_of_the_first_axis_share_memory_and_the_lend_state(rng):
    array = random_array(rng, (10, 6), np.float32)
    buf = hetmem.register(array)
    middle = buf[3:7]
    assert middle.shape == (4, 6)
    assert np.shares_memory(middle.numpy(), array)
    np.testing.assert_array_equal(middle.numpy(), array[3:7])
    np.testing.assert_array_equal(np.from_dlpack(middle), array[3:7])
    np.testing.assert_array_equal(middle[1:2].numpy(), array[4:5])
    assert middle.host_ptr == buf.host_ptr + 3 * 6 * 4
    with middle.lend():
        with pytest.raises(hetmem.LentError):
            buf.numpy()
    with pytest.raises(ValueError, match="step"):
        buf[::2]
    with pytest.raises(TypeError, match="slice"):
        buf[3]


def test_buffers_made_anew_over_one_memory_share_its_lend_state(rng):
    array = random_array(rng, (8, 4), np.float32)
    buf = hetmem.register(array)
    # Not a view or a slice of buf: a Buffer of its own over the same memory.
    other = hetmem.Buffer(buf._memory, (32,), np.float32)
    np.testing.assert_array_equal(other.numpy(), array.reshape(-1))
    with buf.lend():
        assert other.lent
        with pytest.raises(hetmem.LentError):
            other.numpy()
        with pytest.raises(hetmem.LentError, match="already lent"):
            other.lend()
    assert not other.lent
    np.testing.assert_array_equal(other.numpy(), array.reshape(-1))


def test_the_pinned_pool_reuses_a_returned_buffer(rng):
    pool = hetmem.PinnedPool(64 << 20)
    first = pool.acquire((1000, 3), np.float32)
    fresh = random_array(rng, (1000, 3), np.float32)
    first.numpy()[...] = fresh
    address = first.host_ptr
    del first
    gc.collect()
    again = pool.acquire((1000, 3), np.float32)
    stats = pool.stats()
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert again.host_ptr == address
    np.testing.assert_array_equal(again.numpy(), fresh)  # what its last user left
    del again
    gc.collect()
    pool.trim()
    assert pool.stats()["bytes_pinned"] == 0
    with pytest.raises(hetmem.HetmemError, match="budget|exhaust"):
        pool.acquire(128 << 20)


class DlpackOnly:
    """A producer that speaks DLPack alone (no array interface), as a PyTorch tensor does to
    hetmem: its capsule comes from `make_capsule`, its memory from `array`."""

    def __init__(self, array, make_capsule=None, device=(1, 0)):
        self.array = array
        self._make_capsule = make_capsule or (lambda **kwargs: array.__dlpack__(**kwargs))
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._make_capsule(**kwargs)

    def __dlpack_device__(self):
        return self._device


def test_register_refuses_dlpack_producers_it_cannot_pin(rng):
    # A capsule says nothing of what keeps its memory in place: only NumPy's and PyTorch's are
    # taken, from those types' own methods, hetmem's own memory included.
    array = random_array(rng, (20, 30), np.float32)
    with pytest.raises(TypeError, match="a DlpackOnly is not an array in memory"):
        hetmem.register(DlpackOnly(array))
    memory = hetmem.pinned(4096)._memory
    with pytest.raises(TypeError, match="not an array in memory"):
        hetmem.register(DlpackOnly(None, lambda **_: hetmem._native.capsule(memory, 0, [12, 34], 4, 16)))


@numpy_dlpack_1
def test_the_native_registration_refuses_what_it_cannot_pin(rng):
    array = random_array(rng, (20, 30), np.float32)
    device = hetmem.device()
    memory, info = hetmem._native.register(device, array)
    assert (info.code, info.bits, info.shape) == (2, 32, [20, 30]) and memory.host_ptr == array.ctypes.data
    with pytest.raises(ValueError, match="not C-contiguous"):
        hetmem._native.register(device, array[:, ::2])
    readonly = array.copy()
    readonly.flags.writeable = False  # NumPy flags it read-only in a versioned capsule
    with pytest.raises(ValueError, match="read-only"):
        hetmem._native.register(device, readonly)


@pytest.mark.parametrize("dtype", [
    np.dtype([("a", "<i4"), ("b", "<f4")]),
    np.dtype([("x", "<u2", (3,)), ("y", ">f8")]),
    np.dtype({"names": ["a"], "formats": ["<i4"], "offsets": [4], "itemsize": 12}),
])
def test_structured_dtypes_reach_numpy_as_themselves(rng, dtype):
    # Once: NumPy saw them as opaque |V elements.
    buf = hetmem.pinned(4 * dtype.itemsize).view(dtype)
    view = buf.numpy()
    assert view.shape == (4,) and view.dtype == dtype
    # The array interface spells padding as fields of its own: the same layout.
    seen = np.asarray(buf).dtype
    assert seen.itemsize == dtype.itemsize
    assert all(seen.fields[name][1] == offset for name, (_, offset) in dtype.fields.items())
    name = dtype.names[0]
    fresh = random_array(rng, view[name].shape, view[name].dtype)
    view[name] = fresh
    np.testing.assert_array_equal(buf.numpy()[name], fresh)
    raw = buf.view(np.uint8).numpy().reshape(4, dtype.itemsize)
    offset = dtype.fields[name][1]
    np.testing.assert_array_equal(raw[:, offset:offset + fresh[0].nbytes].copy().view(fresh.dtype).reshape(fresh.shape),
                                  fresh)


def test_a_subarray_dtype_reaches_numpy_as_numpy_shows_it(rng):
    buf = hetmem.pinned(24).view(np.dtype(("f4", (2,))))
    assert buf.shape == (3,)
    view = buf.numpy()
    assert view.shape == (3, 2) and view.dtype == np.float32
    fresh = random_array(rng, (3, 2), np.float32)
    view[...] = fresh
    np.testing.assert_array_equal(buf.view(np.float32).numpy(), fresh.reshape(-1))


def test_a_dtype_the_array_interface_cannot_describe_is_refused_with_the_remedy():
    overlapping = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [0, 0], "itemsize": 4})
    with pytest.raises(ValueError, match="overlapping or out-of-order fields"):
        hetmem.pinned(8).view(overlapping)


def test_register_a_torch_bfloat16_cpu_tensor(rng):
    torch = pytest.importorskip("torch")
    bits = random_array(rng, (16, 40), np.int16)
    # In shared memory, as registration needs (share_memory_ copies the NumPy array there).
    values = torch.from_numpy(bits).view(torch.bfloat16).share_memory_()
    expected = values.clone()
    buf = hetmem.register(values)
    assert buf.dtype == hetmem.bfloat16 and buf.host_ptr == values.data_ptr()
    seen = torch.from_dlpack(buf)
    assert seen.dtype == torch.bfloat16 and seen.data_ptr() == values.data_ptr()
    assert torch.equal(seen, expected)
    np.testing.assert_array_equal(buf.numpy(), bits.view(np.uint16))


def page_aligned_part(rng, pages):
    """A fresh array of random bytes with a page boundary at index `start`, `pages` pages after it."""
    page = hetmem.page_size
    backing = random_array(rng, (pages + 1) * page, np.uint8)
    start = -backing.ctypes.data % page
    return backing, start


def test_arrays_on_one_page_share_its_registration(rng):
    backing, start = page_aligned_part(rng, 2)
    first_array, second_array = backing[start:start + 100], backing[start + 200:start + 300]
    first = hetmem.register(first_array)
    second = hetmem.register(second_array)  # the same page: shares the first's registration
    np.testing.assert_array_equal(second.numpy(), backing[start + 200:start + 300])
    assert np.shares_memory(second.numpy(), second_array)
    if first.is_mapped:
        assert second.device_ptr - first.device_ptr == 200
    across = backing[start + 50:start + hetmem.page_size + 10]  # page 0, where both lie, and page 1
    del first
    gc.collect()
    # The second keeps the page registered: an array overlapping it in part is still refused.
    with pytest.raises(hetmem.HetmemError, match="overlap a live registration"):
        hetmem.register(across)
    fresh = random_array(rng, 100, np.uint8)
    second.numpy()[...] = fresh
    np.testing.assert_array_equal(backing[start + 200:start + 300], fresh)
    del second
    gc.collect()
    np.testing.assert_array_equal(hetmem.register(across).numpy(), backing[start + 50:start + hetmem.page_size + 10])


def test_an_array_overlapping_a_registration_in_part_is_refused_with_the_remedy(rng):
    page = hetmem.page_size
    backing, start = page_aligned_part(rng, 3)
    first = hetmem.register(backing[start + 100:start + page + 10])  # pages 0 and 1
    with pytest.raises(hetmem.HetmemError, match="overlap a live registration.*register one array holding both"):
        hetmem.register(backing[start + page + 500:start + 2 * page + 50])  # pages 1 and 2
    with pytest.raises(hetmem.HetmemError, match="mapped=False.*same options"):
        unmapped = hetmem.register(backing[start + 2 * page + 8:start + 2 * page + 64], mapped=False)
        hetmem.register(backing[start + 2 * page + 100:start + 2 * page + 200])
    del first, unmapped
    gc.collect()
    later = hetmem.register(backing[start + page + 500:start + 2 * page + 50])  # free again
    np.testing.assert_array_equal(later.numpy(), backing[start + page + 500:start + 2 * page + 50])


@numpy_dlpack_1
def test_dlpack_versioned_when_the_consumer_asks(rng):
    array = random_array(rng, (6, 7), np.int16)
    buf = hetmem.register(array)
    assert "dltensor_versioned" in repr(buf.__dlpack__(max_version=(1, 0)))
    assert "dltensor_versioned" not in repr(buf.__dlpack__(max_version=(0, 8)))
    assert "dltensor_versioned" not in repr(buf.__dlpack__())
    # NumPy >= 2.1 asks for DLPack 1.x; it also takes the old kind from an older producer.
    versioned = np.from_dlpack(buf)
    unversioned = np.from_dlpack(DlpackOnly(array, lambda **_: buf.__dlpack__()))
    for seen in (versioned, unversioned):
        assert np.shares_memory(seen, array)
        np.testing.assert_array_equal(seen, array)


@numpy_dlpack_1
def test_a_read_only_window_reaches_numpy_read_only_through_versioned_dlpack(rng, tmp_path):
    data = random_array(rng, 3 * 4096, np.uint8)
    path = tmp_path / "records.bin"
    data.tofile(path)
    window = hetmem.MappedFile(path).window(4096, (64, 64))
    seen = np.from_dlpack(window)
    assert not seen.flags.writeable
    np.testing.assert_array_equal(seen, data[4096:8192].reshape(64, 64))
    info = hetmem._native.tensor_info(window.__dlpack__(max_version=(1, 0)))
    assert info.readonly
    with pytest.raises(BufferError, match="no read-only flag"):
        window.__dlpack__()


def test_streams_need_a_gpu():
    if hetmem.device().backend != "cpu":
        pytest.skip("the CPU backend's behaviour")
    with pytest.raises(hetmem.HetmemError, match="CPU backend.*need a GPU"):
        hetmem.stream()


def test_a_shallow_copy_of_a_buffer_shares_its_memory_and_lend_state(rng):
    buf = hetmem.pinned((16,), np.int32)
    twin = copy.copy(buf)
    assert twin.host_ptr == buf.host_ptr and twin.shape == buf.shape and twin.dtype == buf.dtype
    fresh = random_array(rng, 16, np.int32)
    twin.numpy()[...] = fresh
    np.testing.assert_array_equal(buf.numpy(), fresh)
    with buf.lend():
        with pytest.raises(hetmem.LentError):
            twin.numpy()
