//! hetmem's one error type, and the remedies it offers.
//!
//! Every failure names what failed and, where a user can act on it, what to do. CUDA driver
//! failures keep the call, the `CUresult` name and the driver's description; NVRTC compile
//! failures keep the compiler's log.

use std::fmt;

use crate::backend::BackendKind;

/// The result type of every fallible hetmem function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in hetmem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// NVRTC, the run-time CUDA compiler, failed or is missing.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A backend was asked for (through `HETMEM_BACKEND` or the API) but cannot run here.
    #[error(
        "the {requested} backend was requested but cannot run here: {reason}; remedy: {}; \
         or unset HETMEM_BACKEND (`--backend auto`) to fall back to the CPU",
        reason.remedy()
    )]
    BackendUnavailable {
        /// The backend that was asked for.
        requested: BackendKind,
        /// Why it cannot run.
        reason: Unavailable,
    },
    /// `HETMEM_BACKEND` (or a `--backend` option) named no known backend.
    #[error("unknown backend {0:?}: expected one of `auto`, `cpu`, `cuda`")]
    UnknownBackend(String),
    /// An argument was out of range or inconsistent (a size, an alignment, a device index).
    /// Run-time states a caller may need to tell apart have variants of their own
    /// ([`Error::FrameMemoryLost`], [`Error::DoorbellStopped`], [`Error::FlagNeverArrived`],
    /// [`Error::LentToGpu`], ...).
    #[error("invalid {what}: {problem}")]
    InvalidArgument {
        /// The argument or object that was wrong.
        what: &'static str,
        /// What was wrong with it, and what would be accepted.
        problem: String,
    },
    /// A pinned pool's budget is taken by buffers still in use.
    #[error(
        "the pinned pool cannot pin {requested} more bytes: {in_use} of its {budget}-byte budget are \
         in use; remedy: raise the budget or release buffers sooner"
    )]
    PoolExhausted {
        /// Bytes asked for (rounded to the size class).
        requested: usize,
        /// Bytes in buffers handed out.
        in_use: usize,
        /// The pool's budget.
        budget: usize,
    },
    /// A non-blocking call found that it would have to wait: a full frame ring, an empty one,
    /// a frame still on the GPU, a full doorbell queue. Try again later, or use the blocking
    /// call.
    #[error("{0} would block")]
    WouldBlock(&'static str),
    /// A frame ring was closed: it takes no more frames, and every frame it took has come out.
    #[error("the frame ring is closed")]
    RingClosed,
    /// A frame of a stream failed; frames before it came out intact.
    #[error("frame {index} (counting from 0) failed: {source}")]
    FrameFailed {
        /// The failed frame's index in the stream.
        index: u64,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
    /// A doorbell request got no reply in time: the persistent kernel is hung or gone.
    #[error(
        "doorbell request {sequence} got no reply within {timeout:?}: the persistent kernel is hung \
         or has stopped; remedy: check the GPU with `nvidia-smi`, raise the watchdog timeout if the \
         GPU is busy with other work, or restart the process"
    )]
    DoorbellTimeout {
        /// The request's sequence number.
        sequence: u64,
        /// The watchdog's timeout.
        timeout: std::time::Duration,
    },
    /// A doorbell's persistent kernel did not stop when asked: its memory is leaked, since
    /// freeing it would wait for the kernel for ever.
    #[error(
        "the doorbell kernel did not stop within {timeout:?}; its memory is leaked; remedy: \
         restart the process (the driver reclaims the GPU when it exits)"
    )]
    DoorbellStuck {
        /// How long shutdown waited.
        timeout: std::time::Duration,
    },
    /// A doorbell no longer serves requests: it was shut down, its server ended without being
    /// asked to, or its CPU thread panicked. Its tickets and submissions fail this way from
    /// then on; start a new doorbell.
    #[error("{cause}")]
    DoorbellStopped {
        /// Why it stopped, with the remedy.
        cause: DoorbellStop,
    },
    /// A doorbell's server replied with a status the library does not expect: the two sides of
    /// the protocol disagree, a bug in hetmem.
    #[error(
        "doorbell request {sequence} {}; the kernel and the library disagree on the doorbell \
         protocol, a bug in hetmem; remedy: shut the doorbell down and start a new one, and \
         report the bug",
        bad_reply(*status)
    )]
    DoorbellBadReply {
        /// The request's sequence number.
        sequence: u64,
        /// The status word the server wrote.
        status: u32,
    },
    /// A frame ring's slot or a frame filter lost its memory to a frame that failed earlier:
    /// the GPU work on it could not be waited for (its context is likely lost), or failed
    /// part-way, so hetmem gave the memory up rather than risk freeing it under the GPU. The
    /// ring or filter cannot run frames there any more.
    #[error(
        "{} lost to an earlier failed frame{}: the GPU work on it failed, so hetmem gave it \
         up rather than free it under the GPU; remedy: make a new {} (and a new process if the \
         failure lost the GPU's context: see that frame's error)",
        holder.memory(),
        frame.map_or(String::new(), |index| format!(" (frame {index})")),
        holder.remedy()
    )]
    FrameMemoryLost {
        /// Whose memory it was.
        holder: FrameMemoryHolder,
        /// The frame whose failure lost it, where it is known.
        frame: Option<u64>,
    },
    /// A flag fence's stream finished, yet the value it writes into mapped host memory never
    /// became visible to the CPU: the platform does not deliver the stream's memory writes.
    #[error(
        "the stream of a flag fence finished but its flag (value {target}) never arrived in host \
         memory; remedy: use FenceKind::Event on this machine (`hetmem doctor` shows whether \
         mapped memory works here)"
    )]
    FlagNeverArrived {
        /// The value the stream should have written.
        target: u32,
    },
    /// hetmem's CPU path was given a buffer that is lent to GPU work: a lease of a queue on a
    /// GPU, passed to an operation on a CPU-backend queue. The CPU must not touch it until the
    /// lease is reclaimed.
    #[error(
        "the CPU cannot touch this buffer: it is lent to GPU work on CUDA device {device}; \
         remedy: reclaim the lease first, or pass leases of the queue the operation runs on"
    )]
    LentToGpu {
        /// The ordinal of the GPU whose queue holds the lease.
        device: usize,
    },
    /// A measurement's check failed: what the GPU (or a copy) produced differs from what the
    /// CPU computes, so the measurement is void.
    #[error(
        "{what} differs from the CPU's result: {detail}; the measurement is void; remedy: run \
         again, and if it repeats, run `hetmem doctor` and the program under compute-sanitizer \
         (a repeatable difference is a bug: please report it)"
    )]
    ResultMismatch {
        /// What was checked.
        what: &'static str,
        /// Where the first difference is, and the values.
        detail: String,
    },
    /// One cell of the link benchmark (a path at a size) failed.
    #[error("the link benchmark's {path} cell at {bytes} bytes failed: {source}")]
    BenchCellFailed {
        /// The path measured.
        path: &'static str,
        /// The transfer size.
        bytes: usize,
        /// Why it failed.
        #[source]
        source: Box<Error>,
    },
    /// A device selection (`--devices`) names GPUs this machine does not have.
    #[error("GPU {asked} asked for, but the GPUs present are: {present}")]
    NoSuchDevices {
        /// The ordinals asked for that are missing, or `all`.
        asked: String,
        /// The GPUs present, `0 (NVIDIA H200), ...`, or `none` with the reason.
        present: String,
    },
    /// A call would wait for a resident kernel (a doorbell or gate) that runs until it is
    /// told to stop, so it is refused instead of hanging.
    #[error(
        "{call} would wait for the {running} resident kernel(s) (doorbell or gate) running on this \
         GPU, that is until they are shut down; remedy: run kernels once (so they are loaded) and \
         synchronise before starting a doorbell, or shut it down first"
    )]
    ResidentKernelRunning {
        /// The driver call that would wait.
        call: &'static str,
        /// Resident kernels running on the device.
        running: usize,
    },
    /// A fault injected by a test (feature `testing`, [`crate::testing::faults`]).
    #[cfg(feature = "testing")]
    #[error("injected fault: call {nth} at {point:?} ({call}) failed as a {kind:?} error would", call = point.call())]
    InjectedFault {
        /// Where.
        point: crate::faults::FaultPoint,
        /// Which call there, counting from 1.
        nth: u64,
        /// As what kind of failure.
        kind: crate::faults::FaultKind,
    },
    /// A range of a buffer or file was asked for while an overlapping range is held: two
    /// ranges may overlap only when both are only read.
    #[error(
        "{what} {asked:?} overlaps {held:?}, which is {how}; remedy: drop or reclaim that range \
         first, or ask for a disjoint one",
        how = if *held_exclusively { "held for writing" } else { "held for reading" }
    )]
    RangeInUse {
        /// What the range is of (`buffer range` in elements, `file window` in bytes).
        what: &'static str,
        /// The range asked for.
        asked: std::ops::Range<u64>,
        /// The range held that overlaps it.
        held: std::ops::Range<u64>,
        /// Whether the held range is held for writing (else both would be written).
        held_exclusively: bool,
    },
    /// A byte budget ([`crate::memory::PinnedBudget`], [`crate::memory::DeviceBudget`]) cannot
    /// take an allocation: what is in use plus what is asked exceeds it.
    #[error(
        "the {budget} budget cannot take {asked} more bytes: {in_use} of its {limit} bytes are in \
         use; remedy: {remedy}",
        remedy = budget.remedy()
    )]
    BudgetExceeded {
        /// Which budget.
        budget: BudgetKind,
        /// Bytes asked for.
        asked: u64,
        /// Bytes taken by allocations still alive.
        in_use: u64,
        /// The budget.
        limit: u64,
    },
    /// A file's contents do not follow its format (a safetensors header that is truncated, not
    /// JSON, or points past the end of the file).
    #[error(
        "{}: not a valid {format} file: {problem}; remedy: check the file is complete (re-download or re-save it)",
        .path.display()
    )]
    MalformedFile {
        /// The file.
        path: std::path::PathBuf,
        /// The format expected, e.g. `safetensors`.
        format: &'static str,
        /// What is wrong, from the format's parser.
        problem: String,
    },
    /// A file no longer holds bytes that a mapping of it covers: it was truncated (or shrunk)
    /// while hetmem mapped it. hetmem's own CPU loops over a mapping (copies, checksums,
    /// operations' CPU paths, the loader's reads) check the file's size first and recover the
    /// fault (SIGBUS) if it shrinks while they run; what they made of the missing bytes is
    /// discarded. A window that faulted reads zeros past the file's end from then on: drop it.
    #[error(
        "{} no longer holds bytes {}..{} that hetmem maps: {detail}; remedy: do not truncate or \
         rewrite a file in place while it is mapped (write a new file and rename it over the old \
         one), then map it again",
        path.as_ref().map_or_else(|| "a mapped file".to_string(), |path| path.display().to_string()),
        range.start,
        range.end
    )]
    FileTruncated {
        /// The file, where the mapping knows it.
        path: Option<std::path::PathBuf>,
        /// The bytes of the file the access needed.
        range: std::ops::Range<u64>,
        /// What was found: the file's size now, or the fault.
        detail: String,
    },
    /// A page of a mapped file could not be read (SIGBUS) although the file still holds it:
    /// the storage failed to read it (an I/O error, a network file system that lost the
    /// file), or the file was truncated and grown again meanwhile. As for
    /// [`Error::FileTruncated`], what hetmem made of those bytes is discarded and the mapping
    /// reads zeros from the faulting page on: drop it.
    #[error(
        "a page of {} (in bytes {}..{} that hetmem maps) could not be read, although the file still \
         holds it (the storage failed to read it, or the file was truncated and grown again); \
         remedy: check the storage and the system log, then map the file again",
        path.as_ref().map_or_else(|| "a mapped file".to_string(), |path| path.display().to_string()),
        range.start,
        range.end
    )]
    FileUnreadable {
        /// The file, where the mapping knows it.
        path: Option<std::path::PathBuf>,
        /// The bytes of the file the access needed.
        range: std::ops::Range<u64>,
    },
    /// A file or operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What hetmem was doing, with the path where there is one.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(what: &'static str, problem: impl Into<String>) -> Self {
        Error::InvalidArgument { what, problem: problem.into() }
    }

    /// Whether trying again later may succeed: a failed allocation or registration (memory or
    /// pinned memory exhausted, `ulimit -l`), a busy device, an exhausted pool, a full ring.
    /// Retrying such a failure changes nothing but timing; see [`crate::retry::RetryPolicy`].
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Cuda(error) => error.is_transient(),
            Error::PoolExhausted { .. }
            | Error::WouldBlock(_)
            | Error::RangeInUse { .. }
            | Error::BudgetExceeded { .. } => true,
            Error::Io { source, .. } => matches!(
                source.raw_os_error(),
                Some(code) if code == rustix::io::Errno::NOMEM.raw_os_error()
                    || code == rustix::io::Errno::AGAIN.raw_os_error()
            ),
            Error::FrameFailed { source, .. } | Error::BenchCellFailed { source, .. } => {
                source.is_transient()
            }
            #[cfg(feature = "testing")]
            Error::InjectedFault { kind, .. } => *kind == crate::faults::FaultKind::Transient,
            _ => false,
        }
    }

    /// Whether the GPU context is lost: a kernel faulted (an illegal address, a trap), every
    /// later call on that GPU fails the same way, and only a new process can use it again.
    pub fn is_sticky(&self) -> bool {
        match self {
            Error::Cuda(error) => error.is_sticky(),
            Error::FrameFailed { source, .. } | Error::BenchCellFailed { source, .. } => source.is_sticky(),
            #[cfg(feature = "testing")]
            Error::InjectedFault { kind, .. } => *kind != crate::faults::FaultKind::Transient,
            _ => false,
        }
    }
}

