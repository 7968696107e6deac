//! [`Strategy`]: how a frame reaches a kernel and comes back.

use std::fmt;
use std::str::FromStr;

use crate::backend::Device;
use crate::error::{Error, Result};

/// How frames travel between host and GPU.
///
/// What each strategy means is written once, in [`Strategy::TRAITS`]; the slots' memory, the
/// places of a stage's constant data, the link bytes a frame moves, the device checks and the
/// command line's help are derived from it. This table is rendered from it too (a unit test
/// checks that they agree):
///
/// | strategy | frame buffers | constant data | needs |
/// |---|---|---|---|
/// | `cpu` | plain host memory, for the CPU path | in host memory, read by the CPU path | nothing |
/// | `copy` | pageable host memory, copied in and out of frame-sized device buffers by the driver's staging copies | in device memory | a GPU |
/// | `pinned-async` | pinned host memory, copied in and out of frame-sized device buffers by the copy engines, overlapped with the kernel in segments where the stage can ([`crate::ops::gaussian::GaussianOverlap`]) | in device memory | a GPU |
/// | `zero-copy` | mapped pinned host memory, read and written by the kernel itself | mapped host memory | a GPU that maps host memory |
/// | `managed` | managed memory, prefetched to the GPU and back | in device memory | a GPU with concurrent managed access |
/// | `hybrid` | mapped pinned host memory, read and written by the kernel itself | placed by [`crate::placement`] from the measured link profile: device memory where its reads save link bytes and it fits the budget, else mapped | a GPU that maps host memory |
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

/// Where a strategy keeps one frame's buffers, and so how a frame reaches the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameMemory {
    /// Plain host memory, for the CPU path.
    Host,
    /// Pageable host memory, copied in and out of frame-sized device buffers by the driver's
    /// staging copies.
    PageableCopied,
    /// Pinned host memory, copied in and out of frame-sized device buffers by the copy engines.
    PinnedCopied,
    /// Mapped pinned host memory, read and written by the kernel itself.
    Mapped,
    /// Managed memory, prefetched to the GPU and back.
    Managed,
}

impl FrameMemory {
    /// A sentence for docs and reports.
    pub fn description(self) -> &'static str {
        match self {
            FrameMemory::Host => "plain host memory, for the CPU path",
            FrameMemory::PageableCopied => {
                "pageable host memory, copied in and out of frame-sized device buffers by the driver's \
                 staging copies"
            }
            FrameMemory::PinnedCopied => {
                "pinned host memory, copied in and out of frame-sized device buffers by the copy engines, \
                 overlapped with the kernel in segments where the stage can \
                 ([`crate::ops::gaussian::GaussianOverlap`])"
            }
            FrameMemory::Mapped => "mapped pinned host memory, read and written by the kernel itself",
            FrameMemory::Managed => "managed memory, prefetched to the GPU and back",
        }
    }
}

/// Where a strategy puts the stage's constant data (its tables, read by every block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConstantMemory {
    /// Host memory, read by the CPU path.
    Host,
    /// Device memory.
    Device,
    /// Mapped host memory: nothing of the stage stays in device memory.
    Mapped,
    /// Where [`crate::placement`] decides from the measured link profile and the budget.
    Placed,
}

impl ConstantMemory {
    /// A sentence for docs and reports.
    pub fn description(self) -> &'static str {
        match self {
            ConstantMemory::Host => "in host memory, read by the CPU path",
            ConstantMemory::Device => "in device memory",
            ConstantMemory::Mapped => "mapped host memory",
            ConstantMemory::Placed => {
                "placed by [`crate::placement`] from the measured link profile: device memory where its \
                 reads save link bytes and it fits the budget, else mapped"
            }
        }
    }
}

/// What a device must offer to run a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// Any device, the CPU backend included.
    Nothing,
    /// A GPU.
    Gpu,
    /// A GPU that can map host memory into its address space.
    MapsHostMemory,
    /// A GPU on which the CPU and GPU may access managed memory at once.
    ConcurrentManagedAccess,
}

impl Requirement {
    /// A few words for docs and reports.
    pub fn description(self) -> &'static str {
        match self {
            Requirement::Nothing => "nothing",
            Requirement::Gpu => "a GPU",
            Requirement::MapsHostMemory => "a GPU that maps host memory",
            Requirement::ConcurrentManagedAccess => "a GPU with concurrent managed access",
        }
    }
}

