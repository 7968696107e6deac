//! `hetmem bench compare`: seed 2's table, measured rather than asserted. Copying with the
//! driver (from pinned and from pageable memory) against a kernel reading mapped pinned memory
//! (zero-copy) and a kernel reading a registered read-only file mapping (mmap): the latency of
//! a small transfer and the bandwidth of a large one, host to device.

use super::link::{self, Ceiling, LatencyPath, LinkOptions, LinkPath, LinkReport};
use hetmem::backend::Device;

use crate::error::Result;

/// The small transfer's size: one page.
pub const SMALL_BYTES: usize = 4 << 10;

/// One method's row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompareRow {
    /// `memcpy_pinned`, `memcpy_pageable`, `zero_copy`, `mmap` or `host_memcpy`.
    pub method: &'static str,
    /// What the latency column measures.
    pub latency_path: LatencyPath,
    /// What the bandwidth column measures.
    pub bandwidth_path: LinkPath,
    /// Median microseconds to move the small transfer; `None` when not measured.
    pub latency_us: Option<f64>,
    /// Median GB/s of the large transfer; `None` when not measured.
    pub bandwidth_gb_s: Option<f64>,
    /// The bandwidth over the copy engines' host-to-device rate in the same run.
    pub ratio_to_ceiling: Option<f64>,
}

/// The comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompareReport {
    /// The device.
    pub device: String,
    /// Whether GPU rows were measured.
    pub gpu_measured: bool,
    /// Why not, when they were not.
    pub gpu_not_measured_because: Option<String>,
    /// The small transfer, bytes.
    pub small_bytes: usize,
    /// The large transfer, bytes.
    pub large_bytes: usize,
    /// The copy engines' rate in this run.
    pub ceiling: Option<Ceiling>,
    /// One row per method.
    pub rows: Vec<CompareRow>,
}

const ROWS: [(&str, LatencyPath, LinkPath); 5] = [
    ("memcpy_pinned", LatencyPath::PinnedSyncH2d, LinkPath::PinnedSyncH2d),
    ("memcpy_pageable", LatencyPath::PageableSyncH2d, LinkPath::PageableH2d),
    ("zero_copy", LatencyPath::ZeroCopyKernelRead, LinkPath::ZeroCopyRead),
    ("mmap", LatencyPath::FileKernelRead, LinkPath::RegisteredFileRead),
    ("host_memcpy", LatencyPath::HostMemcpy, LinkPath::HostMemcpy),
];

/// Measures the table on `device`: a large transfer of 256 MiB when `quick`, else 1 GiB.
///
/// # Errors
/// As [`link::measure`].
pub fn measure(device: &Device, quick: bool) -> Result<CompareReport> {
    let large_bytes = if quick { 256 << 20 } else { 1 << 30 };
    let options = LinkOptions {
        sizes: vec![large_bytes],
        paths: ROWS.iter().map(|row| row.2).collect(),
        repeats: if quick { 5 } else { 10 },
        warm_up: 1,
        latency_sizes: vec![SMALL_BYTES],
        latency_samples: if quick { 200 } else { 1000 },
        completion: false,
        cold_cpu_cache: true,
    };
    Ok(table(&link::measure(device, &options)?, large_bytes))
}

/// The table from a link report that measured its cells.
pub fn table(report: &LinkReport, large_bytes: usize) -> CompareReport {
    let rows = ROWS
        .iter()
        .map(|&(method, latency_path, bandwidth_path)| {
            let latency = report.latency.iter().find(|c| c.path == latency_path && c.bytes == SMALL_BYTES);
            let bandwidth =
                report.bandwidth.iter().find(|c| c.path == bandwidth_path && c.bytes == large_bytes);
            CompareRow {
                method,
                latency_path,
                bandwidth_path,
                latency_us: latency.and_then(|cell| cell.us).map(|us| us.median),
                bandwidth_gb_s: bandwidth.map(|cell| cell.gb_s.median),
                ratio_to_ceiling: bandwidth.and_then(|cell| cell.ratio_to_ceiling),
            }
        })
        .collect();
    CompareReport {
        device: report.device.clone(),
        gpu_measured: report.gpu_measured,
        gpu_not_measured_because: report.gpu_not_measured_because.clone(),
        small_bytes: SMALL_BYTES,
        large_bytes,
        ceiling: report.ceiling,
        rows,
    }
}