/// Which byte budget refused an allocation ([`Error::BudgetExceeded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetKind {
    /// Pinned (page-locked) host memory, bounded by the locked-memory limit
    /// ([`crate::memory::PinnedBudget`]).
    PinnedMemory,
    /// Device memory ([`crate::memory::DeviceBudget`]).
    DeviceMemory,
}

impl BudgetKind {
    /// What a user can do when the budget is full.
    pub fn remedy(self) -> &'static str {
        match self {
            BudgetKind::PinnedMemory => {
                "raise the locked-memory limit (`ulimit -l`, or `memlock` in \
                 /etc/security/limits.conf) and the budget with it, map smaller windows, or drop \
                 windows still in use sooner"
            }
            BudgetKind::DeviceMemory => {
                "raise the device budget, process the data in smaller chunks, or drop device \
                 buffers sooner"
            }
        }
    }
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetKind::PinnedMemory => "pinned-memory (memlock)",
            BudgetKind::DeviceMemory => "device-memory",
        })
    }
}

/// What a reply status other than done or stopped means (the doorbell protocol's status
/// word, as in kernels/doorbell.cu).
fn bad_reply(status: u32) -> String {
    match status {
        1 => "was refused: the server did not know its opcode".to_string(),
        other => format!("got a reply with status {other}, which no server writes"),
    }
}