/// What one strategy means: the one description from which the slots' memory, the constants'
/// places, the link bytes, the device checks and the help texts are derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyTraits {
    /// The strategy described.
    pub strategy: Strategy,
    /// The name used on the command line.
    pub name: &'static str,
    /// One line for help texts.
    pub summary: &'static str,
    /// Where frames live.
    pub frames: FrameMemory,
    /// Where the stage's constant data goes.
    pub constants: ConstantMemory,
    /// What the device must offer.
    pub requires: Requirement,
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

    /// What each concrete strategy means, in [`Strategy::ALL`]'s order.
    pub const TRAITS: [StrategyTraits; 6] = [
        StrategyTraits {
            strategy: Strategy::Cpu,
            name: "cpu",
            summary: "the CPU path on the host",
            frames: FrameMemory::Host,
            constants: ConstantMemory::Host,
            requires: Requirement::Nothing,
        },
        StrategyTraits {
            strategy: Strategy::Copy,
            name: "copy",
            summary: "pageable memory and synchronous copies",
            frames: FrameMemory::PageableCopied,
            constants: ConstantMemory::Device,
            requires: Requirement::Gpu,
        },
        StrategyTraits {
            strategy: Strategy::PinnedAsync,
            name: "pinned-async",
            summary: "pinned memory; copies overlap the kernel",
            frames: FrameMemory::PinnedCopied,
            constants: ConstantMemory::Device,
            requires: Requirement::Gpu,
        },
        StrategyTraits {
            strategy: Strategy::ZeroCopy,
            name: "zero-copy",
            summary: "the kernel reads and writes mapped host memory",
            frames: FrameMemory::Mapped,
            constants: ConstantMemory::Mapped,
            requires: Requirement::MapsHostMemory,
        },
        StrategyTraits {
            strategy: Strategy::Managed,
            name: "managed",
            summary: "managed memory, prefetched to the GPU and back",
            frames: FrameMemory::Managed,
            constants: ConstantMemory::Device,
            requires: Requirement::ConcurrentManagedAccess,
        },
        StrategyTraits {
            strategy: Strategy::Hybrid,
            name: "hybrid",
            summary: "frames mapped, constant data placed (device memory where it pays and fits)",
            frames: FrameMemory::Mapped,
            constants: ConstantMemory::Placed,
            requires: Requirement::MapsHostMemory,
        },
    ];

    /// What this strategy means; `None` for [`Strategy::Auto`], which means a choice.
    pub fn traits(self) -> Option<&'static StrategyTraits> {
        Strategy::TRAITS.iter().find(|traits| traits.strategy == self)
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        self.traits().map_or("auto", |traits| traits.name)
    }

    /// One line for help texts.
    pub fn summary(self) -> &'static str {
        self.traits().map_or(
            "chosen for the device: hybrid where the GPU maps host memory, cpu without a GPU",
            |traits| traits.summary,
        )
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
        let offers = device.capabilities();
        match self {
            Strategy::Auto if !offers.gpu => Strategy::Cpu,
            Strategy::Auto if offers.maps_host_memory => Strategy::Hybrid,
            Strategy::Auto => Strategy::PinnedAsync,
            strategy => strategy,
        }
    }

    /// Whether `device` can run this strategy, and why not.
    ///
    /// # Errors
    /// A GPU strategy on the CPU backend, mapping without `can_map_host_memory`, managed
    /// memory without concurrent managed access.
    pub fn check(self, device: &Device) -> Result<()> {
        let refuse = |why: String| Err(Error::invalid("strategy", format!("{}: {why}", self.name())));
        let Some(traits) = self.traits() else { return Ok(()) };
        let offers = device.capabilities();
        if traits.requires != Requirement::Nothing && !offers.gpu {
            return Err(Error::NeedsGpu {
                what: format!("the {self} strategy"),
                detail: match device.cpu_fallback_reason() {
                    Some(reason) => {
                        format!("it fell back to it because {reason}; or choose the cpu strategy")
                    }
                    None => "the CPU backend was chosen; choose the cpu strategy, or the cuda backend".into(),
                },
            });
        }
        match traits.requires {
            Requirement::MapsHostMemory if !offers.maps_host_memory => {
                refuse(format!("{} cannot map host memory", device.name()))
            }
            Requirement::ConcurrentManagedAccess if !offers.concurrent_managed_access => {
                refuse(format!("{} lacks concurrent managed access", device.name()))
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
    fn the_table_describes_every_concrete_strategy_in_order() {
        let described: Vec<Strategy> = Strategy::TRAITS.iter().map(|traits| traits.strategy).collect();
        assert_eq!(described, Strategy::ALL);
        assert_eq!(Strategy::Auto.traits(), None);
        for traits in &Strategy::TRAITS {
            assert_eq!(traits.name.parse::<Strategy>().unwrap(), traits.strategy);
            assert_eq!(traits.strategy.summary(), traits.summary);
        }
    }

    /// The type's doc table is the table rendered: one row per strategy, in order.
    #[test]
    fn the_doc_table_is_rendered_from_the_traits() {
        let source = include_str!("strategy.rs");
        let doc: Vec<&str> = source
            .lines()
            .skip_while(|line| !line.starts_with("/// | strategy |"))
            .skip(2)
            .take_while(|line| line.starts_with("/// | "))
            .collect();
        let rendered: Vec<String> = Strategy::TRAITS
            .iter()
            .map(|traits| {
                format!(
                    "/// | `{}` | {} | {} | {} |",
                    traits.name,
                    traits.frames.description(),
                    traits.constants.description(),
                    traits.requires.description()
                )
            })
            .collect();
        assert_eq!(doc, rendered);
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
