"""The native module's doors, each tried with what once crashed the interpreter: integers that
wrap, negative offsets, raw addresses, ranges outside the memory, and memory resized under a
registration. Each former crash runs in a child interpreter, which must end with a Python
exception naming the cause (a segfault there fails the test here, not the suite)."""

import gc
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hetmem
from hetmem import _native


def raises_in_child(code, exception, match):
    """Runs `code` in a fresh interpreter; it must end with an uncaught `exception` whose
    message matches `match` (not with a signal, and not cleanly)."""
    source = "import numpy as np, hetmem\nfrom hetmem import _native\n" + textwrap.dedent(code)
    child = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert child.returncode == 1, f"rc {child.returncode} (a negative rc is a signal); stderr:\n{child.stderr}"
    raised = [line for line in child.stderr.splitlines() if line.startswith(f"{exception}: ")]
    assert raised, child.stderr
    assert re.search(match, raised[-1]), child.stderr


# -- the data loader's native pre-processing ---------------------------------------------------

def test_a_crop_whose_size_wraps_is_refused_not_written():
    # 2^32 x 2^32 crop elements wrap to 0 bytes in 64 bits: the output check once passed, and
    # the loop wrote 2^64 floats into 4 KiB. The record (2^32 + 1) x (2^64 - 2^32 + 1) x 1
    # wraps to 1 byte, so the records memory "holds" 4096 of them.
    raises_in_child("""
        records, out = hetmem.pinned(4096), hetmem.pinned(4096)
        _native.prepare_batch(records._memory, (2**32 + 1, 2**64 - 2**32 + 1, 1), [0], [(0, 0)], [False],
                              (2**32, 2**32), [1.0], [0.0], out._memory, "float32")
    """, "ValueError", r"batch record shape: the byte count overflows")


def test_batch_arithmetic_that_would_wrap_is_refused_everywhere():
    records = hetmem.pinned((2, 4, 4, 1), np.uint8)
    out = hetmem.pinned(4096)

    def prepare(record_shape=(4, 4, 1), indices=(0,), origins=((0, 0),), crop=(2, 2), channels=1):
        _native.prepare_batch(records._memory, record_shape, list(indices), list(origins), [False] * len(indices),
                              crop, [1.0] * channels, [0.0] * channels, out._memory, "float32")

    prepare()  # fits
    with pytest.raises(ValueError, match=r"batch origins\[0\] top: -1 is negative"):
        prepare(origins=((-1, 0),))
    with pytest.raises(ValueError, match=r"batch crop top \+ height: .* overflows"):
        prepare(origins=((2**64 - 1, 0),))
    with pytest.raises(ValueError, match=r"batch indices\[0\]: -5 is negative"):
        prepare(indices=(-5,))
    with pytest.raises(ValueError, match="larger than this machine can address"):
        prepare(indices=(2**64,))
    with pytest.raises(ValueError, match="batch record channels: -1 is negative"):
        prepare(record_shape=(4, 4, -1))
    with pytest.raises(ValueError, match="batch record shape: the byte count overflows"):
        prepare(record_shape=(2**62, 2**62, 1), crop=(1, 1))


