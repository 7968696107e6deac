//! The summary `hetmem filter` gives at the end: text on stderr (stdout may carry the video),
//! or JSON for `--json` and `--report FILE`.

use std::io::Write;
use std::time::{Duration, Instant};

use hetmem::Strategy;
use hetmem::ops::gaussian::{Border, Gaussian, PixelLayout, SampleType};
use hetmem_bench::Summary;

use crate::json::{self, Schema};

/// What `filter --json` and `--report` write.
const SCHEMA: Schema = Schema("hetmem.filter/1");

/// Frame latencies and time, gathered while filtering.
#[derive(Debug)]
pub(super) struct Clock {
    start: Instant,
    latencies_ms: Vec<f64>,
    busy: Duration,
}

impl Clock {
    pub(super) fn start() -> Clock {
        Clock { start: Instant::now(), latencies_ms: Vec::new(), busy: Duration::ZERO }
    }

    /// One frame through the filter took `latency`.
    pub(super) fn frame(&mut self, latency: Duration) {
        self.busy += latency;
        self.latencies_ms.push(latency.as_secs_f64() * 1e3);
    }

    pub(super) fn frames(&self) -> usize {
        self.latencies_ms.len()
    }
}

/// The run, summed up.
#[derive(Debug, serde::Serialize)]
pub(super) struct Report {
    #[serde(flatten)]
    pub facts: Facts,
    pub radius: u32,
    pub sigma: f64,
    pub border: Border,
    pub frames: usize,
    /// Per frame, from handing it to the filter to the result being readable; `null` with no
    /// frames.
    pub latency_ms: Option<Summary>,
    /// Frames per second end to end: reading, filtering and writing.
    pub frames_per_s: f64,
    /// Frames per second of the filter alone.
    pub filter_frames_per_s: f64,
    pub wall_s: f64,
    /// Ctrl-C ended the stream early (every whole frame read was still filtered and written,
    /// unless the output's reader closed it first).
    pub interrupted: bool,
    /// Frames that failed and were filtered again (`--retries`), in order.
    pub retried: Vec<super::recovery::Retried>,
}

/// What a report needs besides the kernel and the clock.
#[derive(Debug, serde::Serialize)]
pub(super) struct Facts {
    pub input: String,
    pub output: String,
    /// `image` or `video`.
    pub kind: &'static str,
    /// The container's name for the pixels: `PNG L8`, `Y4M C420jpeg`, ...
    pub format: String,
    pub width: usize,
    pub height: usize,
    pub layout: PixelLayout,
    /// `u8`, or `u16` for 16-bit samples (9- to 16-bit video, 16-bit images).
    pub sample: SampleType,
    pub strategy: Strategy,
    pub warnings: Vec<String>,
}

impl Report {
    pub(super) fn new(facts: Facts, kernel: &Gaussian, clock: &Clock) -> Report {
        let wall = clock.start.elapsed().as_secs_f64();
        let frames = clock.frames();
        let per_s = |seconds: f64| if seconds > 0.0 { frames as f64 / seconds } else { 0.0 };
        Report {
            facts,
            radius: kernel.radius(),
            sigma: kernel.sigma(),
            border: kernel.border(),
            frames,
            latency_ms: Summary::of(&clock.latencies_ms),
            frames_per_s: per_s(wall),
            filter_frames_per_s: per_s(clock.busy.as_secs_f64()),
            wall_s: wall,
            interrupted: false,
            retried: Vec::new(),
        }
    }

    /// The summary as JSON.
    pub(super) fn to_json(&self) -> anyhow::Result<String> {
        json::to_string(SCHEMA, self)
    }

    /// Prints the warnings on stderr, then the summary unless `quiet`.
    pub(super) fn print_text(&self, quiet: bool) -> anyhow::Result<()> {
        let mut err = std::io::stderr().lock();
        for warning in &self.facts.warnings {
            writeln!(err, "hetmem: warning: {warning}")?;
        }
        if !quiet {
            let taps = 2 * self.radius + 1;
            writeln!(
                err,
                "hetmem filter: {} -> {}: {} frame{} of {}x{} {}, Gaussian {taps}x{taps} (sigma {}, {}), \
                 strategy {}",
                self.facts.input,
                self.facts.output,
                self.frames,
                if self.frames == 1 { "" } else { "s" },
                self.facts.width,
                self.facts.height,
                self.facts.format,
                self.sigma,
                match self.border {
                    Border::Reflect101 => "reflect101",
                    Border::Replicate => "replicate",
                },
                self.facts.strategy
            )?;
            match &self.latency_ms {
                Some(latency) => writeln!(
                    err,
                    "latency p50 {:.3} ms, p99 {:.3} ms; {:.1} frames/s end to end, {:.1} frames/s in the filter",
                    latency.median, latency.p99, self.frames_per_s, self.filter_frames_per_s
                )?,
                None => writeln!(err, "no frames")?,
            }
        }
        err.flush()?;
        Ok(())
    }
}
