//! What the CLI says on stderr besides errors and warnings: progress bars and informational
//! lines, both hidden by `-q`/`--quiet`. Bars draw on stderr only when it is a terminal
//! (indicatif's stderr target draws nothing otherwise), so a log or a pipe gets no progress.
//! Errors and warnings are printed whatever the flags.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// `-q`/`--quiet`, for the parts of the CLI that talk.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    pub quiet: bool,
}

impl Ui {
    /// A bar over `steps` steps of the work, counted in `unit`s, its message naming the step.
    pub fn bar(&self, steps: u64, unit: &str) -> ProgressBar {
        let template = format!("{{msg}} {{wide_bar}} {{pos}}/{{len}} {unit}, {{per_sec}}, {{eta}} left");
        self.progress(Some(steps), &template)
    }

    /// Bytes on their way somewhere: a bar over `total` bytes with the rate.
    pub fn bytes(&self, total: u64, message: impl Into<String>) -> ProgressBar {
        let template = "{msg} {wide_bar} {bytes}/{total_bytes}, {decimal_bytes_per_sec}, {eta} left";
        self.progress(Some(total), template).with_message(message.into())
    }

    /// Frames through a filter: a bar when the count is known, else a running count.
    pub fn frames(&self, frames: Option<u64>) -> ProgressBar {
        match frames {
            Some(frames) => self.bar(frames, "frames"),
            None => self.progress(None, "{spinner} {pos} frames, {per_sec}"),
        }
    }

    /// A spinner with the time spent, for a step whose own progress cannot be seen from here.
    pub fn spinner(&self, message: impl Into<String>) -> ProgressBar {
        let spinner = self.progress(None, "{spinner} {msg} {elapsed}").with_message(message.into());
        spinner.enable_steady_tick(Duration::from_millis(100));
        spinner
    }

    /// Prints an informational line on stderr (`wrote plots/x.svg`), unless quiet.
    pub fn info(&self, line: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }

    /// A bar of `steps` (a spinner for `None`) drawn with `template`, cleared however the work
    /// ends, an error included: the error is what should stay on the screen.
    fn progress(&self, steps: Option<u64>, template: &str) -> ProgressBar {
        let target = if self.quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        let style = ProgressStyle::with_template(template).expect("a valid template");
        ProgressBar::with_draw_target(steps, target).with_style(style).with_finish(ProgressFinish::AndClear)
    }
}
