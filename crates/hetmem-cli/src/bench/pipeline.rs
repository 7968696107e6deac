//! `hetmem bench pipeline`: the per-strategy frame table at 1080p and 4K.

use std::path::{Path, PathBuf};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, Strategy};

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
