//! One frame at a time through `FrameFilter` (the 5x5 Gaussian on RGB frames), timed from
//! handing the frame over to the result readable by the CPU, under stated conditions: the
//! producer writes each frame into the filter's input just before (always), and the consumer
//! either leaves the output alone or reads it (`--read-output`: its cache lines are then in the
//! CPU's cache when the next frame's result arrives). Pinned-async runs at several segment
//! counts; then the resident blur (`ResidentGaussian`: one kernel launched once, a frame per
//! mapped bell) by zero-copy and hybrid at three tile counts. Printed as one JSON object per
//! row (median and p99 microseconds).
//!
//! `scripts/probes/frame_latency.cu` times the same kernels without hetmem's leases and
//! fences: the two together say what hetmem adds per frame.
//!
//! Run with `cargo run --release -p hetmem-bench --example frame_latency [FRAMES] [--read-output]`.

use std::time::Duration;

use hetmem::ops::gaussian::{
    Border, FrameFormat, Gaussian, GaussianStage, PixelLayout, ResidentGaussian, ResidentOptions, Segments,
    gaussian_cpu,
};
use hetmem::{Device, FrameFilter, Strategy};
use hetmem_bench::Summary;

mod support;

use support::FreshWords;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let read_output = args.iter().any(|arg| arg == "--read-output");
    let frames: usize =
        args.iter().find(|arg| !arg.starts_with("--")).map(|text| text.parse()).transpose()?.unwrap_or(300);
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    let mut rng = FreshWords::from_time();
    for (width, height) in [(1920, 1080), (3840, 2160)] {
        let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
        // Two random frames and their CPU results: frames alternate, so no result can be stale.
        let sources: Vec<Vec<u8>> = (0..2)
            .map(|_| (0..format.frame_bytes()).map(|_| (rng.next_u32() >> 24) as u8).collect())
            .collect();
        let expected: Vec<Vec<u8>> = sources
            .iter()
            .map(|source| {
                let mut out = vec![0u8; source.len()];
                gaussian_cpu(&format, &kernel, source, &mut out).map(|()| out)
            })
            .collect::<Result<_, _>>()?;
        let mut runs: Vec<(Strategy, Segments)> =
            vec![(Strategy::Hybrid, Segments::Auto), (Strategy::ZeroCopy, Segments::Auto)];
        runs.extend(
            [Segments::Auto, Segments::Count(3), Segments::Count(6), Segments::Count(12)]
                .map(|s| (Strategy::PinnedAsync, s)),
        );
        for (strategy, segments) in runs {
            let stage = GaussianStage::new(format, &kernel)?.with_segments(segments);
            let mut filter = FrameFilter::with_stage(&device, strategy, stage)?;
            let what = format!("{strategy} at {width}x{height}");
            let (latencies, checksum) =
                time_frames(&mut filter, frames, read_output, &sources, &expected, &what)?;
            let summary = Summary::of(&latencies).expect("frames");
            println!(
                "{{\"width\": {width}, \"height\": {height}, \"strategy\": \"{strategy}\", \"segments\": \"{segments:?}\", \"read_output\": {read_output}, \"median_us\": {:.1}, \"p99_us\": {:.1}, \"frames\": {frames}, \"checksum\": {checksum}}}",
                summary.median, summary.p99
            );
        }
        let sms = device.capabilities().multiprocessors;
        for strategy in [Strategy::ZeroCopy, Strategy::Hybrid] {
            for tiles in [None, Some(sms / 4), Some(sms / 2)] {
                let options = ResidentOptions { strategy, tiles, ..ResidentOptions::default() };
                let mut filter = ResidentGaussian::start_with(&device, format, &kernel, options)?;
                let (tiles, blocks) = (filter.plan().tiles(), filter.plan().blocks());
                let what = format!("resident {strategy} at {width}x{height}");
                let (latencies, checksum) =
                    time_frames(&mut filter, frames, read_output, &sources, &expected, &what)?;
                filter.shutdown()?;
                let summary = Summary::of(&latencies).expect("frames");
                println!(
                    "{{\"width\": {width}, \"height\": {height}, \"strategy\": \"resident {strategy}\", \"tiles\": {tiles}, \"blocks\": {blocks}, \"read_output\": {read_output}, \"median_us\": {:.1}, \"p99_us\": {:.1}, \"frames\": {frames}, \"checksum\": {checksum}}}",
                    summary.median, summary.p99
                );
            }
        }
    }
    Ok(())
}

/// A filter one frame at a time: `FrameFilter` or `ResidentGaussian`.
trait OneFrame {
    fn input_mut(&mut self) -> hetmem::Result<&mut [u8]>;
    fn run(&mut self) -> hetmem::Result<Duration>;
    fn output(&self) -> hetmem::Result<&[u8]>;
}

impl<S: hetmem::stage::Stage> OneFrame for FrameFilter<S> {
    fn input_mut(&mut self) -> hetmem::Result<&mut [u8]> {
        FrameFilter::input_mut(self)
    }
    fn run(&mut self) -> hetmem::Result<Duration> {
        FrameFilter::run(self)
    }
    fn output(&self) -> hetmem::Result<&[u8]> {
        FrameFilter::output(self)
    }
}

impl OneFrame for ResidentGaussian {
    fn input_mut(&mut self) -> hetmem::Result<&mut [u8]> {
        ResidentGaussian::input_mut(self)
    }
    fn run(&mut self) -> hetmem::Result<Duration> {
        ResidentGaussian::run(self)
    }
    fn output(&self) -> hetmem::Result<&[u8]> {
        ResidentGaussian::output(self)
    }
}

/// 20 untimed frames, then `frames` timed ones, the two `sources` alternating: each frame's
/// latency in microseconds, and a checksum of every 64th output byte where `read_output`
/// (the output's lines then sit in the CPU's cache). Every 50th frame is compared whole with
/// `expected` (a full compare of every frame would keep the output in the CPU's cache).
fn time_frames(
    filter: &mut impl OneFrame,
    frames: usize,
    read_output: bool,
    sources: &[Vec<u8>],
    expected: &[Vec<u8>],
    what: &str,
) -> Result<(Vec<f64>, u64), Box<dyn std::error::Error>> {
    let warmup = 20;
    let mut latencies = Vec::with_capacity(frames);
    let mut checksum = 0u64;
    for frame in 0..warmup + frames {
        filter.input_mut()?.copy_from_slice(&sources[frame % 2]);
        let latency = filter.run()?;
        if frame >= warmup {
            latencies.push(latency.as_secs_f64() * 1e6);
        }
        if read_output {
            checksum = filter.output()?.iter().step_by(64).fold(checksum, |sum, &byte| sum + u64::from(byte));
        }
        if frame % 50 == 0 && filter.output()? != expected[frame % 2].as_slice() {
            return Err(format!("{what}, frame {frame}: differs from the CPU").into());
        }
    }
    Ok((latencies, checksum))
}
