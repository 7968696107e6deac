#!/usr/bin/env python3
"""Registers, spills and shared memory of every entry point of a .cu file, from NVRTC's ptxas.

Usage: scripts/probes/ptxas-info.py crates/hetmem/kernels/gaussian.cu [sm_90]
Needs libnvrtc.so.13 on LD_LIBRARY_PATH (.ci/run installs it into .nvrtc/nvidia/cu13/lib).
"""
import ctypes
import sys

path = sys.argv[1]
arch = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
nvrtc = ctypes.CDLL("libnvrtc.so.13")
program = ctypes.c_void_p()
source = open(path, "rb").read()
if nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, path.encode(), 0, None, None) != 0:
    sys.exit("nvrtcCreateProgram failed")
options = [f"--gpu-architecture={arch}".encode(), b"-Xptxas=-v", b"--std=c++17"]
array = (ctypes.c_char_p * len(options))(*options)
status = nvrtc.nvrtcCompileProgram(program, len(options), array)
size = ctypes.c_size_t()
nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetProgramLog(program, log)
print(log.value.decode())
sys.exit(1 if status != 0 else 0)