def test_the_staged_gather_copies_the_chosen_records_and_checks_every_integer():
    rng = np.random.default_rng()
    records = hetmem.pinned((16, 4, 4, 3), np.uint8)
    records.numpy()[...] = rng.integers(0, 256, records.shape, dtype=np.uint8)
    out = hetmem.pinned((5, 4, 4, 3), np.uint8)
    out.numpy()[...] = 0xA5  # poisoned: a record the gather failed to copy shows
    chosen = rng.choice(16, 5, replace=False)
    _native.gather_records(records._memory, 48, chosen.tolist(), out._memory)
    np.testing.assert_array_equal(out.numpy(), records.numpy()[chosen])

    def gather(record_bytes=48, indices=(0,), target=out):
        _native.gather_records(records._memory, record_bytes, list(indices), target._memory)

    with pytest.raises(ValueError, match=r"gather: record 16 of 16"):
        gather(indices=(16,))
    with pytest.raises(ValueError, match=r"gather indices\[1\]: -1 is negative"):
        gather(indices=(0, -1))
    with pytest.raises(ValueError, match="gather: record_bytes is 0"):
        gather(record_bytes=0)
    with pytest.raises(ValueError, match="gather record_bytes: -48 is negative"):
        gather(record_bytes=-48)
    # 2^63 records of 2 bytes would wrap to 0 bytes of output in 64 bits; the count (one record
    # of 768 bytes fits) is checked first, then the product.
    with pytest.raises(ValueError, match="6 writable bytes are needed|overflows"):
        _native.gather_records(records._memory, 2, [0, 1, 2], hetmem.pinned(4)._memory)
    with pytest.raises(ValueError, match="overlaps the records"):
        gather(target=records)


# -- buffers and the views made from them -------------------------------------------------------

def test_a_negative_buffer_offset_is_refused_before_any_view():
    raises_in_child("""
        mem = hetmem.pinned(4096)._memory
        hetmem.Buffer(mem, (16,), np.uint8, offset=-(1 << 40)).numpy()[0] = 1
    """, "ValueError", r"offset -1099511627776: a buffer starts at byte 0")


def test_the_native_views_check_the_range_whatever_python_says():
    # The Python checks bypassed: the view is made in Rust, which checks again.
    raises_in_child("""
        _native.View(hetmem.pinned(4096)._memory, (16,), np.uint8, -(1 << 40))
    """, "ValueError", r"view offset: -1099511627776 is negative")
    memory = hetmem.pinned(4096)._memory
    with pytest.raises(ValueError, match="needs 4097 bytes from byte 0; the memory holds 4096"):
        _native.View(memory, [4097], "|u1")
    with pytest.raises(ValueError, match="needs 8 bytes from byte 4089"):
        _native.View(memory, [1], "<f8", 4089)
    with pytest.raises(ValueError, match="view: the byte count overflows"):
        _native.View(memory, [2**32, 2**32], "|u1")
    with pytest.raises(ValueError, match="view shape\\[1\\]: -1 is negative"):
        _native.View(memory, [4, -1], "|u1")
    with pytest.raises(ValueError, match="holds Python objects"):
        _native.View(memory, [1], object)
    # A subarray dtype's elements are counted too: 1024 x 2 float32 need 8192 bytes.
    with pytest.raises(ValueError, match="needs 8192 bytes from byte 0"):
        _native.View(memory, [1024], np.dtype(("f4", (2,))))


def test_a_buffer_is_fixed_to_its_memory_once_made():
    # Once: NumPy keeps the Buffer as its array's base, and the Buffer held its memory in a
    # plain attribute: rebinding it (or calling __init__ again) freed the memory under the array.
    raises_in_child("""
        buf = hetmem.pinned(1 << 24)
        arr = np.asarray(buf)
        buf._memory = hetmem.pinned(1)._memory
        print(arr[0])
    """, "AttributeError", r"'_memory' of 'hetmem._native.View' objects is not writable")
    raises_in_child("""
        buf = hetmem.pinned(1 << 24)
        arr = buf.numpy()
        buf.__init__(hetmem.pinned(1)._memory, (1,), np.uint8)
        print(arr[0])
    """, "TypeError", r"a Buffer is made once")
    buf = hetmem.pinned((64,), np.uint32)
    arr = np.asarray(buf)
    assert arr.base is buf
    for name, value in [("_offset", -(1 << 40)), ("_shape", (4097,)), ("_dtype", np.dtype(object))]:
        with pytest.raises(AttributeError, match="not writable"):
            setattr(buf, name, value)
    buf.__dict__["_memory"] = hetmem.pinned(1)._memory  # an instance attribute the views never read
    arr[...] = np.arange(64, dtype=np.uint32)
    del buf
    gc.collect()
    np.testing.assert_array_equal(arr, np.arange(64, dtype=np.uint32))  # the array's base holds the memory
    # The device view, which CuPy keeps as its array's owner, is fixed the same way.
    view = hetmem.DeviceView(hetmem.pinned(64))
    with pytest.raises(AttributeError, match="not writable"):
        view._memory = hetmem.pinned(1)._memory
    with pytest.raises(TypeError, match="made once"):
        view.__init__(hetmem.pinned(64))


