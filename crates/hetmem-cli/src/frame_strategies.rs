//! The per-strategy frame table: synthetic frames through the Gaussian blur by every strategy
//! the machine has, with latency, frames/s, link traffic and memory. `hetmem demo` shows it for
//! one frame size; `hetmem bench pipeline` measures it at 1080p and 4K.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hetmem::backend::nvml::NvmlSession;
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage, gaussian_cpu};
use hetmem::placement::Placement;
use hetmem::{Device, FrameFilter, Strategy};
use hetmem_bench::Summary;

use crate::table::Table;
use crate::ui::Ui;

/// One strategy's row.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub strategy: Strategy,
    pub frames: u32,
    pub latency_ms: Summary,
    pub frames_per_s: f64,
    pub link_bytes_per_frame: u64,
    /// NVML's mean PCIe throughput during the run, MB/s: (GPU to host, host to GPU).
    pub pcie_mb_s: Option<(f64, f64)>,
    pub host_bytes: usize,
    pub device_bytes: usize,
    pub verified_bit_exact: bool,
    /// By the hybrid strategy, where each buffer went and why ([`FrameFilter::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub device: String,
    pub width: usize,
    pub height: usize,
    pub radius: u32,
    pub sigma: f64,
    pub skipped: Vec<String>,
    pub rows: Vec<Row>,
}

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
    mut first: impl FnMut(&mut FrameFilter<GaussianStage>) -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
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
        bail!("no strategy can run here: {}", skipped.join("; "));
    }
    let nvml = device
        .as_cuda()
        .and_then(|gpu| NvmlSession::open().ok().map(|nvml| (nvml, gpu.pci_bus_id().to_string())));
    let mut rows = Vec::new();
    for (index, strategy) in strategies.into_iter().enumerate() {
        let bar = ui.bar(u64::from(frames), "frames");
        bar.set_message(format!("{strategy} at {}x{}", format.width(), format.height()));
        let setting_up = || format!("setting up the {strategy} strategy");
        let segments = crate::environment::segments().with_context(setting_up)?;
        let stage = GaussianStage::new(format, kernel).with_context(setting_up)?.with_segments(segments);
        let mut filter = FrameFilter::with_stage(device, strategy, stage).with_context(setting_up)?;
        let verified = verify(&mut filter, &format, kernel)?;
        if index == 0 {
            first(&mut filter)?;
        }
        let sampler = nvml.as_ref().map(|(nvml, bus)| PcieSampler::start(nvml, bus));
        let mut latencies = Vec::with_capacity(frames as usize);
        let mut busy = Duration::ZERO;
        for frame in 0..frames {
            render(filter.input_mut()?, format.width(), format.height(), frame);
            let latency = filter.run().with_context(|| format!("{strategy}, frame {frame}"))?;
            busy += latency;
            latencies.push(latency.as_secs_f64() * 1e3);
            bar.inc(1);
        }
        bar.finish_and_clear();
        let pcie_mb_s = sampler.and_then(PcieSampler::stop);
        rows.push(Row {
            strategy,
            frames,
            latency_ms: Summary::of(&latencies).expect("at least one frame"),
            frames_per_s: f64::from(frames) / busy.as_secs_f64(),
            link_bytes_per_frame: filter.link_bytes_per_frame(),
            pcie_mb_s,
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

/// Filters one random frame and compares it with the CPU path, which is bit-exact by design.
fn verify(
    filter: &mut FrameFilter<GaussianStage>,
    format: &FrameFormat,
    kernel: &Gaussian,
) -> anyhow::Result<bool> {
    // Fresh data each run: the wall clock and the process id, never a fixed seed.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_nanos());
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ nanos as u64 ^ u64::from(std::process::id());
    let input: Vec<u8> = (0..format.frame_bytes())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    filter.input_mut()?.copy_from_slice(&input);
    filter.fill_output(0xA5)?;
    filter.run()?;
    let mut want = vec![0u8; input.len()];
    gaussian_cpu(format, kernel, &input, &mut want)?;
    let got = filter.output()?;
    if let Some(index) = got.iter().zip(&want).position(|(g, w)| g != w) {
        bail!(
            "{} strategy: byte {index} is {}, the CPU path gives {}",
            filter.strategy(),
            got[index],
            want[index]
        );
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

/// Samples NVML's PCIe counters every 20 ms on a thread while a strategy runs.
pub(crate) struct PcieSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u32, u32)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl PcieSampler {
    pub(crate) fn start(nvml: &NvmlSession, bus: &str) -> PcieSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        // NVML handles are per session; the thread opens its own.
        let _ = nvml;
        let thread = {
            let (stop, samples, bus) = (Arc::clone(&stop), Arc::clone(&samples), bus.to_string());
            std::thread::spawn(move || {
                let Ok(nvml) = NvmlSession::open() else { return };
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(sample) = nvml.pcie_throughput(&bus) {
                        samples.lock().unwrap_or_else(|poison| poison.into_inner()).push(sample);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        PcieSampler { stop, samples, thread }
    }

    /// Mean (GPU to host, host to GPU) in MB/s, if any sample came in.
    pub(crate) fn stop(self) -> Option<(f64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let samples = self.samples.lock().unwrap_or_else(|poison| poison.into_inner());
        if samples.is_empty() {
            return None;
        }
        let n = samples.len() as f64;
        let mean = |pick: fn(&(u32, u32)) -> u32| {
            samples.iter().map(|s| f64::from(pick(s))).sum::<f64>() / n / 1000.0
        };
        Some((mean(|s| s.0), mean(|s| s.1)))
    }
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
            "PCIe out/in MB/s",
            "host MiB",
            "dev MiB",
            "verified",
        ],
    );
    for row in &report.rows {
        let pcie = row.pcie_mb_s.map_or("n/a".to_string(), |(out, inn)| format!("{out:.0}/{inn:.0}"));
        table.row(vec![
            row.strategy.name().to_string(),
            format!("{:.3}", row.latency_ms.median),
            format!("{:.3}", row.latency_ms.p99),
            format!("{:.0}", row.frames_per_s),
            format!("{:.2}", row.link_bytes_per_frame as f64 / 1e6),
            pcie,
            format!("{:.1}", row.host_bytes as f64 / (1 << 20) as f64),
            format!("{:.1}", row.device_bytes as f64 / (1 << 20) as f64),
            if row.verified_bit_exact { "bit-exact" } else { "NO" }.to_string(),
        ]);
    }
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