/// Why a doorbell no longer serves requests ([`Error::DoorbellStopped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DoorbellStop {
    /// It was shut down: a request submitted after that, or one still running then (a stalled
    /// test request), fails this way.
    ShutDown,
    /// Its server ended although nobody asked it to: the kernel is no longer running (its
    /// stream is idle) or said it exited.
    ServerEnded,
    /// The CPU backend's server thread panicked.
    Panicked,
}

impl fmt::Display for DoorbellStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DoorbellStop::ShutDown => {
                "the doorbell has been shut down; remedy: start a new doorbell (Doorbell::start)"
            }
            DoorbellStop::ServerEnded => {
                "the doorbell's server is no longer running although it was not shut down (its \
                 kernel ended or failed); remedy: look for an earlier GPU error (`nvidia-smi`), \
                 shut the doorbell down and start a new one"
            }
            DoorbellStop::Panicked => {
                "the doorbell's server thread panicked (a bug in hetmem: please report it with the \
                 panic message above); remedy: start a new doorbell"
            }
        })
    }
}

/// Whose frame memory was lost ([`Error::FrameMemoryLost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameMemoryHolder {
    /// A slot of a [`crate::FrameRing`].
    RingSlot,
    /// A [`crate::FrameFilter`].
    Filter,
}