def test_buffer_arguments_are_checked_with_the_cause():
    memory = hetmem.pinned(4096)._memory
    with pytest.raises(ValueError, match="extents must be >= 0"):
        hetmem.Buffer(memory, (-1,), np.uint8)
    with pytest.raises(ValueError, match="needs 4097 bytes from byte 0"):
        hetmem.Buffer(memory, (4097,), np.uint8)
    with pytest.raises(ValueError, match="needs 8 bytes from byte 4089"):
        hetmem.Buffer(memory, (1,), np.float64, offset=4089)
    with pytest.raises(ValueError, match="holds Python objects"):
        hetmem.Buffer(memory, (1,), object)
    with pytest.raises(TypeError, match="a view of hetmem memory"):
        hetmem.Buffer(np.zeros(16, np.uint8), (16,), np.uint8)
    with pytest.raises(TypeError):
        hetmem.Buffer(memory, (1.5,), np.uint8)


# -- no raw addresses ---------------------------------------------------------------------------

def test_register_takes_no_address():
    # Once: _native.register(device, owner, address, nbytes) made any integer a writable view.
    raises_in_child("""
        owner = np.zeros(16, np.uint8)
        memory = _native.register(hetmem.device(), owner, 8, 4096)
        hetmem.Buffer(memory, (4096,), np.uint8).numpy()[:] = 1
    """, "TypeError", r"not an instance of 'bool'")
    with pytest.raises(TypeError, match="not an array in memory that NumPy views in place"):
        _native.register(hetmem.device(), object())
    with pytest.raises(TypeError, match="not an array in memory that NumPy views in place"):
        _native.register(hetmem.device(), 8)


def test_capsule_takes_memory_not_an_address():
    # Once: _native.capsule(owner, address, ...) made any integer a writable DLPack tensor.
    raises_in_child("""
        capsule = _native.capsule(None, 8, 1, 0, [4096], [1], 1, 8, versioned=True)
    """, "TypeError", r"positional arguments")
    raises_in_child("""
        owner = np.zeros(16, np.uint8)
        capsule = _native.capsule(owner, 8, [4096], 1, 8, versioned=True)
    """, "TypeError", r"Memory")
    memory = hetmem.pinned(4096)._memory
    with pytest.raises(ValueError, match="view offset: -8 is negative"):
        _native.capsule(memory, -8, [16], 1, 8)
    with pytest.raises(ValueError, match="needs 8192 bytes from byte 0; the memory holds 4096"):
        _native.capsule(memory, 0, [1024, 2], 2, 32)
    with pytest.raises(ValueError, match="the byte count overflows"):
        _native.capsule(memory, 0, [2**40, 2**40], 1, 8)
    with pytest.raises(ValueError, match="12-bit elements"):
        _native.capsule(memory, 0, [16], 1, 12)
    with pytest.raises(ValueError, match="type code 3"):
        _native.capsule(memory, 0, [16], 3, 8)
    with pytest.raises(ValueError, match="device views only"):
        _native.capsule(memory, 0, [16], 1, 8, unflagged_readonly=True)
    # What it makes describes exactly the range asked for.
    info = _native.tensor_info(_native.capsule(memory, 64, [3, 5], 2, 32))
    assert info.address == memory.host_ptr + 64 and info.shape == [3, 5] and info.strides == [5, 1]


