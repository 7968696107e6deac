//! The backend's own error type, below hetmem's one [`crate::Error`].
//!
//! The backend reports what it finds in its own terms, so that it depends on nothing above
//! it; [`crate::Error`] converts from [`BackendError`], variant by variant, into the variant a
//! user matches on, with the same message. The texts here are those of [`crate::Error`]'s
//! variants (a test in `crate::error` holds them equal).

use super::BackendKind;
use super::cuda::error::{CudaError, NvrtcError, Unavailable};
use crate::faults::Injected;

/// Results of the backend's fallible calls.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// What can go wrong in the backend. Converts into [`crate::Error`] with the same message:
/// `Cuda` into [`crate::Error::Cuda`], `Unavailable` into
/// [`crate::Error::BackendUnavailable`], and each other variant into the variant of its name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A CUDA driver call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// NVRTC, the run-time CUDA compiler, failed or is missing.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A backend was asked for but cannot run here.
    #[error(
        "the {requested} backend was requested but cannot run here: {reason}; remedy: {}; \
         or unset HETMEM_BACKEND (`--backend auto`) to fall back to the CPU",
        reason.remedy()
    )]
    Unavailable {
        /// The backend that was asked for.
        requested: BackendKind,
        /// Why it cannot run.
        reason: Unavailable,
    },
    /// A backend name that names no backend.
    #[error("unknown backend {0:?}: expected one of `auto`, `cpu`, `cuda`")]
    UnknownBackend(String),
    /// An argument was out of range or inconsistent.
    #[error("invalid {what}: {problem}")]
    InvalidArgument {
        /// The argument or object that was wrong.
        what: &'static str,
        /// What was wrong with it, and what would be accepted.
        problem: String,
    },
    /// A device selection names GPUs this machine does not have.
    #[error("GPU {asked} asked for, but the GPUs present are: {present}")]
    NoSuchDevices {
        /// The ordinals asked for that are missing, or `all`.
        asked: String,
        /// The GPUs present, or `none` with the reason.
        present: String,
    },
    /// A call would wait for a resident kernel that runs until it is told to stop.
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
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What the backend was doing.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A fault injected by a test (feature `testing`).
    #[error("{}", injected_message(.0))]
    InjectedFault(Injected),
}

impl BackendError {
    /// Shorthand for [`BackendError::InvalidArgument`].
    pub fn invalid(what: &'static str, problem: impl Into<String>) -> Self {
        BackendError::InvalidArgument { what, problem: problem.into() }
    }
}

impl From<Injected> for BackendError {
    fn from(injected: Injected) -> Self {
        BackendError::InjectedFault(injected)
    }
}

#[cfg(feature = "testing")]
fn injected_message(injected: &Injected) -> String {
    let Injected { point, nth, kind } = injected;
    format!("injected fault: call {nth} at {point:?} ({}) failed as a {kind:?} error would", point.call())
}

#[cfg(not(feature = "testing"))]
fn injected_message(injected: &Injected) -> String {
    match *injected {}
}