impl FrameMemoryHolder {
    /// The memory, as a sentence names it, and its verb.
    fn memory(self) -> &'static str {
        match self {
            FrameMemoryHolder::RingSlot => "a frame ring slot's memory was",
            FrameMemoryHolder::Filter => "the frame filter's buffers were",
        }
    }

    /// What to make instead.
    fn remedy(self) -> &'static str {
        match self {
            FrameMemoryHolder::RingSlot => "ring (FrameRing::new)",
            FrameMemoryHolder::Filter => "filter (FrameFilter::new)",
        }
    }
}

/// Why the CUDA backend cannot run on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Unavailable {
    /// No NVIDIA driver library (`libcuda.so`) could be loaded.
    NoDriverLibrary,
    /// The driver is older than the CUDA version hetmem is built against.
    DriverTooOld {
        /// The CUDA version the driver supports, as `major * 1000 + minor * 10`.
        driver_version: i32,
        /// The CUDA version hetmem needs, in the same form.
        required_version: i32,
    },
    /// `cuInit` failed.
    InitFailed {
        /// The driver's error, with its remedy.
        error: String,
    },
    /// The driver works but sees no CUDA device.
    NoDevice,
    /// A device index beyond the devices the driver sees.
    NoSuchDevice {
        /// The index asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
    },
}

