"""hetmem memory moved by NVIDIA NIXL, with the hand-off kept.

NIXL (the ``nixl`` package: ``pip install nixl-cu13``, or ``nixl-cu12``) moves registered
memory between agents, in one process, across processes, or across machines, over UCX, and
between memory and files through its storage backends (POSIX, GDS). This module registers
hetmem's own memory with an agent and keeps hetmem's rule while NIXL works on it:

- a buffer a transfer **writes** is lent for the transfer's duration: its host views raise
  ``LentError`` until NIXL reports the transfer complete (``Transfer.wait()``, or
  ``Transfer.done()`` returning True), when it is reclaimed;
- a buffer a transfer **reads** is shared: its host views stay usable for reading, and no
  transfer may write it until every transfer reading it is done (``LentError``). Writing it
  through a NumPy view meanwhile races the transfer, as writing any array under a reader does;
  a buffer lent to the GPU (``buf.lend()``) cannot be shared or lent to a transfer.

A peer's transfer into or out of this process's memory is announced to it by the peer's
notification: ``Agent.expect`` lends a buffer until the peer's write says it is done,
``Agent.offer`` shares one until the peer's read says so.

Memory is only ever named by hetmem's objects: a ``Registration`` is made from a ``Buffer``
(pinned, registered in place, or a window of a mapped file: host memory, NIXL's ``DRAM_SEG``),
from device memory hetmem allocated (the ``LoadedTensors`` of ``hetmem.load(..., "cuda")``,
or a ``DeviceView`` of it: ``VRAM_SEG``, with its CUDA device id; while a transfer writes it,
its device views raise ``LentError`` too), or from a file path (``FILE_SEG``, for the
storage backends); a peer's memory is a
``RemoteRegion`` that the peer made from its own registration and sent over (it pickles).
NIXL checks every remote range against what the peer registered, and refuses the rest.

A registration lives while it is used: it is deregistered when dropped (or ``close()``-d),
and every transfer in flight holds it, so that is after every transfer that uses it is done.
Transfers in flight are kept by this module until they complete, whatever the caller drops.

Device memory moves over UCX only through its CUDA transports (``UCX_TLS`` with
``cuda_copy``, and ``cuda_ipc`` between processes); inside one machine the fastest settings
measured were ``UCX_TLS=cuda_copy,cuda_ipc,sm,self`` (set before the first agent) with
``Agent(name, params={"UCX": {"ucx_error_handling_mode": "none"}})``.

Host memory into another process's device memory can go in two hops on one machine:
``Agent.write_staged`` lands it in device memory of this process, then NIXL moves it device to
device (UCX alone emulates that put at under 1 GB/s; the two hops, staged in PyTorch's memory
as this call stages, ran at 0.92-0.94 of the link on the H200 machine: docs/cluster.md).

Errors from NIXL and UCX come as ``NixlError`` (a ``HetmemError``) naming the backend, the call
and a remedy. An ``Agent`` is used from one thread at a time.

Example (two agents; across processes, send ``metadata()`` and the ``RemoteRegion`` over)::

    import numpy as np, hetmem, hetmem.nixl as hn
    sender, receiver = hn.Agent("sender"), hn.Agent("receiver")
    sender.add_peer(receiver.metadata())
    src, dst = hetmem.pinned(1 << 20), hetmem.pinned(1 << 20)
    src.numpy()[:] = np.random.default_rng().integers(0, 256, 1 << 20, dtype=np.uint8)
    src_reg, dst_reg = sender.register(src), receiver.register(dst)
    incoming = receiver.expect(dst_reg, "sender", b"frame 0")   # dst is lent from here
    sender.write(src_reg, dst_reg.remote(), notify=b"frame 0").wait()
    incoming.wait()                                             # dst is reclaimed
    assert (dst.numpy() == src.numpy()).all()
"""

from ._agent import Agent
from ._errors import NixlError, available
from ._handoff import Incoming, Offered
from ._registration import FileRegistration, Registration, RemoteRegion
from ._staged import StagedWrite
from ._transfer import Transfer

__all__ = [
    "Agent",
    "FileRegistration",
    "Incoming",
    "NixlError",
    "Offered",
    "Registration",
    "RemoteRegion",
    "StagedWrite",
    "Transfer",
    "available",
]
