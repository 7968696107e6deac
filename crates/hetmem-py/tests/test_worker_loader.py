"""hetmem.loader.WorkerLoader: a map-style dataset in spawned workers, samples written straight
into the shared, registered slots, batches in sampler order.

Every sample is fresh random data made from (seed, index), so a batch is compared exactly with
what the dataset gives for its indices. On a GPU (HETMEM_REQUIRE_GPU=1 on the H200 machine)
the batches are CUDA tensors and are compared with the same data on the host; without one
the CPU backend runs (NumPy output, so no PyTorch is needed).
"""

import faulthandler
import os
import platform
import signal
import time

import numpy as np
import pytest

import hetmem
from hetmem.loader import WorkerError, WorkerLoader, WorkerTimeout

SHAPE = (6, 5, 3)
DTYPE = np.float32
ON_GPU = hetmem.device().backend == "cuda"
if os.environ.get("HETMEM_REQUIRE_GPU") == "1" and not ON_GPU:
    raise RuntimeError(f"HETMEM_REQUIRE_GPU=1 but hetmem runs on the CPU backend: {hetmem.device().fallback_reason}")


@pytest.fixture(autouse=True)
def hang_guard():
    """A hang fails the run with every thread's traceback instead of blocking CI."""
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def sample(seed, index):
    """Dataset item ``index``: random, never zeros, different for every index."""
    rng = np.random.default_rng([seed, index])
    return (rng.standard_normal(SHAPE) + 10.0).astype(DTYPE), int(rng.integers(-(2**40), 2**40))


# -- the datasets (module level: pickled to spawned workers) -----------------------------------


class Random:
    def __init__(self, seed, length, labels=False):
        self.seed, self.length, self.labels = seed, length, labels

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        image, label = sample(self.seed, index)
        return (image, label) if self.labels else image


class BadAt(Random):
    """Item ``bad`` is wrong in the way ``how`` says."""

    def __init__(self, seed, length, bad, how):
        super().__init__(seed, length)
        self.bad, self.how = bad, how

    def __getitem__(self, index):
        image = super().__getitem__(index)
        if index != self.bad:
            return image
        if self.how == "shape":
            return image[:, :4]
        if self.how == "dtype":
            return image.astype(np.float64)
        if self.how == "raise":
            raise KeyError(f"no such image {index} in the archive")
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "hang":
            time.sleep(600)
        raise AssertionError(self.how)


class Allocates(Random):
    """Makes and fills two 1 MiB scratch buffers for each item, as a decoder does (PIL: the
    decoded image, then its conversion): freed together, they leave 2 MiB free at the top of
    the heap, which glibc's own thresholds hand back to the kernel each time."""

    def __getitem__(self, index):
        decoded = np.empty(1 << 20, np.uint8)
        decoded.fill(index % 251 + 1)
        converted = np.empty(1 << 20, np.uint8)
        converted.fill(index % 241 + 1)
        del decoded, converted
        return super().__getitem__(index)


