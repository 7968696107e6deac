//! The GPU side of the doctor: each device, its link, and the attributes that decide which
//! way of sharing memory works on it.

use super::Check;
use hetmem::backend::cuda::{CudaDevice, DeviceAttributes};
use hetmem::backend::nvml::{NvmlSession, PcieLink};

/// One CUDA device as the doctor reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    /// The device's index.
    pub index: usize,
    /// The product name.
    pub name: String,
    /// Compute capability, for example `9.0`.
    pub compute_capability: String,
    /// Device memory in bytes.
    pub total_memory_bytes: u64,
    /// The PCI bus id.
    pub pci_bus_id: String,
    /// The PCIe link, where NVML reports it.
    pub pcie: Option<PcieLink>,
    /// Why the link is unknown, where it is.
    pub pcie_error: Option<String>,
    /// The attributes that decide strategies.
    pub attributes: DeviceAttributes,
}

impl DeviceReport {
    /// Describes `device`, asking NVML (where open) for its link.
    pub fn gather(device: &CudaDevice, nvml: Result<&NvmlSession, &String>) -> DeviceReport {
        let (pcie, pcie_error) =
            match nvml.map_err(String::clone).and_then(|nvml| nvml.pcie_link(device.pci_bus_id())) {
                Ok(link) => (Some(link), None),
                Err(error) => (None, Some(error)),
            };
        DeviceReport {
            index: device.ordinal(),
            name: device.name().to_string(),
            compute_capability: device.compute_capability().to_string(),
            total_memory_bytes: device.total_memory(),
            pci_bus_id: device.pci_bus_id().to_string(),
            pcie,
            pcie_error,
            attributes: *device.attributes(),
        }
    }

    /// The ok / warn / fail lines for this device.
    pub fn checks(&self) -> Vec<Check> {
        let scope = format!("device {}", self.index);
        let a = &self.attributes;
        let mut checks = vec![if a.can_map_host_memory {
            Check::ok(&scope, "can_map_host_memory", "host memory can be mapped (zero-copy works)")
        } else {
            Check::fail(
                &scope,
                "can_map_host_memory",
                "host memory cannot be mapped: no zero-copy strategy",
                "use the Copy or PinnedAsync strategies on this device",
            )
        }];
        let mut flag = |name: &'static str, value: bool, yes: &str, no: &str, remedy: Option<&str>| {
            checks.push(match (value, remedy) {
                (true, _) | (false, None) => Check::ok(&scope, name, if value { yes } else { no }),
                (false, Some(remedy)) => Check::warn(&scope, name, no, remedy),
            });
        };
        flag(
            "unified_addressing",
            a.unified_addressing,
            "host and device share one address space",
            "no unified addressing: mapped pointers differ between host and device",
            Some("use a 64-bit OS and a current driver"),
        );
        flag(
            "pageable_memory_access",
            a.pageable_memory_access,
            "kernels may read plain pageable memory (HMM/ATS)",
            "kernels cannot read plain pageable memory: hetmem pins or registers it first",
            None,
        );
        flag(
            "pageable_memory_access_uses_host_page_tables",
            a.pageable_memory_access_uses_host_page_tables,
            "pageable access goes through the host's page tables (ATS)",
            "no ATS",
            None,
        );
        flag(
            "concurrent_managed_access",
            a.concurrent_managed_access,
            "CPU and GPU may touch managed memory at once; prefetch and advice work",
            "managed memory is locked to one side at a time",
            Some("prefer pinned or mapped memory over managed memory on this device"),
        );
        flag(
            "host_register_supported",
            a.host_register_supported,
            "existing host memory can be registered",
            "existing memory cannot be registered",
            Some("allocate pinned buffers instead of registering existing ones"),
        );
        flag(
            "read_only_host_register_supported",
            a.read_only_host_register_supported,
            "read-only file mappings can be registered",
            "read-only mappings cannot be registered: file windows are copied",
            Some("file windows fall back to copies; expect lower throughput"),
        );
        flag(
            "host_native_atomic_supported",
            a.host_native_atomic_supported,
            "atomics on host memory are native",
            "atomics on host memory are not native: hetmem's flags use plain stores",
            None,
        );
        flag(
            "integrated",
            a.integrated,
            "integrated GPU: host and device share physical memory; zero-copy is the natural path",
            "discrete GPU: data crosses the link",
            None,
        );
        checks.push(match a.async_engine_count {
            0 => Check::warn(
                &scope,
                "async_engine_count",
                "no copy engine: copies stall kernels",
                "prefer zero-copy strategies on this device",
            ),
            1 => Check::warn(
                &scope,
                "async_engine_count",
                "1 copy engine: uploads and downloads cannot overlap",
                "pipelines gain less from overlapping; zero-copy may win",
            ),
            engines => Check::ok(
                &scope,
                "async_engine_count",
                format!("{engines} copy engines: upload, download and kernels can overlap"),
            ),
        });
        checks.push(match (&self.pcie, &self.pcie_error) {
            (Some(link), _) if self.attributes.integrated => Check::ok(&scope, "pcie", link_text(link)),
            (Some(link), _) if link.max_width < 16 => Check::warn(
                &scope,
                "pcie",
                link_text(link),
                "the slot gives fewer than 16 lanes: move the GPU to an x16 slot for full bandwidth",
            ),
            (Some(link), _) => Check::ok(&scope, "pcie", link_text(link)),
            (None, error) => Check::warn(
                &scope,
                "pcie",
                format!("PCIe link unknown: {}", error.as_deref().unwrap_or("not reported")),
                "NVML ships with the driver as libnvidia-ml.so.1; `hetmem bench link` measures the link directly",
            ),
        });
        checks
    }
}

