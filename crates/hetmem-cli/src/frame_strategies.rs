//! The per-strategy frame table, as `hetmem demo` and `hetmem bench pipeline` show it: the
//! measurement is hetmem-bench's ([`hetmem_bench::frame_strategies`]); here are its progress
//! bars, the segment count from the environment, and the table.

use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage};
use hetmem::{Device, FrameFilter, Strategy};
use hetmem_bench::frame_strategies::{self, Progress, TableSetup};
pub use hetmem_bench::frame_strategies::{Report, render};

use crate::table::Table;
use crate::ui::Ui;

/// Runs `frames` frames of `format` through each strategy in `wanted` (every one the machine
/// has when empty; on the CPU backend, the CPU strategy), each checked bit-exact against the
/// CPU path first. `first` sees the first strategy's filter before its frames (the demo writes
/// its picture from it); `ui` shows a bar of each strategy's frames.
pub fn measure(
    device: &Device,
    format: FrameFormat,
    kernel: &Gaussian,
    wanted: &[Strategy],
    frames: u32,
    ui: Ui,
    first: impl FnMut(&mut FrameFilter<GaussianStage>) -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
    let setup = TableSetup { format, kernel, wanted, frames };
    let segments = || crate::environment::segments().map_err(Into::into);
    let mut bar = None;
    let mut progress = |step| match step {
        Progress::Strategy(strategy) => {
            let strategy_bar = ui.bar(u64::from(frames), "frames");
            strategy_bar.set_message(format!("{strategy} at {}x{}", format.width(), format.height()));
            bar = Some(strategy_bar);
        }
        Progress::Frame => bar.iter().for_each(|bar| bar.inc(1)),
        Progress::Done => bar.take().iter().for_each(|bar| bar.finish_and_clear()),
    };
    frame_strategies::measure(device, &setup, &segments, &mut progress, first)
}

/// The name of the table of `width` x `height` frames (its CSV and plot files).
pub fn table_name(width: usize, height: usize) -> String {
    format!("pipeline_{width}x{height}")
}

/// The report as a table.
pub fn table(report: &Report) -> Table {
    let side = 2 * report.radius + 1;
    let mut table = Table::new(
        table_name(report.width, report.height),
        format!(
            "{}x{} RGB, Gaussian {side}x{side} (sigma {}), on {}",
            report.width, report.height, report.sigma, report.device
        ),
        &[
            "strategy",
            "p50 ms",
            "p99 ms",
            "frames/s",
            "link MB/f",
            "link GB/s",
            "host MiB",
            "dev MiB",
            "verified",
        ],
    );
    for row in &report.rows {
        table.row(vec![
            row.strategy.name().to_string(),
            format!("{:.3}", row.latency_ms.median),
            format!("{:.3}", row.latency_ms.p99),
            format!("{:.0}", row.frames_per_s),
            format!("{:.2}", row.link_bytes_per_frame as f64 / 1e6),
            format!("{:.1}", row.link_bytes_per_s / 1e9),
            format!("{:.1}", row.host_bytes as f64 / (1 << 20) as f64),
            format!("{:.1}", row.device_bytes as f64 / (1 << 20) as f64),
            if row.verified_bit_exact { "bit-exact" } else { "NO" }.to_string(),
        ]);
    }
    table.note(
        "link GB/s: the bytes counted per frame over the filter's time (NVML's PCIe traffic, which holds \
         more than the payload, is in the JSON only)",
    );
    for note in &report.skipped {
        table.note(format!("skipped: {note}"));
    }
    for row in &report.rows {
        if let Some(placement) = &row.placement {
            // The constant data's decisions: the frames stay mapped by the hybrid strategy's
            // definition, and listing them would only repeat it.
            for decision in placement
                .decisions
                .iter()
                .filter(|d| !d.name.starts_with("input ") && !d.name.starts_with("output "))
            {
                table.note(format!(
                    "{}: {} in {} memory: {}",
                    row.strategy, decision.name, decision.place, decision.reason
                ));
            }
            table.note(format!("{}: link profile {}", row.strategy, placement.profile_source));
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use hetmem_bench::Summary;
    use hetmem_bench::frame_strategies::{NvmlPcieTraffic, Row};

    use super::*;

    fn report(nvml_pcie_traffic: Option<NvmlPcieTraffic>) -> Report {
        Report {
            device: "NVIDIA H200".to_string(),
            width: 1920,
            height: 1080,
            radius: 2,
            sigma: 1.1,
            skipped: Vec::new(),
            rows: vec![Row {
                strategy: Strategy::Managed,
                frames: 200,
                latency_ms: Summary::of(&[0.9, 1.1, 1.3]).unwrap(),
                frames_per_s: 900.0,
                link_bytes_per_frame: 12_441_600,
                link_bytes_per_s: 11.2e9,
                nvml_pcie_traffic,
                host_bytes: 0,
                device_bytes: 0,
                verified_bit_exact: true,
                placement: None,
            }],
        }
    }

    #[test]
    fn the_table_heads_with_the_counted_link_rate_and_shows_no_nvml_column() {
        // NVML's traffic 2.24x the counted bytes, as the managed strategy's was on the H200.
        let measured =
            NvmlPcieTraffic { seconds: 0.5, out_mb_s: 9_000.0, in_mb_s: 16_088.0, counted_mb_s: 11_200.0 };
        let table = table(&report(Some(measured)));
        assert!(table.headers.iter().all(|header| !header.contains("NVML")), "{:?}", table.headers);
        let column = table.headers.iter().position(|header| header == "link GB/s").unwrap();
        assert_eq!(table.rows[0][column], "11.2");
        assert_eq!(table.rows[0].len(), table.headers.len());
        let cells = table.rows[0].join(" ");
        for nvml_figure in ["9.0", "16.1", "25.1", "2.24"] {
            assert!(!cells.contains(nvml_figure), "NVML's {nvml_figure} in the row: {cells}");
        }
        assert_eq!(table.rows, super::table(&report(None)).rows, "the row does not depend on NVML");
    }
}
