"""``hetmem.load``: safetensors checkpoints into one allocation, as tensors that are views of it.

The bytes move in the native half (``_native.load_checkpoint``: the library's ``FileStream``,
what ``hetmem load`` runs), with the interpreter released; here the allocation's tensors get
their dtypes and shapes, as PyTorch tensors where PyTorch is importable.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from . import Buffer, DeviceView, HetmemError, bfloat16, cuda_device as _cuda_device, device as _default_device

PathLike = Union[str, "os.PathLike[str]"]

# Each safetensors dtype: the NumPy dtype of its host views (the raw bits where NumPy has no
# such type: BF16 as hetmem's bfloat16, whose DLPack export is bfloat16; F8 as uint8).
_VIEW_DTYPES: Dict[str, Any] = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": bfloat16, "C64": np.complex64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8,
}

# Each safetensors dtype: the name of its PyTorch dtype.
_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "C64": "complex64",
                 "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
                 "U16": "uint16", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
                 "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}

#: Loads shorter than this show no progress bar when ``progress`` is left to choose.
_BAR_AFTER_SECONDS = 1.0


@dataclass(frozen=True)
class LoadReport:
    """How a ``hetmem.load`` moved its bytes.

    ``method``: ``"staged"`` or ``"staged-direct"`` (what ``"auto"`` chose, and why in
    ``auto_reason``); ``read_mode``: ``"buffered"``, ``"O_DIRECT"`` or ``"O_DIRECT and buffered"`` (small
    ranges gathered into one read go through the page cache); ``bytes`` read in
    ``seconds`` (from the first read to the last copy's completion), ``gb_per_s`` (10^9
    bytes); ``setup_seconds``: pinning the staging ring, not in the rate. ``of_link`` and
    ``of_storage``: the rate's share of the link's and the storage's rates, where they were
    given (``link_gb_per_s=``, ``storage_gb_per_s=``: ``hetmem bench`` measures both, and
    ``measure_link=True`` the link as ``hetmem load`` does).

    ``per_device``: for a load with ``device_map=``, each device's own report by its name
    (``"cpu"``, ``"cuda:0"``); the report itself then counts every device's bytes, its
    ``seconds`` are the wall time of the whole call (the devices' loads overlap, their setups
    included), ``method`` and ``read_mode`` are the devices' where they agree, else
    ``"mixed"``, and ``link_gb_per_s`` is left to the devices' reports. None otherwise.

    Example::

        report = hetmem.load("model.safetensors", measure_link=True).report
        print(f"{report.gb_per_s:.1f} GB/s by {report.method}, {report.of_link:.0%} of the link")
    """

    method: str
    read_mode: str
    bytes: int
    seconds: float
    setup_seconds: float
    gb_per_s: float
    auto_reason: Optional[str]
    direct_refused: Optional[str]
    link_gb_per_s: Optional[float] = None
    of_link: Optional[float] = None
    storage_gb_per_s: Optional[float] = None
    of_storage: Optional[float] = None
    per_device: Optional[Dict[str, "LoadReport"]] = None


class LoadedTensors(Mapping):
    """The tensors of a ``hetmem.load``: a read-only mapping, name -> tensor, each a view of one
    allocation (device memory on a GPU, host memory on the CPU backend), and ``report``.

    The tensors are PyTorch tensors where PyTorch is importable; else, on the CPU, NumPy arrays
    (``BF16`` and ``F8_*`` as their raw bits, ``uint16`` and ``uint8``) and, on a GPU, objects
    that export DLPack and the CUDA array interface (``cupy.from_dlpack(t)``). The allocation
    lives while any tensor does, or this mapping. ``hetmem.nixl``'s ``Agent.register(loaded)``
    registers the whole allocation (``VRAM_SEG`` on a GPU, ``DRAM_SEG`` on the CPU backend).

    Example::

        model.load_state_dict(hetmem.load("model.safetensors.index.json"), assign=True)
    """

    def __init__(self, tensors: Dict[str, Any], report: LoadReport, nbytes: int, where: str,
                 whole: Optional[Buffer], parts: Optional[Dict[str, "LoadedTensors"]] = None):
        self._tensors = tensors
        #: For a load with ``device_map=``: each device's own ``LoadedTensors`` (one allocation
        #: each, what ``hetmem.nixl`` registers), by device name; None otherwise.
        self.parts = parts
        # The allocation as one byte buffer: what hetmem.nixl registers (agent.register(loaded)).
        self._whole = whole
        self.report = report
        #: The allocation's size in bytes.
        self.nbytes = nbytes
        #: ``"cuda"`` or ``"cpu"``: where the allocation is (``"mixed"``: a ``device_map``
        #: load over both).
        self.device = where

    def __getitem__(self, name: str) -> Any:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        return (f"hetmem.LoadedTensors({len(self)} tensors, {self.nbytes} bytes on {self.device}, "
                f"{self.report.gb_per_s:.2f} GB/s by {self.report.method})")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _native_device(device: Any) -> Optional[_native.Device]:
    """The native device to load into: None for host memory of the CPU backend."""
    if device is None:
        chosen = _default_device()
        return chosen if chosen.backend == "cuda" else None
    if isinstance(device, bool):
        raise TypeError(f"load: device={device!r}; give 'cuda', 'cuda:N', an ordinal N or 'cpu'")
    if not isinstance(device, str) and hasattr(type(device), "__index__"):  # int, np.int64
        ordinal: Optional[int] = operator.index(device)
    else:
        text = str(device)
        if text == "cpu":
            return None
        numbered = re.fullmatch(r"cuda(?::([0-9]+))?", text)
        if numbered is None:
            raise ValueError(f"load: device={device!r}; give 'cuda' (the GPU hetmem uses), 'cuda:N', an ordinal N, "
                             "'cpu', or leave it out")
        ordinal = None if numbered.group(1) is None else int(numbered.group(1))
    if ordinal is not None and ordinal < 0:
        raise ValueError(f"load: device={device!r}; a CUDA ordinal is 0 or more")
    chosen = _default_device()
    if chosen.backend != "cuda":
        raise HetmemError(f"load: device={device!r} but no GPU can be used ({chosen.fallback_reason}); "
                          "load to device='cpu', or leave device out to take what there is")
    if ordinal is None or ordinal == chosen.ordinal:
        return chosen
    return _cuda_device(ordinal)


def _sources(source: Union[PathLike, Iterable[PathLike]]) -> List[str]:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    sources = [os.fspath(path) for path in source]
    if not sources:
        raise ValueError("load: an empty list of files; give a .safetensors file, a list of them, or an index")
    return sources


def _prefixes(prefix: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    if prefix is None:
        return None
    if isinstance(prefix, str):
        return [prefix]
    return [str(each) for each in prefix]


class _Progress:
    """The ``progress`` callback: a tqdm bar (made once a load has run past a second, where
    tqdm is installed), or the caller's function."""

    def __init__(self, progress: Any):
        self._bar: Any = None
        self._calls = 0
        self._user: Optional[Callable[[int, int], Any]] = progress if callable(progress) else None
        self._tqdm: Any = None
        if self._user is None and progress is not False:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            self._tqdm = tqdm

    @property
    def wanted(self) -> bool:
        return self._user is not None or self._tqdm is not None

    def __call__(self, done: int, total: int) -> None:
        if self._user is not None:
            self._user(done, total)
            return
        self._calls += 1
        if self._bar is None and self._calls * 0.1 >= _BAR_AFTER_SECONDS:
            self._bar = self._tqdm(total=total, initial=done, unit="B", unit_scale=True, desc="hetmem.load")
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def close(self, total: Optional[int]) -> None:
        if self._bar is not None:
            if total is not None:
                self._bar.update(total - self._bar.n)
            self._bar.close()