def test_an_unflagged_read_only_device_capsule_needs_a_window_opened_for_it(tmp_path):
    # Once: any caller could export any read-only window as a writable-looking CUDA tensor,
    # whose GPU write faults and loses the CUDA context.
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(range(256)) * 32)
    mapped = hetmem.MappedFile(path)
    window = mapped.window(0, 4096)
    with pytest.raises(BufferError, match="not opened for it.*max_version=\\(1, 0\\)"):
        _native.capsule(window._memory, 0, [4096], 1, 8, cuda=True, unflagged_readonly=True)
    opened = mapped._window(0, 4096, np.uint8, False, True)  # what the data loader opens
    assert opened.readonly and not opened.numpy().flags.writeable
    if hetmem.device().backend == "cpu":
        with pytest.raises(hetmem.HetmemError, match="not mapped"):
            _native.capsule(opened._memory, 0, [4096], 1, 8, cuda=True, unflagged_readonly=True)
    else:
        info = _native.tensor_info(_native.capsule(opened._memory, 0, [4096], 1, 8, cuda=True,
                                                   unflagged_readonly=True))
        assert info.address == opened.device_ptr and not info.readonly
    with pytest.raises(ValueError, match="device views only"):
        _native.capsule(opened._memory, 0, [16], 1, 8, unflagged_readonly=True)


def test_a_device_capsule_needs_mapped_memory():
    if hetmem.device().backend != "cpu":
        pytest.skip("the CPU backend's behaviour")
    memory = hetmem.pinned(4096)._memory
    with pytest.raises(hetmem.HetmemError, match="not mapped"):
        _native.capsule(memory, 0, [16], 1, 8, cuda=True)
    with pytest.raises(hetmem.HetmemError, match="not mapped"):
        _native.View(memory, [16], "|u1")._device_interface()


def test_sizes_given_to_the_allocators_are_checked(tmp_path):
    device = hetmem.device()
    with pytest.raises(ValueError, match="pinned nbytes: -1 is negative"):
        _native.pinned(device, -1)
    with pytest.raises(ValueError, match="pool budget_bytes: -1 is negative"):
        _native.PinnedPool(device, -1)
    with pytest.raises(ValueError, match="pool acquire nbytes: -4096 is negative"):
        _native.PinnedPool(device, 1 << 20).acquire(-4096)
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(8192))
    windowed = _native.WindowedFile(device, str(path))
    with pytest.raises(ValueError, match="file window offset: -4096 is negative"):
        windowed.window(-4096, 4096)
    with pytest.raises(ValueError, match="file window: offset \\+ nbytes overflows"):
        windowed.window(2**64 - 1, 2)


# -- memory that moves under a registration -------------------------------------------------------

def test_a_registered_numpy_array_cannot_be_resized_even_without_refcheck(rng):
    array = rng.integers(0, 255, size=4096, dtype=np.uint8)
    buf = hetmem.register(array)
    with pytest.raises(ValueError, match="cannot resize"):
        array.resize(1 << 20)
    # refcheck=False once reallocated it under the registration and every view.
    with pytest.raises(ValueError, match="cannot resize"):
        array.resize(1 << 20, refcheck=False)
    view = array[100:200]
    part = hetmem.register(view)  # a view: its base, which owns the memory, is pinned too
    del buf
    gc.collect()
    with pytest.raises(ValueError, match="cannot resize"):
        array.resize(1 << 20, refcheck=False)
    np.testing.assert_array_equal(part.numpy(), view)
    del part, view
    gc.collect()
    array.resize(1 << 20, refcheck=False)  # free again once the buffers are gone
    assert array.size == 1 << 20


def test_a_registered_bytearray_cannot_be_resized():
    data = bytearray(range(256)) * 20
    buf = hetmem.register(data)
    with pytest.raises(BufferError):
        data.extend(bytes(1 << 20))
    del buf
    gc.collect()
    data.extend(bytes(16))
    assert len(data) == 256 * 20 + 16


