//! `hetmem bench link` and `hetmem bench compare`: the library's reports as tables and plots.

use std::path::{Path, PathBuf};

use hetmem_bench::compare::CompareReport;
use hetmem_bench::link::{Direction, LinkPath, LinkReport};
use hetmem_bench::sizes;

use super::plot::{self, Series};
use super::signals;
use crate::table::Table;

/// The tables' names (their CSV files): bandwidth, latency, completion signals.
pub const TABLES: [&str; 3] = ["link_bandwidth", "link_latency", "link_completion"];
/// The plots: bandwidth and latency against size, the spread of the smallest transfers.
pub const PLOTS: [&str; 3] = ["bandwidth_vs_size.svg", "latency_vs_size.svg", "latency_spread.svg"];
/// The compare table's name.
pub const COMPARE_TABLE: &str = "compare";
/// The compare plots: latency, bandwidth.
pub const COMPARE_PLOTS: [&str; 2] = ["compare_latency.svg", "compare_bandwidth.svg"];

fn sorted_unique(mut values: Vec<usize>) -> Vec<usize> {
    values.sort_unstable();
    values.dedup();
    values
}

/// What marks a bandwidth cell whose median may be off.
const UNSURE_MARK: &str = "?";

/// A bandwidth cell's text: the median, its share of the ceiling, how many samples and how
/// widely they spread, and a mark when that makes the median unsure.
fn bandwidth_cell(cell: &hetmem_bench::link::BandwidthCell) -> String {
    let median = match cell.ratio_to_ceiling {
        Some(ratio) => format!("{:.2} ({:.0}%)", cell.gb_s.median, ratio * 100.0),
        None => format!("{:.2}", cell.gb_s.median),
    };
    let mark = if cell.unsure.is_some() { format!(" {UNSURE_MARK}") } else { String::new() };
    format!("{median} [{}/{:.0}%]{mark}", cell.gb_s.samples, cell.spread * 100.0)
}

