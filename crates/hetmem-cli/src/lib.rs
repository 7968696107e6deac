//! `hetmem`: see what this machine can do for CPU<->GPU memory sharing, and measure it.
//!
//! The command is thin: each subcommand parses its options and calls the libraries (hetmem,
//! hetmem-bench, and hetmem-media for `hetmem filter`'s media I/O). It is a library target too
//! (`src/main.rs` only calls [`main`]); it is no library to depend on.

mod bench;
mod choices;
mod demo;
mod doctor;
mod environment;
mod filter;
mod frame_strategies;
mod generate;
mod json;
mod load;
mod logging;
mod outputs;
mod table;
mod ui;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand};
use hetmem::Device;

use crate::choices::Backend;
use crate::outputs::Outputs;
use crate::ui::Ui;

/// Where the options every command takes are listed in `--help`.
const GLOBAL: &str = "Global options";

/// Zero-copy CPU<->GPU memory sharing for NVIDIA GPUs, with a CPU backend.
#[derive(Debug, Parser)]
#[command(name = "hetmem", version)]
struct Cli {
    /// Backend to run on.
    #[arg(
        long,
        global = true,
        env = "HETMEM_BACKEND",
        default_value = "auto",
        value_parser = choices::by_library::<Backend>(),
        help_heading = GLOBAL
    )]
    backend: Backend,

    /// Print no progress and no summary on stderr: warnings and errors only. The log then
    /// shows errors only, unless HETMEM_LOG says otherwise.
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = GLOBAL)]
    quiet: bool,

    /// Log more on stderr: -v info, -vv debug, -vvv trace. HETMEM_LOG, when set, wins (a
    /// tracing filter such as `debug` or `hetmem=trace`).
    #[arg(short, long, global = true, action = ArgAction::Count, help_heading = GLOBAL)]
    verbose: u8,

    /// Replace output files that exist already (without it they are refused before any work).
    #[arg(short = 'y', long, global = true, help_heading = GLOBAL)]
    overwrite: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Report the GPUs, the driver and the host settings that decide how memory is shared.
    Doctor(doctor::Args),
    /// Measure this machine: completion signals, pinning, ...
    Bench(bench::Args),
    /// Load files into GPU memory (safetensors tensor by tensor), or through a checksum kernel,
    /// at the storage's speed: GB/s against the link's and the storage's rates.
    Load(load::Args),
    /// Blur moving synthetic 1080p frames by every strategy the machine has, side by side.
    Demo(demo::Args),
    /// Blur images (PNG, JPEG, PPM) or video (Y4M, raw frames), from files or pipes.
    Filter(filter::Args),
    /// Print a shell's completion script, e.g. `hetmem completions bash > /etc/bash_completion.d/hetmem`.
    Completions(generate::CompletionsArgs),
    /// Print the man page (roff), e.g. `hetmem man | man -l -`, or write every page with --out.
    Man(generate::ManArgs),
}

/// The `hetmem` command: parses the arguments, runs the subcommand, prints its error.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.quiet, cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hetmem: error: {}", chain_text(&error));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let ui = Ui { quiet: cli.quiet };
    let outputs = Outputs { overwrite: cli.overwrite };
    let choice = cli.backend.0;
    // Opened by the commands that run work only: completions and the man page need none.
    let device = || -> anyhow::Result<Device> {
        hetmem::kernels::set_cache(environment::kernel_cache());
        Device::open(choice).context("cannot open the requested backend")
    };
    match cli.command {
        Command::Doctor(args) => doctor::run(&device()?, &args),
        Command::Bench(args) => bench::run(&device()?, choice, &args, ui, outputs),
        Command::Load(args) => load::run(&device()?, &args, ui),
        Command::Demo(args) => demo::run(&device()?, &args, ui, outputs),
        Command::Filter(args) => {
            // The summary's wall time counts from here, the device's opening included.
            let started = std::time::Instant::now();
            filter::run(&device()?, started, &args, ui, outputs)
        }
        Command::Completions(args) => generate::completions(&args),
        Command::Man(args) => generate::man(&args, ui, outputs),
    }
}

/// A reader closing our stdout early (`hetmem ... | head`) is not an error.
pub(crate) fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes, `: `-separated as `{:#}` prints them, less each cause whose text
/// the one before it already ends with: the `image` crate's errors, for one, print their
/// source in their own text and then give it as their source too.
fn chain_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if !previous.is_empty() && previous.ends_with(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
        previous = message;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::chain_text;

    /// An error that prints its source in its own text, as `image::ImageError` does.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Format error decoding Png: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_is_printed_once() {
        let inner = std::io::Error::other("Unrecognized critical chunk");
        let error = anyhow::Error::new(Wrapping(inner)).context("cannot decode x.png as PNG");
        assert_eq!(format!("{error:#}").matches("Unrecognized critical chunk").count(), 2);
        assert_eq!(
            chain_text(&error),
            "cannot decode x.png as PNG: Format error decoding Png: Unrecognized critical chunk"
        );
        // Causes that differ all stay.
        let error = anyhow::anyhow!("no such file").context("cannot open a.png");
        assert_eq!(chain_text(&error), "cannot open a.png: no such file");
    }
}
