#!/usr/bin/env python3
"""Reference outputs of OpenCV's cv2.GaussianBlur on real photographs, for hetmem's tests.

Usage: opencv-reference.py OUTPUT_DIR

Loads photographs that scikit-image ships inside its wheel (nothing is downloaded), and for
each image and each case of a small matrix (kernel size, sigma, border) writes:

* the input once, as raw bytes: uint8, C-contiguous rows, RGB order (gray: one channel), and
  tiny crops of it (1x1 to 5x4: sides not larger than the radius);
* the same photographs and crops as 16-bit samples (CV_16U, little-endian uint16): each 8-bit
  value scaled to 16 bits with random low bits, and scaled to 10 bits (0 to 1023, as 10-bit
  video holds them) with random low bits, from a fixed seed;
* cv2.GaussianBlur's output, in the same layout;
* manifest.json, listing every case: file names, width, height, channels, sample ("u8" or
  "u16"), ksize (0 means "derive it from sigma", as passed to OpenCV), sigma (0 means "derive it from ksize", exactly as passed to OpenCV) and border
  ("reflect101" or "replicate").

crates/hetmem/tests/opencv.rs reads the folder named by HETMEM_OPENCV_REFERENCE and checks
hetmem's gaussian_cpu against every case. .ci/run installs the pinned packages and runs this.
"""

import json
import os
import sys

import cv2
import numpy as np
import skimage
import skimage.data

# Photographs shipped in the scikit-image wheel (no pooch download): (name, expected channels).
IMAGES = [
    ("astronaut", 3),
    ("coffee", 3),
    ("chelsea", 3),
    ("rocket", 3),
    ("camera", 1),
    ("moon", 1),
]

BORDERS = {
    "reflect101": cv2.BORDER_REFLECT_101,
    "replicate": cv2.BORDER_REPLICATE,
}

# (ksize, sigma, borders); sigma 0 lets OpenCV derive it from ksize (and use its fixed tables
# for ksize <= 7).
CASES = [
    (3, 0.0, ["reflect101", "replicate"]),
    (5, 0.0, ["reflect101", "replicate"]),
    (5, 1.5, ["reflect101"]),
    (7, 0.0, ["reflect101"]),
    (11, 2.0, ["reflect101", "replicate"]),
    (15, 0.0, ["reflect101"]),
]

# Crops whose sides are not larger than the radius, (width, height), from the middle of each
# photograph (its corners are often flat): the borders fold again and again (OpenCV's
# borderInterpolate).
TINY_SIZES = [(1, 1), (2, 3), (3, 1), (5, 4)]
TINY_CASES = [
    (5, 0.0, ["reflect101", "replicate"]),
    (19, 0.0, ["reflect101", "replicate"]),
    (11, 2.0, ["reflect101"]),
]

# 16-bit samples (OpenCV's bit-exact CV_16U path: Q16 weights, a 64-bit vertical sum): the
# 9-tap table OpenCV keeps for sigma 0, and kernels up to hetmem's largest (65 taps).
CASES_16 = [
    (3, 0.0, ["reflect101", "replicate"]),
    (5, 0.0, ["reflect101", "replicate"]),
    (5, 1.5, ["reflect101"]),
    (9, 0.0, ["reflect101", "replicate"]),
    (11, 2.0, ["reflect101", "replicate"]),
    (31, 5.0, ["reflect101"]),
    (65, 0.0, ["replicate"]),
    # ksize 0: OpenCV sizes the kernel from sigma, by 8 sigma for 16-bit images (6 for 8-bit).
    (0, 1.0, ["reflect101"]),
    (0, 2.0, ["replicate"]),
]
# 10-bit samples (0 to 1023) in 16-bit words: fewer kernels on whole photographs.
CASES_10 = [
    (5, 0.0, ["reflect101"]),
    (9, 0.0, ["replicate"]),
    (11, 2.0, ["reflect101"]),
]
# Crops of the 16-bit photographs: sides not larger than the radius, and an odd small size.
SIZES_16 = [(1, 1), (2, 3), (3, 1), (5, 4), (37, 23)]
CASES_16_SMALL = [
    (5, 0.0, ["reflect101", "replicate"]),
    (9, 0.0, ["reflect101"]),
    (19, 0.0, ["reflect101", "replicate"]),
    (11, 2.0, ["reflect101"]),
]
# The seed of the random low bits: the same references on every run.
SEED_16 = 20261201