impl Unavailable {
    /// What a user can do about it.
    pub fn remedy(&self) -> &'static str {
        match self {
            Unavailable::NoDriverLibrary => {
                "install the NVIDIA driver (libcuda.so.1 must be on the loader path)"
            }
            Unavailable::DriverTooOld { .. } => {
                "update the NVIDIA driver to release 525 or newer (CUDA 12.0)"
            }
            Unavailable::InitFailed { .. } => {
                "check `nvidia-smi`; a driver/kernel-module version mismatch needs a reboot"
            }
            Unavailable::NoDevice => "check `nvidia-smi` and CUDA_VISIBLE_DEVICES",
            Unavailable::NoSuchDevice { .. } => {
                "pick an index below the device count (`hetmem doctor` lists them)"
            }
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoDriverLibrary => write!(f, "no NVIDIA driver library (libcuda.so) found"),
            Unavailable::DriverTooOld { driver_version, required_version } => write!(
                f,
                "the NVIDIA driver supports CUDA {} but hetmem needs CUDA {}",
                cuda_version_string(*driver_version),
                cuda_version_string(*required_version)
            ),
            Unavailable::InitFailed { error } => write!(f, "the CUDA driver failed to start: {error}"),
            Unavailable::NoDevice => write!(f, "the NVIDIA driver sees no CUDA device"),
            Unavailable::NoSuchDevice { index, count } => {
                write!(f, "there is no CUDA device {index} (the driver sees {count})")
            }
        }
    }
}

/// Formats a CUDA version number as the driver reports it (`13000`) as `13.0`.
pub fn cuda_version_string(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// A failed CUDA driver call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The driver function that failed, for example `cuMemHostRegister`.
    pub call: &'static str,
    /// The numeric `CUresult`.
    pub code: u32,
    /// The `CUresult` name, for example `CUDA_ERROR_INVALID_VALUE`.
    pub name: String,
    /// The driver's description of the error.
    pub description: String,
}

