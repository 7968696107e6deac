//! The host side of the doctor: the limits and kernel settings that decide whether memory can
//! be pinned, registered or backed by huge pages.

use std::path::Path;

use hetmem::error::NVRTC_REMEDY;

use super::{Check, NvrtcReport};

/// What the host offers for sharing memory with a GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostReport {
    /// RLIMIT_MEMLOCK soft limit in bytes; `None` when unlimited.
    pub memlock_limit_bytes: Option<u64>,
    /// Whether RLIMIT_MEMLOCK is unlimited.
    pub memlock_unlimited: bool,
    /// Whether this process holds CAP_IPC_LOCK, which lifts the memlock limit (root has it).
    pub cap_ipc_lock: bool,
    /// Transparent huge page mode (`always`, `madvise`, `never`); `None` where unknown.
    pub transparent_hugepages: Option<String>,
    /// Free pre-reserved hugetlbfs pages (`HugePages_Free`).
    pub hugetlb_free_pages: Option<u64>,
    /// The hugetlbfs page size in bytes.
    pub hugetlb_page_size_bytes: Option<u64>,
    /// The base page size in bytes.
    pub page_size_bytes: u64,
    /// Host memory in bytes (`MemTotal`).
    pub total_memory_bytes: Option<u64>,
    /// NUMA nodes; `None` where the kernel does not say.
    pub numa_nodes: Option<usize>,
    /// The run-time CUDA compiler.
    pub nvrtc: NvrtcReport,
}

impl HostReport {
    /// Reads the host's settings.
    pub fn gather(nvrtc: NvrtcReport) -> HostReport {
        let memlock = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostReport {
            memlock_limit_bytes: memlock,
            memlock_unlimited: memlock.is_none(),
            cap_ipc_lock: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| has_capability(&status, CAP_IPC_LOCK))
                .unwrap_or(false),
            transparent_hugepages: std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .ok()
                .and_then(|text| selected_mode(&text)),
            hugetlb_free_pages: meminfo_value(&meminfo, "HugePages_Free"),
            hugetlb_page_size_bytes: meminfo_value(&meminfo, "Hugepagesize").map(|kib| kib * 1024),
            page_size_bytes: rustix::param::page_size() as u64,
            total_memory_bytes: meminfo_value(&meminfo, "MemTotal").map(|kib| kib * 1024),
            numa_nodes: count_numa_nodes(Path::new("/sys/devices/system/node")),
            nvrtc,
        }
    }

    /// The ok / warn / fail lines for the host. A missing NVRTC is a warning: hetmem's own
    /// kernels then run from their shipped PTX, and only CUDA C stages need it.
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        // Measured on the H200 machine (driver 580): without CAP_IPC_LOCK and with a 64 KiB
        // limit, cuMemHostAlloc and cuMemHostRegister both pinned 64 MiB. NVIDIA's driver does
        // not count pinned memory against RLIMIT_MEMLOCK, so a low limit is no fault.
        checks.push(match self.memlock_limit_bytes {
            None => Check::ok("host", "memlock", "RLIMIT_MEMLOCK unlimited"),
            Some(limit) if self.cap_ipc_lock => Check::ok(
                "host",
                "memlock",
                format!("RLIMIT_MEMLOCK {} KiB, lifted by CAP_IPC_LOCK", limit / 1024),
            ),
            Some(limit) => Check::ok(
                "host",
                "memlock",
                format!(
                    "RLIMIT_MEMLOCK {:.1} MiB; NVIDIA's driver pins past it (measured: driver 580)",
                    limit as f64 / (1 << 20) as f64
                ),
            ),
        });
        checks.push(match self.transparent_hugepages.as_deref() {
            Some(mode @ ("always" | "madvise")) => Check::ok(
                "host",
                "transparent_hugepages",
                format!("THP {mode}: huge-page buffers register faster (2 MiB pages)"),
            ),
            Some(mode) => Check::warn(
                "host",
                "transparent_hugepages",
                format!("THP {mode}: large buffers use 4 KiB pages"),
                "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (as root) for faster registration",
            ),
            None => Check::ok("host", "transparent_hugepages", "not reported by this kernel"),
        });
        checks.push(Check::ok(
            "host",
            "hugetlb_pages",
            match self.hugetlb_free_pages {
                Some(0) | None => {
                    "no free hugetlbfs pages (MAP_HUGETLB unavailable; hetmem uses THP)".to_string()
                }
                Some(free) => format!("{free} free hugetlbfs pages"),
            },
        ));
        checks.push(Check::ok(
            "host",
            "page_size",
            format!("{} KiB base pages", self.page_size_bytes / 1024),
        ));
        checks.push(Check::ok(
            "host",
            "numa_nodes",
            match self.numa_nodes {
                Some(nodes) => format!("{nodes} NUMA node(s)"),
                None => "NUMA layout not reported".to_string(),
            },
        ));
        checks.push(match (&self.nvrtc.version, &self.nvrtc.error) {
            (Some(version), _) => Check::ok(
                "host",
                "nvrtc",
                format!("NVRTC {version} ({})", self.nvrtc.library.as_deref().unwrap_or("libnvrtc")),
            ),
            (None, error) => Check::warn(
                "host",
                "nvrtc",
                format!(
                    "{}: hetmem's kernels run from their shipped PTX; CUDA C stages need NVRTC",
                    error.as_deref().unwrap_or("NVRTC not found")
                ),
                NVRTC_REMEDY,
            ),
        });
        checks
    }
}

