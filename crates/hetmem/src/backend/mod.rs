//! Backends: where work runs.
//!
//! - [`cuda`] drives an NVIDIA GPU through the CUDA driver API. It is the only module in
//!   hetmem that calls cudarc's raw layers; everything above it sees owning types.
//! - [`cpu`] runs everything on the host. It always builds, is the fallback when no GPU can
//!   be used, and is the reference the GPU paths are tested against.
//! - `nvml` (feature `nvml`) reads a GPU's PCIe link and traffic counters through NVML.
//!
//! [`Device::open_best`] picks one: the first CUDA device, or the CPU with the reason the
//! GPU could not be used. The `HETMEM_BACKEND` environment variable (`auto`, `cpu`, `cuda`)
//! overrides the choice; asking for `cuda` where it cannot run is an error, never a silent
//! fallback.

mod capabilities;
pub mod cpu;
pub mod cuda;
mod error;
pub(crate) mod memory;
#[cfg(feature = "nvml")]
pub mod nvml;
pub(crate) mod queue;
mod selection;

use std::fmt;
use std::str::FromStr;

use cuda::error::Unavailable;
pub use error::BackendError;
use error::Result;

pub use capabilities::Capabilities;
pub use selection::DeviceSelection;

/// The environment variable that forces a backend.
pub const BACKEND_ENV: &str = "HETMEM_BACKEND";

/// A kind of backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BackendKind {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Which backend a user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The first CUDA device, else the CPU.
    #[default]
    Auto,
    /// Exactly this backend, or an error.
    Only(BackendKind),
}

impl FromStr for BackendChoice {
    type Err = BackendError;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Only(BackendKind::Cpu)),
            "cuda" | "gpu" => Ok(BackendChoice::Only(BackendKind::Cuda)),
            _ => Err(BackendError::UnknownBackend(text.to_string())),
        }
    }
}

impl BackendChoice {
    /// The choice `HETMEM_BACKEND` makes; `Auto` when it is unset.
    ///
    /// # Errors
    /// [`BackendError::UnknownBackend`] when it names no backend.
    pub fn from_env() -> Result<Self> {
        match std::env::var(BACKEND_ENV) {
            Ok(value) => value.parse(),
            Err(std::env::VarError::NotPresent) => Ok(BackendChoice::Auto),
            Err(std::env::VarError::NotUnicode(value)) => {
                Err(BackendError::UnknownBackend(value.to_string_lossy().into()))
            }
        }
    }
}

/// Where work runs: a CUDA device, or the CPU.
#[derive(Debug, Clone)]
pub enum Device {
    /// An NVIDIA GPU.
    Cuda(cuda::CudaDevice),
    /// The host CPU.
    Cpu(cpu::CpuDevice),
}

impl Device {
    /// The best device on this machine, honouring `HETMEM_BACKEND`.
    ///
    /// # Errors
    /// An unknown `HETMEM_BACKEND`, or `HETMEM_BACKEND=cuda` where CUDA cannot run.
    ///
    /// # Examples
    /// ```
    /// let device = hetmem::Device::open_best()?;
    /// if let Some(reason) = device.cpu_fallback_reason() {
    ///     eprintln!("running on the CPU: {reason}");
    /// }
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn open_best() -> Result<Device> {
        Device::open(BackendChoice::from_env()?)
    }

    /// The device for an explicit choice.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when `Only(Cuda)` is asked for where CUDA cannot run.
    pub fn open(choice: BackendChoice) -> Result<Device> {
        match choice {
            BackendChoice::Only(BackendKind::Cpu) => Ok(Device::Cpu(cpu::CpuDevice::chosen())),
            BackendChoice::Only(BackendKind::Cuda) => cuda::CudaDevice::open(0)
                .map(Device::Cuda)
                .map_err(|reason| BackendError::Unavailable { requested: BackendKind::Cuda, reason }),
            BackendChoice::Auto => Ok(match cuda::CudaDevice::open(0) {
                Ok(device) => Device::Cuda(device),
                Err(reason) => {
                    tracing::info!("no usable GPU, running on the CPU backend: {reason}");
                    Device::Cpu(cpu::CpuDevice::fallback(reason))
                }
            }),
        }
    }

    /// The CPU backend, chosen on purpose (the CPU strategy's queue, a CPU-only ring).
    pub fn cpu() -> Device {
        Device::Cpu(cpu::CpuDevice::chosen())
    }

    /// CUDA device `ordinal`, whatever `HETMEM_BACKEND` says.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when CUDA cannot run or there is no such device.
    pub fn open_ordinal(ordinal: usize) -> Result<Device> {
        cuda::CudaDevice::open(ordinal)
            .map(Device::Cuda)
            .map_err(|reason| BackendError::Unavailable { requested: BackendKind::Cuda, reason })
    }

