//! The per-strategy frame table: synthetic frames through the Gaussian blur by every strategy
//! the machine has, with latency, frames/s, link traffic and memory. `hetmem demo` shows it for
//! one frame size; `hetmem bench pipeline` measures it at 1080p and 4K.
//!
//! Each strategy's filter is first checked bit-exact against the CPU path on one frame of
//! fresh random bytes with a poisoned output; the timed frames are a moving test card
//! ([`render`]), and NVML's PCIe counters are sampled while they run ([`PcieSampler`]).
//!
//! The link rate is counted: the filter's link bytes per frame over the time the filter took.
//! NVML's counters are kept beside it in the report only, never as the headline: they see all
//! the PCIe traffic of the window (protocol, the GPU's read requests, page migrations), not
//! the payload, which put them at 1.13-2.24x the counted bytes on the H200, the mapped and
//! managed strategies highest. They are compared with the bytes counted over the same window
//! they were sampled in, which also holds the rendering of each test card between frames,
//! when the link is idle.

use std::time::{Duration, Instant};

use hetmem::backend::nvml::NvmlSession;
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage, Segments, gaussian_cpu};
use hetmem::placement::Placement;
use hetmem::{Device, FrameFilter, Strategy};

use crate::Summary;
use crate::error::BenchError;
use crate::pcie::PcieSampler;
use crate::random::SplitMix64;

/// One strategy's row.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    /// The strategy measured (`Auto` resolved).
    pub strategy: Strategy,
    /// Frames timed.
    pub frames: u32,
    /// Each frame's time through the filter, in milliseconds.
    pub latency_ms: Summary,
    /// Frames over the time the filter took for them.
    pub frames_per_s: f64,
    /// Bytes crossing the host-GPU link per frame ([`FrameFilter::link_bytes_per_frame`]).
    pub link_bytes_per_frame: u64,
    /// Link bytes per second while filtering: `link_bytes_per_frame` times the frames over the
    /// time the filter took for them.
    pub link_bytes_per_s: f64,
    /// All the PCIe traffic NVML's counters saw while the frames ran, beside the bytes counted
    /// in the same window ([`NvmlPcieTraffic`]); `None` without NVML.
    pub nvml_pcie_traffic: Option<NvmlPcieTraffic>,
    /// Host memory the filter allocated.
    pub host_bytes: usize,
    /// Device memory the filter allocated.
    pub device_bytes: usize,
    /// Whether the check before the run found the output bit-exact with the CPU path.
    pub verified_bit_exact: bool,
    /// By the hybrid strategy, where each buffer went and why ([`FrameFilter::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// All the PCIe traffic NVML's counters saw and the payload bytes counted, over the same
/// window: the timed frames, the rendering of each test card between them included. NVML's
/// figures hold protocol traffic, the GPU's read requests and page migrations too, so they are
/// above the payload, most for the mapped and managed strategies (1.13-2.24x the counted bytes
/// on the H200): a measure of the link's load, not of the frames' bytes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct NvmlPcieTraffic {
    /// How long the counters were sampled.
    pub seconds: f64,
    /// NVML's mean MB/s of all PCIe traffic from the GPU to the host.
    pub out_mb_s: f64,
    /// NVML's mean MB/s of all PCIe traffic from the host to the GPU.
    pub in_mb_s: f64,
    /// The frames' counted link bytes (both ways) over the window, MB/s.
    pub counted_mb_s: f64,
}

/// The table of one frame size.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    /// The device's name.
    pub device: String,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// The Gaussian's radius.
    pub radius: u32,
    /// The Gaussian's sigma.
    pub sigma: f64,
    /// Why strategies asked for did not run.
    pub skipped: Vec<String>,
    /// One row per strategy that ran.
    pub rows: Vec<Row>,
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct TableSetup<'a> {
    /// The frames' format (interleaved RGB).
    pub format: FrameFormat,
    /// The blur.
    pub kernel: &'a Gaussian,
    /// The strategies to run; every one the machine has when empty (on the CPU backend, the
    /// CPU strategy).
    pub wanted: &'a [Strategy],
    /// Frames timed per strategy.
    pub frames: u32,
}

/// What [`measure`] reports as it goes, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A strategy's setup begins; its frames follow.
    Strategy(Strategy),
    /// A timed frame is done.
    Frame,
    /// The strategy's frames are done.
    Done,
}

