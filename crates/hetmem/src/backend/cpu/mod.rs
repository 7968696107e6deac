//! The CPU backend: plain host memory and host threads.
//!
//! It has no state beyond a description of the machine; the operations above run their CPU
//! paths when handed a [`CpuDevice`]. Its memory is [`PageBox`]: page-aligned, whole pages.

use std::sync::OnceLock;

pub(crate) mod memory;

pub use memory::{HUGE_PAGE_BYTES, PageBox, page_size};

use crate::backend::cuda::error::Unavailable;

/// The host CPU as a backend.
#[derive(Debug, Clone)]
pub struct CpuDevice {
    fallback_reason: Option<Unavailable>,
}

impl CpuDevice {
    /// The CPU, chosen on purpose.
    pub fn chosen() -> Self {
        CpuDevice { fallback_reason: None }
    }

    /// The CPU, running because no GPU could be used.
    pub fn fallback(reason: Unavailable) -> Self {
        CpuDevice { fallback_reason: Some(reason) }
    }

    /// Why no GPU is used, when this is a fallback.
    pub fn fallback_reason(&self) -> Option<&Unavailable> {
        self.fallback_reason.as_ref()
    }

    /// The processor's model name, from `/proc/cpuinfo` where there is one.
    pub fn name(&self) -> &'static str {
        static NAME: OnceLock<String> = OnceLock::new();
        NAME.get_or_init(|| {
            std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|text| {
                    text.lines()
                        .find_map(|line| line.strip_prefix("model name"))
                        .and_then(|rest| rest.split_once(':'))
                        .map(|(_, name)| name.trim().to_string())
                })
                .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
        })
    }

    /// How many threads the host can run at once.
    pub fn threads(&self) -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
