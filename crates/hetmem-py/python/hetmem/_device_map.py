"""``hetmem.load(..., device_map=...)``: one checkpoint spread over several devices.

The chosen tensors are planned once (``_native.plan_checkpoint``: names, sizes and file order,
no tensor bytes read), each is given its device, and one ``hetmem.load`` per device runs on a
thread of its own: each load releases the interpreter while its bytes move, so the devices'
copies overlap, and every file byte is read by exactly one of them.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import HetmemError, _native
from . import device as _default_device
from ._load import LoadedTensors, LoadReport, _native_device, _prefixes, _Progress, _shard, _sources, load


def device_key(value: Any, where: str) -> str:
    """A device_map value as the place it names, ``"cpu"`` or ``"cuda:N"``, checked as
    ``hetmem.load(device=...)`` checks its device; ``where`` names the entry in errors."""
    if value is None or isinstance(value, bool):
        raise ValueError(f"load: device_map{where} is {value!r}; give a device: 'cuda', 'cuda:N', N or 'cpu'")
    try:
        chosen = _native_device(value)
    except (ValueError, HetmemError) as error:
        raise type(error)(f"device_map{where}: {error}") from None
    return "cpu" if chosen is None else f"cuda:{chosen.ordinal}"


def matches(key: str, name: str) -> bool:
    """Whether a device_map key covers a tensor: ``""`` covers every tensor; else the key is
    the name, or a leading part of it ending at a ``.`` (``"layers.1"`` covers
    ``"layers.1.w"`` but not ``"layers.10.w"``, as accelerate's module names do), or a
    prefix that itself ends with ``.``."""
    if not name.startswith(key):
        return False
    return key == "" or key.endswith(".") or len(name) == len(key) or name[len(key)] == "."


def assign(names: Sequence[str], device_map: Mapping[Any, Any]) -> Dict[str, str]:
    """Each tensor's device key by the longest key of ``device_map`` that covers it."""
    keys: List[Tuple[str, str]] = []
    for key, value in device_map.items():
        if not isinstance(key, str):
            raise TypeError(f"load: device_map key {key!r} is a {type(key).__name__}; keys are tensor names or "
                            "name prefixes (strings; \"\" for the default)")
        keys.append((key, device_key(value, f"[{key!r}]")))
    keys.sort(key=lambda entry: len(entry[0]), reverse=True)
    placed = {}
    for name in names:
        place = next((where for key, where in keys if matches(key, name)), None)
        if place is None:
            raise ValueError(f"load: tensor {name!r} is not in device_map; map it (its name or a prefix of it), or "
                             "add a default: device_map={..., \"\": \"cpu\"}")
        placed[name] = place
    return placed


def balanced(tensors: Sequence[Tuple[str, int]], devices: Sequence[str]) -> Dict[str, str]:
    """``tensors`` (name, nbytes), in file order, cut into one contiguous run per device of
    about equal bytes: a tensor goes to the device whose share holds its middle byte (the
    library's own rule, ``hetmem::data::balanced_devices``)."""
    indices = _native.balanced_devices([nbytes for _, nbytes in tensors], len(devices))
    return {name: devices[index] for (name, _), index in zip(tensors, indices)}


def _cuda_devices() -> List[str]:
    """The CUDA devices ``"balanced"`` spreads over: every one present (as
    ``CUDA_VISIBLE_DEVICES`` numbers them)."""
    chosen = _default_device()
    if chosen.backend != "cuda":
        raise HetmemError(f"load: device_map=\"balanced\" spreads tensors over CUDA devices, and none can be used "
                          f"({chosen.fallback_reason}); load with device=\"cpu\", or give a dict device_map")
    return [f"cuda:{ordinal}" for ordinal in range(max(1, len(_native.Device.cuda_names())))]


def _agreed(values: Sequence[Optional[str]]) -> Optional[str]:
    """The value every device's report has, else ``"mixed"`` (None for no devices)."""
    if not values:
        return None
    return values[0] if len(set(values)) == 1 else "mixed"


class _LoadStopped(Exception):
    """Raised in a device's progress callback once the whole load has failed (another device's
    load, or Ctrl-C in the caller's thread, which alone hears signals): the native load then
    stops at its next piece instead of running to its end."""


class _SummedProgress:
    """One ``progress`` for all devices' loads: their bytes done summed, under a lock (the
    loads' callbacks come from several threads). Each device's load calls it about every
    100 ms, also without a progress wanted, so that a stop reaches every load."""

    def __init__(self, reporter: _Progress, total: int):
        self._reporter, self._total = reporter, total
        self._done: Dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def for_device(self, key: str) -> Callable[[int, int], None]:
        def report(done: int, _total: int) -> None:
            with self._lock:
                if self._stopped:
                    raise _LoadStopped()
                self._done[key] = done
                if self._reporter.wanted:
                    self._reporter(sum(self._done.values()), self._total)
        return report

    def stop(self) -> None:
        """No more reports, and every load still running stops at its next call: the load has
        failed."""
        with self._lock:
            self._stopped = True


def _raise_first_failure(futures: Mapping[str, Any]) -> None:
    """Raises the error of the first failed load among those ended, in the order the devices
    were mapped."""
    for future in futures.values():
        if future.done() and not future.cancelled() and future.exception() is not None:
            future.result()


def _cancel(futures: Mapping[str, Any]) -> None:
    """Cancels the loads not yet started."""
    for future in futures.values():
        future.cancel()


def load_mapped(source: Any, device_map: Any, *, names: Any, prefix: Any, shard: Any, progress: Any,
                storage_gb_per_s: Optional[float], **options: Any) -> LoadedTensors:
    """``hetmem.load`` with ``device_map``: see its docstring."""
    began = time.perf_counter()
    if names is not None and prefix is not None:
        raise ValueError("hetmem.load: give names= or prefix=, not both")
    if isinstance(names, str):
        raise TypeError("hetmem.load: names= is a list of tensor names, not one string (for one, give [name])")
    shard = _shard(shard)
    # Once: a generator of paths would be used up by the plan, and each device's load reads
    # the same list.
    sources = _sources(source)
    names = None if names is None else list(names)
    planned = _native.plan_checkpoint(sources, names=names, prefixes=_prefixes(prefix), shard=shard)
    if isinstance(device_map, str):
        if device_map != "balanced":
            raise ValueError(f"load: device_map={device_map!r}; give a dict name or prefix -> device, or "
                             "\"balanced\"")
        placed = balanced([(name, nbytes) for name, nbytes, _ in planned], _cuda_devices())
    elif isinstance(device_map, Mapping):
        placed = assign([name for name, _, _ in planned], device_map)
    else:
        raise TypeError(f"load: device_map is a {type(device_map).__name__}; give a dict name or prefix -> device, "
                        "or \"balanced\"")
    groups: Dict[str, List[str]] = {}
    for name, _, _ in planned:  # file order, so each device's names stay in the files' order
        groups.setdefault(placed[name], []).append(name)
    reporter = _Progress(progress)
    summed = _SummedProgress(reporter, sum(nbytes for _, nbytes, _ in planned))
    pool = ThreadPoolExecutor(max_workers=max(1, len(groups)), thread_name_prefix="hetmem.load")
    futures: Dict[str, Any] = {}
    try:
        for key, group in groups.items():
            futures[key] = pool.submit(load, sources, device=key, names=group, shard=shard,
                                       progress=summed.for_device(key), storage_gb_per_s=storage_gb_per_s,
                                       **options)
        # Waiting for the first failure, whichever device's: the others are stopped then (the
        # handler below), not waited out.
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        _raise_first_failure(futures)
        parts = {key: future.result() for key, future in futures.items()}
    except BaseException:
        try:
            # The other devices' loads stop at their next progress call (within about 100
            # ms), rather than reading to their end first, and have ended before the error
            # goes up (no progress call after it).
            summed.stop()
            _cancel(futures)
            pool.shutdown(wait=True)
        finally:
            # Their tensors are let go now, not kept by this frame for as long as the caller
            # keeps the exception's traceback (no name here holds a future: the loops over
            # them run in functions of their own).
            futures.clear()
            reporter.close(None)
        raise
    pool.shutdown(wait=True)
    seconds = time.perf_counter() - began
    total = sum(part.report.bytes for part in parts.values())
    reporter.close(total)
    reports = {key: part.report for key, part in parts.items()}
    rate = total / seconds / 1e9 if seconds > 0 and total else 0.0
    report = LoadReport(
        method=_agreed([each.method for each in reports.values()]) or "staged",
        read_mode=_agreed([each.read_mode for each in reports.values()]) or "buffered",
        bytes=total, seconds=seconds,
        setup_seconds=max((each.setup_seconds for each in reports.values()), default=0.0),
        gb_per_s=rate, auto_reason=None, direct_refused=None,
        storage_gb_per_s=storage_gb_per_s, of_storage=rate / storage_gb_per_s if storage_gb_per_s else None,
        per_device=reports)
    tensors = {name: parts[placed[name]][name] for name in sorted(placed)}
    places = {key.split(":")[0] for key in parts}
    where = places.pop() if len(places) == 1 else "mixed"
    return LoadedTensors(tensors, report, sum(part.nbytes for part in parts.values()), where, None, parts=parts)
