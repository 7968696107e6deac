//! Two processes against one: RGB frames through the cross-process ring (a producer process
//! fills shared slots, this process blurs them 5x5 on the GPU) and through the single-process
//! `FrameRing`, the same stage, strategy, slots and producer work, in one run. Prints frames/s
//! and one frame's latency (publish to result, `CLOCK_MONOTONIC`) for both, and their ratio.
//!
//! The goal it checks: two processes reach >= 95% of one process's frames/s, by zero-copy and
//! by pinned-async, and one frame's latency stays within 10 us of one process's.
//!
//! ```text
//! cargo run --release -p hetmem-bench --example two_process_ring -- \
//!     [--strategy all|zero-copy|pinned-async|cpu] [--frames N] [--latency N] [--slots N]
//!     [--size WxH] [--checked N] [--seed N] [--json PATH]
//! ```
//! Defaults on a GPU: both strategies, 1920x1080, 4 slots, 3000 timed frames, 300 latency
//! frames; on the CPU backend: the cpu strategy, 320x240, 8 timed frames, 3 latency frames.
//! The producer is this program again (`--producer SOCKET PLAN...`), started for each run.

use std::process::{Command, ExitCode};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, Strategy};
use hetmem_bench::cross_process::{CrossProcessRun, CrossProcessSetup, ProducerPlan, measure, produce};
use hetmem_bench::random::fresh_seed;

type Failure = Box<dyn std::error::Error>;

struct Options {
    strategies: Option<Vec<Strategy>>,
    frames: Option<u64>,
    latency: Option<u64>,
    slots: usize,
    size: Option<(usize, usize)>,
    checked: u64,
    seed: u64,
    json: Option<std::path::PathBuf>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, Failure> {
    let mut options = Options {
        strategies: None,
        frames: None,
        latency: None,
        slots: 4,
        size: None,
        checked: 3,
        seed: fresh_seed(),
        json: None,
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--strategy" => {
                options.strategies = Some(match value()?.as_str() {
                    "all" => vec![Strategy::ZeroCopy, Strategy::PinnedAsync],
                    name => vec![
                        name.parse::<Strategy>().map_err(|error| format!("--strategy {name}: {error}"))?,
                    ],
                })
            }
            "--frames" => options.frames = Some(value()?.parse()?),
            "--latency" => options.latency = Some(value()?.parse()?),
            "--slots" => options.slots = value()?.parse()?,
            "--checked" => options.checked = value()?.parse()?,
            "--seed" => options.seed = value()?.parse()?,
            "--json" => options.json = Some(value()?.into()),
            "--size" => {
                let text = value()?;
                let (width, height) =
                    text.split_once('x').ok_or_else(|| format!("--size {text}: give WIDTHxHEIGHT"))?;
                options.size = Some((width.parse()?, height.parse()?));
            }
            other => return Err(format!("unknown argument {other}; see the example's documentation").into()),
        }
    }
    Ok(options)
}

fn print_table(runs: &[CrossProcessRun]) {
    println!(
        "{:<13} {:<14} {:>10} {:>14} {:>11} {:>11}",
        "strategy", "ring", "frames/s", "latency us p50", "p90", "min"
    );
    for run in runs {
        for (ring, figures) in [("two processes", &run.cross_process), ("one process", &run.single_process)] {
            println!(
                "{:<13} {:<14} {:>10.1} {:>14.1} {:>11.1} {:>11.1}",
                run.strategy.to_string(),
                ring,
                figures.frames_per_s,
                figures.latency_us.median,
                figures.latency_us.p90,
                figures.latency_us.min
            );
        }
        let verdict = match (run.strategy, run.throughput_ratio >= 0.95 && run.latency_difference_us <= 10.0)
        {
            (Strategy::Cpu, _) => "the goal is for the GPU strategies",
            (_, true) => "meets the goal",
            (_, false) => "misses the goal",
        };
        println!(
            "{:<13} two/one: {:.3} of the frames/s, latency {:+.1} us: {} (goal >= 0.95, <= +10 us)",
            "", run.throughput_ratio, run.latency_difference_us, verdict
        );
    }
}

fn run() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--producer") {
        let socket = args.nth(1).ok_or("--producer needs the socket and the plan")?;
        let plan = ProducerPlan::parse(&args.collect::<Vec<_>>())?;
        return Ok(produce(socket.as_ref(), &plan)?);
    }
    let options = parse(args)?;
    let device = Device::open_best()?;
    let gpu = device.gpu_ordinal().is_some();
    let strategies = options.strategies.unwrap_or_else(|| {
        if gpu { vec![Strategy::ZeroCopy, Strategy::PinnedAsync] } else { vec![Strategy::Cpu] }
    });
    let (width, height) = options.size.unwrap_or(if gpu { (1920, 1080) } else { (320, 240) });
    let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    eprintln!(
        "device: {} ({} backend); {width}x{height} RGB, {} slots, seed {}",
        device.name(),
        device.backend(),
        options.slots,
        options.seed
    );
    let exe = std::env::current_exe()?;
    let mut spawn = |socket: &std::path::Path, plan: &ProducerPlan| {
        Command::new(&exe).arg("--producer").arg(socket).args(plan.to_args()).spawn()
    };
    let mut runs = Vec::new();
    for strategy in strategies {
        let setup = CrossProcessSetup {
            strategy,
            format,
            slots: options.slots,
            frames: options.frames.unwrap_or(if gpu { 3000 } else { 8 }),
            latency_frames: options.latency.unwrap_or(if gpu { 300 } else { 3 }),
            checked: options.checked,
            seed: options.seed,
            producer_timeout: std::time::Duration::from_secs(60),
        };
        runs.push(
            measure(&device, &kernel, &setup, &mut spawn).map_err(|error| format!("{strategy}: {error}"))?,
        );
    }
    print_table(&runs);
    if let Some(path) = options.json {
        std::fs::write(&path, serde_json::to_string_pretty(&runs)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("two_process_ring: {error}");
            ExitCode::FAILURE
        }
    }
}
