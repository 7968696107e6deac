//! The summary `hetmem filter` gives at the end: text on stderr (stdout may carry the video),
//! or JSON for `--json` and `--report FILE`.
//!
//! The headline rate is the frames over the command's wall time, from its start (before the
//! device opens) to the output closed and the frame memory released: what a stopwatch around
//! the command shows, less the process's own start and exit. The rate over the frames alone
//! (streaming) is given beside it, with everything else named as setup, so the two differ by
//! exactly the setup shown. Closing an output that replaced an existing file can take seconds:
//! ext4 writes such a file back when it is closed (its `auto_da_alloc`), at the disk's rate.

use std::io::Write;
use std::time::{Duration, Instant};

use hetmem::Strategy;
use hetmem::ops::gaussian::{Border, Gaussian, PixelLayout, SampleType};
use hetmem::pipeline::SetupTime;
use hetmem_bench::Summary;

use crate::json::{self, Schema};

/// What `filter --json` and `--report` write.
const SCHEMA: Schema = Schema("hetmem.filter/2");

/// The run's time, by phase, and each frame's latency.
#[derive(Debug)]
pub(super) struct Clock {
    /// When the command started, before the device was opened.
    command: Instant,
    /// Everything but the frames, by name, in the order first met; a name met again (a ring
    /// rebuilt after a failure) adds to its time.
    setup: Vec<(&'static str, Duration)>,
    /// When the frames started streaming, while they do.
    streaming_since: Option<Instant>,
    streamed: Duration,
    latencies_ms: Vec<f64>,
}

impl Clock {
    /// A clock for a command that started at `command`.
    pub(super) fn new(command: Instant) -> Clock {
        Clock {
            command,
            setup: Vec::new(),
            streaming_since: None,
            streamed: Duration::ZERO,
            latencies_ms: Vec::new(),
        }
    }

    /// `spent` went on the setup named `name`.
    pub(super) fn setup(&mut self, name: &'static str, spent: Duration) {
        match self.setup.iter_mut().find(|(known, _)| *known == name) {
            Some((_, total)) => *total += spent,
            None => self.setup.push((name, spent)),
        }
    }

    /// Runs `work` as the setup named `name`.
    pub(super) fn time<T>(&mut self, name: &'static str, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = work();
        self.setup(name, start.elapsed());
        result
    }

    /// Runs `build` (a ring or a filter, built in `setup` time by part), naming its parts;
    /// the build's time outside them (the stage's own checks) goes to "building the stage".
    pub(super) fn build<T>(
        &mut self,
        build: impl FnOnce() -> anyhow::Result<T>,
        setup: impl Fn(&T) -> SetupTime,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        let built = build()?;
        let spent = start.elapsed();
        let parts = setup(&built);
        self.setup("placement", parts.placement);
        self.setup("queues", parts.queues);
        self.setup("kernel (first load: compile or cache)", parts.kernel);
        self.setup("frame memory (pinning)", parts.frame_memory);
        self.setup("building the stage", spent.saturating_sub(parts.total()));
        Ok(built)
    }

    /// The frames start moving.
    pub(super) fn start_streaming(&mut self) {
        self.streaming_since.get_or_insert_with(Instant::now);
    }

    /// The frames stop moving (all of them, or for a ring to be rebuilt).
    pub(super) fn stop_streaming(&mut self) {
        if let Some(since) = self.streaming_since.take() {
            self.streamed += since.elapsed();
        }
    }

    /// One frame through the filter took `latency`.
    pub(super) fn frame(&mut self, latency: Duration) {
        self.latencies_ms.push(latency.as_secs_f64() * 1e3);
    }

    pub(super) fn frames(&self) -> usize {
        self.latencies_ms.len()
    }
}

/// A named part of the setup.
#[derive(Debug, serde::Serialize)]
pub(super) struct Phase {
    pub name: &'static str,
    pub seconds: f64,
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
    /// The command's wall time: from its start, before the device opened, to the output
    /// closed and the frame memory released.
    pub wall_s: f64,
    /// Frames per second over `wall_s`: what a stopwatch around the command gives.
    pub frames_per_s: f64,
    /// The time the frames streamed: from the first frame read to the last one written.
    pub streaming_s: f64,
    /// Frames per second over `streaming_s`.
    pub streaming_frames_per_s: f64,
    /// Everything else, by name: `wall_s` is `streaming_s` plus these.
    pub setup: Vec<Phase>,
    /// `setup`'s seconds together.
    pub setup_s: f64,
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

/// The setup of opening the device, before the command's own work.
pub(super) const OPENING_THE_DEVICE: &str = "opening the device";
/// The setup of freeing a ring's or filter's memory (unpinning).
pub(super) const RELEASING: &str = "releasing the frame memory";

/// What the wall time holds besides the streaming and the named setup: parsing the input's
/// header, opening and checking files, writing the container's header.
const OTHER: &str = "other (headers, checks)";

impl Report {
    /// The report, with the wall time taken now: call it once the output is closed and the
    /// frame memory released.
    pub(super) fn new(facts: Facts, kernel: &Gaussian, mut clock: Clock) -> Report {
        clock.stop_streaming();
        let wall = clock.command.elapsed();
        let named: Duration = clock.setup.iter().map(|(_, spent)| *spent).sum();
        let other = wall.saturating_sub(clock.streamed + named);
        clock.setup(OTHER, other);
        let frames = clock.frames();
        let per_s = |seconds: f64| if seconds > 0.0 { frames as f64 / seconds } else { 0.0 };
        let setup: Vec<Phase> =
            clock.setup.iter().map(|&(name, spent)| Phase { name, seconds: spent.as_secs_f64() }).collect();
        let setup_s = setup.iter().map(|phase| phase.seconds).sum();
        Report {
            facts,
            radius: kernel.radius(),
            sigma: kernel.sigma(),
            border: kernel.border(),
            frames,
            latency_ms: Summary::of(&clock.latencies_ms),
            wall_s: wall.as_secs_f64(),
            frames_per_s: per_s(wall.as_secs_f64()),
            streaming_s: clock.streamed.as_secs_f64(),
            streaming_frames_per_s: per_s(clock.streamed.as_secs_f64()),
            setup,
            setup_s,
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
                    "{:.1} frames/s over the command's {:.3} s; {:.1} frames/s over the {:.3} s the frames \
                     streamed; latency p50 {:.3} ms, p99 {:.3} ms",
                    self.frames_per_s,
                    self.wall_s,
                    self.streaming_frames_per_s,
                    self.streaming_s,
                    latency.median,
                    latency.p99
                )?,
                None => writeln!(err, "no frames ({:.3} s)", self.wall_s)?,
            }
            let parts: Vec<String> = self
                .setup
                .iter()
                .filter(|phase| phase.seconds >= 0.0005 || phase.name == OTHER)
                .map(|phase| format!("{} {:.3}", phase.name, phase.seconds))
                .collect();
            writeln!(err, "setup {:.3} s: {}", self.setup_s, parts.join(", "))?;
        }
        err.flush()?;
        Ok(())
    }
}
