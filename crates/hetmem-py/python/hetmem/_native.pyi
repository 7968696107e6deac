"""Type stubs of hetmem's native module (the Rust half; see hetmem/__init__.py for the API)."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

page_size: int

class HetmemError(RuntimeError):
    """An error of the hetmem library; its message names the cause and a remedy."""

class Device:
    """CUDA device 0, or the CPU backend where no GPU can be used."""
    @staticmethod
    def open_best() -> Device: ...
    @property
    def backend(self) -> str: ...
    @property
    def ordinal(self) -> Optional[int]: ...
    @property
    def name(self) -> str: ...
    @property
    def fallback_reason(self) -> Optional[str]: ...
    def synchronize(self) -> None: ...

class Memory:
    """Bytes of memory hetmem holds (pinned, registered, a file window, or a device allocation
    of ``load_checkpoint``); its release waits for the GPU work that may still use it."""
    @property
    def host_ptr(self) -> Optional[int]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device_ptr(self) -> Optional[int]: ...
    @property
    def device_ordinal(self) -> Optional[int]: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def kind(self) -> str: ...

class View:
    """A typed range of a Memory, fixed when made, that exports the array interfaces (the base
    of hetmem.Buffer and hetmem.DeviceView)."""
    def __new__(cls, memory: Memory, shape: Sequence[int], dtype: Any, offset: Optional[int] = None) -> View: ...
    @property
    def _memory(self) -> Memory: ...
    @property
    def _offset(self) -> int: ...
    @property
    def _shape(self) -> Tuple[int, ...]: ...
    @property
    def _dtype(self) -> Any: ...
    def _host_interface(self) -> Dict[str, Any]: ...
    def _device_interface(self) -> Dict[str, Any]: ...

class WindowedFile:
    """A file whose byte ranges are mapped and registered on demand."""
    def __init__(self, device: Device, path: str, writable: bool = False) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def writable(self) -> bool: ...
    def window(self, offset: int, nbytes: int, writable: bool = False,
               unflagged_device_view: bool = False) -> Memory: ...

class PinnedPool:
    """Pinned host memory reused within a byte budget."""
    def __init__(self, device: Device, budget_bytes: int) -> None: ...
    def acquire(self, nbytes: int, mapped: bool = True, portable: bool = False,
                write_combined: bool = False) -> Memory: ...
    def stats(self) -> Dict[str, int]: ...
    def trim(self) -> None: ...

class Stream:
    """A CUDA stream of hetmem's; its handle goes to torch/cupy ExternalStream."""
    def __init__(self, device: Device) -> None: ...
    @property
    def handle(self) -> int: ...
    @property
    def device_ordinal(self) -> int: ...
    def __cuda_stream__(self) -> Tuple[int, int]: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...

class TensorInfo:
    """What a DLPack capsule describes, read without consuming it."""
    address: int
    device_type: int
    device_id: int
    shape: List[int]
    strides: Optional[List[int]]
    code: int
    bits: int
    lanes: int
    readonly: bool

def pinned(device: Device, nbytes: int, mapped: bool = True, portable: bool = False,
           write_combined: bool = False) -> Memory: ...
def register(device: Device, owner: Any, mapped: bool = True,
             portable: bool = False) -> Tuple[Memory, TensorInfo]: ...
def capsule(memory: Memory, offset: int, shape: List[int], code: int, bits: int, *, cuda: bool = False,
            versioned: bool = False, stream: Optional[int] = None,
            unflagged_readonly: bool = False) -> Any: ...
def tensor_info(capsule: Any) -> TensorInfo: ...
def prepare_batch(records: Memory, record_shape: Tuple[int, int, int], indices: List[int],
                  origins: List[Tuple[int, int]], flips: List[bool], crop_shape: Tuple[int, int],
                  scale: List[float], shift: List[float], out: Memory, element: str) -> None: ...
def gather_records(records: Memory, record_bytes: int, indices: List[int], out: Memory) -> None:
    """Copies record ``indices[i]`` of ``records`` to record ``i`` of ``out``; a truncation of a
    window's file while it runs raises HetmemError."""

def check_file(memory: Memory) -> None:
    """Raises HetmemError when ``memory`` is a window its file no longer holds."""

class LoadedCheckpoint:
    """A checkpoint loaded into one allocation (``memory``), and each tensor's place in it."""
    @property
    def memory(self) -> Memory: ...
    @property
    def tensors(self) -> List[Tuple[str, str, List[int], int, int]]:
        """``(name, dtype, shape, offset, nbytes)`` for each tensor, by name."""
    @property
    def report(self) -> Dict[str, Any]:
        """method, read_mode, bytes, seconds, setup_seconds, gb_per_s, auto_reason, direct_refused."""

def load_checkpoint(device: Optional[Device], sources: List[str], *, names: Optional[List[str]] = None,
                    prefixes: Optional[List[str]] = None, method: str = "auto", threads: Optional[int] = None,
                    chunk_bytes: Optional[int] = None,
                    progress: Optional[Callable[[int, int], Any]] = None) -> LoadedCheckpoint:
    """Loads the safetensors files (or the one index) ``sources`` names into one allocation of
    ``device`` (host memory of the CPU backend where None), with the interpreter released.

    Example::

        loaded = load_checkpoint(hetmem.device(), ["model.safetensors"], prefixes=["layers.0."])
        for name, dtype, shape, offset, nbytes in loaded.tensors: ...
    """

def link_h2d_gb_per_s(device: Device) -> Optional[float]:
    """The link's host-to-device rate as ``hetmem load`` measures it (GB/s), None on the CPU backend."""

def doctor_json(device: Device) -> str:
    """The report ``hetmem doctor`` gathers on this machine, as JSON (``hetmem.doctor()`` parses it)."""