def _exported(whole: Buffer, dtype_name: str, shape: Sequence[int], offset: int) -> Buffer:
    """A tensor's range of the allocation (``whole``, whose hand-off state every tensor
    shares) as a hetmem Buffer (host memory) or DeviceView."""
    np_dtype = _VIEW_DTYPES.get(dtype_name)
    if np_dtype is None:
        raise HetmemError(f"load: dtype {dtype_name} has no tensor type here; load the checkpoint with safetensors")
    memory = whole._memory
    buffer = Buffer(memory, tuple(shape), np_dtype, keep=whole, offset=offset)
    return DeviceView(buffer) if memory.kind == "device" else buffer


def _torch_dtype(torch: Any, dtype_name: str) -> Any:
    target = getattr(torch, _TORCH_DTYPES.get(dtype_name, ""), None)
    if target is None:
        raise HetmemError(f"load: this PyTorch ({torch.__version__}) has no tensor type for dtype {dtype_name}; "
                          "upgrade PyTorch, or choose other tensors (names=, prefix=)")
    return target


def _views(whole: Buffer, entries: List[Tuple[str, str, List[int], int, int]]) -> Dict[str, Any]:
    """Each tensor as a view of the allocation: PyTorch tensors cut from one tensor over all of
    it (one DLPack import; a tensor whose offset its element size does not divide is imported
    on its own), else NumPy arrays (host memory) or DLPack exporters (device memory)."""
    torch = _torch()
    device = whole._memory.kind == "device"
    if torch is None:
        out = {}
        for name, dtype_name, shape, offset, _ in entries:
            exported = _exported(whole, dtype_name, shape, offset)
            out[name] = exported if device else exported.numpy()
        return out
    all_bytes = torch.from_dlpack(_exported(whole, "U8", [whole.nbytes], 0))
    out = {}
    for name, dtype_name, shape, offset, nbytes in entries:
        target = _torch_dtype(torch, dtype_name)
        if offset % target.itemsize == 0:
            out[name] = all_bytes[offset:offset + nbytes].view(target).view(tuple(shape))
        else:
            out[name] = torch.from_dlpack(_exported(whole, dtype_name, shape, offset)).view(target)
    return out


