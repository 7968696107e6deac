//! `hetmem doctor`.

mod text;

use std::io::Write;
use std::process::ExitCode;

use hetmem::Device;
use hetmem_bench::doctor::{Report, Status};

use crate::json::{self, Schema};

/// What `doctor --json` prints.
const SCHEMA: Schema = Schema("hetmem.doctor/1");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON (stable field names, under "schema": "hetmem.doctor/1") instead of text.
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
        json::write(&mut stdout, SCHEMA, &report)?;
    } else {
        stdout.write_all(text::report_text(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(if args.strict && report.worst() == Status::Fail { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
