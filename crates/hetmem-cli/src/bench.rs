//! `hetmem bench`: measurements of this machine's ways of sharing memory.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::bench::{completion, pinning};
use hetmem::{Device, Queue};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Time from a kernel's end to the CPU knowing, for every completion signal.
    Completion {
        /// Samples per signal.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        samples: u64,
    },
    /// Pinning cost by method and size, CPU access to pinned memory, and pool reuse.
    Pinning {
        /// 64 MiB only, one repeat.
        #[arg(long)]
        quick: bool,
    },
}

pub fn run(device: &Device, args: &Args) -> anyhow::Result<ExitCode> {
    if device.as_cuda().is_none() {
        bail!(
            "this benchmark measures a GPU and none is in use ({}); GPU cells were not measured",
            device
                .cpu_fallback_reason()
                .map_or("the CPU backend was chosen".to_string(), ToString::to_string)
        );
    }
    let mut out = std::io::stdout().lock();
    match &args.what {
        What::Completion { samples } => {
            let queue = Queue::new(device)?;
            let report = completion::measure(&queue, *samples as usize).context("completion benchmark")?;
            if args.json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                writeln!(
                    out,
                    "completion latency on {} ({} samples each), microseconds",
                    report.device, report.samples
                )?;
                writeln!(
                    out,
                    "{:<24} {:>9} {:>9} {:>9} {:>18}",
                    "mechanism", "median", "p90", "p99", "after kernel end"
                )?;
                for row in &report.rows {
                    let name = snake_name(&row.mechanism)?;
                    let s = &row.go_to_known_us;
                    writeln!(
                        out,
                        "{name:<24} {:>9.2} {:>9.2} {:>9.2} {:>18.2}",
                        s.median, s.p90, s.p99, row.after_kernel_end_us
                    )?;
                }
            }
        }
        What::Pinning { quick } => {
            let (sizes, repeats): (&[usize], usize) =
                if *quick { (&[64 << 20], 1) } else { (&[2 << 20, 64 << 20, 1 << 30], 3) };
            let report = pinning::measure(device, sizes, repeats).context("pinning benchmark")?;
            if args.json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                writeln!(out, "pinning on {} (median of {} repeats)", report.device, report.repeats)?;
                writeln!(
                    out,
                    "{:<28} {:>10} {:>11} {:>9} {:>12}",
                    "method", "MiB", "setup ms", "GB/s", "release ms"
                )?;
                for row in &report.rows {
                    let name = snake_name(&row.method)?;
                    writeln!(
                        out,
                        "{name:<28} {:>10} {:>11.2} {:>9.2} {:>12.2}",
                        row.bytes >> 20,
                        row.setup_ms,
                        row.bytes as f64 / 1e6 / row.setup_ms,
                        row.release_ms
                    )?;
                }
                for row in &report.cpu_access {
                    writeln!(
                        out,
                        "CPU, {:<15} write {:>7.2} GB/s, read {:>7.2} GB/s",
                        row.memory, row.write_gb_s, row.read_gb_s
                    )?;
                }
                let pool = &report.pool_acquire_us;
                writeln!(
                    out,
                    "pool acquire+release of a 1080p RGB frame: median {:.2} us, p99 {:.2} us",
                    pool.median, pool.p99
                )?;
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The name an enum variant has in the JSON output (`event_sync`), for the text tables.
fn snake_name(value: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_value(value)?.as_str().unwrap_or_default().to_string())
}