def load(name, channels):
    loader = getattr(skimage.data, name, None)
    if loader is None:
        return None
    image = loader()
    if image.dtype != np.uint8:
        raise SystemExit(f"skimage.data.{name}: dtype {image.dtype}, expected uint8")
    if channels == 1 and image.ndim != 2:
        raise SystemExit(f"skimage.data.{name}: shape {image.shape}, expected gray")
    if channels == 3 and (image.ndim != 3 or image.shape[2] != 3):
        raise SystemExit(f"skimage.data.{name}: shape {image.shape}, expected RGB")
    return np.ascontiguousarray(image)


def sigma_tag(sigma):
    return "auto" if sigma == 0 else f"{sigma:g}".replace(".", "p")


def to_16_bit(image, bits, rng):
    """An 8-bit image as `bits`-bit samples: each value shifted up, the new low bits random."""
    shift = bits - 8
    low = rng.integers(0, 1 << shift, size=image.shape, dtype=np.uint16)
    return np.ascontiguousarray((image.astype(np.uint16) << shift) | low)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)

    images = []
    for name, channels in IMAGES:
        image = load(name, channels)
        if image is not None:
            images.append((name, channels, image))
    grays = sum(1 for _, channels, _ in images if channels == 1)
    if len(images) < 4 or grays < 1:
        raise SystemExit(f"only {len(images)} images ({grays} gray) in scikit-image {skimage.__version__}")

    cases = []
    jobs = [(name, name, channels, image, CASES) for name, channels, image in images]
    for name, channels, image in images:
        for width, height in TINY_SIZES:
            top, left = image.shape[0] // 2, image.shape[1] // 2
            crop = np.ascontiguousarray(image[top : top + height, left : left + width])
            jobs.append((name, f"{name}_{width}x{height}", channels, crop, TINY_CASES))
    rng = np.random.default_rng(SEED_16)
    for name, channels, image in images:
        for bits in (16, 10):
            wide = to_16_bit(image, bits, rng)
            jobs.append((name, f"{name}_{bits}bit", channels, wide, CASES_16 if bits == 16 else CASES_10))
            for width, height in SIZES_16:
                top, left = wide.shape[0] // 2, wide.shape[1] // 2
                crop = np.ascontiguousarray(wide[top : top + height, left : left + width])
                jobs.append((name, f"{name}_{bits}bit_{width}x{height}", channels, crop, CASES_16_SMALL))
    for name, stem, channels, image, matrix in jobs:
        height, width = image.shape[:2]
        sample = "u16" if image.dtype == np.uint16 else "u8"
        suffix = ("gray" if channels == 1 else "rgb") + ("16" if sample == "u16" else "")
        input_file = f"{stem}.{suffix}"
        with open(os.path.join(out_dir, input_file), "wb") as f:
            # Little-endian samples whatever this machine's order, as hetmem reads them.
            f.write(image.astype(image.dtype.newbyteorder("<")).tobytes())
        for ksize, sigma, borders in matrix:
            for border in borders:
                # A whole (not sub-)matrix, so OpenCV takes its bit-exact 8-bit or 16-bit path as
                # a caller's own image would.
                blurred = cv2.GaussianBlur(
                    image, (ksize, ksize), sigmaX=sigma, sigmaY=sigma, borderType=BORDERS[border]
                )
                blurred = np.ascontiguousarray(blurred)
                assert blurred.dtype == image.dtype and blurred.shape == image.shape, blurred.shape
                output_file = f"{stem}_k{ksize}_s{sigma_tag(sigma)}_{border}.{suffix}"
                with open(os.path.join(out_dir, output_file), "wb") as f:
                    f.write(blurred.astype(blurred.dtype.newbyteorder("<")).tobytes())
                cases.append(
                    {
                        "image": name,
                        "input": input_file,
                        "output": output_file,
                        "width": width,
                        "height": height,
                        "channels": channels,
                        "sample": sample,
                        "ksize": ksize,
                        "sigma": sigma,
                        "border": border,
                    }
                )

    manifest = {
        "opencv": cv2.__version__,
        "scikit_image": skimage.__version__,
        "numpy": np.__version__,
        "cases": cases,
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    wide = sum(1 for case in cases if case["sample"] == "u16")
    print(
        f"opencv-reference: {len(cases)} cases ({wide} of 16-bit samples) from {len(images)} images "
        f"(OpenCV {cv2.__version__}, scikit-image {skimage.__version__}) in {out_dir}"
    )


if __name__ == "__main__":
    main()