    /// The devices `selection` names, in its order, on the backend `choice` allows.
    ///
    /// [`DeviceSelection::All`] opens every GPU, or gives the CPU alone where no GPU can be
    /// used (the reason recorded as for [`Device::open_best`]) or `choice` asks for the CPU.
    /// Ordinals always mean GPUs: without one they are an error.
    ///
    /// # Errors
    /// [`BackendError::NoSuchDevices`] listing the GPUs present (or why there are none) for a
    /// missing ordinal; [`BackendError::Unavailable`] when `choice` is CUDA only where CUDA
    /// cannot run; a context that cannot be made.
    ///
    /// # Examples
    /// ```
    /// use hetmem::backend::{BackendChoice, DeviceSelection};
    /// let choice = BackendChoice::from_env()?; // HETMEM_BACKEND
    /// let devices = hetmem::Device::open_selection(choice, &DeviceSelection::All)?;
    /// assert!(!devices.is_empty());
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn open_selection(choice: BackendChoice, selection: &DeviceSelection) -> Result<Vec<Device>> {
        let names = match choice {
            BackendChoice::Only(BackendKind::Cpu) => Err(None),
            _ => cuda::CudaDevice::names().map_err(Some),
        };
        match (names, selection) {
            (Ok(names), _) => selection.resolve(&names)?.into_iter().map(Device::open_ordinal).collect(),
            (Err(reason), _) if choice == BackendChoice::Only(BackendKind::Cuda) => {
                let reason = reason.unwrap_or(Unavailable::NoDevice);
                Err(BackendError::Unavailable { requested: BackendKind::Cuda, reason })
            }
            (Err(None), DeviceSelection::All) => Ok(vec![Device::Cpu(cpu::CpuDevice::chosen())]),
            (Err(Some(reason)), DeviceSelection::All) => {
                tracing::info!("no usable GPU, running on the CPU backend: {reason}");
                Ok(vec![Device::Cpu(cpu::CpuDevice::fallback(reason))])
            }
            (Err(reason), DeviceSelection::Ordinals(_)) => Err(BackendError::NoSuchDevices {
                asked: selection.to_string(),
                present: match reason {
                    Some(reason) => format!("none ({reason})"),
                    None => "none in use (the CPU backend was chosen)".to_string(),
                },
            }),
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> BackendKind {
        match self {
            Device::Cuda(_) => BackendKind::Cuda,
            Device::Cpu(_) => BackendKind::Cpu,
        }
    }

    /// A human-readable name: the GPU's, or the CPU's.
    pub fn name(&self) -> String {
        match self {
            Device::Cuda(device) => device.name().to_string(),
            Device::Cpu(device) => device.name().to_string(),
        }
    }

    /// The device memory free now, in bytes: the driver's figure on a GPU; None on the CPU
    /// backend, whose "device memory" is host memory with no separate budget.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn free_device_memory(&self) -> Result<Option<u64>> {
        match self {
            Device::Cuda(cuda) => Ok(Some(cuda.memory_info()?.0)),
            Device::Cpu(_) => Ok(None),
        }
    }

    /// Why the CPU backend runs instead of a GPU, when it was chosen as a fallback.
    pub fn cpu_fallback_reason(&self) -> Option<&Unavailable> {
        match self {
            Device::Cpu(device) => device.fallback_reason(),
            Device::Cuda(_) => None,
        }
    }

    /// The CUDA device, if this is one.
    pub fn as_cuda(&self) -> Option<&cuda::CudaDevice> {
        match self {
            Device::Cuda(device) => Some(device),
            Device::Cpu(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_parse_case_insensitively() {
        assert_eq!("CUDA".parse::<BackendChoice>().unwrap(), BackendChoice::Only(BackendKind::Cuda));
        assert_eq!(" cpu ".parse::<BackendChoice>().unwrap(), BackendChoice::Only(BackendKind::Cpu));
        assert_eq!("auto".parse::<BackendChoice>().unwrap(), BackendChoice::Auto);
        assert_eq!("".parse::<BackendChoice>().unwrap(), BackendChoice::Auto);
    }

    #[test]
    fn unknown_backend_is_an_error_naming_the_choices() {
        let error = "vulkan".parse::<BackendChoice>().unwrap_err();
        assert!(matches!(&error, BackendError::UnknownBackend(name) if name == "vulkan"));
        assert_eq!(error.to_string(), "unknown backend \"vulkan\": expected one of `auto`, `cpu`, `cuda`");
    }

    #[test]
    fn every_gpu_or_the_cpu_is_selected() {
        let devices = Device::open_selection(BackendChoice::Auto, &DeviceSelection::All).unwrap();
        match cuda::CudaDevice::count() {
            Ok(count) => {
                let ordinals: Vec<usize> =
                    devices.iter().map(|device| device.as_cuda().unwrap().ordinal()).collect();
                assert_eq!(ordinals, (0..count).collect::<Vec<_>>());
            }
            Err(_) => {
                assert_eq!(devices.len(), 1);
                assert!(devices[0].cpu_fallback_reason().is_some());
            }
        }
    }

    #[test]
    fn a_missing_gpu_is_an_error_listing_those_present() {
        let error = Device::open_selection(BackendChoice::Auto, &DeviceSelection::Ordinals(vec![0, 4096]))
            .unwrap_err();
        assert!(matches!(&error, BackendError::NoSuchDevices { .. }), "{error}");
        assert!(error.to_string().starts_with("GPU "), "{error}");
    }

    #[test]
    fn the_cpu_backend_selects_the_cpu_for_all_and_refuses_gpu_numbers() {
        let cpu = BackendChoice::Only(BackendKind::Cpu);
        let devices = Device::open_selection(cpu, &DeviceSelection::All).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].backend(), BackendKind::Cpu);
        assert!(devices[0].cpu_fallback_reason().is_none());
        let error = Device::open_selection(cpu, &DeviceSelection::Ordinals(vec![0])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "GPU 0 asked for, but the GPUs present are: none in use (the CPU backend was chosen)"
        );
    }

    #[test]
    fn forced_cpu_is_not_a_fallback() {
        let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        assert_eq!(device.backend(), BackendKind::Cpu);
        assert!(device.cpu_fallback_reason().is_none());
    }

    #[test]
    fn auto_either_finds_a_gpu_or_records_why_not() {
        let device = Device::open(BackendChoice::Auto).unwrap();
        match device.backend() {
            BackendKind::Cuda => assert!(device.cpu_fallback_reason().is_none()),
            BackendKind::Cpu => assert!(device.cpu_fallback_reason().is_some()),
        }
    }
}
