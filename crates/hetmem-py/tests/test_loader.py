"""The data loader against a NumPy reference written here from the loader's specification
(crop at the planned origin, mirror where planned, x * scale + shift in float32, rounded to
nearest even): on the CPU backend (CI; hetmem's native pre-processing, checked bit for bit)
and on a GPU (PyTorch on the loader's stream, within one unit of the output type, since the
GPU may fuse the multiply and add)."""

import numpy as np
import pytest

import hetmem
from hetmem import loader

on_gpu = hetmem.device().backend == "cuda"
# On a GPU the loader yields CUDA tensors; on the CPU backend, tensors or hetmem buffers.
OUTPUTS = ["torch"] if on_gpu else ["buffer", "torch"]
ELEMENTS = ["float32", "float16", "bfloat16"]


def scale_and_shift(mean, std):
    """(x / 255 - mean) / std as x * scale + shift: worked out in float64, rounded once."""
    mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    return (1.0 / (255.0 * std)).astype(np.float32), (-mean / std).astype(np.float32)


def as_bits(values, element):
    """float32 values rounded to `element` (to nearest, ties to even), as unsigned bits."""
    if element == "float32":
        return values.view(np.uint32)
    if element == "float16":
        with np.errstate(over="ignore"):  # past float16's range is infinity, as meant
            return values.astype(np.float16).view(np.uint16)
    bits = values.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def bits_as_float(bits, element):
    if element == "float32":
        return bits.view(np.float32)
    if element == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def reference(data, plan, positions, crop, scale, shift):
    """The batch at `positions` of the plan, N x crop_h x crop_w x C, float32."""
    images = []
    for index, flip, top, left in zip(plan.indices[positions], plan.flips[positions], plan.tops[positions],
                                      plan.lefts[positions]):
        image = data[index, top:top + crop[0], left:left + crop[1], :]
        images.append(image[:, ::-1, :] if flip else image)
    return np.stack(images).astype(np.float32) * scale + shift


