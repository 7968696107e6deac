//! `hetmem doctor`.

mod text;

use std::io::Write;
use std::process::ExitCode;

use hetmem::Device;
use hetmem_bench::doctor::{Report, Status};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when any check fails.
    #[arg(long)]
    strict: bool,
}

pub fn run(device: &Device, args: &Args) -> anyhow::Result<ExitCode> {
    let report = Report::gather(device);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(text::report_text(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(if args.strict && report.worst() == Status::Fail { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