fn link_text(link: &PcieLink) -> String {
    let mut text = format!(
        "PCIe Gen{} x{} (now Gen{} x{})",
        link.max_generation, link.max_width, link.current_generation, link.current_width
    );
    if link.current_generation < link.max_generation {
        text.push_str("; idle links drop to a lower generation and rise under load");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn h200() -> DeviceReport {
        DeviceReport {
            index: 0,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            total_memory_bytes: 143771 << 20,
            pci_bus_id: "00000000:00:05.0".into(),
            pcie: Some(PcieLink {
                current_generation: 1,
                current_width: 16,
                max_generation: 5,
                max_width: 16,
            }),
            pcie_error: None,
            attributes: DeviceAttributes {
                can_map_host_memory: true,
                unified_addressing: true,
                pageable_memory_access: false,
                pageable_memory_access_uses_host_page_tables: false,
                concurrent_managed_access: true,
                host_register_supported: true,
                read_only_host_register_supported: true,
                host_native_atomic_supported: false,
                async_engine_count: 3,
                integrated: false,
                multiprocessor_count: 132,
                gpu_direct_rdma_supported: true,
                can_use_host_pointer_for_registered_mem: true,
            },
        }
    }

    fn check(report: &DeviceReport, name: &str) -> Check {
        report.checks().into_iter().find(|check| check.name == name).unwrap()
    }

    #[test]
    fn an_h200_passes_every_check() {
        let checks = h200().checks();
        assert!(checks.iter().all(|check| check.status == Status::Ok), "{checks:#?}");
        assert_eq!(checks[0].name, "can_map_host_memory");
        let pcie = check(&h200(), "pcie");
        assert!(pcie.detail.starts_with("PCIe Gen5 x16 (now Gen1 x16)"), "{}", pcie.detail);
    }

    #[test]
    fn no_mapping_fails_and_one_copy_engine_warns() {
        let mut device = h200();
        device.attributes.can_map_host_memory = false;
        device.attributes.async_engine_count = 1;
        assert_eq!(check(&device, "can_map_host_memory").status, Status::Fail);
        assert_eq!(check(&device, "async_engine_count").status, Status::Warn);
    }

    #[test]
    fn an_unknown_link_warns_and_says_why() {
        let mut device = h200();
        device.pcie = None;
        device.pcie_error = Some("NVML unavailable: library not found".into());
        let pcie = check(&device, "pcie");
        assert_eq!(pcie.status, Status::Warn);
        assert!(pcie.detail.contains("library not found"));
    }

    #[test]
    fn a_narrow_slot_warns() {
        let mut device = h200();
        device.pcie.as_mut().unwrap().max_width = 8;
        assert_eq!(check(&device, "pcie").status, Status::Warn);
    }
}