class LookalikeTensor:
    """What PyTorch's tensors once looked like to registration: DLPack, and a storage that says
    it cannot be resized. Neither says what keeps the memory in place."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)

    def untyped_storage(self):
        class Storage:
            def resizable(self):
                return False

        return Storage()


def test_only_numpy_and_torch_capsules_are_taken(rng):
    array = rng.standard_normal(512).astype(np.float32)
    with pytest.raises(TypeError, match="not an array in memory.*PyTorch CPU tensor"):
        hetmem.register(LookalikeTensor(array))


def test_a_capsule_handed_out_twice_cannot_free_the_registration():
    # Once: registration kept the producer's capsule unconsumed, and another consumer took the
    # same capsule and, through its deleter, freed the registered memory.
    raises_in_child("""
        import gc
        a = np.full(1 << 20, 7, np.uint8)
        cap = a.__dlpack__()
        del a
        class Liar:
            def __dlpack__(self, **kw):
                return cap
            def __dlpack_device__(self):
                return (1, 0)
        buf = hetmem.register(Liar())
        taken = np.from_dlpack(Liar())
        del taken
        gc.collect()
        buf.numpy()[:] = 0x55
    """, "TypeError", r"a Liar is not an array in memory")


def test_another_arrays_capsule_is_not_taken():
    # Once: __dlpack__ answered with another array's capsule, whose array was resized (freed)
    # under the registration.
    raises_in_child("""
        a = np.full(1 << 16, 7, np.uint8)
        class Liar:
            def __dlpack__(self, **kw):
                return a.__dlpack__(**kw)
            def __dlpack_device__(self):
                return (1, 0)
        view = hetmem.register(Liar()).numpy()
        a.resize(1 << 26, refcheck=False)
        view[:] = 0x55
    """, "TypeError", r"a Liar is not an array in memory")


class LyingBase(np.ndarray):
    @property
    def base(self):
        return None


class LoopingBase(np.ndarray):
    @property
    def base(self):
        return self


def test_the_array_owning_the_memory_is_found_whatever_base_says():
    # Once: the walk read `base` as the subclass defined it, and left the owner resizable.
    owner = np.full(1 << 16, 7, np.uint8)
    memory, _ = _native.register(hetmem.device(), owner.view(LyingBase))
    with pytest.raises(ValueError, match="cannot resize"):
        owner.resize(1 << 26, refcheck=False)
    assert (hetmem.Buffer(memory, (1 << 16,), np.uint8).numpy() == 7).all()
    # Once: a `base` returning the array itself made the walk run forever.
    child = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import numpy as np, hetmem
        class LoopingBase(np.ndarray):
            @property
            def base(self):
                return self
        looping = LoopingBase((1 << 12,), np.uint8)
        buf = hetmem.register(looping)
        try:
            looping.resize(1 << 20, refcheck=False)
        except ValueError as error:
            print("refused:", error)
    """)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0 and "refused: cannot resize" in child.stdout, child.stderr


def test_memory_reached_through_a_memoryview_is_pinned_where_it_lives():
    # Once: the walk stopped at the memoryview and left the array under it resizable.
    owner = np.full(1 << 16, 7, np.uint8)
    buf = hetmem.register(np.frombuffer(memoryview(owner), np.uint8))
    with pytest.raises(ValueError, match="cannot resize"):
        owner.resize(1 << 26, refcheck=False)
    del buf
    gc.collect()
    owner.resize(1 << 17, refcheck=False)  # free again once the buffer is gone
    # A bytearray stays locked by the registration's own export, whatever becomes of the
    # memoryview it was registered through. (1 MiB: pages of its own, none shared with the
    # test's other arrays, which a registration would refuse to overlap in part.)
    data = bytearray(1 << 20)
    view = memoryview(data)
    from_view = hetmem.register(view)
    view.release()
    with pytest.raises(BufferError):
        data.extend(bytes(1 << 20))
    from_view.numpy()[:4] = 1
    assert data[:4] == b"\x01\x01\x01\x01"
    del from_view
    gc.collect()
    data.extend(bytes(16))
    assert len(data) == (1 << 20) + 16


