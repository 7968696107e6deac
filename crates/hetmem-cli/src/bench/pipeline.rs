//! `hetmem bench pipeline`: the per-strategy frame table at 1080p and 4K.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use hetmem::backend::nvml::NvmlSession;
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, FenceKind, Strategy};
use hetmem_bench::pcie::PcieSampler;
use hetmem_bench::streaming::{self, StreamingRun, StreamingSetup};

use super::plot;
use crate::frame_strategies::{self, Report};
use crate::table::Table;
use crate::ui::Ui;

/// The frame sizes measured.
pub const RESOLUTIONS: [(usize, usize); 2] = [(1920, 1080), (3840, 2160)];

/// The streaming tables' names: frames/s, each device's share.
pub const STREAMING_TABLES: [&str; 2] = ["pipelined", "pipelined_devices"];

/// What `bench pipeline --json` prints: one report per resolution.
#[derive(Debug, serde::Serialize)]
pub struct Reports<'a> {
    pub reports: &'a [Report],
}

/// What `bench pipeline --pipelined --json` prints: one run per resolution, strategy, device
/// count and stage.
#[derive(Debug, serde::Serialize)]
pub struct Runs<'a> {
    pub runs: &'a [StreamingRun],
}

/// What runs on each streamed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StageChoice {
    /// The built-in 5x5 Gaussian.
    Gaussian,
    /// A user's kernel of the same bytes (`hetmem_bench::user_stage`).
    User,
}

/// One report per resolution, 5x5 Gaussian.
pub fn measure(device: &Device, frames: u32, wanted: &[Strategy], ui: Ui) -> anyhow::Result<Vec<Report>> {
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    RESOLUTIONS
        .iter()
        .map(|&(width, height)| {
            let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
            frame_strategies::measure(device, format, &kernel, wanted, frames, ui, |_| Ok(()))
        })
        .collect()
}

