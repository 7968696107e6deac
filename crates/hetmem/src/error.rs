//! hetmem's one error type, and the remedies it offers.
//!
//! Every failure names what failed and, where a user can act on it, what to do. CUDA driver
//! failures keep the call, the `CUresult` name and the driver's description; NVRTC compile
//! failures keep the compiler's log.

use std::fmt;

pub use crate::backend::cuda::error::{
    CudaError, NVRTC_REMEDY, NvrtcError, Unavailable, cuda_version_string,
};
use crate::backend::{BackendError, BackendKind};

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
    /// An operation that only a GPU can do was asked of the CPU backend (chosen, or fallen
    /// back to: [`crate::Device::cpu_fallback_reason`] says why).
    #[error(
        "{what} needs a GPU, and this run is on the CPU backend: {detail}; remedy: run it where an \
         NVIDIA GPU can be used (`hetmem doctor` says why none is), or take its CPU path"
    )]
    NeedsGpu {
        /// The operation or object.
        what: String,
        /// Why, and what to do instead.
        detail: String,
    },
    /// An object is held by an earlier call that has not given it back yet (an input slot not
    /// submitted, an output frame not dropped, chunks alive, frame buffers lent to GPU work).
    #[error("{what} is still held: {remedy}")]
    StillHeld {
        /// What is held.
        what: &'static str,
        /// How to give it back.
        remedy: String,
    },
    /// A lease or stage was passed to a queue other than the one it belongs to.
    #[error("{what} belongs to another queue; remedy: {remedy}")]
    ForeignQueue {
        /// The lease or stage.
        what: &'static str,
        /// What to do instead.
        remedy: &'static str,
    },
    /// A run was stopped (by its caller, or by Ctrl-C) before it finished; what it produced
    /// until then is kept.
    #[error("the {what} was interrupted (stopped by its caller) before it finished")]
    Stopped {
        /// The run.
        what: &'static str,
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
    /// The process at the other end of a shared (cross-process) ring exited, was killed, or
    /// closed the ring while this process waited for it. Frames it finished before it went
    /// have been delivered; nothing after them will come.
    #[error(
        "the shared ring's {role} process (pid {pid}) is gone: {detail}; remedy: check why it \
         ended (its exit status, the system log for a kill), then set the ring up again"
    )]
    PeerGone {
        /// `producer` or `consumer`.
        role: &'static str,
        /// Its process id.
        pid: u32,
        /// What it was doing when it went.
        detail: String,
    },
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
    /// A frame of a resident blur ([`crate::ops::gaussian::ResidentGaussian`]) did not finish
    /// in time: its kernel is hung, or other work kept its blocks from running. The kernel may
    /// still touch the filter's memory, so the filter gives it up.
    #[error(
        "frame {frame} (counting from 0) of the resident blur did not finish within {timeout:?}: \
         its kernel is hung, or other work on the GPU held its SMs; the filter's memory is given \
         up to the kernel; remedy: shut this one down (its kernel holds its SMs until then), \
         start a new one (with a longer timeout if the GPU is shared or the frames large), and \
         check the GPU with `nvidia-smi`"
    )]
    ResidentFrameTimeout {
        /// The frame's index.
        frame: u64,
        /// The watchdog's timeout.
        timeout: std::time::Duration,
    },
    /// A resident blur's blocks did not all run within the timeout: they wait on each other, so
    /// it cannot serve frames until they do.
    #[error(
        "the resident blur's {blocks} blocks did not all start within {timeout:?}: other work \
         holds the GPU's SMs; remedy: start it on a GPU with {blocks} SMs free, or ask for \
         fewer tiles (ResidentOptions::tiles)"
    )]
    ResidentStartTimeout {
        /// Blocks the kernel was launched with.
        blocks: u32,
        /// The watchdog's timeout.
        timeout: std::time::Duration,
    },
    /// A resident blur's kernel ended although it was not stopped, without an error the driver
    /// reports.
    #[error(
        "the resident blur's kernel ended although it was not shut down (a bug in hetmem, or a \
         reset of the GPU); remedy: start a new resident blur, and report the bug"
    )]
    ResidentKernelEnded,
    /// A resident blur's kernel did not stop when asked: its memory is leaked, since freeing it
    /// would wait for the kernel for ever.
    #[error(
        "the resident blur's kernel did not stop within {timeout:?}; its memory is leaked; \
         remedy: restart the process (the driver reclaims the GPU when it exits)"
    )]
    ResidentStuck {
        /// How long the shutdown waited.
        timeout: std::time::Duration,
    },
    /// A call of NVIDIA NIXL failed, or its library is missing (the `hetmem-nixl` crate).
    #[error("NIXL: {call} failed: {problem}; remedy: {remedy}")]
    Nixl {
        /// The NIXL call, or what hetmem was doing.
        call: &'static str,
        /// NIXL's words, or hetmem's.
        problem: String,
        /// What to do.
        remedy: &'static str,
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
    /// A wait on a mapped flag, counter or mailbox ran past its timeout: the other side (a
    /// kernel, or a CPU thread) did not write what was waited for.
    #[error(
        "{what} did not arrive within {timeout:?}; remedy: check that the other side runs (its \
         kernel launched on a queue of this GPU, its thread started) and follows the protocol, or \
         wait longer"
    )]
    MappedWaitTimeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        timeout: std::time::Duration,
    },
    /// A read-modify-write of one mapped word from both the CPU and a GPU was asked for where
    /// the GPU's link to the host has no native atomics (`host_native_atomic = 0`, every PCIe
    /// GPU): each side's read-modify-write would be atomic only among its own threads, and
    /// updates would be lost.
    #[error(
        "{what} would take read-modify-writes from both the CPU and the GPU, but {device}'s link \
         has no host-native atomics; remedy: give it one writer (the CPU or the GPU) and let \
         the other side only read it, or use one counter per side"
    )]
    AtomicsNotNative {
        /// The word.
        what: &'static str,
        /// The device.
        device: String,
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
        "{call} would wait for the {running} resident kernel(s) (doorbell, gate or resident blur) \
         running on this GPU, that is until they are shut down; remedy: run kernels once (so they \
         are loaded) and synchronise before starting a resident kernel, or shut it down first"
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

impl From<BackendError> for Error {
    /// The backend's failure as the variant of the same name, with the same message.
    fn from(error: BackendError) -> Self {
        match error {
            BackendError::Cuda(error) => Error::Cuda(error),
            BackendError::Nvrtc(error) => Error::Nvrtc(error),
            BackendError::Unavailable { requested, reason } => {
                Error::BackendUnavailable { requested, reason }
            }
            BackendError::UnknownBackend(name) => Error::UnknownBackend(name),
            BackendError::InvalidArgument { what, problem } => Error::InvalidArgument { what, problem },
            BackendError::NoSuchDevices { asked, present } => Error::NoSuchDevices { asked, present },
            BackendError::ResidentKernelRunning { call, running } => {
                Error::ResidentKernelRunning { call, running }
            }
            BackendError::Io { context, source } => Error::Io { context, source },
            BackendError::InjectedFault(injected) => injected.into(),
        }
    }
}

impl From<crate::faults::Injected> for Error {
    fn from(injected: crate::faults::Injected) -> Self {
        #[cfg(feature = "testing")]
        {
            let crate::faults::Injected { point, nth, kind } = injected;
            Error::InjectedFault { point, nth, kind }
        }
        #[cfg(not(feature = "testing"))]
        match injected {}
    }
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
            Error::FrameFailed { source, .. } => source.is_transient(),
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
            Error::FrameFailed { source, .. } => source.is_sticky(),
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
    /// A [`crate::ops::gaussian::ResidentGaussian`].
    ResidentBlur,
}

impl FrameMemoryHolder {
    /// The memory, as a sentence names it, and its verb.
    fn memory(self) -> &'static str {
        match self {
            FrameMemoryHolder::RingSlot => "a frame ring slot's memory was",
            FrameMemoryHolder::Filter => "the frame filter's buffers were",
            FrameMemoryHolder::ResidentBlur => "the resident blur's frames were",
        }
    }

    /// What to make instead.
    fn remedy(self) -> &'static str {
        match self {
            FrameMemoryHolder::RingSlot => "ring (FrameRing::new)",
            FrameMemoryHolder::Filter => "filter (FrameFilter::new)",
            FrameMemoryHolder::ResidentBlur => "resident blur (ResidentGaussian::start)",
        }
    }
}

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
        let gpu = Error::NeedsGpu { what: "the hybrid strategy".into(), detail: "its placement".into() }
            .to_string();
        assert!(gpu.starts_with(
            "the hybrid strategy needs a GPU, and this run is on the CPU backend: its placement;"
        ));
        assert!(gpu.contains("remedy: ") && gpu.contains("hetmem doctor"), "{gpu}");
        let held = Error::StillHeld { what: "the frame ring's input slot", remedy: "submit it".into() };
        assert_eq!(held.to_string(), "the frame ring's input slot is still held: submit it");
        let foreign = Error::ForeignQueue { what: "this lease", remedy: "reclaim it first" }.to_string();
        assert_eq!(foreign, "this lease belongs to another queue; remedy: reclaim it first");
        assert_eq!(
            Error::Stopped { what: "load" }.to_string(),
            "the load was interrupted (stopped by its caller) before it finished"
        );
        let lent = Error::LentToGpu { device: 1 }.to_string();
        assert!(lent.contains("lent to GPU work on CUDA device 1") && lent.contains("reclaim"), "{lent}");
    }

    #[test]
    fn backend_errors_keep_their_message_as_hetmem_errors() {
        let unavailable = || Unavailable::DriverTooOld { driver_version: 11080, required_version: 12000 };
        let cases = [
            BackendError::Cuda(cuda_error("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY")),
            BackendError::Unavailable { requested: BackendKind::Cuda, reason: unavailable() },
            BackendError::UnknownBackend("vulkan".into()),
            BackendError::invalid("device allocation size", "0 bytes"),
            BackendError::NoSuchDevices { asked: "4".into(), present: "none".into() },
            BackendError::ResidentKernelRunning { call: "cuCtxSynchronize", running: 1 },
        ];
        for backend in cases {
            let text = backend.to_string();
            let error = Error::from(backend);
            assert_eq!(error.to_string(), text, "{error:?}");
            assert!(!matches!(error, Error::InvalidArgument { .. }) || text.starts_with("invalid "));
        }
        let error =
            Error::from(BackendError::Unavailable { requested: BackendKind::Cuda, reason: unavailable() });
        assert!(matches!(error, Error::BackendUnavailable { requested: BackendKind::Cuda, .. }), "{error:?}");
        let error = Error::from(BackendError::ResidentKernelRunning { call: "cuCtxSynchronize", running: 2 });
        assert!(matches!(error, Error::ResidentKernelRunning { running: 2, .. }), "{error:?}");
    }

    #[cfg(feature = "testing")]
    #[test]
    fn injected_faults_keep_their_message_and_kind() {
        use crate::faults::{FaultKind, FaultPoint, Injected};
        let injected = Injected { point: FaultPoint::Copy, nth: 3, kind: FaultKind::Transient };
        let text = BackendError::from(injected).to_string();
        let error = Error::from(BackendError::from(injected));
        assert_eq!(error.to_string(), text);
        assert_eq!(text, "injected fault: call 3 at Copy (copy) failed as a Transient error would");
        assert!(error.is_transient() && !error.is_sticky());
        let sticky = Error::from(Injected { kind: FaultKind::Sticky, ..injected });
        assert!(sticky.is_sticky() && !sticky.is_transient());
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