/// Bandwidth (path x size), latency (path x size) and, where measured, the completion signals.
pub fn tables(report: &LinkReport) -> Vec<Table> {
    let mut tables = Vec::new();
    let sizes_measured = sorted_unique(report.bandwidth.iter().map(|cell| cell.bytes).collect());
    let mut headers = vec!["path".to_string()];
    headers.extend(sizes_measured.iter().map(|&bytes| sizes::format(bytes)));
    let mut bandwidth = Table::new(
        TABLES[0],
        format!("link bandwidth on {}, GB/s median (share of the copy-engine ceiling)", report.device),
        &[],
    );
    bandwidth.headers = headers.clone();
    let mut paths: Vec<LinkPath> = Vec::new();
    for cell in &report.bandwidth {
        if !paths.contains(&cell.path) {
            paths.push(cell.path);
        }
    }
    for path in &paths {
        let mut row = vec![path.name().to_string()];
        for &bytes in &sizes_measured {
            let cell = report.bandwidth.iter().find(|cell| cell.path == *path && cell.bytes == bytes);
            row.push(cell.map_or("-".to_string(), bandwidth_cell));
        }
        bandwidth.row(row);
    }
    bandwidth.note(format!(
        "[n/spread]: the timed samples and their spread, slowest to fastest, as a share of the median; \
         {UNSURE_MARK} marks a cell with fewer than {} samples or a spread over {:.0}%: its median may be off, \
         so rerun it without --quick or with more --repeats",
        hetmem_bench::link::MIN_TIMED,
        hetmem_bench::link::WIDE_SPREAD * 100.0
    ));
    if let Some(ceiling) = report.ceiling {
        bandwidth.note(format!(
            "ceiling (pinned async copies, best median in this run): H2D {:.2} GB/s, D2H {:.2} GB/s; \
             two-way rows are per direction, against the slower ceiling",
            ceiling.h2d_gb_s, ceiling.d2h_gb_s
        ));
    }
    let measured = |path: LinkPath| report.bandwidth.iter().any(|cell| cell.path == path);
    if measured(LinkPath::WriteCombinedRead) {
        bandwidth.note(
            "write_combined_read against zero_copy_read: the seeds claim write-combined memory crosses the link \
             40% faster (and the CPU reads it slowly: `hetmem bench pinning` measures the CPU's side)",
        );
    }
    if measured(LinkPath::RandomReadBasePages) || measured(LinkPath::RandomReadHugePages) {
        bandwidth.note(format!(
            "random_read_4k_pages against random_read_2m_pages: 16-byte loads from random places of registered \
             memory; the seeds claim huge pages speed the GPU's access through its TLB. {}",
            hetmem_bench::link::page_sizes()
        ));
    }
    if report.bandwidth.iter().any(|cell| cell.direction != Direction::Host) {
        bandwidth
            .note("every cell was checked against the CPU (kernel XOR checksums, word-for-word compares)");
    }
    let samples = report.bandwidth.iter().map(|cell| cell.gb_s.samples);
    bandwidth.note(format!(
        "median of {} to {} timed repetitions after warm-up (more for smaller cells); 1 GB/s = 10^9 B/s",
        samples.clone().min().unwrap_or(0),
        samples.max().unwrap_or(0)
    ));
    if report.gpu_measured {
        bandwidth.note(if report.cold_cpu_cache {
            "each GPU bandwidth cell's host buffers (managed memory excepted) were evicted from the CPU's caches before it"
        } else {
            "host buffers left in the CPU's caches between cells (--warm-cpu-cache)"
        });
    }
    if let Some(because) = &report.gpu_not_measured_because {
        bandwidth.note(because.clone());
    }
    tables.push(bandwidth);

    let latency_sizes = sorted_unique(report.latency.iter().map(|cell| cell.bytes).collect());
    if !latency_sizes.is_empty() {
        let mut latency = Table::new(
            TABLES[1],
            format!("small-transfer latency on {}, us median (p99)", report.device),
            &[],
        );
        latency.headers = vec!["path".to_string()];
        latency.headers.extend(latency_sizes.iter().map(|&bytes| sizes::format(bytes)));
        let mut names = Vec::new();
        for cell in &report.latency {
            if !names.contains(&cell.path) {
                names.push(cell.path);
            }
        }
        for path in names {
            let mut row = vec![path.name().to_string()];
            for &bytes in &latency_sizes {
                let cell = report.latency.iter().find(|cell| cell.path == path && cell.bytes == bytes);
                row.push(match cell {
                    Some(cell) => cell
                        .us
                        .map_or("not measured".to_string(), |us| format!("{:.2} ({:.2})", us.median, us.p99)),
                    None => "-".to_string(),
                });
            }
            latency.row(row);
        }
        for cell in &report.latency {
            if let Some(note) = &cell.note {
                let line = format!("{}: {note}", cell.path.name());
                if !latency.notes.contains(&line) {
                    latency.note(line);
                }
            }
        }
        tables.push(latency);
    }
    if let Some(completion) = &report.completion {
        let mut table = signals::completion_table(completion);
        table.name = TABLES[2].to_string();
        tables.push(table);
    }
    tables
}

