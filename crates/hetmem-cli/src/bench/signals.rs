//! `hetmem bench completion` and `hetmem bench pinning`: the hand-off's costs as tables and
//! plots.

use std::path::{Path, PathBuf};

use hetmem_bench::completion::CompletionReport;
use hetmem_bench::pinning::PinningReport;

use super::plot::{self, Series};
use super::snake_name;
use crate::table::Table;

/// The completion table's name.
pub const COMPLETION_TABLE: &str = "completion";
/// The completion plot.
pub const COMPLETION_PLOT: &str = "completion_spread.svg";
/// The pinning table's name.
pub const PINNING_TABLE: &str = "pinning";
/// The pinning plot.
pub const PINNING_PLOT: &str = "pinning_setup.svg";

pub fn completion_table(report: &CompletionReport) -> Table {
    let mut table = Table::new(
        COMPLETION_TABLE,
        format!("completion latency on {} ({} samples each), microseconds", report.device, report.samples),
        &["mechanism", "median", "p90", "p99", "after kernel end"],
    );
    for row in &report.rows {
        let s = &row.go_to_known_us;
        table.row(vec![
            snake_name(&row.mechanism).unwrap_or_default(),
            format!("{:.2}", s.median),
            format!("{:.2}", s.p90),
            format!("{:.2}", s.p99),
            format!("{:.2}", row.after_kernel_end_us),
        ]);
    }
    table
}

/// `completion_spread.svg`.
pub fn completion_plots(report: &CompletionReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let items: Vec<_> = report
        .rows
        .iter()
        .map(|row| (snake_name(&row.mechanism).unwrap_or_default(), row.go_to_known_us))
        .collect();
    let file = plot::file_in(dir, COMPLETION_PLOT)?;
    let title = "completion signals: go to known (bar: min..p99, dot: median, ring: p90)";
    Ok(vec![plot::spread(&file, title, "microseconds", &items)?])
}

pub fn pinning_tables(report: &PinningReport) -> Vec<Table> {
    let mut table = Table::new(
        PINNING_TABLE,
        format!("pinning on {} (median of {} repeats)", report.device, report.repeats),
        &["method", "MiB", "setup ms", "GB/s", "release ms"],
    );
    for row in &report.rows {
        table.row(vec![
            snake_name(&row.method).unwrap_or_default(),
            (row.bytes >> 20).to_string(),
            format!("{:.2}", row.setup_ms),
            format!("{:.2}", row.bytes as f64 / 1e6 / row.setup_ms),
            format!("{:.2}", row.release_ms),
        ]);
    }
    for row in &report.cpu_access {
        table.note(format!(
            "CPU, {}: write {:.2} GB/s, read {:.2} GB/s",
            row.memory, row.write_gb_s, row.read_gb_s
        ));
    }
    table.note(
        "seeds' claims beside these: write-combined memory is slow for the CPU to read (the write_combined \
         line against the cached one); huge pages are cheaper to pin (touch_then_register_huge, 2 MiB pages, \
         against touch_then_register_base, 4 KiB pages)",
    );
    table.note(hetmem_bench::link::page_sizes());
    let pool = &report.pool_acquire_us;
    table.note(format!(
        "pool acquire+release of a 1080p RGB frame: median {:.2} us, p99 {:.2} us",
        pool.median, pool.p99
    ));
    vec![table]
}

/// `pinning_setup.svg`: setup time against size, one line per method.
pub fn pinning_plots(report: &PinningReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut series: Vec<Series> = Vec::new();
    for row in &report.rows {
        let name = snake_name(&row.method).unwrap_or_default();
        let point = (row.bytes as f64, row.setup_ms);
        match series.iter_mut().find(|(existing, _)| *existing == name) {
            Some((_, points)) => points.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let file = plot::file_in(dir, PINNING_PLOT)?;
    Ok(vec![plot::lines(&file, "pinning setup time", ("bytes pinned", "milliseconds"), &series, true)?])
}