def _shard(shard: Any) -> Optional[Tuple[int, int, int]]:
    """``shard=`` checked: three ints, rank in 0..world-1, world >= 1, dim >= 0."""
    if shard is None:
        return None
    try:
        rank, world, dim = (operator.index(each) for each in shard)
    except (TypeError, ValueError):
        raise ValueError(f"load: shard={shard!r}; give (rank, world, dim), three ints, e.g. shard=(0, 2, 0)") from None
    if world < 1:
        raise ValueError(f"load: shard world {world}; give the number of ranks, at least 1")
    if not 0 <= rank < world:
        raise ValueError(f"load: shard rank {rank} of a world of {world}; ranks count from 0 to {world - 1}")
    if dim < 0:
        raise ValueError(f"load: shard dim {dim}; give the dimension counted from the front (0 for rows)")
    return rank, world, dim


# The floating types dtype= may cast to, by the names it takes.
_CAST_NAMES = ("float64", "float32", "float16", "bfloat16")


def _cast_target(torch: Any, dtype: Any) -> Any:
    """``dtype=`` as a floating torch dtype."""
    target = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(target, torch.dtype):
        raise ValueError(f"load: dtype={dtype!r}; give a torch dtype or one of {', '.join(_CAST_NAMES)}")
    if not target.is_floating_point or target.itemsize < 2:
        raise ValueError(f"load: dtype={dtype!r} is not a floating type safetensors tensors can be cast to; "
                         f"give one of {', '.join(_CAST_NAMES)} (integer tensors are never cast)")
    return target


def _casts(tensor: Any) -> bool:
    """Whether dtype= and into= cast this tensor: floating ones (float8 too); integer, bool
    and complex ones are left as they are."""
    return tensor.dtype.is_floating_point


def _synchronized(torch: Any, tensors: Iterable[Any]) -> None:
    """Waits for PyTorch's copies out of the load's allocation before it may be released: the
    current stream of every CUDA device among ``tensors`` (the copies' sources and targets),
    not only of the device that is current, which may be another (``torch.cuda.set_device``):
    a copy still running there would read the allocation after it was freed."""
    devices = {tensor.device for tensor in tensors if tensor.is_cuda}
    for device in sorted(devices, key=str):
        torch.cuda.current_stream(device).synchronize()