/// The error a caller's segment count gives ([`measure`]'s `segments`).
pub type SetupError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `setup.frames` frames through each strategy of `setup.wanted`, each checked bit-exact
/// against the CPU path first. `segments` gives the PinnedAsync strategy's segment count as
/// each strategy is set up; `progress` hears of each strategy and frame; `first` sees the first
/// strategy's filter before its frames (the demo writes its picture from it).
///
/// # Errors
/// No strategy that can run here ([`BenchError::NoStrategyRuns`]), a strategy that cannot be
/// set up ([`BenchError::StrategySetup`]), an output that differs from the CPU path
/// ([`BenchError::FilterMismatch`]), a failed frame ([`BenchError::StrategyFrame`]), or what
/// `first` returns.
pub fn measure<E>(
    device: &Device,
    setup: &TableSetup<'_>,
    segments: &dyn Fn() -> Result<Segments, SetupError>,
    progress: &mut dyn FnMut(Progress),
    mut first: impl FnMut(&mut FrameFilter<GaussianStage>) -> Result<(), E>,
) -> Result<Report, E>
where
    E: From<BenchError>,
{
    let TableSetup { format, kernel, wanted, frames } = *setup;
    let (strategies, mut skipped) = runnable(device, wanted)?;
    let nvml = device
        .as_cuda()
        .and_then(|gpu| NvmlSession::open().ok().map(|nvml| (nvml, gpu.pci_bus_id().to_string())));
    let mut rows = Vec::new();
    for (index, strategy) in strategies.into_iter().enumerate() {
        progress(Progress::Strategy(strategy));
        let mut filter = set_up(device, strategy, format, kernel, segments)?;
        let verified = verify(&mut filter, &format, kernel)?;
        if index == 0 {
            first(&mut filter)?;
        }
        let sampler = nvml.as_ref().map(|(nvml, bus)| PcieSampler::start(nvml, bus));
        let window = Instant::now();
        let timed = time_frames(&mut filter, &format, frames, progress)?;
        let window = window.elapsed().as_secs_f64();
        progress(Progress::Done);
        let link_bytes = filter.link_bytes_per_frame() as f64 * f64::from(frames);
        let nvml_pcie_traffic = sampler.and_then(PcieSampler::stop).map(|(out_mb_s, in_mb_s)| {
            NvmlPcieTraffic { seconds: window, out_mb_s, in_mb_s, counted_mb_s: link_bytes / window / 1e6 }
        });
        rows.push(Row {
            strategy,
            frames,
            latency_ms: Summary::of(&timed.latencies_ms).expect("at least one frame"),
            frames_per_s: f64::from(frames) / timed.busy.as_secs_f64(),
            link_bytes_per_frame: filter.link_bytes_per_frame(),
            link_bytes_per_s: link_bytes / timed.busy.as_secs_f64(),
            nvml_pcie_traffic,
            host_bytes: filter.host_bytes(),
            device_bytes: filter.device_bytes(),
            verified_bit_exact: verified,
            placement: filter.placement().cloned(),
        });
    }
    if device.as_cuda().is_none() {
        skipped.insert(
            0,
            format!(
                "no GPU strategy ran (GPU cells were not measured): {}",
                device
                    .cpu_fallback_reason()
                    .map_or("the CPU backend was chosen".to_string(), ToString::to_string)
            ),
        );
    }
    Ok(Report {
        device: device.name(),
        width: format.width(),
        height: format.height(),
        radius: kernel.radius(),
        sigma: kernel.sigma(),
        skipped,
        rows,
    })
}

/// The strategies of `wanted` that can run on `device` (resolved), and why the others cannot.
fn runnable(device: &Device, wanted: &[Strategy]) -> Result<(Vec<Strategy>, Vec<String>), BenchError> {
    let on_cpu_by_default = device.as_cuda().is_none() && wanted.is_empty();
    let wanted = if on_cpu_by_default {
        vec![Strategy::Cpu]
    } else if wanted.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        wanted.to_vec()
    };
    let mut skipped = Vec::new();
    let mut strategies = Vec::new();
    for strategy in wanted {
        match strategy.check(device) {
            Ok(()) => strategies.push(strategy.resolve(device)),
            Err(error) => skipped.push(error.to_string()),
        }
    }
    if strategies.is_empty() {
        return Err(BenchError::NoStrategyRuns { skipped });
    }
    Ok((strategies, skipped))
}

/// The filter of one strategy, its stage cut into the segments `segments` gives.
fn set_up(
    device: &Device,
    strategy: Strategy,
    format: FrameFormat,
    kernel: &Gaussian,
    segments: &dyn Fn() -> Result<Segments, SetupError>,
) -> Result<FrameFilter<GaussianStage>, BenchError> {
    let setting_up = |source: SetupError| BenchError::StrategySetup { strategy, source };
    let segments = segments().map_err(setting_up)?;
    let stage =
        GaussianStage::new(format, kernel).map_err(|error| setting_up(error.into()))?.with_segments(segments);
    FrameFilter::with_stage(device, strategy, stage).map_err(|error| setting_up(error.into()))
}

/// The timed frames of one strategy.
struct Timed {
    latencies_ms: Vec<f64>,
    busy: Duration,
}

