//! The doctor's report as text for a terminal.

use std::fmt::Write;

use hetmem_bench::doctor::{Report, Status};

const GIB: f64 = (1u64 << 30) as f64;

/// The report as aligned text lines, ending with a summary line.
pub fn report_text(report: &Report) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_text(report, &mut out);
    out
}

fn write_text(report: &Report, out: &mut String) -> std::fmt::Result {
    write_driver(report, out)?;
    write_devices(report, out)?;
    write_pairs(report, out)?;
    write_host(report, out)?;
    writeln!(out)?;
    write_checks(report, out)
}

/// The backend chosen and the driver found.
fn write_driver(report: &Report, out: &mut String) -> std::fmt::Result {
    writeln!(out, "hetmem {} doctor", report.hetmem_version)?;
    match &report.backend.fallback_reason {
        Some(reason) => writeln!(out, "backend: {} (fallback: {reason})", report.backend.selected)?,
        None => writeln!(out, "backend: {}", report.backend.selected)?,
    }
    match (&report.driver.cuda_version, &report.driver.driver_version) {
        (Some(cuda), Some(driver)) => writeln!(out, "driver:  CUDA {cuda}, NVIDIA {driver}")?,
        (Some(cuda), None) => writeln!(out, "driver:  CUDA {cuda}")?,
        (None, _) => writeln!(out, "driver:  none found")?,
    }
    Ok(())
}

/// Each GPU: its name, memory and link, and the attributes hetmem decides from.
fn write_devices(report: &Report, out: &mut String) -> std::fmt::Result {
    for device in &report.devices {
        let link = match &device.pcie {
            Some(link) => format!(
                "PCIe Gen{} x{} max, Gen{} x{} now",
                link.max_generation, link.max_width, link.current_generation, link.current_width
            ),
            None => "PCIe link unknown".to_string(),
        };
        writeln!(
            out,
            "device {}: {}, compute {}, {:.1} GiB, bus {}, {link}",
            device.index,
            device.name,
            device.compute_capability,
            device.total_memory_bytes as f64 / GIB,
            device.pci_bus_id
        )?;
        let a = &device.attributes;
        let flag = |value: bool| u8::from(value);
        writeln!(
            out,
            "  can_map_host_memory={} unified_addressing={} pageable_memory_access={} \
             pageable_memory_access_uses_host_page_tables={}",
            flag(a.can_map_host_memory),
            flag(a.unified_addressing),
            flag(a.pageable_memory_access),
            flag(a.pageable_memory_access_uses_host_page_tables)
        )?;
        writeln!(
            out,
            "  concurrent_managed_access={} host_register_supported={} \
             read_only_host_register_supported={} host_native_atomic_supported={}",
            flag(a.concurrent_managed_access),
            flag(a.host_register_supported),
            flag(a.read_only_host_register_supported),
            flag(a.host_native_atomic_supported)
        )?;
        writeln!(
            out,
            "  async_engine_count={} integrated={} multiprocessor_count={} gpu_direct_rdma_supported={} \
             can_use_host_pointer_for_registered_mem={}",
            a.async_engine_count,
            flag(a.integrated),
            a.multiprocessor_count,
            flag(a.gpu_direct_rdma_supported),
            flag(a.can_use_host_pointer_for_registered_mem)
        )?;
    }
    Ok(())
}

/// That there is no GPU or only one, or each pair of GPUs: its topology and peer access.
fn write_pairs(report: &Report, out: &mut String) -> std::fmt::Result {
    if report.devices.is_empty() {
        writeln!(out, "devices: none (GPU checks skipped; the CPU backend runs everything)")?;
    } else if report.devices.len() == 1 {
        writeln!(out, "pairs:   none (one GPU)")?;
    }
    for pair in &report.pairs {
        let peer = |value: Option<bool>| match value {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        };
        writeln!(
            out,
            "pair {}-{}: topology {}, peer access {}->{} {}, {}->{} {}",
            pair.a,
            pair.b,
            pair.topology.as_deref().unwrap_or("unknown"),
            pair.a,
            pair.b,
            peer(pair.peer_access_a_to_b),
            pair.b,
            pair.a,
            peer(pair.peer_access_b_to_a)
        )?;
    }
    Ok(())
}

/// The host's limits and the kernels' code.
fn write_host(report: &Report, out: &mut String) -> std::fmt::Result {
    let host = &report.host;
    writeln!(
        out,
        "host:    memlock {}, THP {}, {} free hugetlb pages, {} KiB pages, {} NUMA node(s), {}, NVRTC {}",
        host.memlock_limit_bytes.map_or("unlimited".to_string(), |bytes| format!("{} KiB", bytes / 1024)),
        host.transparent_hugepages.as_deref().unwrap_or("unknown"),
        host.hugetlb_free_pages.map_or("?".to_string(), |pages| pages.to_string()),
        host.page_size_bytes / 1024,
        host.numa_nodes.map_or("?".to_string(), |nodes| nodes.to_string()),
        host.total_memory_bytes
            .map_or("RAM unknown".to_string(), |bytes| format!("{:.1} GiB RAM", bytes as f64 / GIB)),
        host.nvrtc.version.as_deref().unwrap_or("not found"),
    )?;
    if !report.devices.is_empty() {
        writeln!(
            out,
            "kernels: {} (hetmem's own; CUDA C stages need NVRTC)",
            match report.kernel_code.as_str() {
                "PTX" => "shipped PTX, compiled by the driver when loaded",
                _ => "compiled by NVRTC for each GPU, cached",
            }
        )?;
    }
    Ok(())
}

/// The checks, aligned, each remedy under its check, and the summary line.
fn write_checks(report: &Report, out: &mut String) -> std::fmt::Result {
    let scope_width = report.checks.iter().map(|c| c.scope.len()).max().unwrap_or(0);
    let name_width = report.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for check in &report.checks {
        let status = match check.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        writeln!(
            out,
            "{status:<4}  {:<scope_width$}  {:<name_width$}  {}",
            check.scope, check.name, check.detail
        )?;
        if let Some(remedy) = &check.remedy {
            writeln!(out, "{:<4}  {:<scope_width$}  {:<name_width$}  remedy: {remedy}", "", "", "")?;
        }
    }
    let count = |status| report.checks.iter().filter(|check| check.status == status).count();
    writeln!(out, "\n{} ok, {} warn, {} fail", count(Status::Ok), count(Status::Warn), count(Status::Fail))
}