def batch_bits(images, element, torch):
    """The loader's batch as N x H x W x C bits, after checking its layout."""
    if isinstance(images, hetmem.Buffer):
        host = images.numpy()
        return host.view(np.uint32 if element == "float32" else np.uint16)
    assert images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last)
    nhwc = images.permute(0, 2, 3, 1).contiguous().cpu()
    wide = {"float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}[element]
    return nhwc.view(wide).numpy().view(np.uint32 if element == "float32" else np.uint16)


def make_records(rng, tmp_path, count, shape):
    images, labels = tmp_path / "images.u8", tmp_path / "labels.i64"
    loader.write_records(images, labels, count=count, record_shape=shape, seed=int(rng.integers(2**31)))
    return images, labels, np.fromfile(images, np.uint8).reshape((count,) + shape), np.fromfile(labels, np.int64)


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("mode", ["mapped", "staged", "copied"])
def test_the_loader_matches_a_numpy_reference(rng, tmp_path, mode, element, output):
    torch = pytest.importorskip("torch") if output == "torch" else None
    shape, crop, batch = (32, 40, 3), (24, 29), 8
    images, labels, data, truth = make_records(rng, tmp_path, 50, shape)
    mean = tuple(rng.uniform(0.3, 0.6, 3))
    std = tuple(rng.uniform(0.2, 0.3, 3))
    scale, shift = scale_and_shift(mean, std)
    feed = loader.RecordLoader(images, labels, batch, shape, seed=int(rng.integers(2**31)), mode=mode,
                               dtype=element, crop=crop, mean=mean, std=std, output=output)
    assert len(feed) == 6
    plan = feed.order(0)
    assert plan.flips.any() and not plan.flips.all()
    assert len(set(zip(plan.tops.tolist(), plan.lefts.tolist()))) > 1  # crops at many origins
    seen = 0
    for number, (batch_images, batch_labels) in enumerate(feed):
        positions = slice(number * batch, (number + 1) * batch)
        expected = reference(data, plan, positions, crop, scale, shift)
        got = batch_bits(batch_images, element, torch)
        assert got.shape == (batch,) + crop + (3,)
        if on_gpu:
            ulp = {"float32": 2**-23, "float16": 2**-10, "bfloat16": 2**-7}[element]
            np.testing.assert_allclose(bits_as_float(got, element), bits_as_float(as_bits(expected, element), element),
                                       rtol=ulp, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, as_bits(expected, element))
        np.testing.assert_array_equal(np.asarray(batch_labels.cpu() if torch else batch_labels), truth[plan.indices[positions]])
        seen += 1
    assert seen == 6


def test_the_same_seed_gives_the_same_batches_and_epochs_differ(rng, tmp_path):
    output = "torch" if on_gpu else "buffer"
    torch = pytest.importorskip("torch") if on_gpu else None
    shape = (16, 16, 3)
    images, labels, _, _ = make_records(rng, tmp_path, 40, shape)
    seed = int(rng.integers(2**31))

    def epoch_bits(feed):
        return np.concatenate([batch_bits(batch, "bfloat16", torch) for batch, _ in feed])

    first = loader.RecordLoader(images, labels, 8, shape, seed=seed, crop=(12, 10), output=output)
    second = loader.RecordLoader(images, labels, 8, shape, seed=seed, crop=(12, 10), output=output)
    epoch0 = epoch_bits(first)
    np.testing.assert_array_equal(epoch_bits(second), epoch0)
    assert not np.array_equal(epoch_bits(first), epoch0)  # epoch 1: another order, other crops
    other = loader.RecordLoader(images, labels, 8, shape, seed=seed + 1, crop=(12, 10), output=output)
    assert not np.array_equal(other.order(0).indices, first.order(0).indices)


@pytest.mark.skipif(on_gpu, reason="the CPU backend's rounding; on a GPU PyTorch converts")
def test_half_precision_overflows_and_underflows_as_numpy_does(rng, tmp_path):
    shape = (8, 8, 3)
    images, labels, data, _ = make_records(rng, tmp_path, 4, shape)
    # Tiny stds push values past float16's range (infinity); huge ones into its subnormals.
    for std in ((1e-6, 1e-5, 3e-5), (1e5, 3e5, 1e6)):
        feed = loader.RecordLoader(images, labels, 4, shape, dtype="float16", mean=(0.1, 0.2, 0.3), std=std,
                                   shuffle=False, flip=False, output="buffer", seed=int(rng.integers(2**31)))
        (batch, _), = list(feed)
        scale, shift = scale_and_shift((0.1, 0.2, 0.3), std)
        expected = data.astype(np.float32) * scale + shift
        np.testing.assert_array_equal(batch.numpy().view(np.uint16), as_bits(expected, "float16"))


def test_bad_loader_arguments_are_refused_with_the_remedy(rng, tmp_path):
    shape = (8, 8, 3)
    images, labels, _, _ = make_records(rng, tmp_path, 4, shape)
    with pytest.raises(ValueError, match="crop"):
        loader.RecordLoader(images, labels, 2, shape, crop=(9, 8))
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        loader.RecordLoader(images, labels, 2, shape, dtype="int8")
    with pytest.raises(ValueError, match="whole records"):
        loader.RecordLoader(images, labels, 2, (7, 8, 3))
    with pytest.raises(ValueError, match="std > 0"):
        loader.RecordLoader(images, labels, 2, shape, std=(0.2, 0.0, 0.2))


def test_native_batch_preparation_checks_its_bounds(rng):
    records = hetmem.register(rng.integers(0, 255, size=(3, 4, 5, 2), dtype=np.uint8))
    out = hetmem.pinned((1, 2, 2, 2), np.float32)
    args = dict(record_shape=(4, 5, 2), crop_shape=(2, 2), scale=[1.0, 1.0], shift=[0.0, 0.0], element="float32")

    def prepare(indices, origins, flips, **changes):
        merged = {**args, **changes}
        hetmem._native.prepare_batch(records._memory, merged["record_shape"], indices, origins, flips,
                                     merged["crop_shape"], merged["scale"], merged["shift"], out._memory,
                                     merged["element"])

    prepare([2], [(2, 3)], [True])  # the last record, the bottom-right crop: fits
    expected = records.numpy()[2, 2:4, 3:5, :][:, ::-1, :].astype(np.float32)
    np.testing.assert_array_equal(out.numpy()[0], expected)
    with pytest.raises(ValueError, match="record 3 of 3"):
        prepare([3], [(0, 0)], [False])
    with pytest.raises(ValueError, match="leaves"):
        prepare([0], [(3, 0)], [False])
    with pytest.raises(ValueError, match="writable bytes"):
        prepare([0, 1], [(0, 0), (0, 0)], [False, False])
    with pytest.raises(ValueError, match="one of each"):
        prepare([0], [(0, 0), (0, 0)], [False])
    with pytest.raises(ValueError, match="one per channel"):
        prepare([0], [(0, 0)], [False], scale=[1.0])


@pytest.mark.parametrize("element", ["float16", "bfloat16"])
def test_native_rounding_matches_numpy_on_any_float(rng, element):
    # With scale 0 each channel's value is its shift: one record of many channels converts
    # arbitrary float32 values, random bit patterns (normal, subnormal, huge) and the edges
    # of float16's range and its ties.
    edges = np.array([65504.0, 65519.996, 65520.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14,
                      2.0**-14 - 2.0**-25, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, np.inf], np.float32)
    bits = rng.integers(0, 2**32, size=8192, dtype=np.uint64).astype(np.uint32).view(np.float32)
    shift = np.concatenate([edges, -edges, bits[np.isfinite(bits)]]).astype(np.float32)
    channels = shift.size
    records = hetmem.register(rng.integers(0, 255, size=(1, 1, 1, channels), dtype=np.uint8))
    out = hetmem.pinned(channels, np.uint16)
    hetmem._native.prepare_batch(records._memory, (1, 1, channels), [0], [(0, 0)], [False], (1, 1),
                                 [0.0] * channels, shift.tolist(), out._memory, element)
    expected = records.numpy().reshape(-1).astype(np.float32) * np.float32(0.0) + shift
    np.testing.assert_array_equal(out.numpy(), as_bits(expected, element))
