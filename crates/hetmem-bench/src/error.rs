//! The benchmark's error type: hetmem's own errors, and the states only a measurement has (a
//! result that differs from the CPU's, a cell of the link table that failed, a strategy of the
//! frame table that could not be set up).

use hetmem::Strategy;

/// The result type of the benchmark's fallible functions.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Everything that can go wrong in a measurement.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The library failed (a CUDA call, an allocation, an invalid argument, ...).
    #[error(transparent)]
    Hetmem(#[from] hetmem::Error),
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
        source: Box<BenchError>,
    },
    /// No strategy asked for can run on this machine (the frame table).
    #[error("no strategy can run here: {}", skipped.join("; "))]
    NoStrategyRuns {
        /// Why each strategy cannot run.
        skipped: Vec<String>,
    },
    /// A strategy's frame filter could not be set up (the frame table).
    #[error("setting up the {strategy} strategy")]
    StrategySetup {
        /// The strategy.
        strategy: Strategy,
        /// Why: the library's error, or the caller's segment count's.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A strategy's filter put out a byte the CPU path does not (the frame table's check).
    #[error("{strategy} strategy: byte {byte} is {got}, the CPU path gives {want}")]
    FilterMismatch {
        /// The strategy.
        strategy: Strategy,
        /// The first byte that differs.
        byte: usize,
        /// The filter's byte.
        got: u8,
        /// The CPU path's byte.
        want: u8,
    },
    /// A timed frame of the frame table failed.
    #[error("{strategy}, frame {frame}")]
    StrategyFrame {
        /// The strategy.
        strategy: Strategy,
        /// The frame, counting from 0.
        frame: u32,
        /// Why it failed.
        #[source]
        source: hetmem::Error,
    },
}

// The raw CUDA calls and registrations the link cells make report in the library's own terms;
// these let `?` carry them as it carries a `hetmem::Error`.
impl From<hetmem::error::CudaError> for BenchError {
    fn from(error: hetmem::error::CudaError) -> Self {
        BenchError::Hetmem(error.into())
    }
}

impl From<hetmem::backend::BackendError> for BenchError {
    fn from(error: hetmem::backend::BackendError) -> Self {
        BenchError::Hetmem(error.into())
    }
}

impl<M> From<hetmem::memory::RegisterError<M>> for BenchError {
    fn from(error: hetmem::memory::RegisterError<M>) -> Self {
        BenchError::Hetmem(error.into())
    }
}

impl BenchError {
    /// Whether trying again later may succeed ([`hetmem::Error::is_transient`]); a failed cell,
    /// setup or frame is as transient as its cause, a result that differs never is.
    pub fn is_transient(&self) -> bool {
        match self {
            BenchError::Hetmem(error) => error.is_transient(),
            BenchError::BenchCellFailed { source, .. } => source.is_transient(),
            BenchError::StrategyFrame { source, .. } => source.is_transient(),
            BenchError::StrategySetup { source, .. } => {
                source.downcast_ref::<hetmem::Error>().is_some_and(hetmem::Error::is_transient)
            }
            BenchError::ResultMismatch { .. }
            | BenchError::NoStrategyRuns { .. }
            | BenchError::FilterMismatch { .. } => false,
        }
    }

    /// Whether the GPU context is lost ([`hetmem::Error::is_sticky`]); a failed cell is as
    /// sticky as its cause.
    pub fn is_sticky(&self) -> bool {
        match self {
            BenchError::Hetmem(error) => error.is_sticky(),
            BenchError::BenchCellFailed { source, .. } => source.is_sticky(),
            BenchError::StrategyFrame { source, .. } => source.is_sticky(),
            BenchError::StrategySetup { source, .. } => {
                source.downcast_ref::<hetmem::Error>().is_some_and(hetmem::Error::is_sticky)
            }
            BenchError::ResultMismatch { .. }
            | BenchError::NoStrategyRuns { .. }
            | BenchError::FilterMismatch { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_names_what_differs_and_voids_the_measurement() {
        let wrong =
            BenchError::ResultMismatch { what: "the written data", detail: "word 3".into() }.to_string();
        assert!(wrong.starts_with("the written data differs from the CPU's result: word 3;"), "{wrong}");
        assert!(wrong.contains("the measurement is void"), "{wrong}");
    }

    #[test]
    fn hetmem_errors_pass_through_unchanged() {
        let inner = hetmem::Error::invalid("frames", "none");
        let text = inner.to_string();
        let error = BenchError::from(inner);
        assert_eq!(error.to_string(), text);
        assert!(!error.is_transient() && !error.is_sticky());
    }
}