impl CudaError {
    /// What a user can do about this failure, where hetmem knows.
    pub fn remedy(&self) -> Option<&'static str> {
        remedy_for(self.call, &self.name)
    }

    /// Whether the error loses the context: a kernel fault after which every call fails
    /// (NVIDIA: "the process must be terminated and relaunched"; on driver 580 even
    /// `cuDevicePrimaryCtxReset` does not bring the context back, bench/results/2026-11-30-h200-probes).
    pub fn is_sticky(&self) -> bool {
        STICKY.contains(&self.name.as_str())
    }

    /// Whether trying again later may succeed: out of device or pinned memory, a busy or not
    /// yet ready device.
    pub fn is_transient(&self) -> bool {
        TRANSIENT.contains(&self.name.as_str())
    }
}

/// Errors that leave a context unusable (CUDA's "sticky" errors).
const STICKY: &[&str] = &[
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
];

/// Errors that may pass: memory freed meanwhile, a device that stops being busy.
const TRANSIENT: &[&str] = &[
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA_ERROR_DEVICE_UNAVAILABLE",
    "CUDA_ERROR_SYSTEM_NOT_READY",
    "CUDA_ERROR_TIMEOUT",
];

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.description)?;
        if let Some(remedy) = self.remedy() {
            write!(f, "; remedy: {remedy}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CudaError {}

/// The remedy for a driver call that failed with `name`, where one is known.
fn remedy_for(call: &str, name: &str) -> Option<&'static str> {
    let host_memory_call = matches!(call, "cuMemHostAlloc" | "cuMemHostRegister" | "cuMemAllocHost");
    Some(match name {
        "CUDA_ERROR_OUT_OF_MEMORY" if host_memory_call => {
            "pinned host memory is limited by free RAM: pin less, or reuse buffers through the \
             pinned pool (NVIDIA's driver 580 does not count pinned memory against `ulimit -l`; \
             other drivers may, so raising it can help there)"
        }
        "CUDA_ERROR_OUT_OF_MEMORY" => {
            "the GPU is out of memory: free device buffers, use smaller frames or windows, \
             or use mapped host memory instead of device memory"
        }
        "CUDA_ERROR_INVALID_VALUE" if call == "cuMemHostRegister" => {
            "register read-only file mappings (PROT_READ or MAP_SHARED) with the read-only \
             flag, and pass a page-aligned range inside one mapping"
        }
        "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED" => {
            "this range is already registered with CUDA: reuse that registration or unregister it first"
        }
        "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED" => {
            "this range was never registered, or is already unregistered"
        }
        "CUDA_ERROR_NOT_SUPPORTED" if call == "cuMemHostRegister" => {
            "this device or OS cannot register this kind of memory: use a pinned allocation instead"
        }
        "CUDA_ERROR_NO_DEVICE" => {
            "no CUDA device is visible: check `nvidia-smi` and CUDA_VISIBLE_DEVICES; \
             hetmem runs on the CPU backend meanwhile"
        }
        "CUDA_ERROR_INSUFFICIENT_DRIVER" | "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE" => {
            "the NVIDIA driver is too old: update it to release 525 (CUDA 12.0) or newer"
        }
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" | "CUDA_ERROR_JIT_COMPILER_NOT_FOUND" => {
            "the PTX came from a compiler newer than the driver: compile it with an NVRTC no \
             newer than the driver's CUDA version (`hetmem doctor` shows both; CUDA 12 drivers \
             take `pip install nvidia-cuda-nvrtc-cu12`, with its nvidia/cuda_nvrtc/lib on \
             LD_LIBRARY_PATH), or update the driver"
        }
        "CUDA_ERROR_INVALID_IMAGE" | "CUDA_ERROR_NO_BINARY_FOR_GPU" | "CUDA_ERROR_INVALID_PTX" => {
            "the compiled kernel does not fit this GPU: delete hetmem's kernel cache \
             (~/.cache/hetmem, or the folder given to kernels::set_cache or the CLI's \
             HETMEM_CACHE_DIR) and run again"
        }
        "CUDA_ERROR_ILLEGAL_ADDRESS" => {
            "a kernel touched memory the GPU cannot reach (plain pageable memory on a machine \
             without HMM, or a freed buffer); the context is lost: restart the process and \
             run it under compute-sanitizer to find the access"
        }
        "CUDA_ERROR_LAUNCH_FAILED"
        | "CUDA_ERROR_ILLEGAL_INSTRUCTION"
        | "CUDA_ERROR_MISALIGNED_ADDRESS"
        | "CUDA_ERROR_HARDWARE_STACK_ERROR"
        | "CUDA_ERROR_INVALID_PC"
        | "CUDA_ERROR_ASSERT" => {
            "a kernel faulted and the GPU context is lost: restart the process (hetmem's CLI can \
             finish the remaining frames on the CPU with --retries) and run it under \
             compute-sanitizer to find the fault"
        }
        "CUDA_ERROR_LAUNCH_TIMEOUT" => {
            "a kernel ran past the display watchdog: use a GPU without a display attached"
        }
        "CUDA_ERROR_NOT_PERMITTED" | "CUDA_ERROR_NOT_SUPPORTED" => {
            "this operation is not available on this device or driver: `hetmem doctor` lists what is"
        }
        _ => return None,
    })
}

