"""Does the NVIDIA driver honour RLIMIT_MEMLOCK? Run under a low `ulimit -l`.

Pins 1 GiB with cudaHostAlloc and registers 1 GiB of numpy memory with cudaHostRegister,
printing what each call returns. hetmem's error remedies depend on the answer.
"""
import ctypes, resource, sys
import numpy as np
import cupy
from cupy.cuda import runtime

print("RLIMIT_MEMLOCK", resource.getrlimit(resource.RLIMIT_MEMLOCK))
size = 1 << 30
try:
    p = runtime.hostAlloc(size, 0)
    ctypes.memset(p, 1, size)
    print("hostAlloc 1 GiB: ok")
    runtime.freeHost(p)
except Exception as e:
    print("hostAlloc 1 GiB: error", e)
a = np.ones(size, dtype=np.uint8)
try:
    runtime.hostRegister(a.ctypes.data, size, 0)
    print("hostRegister 1 GiB: ok")
    runtime.hostUnregister(a.ctypes.data)
except Exception as e:
    print("hostRegister 1 GiB: error", e)
