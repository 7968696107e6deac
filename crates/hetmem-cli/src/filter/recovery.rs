//! What `hetmem filter` does when a frame fails, or the filter cannot be built: `--retries`.
//!
//! - Memory that runs short while the ring or filter is built is retried by the library
//!   (`RetryPolicy`); if it still runs short and the strategy was `auto`, the run falls back to
//!   the CPU strategy with a warning (the same result: the CPU path is bit-exact with the GPU).
//! - A frame that fails is retried when `--retries` allows: the frames not yet written (kept in
//!   memory from the moment they were read) go through a new ring, in order, and nothing is
//!   written twice. After a transient failure the new ring is on the same GPU. After a kernel
//!   fault the GPU's context is lost for the whole process and the driver cannot rebuild it
//!   (bench/results/2026-11-30-h200-probes), so the new ring is on the CPU, and the run says
//!   so. Each retry is reported: the frame, the error, where it was filtered again.

use hetmem::{BackendChoice, BackendKind, Device, Strategy};

/// A frame that failed and was filtered again.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Retried {
    /// The frame's index in the stream (0 for an image).
    pub index: u64,
    /// Why it failed.
    pub error: String,
    /// The backend the frames from it on were filtered by.
    pub backend: BackendKind,
    /// The strategy they were filtered by.
    pub strategy: Strategy,
    /// The failure lost the GPU's context, so the run went on on the CPU.
    pub lost_context: bool,
}

/// Where a retry runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// A new ring or filter on the same device, by the same strategy.
    Same,
    /// The CPU backend, by the CPU strategy: the GPU's context is lost.
    Cpu,
}

/// Retries left, and what was retried.
#[derive(Debug)]
pub(super) struct Recovery {
    left: u32,
    pub retried: Vec<Retried>,
}

impl Recovery {
    pub(super) fn new(retries: u32) -> Recovery {
        Recovery { left: retries, retried: Vec::new() }
    }

    /// Whether frames must be kept in memory until written, to be filtered again.
    pub(super) fn keeps_frames(&self) -> bool {
        self.left > 0
    }

    /// Where to go on after frame `index`, filtered on `device` by `strategy`, failed with
    /// `error`, if a retry is left: the same device and strategy, or the CPU after a lost
    /// context. `None`: the error stands.
    pub(super) fn after(
        &mut self,
        device: &Device,
        strategy: Strategy,
        index: u64,
        error: &anyhow::Error,
    ) -> Option<Retry> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let lost_context = device.backend() == BackendKind::Cuda
            && error
                .chain()
                .any(|cause| cause.downcast_ref::<hetmem::Error>().is_some_and(hetmem::Error::is_sticky));
        let (retry, backend, strategy) = if lost_context {
            (Retry::Cpu, BackendKind::Cpu, Strategy::Cpu)
        } else {
            (Retry::Same, device.backend(), strategy)
        };
        // The frame's own error: the chain around it only repeats it with context.
        let reason = error
            .chain()
            .find_map(|cause| match cause.downcast_ref::<hetmem::Error>() {
                Some(hetmem::Error::FrameFailed { source, .. }) => Some(source.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| format!("{error:#}"));
        self.retried.push(Retried { index, error: reason, backend, strategy, lost_context });
        Some(retry)
    }

    /// The warnings the run ends with, one per retry.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.retried
            .iter()
            .map(|retry| {
                let how = if retry.lost_context {
                    "the GPU context is lost for this process and the driver cannot rebuild it, so it and the \
                     frames after it were filtered on the CPU (the same result)"
                        .to_string()
                } else {
                    format!("it and the frames after it were filtered again by a new {} ring", retry.strategy)
                };
                format!("frame {} (counting from 0) failed: {}; {how}", retry.index, retry.error)
            })
            .collect()
    }
}

/// The CPU backend, where runs go on after the GPU's context is lost.
pub(super) fn cpu() -> Device {
    Device::open(BackendChoice::Only(BackendKind::Cpu)).expect("the CPU backend always opens")
}

/// The frame a failure names, if it is a failed frame.
pub(super) fn failed_frame(error: &anyhow::Error) -> Option<u64> {
    error.chain().find_map(|cause| match cause.downcast_ref::<hetmem::Error>() {
        Some(hetmem::Error::FrameFailed { index, .. }) => Some(*index),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_fault() -> anyhow::Error {
        let fault = hetmem::error::CudaError {
            call: "cuEventSynchronize",
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            description: "an illegal memory access was encountered".into(),
        };
        anyhow::Error::new(hetmem::Error::FrameFailed { index: 4, source: Box::new(fault.into()) })
            .context("filtering in.y4m")
    }

    #[test]
    fn retries_are_counted_and_a_cpu_run_stays_on_the_cpu() {
        let cpu = cpu();
        let mut recovery = Recovery::new(2);
        assert!(recovery.keeps_frames());
        assert_eq!(failed_frame(&gpu_fault()), Some(4));
        assert_eq!(recovery.after(&cpu, Strategy::Cpu, 4, &gpu_fault()), Some(Retry::Same));
        assert_eq!(recovery.after(&cpu, Strategy::Cpu, 9, &gpu_fault()), Some(Retry::Same));
        assert_eq!(recovery.after(&cpu, Strategy::Cpu, 11, &gpu_fault()), None, "two retries only");
        assert_eq!(recovery.retried.iter().map(|r| r.index).collect::<Vec<_>>(), [4, 9]);
        let warnings = recovery.warnings();
        assert!(warnings[0].starts_with("frame 4 (counting from 0) failed:"), "{}", warnings[0]);
        assert!(warnings[0].contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{}", warnings[0]);
        assert!(warnings[0].contains("new cpu ring"), "{}", warnings[0]);
        assert!(!Recovery::new(0).keeps_frames());
        assert_eq!(failed_frame(&anyhow::anyhow!("cannot write out.y4m")), None);
    }
}