/// A failure of NVRTC, the run-time CUDA compiler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NvrtcError {
    /// No NVRTC 12 or 13 could be loaded.
    NotFound {
        /// Each library name tried, with the loader's answer.
        tried: String,
    },
    /// A kernel failed to compile; `log` is NVRTC's own output.
    Compile {
        /// The kernel source's name.
        kernel: String,
        /// The architecture compiled for, for example `sm_90`.
        arch: String,
        /// The `nvrtcResult` name.
        code: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// Another NVRTC call failed.
    Call {
        /// The NVRTC function that failed.
        call: &'static str,
        /// The `nvrtcResult` name.
        code: String,
    },
}

impl fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvrtcError::NotFound { tried } => write!(
                f,
                "NVRTC 12 or 13 not found ({tried}); hetmem's own kernels run without it (from \
                 their PTX), kernels compiled from CUDA C need it; remedy: {NVRTC_REMEDY}"
            ),
            NvrtcError::Compile { kernel, arch, code, log } => {
                write!(f, "NVRTC could not compile kernel `{kernel}` for {arch}: {code}\n{}", log.trim_end())
            }
            NvrtcError::Call { call, code } => write!(f, "{call} failed: {code}"),
        }
    }
}

impl std::error::Error for NvrtcError {}

/// How to install NVRTC where it is missing.
pub const NVRTC_REMEDY: &str = "install the CUDA toolkit (12.0 or newer), or `pip install --target DIR \
     nvidia-cuda-nvrtc==13.0.88` (CUDA 13; `nvidia-cuda-nvrtc-cu12` for CUDA 12) and add the \
     folder holding libnvrtc.so.* (DIR/nvidia/cu13/lib, or DIR/nvidia/cuda_nvrtc/lib) to \
     LD_LIBRARY_PATH";

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda_error(call: &'static str, name: &str) -> CudaError {
        CudaError { call, code: 1, name: name.to_string(), description: "described".to_string() }
    }

    #[test]
    fn read_only_registration_failure_names_the_read_only_flag() {
        let text = cuda_error("cuMemHostRegister", "CUDA_ERROR_INVALID_VALUE").to_string();
        assert!(text.starts_with("cuMemHostRegister failed: CUDA_ERROR_INVALID_VALUE (described)"));
        assert!(text.contains("read-only flag"), "{text}");
    }

    #[test]
    fn invalid_value_elsewhere_has_no_registration_remedy() {
        assert_eq!(cuda_error("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE").remedy(), None);
    }

    #[test]
    fn host_and_device_out_of_memory_get_different_remedies() {
        let host = cuda_error("cuMemHostAlloc", "CUDA_ERROR_OUT_OF_MEMORY").remedy().unwrap();
        let device = cuda_error("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY").remedy().unwrap();
        assert!(host.contains("ulimit -l"));
        assert!(device.contains("GPU is out of memory"));
    }

    #[test]
    fn ptx_too_new_points_at_matching_nvrtc() {
        let remedy = cuda_error("cuModuleLoadData", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION").remedy().unwrap();
        assert!(remedy.contains("no newer than the driver"), "{remedy}");
        assert!(remedy.contains("nvidia-cuda-nvrtc-cu12"), "{remedy}");
    }

    #[test]
    fn a_forced_backend_that_cannot_run_names_cause_and_remedy() {
        let text = Error::BackendUnavailable {
            requested: BackendKind::Cuda,
            reason: Unavailable::DriverTooOld { driver_version: 11080, required_version: 12000 },
        }
        .to_string();
        assert_eq!(
            text,
            "the cuda backend was requested but cannot run here: the NVIDIA driver supports CUDA \
             11.8 but hetmem needs CUDA 12.0; remedy: update the NVIDIA driver to release 525 or \
             newer (CUDA 12.0); or unset HETMEM_BACKEND (`--backend auto`) to fall back to the CPU"
        );
    }

    #[test]
    fn faults_lose_the_context_and_shortages_pass() {
        let fault = Error::FrameFailed {
            index: 7,
            source: Box::new(cuda_error("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS").into()),
        };
        assert!(fault.is_sticky() && !fault.is_transient());
        let trap = cuda_error("cuEventSynchronize", "CUDA_ERROR_LAUNCH_FAILED");
        assert!(trap.is_sticky());
        assert!(trap.remedy().unwrap().contains("--retries"), "{trap}");
        let shortage: Error = cuda_error("cuMemHostAlloc", "CUDA_ERROR_OUT_OF_MEMORY").into();
        assert!(shortage.is_transient() && !shortage.is_sticky());
        let bad = cuda_error("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE");
        assert!(!bad.is_sticky() && !bad.is_transient());
        let no_memory = Error::Io { context: "mmap".into(), source: std::io::Error::from_raw_os_error(12) };
        assert!(no_memory.is_transient());
    }

    #[test]
    fn runtime_states_name_their_cause_and_remedy() {
        let lost = Error::FrameMemoryLost { holder: FrameMemoryHolder::RingSlot, frame: Some(7) }.to_string();
        assert!(
            lost.starts_with("a frame ring slot's memory was lost to an earlier failed frame (frame 7): ")
        );
        assert!(lost.contains("remedy: make a new ring"), "{lost}");
        let lost = Error::FrameMemoryLost { holder: FrameMemoryHolder::Filter, frame: None }.to_string();
        assert!(lost.starts_with("the frame filter's buffers were lost to an earlier failed frame: "));
        assert!(lost.contains("remedy: make a new filter"), "{lost}");
        for cause in [DoorbellStop::ShutDown, DoorbellStop::ServerEnded, DoorbellStop::Panicked] {
            let text = Error::DoorbellStopped { cause }.to_string();
            assert!(text.starts_with("the doorbell") && text.contains("; remedy: "), "{text}");
        }
        let refused = Error::DoorbellBadReply { sequence: 3, status: 1 }.to_string();
        assert!(refused.starts_with("doorbell request 3 was refused: the server did not know its opcode"));
        let garbled = Error::DoorbellBadReply { sequence: 3, status: 9 }.to_string();
        assert!(garbled.contains("status 9") && garbled.contains("remedy: "), "{garbled}");
        let flag = Error::FlagNeverArrived { target: 5 }.to_string();
        assert!(flag.contains("(value 5) never arrived") && flag.contains("FenceKind::Event"), "{flag}");
        let lent = Error::LentToGpu { device: 1 }.to_string();
        assert!(lent.contains("lent to GPU work on CUDA device 1") && lent.contains("reclaim"), "{lent}");
        let wrong = Error::ResultMismatch { what: "the written data", detail: "word 3".into() }.to_string();
        assert!(wrong.starts_with("the written data differs from the CPU's result: word 3;"), "{wrong}");
    }

    #[test]
    fn compile_errors_show_the_log() {
        let text = NvrtcError::Compile {
            kernel: "k".into(),
            arch: "sm_90".into(),
            code: "NVRTC_ERROR_COMPILATION".into(),
            log: "k.cu(3): error: identifier \"x\" is undefined\n".into(),
        }
        .to_string();
        assert!(text.ends_with("k.cu(3): error: identifier \"x\" is undefined"), "{text}");
    }
}
