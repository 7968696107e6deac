//! `hetmem`: see what this machine can do for CPU<->GPU memory sharing, and measure it.
//!
//! The binary is thin: each subcommand parses its options and calls the library.

mod bench;
mod demo;
mod doctor;
mod environment;
mod filter;
mod frame_strategies;
mod table;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use hetmem::{BackendChoice, Device};

/// Zero-copy CPU<->GPU memory sharing for NVIDIA GPUs, with a CPU backend.
#[derive(Debug, Parser)]
#[command(name = "hetmem", version, about)]
struct Cli {
    /// Backend to run on: auto (the first GPU, else the CPU), cpu, or cuda.
    #[arg(long, global = true, env = "HETMEM_BACKEND", default_value = "auto")]
    backend: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Report the GPUs, the driver and the host settings that decide how memory is shared.
    Doctor(doctor::Args),
    /// Measure this machine: completion signals, pinning, ...
    Bench(bench::Args),
    /// Blur moving synthetic 1080p frames by every strategy the machine has, side by side.
    Demo(demo::Args),
    /// Blur images (PNG, JPEG, PPM) or Y4M video (files or pipes).
    Filter(filter::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HETMEM_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
    hetmem::kernels::set_cache(environment::kernel_cache());
    let choice: BackendChoice = cli.backend.parse()?;
    let device = Device::open(choice).context("cannot open the requested backend")?;
    match cli.command {
        Command::Doctor(args) => doctor::run(&device, &args),
        Command::Bench(args) => bench::run(&device, choice, &args),
        Command::Demo(args) => demo::run(&device, &args),
        Command::Filter(args) => filter::run(&device, &args),
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
