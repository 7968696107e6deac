#!/usr/bin/env python3
"""Reference outputs of OpenCV's cv2.GaussianBlur on real photographs, for hetmem's tests.

Usage: opencv-reference.py OUTPUT_DIR

Loads photographs that scikit-image ships inside its wheel (nothing is downloaded), and for
each image and each case of a small matrix (kernel size, sigma, border) writes:

* the input once, as raw bytes: uint8, C-contiguous rows, RGB order (gray: one channel), and
  tiny crops of it (1x1 to 5x4: sides not larger than the radius);
* cv2.GaussianBlur's output, in the same layout;
* manifest.json, listing every case: file names, width, height, channels, ksize, sigma (0 means
  "derive it from ksize", exactly as passed to OpenCV) and border ("reflect101" or "replicate").

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
    for name, stem, channels, image, matrix in jobs:
        height, width = image.shape[:2]
        suffix = "gray" if channels == 1 else "rgb"
        input_file = f"{stem}.{suffix}"
        with open(os.path.join(out_dir, input_file), "wb") as f:
            f.write(image.tobytes())
        for ksize, sigma, borders in matrix:
            for border in borders:
                # A whole (not sub-)matrix, so OpenCV takes its bit-exact 8-bit path as a caller's
                # own image would.
                blurred = cv2.GaussianBlur(
                    image, (ksize, ksize), sigmaX=sigma, sigmaY=sigma, borderType=BORDERS[border]
                )
                blurred = np.ascontiguousarray(blurred)
                assert blurred.dtype == np.uint8 and blurred.shape == image.shape, blurred.shape
                output_file = f"{stem}_k{ksize}_s{sigma_tag(sigma)}_{border}.{suffix}"
                with open(os.path.join(out_dir, output_file), "wb") as f:
                    f.write(blurred.tobytes())
                cases.append(
                    {
                        "image": name,
                        "input": input_file,
                        "output": output_file,
                        "width": width,
                        "height": height,
                        "channels": channels,
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
    print(
        f"opencv-reference: {len(cases)} cases from {len(images)} images "
        f"(OpenCV {cv2.__version__}, scikit-image {skimage.__version__}) in {out_dir}"
    )


if __name__ == "__main__":
    main()