def minor_faults(pid):
    with open(f"/proc/{pid}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[7])


def loader_for(dataset, batch_size, **options):
    options.setdefault("workers", 3)
    options.setdefault("output", "torch" if ON_GPU else "numpy")
    return WorkerLoader(dataset, batch_size, sample_shape=SHAPE, sample_dtype=DTYPE, **options)


def host(array):
    """A batch as NumPy (a CUDA tensor copied back)."""
    if isinstance(array, np.ndarray):
        return array
    return array.cpu().numpy()


def expected(seed, indices):
    items = [sample(seed, int(i)) for i in indices]
    return np.stack([image for image, _ in items]), np.array([label for _, label in items], np.int64)


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("length,batch_size,drop_last", [(103, 8, False), (103, 8, True), (96, 8, False)])
def test_batches_in_order_none_lost_or_repeated(rng, length, batch_size, drop_last):
    seed = int(rng.integers(2**32))
    before = shm_names()
    with loader_for(Random(seed, length, labels=True), batch_size, labels=True, drop_last=drop_last) as loader:
        assert len(loader) == (length // batch_size if drop_last else -(-length // batch_size))
        seen = []
        for number, (images, labels) in enumerate(loader):
            chosen = np.arange(length)[number * batch_size: (number + 1) * batch_size]
            want_images, want_labels = expected(seed, chosen)
            if ON_GPU:
                assert images.is_cuda and labels.is_cuda
            np.testing.assert_array_equal(host(images), want_images)
            np.testing.assert_array_equal(host(labels), want_labels)
            seen.extend(chosen.tolist())
        assert number + 1 == len(loader)
        kept = (length // batch_size) * batch_size if drop_last else length
        assert seen == list(range(kept))
        stats = loader.stats()
        assert stats["samples"] == kept and stats["batches"] == len(loader)
        sample_bytes = int(np.prod(SHAPE)) * np.dtype(DTYPE).itemsize
        assert stats["worker_bytes"] == kept * sample_bytes
        # One host write per sample by its worker; the CPU backend copies each batch out once more.
        assert stats["host_bytes_per_sample"] == sample_bytes * (1 if ON_GPU else 2)
        assert shm_names() == before, "the slots are sealed memfds: nothing named in /dev/shm"
    assert shm_names() == before


def test_shuffle_follows_seed_and_epoch_every_index_once(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 77, 10
    loader_seed = int(rng.integers(2**31))
    with loader_for(Random(seed, length), batch_size, shuffle=True, seed=loader_seed, workers=2) as loader:
        orders = []
        for epoch in range(3):
            order = loader.order()
            assert sorted(order.tolist()) == list(range(length))
            got = np.concatenate([host(images) for images in loader])
            np.testing.assert_array_equal(got, expected(seed, order)[0])
            orders.append(order.tolist())
        assert len({tuple(order) for order in orders}) == 3, "each epoch is shuffled anew"
        assert orders[0] != list(range(length))
        loader.set_epoch(1)
        np.testing.assert_array_equal(np.concatenate([host(images) for images in loader]),
                                      expected(seed, orders[1])[0])
    with loader_for(Random(seed, length), batch_size, shuffle=True, seed=loader_seed, workers=1) as again:
        assert again.order(2).tolist() == orders[2], "the same seed gives the same order"


def test_an_epoch_left_early_does_not_leak_into_the_next(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 60, 4
    with loader_for(Random(seed, length), batch_size, workers=2, prefetch=3) as loader:
        for number, images in enumerate(loader):
            if number == 2:
                break
        got = np.concatenate([host(images) for images in loader])
        np.testing.assert_array_equal(got, expected(seed, range(length))[0])


def test_a_new_epoch_closes_the_last_ones_iterator_still_alive(rng):
    """With one slot (prefetch=1) the kept iterator holds the slot its worker needs next (on a
    GPU, until the next batch is asked for): the new epoch closes it, and it gives no more
    batches, so it cannot take the new epoch's."""
    seed, length, batch_size = int(rng.integers(2**32)), 24, 4
    with loader_for(Random(seed, length), batch_size, workers=1, prefetch=1) as loader:
        kept = iter(loader)
        first = host(next(kept))
        np.testing.assert_array_equal(first, expected(seed, range(batch_size))[0])
        got = np.concatenate([host(images) for images in loader])
        np.testing.assert_array_equal(got, expected(seed, range(length))[0])
        with pytest.raises(StopIteration):
            next(kept)


@pytest.mark.parametrize("how,words", [("shape", ["shape (6, 4, 3)", "sample_shape=(6, 5, 3)"]),
                                       ("dtype", ["dtype float64", "sample_dtype=float32"]),
                                       ("raise", ["KeyError", "no such image", "Traceback", "__getitem__"])])
def test_a_bad_sample_raises_naming_its_index_after_the_good_batches(rng, how, words):
    seed, length, batch_size = int(rng.integers(2**32)), 50, 4
    bad = int(rng.integers(12, length))
    before = shm_names()
    loader = loader_for(BadAt(seed, length, bad, how), batch_size)
    good = []
    with pytest.raises(WorkerError) as raised:
        for images in loader:
            good.append(host(images))
    error = raised.value
    assert error.index == bad and error.batch == bad // batch_size
    assert f"dataset index {bad}" in str(error)
    for word in words:
        assert word in str(error), (word, str(error))
    assert error.traceback and "Traceback" in error.traceback
    assert len(good) == bad // batch_size, "the batches before the bad one came out"
    np.testing.assert_array_equal(np.concatenate(good), expected(seed, range(len(good) * batch_size))[0])
    with pytest.raises(WorkerError):
        iter(loader)
    assert all(not worker.process.is_alive() for worker in loader._workers)
    assert shm_names() == before


def test_a_killed_worker_is_an_error_naming_it_within_a_second(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 40, 4
    bad = 21  # batch 5, worker 5 % 3 = 2
    before = shm_names()
    loader = loader_for(BadAt(seed, length, bad, "kill"), batch_size)
    batches = iter(loader)
    for _ in range(bad // batch_size):
        next(batches)
    victim = loader._workers[(bad // batch_size) % 3]
    started = time.monotonic()
    with pytest.raises(WorkerError) as raised:
        next(batches)
    elapsed = time.monotonic() - started
    error = raised.value
    assert error.worker == victim.number and error.pid == victim.process.pid
    assert "SIGKILL" in str(error) and f"pid {victim.process.pid}" in str(error)
    assert error.traceback is None
    assert elapsed < 3.0, elapsed  # about a second (the report poll), generous for a loaded machine
    assert shm_names() == before


def test_a_worker_killed_from_outside_while_waiting(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 40, 4
    loader = loader_for(Random(seed, length), batch_size, workers=2, prefetch=1)
    batches = iter(loader)
    np.testing.assert_array_equal(host(next(batches)), expected(seed, range(4))[0])
    victim = loader._workers[1]
    os.kill(victim.process.pid, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(WorkerError) as raised:
        # Batch 1 may have been published before the kill; batch 3 cannot have been.
        for _ in range(3):
            next(batches)
    assert raised.value.worker == 1 and "SIGKILL" in str(raised.value)


def test_several_epochs_and_len(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 45, 7
    with loader_for(Random(seed, length, labels=True), batch_size, labels=True, workers=4) as loader:
        assert len(loader) == 7
        want = expected(seed, range(length))
        for _ in range(3):
            got = list(loader)
            assert len(got) == 7 and len(got[-1][0]) == 3
            np.testing.assert_array_equal(np.concatenate([host(images) for images, _ in got]), want[0])
            np.testing.assert_array_equal(np.concatenate([host(labels) for _, labels in got]), want[1])
        assert loader.stats()["samples"] == 3 * length
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


def test_labels_contract_is_checked(rng):
    seed = int(rng.integers(2**32))
    loader = loader_for(Random(seed, 8, labels=False), 4, labels=True, workers=1)
    with pytest.raises(WorkerError, match=r"with labels=True return a \(sample, label\) tuple"):
        list(loader)
    loader = loader_for(Random(seed, 8, labels=True), 4, labels=False, workers=1)
    with pytest.raises(WorkerError, match="give labels=True"):
        list(loader)


def test_bad_arguments_are_refused():
    dataset = Random(1, 10)
    for options, match in [({"workers": 0}, "workers"), ({"prefetch": 0}, "prefetch"),
                           ({"context": "fork"}, "fork"), ({"output": "jax"}, "output")]:
        with pytest.raises(ValueError, match=match):
            loader_for(dataset, 4, **options)
    with pytest.raises(ValueError, match="batch_size"):
        loader_for(dataset, 0)


def test_forkserver_workers(rng):
    seed, length = int(rng.integers(2**32)), 30
    with loader_for(Random(seed, length), 8, workers=2, context="forkserver") as loader:
        np.testing.assert_array_equal(np.concatenate([host(images) for images in loader]),
                                      expected(seed, range(length))[0])


def test_torch_output_gives_tensors_of_the_same_data(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the numpy output was tested")
    seed, length = int(rng.integers(2**32)), 20
    with loader_for(Random(seed, length, labels=True), 6, labels=True, workers=2, output="torch") as loader:
        got = list(loader)
    for images, labels in got:
        assert isinstance(images, torch.Tensor) and images.dtype == torch.float32
        assert labels.dtype == torch.int64 and images.is_cuda == ON_GPU
    want = expected(seed, range(length))
    np.testing.assert_array_equal(np.concatenate([host(images) for images, _ in got]), want[0])
    np.testing.assert_array_equal(np.concatenate([host(labels) for _, labels in got]), want[1])


def test_one_worker_with_one_slot_does_not_stall(rng):
    # On a GPU the trainer holds a batch's slot until its copy completed: with one slot in all,
    # it must give that slot back before it waits for the next batch.
    seed, length = int(rng.integers(2**32)), 25
    with loader_for(Random(seed, length), 4, workers=1, prefetch=1) as loader:
        np.testing.assert_array_equal(np.concatenate([host(images) for images in loader]),
                                      expected(seed, range(length))[0])


def test_a_stuck_worker_is_a_timeout_naming_it_and_the_loader_closes(rng):
    seed, length, batch_size = int(rng.integers(2**32)), 40, 4
    bad = int(rng.integers(8, length))  # from batch 2 on, so earlier batches come out first
    before = shm_names()
    loader = loader_for(BadAt(seed, length, bad, "hang"), batch_size, timeout=1.5)
    good = []
    started = None
    with pytest.raises(WorkerTimeout) as raised:
        for images in loader:
            good.append(host(images))
            started = time.monotonic()
    waited = time.monotonic() - started
    error = raised.value
    victim = loader._workers[(bad // batch_size) % 3]
    assert isinstance(error, TimeoutError) and isinstance(error, WorkerError)
    assert (error.worker, error.pid, error.batch) == (victim.number, victim.process.pid, bad // batch_size)
    for word in (f"worker {victim.number}", f"pid {victim.process.pid}", f"batch {bad // batch_size}", "1.5 s",
                 "still running"):
        assert word in str(error), (word, str(error))
    # The batches before the stuck one came out intact; the wait was about the timeout.
    assert len(good) == bad // batch_size
    np.testing.assert_array_equal(np.concatenate(good), expected(seed, range(len(good) * batch_size))[0])
    assert 1.4 <= waited < 10.0, waited
    with pytest.raises(WorkerError, match="closed"):
        iter(loader)
    assert all(not worker.process.is_alive() for worker in loader._workers)
    assert shm_names() == before


def test_a_timeout_only_bounds_the_wait(rng):
    # Batches that come in time are untouched by a (short) timeout.
    seed, length = int(rng.integers(2**32)), 30
    with loader_for(Random(seed, length), 4, workers=2, timeout=30) as loader:
        np.testing.assert_array_equal(np.concatenate([host(images) for images in loader]),
                                      expected(seed, range(length))[0])


def test_bad_timeouts_are_refused():
    for timeout in (-1, -0.5, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            loader_for(Random(1, 10), 4, timeout=timeout)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat") or platform.libc_ver()[0] != "glibc",
                    reason="needs Linux's /proc and glibc (the malloc settings are glibc's)")
def test_spawned_workers_reuse_their_freed_memory(rng):
    # Without the loader's malloc settings a spawned worker faults such buffers in anew for each
    # item (about 480 faults, measured); with them the freed memory is reused.
    seed, length, batch_size = int(rng.integers(2**32)), 64, 8
    with loader_for(Allocates(seed, length), batch_size, workers=1) as loader:
        list(loader)  # the first epoch: the heap grows to its size
        pid = loader._workers[0].process.pid
        before = minor_faults(pid)
        got = np.concatenate([host(images) for images in loader])
        per_item = (minor_faults(pid) - before) / length
    np.testing.assert_array_equal(got, expected(seed, range(length))[0])
    assert per_item < 32, f"{per_item:.0f} page faults per item: freed memory is not being reused"


def test_timeouts_too_long_for_the_clock_wait_for_ever(rng):
    # 1e300 s was accepted here and then refused by the ring at the first batch ("give a finite
    # number of seconds", a ValueError that left the loader unusable); 10**400 raised an
    # OverflowError naming no timeout. Both are waits for ever; negative ones are refused.
    seed, length = int(rng.integers(2**32)), 12
    for timeout in (1e300, 10**400):
        with loader_for(Random(seed, length), 4, workers=2, timeout=timeout) as loader:
            assert loader.timeout is None
            np.testing.assert_array_equal(np.concatenate([host(images) for images in loader]),
                                          expected(seed, range(length))[0])
    for timeout in (-(10**400), -1e-300):
        with pytest.raises(ValueError, match="finite number of seconds >= 0"):
            loader_for(Random(1, 10), 4, timeout=timeout)


class _FakeCuda:
    """Just enough of ``torch`` for the loader's GPU path, logging each step (no GPU needed):
    the ``fail_on``-th ``torch.empty`` raises, as an allocation that runs out of memory."""

    int64 = "int64"

    def __init__(self, fail_on):
        self.log, self.empties, self.fail_on = [], 0, fail_on
        fake = self

        class Waits:
            def __init__(self, name):
                self.name = name

            def synchronize(self):
                fake.log.append(f"{self.name} waited")

            def record(self, stream):
                fake.log.append(f"{self.name} recorded")

            def wait_event(self, event):
                pass

        class Copied:
            def __init__(self, shape):
                self.shape = shape

            def copy_(self, source, non_blocking=False):
                fake.log.append("copy queued")

            def record_stream(self, stream):
                pass

        class Cuda:
            Stream = staticmethod(lambda device=None: Waits("copy stream"))
            Event = staticmethod(lambda: Waits("copy event"))
            current_stream = staticmethod(lambda device=None: Waits("consumer stream"))

            @staticmethod
            def stream(stream):
                import contextlib
                return contextlib.nullcontext()

        self.cuda = Cuda
        self._copied = Copied

    def device(self, *args):
        return args

    def from_numpy(self, array):
        return array

    def empty(self, shape, dtype=None, device=None):
        self.empties += 1
        if self.empties == self.fail_on:
            raise RuntimeError("CUDA out of memory (the test's)")
        return self._copied(shape)


def test_the_gpu_path_gives_a_slot_back_only_after_its_copy_even_when_a_step_fails(rng):
    # The labels' allocation fails after the samples' copy out of the slot was queued and
    # before its event was recorded: the slot must still go back only once the copy stream is
    # idle (it was left to the garbage collector, under a copy that may still be reading it).
    seed, length = int(rng.integers(2**32)), 16
    with loader_for(Random(seed, length, labels=True), 4, labels=True, workers=2) as loader:
        fake = _FakeCuda(fail_on=4)  # batch 0: samples, labels; batch 1: samples, then fails
        loader._torch, loader.on_gpu = fake, True
        take = loader._take

        def logged_take(worker, batch):
            frame = take(worker, batch)
            release = frame.release

            def logged_release():
                fake.log.append(f"frame {batch} released")
                release()

            frame.release = logged_release
            return frame

        loader._take = logged_take
        batches = iter(loader)
        next(batches)
        with pytest.raises(RuntimeError, match="out of memory"):
            next(batches)
    log = fake.log
    # Batch 0's slot goes back after its event, before batch 1 is taken; batch 1's after the
    # copy stream was waited for.
    assert log.index("frame 0 released") > log.index("copy event recorded")
    assert log[log.index("frame 0 released") - 1] == "copy event waited", log
    tail = log[log.index("frame 0 released") + 1:]
    assert tail == ["copy queued", "copy stream waited", "frame 1 released"], log
