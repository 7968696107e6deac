//! `hetmem demo`: the showcase. Moving synthetic frames through the Gaussian blur by every
//! strategy the machine has, side by side: latency, frames/s, link traffic, memory.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hetmem::backend::nvml::NvmlSession;
use hetmem::bench::Summary;
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, gaussian_cpu};
use hetmem::{Device, FrameFilter, Strategy};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Frames per strategy.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    frames: u32,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 1920)]
    width: usize,
    /// Frame height in pixels.
    #[arg(long, default_value_t = 1080)]
    height: usize,
    /// Kernel radius (2 = 5x5). Default: from sigma, or 2.
    #[arg(long)]
    radius: Option<u32>,
    /// Gaussian sigma. Default: OpenCV's for the radius.
    #[arg(long)]
    sigma: Option<f64>,
    /// Strategies to run, comma-separated (default: every one the machine has).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Where to write the before/after PNG.
    #[arg(long, default_value = "hetmem-demo.png")]
    png: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One strategy's row.
#[derive(Debug, serde::Serialize)]
struct Row {
    strategy: Strategy,
    frames: u32,
    latency_ms: Summary,
    frames_per_s: f64,
    link_bytes_per_frame: u64,
    /// NVML's mean PCIe throughput during the run, MB/s: (GPU to host, host to GPU).
    pcie_mb_s: Option<(f64, f64)>,
    host_bytes: usize,
    device_bytes: usize,
    verified_bit_exact: bool,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    device: String,
    width: usize,
    height: usize,
    radius: u32,
    sigma: f64,
    skipped: Vec<String>,
    rows: Vec<Row>,
}

pub fn run(device: &Device, args: &Args) -> anyhow::Result<ExitCode> {
    let format = FrameFormat::new(args.width, args.height, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(args.radius, args.sigma, Border::Reflect101)?;
    let wanted: Vec<Strategy> = if args.strategies.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        args.strategies.iter().map(|name| name.parse()).collect::<Result<_, _>>()?
    };
    let mut skipped = Vec::new();
    let mut strategies = Vec::new();
    let on_cpu_by_default = device.as_cuda().is_none() && args.strategies.is_empty();
    let wanted = if on_cpu_by_default { vec![Strategy::Cpu] } else { wanted };
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
    let mut png_written = false;
    for strategy in strategies {
        if !args.json {
            eprintln!("running {strategy} ({} frames)...", args.frames);
        }
        let mut filter = FrameFilter::new(device, strategy, format, &kernel)
            .with_context(|| format!("setting up the {strategy} strategy"))?;
        let verified = verify(&mut filter, &format, &kernel)?;
        if !png_written {
            write_png(&args.png, &mut filter, &format)?;
            png_written = true;
        }
        let sampler = nvml.as_ref().map(|(nvml, bus)| PcieSampler::start(nvml, bus));
        let mut latencies = Vec::with_capacity(args.frames as usize);
        let mut busy = Duration::ZERO;
        for frame in 0..args.frames {
            render(filter.input_mut()?, format.width, format.height, frame);
            let latency = filter.run().with_context(|| format!("{strategy}, frame {frame}"))?;
            busy += latency;
            latencies.push(latency.as_secs_f64() * 1e3);
        }
        let pcie_mb_s = sampler.and_then(PcieSampler::stop);
        rows.push(Row {
            strategy,
            frames: args.frames,
            latency_ms: Summary::of(&latencies).expect("at least one frame"),
            frames_per_s: f64::from(args.frames) / busy.as_secs_f64(),
            link_bytes_per_frame: filter.link_bytes_per_frame(),
            pcie_mb_s,
            host_bytes: filter.host_bytes(),
            device_bytes: filter.device_bytes(),
            verified_bit_exact: verified,
        });
    }
    if device.as_cuda().is_none() {
        skipped.insert(
            0,
            format!(
                "no GPU strategy ran: {}",
                device
                    .cpu_fallback_reason()
                    .map_or("the CPU backend was chosen".to_string(), ToString::to_string)
            ),
        );
    }
    let report = Report {
        device: device.name(),
        width: format.width,
        height: format.height,
        radius: kernel.radius(),
        sigma: kernel.sigma(),
        skipped,
        rows,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &report, &args.png)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Filters one random frame and compares it with the CPU path, which is bit-exact by design.
fn verify(filter: &mut FrameFilter, format: &FrameFormat, kernel: &Gaussian) -> anyhow::Result<bool> {
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
fn render(frame: &mut [u8], width: usize, height: usize, t: u32) {
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

/// Writes the centre of frame 0, before and after the blur, side by side.
fn write_png(path: &PathBuf, filter: &mut FrameFilter, format: &FrameFormat) -> anyhow::Result<()> {
    render(filter.input_mut()?, format.width, format.height, 0);
    filter.run()?;
    let (cw, ch) = (format.width.min(640), format.height.min(360));
    let (x0, y0) = ((format.width - cw) / 2, (format.height - ch) / 2);
    let mut image = image::RgbImage::new(2 * cw as u32, ch as u32);
    let input = filter.input_mut()?.to_vec();
    for (half, frame) in [(0, &input[..]), (1, filter.output()?)] {
        for y in 0..ch {
            for x in 0..cw {
                let at = ((y0 + y) * format.width + x0 + x) * 3;
                let pixel = image::Rgb([frame[at], frame[at + 1], frame[at + 2]]);
                image.put_pixel((half * cw + x) as u32, y as u32, pixel);
            }
        }
    }
    image.save(path).with_context(|| format!("writing {}", path.display()))
}

/// Samples NVML's PCIe counters every 20 ms on a thread while a strategy runs.
struct PcieSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u32, u32)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl PcieSampler {
    fn start(nvml: &NvmlSession, bus: &str) -> PcieSampler {
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
    fn stop(self) -> Option<(f64, f64)> {
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

fn print_table(out: &mut impl Write, report: &Report, png: &std::path::Path) -> anyhow::Result<()> {
    writeln!(
        out,
        "hetmem demo: {}x{} RGB, Gaussian {}x{} (sigma {}), on {}",
        report.width,
        report.height,
        2 * report.radius + 1,
        2 * report.radius + 1,
        report.sigma,
        report.device
    )?;
    writeln!(
        out,
        "{:<13} {:>9} {:>9} {:>9} {:>10} {:>19} {:>9} {:>9} {:>9}",
        "strategy",
        "p50 ms",
        "p99 ms",
        "frames/s",
        "link MB/f",
        "PCIe out/in MB/s",
        "host MiB",
        "dev MiB",
        "verified"
    )?;
    for row in &report.rows {
        let pcie = row.pcie_mb_s.map_or("n/a".to_string(), |(out, inn)| format!("{out:.0}/{inn:.0}"));
        writeln!(
            out,
            "{:<13} {:>9.3} {:>9.3} {:>9.0} {:>10.2} {:>19} {:>9.1} {:>9.1} {:>9}",
            row.strategy.name(),
            row.latency_ms.median,
            row.latency_ms.p99,
            row.frames_per_s,
            row.link_bytes_per_frame as f64 / 1e6,
            pcie,
            row.host_bytes as f64 / (1 << 20) as f64,
            row.device_bytes as f64 / (1 << 20) as f64,
            if row.verified_bit_exact { "bit-exact" } else { "NO" }
        )?;
    }
    for note in &report.skipped {
        writeln!(out, "skipped: {note}")?;
    }
    writeln!(out, "before/after: {}", png.display())?;
    Ok(())
}
