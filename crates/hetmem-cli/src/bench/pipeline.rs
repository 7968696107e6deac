//! `hetmem bench pipeline`: the per-strategy frame table at 1080p and 4K.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use hetmem::bench::streaming::{self, StreamingRun, StreamingSetup};
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, FenceKind, Strategy};

use super::plot;
use crate::frame_strategies::{self, Report};
use crate::table::Table;

/// The frame sizes measured.
pub const RESOLUTIONS: [(usize, usize); 2] = [(1920, 1080), (3840, 2160)];

/// One report per resolution, 5x5 Gaussian.
pub fn measure(
    device: &Device,
    frames: u32,
    wanted: &[Strategy],
    progress: bool,
) -> anyhow::Result<Vec<Report>> {
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    RESOLUTIONS
        .iter()
        .map(|&(width, height)| {
            let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
            frame_strategies::measure(device, format, &kernel, wanted, frames, progress, |_| Ok(()))
        })
        .collect()
}

/// Frames per second through a FrameRing for each strategy (when `wanted` is empty: every GPU
/// strategy the first device has, or the CPU without a GPU) at 1080p and 4K, fanned out over
/// `devices` (frame k to the k mod N-th). Frames: `frames` at 1080p and a quarter of it at 4K;
/// by default 2000 (200 with `quick`).
pub fn measure_streaming(
    devices: &[Device],
    quick: bool,
    frames: Option<u32>,
    wanted: &[Strategy],
    slots: usize,
) -> anyhow::Result<Vec<StreamingRun>> {
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    let device = devices.first().context("no devices to stream to")?;
    let strategies: Vec<Strategy> = if wanted.is_empty() {
        // With a GPU, its strategies only: the CPU's rate is in the latency table.
        let gpu = device.as_cuda().is_some();
        let runnable = Strategy::ALL.into_iter().filter(|strategy| strategy.check(device).is_ok());
        runnable.filter(|&strategy| !gpu || strategy != Strategy::Cpu).collect()
    } else {
        wanted.to_vec()
    };
    let frames = u64::from(frames.unwrap_or(if quick { 200 } else { 2000 }));
    let mut runs = Vec::new();
    for &(width, height) in &RESOLUTIONS {
        let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
        let frames = if width > 1920 { (frames / 4).max(2 * slots as u64) } else { frames };
        for &strategy in &strategies {
            eprintln!(
                "streaming {frames} {width}x{height} frames by {strategy} over {} device(s)...",
                devices.len()
            );
            let setup =
                StreamingSetup { strategy, format, slots, frames, refill: false, fence: FenceKind::Event };
            runs.push(streaming::measure_fan_out(devices, &kernel, &setup)?);
        }
    }
    Ok(runs)
}

/// The streaming runs as a table, and with several devices a second one of each device's share.
pub fn streaming_tables(runs: &[StreamingRun]) -> Vec<Table> {
    let mut tables = vec![streaming_table(runs)];
    if runs.iter().any(|run| run.devices.len() > 1) {
        let mut table = Table::new(
            "Each device's share of the streamed frames",
            &["frames", "strategy", "device", "frames filtered", "link GB/s (both ways)", "kernel busy"],
        );
        for run in runs {
            for share in &run.devices {
                table.row(vec![
                    format!("{}x{}", run.width, run.height),
                    run.strategy.name().to_string(),
                    share
                        .ordinal
                        .map_or_else(|| share.name.clone(), |ordinal| format!("{ordinal}: {}", share.name)),
                    share.frames.to_string(),
                    format!("{:.1}", share.link_bytes_per_s / 1e9),
                    format!("{:.0}%", 100.0 * share.kernel_busy_s / run.wall_s),
                ]);
            }
        }
        table.note("link bytes counted per frame (not read from NVML), over the whole run's wall time");
        tables.push(table);
    }
    tables
}

fn streaming_table(runs: &[StreamingRun]) -> Table {
    let mut table = Table::new(
        "Frames streamed through a FrameRing, Gaussian 5x5 on RGB frames",
        &["frames", "strategy", "devices", "slots", "frames/s", "link GB/s (both ways)", "kernel busy"],
    );
    for run in runs {
        table.row(vec![
            format!("{}x{}", run.width, run.height),
            run.strategy.name().to_string(),
            run.devices.len().to_string(),
            run.slots.to_string(),
            format!("{:.0}", run.frames_per_s),
            format!("{:.1}", run.link_bytes_per_s / 1e9),
            format!("{:.0}%", 100.0 * run.kernel_busy_fraction),
        ]);
    }
    table.note(
        "inputs written once per slot (no per-frame memcpy on the CPU); the first and last round \
         of outputs checked against the CPU path",
    );
    table
}

pub fn tables(reports: &[Report]) -> Vec<Table> {
    reports.iter().map(frame_strategies::table).collect()
}

/// `pipeline_<width>x<height>.svg`: each strategy's frame latency distribution.
pub fn plots(reports: &[Report], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    reports
        .iter()
        .map(|report| {
            let items: Vec<_> =
                report.rows.iter().map(|row| (row.strategy.name().to_string(), row.latency_ms)).collect();
            let file = plot::file_in(dir, &format!("pipeline_{}x{}.svg", report.width, report.height))?;
            let title = format!(
                "{}x{} frame latency by strategy (bar: min..p99, dot: median, ring: p90)",
                report.width, report.height
            );
            plot::spread(&file, &title, "milliseconds", &items)
        })
        .collect()
}