/// `bandwidth_vs_size.svg`, `latency_vs_size.svg`, `latency_spread.svg` (the smallest latency
/// size, and the completion signals).
pub fn plots(report: &LinkReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut series: Vec<Series> = Vec::new();
    for cell in &report.bandwidth {
        let point = (cell.bytes as f64, cell.gb_s.median);
        match series.iter_mut().find(|(name, _)| name == cell.path.name()) {
            Some((_, points)) => points.push(point),
            None => series.push((cell.path.name().to_string(), vec![point])),
        }
    }
    if !series.is_empty() {
        let title = format!("bandwidth vs size, {}", report.device);
        let file = plot::file_in(dir, PLOTS[0])?;
        written.push(plot::lines(&file, &title, ("bytes per transfer", "GB/s (median)"), &series, false)?);
    }
    let mut series: Vec<Series> = Vec::new();
    for cell in &report.latency {
        let Some(us) = cell.us else { continue };
        let point = (cell.bytes as f64, us.median);
        match series.iter_mut().find(|(name, _)| name == cell.path.name()) {
            Some((_, points)) => points.push(point),
            None => series.push((cell.path.name().to_string(), vec![point])),
        }
    }
    if series.iter().any(|(_, points)| points.len() > 1) {
        let title = format!("latency vs size, {}", report.device);
        let file = plot::file_in(dir, PLOTS[1])?;
        written.push(plot::lines(
            &file,
            &title,
            ("bytes per transfer", "microseconds (median)"),
            &series,
            true,
        )?);
    }
    let smallest = report.latency.iter().map(|cell| cell.bytes).min();
    let mut items: Vec<(String, hetmem_bench::Summary)> = report
        .latency
        .iter()
        .filter(|cell| Some(cell.bytes) == smallest)
        .filter_map(|cell| cell.us.map(|us| (cell.path.name().to_string(), us)))
        .collect();
    if let Some(completion) = &report.completion {
        items.extend(completion.rows.iter().map(|row| {
            (format!("signal: {}", super::snake_name(&row.mechanism).unwrap_or_default()), row.go_to_known_us)
        }));
    }
    if !items.is_empty() {
        let title = format!(
            "latency distribution at {} (bar: min..p99, dot: median, ring: p90)",
            sizes::format(smallest.unwrap_or(4))
        );
        let file = plot::file_in(dir, PLOTS[2])?;
        written.push(plot::spread(&file, &title, "microseconds", &items)?);
    }
    Ok(written)
}

/// The compare table: copy vs zero-copy vs a file mapping.
pub fn compare_tables(report: &CompareReport) -> Vec<Table> {
    let mut table = Table::new(
        COMPARE_TABLE,
        format!("copy vs zero-copy vs mmap on {}, host to device", report.device),
        &[
            "method",
            &format!("latency us ({})", sizes::format(report.small_bytes)),
            &format!("GB/s ({})", sizes::format(report.large_bytes)),
            "share of copy engine",
        ],
    );
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "not measured".to_string());
    for row in &report.rows {
        table.row(vec![
            row.method.to_string(),
            or_dash(row.latency_us.map(|us| format!("{us:.2}"))),
            or_dash(row.bandwidth_gb_s.map(|gb| format!("{gb:.2}"))),
            match (row.ratio_to_ceiling, row.bandwidth_gb_s) {
                (Some(ratio), _) => format!("{:.0}%", ratio * 100.0),
                (None, Some(_)) => "n/a (host only)".to_string(),
                (None, None) => "not measured".to_string(),
            },
        ]);
    }
    table.note(
        "memcpy: cuMemcpyHtoD (synchronous); zero_copy and mmap: a kernel reading mapped pinned memory or a \
         registered read-only file mapping, latency including the launch and the stream synchronisation",
    );
    if let Some(because) = &report.gpu_not_measured_because {
        table.note(because.clone());
    }
    vec![table]
}

/// `compare_latency.svg` and `compare_bandwidth.svg`: one column per method.
pub fn compare_plots(report: &CompareReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let point =
        |value: f64| hetmem_bench::Summary { samples: 1, min: value, median: value, p90: value, p99: value };
    let latency: Vec<_> = report
        .rows
        .iter()
        .filter_map(|row| row.latency_us.map(|us| (row.method.to_string(), point(us))))
        .collect();
    if !latency.is_empty() {
        let file = plot::file_in(dir, COMPARE_PLOTS[0])?;
        let title = format!("latency of {} (median)", sizes::format(report.small_bytes));
        written.push(plot::spread(&file, &title, "microseconds", &latency)?);
    }
    let bandwidth: Vec<_> = report
        .rows
        .iter()
        .filter_map(|row| row.bandwidth_gb_s.map(|gb| (row.method.to_string(), point(gb))))
        .collect();
    if !bandwidth.is_empty() {
        let file = plot::file_in(dir, COMPARE_PLOTS[1])?;
        let title = format!("bandwidth at {} (median)", sizes::format(report.large_bytes));
        written.push(plot::spread(&file, &title, "GB/s", &bandwidth)?);
    }
    Ok(written)
}