/// The capability number of CAP_IPC_LOCK (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// Whether the `CapEff` mask in `/proc/self/status` text holds capability `bit`.
pub(crate) fn has_capability(status: &str, bit: u32) -> Option<bool> {
    let mask = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
    Some(mask & (1 << bit) != 0)
}

/// The bracketed choice in a sysfs mode file such as `always [madvise] never`.
pub(crate) fn selected_mode(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = start + text[start..].find(']')?;
    Some(text[start + 1..end].to_string())
}

/// The number in a `/proc/meminfo` line such as `MemTotal:  131072 kB`.
pub(crate) fn meminfo_value(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        (name.trim() == key).then(|| rest.split_whitespace().next()?.parse().ok())?
    })
}

fn count_numa_nodes(dir: &Path) -> Option<usize> {
    let entries = std::fs::read_dir(dir).ok()?;
    let count = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("node"))
                .is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    (count > 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn report() -> HostReport {
        HostReport {
            memlock_limit_bytes: None,
            memlock_unlimited: true,
            cap_ipc_lock: false,
            transparent_hugepages: Some("madvise".into()),
            hugetlb_free_pages: Some(0),
            hugetlb_page_size_bytes: Some(2 << 20),
            page_size_bytes: 4096,
            total_memory_bytes: Some(128 << 30),
            numa_nodes: Some(1),
            nvrtc: NvrtcReport {
                version: Some("13.0".into()),
                library: Some("libnvrtc.so.13".into()),
                error: None,
            },
        }
    }

    fn status_of(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|check| check.name == name).unwrap().status
    }

    #[test]
    fn thp_mode_is_the_bracketed_word() {
        assert_eq!(selected_mode("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(selected_mode("[always] madvise never").as_deref(), Some("always"));
        assert_eq!(selected_mode("always madvise never"), None);
    }

    #[test]
    fn meminfo_values_are_read_by_exact_key() {
        let text = "MemTotal:       131072 kB\nHugePages_Total:       0\nHugePages_Free:        7\n";
        assert_eq!(meminfo_value(text, "MemTotal"), Some(131072));
        assert_eq!(meminfo_value(text, "HugePages_Free"), Some(7));
        assert_eq!(meminfo_value(text, "HugePages"), None);
    }

    #[test]
    fn a_small_memlock_limit_is_reported_but_not_a_fault() {
        let mut host = report();
        host.memlock_limit_bytes = Some(8 << 20);
        host.memlock_unlimited = false;
        let checks = host.checks();
        let memlock = checks.iter().find(|check| check.name == "memlock").unwrap();
        assert_eq!(memlock.status, Status::Ok);
        assert!(
            memlock.detail.contains("8.0 MiB") && memlock.detail.contains("pins past it"),
            "{}",
            memlock.detail
        );
    }

    #[test]
    fn cap_ipc_lock_lifts_the_memlock_warning() {
        assert_eq!(has_capability("Name:\tx\nCapEff:\t000001ffffffffff\n", CAP_IPC_LOCK), Some(true));
        assert_eq!(has_capability("CapEff:\t0000000000000000\n", CAP_IPC_LOCK), Some(false));
        assert_eq!(has_capability("CapEff:\t0000000000004000\n", CAP_IPC_LOCK), Some(true));
        assert_eq!(has_capability("no such line", CAP_IPC_LOCK), None);
        let mut host = report();
        host.memlock_limit_bytes = Some(64 << 10);
        host.memlock_unlimited = false;
        host.cap_ipc_lock = true;
        assert_eq!(status_of(&host.checks(), "memlock"), Status::Ok);
    }

    #[test]
    fn missing_nvrtc_warns_with_the_remedy_since_kernels_ship_as_ptx() {
        let mut host = report();
        assert_eq!(status_of(&host.checks(), "nvrtc"), Status::Ok);
        host.nvrtc =
            NvrtcReport { version: None, library: None, error: Some("NVRTC 12 or 13 not found".into()) };
        let checks = host.checks();
        let nvrtc = checks.iter().find(|check| check.name == "nvrtc").unwrap();
        assert_eq!(nvrtc.status, Status::Warn);
        assert!(nvrtc.detail.contains("shipped PTX"), "{}", nvrtc.detail);
        assert!(nvrtc.remedy.as_deref().unwrap().contains("nvidia-cuda-nvrtc"));
    }

    #[test]
    fn thp_never_warns() {
        let mut host = report();
        host.transparent_hugepages = Some("never".into());
        assert_eq!(status_of(&host.checks(), "transparent_hugepages"), Status::Warn);
    }

    #[test]
    fn this_machine_reports_a_page_size_and_memory() {
        let host = HostReport::gather(report().nvrtc);
        assert!(host.page_size_bytes.is_power_of_two() && host.page_size_bytes >= 4096);
        assert!(host.total_memory_bytes.unwrap() > 0);
        assert_eq!(host.memlock_unlimited, host.memlock_limit_bytes.is_none());
    }
}
