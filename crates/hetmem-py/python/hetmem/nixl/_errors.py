"""Loading NIXL, and its errors as ``NixlError``: the backend, the call and a remedy."""

from __future__ import annotations

import importlib
import os
from typing import Any, Iterable, Optional

from .. import HetmemError

#: What ``Agent()`` loads, in order: the meta package, then its CUDA 13 and 12 builds.
_MODULES = ("nixl", "nixl_cu13", "nixl_cu12")


class NixlError(HetmemError):
    """A NIXL or UCX call failed; the message names the backend, the call and a remedy."""


_loaded: Optional[Any] = None
_load_error: Optional[str] = None


def _nixl() -> Any:
    """The nixl package (its ``nixl_agent`` API), imported once."""
    global _loaded, _load_error
    if _loaded is None and _load_error is None:
        failures = []
        for name in _MODULES:
            try:
                module = importlib.import_module(name)
                if hasattr(module, "nixl_agent"):
                    _loaded = module
                    break
                failures.append(f"{name}: no nixl_agent")
            except ImportError as error:
                failures.append(f"{name}: {error}")
        if _loaded is None:
            _load_error = "; ".join(failures)
    if _loaded is None:
        raise NixlError(f"NIXL is not installed ({_load_error}): install it with `pip install nixl-cu13` "
                        "(CUDA 13 drivers) or `pip install nixl-cu12`; it needs no GPU for host memory")
    return _loaded


def available() -> Optional[str]:
    """None where NIXL can be loaded, else why not."""
    try:
        _nixl()
        return None
    except NixlError as error:
        return str(error)


def _ucx_tls() -> str:
    return os.environ.get("UCX_TLS", "(unset: UCX picks)")


#: What UCX needs to move device memory, and what the GPU machine's fastest runs used.
_VRAM_TLS_ADVICE = ("UCX moves device memory (VRAM) only through its CUDA transports: UCX_TLS must include "
                    "cuda_copy (and cuda_ipc between processes of one host), e.g. "
                    "UCX_TLS=cuda_copy,cuda_ipc,sm,self with params={'UCX': {'ucx_error_handling_mode': "
                    "'none'}} (these transports lack peer failure handling), or UCX_TLS unset; the nixl build "
                    "must be the one for the driver's CUDA (nixl-cu13 or nixl-cu12), and UCX_LOG_LEVEL=info "
                    "shows the transports UCX found")


def _remedy(kind: str, backend: str, call: str, memory: Iterable[str] = ()) -> str:
    """What to do about NIXL's status ``kind`` (its exception's name) from ``call``, on memory
    of the NIXL kinds ``memory`` (advice for device memory where ``"VRAM"`` is one)."""
    if "VRAM" in tuple(memory) and backend == "UCX" and call in ("register", "prepare", "post", "progress"):
        return f"{_VRAM_TLS_ADVICE} (UCX_TLS={_ucx_tls()} now)"
    if call == "create_backend":
        if kind == "nixlNotFoundError":
            return f"this nixl build has no {backend} plugin, or it could not be loaded (its libraries are missing)"
        if backend == "UCX":
            return (f"UCX could not start with UCX_TLS={_ucx_tls()}: NIXL asks UCX for peer failure handling "
                    "(ucx_error_handling_mode='peer'), which its shared-memory and CUDA transports lack; add tcp "
                    "to UCX_TLS, or unset it, or pass params={'UCX': {'ucx_error_handling_mode': 'none'}} "
                    "(no detection of a peer that dies); UCX_LOG_LEVEL=info shows what UCX found")
        return (f"the {backend} plugin would not start: GDS and GDS_MT need libcufile and a GPU, LIBFABRIC needs "
                "libfabric; NIXL's log above says which")
    if call == "register":
        return (f"{backend} would not register the memory: for a file, the storage backend must take its file "
                "system (GDS needs a cuFile-capable one, POSIX takes any); NIXL's log above says why")
    if call == "add_peer":
        return "pass the bytes of the peer's Agent.metadata() unchanged (they were refused as metadata)"
    if call == "prepare":
        if kind == "nixlNotFoundError":
            return ("no backend of this agent can reach the range: the peer's metadata is not loaded "
                    "(add_peer), the peer registered no memory holding the range (or dropped it), or no backend "
                    "both agents have moves these kinds of memory")
        return "the two ranges must be of the same size and of kinds the backend moves"
    if call == "post" or call == "progress":
        if kind == "nixlRemoteDisconnectError":
            return "the peer went away during the transfer; the destination's bytes are undefined: send them again"
        return (f"the transfer failed in {backend} (UCX_TLS={_ucx_tls()}); a transport may refuse the memory kind "
                "or the peer may have gone: the destination's bytes are undefined; UCX_LOG_LEVEL=info says more")
    return "NIXL's log above says why"


def _wrap(error: BaseException, backend: str, call: str, what: str, memory: Iterable[str] = ()) -> NixlError:
    kind = type(error).__name__
    return NixlError(f"NIXL {backend}: {what} failed ({kind}: {error}); {_remedy(kind, backend, call, memory)}")
