#!/usr/bin/env python3
"""Issue 15's registration goal: pinning 1 GiB in place with `hetmem.register` against
`tensor.pin_memory()` (which allocates pinned memory and copies). Each is timed --repeats
times on a fresh, already-touched array (pages faulted in, as a real data set is), including
nothing else; the medians and their ratio go to stdout as JSON.
The registered view is checked to hold the array's bytes.

    python3 bench/peers/register_vs_pin.py --gib 1
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

import hetmem


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    nbytes = int(args.gib * (1 << 30))
    rng = np.random.default_rng()
    register_ms, pin_ms = [], []
    for _ in range(args.repeats):
        array = rng.integers(0, 255, size=nbytes, dtype=np.uint8)
        start = time.perf_counter()
        buf = hetmem.register(array)
        register_ms.append((time.perf_counter() - start) * 1e3)
        probe = rng.integers(0, nbytes, size=64)
        assert np.array_equal(buf.numpy()[probe], array[probe]), "the registered view differs"
        del buf
        tensor = torch.from_numpy(array)
        start = time.perf_counter()
        pinned = tensor.pin_memory()
        pin_ms.append((time.perf_counter() - start) * 1e3)
        del pinned, tensor, array
    register, pin = statistics.median(register_ms), statistics.median(pin_ms)
    print(json.dumps({"bytes": nbytes, "register_ms": register, "pin_memory_ms": pin,
                      "speedup": pin / register, "register_all_ms": register_ms, "pin_memory_all_ms": pin_ms}))


if __name__ == "__main__":
    main()
