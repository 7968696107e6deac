//! NVML, the NVIDIA management library: PCIe link state and traffic counters.
//!
//! Built with the feature `nvml` only. NVML is optional at run time too: it ships with the
//! driver as `libnvidia-ml.so.1`; where it is missing every answer is an error string that
//! callers print as "unknown".

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{PcieUtilCounter, TopologyLevel};

/// A GPU's PCIe link: generation and lane count, now and at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PcieLink {
    /// The generation the link runs at now (idle links often drop to generation 1).
    pub current_generation: u32,
    /// The lanes in use now.
    pub current_width: u32,
    /// The highest generation the GPU and the slot support together.
    pub max_generation: u32,
    /// The most lanes the GPU and the slot support together.
    pub max_width: u32,
}

/// An open NVML session.
#[derive(Debug)]
pub struct NvmlSession {
    nvml: Nvml,
}

impl NvmlSession {
    /// Opens NVML.
    ///
    /// # Errors
    /// NVML's error, as text, when the library is missing or the driver is not running.
    pub fn open() -> Result<NvmlSession, String> {
        // The unversioned name exists only with development packages; the driver ships `.so.1`.
        Nvml::builder()
            .lib_path("libnvidia-ml.so.1".as_ref())
            .init()
            .or_else(|_| Nvml::init())
            .map(|nvml| NvmlSession { nvml })
            .map_err(|error| format!("NVML unavailable: {error}"))
    }

    /// The driver's version string, for example `580.159.04`.
    ///
    /// # Errors
    /// NVML's error, as text.
    pub fn driver_version(&self) -> Result<String, String> {
        self.nvml.sys_driver_version().map_err(|error| error.to_string())
    }

    /// PCIe traffic of the GPU at `pci_bus_id` over NVML's last sampling window (about 20 ms),
    /// in KB/s: (from the GPU to the host, from the host to the GPU).
    ///
    /// # Errors
    /// NVML's error, as text.
    pub fn pcie_throughput(&self, pci_bus_id: &str) -> Result<(u32, u32), String> {
        let device = self.nvml.device_by_pci_bus_id(pci_bus_id).map_err(|error| error.to_string())?;
        let read = |counter| device.pcie_throughput(counter).map_err(|error| error.to_string());
        Ok((read(PcieUtilCounter::Send)?, read(PcieUtilCounter::Receive)?))
    }

    /// The closest common ancestor of the GPUs at `a` and `b` in the PCIe tree
    /// (`nvmlDeviceGetTopologyCommonAncestor`): `internal` (one board), `single_switch`,
    /// `multiple_switches`, `host_bridge`, `numa_node` or `system` (across NUMA nodes).
    ///
    /// # Errors
    /// NVML's error, as text.
    pub fn topology(&self, a: &str, b: &str) -> Result<&'static str, String> {
        let find = |bus: &str| {
            self.nvml
                .device_by_pci_bus_id(bus)
                .map_err(|error| format!("NVML has no device at {bus}: {error}"))
        };
        let level = find(a)?.topology_common_ancestor(find(b)?).map_err(|error| error.to_string())?;
        Ok(match level {
            TopologyLevel::Internal => "internal",
            TopologyLevel::Single => "single_switch",
            TopologyLevel::Multiple => "multiple_switches",
            TopologyLevel::HostBridge => "host_bridge",
            TopologyLevel::Node => "numa_node",
            TopologyLevel::System => "system",
        })
    }

    /// The PCIe link of the GPU at `pci_bus_id` (as CUDA reports it).
    ///
    /// # Errors
    /// NVML's error, as text, when the device is not found or does not report its link.
    pub fn pcie_link(&self, pci_bus_id: &str) -> Result<PcieLink, String> {
        let device = self
            .nvml
            .device_by_pci_bus_id(pci_bus_id)
            .map_err(|error| format!("NVML has no device at {pci_bus_id}: {error}"))?;
        let read =
            |value: Result<u32, nvml_wrapper::error::NvmlError>| value.map_err(|error| error.to_string());
        Ok(PcieLink {
            current_generation: read(device.current_pcie_link_gen())?,
            current_width: read(device.current_pcie_link_width())?,
            max_generation: read(device.max_pcie_link_gen())?,
            max_width: read(device.max_pcie_link_width())?,
        })
    }
}