def _cast(torch: Any, tensors: Dict[str, Any], target: Any) -> Tuple[Dict[str, Any], int]:
    """Every tensor in one new allocation on the same device, floating ones cast to `target`
    (in one pass of copies), so the load's allocation is released once the caller drops it."""
    layout, total = {}, 0
    for name, tensor in tensors.items():
        dtype = target if _casts(tensor) else tensor.dtype
        total = -(-total // 256) * 256
        layout[name] = (dtype, total)
        total += tensor.numel() * dtype.itemsize
    some = next(iter(tensors.values()), None)
    whole = torch.empty(max(total, 1), dtype=torch.uint8, device=some.device if some is not None else "cpu")
    out = {}
    for name, tensor in tensors.items():
        dtype, offset = layout[name]
        view = whole[offset:offset + tensor.numel() * dtype.itemsize].view(dtype).view(tensor.shape)
        view.copy_(tensor)
        out[name] = view
    _synchronized(torch, [*tensors.values(), *out.values()])
    return out, max(total, 1)


def _into(torch: Any, tensors: Dict[str, Any], into: Mapping) -> Dict[str, Any]:
    """The loaded tensors copied into the caller's, every shape and dtype checked first."""
    for name, tensor in tensors.items():
        if name not in into:
            raise ValueError(f"load: tensor {name!r} is in the files but not in into=; add it to into=, or leave "
                             "it out of the load with names= or prefix=")
        given = into[name]
        if not isinstance(given, torch.Tensor):
            raise TypeError(f"load: into[{name!r}] is a {type(given).__name__}, not a torch tensor")
        if tuple(given.shape) != tuple(tensor.shape):
            raise ValueError(f"load: tensor {name!r} has shape {tuple(tensor.shape)} in the files (this shard's "
                             f"where shard= is given), but into= has {tuple(given.shape)}; give a tensor of that "
                             "shape, or check the shard")
        if given.dtype != tensor.dtype and not (_casts(tensor) and given.dtype.is_floating_point):
            raise ValueError(f"load: tensor {name!r} is {tensor.dtype} in the files but {given.dtype} in into=; "
                             "only floating tensors are cast: give a tensor of the file's dtype")
    with torch.no_grad():
        for name, tensor in tensors.items():
            into[name].copy_(tensor)
    _synchronized(torch, [*tensors.values(), *(into[name] for name in tensors)])
    return {name: into[name] for name in tensors}


def _into_device(torch: Any, into: Any) -> str:
    """Where to load for into= when device= is left out: the GPU if a tensor there is on one."""
    return "cuda" if any(getattr(t, "is_cuda", False) for t in into.values()) else "cpu"


def load(source: Union[PathLike, Iterable[PathLike]], device: Any = None, *,
         device_map: Union[None, str, Mapping[str, Any]] = None, names: Optional[Iterable[str]] = None,
         prefix: Union[None, str, Sequence[str]] = None,
         dtype: Any = None, into: Any = None, shard: Optional[Tuple[int, int, int]] = None,
         method: str = "auto", threads: Optional[int] = None, chunk_bytes: Optional[int] = None,
         progress: Any = None, link_gb_per_s: Optional[float] = None, measure_link: bool = False,
         storage_gb_per_s: Optional[float] = None) -> LoadedTensors:
    """Loads safetensors tensors into one allocation and returns them as views of it.

    ``source``: a ``.safetensors`` file, a list of them (the shards of one model), or a sharded
    checkpoint's ``model.safetensors.index.json`` (its shards found beside it). ``device``:
    ``"cuda"`` (device memory of the GPU hetmem uses, ``hetmem.device()``), ``"cuda:N"`` or
    ``N`` (CUDA device N; a ``torch.device`` names one too), ``"cpu"`` (host memory), or None:
    the GPU where hetmem has one.
    ``names``: only these tensors (each must exist); ``prefix``: only the tensors whose names
    start with it (a string or several). ``method``: ``"auto"`` (by how much of the files the
    page cache holds), ``"staged"`` (through the page cache) or ``"staged-direct"``
    (``O_DIRECT``); ``threads`` and ``chunk_bytes`` as for ``hetmem load``. ``progress``: a
    tqdm bar on loads longer than a second where tqdm is installed (None), none (False), or a
    function called with ``(bytes_done, bytes_total)`` about every 100 ms. The interpreter is
    released while the bytes move. ``report.of_link`` and ``report.of_storage`` are the rate's
    shares of ``link_gb_per_s`` and ``storage_gb_per_s`` where given; ``measure_link=True``
    measures the link first, as ``hetmem load`` does (a few tenths of a second, not in the
    rate; nothing on the CPU backend).

    ``shard=(rank, world, dim)``: a tensor-parallel slice. Each tensor with ``dim + 1``
    dimensions or more is cut to ``torch.chunk(tensor, world, dim)[rank]``: chunks of
    ``ceil(size / world)``, so where ``world`` does not divide the size the last ranks get less
    (and a rank past the end an empty slice); only the slice's bytes are read from the files
    (one range per tensor along ``dim=0``, one per index of the earlier dimensions along a later
    one), and ``report.bytes`` counts them. A tensor with fewer dimensions (a scalar; a 1-D bias
    when ``dim=1``) is loaded whole by every rank. A rank or world out of range, or a negative
    dim, raises ``ValueError``.

    ``dtype=``: floating tensors (float8 among them) cast to this floating type (a torch dtype,
    or ``"bfloat16"``, ``"float16"``, ``"float32"``, ``"float64"``); integer, bool and complex
    tensors are left as they are. Needs PyTorch. The cast runs on the tensors' device after the
    load, in one pass into one new allocation, and the load's allocation is then released: for
    the while of the cast both are held (the files' size plus the cast's).

    ``into=``: a mapping name -> existing torch tensor (``dict(model.named_parameters())``,
    ``model.state_dict()``) that the bytes land in (``copy_`` under ``torch.no_grad``); the
    result maps each loaded name to the given tensor. Every tensor loaded must be in ``into``
    (leave others out with ``names=`` or ``prefix=``) with the same shape (the slice's, with
    ``shard=``), and its dtype, or any floating dtype for a floating tensor (cast as ``dtype=``
    would); everything is checked before anything is copied, so an error leaves ``into``
    unchanged. Tensors of ``into`` that the files do not hold are left as they are. With
    ``device`` left out, the load goes to the GPU when one of ``into``'s tensors is on it;
    ``nbytes`` and ``device`` then describe the given tensors. ``into=`` and ``dtype=`` do not
    go together (the given tensors' dtypes decide).

    ``device_map=``: the tensors spread over several devices, instead of ``device=`` (give one
    of the two). A dict maps tensor names or name prefixes to devices (``"cuda"``,
    ``"cuda:1"``, ``1``, a ``torch.device``, ``"cpu"``), as accelerate's and transformers'
    device maps do: a key covers the tensor of that name, the names under it (``"layers.1"``
    covers ``"layers.1.w"``, not ``"layers.10.w"``), or, ending with ``.``, every name that
    starts with it; the longest key covering a tensor wins, and ``""`` covers every tensor (the
    default). A tensor no key covers raises ``ValueError`` naming it. ``"balanced"``: the
    tensors in the files' order cut into contiguous runs of about equal bytes, one per CUDA
    device present (``hetmem.cuda_devices()``); without a GPU it raises
    ``HetmemError`` (load with ``device="cpu"`` instead). ``names=``, ``prefix=`` and
    ``shard=`` choose the tensors first, then the map places them. One load per device runs
    on a thread of its own, at the same time (each releases the interpreter while its bytes
    move), each reading only its tensors' bytes, so every byte of the files is read once; each
    device's tensors are views of one allocation there (``loaded.parts[device]``), and
    ``dtype=`` casts on each device. ``report.per_device`` holds each device's report. If any
    device's load fails, its error is raised and nothing is returned. ``into=`` does not go
    with ``device_map=`` (the given tensors already fix the devices).

    A malformed or truncated file, a missing shard, a tensor in two files, or a name or prefix
    that matches nothing raises (``HetmemError`` or ``ValueError``) naming the file, the tensor
    and a remedy; nothing is returned unless every tensor arrived.

    Example::

        import torch, hetmem
        weights = hetmem.load("llama/model.safetensors.index.json", device="cuda")
        print(weights.report.gb_per_s, weights.report.method)
        model.load_state_dict(weights, assign=True)

        # Rank 1 of 2: column slices, cast to bfloat16, into the model's own parameters.
        half = hetmem.load("model.safetensors", device="cuda", shard=(1, 2, 1), dtype="bfloat16")
        hetmem.load("model.safetensors", into=dict(model.named_parameters()), prefix="layers.")

        # The embedding and the first layers on the GPU, the rest in host memory.
        spread = hetmem.load("model.safetensors", device_map={"embed": "cuda:0", "layers.0.": "cuda:1", "": "cpu"})
        print({device: r.gb_per_s for device, r in spread.report.per_device.items()})
    """
    if device_map is not None:
        if device is not None:
            raise ValueError("hetmem.load: give device= or device_map=, not both (device_map's \"\" key sets the "
                             "default device)")
        if into is not None:
            raise ValueError("hetmem.load: into= and device_map= do not go together: into='s tensors already fix "
                             "the devices; leave device_map out")
        from ._device_map import load_mapped

        return load_mapped(source, device_map, names=names, prefix=prefix, shard=shard, progress=progress,
                           storage_gb_per_s=storage_gb_per_s, dtype=dtype, method=method, threads=threads,
                           chunk_bytes=chunk_bytes, link_gb_per_s=link_gb_per_s, measure_link=measure_link)
    shard = _shard(shard)
    torch = _torch() if dtype is not None or into is not None else None
    for option, value in (("dtype", dtype), ("into", into)):
        if value is not None and torch is None:
            raise HetmemError(f"hetmem.load: {option}= needs PyTorch, which is not importable here; install torch, "
                              f"or load without {option}= and convert the arrays yourself")
    if dtype is not None and into is not None:
        raise ValueError("hetmem.load: give dtype= or into=, not both (into='s tensors' dtypes decide the cast)")
    cast_to = _cast_target(torch, dtype) if dtype is not None else None
    if into is not None:
        if not isinstance(into, Mapping):
            raise TypeError(f"hetmem.load: into= is a {type(into).__name__}; give a mapping name -> torch tensor, "
                            "e.g. dict(model.named_parameters())")
        if device is None:
            device = _into_device(torch, into)
    if names is not None and prefix is not None:
        raise ValueError("hetmem.load: give names= or prefix=, not both")
    if isinstance(names, str):
        raise TypeError("hetmem.load: names= is a list of tensor names, not one string (for one, give [name])")
    target = _native_device(device)
    if measure_link and link_gb_per_s is None and target is not None:
        link_gb_per_s = _native.link_h2d_gb_per_s(target)
    reporter = _Progress(progress)
    try:
        loaded = _native.load_checkpoint(
            target, _sources(source), names=None if names is None else list(names),
            prefixes=_prefixes(prefix), method=method, threads=threads, chunk_bytes=chunk_bytes,
            progress=reporter if reporter.wanted else None, shard=shard)
    except BaseException:
        reporter.close(None)
        raise
    raw = loaded.report
    reporter.close(raw["bytes"])
    rate = raw["gb_per_s"]
    report = LoadReport(
        **raw, link_gb_per_s=link_gb_per_s, of_link=rate / link_gb_per_s if link_gb_per_s else None,
        storage_gb_per_s=storage_gb_per_s, of_storage=rate / storage_gb_per_s if storage_gb_per_s else None)
    memory = loaded.memory
    # The whole allocation as one buffer, whose hand-off state (lent to, or read by, a NIXL
    # transfer) every tensor's view shares; hetmem.nixl registers it (agent.register(loaded)).
    whole = Buffer(memory, (memory.nbytes,), np.uint8)
    tensors = _views(whole, loaded.tensors)
    where, nbytes = "cuda" if memory.kind == "device" else "cpu", memory.nbytes
    del memory, loaded
    if cast_to is not None:
        tensors, nbytes = _cast(torch, tensors, cast_to)
        whole = None  # the cast's tensors live in a new allocation, not in the loaded one
    elif into is not None:
        tensors = _into(torch, tensors, into)
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
        where = "cuda" if any(tensor.is_cuda for tensor in tensors.values()) else "cpu"
        whole = None  # the bytes now live in the caller's tensors
    return LoadedTensors(tensors, report, nbytes, where, whole)
