#!/usr/bin/env python3
"""Builds and runs dataset_blur_emulate.cpp: dataset_blur3_rgb on the CPU under ASan, every
access checked (no GPU needed). Usage: scripts/probes/dataset_blur_emulate.py [SEED...]

The kernel's text is taken as it is; only its global loads and stores become checked calls and
its CUDA keywords C++ (the replacements below must each be found, or this fails)."""

import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "crates/hetmem-bench/kernels/dataset.cu"
REPLACEMENTS = [
    ('extern "C" __global__ void __launch_bounds__(THREADS)', "void"),
    ("__shared__ __align__(16)", "alignas(16) static"),
    ("__restrict__", ""),
    ("__syncthreads()", "sync_block()"),
    ("loaded[k] = *(const uint4*)g;", "loaded[k] = load16(g);"),
    ("staged[b] = g[b];", "staged[b] = load1(g + b);"),
    ("*(uint4*)g = *(const uint4*)staged;", "store16(g, *(const uint4*)staged);"),
    ("g[b] = staged[b];", "store1(g + b, staged[b]);"),
]


def main() -> int:
    text = SOURCE.read_text()
    body = text[text.index("#define TILE_W"): text.index("// The sparse pass")]
    for old, new in REPLACEMENTS:
        if old not in body:
            sys.exit(f"{SOURCE}: {old!r} not found; update {__file__} to the kernel's new text")
        body = body.replace(old, new)
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        (work / "kernel_body.inc").write_text(body)
        (work / "emulate.cpp").write_text((HERE / "dataset_blur_emulate.cpp").read_text())
        subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                        str(work / "emulate.cpp"), "-o", str(work / "emulate")], check=True)
        failed = 0
        for seed in sys.argv[1:] or ["1"]:
            print(f"seed {seed}: ", end="", flush=True)
            failed |= subprocess.run([str(work / "emulate"), seed]).returncode
    return failed


if __name__ == "__main__":
    sys.exit(main())