/// Frames per second through a FrameRing for each strategy (when `wanted` is empty: every GPU
/// strategy the first device has, or the CPU without a GPU) at 1080p and 4K, fanned out over
/// `devices` (frame k to the k mod N-th). With several devices, each is also measured over the
/// first 1, 2, 4, ... of them, for the rate against N. Frames: `frames` at 1080p and a quarter
/// of it at 4K; by default 2000 (200 with `quick`).
pub fn measure_streaming(
    devices: &[Device],
    quick: bool,
    frames: Option<u32>,
    wanted: &[Strategy],
    slots: usize,
    stages: &[StageChoice],
    ui: Ui,
) -> anyhow::Result<Vec<StreamingRun>> {
    if stages.is_empty() {
        anyhow::bail!("--stage is empty: give gaussian, user, or both");
    }
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
    let mut counts: Vec<usize> =
        std::iter::successors(Some(1), |n| Some(n * 2)).take_while(|&n| n < devices.len()).collect();
    counts.push(devices.len());
    let nvml = NvmlSession::open().ok();
    let steps = RESOLUTIONS.len() * strategies.len() * counts.len() * stages.len();
    let bar = ui.bar(steps as u64, "runs");
    let mut runs = Vec::new();
    for &(width, height) in &RESOLUTIONS {
        let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
        for &strategy in &strategies {
            for (&count, &stage) in
                counts.iter().flat_map(|count| stages.iter().map(move |stage| (count, stage)))
            {
                let in_flight = (slots * count) as u64;
                let frames = if width > 1920 { (frames / 4).max(2 * in_flight) } else { frames };
                let name = if stage == StageChoice::User { "user" } else { "gaussian" };
                bar.set_message(format!(
                    "{frames} {width}x{height} frames, {name} stage, {strategy}, {count} device(s)"
                ));
                let setup = StreamingSetup {
                    strategy,
                    format,
                    slots,
                    frames,
                    refill: false,
                    fence: FenceKind::Event,
                };
                let chosen = &devices[..count];
                // One sampler per GPU, so each link's own traffic is measured, not only counted.
                let samplers: Vec<Option<PcieSampler>> = chosen
                    .iter()
                    .map(|device| {
                        let bus = device.as_cuda()?.pci_bus_id();
                        nvml.as_ref().map(|nvml| PcieSampler::start(nvml, bus))
                    })
                    .collect();
                let measured = match stage {
                    StageChoice::Gaussian => streaming::measure_fan_out(chosen, &kernel, &setup),
                    StageChoice::User => {
                        let sms = device.as_cuda().map_or(1, |gpu| gpu.attributes().multiprocessor_count);
                        let user =
                            hetmem_bench::user_stage::xor_stage(format.frame_bytes(), sms, 0x5A3C_96E1)?;
                        streaming::measure_stage(chosen, "user", &user, &setup)
                    }
                };
                let sampled: Vec<Option<(f64, f64)>> =
                    samplers.into_iter().map(|sampler| sampler.and_then(PcieSampler::stop)).collect();
                let mut run = measured?;
                for (share, sample) in run.devices.iter_mut().zip(sampled) {
                    share.nvml_pcie_traffic_mb_s = sample;
                }
                runs.push(run);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok(runs)
}

/// The streaming runs as a table, and with several devices a second one of each device's share.
pub fn streaming_tables(runs: &[StreamingRun]) -> Vec<Table> {
    let mut tables = vec![streaming_table(runs)];
    if runs.iter().any(|run| run.devices.len() > 1) {
        let mut table = Table::new(
            STREAMING_TABLES[1],
            "Each device's share of the streamed frames",
            &["frames", "strategy", "device", "frames filtered", "link GB/s (both ways)", "kernel busy"],
        );
        for run in runs.iter().filter(|run| run.devices.len() > 1) {
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
        table.note(
            "link GB/s: bytes counted per frame over the run's wall time (NVML's PCIe traffic, which \
             holds more than the payload, is in the JSON only)",
        );
        tables.push(table);
    }
    tables
}

fn streaming_table(runs: &[StreamingRun]) -> Table {
    let mut table = Table::new(
        STREAMING_TABLES[0],
        "Frames streamed through a FrameRing on RGB frames (gaussian: the built-in 5x5 blur; user: a \
         user's kernel through the stage API, reading and writing the same bytes)",
        &[
            "frames",
            "stage",
            "strategy",
            "devices",
            "slots",
            "frames/s",
            "vs 1 device",
            "vs built-in",
            "link GB/s (both ways)",
            "kernel busy",
        ],
    );
    for run in runs {
        let same = |one: &&StreamingRun| {
            (one.width, one.strategy, &one.stage) == (run.width, run.strategy, &run.stage)
        };
        let one = runs.iter().filter(same).find(|one| one.devices.len() == 1);
        let built_in = runs.iter().find(|one| {
            (one.width, one.strategy, one.devices.len(), one.stage.as_str())
                == (run.width, run.strategy, run.devices.len(), "gaussian")
        });
        table.row(vec![
            format!("{}x{}", run.width, run.height),
            run.stage.clone(),
            run.strategy.name().to_string(),
            run.devices.len().to_string(),
            run.slots.to_string(),
            format!("{:.0}", run.frames_per_s),
            one.map_or_else(String::new, |one| format!("{:.2}x", run.frames_per_s / one.frames_per_s)),
            built_in.filter(|_| run.stage != "gaussian").map_or_else(String::new, |built_in| {
                format!("{:.0}%", 100.0 * run.frames_per_s / built_in.frames_per_s)
            }),
            format!("{:.1}", run.link_bytes_per_s / 1e9),
            format!("{:.0}%", 100.0 * run.kernel_busy_fraction),
        ]);
    }
    table.note(
        "inputs written once per slot (no per-frame memcpy on the CPU); a round of outputs checked \
         against the CPU path before and after the timed frames",
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
            let name = frame_strategies::table_name(report.width, report.height);
            let file = plot::file_in(dir, &format!("{name}.svg"))?;
            let title = format!(
                "{}x{} frame latency by strategy (bar: min..p99, dot: median, ring: p90)",
                report.width, report.height
            );
            plot::spread(&file, &title, "milliseconds", &items)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use hetmem_bench::streaming::DeviceShare;

    use super::*;

    fn run(devices: usize, frames_per_s: f64) -> StreamingRun {
        let share = |ordinal| DeviceShare {
            ordinal: Some(ordinal),
            name: "NVIDIA H200".to_string(),
            frames: 1000 / devices as u64,
            link_bytes_per_s: 9e9 / devices as f64,
            kernel_busy_s: 0.25,
            nvml_pcie_traffic_mb_s: Some((4100.0, 4600.0)),
        };
        StreamingRun {
            stage: "gaussian".to_string(),
            strategy: Strategy::ZeroCopy,
            width: 1920,
            height: 1080,
            frame_bytes: 1920 * 1080 * 3,
            slots: 3,
            refill: false,
            fence: FenceKind::Event,
            frames: 1000,
            wall_s: 1.0,
            frames_per_s,
            kernel_busy_s: 0.5,
            kernel_busy_fraction: 0.5,
            link_bytes_per_frame: 12_000_000,
            link_bytes_per_s: 9e9,
            host_bytes: 1,
            device_bytes: 1,
            placement: None,
            devices: (0..devices).map(share).collect(),
        }
    }

    fn text(table: &Table) -> String {
        let mut out = Vec::new();
        table.write_text(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn several_devices_show_the_rate_against_one_and_each_device_s_share() {
        let tables = streaming_tables(&[run(1, 1000.0), run(2, 1900.0)]);
        assert_eq!(tables.len(), 2);
        let totals = text(&tables[0]);
        assert!(totals.contains("1.00x") && totals.contains("1.90x"), "{totals}");
        let shares = text(&tables[1]);
        assert!(shares.contains("0: NVIDIA H200") && shares.contains("1: NVIDIA H200"), "{shares}");
        assert_eq!(shares.matches("NVIDIA H200").count(), 2, "only the two-device run's shares: {shares}");
        assert!(shares.contains("4.5"), "each device's counted link GB/s: {shares}");
        assert!(!shares.contains("4.1") && !shares.contains("4.6"), "no NVML figures: {shares}");
        assert!(tables[1].headers.iter().all(|header| !header.contains("NVML")), "{:?}", tables[1].headers);
    }

    #[test]
    fn one_device_has_no_share_table() {
        assert_eq!(streaming_tables(&[run(1, 1000.0)]).len(), 1);
    }
}