def test_an_mmap_cannot_close_under_its_registration():
    import mmap

    mapped = mmap.mmap(-1, 1 << 16)
    buf = hetmem.register(np.frombuffer(mapped, np.uint8))
    with pytest.raises(BufferError):
        mapped.close()
    buf.numpy()[:3] = 9
    assert mapped[:3] == b"\x09\x09\x09"
    del buf
    gc.collect()
    mapped.close()


def test_memory_no_owner_can_pin_is_refused_with_the_remedy():
    with pytest.raises(ValueError, match="belongs to a bytes.*hetmem.pinned"):
        array = np.frombuffer(b"\x00" * 4096, np.uint8)
        _native.register(hetmem.device(), array)
    with pytest.raises(ValueError, match="hetmem's already"):
        _native.register(hetmem.device(), hetmem.pinned(4096).numpy())
    with pytest.raises(ValueError, match="Python objects"):
        _native.register(hetmem.device(), np.empty(8, object))


def test_torch_tensors_are_taken_only_where_their_memory_cannot_move(rng):
    torch = pytest.importorskip("torch")
    # Once: the registration stayed on the old storage, freed by resize_.
    raises_in_child("""
        import torch
        t = torch.zeros(1024)
        hetmem.register(t)
    """, "ValueError", "storage is resizable")
    # A tensor over a NumPy array: the array, which t.share_memory_() would let go, cannot be
    # found to pin.
    array = rng.standard_normal(1024).astype(np.float32)
    with pytest.raises(ValueError, match="torch.from_numpy.*torch.from_dlpack"):
        hetmem.register(torch.from_numpy(array))

    class Sub(torch.Tensor):
        pass

    with pytest.raises(ValueError, match="subclass of torch.Tensor"):
        hetmem.register(torch.from_numpy(array).as_subclass(Sub))
    # In shared memory already and not resizable: share_memory_() does nothing, resize_ is refused.
    shared = torch.from_numpy(array.copy()).share_memory_()
    assert shared.is_shared() and not shared.untyped_storage().resizable()
    buf = hetmem.register(shared)
    assert buf.host_ptr == shared.data_ptr()
    with pytest.raises(RuntimeError, match="not resizable"):
        shared.resize_(1 << 20)
    shared.share_memory_()
    assert buf.host_ptr == shared.data_ptr()
    np.testing.assert_array_equal(buf.numpy(), array)


# -- integers past 128 bits ----------------------------------------------------------------------

def test_an_int_past_128_bits_is_a_value_error_naming_the_argument():
    device = hetmem.device()
    with pytest.raises(ValueError, match="pinned nbytes: an int past 128 bits is larger than this machine"):
        _native.pinned(device, 2**127)
    with pytest.raises(ValueError, match="pinned nbytes: a negative int past 128 bits"):
        _native.pinned(device, -(2**200))
    memory = hetmem.pinned(64)._memory
    with pytest.raises(ValueError, match="view offset: an int past 128 bits"):
        _native.View(memory, [1], np.uint8, 2**127)
    with pytest.raises(ValueError, match=r"view shape\[0\]: an int past 128 bits"):
        _native.View(memory, [2**300], np.uint8)
    with pytest.raises(ValueError, match="type code an int past 128 bits is not one of DLPack's"):
        _native.capsule(memory, 0, [1], 2**128, 8)
    with pytest.raises(ValueError, match="pool acquire nbytes: an int past 128 bits"):
        _native.PinnedPool(device, 1 << 20).acquire(2**127)


def test_open_cuda_where_cuda_cannot_run_says_why_not_that_no_device_exists():
    reason = hetmem.device().fallback_reason
    if hetmem.cuda_devices() or reason is None or "HETMEM_BACKEND" in reason:
        pytest.skip("CUDA runs here (or is only switched off): this is the no-CUDA path")
    with pytest.raises(hetmem.HetmemError) as raised:
        hetmem._native.Device.open_cuda(0)
    message = str(raised.value)
    assert "cannot run" in message and "does not exist" not in message, message
