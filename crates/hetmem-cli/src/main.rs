//! `hetmem`: see what this machine can do for CPU<->GPU memory sharing, and measure it.
//!
//! The binary is thin: each subcommand parses its options and calls the library.

mod bench;
mod demo;
mod doctor;
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
            eprintln!("hetmem: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
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
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
