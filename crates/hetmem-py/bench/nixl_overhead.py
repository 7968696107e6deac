"""What hetmem.nixl adds to NIXL: the same host-to-host writes between two agents of one
process, through hetmem.nixl (registration, the hand-off, the peer's expected write) and
through NIXL's own API on the same memory, alternated, from 1 MiB to 256 MiB.

    python3 nixl_overhead.py [--ucx-none] [--reps 9]

``--ucx-none`` starts UCX with ``ucx_error_handling_mode=none`` (set UCX_TLS yourself, e.g.
``UCX_TLS=cuda_copy,cuda_ipc,sm,self``). Prints one JSON line a size: the median GB/s of each
path and hetmem's overhead in percent of NIXL's time. Every transfer's destination is
poisoned first and checked after.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import numpy as np

import hetmem
import hetmem.nixl as hn
from hetmem.nixl._errors import _nixl

MiB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ucx-none", action="store_true")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    params = {"UCX": {"ucx_error_handling_mode": "none"}} if args.ucx_none else None
    tag = uuid.uuid4().hex[:6]
    sender, receiver = hn.Agent(f"sender-{tag}", params=params), hn.Agent(f"receiver-{tag}", params=params)
    rng = np.random.default_rng()
    print(json.dumps({"nixl": _nixl().__name__, "backend": hetmem.device().backend,
                      "ucx_error_handling_mode": "none" if args.ucx_none else "peer"}), flush=True)
    for size in (1, 4, 16, 64, 256):
        nbytes = size * MiB
        source, destination = hetmem.pinned(nbytes), hetmem.pinned(nbytes)
        source_registration, destination_registration = sender.register(source), receiver.register(destination)
        sender.add_peer(receiver.metadata())
        region = destination_registration.remote()
        # NIXL's own API on the same memory (the registrations above cover it).
        raw_sender, raw_receiver = sender._agent, receiver._agent
        local = raw_sender.get_xfer_descs([source_registration._descriptor], "DRAM")
        remote = raw_sender.get_xfer_descs([region._descriptor()], "DRAM")
        times = {"hetmem": [], "nixl": []}
        for rep in range(args.reps + 1):
            for path in ("hetmem", "nixl"):
                source.numpy()[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
                destination.numpy()[:] = 0xA5
                notification = f"{path} {rep}".encode()
                start = time.perf_counter()
                if path == "hetmem":
                    incoming = receiver.expect(destination_registration, sender.name, notification)
                    sender.write(source_registration, region, notify=notification).wait()
                    incoming.wait()
                else:
                    handle = raw_sender.initialize_xfer("WRITE", local, remote, receiver.name, notification)
                    state = raw_sender.transfer(handle)
                    while state == "PROC":
                        time.sleep(0)  # as hetmem.nixl polls: let NIXL's progress thread run
                        state = raw_sender.check_xfer_state(handle)
                    assert state == "DONE", state
                    while notification not in raw_receiver.get_new_notifs().get(sender.name, []):
                        time.sleep(0)
                    handle.release()
                elapsed = time.perf_counter() - start
                if not np.array_equal(destination.numpy(), source.numpy()):
                    raise SystemExit(f"{path}, {size} MiB: bytes differ")
                if rep:  # the first round warms the connection
                    times[path].append(elapsed)
        medians = {path: sorted(values)[len(values) // 2] for path, values in times.items()}
        print(json.dumps({"MiB": size, "hetmem_GBps": round(nbytes / medians["hetmem"] / 1e9, 3),
                          "nixl_GBps": round(nbytes / medians["nixl"] / 1e9, 3),
                          "hetmem_overhead_pct": round(100 * (medians["hetmem"] / medians["nixl"] - 1), 2),
                          "bytes_checked": "all"}), flush=True)
        source_registration.close()
        destination_registration.close()


if __name__ == "__main__":
    main()
