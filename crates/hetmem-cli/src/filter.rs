//! `hetmem filter` (being written).

use std::process::ExitCode;

use hetmem::Device;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_device: &Device, _args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hetmem filter is not built yet")
}