/// Runs `frames` test-card frames through `filter`, timing each.
fn time_frames(
    filter: &mut FrameFilter<GaussianStage>,
    format: &FrameFormat,
    frames: u32,
    progress: &mut dyn FnMut(Progress),
) -> Result<Timed, BenchError> {
    let strategy = filter.strategy();
    let mut latencies_ms = Vec::with_capacity(frames as usize);
    let mut busy = Duration::ZERO;
    for frame in 0..frames {
        render(filter.input_mut()?, format.width(), format.height(), frame);
        let latency = filter.run().map_err(|source| BenchError::StrategyFrame { strategy, frame, source })?;
        busy += latency;
        latencies_ms.push(latency.as_secs_f64() * 1e3);
        progress(Progress::Frame);
    }
    Ok(Timed { latencies_ms, busy })
}

/// Filters one frame of fresh random bytes into a poisoned output and compares it with the CPU
/// path, which is bit-exact by design.
fn verify(
    filter: &mut FrameFilter<GaussianStage>,
    format: &FrameFormat,
    kernel: &Gaussian,
) -> Result<bool, BenchError> {
    // Fresh data each run: the wall clock and the process id, never a fixed seed.
    let input = SplitMix64::fresh().bytes(format.frame_bytes());
    filter.input_mut()?.copy_from_slice(&input);
    filter.fill_output(0xA5)?;
    filter.run()?;
    let mut want = vec![0u8; input.len()];
    gaussian_cpu(format, kernel, &input, &mut want)?;
    let got = filter.output()?;
    if let Some(index) = got.iter().zip(&want).position(|(g, w)| g != w) {
        return Err(BenchError::FilterMismatch {
            strategy: filter.strategy(),
            byte: index,
            got: got[index],
            want: want[index],
        });
    }
    Ok(true)
}

/// A moving test card: a gradient, a checkerboard that drifts, and a bright disc orbiting the
/// centre. Fine detail, so the blur shows; different every frame, never constant.
pub fn render(frame: &mut [u8], width: usize, height: usize, t: u32) {
    let t = t as usize;
    let (cx, cy) = (
        width as f64 / 2.0 + (t as f64 * 0.05).cos() * width as f64 / 4.0,
        height as f64 / 2.0 + (t as f64 * 0.05).sin() * height as f64 / 4.0,
    );
    let radius2 = (height as f64 / 6.0).powi(2);
    for (y, row) in frame.chunks_exact_mut(width * 3).enumerate() {
        let dy2 = (y as f64 - cy).powi(2);
        for (x, pixel) in row.chunks_exact_mut(3).enumerate() {
            let checker = if ((x + 2 * t) / 6 + y / 6).is_multiple_of(2) { 48 } else { 0 };
            let inside = (x as f64 - cx).powi(2) + dy2 < radius2;
            let r = (x * 255 / width) as u8;
            let g = (y * 255 / height) as u8;
            pixel[0] = if inside { 250 } else { r.saturating_add(checker) };
            pixel[1] = if inside { 220 } else { g.saturating_add(checker) };
            pixel[2] = ((x + y + t) % 256) as u8 / 2 + checker;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::backend::{BackendChoice, BackendKind};
    use hetmem::ops::gaussian::{Border, PixelLayout};

    #[test]
    fn the_cpu_table_checks_and_times_every_frame() {
        let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
        let format = FrameFormat::new(32, 24, PixelLayout::Rgb).unwrap();
        let setup = TableSetup { format, kernel: &kernel, wanted: &[], frames: 3 };
        let mut heard = Vec::new();
        let mut firsts = 0;
        let report =
            measure::<BenchError>(&device, &setup, &|| Ok(Segments::Auto), &mut |p| heard.push(p), |_| {
                firsts += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(firsts, 1);
        let rows: Vec<_> =
            report.rows.iter().map(|row| (row.strategy, row.frames, row.verified_bit_exact)).collect();
        assert_eq!(rows, [(Strategy::Cpu, 3, true)]);
        assert_eq!(
            heard,
            [
                Progress::Strategy(Strategy::Cpu),
                Progress::Frame,
                Progress::Frame,
                Progress::Frame,
                Progress::Done
            ]
        );
        assert!(report.skipped[0].starts_with("no GPU strategy ran"), "{:?}", report.skipped);
    }

    #[test]
    fn a_bad_segment_count_names_the_strategy_being_set_up() {
        let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
        let format = FrameFormat::new(32, 24, PixelLayout::Rgb).unwrap();
        let setup = TableSetup { format, kernel: &kernel, wanted: &[Strategy::Cpu], frames: 1 };
        let error =
            measure::<BenchError>(&device, &setup, &|| Err("bad count".into()), &mut |_| {}, |_| Ok(()))
                .unwrap_err();
        assert_eq!(error.to_string(), "setting up the cpu strategy");
        assert_eq!(std::error::Error::source(&error).unwrap().to_string(), "bad count");
    }
}
