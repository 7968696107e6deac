//! [`Strategy`]: how a frame reaches a kernel and comes back.

use std::fmt;
use std::str::FromStr;

use crate::backend::Device;
use crate::error::{Error, Result};

/// How frames travel between host and GPU.
///
/// | strategy | host memory | device memory | bytes on the link per frame |
/// |---|---|---|---|
/// | `Cpu` | plain | none | none: the CPU path |
/// | `Copy` | pageable `Vec` | frame-sized | in + out, through the driver's staging copies |
/// | `PinnedAsync` | pinned | frame-sized | in + out, by the copy engines, overlapped with the kernel in segments ([`crate::ops::gaussian::GaussianOverlap`]) |
/// | `ZeroCopy` | mapped pinned (frames and the kernel's table) | none | in + out, read and written by the kernel itself |
/// | `Managed` | managed | migrates | in + out, by prefetch |
/// | `Hybrid` | mapped pinned (frames) | the stage's constant data, placed | in + out by the kernel; constant data from device memory where placement put it |
///
/// [`Strategy::Auto`] picks (see [`Strategy::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Strategy {
    /// The CPU path on the host.
    Cpu,
    /// Pageable memory and synchronous copies.
    Copy,
    /// Pinned memory; the upload, the kernel and the download overlap within each frame.
    PinnedAsync,
    /// The kernel reads and writes mapped host memory.
    ZeroCopy,
    /// Managed memory, prefetched to the device and back.
    Managed,
    /// Frames mapped; the stage's constant data placed by [`crate::placement`] from the
    /// measured link profile: in device memory when its reads save link bytes and it fits the
    /// device budget, else mapped ([`crate::FrameFilter::placement`] says which, and why).
    Hybrid,
    /// Chosen from the device's attributes.
    Auto,
}

impl Strategy {
    /// Every concrete strategy, CPU first.
    pub const ALL: [Strategy; 6] = [
        Strategy::Cpu,
        Strategy::Copy,
        Strategy::PinnedAsync,
        Strategy::ZeroCopy,
        Strategy::Managed,
        Strategy::Hybrid,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Cpu => "cpu",
            Strategy::Copy => "copy",
            Strategy::PinnedAsync => "pinned-async",
            Strategy::ZeroCopy => "zero-copy",
            Strategy::Managed => "managed",
            Strategy::Hybrid => "hybrid",
            Strategy::Auto => "auto",
        }
    }

    /// The concrete strategy for `device`.
    ///
    /// The rule for `Auto`, from the H200 measurements (bench/results): a frame is read and
    /// written once, so the kernel reading and writing mapped memory moves each byte over the
    /// link once with no copy to wait for, and beats copying in and out.
    /// - CPU backend: `Cpu`.
    /// - The GPU can map host memory: `Hybrid` (frames mapped, the kernel's table placed,
    ///   normally in device memory, so blocks do not fetch it over the link).
    /// - Otherwise: `PinnedAsync`.
    pub fn resolve(self, device: &Device) -> Strategy {
        match (self, device.as_cuda()) {
            (Strategy::Auto, None) => Strategy::Cpu,
            (Strategy::Auto, Some(gpu)) if gpu.attributes().can_map_host_memory => Strategy::Hybrid,
            (Strategy::Auto, Some(_)) => Strategy::PinnedAsync,
            (strategy, _) => strategy,
        }
    }

    /// Whether `device` can run this strategy, and why not.
    ///
    /// # Errors
    /// A GPU strategy on the CPU backend, mapping without `can_map_host_memory`, managed
    /// memory without concurrent managed access.
    pub fn check(self, device: &Device) -> Result<()> {
        let refuse = |why: String| Err(Error::invalid("strategy", format!("{}: {why}", self.name())));
        let Some(gpu) = device.as_cuda() else {
            return match self {
                Strategy::Cpu | Strategy::Auto => Ok(()),
                _ => refuse(format!(
                    "needs a GPU, and this run is on the CPU backend ({})",
                    device.cpu_fallback_reason().map_or("chosen".to_string(), ToString::to_string)
                )),
            };
        };
        let attributes = gpu.attributes();
        match self {
            Strategy::ZeroCopy | Strategy::Hybrid if !attributes.can_map_host_memory => {
                refuse(format!("{} cannot map host memory", gpu.name()))
            }
            Strategy::Managed if !attributes.concurrent_managed_access => {
                refuse(format!("{} lacks concurrent managed access", gpu.name()))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    fn from_str(text: &str) -> Result<Strategy> {
        let wanted = text.trim().to_ascii_lowercase().replace('_', "-");
        Strategy::ALL.into_iter().chain([Strategy::Auto]).find(|s| s.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = Strategy::ALL.iter().chain(&[Strategy::Auto]).map(|s| s.name()).collect();
            Error::invalid("strategy", format!("{text:?}: expected one of {}", names.join(", ")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind};

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for strategy in Strategy::ALL.into_iter().chain([Strategy::Auto]) {
            assert_eq!(strategy.name().parse::<Strategy>().unwrap(), strategy);
        }
        assert_eq!("Zero_Copy".parse::<Strategy>().unwrap(), Strategy::ZeroCopy);
        let error = "teleport".parse::<Strategy>().unwrap_err().to_string();
        assert!(error.contains("\"teleport\"") && error.contains("pinned-async"), "{error}");
    }

    #[test]
    fn the_cpu_backend_runs_only_the_cpu_strategy() {
        let cpu = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        assert_eq!(Strategy::Auto.resolve(&cpu), Strategy::Cpu);
        assert!(Strategy::Cpu.check(&cpu).is_ok());
        let error = Strategy::ZeroCopy.check(&cpu).unwrap_err().to_string();
        assert!(error.contains("needs a GPU"), "{error}");
    }
}
