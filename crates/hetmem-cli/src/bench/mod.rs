//! `hetmem bench`: measurements of this machine's ways of sharing memory.
//!
//! Every subcommand prints a table, or JSON (`--json`), Markdown (`--markdown`) or CSV
//! (`--csv`, one per table); `--svg DIR` also draws plots and `--save DIR` also writes
//! `<name>.json`, `<name>.md` and a CSV per table, so one run gives every form. Files that
//! exist already are refused before anything is measured, unless `-y`.

mod args;
mod ct;
mod dataset;
mod emit;
mod file;
mod link;
mod options;
mod pipeline;
mod plot;
mod signals;

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::{BackendChoice, Device, Queue};
use hetmem_bench::ct::CtOptions;
use hetmem_bench::dataset::{Backing, DatasetOptions};
use hetmem_bench::{compare, completion, pinning, sizes};

pub use args::Args;
use args::{BackingArg, What};
use emit::{Emit, Files};
use options::{file_options, link_options, strategies_of};

use crate::outputs::Outputs;
use crate::ui::Ui;

pub fn run(
    device: &Device,
    choice: BackendChoice,
    args: &Args,
    ui: Ui,
    outputs: Outputs,
) -> anyhow::Result<ExitCode> {
    let files = Files::of(&args.what);
    // Before any measuring: a run can take minutes.
    if let Some(dir) = &args.save {
        outputs.check_all(files.saved(dir))?;
    }
    if let Some(dir) = &args.svg {
        outputs.check_all(files.plots.iter().map(|plot| dir.join(plot)))?;
    }
    let emit = Emit { args, ui, outputs, files };
    match &args.what {
        What::Link { .. } => run_link(device, &args.what, ui, &emit),
        What::Compare { quick } => {
            let spinner = ui.spinner("measuring copy vs zero-copy vs mmap (bench compare)");
            let report = compare::measure(device, *quick).context("compare benchmark")?;
            spinner.finish_and_clear();
            emit.all(&report, &link::compare_tables(&report), |dir| link::compare_plots(&report, dir))
        }
        What::Pipeline { quick, frames, strategies, pipelined: true, slots, devices, stage } => {
            let wanted = strategies_of(strategies);
            let devices = match devices {
                Some(selection) => Device::open_selection(choice, selection)
                    .with_context(|| format!("--devices {selection}"))?,
                None => vec![device.clone()],
            };
            let runs =
                pipeline::measure_streaming(&devices, *quick, *frames, &wanted, *slots as usize, stage, ui)?;
            emit.all(&pipeline::Runs { runs: &runs }, &pipeline::streaming_tables(&runs), |_| Ok(Vec::new()))
        }
        What::Pipeline { quick, frames, strategies, pipelined: false, .. } => {
            let wanted = strategies_of(strategies);
            let frames = frames.unwrap_or(if *quick { 30 } else { 300 });
            let reports = pipeline::measure(device, frames, &wanted, ui)?;
            emit.all(&pipeline::Reports { reports: &reports }, &pipeline::tables(&reports), |dir| {
                pipeline::plots(&reports, dir)
            })
        }
        What::Ct { .. } => run_ct(device, &args.what, ui, outputs, &emit),
        What::Completion { samples } => {
            require_gpu(device)?;
            let queue = Queue::new(device)?;
            let spinner = ui.spinner(format!("measuring {samples} samples of each completion signal"));
            let report = completion::measure(&queue, *samples as usize).context("completion benchmark")?;
            spinner.finish_and_clear();
            let table = signals::completion_table(&report);
            emit.all(&report, &[table], |dir| signals::completion_plots(&report, dir))
        }
        What::Dataset { .. } => run_dataset(device, &args.what, ui, &emit),
        What::File { .. } => {
            let options = file_options(&args.what)?;
            let spinner = ui.spinner("bench file");
            let report =
                hetmem_bench::file::measure(device, &options, &|step| spinner.set_message(step.to_string()))
                    .context("file benchmark")?;
            spinner.finish_and_clear();
            emit.all(&report, &file::tables(&report), |_| Ok(Vec::new()))
        }
        What::Pinning { quick } => {
            require_gpu(device)?;
            let (sizes, repeats): (&[usize], usize) =
                if *quick { (&[64 << 20], 1) } else { (&[2 << 20, 64 << 20, 1 << 30], 3) };
            let spinner = ui.spinner("measuring pinning (bench pinning)");
            let report = pinning::measure(device, sizes, repeats).context("pinning benchmark")?;
            spinner.finish_and_clear();
            emit.all(&report, &signals::pinning_tables(&report), |dir| signals::pinning_plots(&report, dir))
        }
    }
}

/// `bench link`: the table, and the link profile saved for placements on this GPU.
fn run_link(device: &Device, what: &What, ui: Ui, emit: &Emit<'_>) -> anyhow::Result<ExitCode> {
    let What::Link { quick, sizes, latency_sizes, paths, repeats, warm_cpu_cache } = what else {
        unreachable!("called for this subcommand only")
    };
    let mut options = link_options(*quick, sizes, latency_sizes, paths, *repeats)?;
    options.cold_cpu_cache = !warm_cpu_cache;
    let spinner = ui.spinner("measuring the link (bench link)");
    let report = hetmem_bench::link::measure(device, &options).context("link benchmark")?;
    spinner.finish_and_clear();
    let mut tables = link::tables(&report);
    if let Some(gpu) = device.as_cuda() {
        tables[0].note(match hetmem_bench::link::save_profile(gpu, &report) {
            Ok(path) => {
                format!("link profile saved to {}: placements on this GPU decide from it", path.display())
            }
            Err(error) => format!("link profile not saved: {error}"),
        });
    }
    emit.all(&report, &tables, |dir| link::plots(&report, dir))
}

/// `bench ct`: the options, the optional projection and volume files, and the tables.
fn run_ct(
    device: &Device,
    what: &What,
    ui: Ui,
    outputs: Outputs,
    emit: &Emit<'_>,
) -> anyhow::Result<ExitCode> {
    let What::Ct {
        quick,
        studies,
        windows,
        repeats,
        device_budget,
        link_profile,
        device_read_gb_s,
        mip,
        write_volume,
        volume,
        labels,
        shape,
    } = what
    else {
        unreachable!("called for this subcommand only")
    };
    let mut options = if *quick { CtOptions::quick() } else { CtOptions::full() };
    options.studies = *studies as usize;
    options.windows = *windows as usize;
    if let Some(repeats) = repeats {
        options.repeats = *repeats as usize;
    }
    if let Some(budget) = device_budget {
        options.device_budget = sizes::parse(budget).context("--device-budget")? as u64;
    }
    if let Some(path) = link_profile {
        options.profile = Some(ct::profile_from_json(path, *device_read_gb_s)?);
    }
    if let (Some(volume), Some(labels)) = (volume, labels) {
        options.scan = Some(ct::read_scan(volume, labels, shape.as_deref())?);
    }
    outputs
        .check_all(mip.iter().cloned().chain(write_volume.iter().flat_map(|dir| ct::volume_files(dir))))?;
    let spinner = ui.spinner("running the CT computation every way (bench ct)");
    let run = hetmem_bench::ct::measure(device, &options).context("ct benchmark")?;
    spinner.finish_and_clear();
    if let Some(path) = mip {
        ct::write_mip(&run, path, &outputs)?;
        ui.info(format_args!("wrote {}", path.display()));
    }
    if let Some(dir) = write_volume {
        ct::write_volume(&run, dir, &outputs)?;
        ui.info(format_args!("wrote the volume for the peer into {}", dir.display()));
    }
    emit.all(&run.report, &ct::tables(&run.report), |_| Ok(Vec::new()))
}

/// `bench dataset`: the data set's options and its table.
fn run_dataset(device: &Device, what: &What, ui: Ui, emit: &Emit<'_>) -> anyhow::Result<ExitCode> {
    let What::Dataset { frames, resolution, width, height, backing, dir, verify, device_budget } = what
    else {
        unreachable!("called for this subcommand only")
    };
    let (width, height) = match (width, height) {
        (Some(width), Some(height)) => (*width as usize, *height as usize),
        _ => resolution.size(),
    };
    let backing = match backing {
        BackingArg::Host => Backing::Host,
        BackingArg::File => Backing::File,
    };
    let device_budget = device_budget
        .as_deref()
        .map(|budget| sizes::parse(budget).context("--device-budget").map(|bytes| bytes as u64))
        .transpose()?;
    let options = DatasetOptions {
        frames: *frames,
        width,
        height,
        backing,
        dir: dir.clone(),
        verify: *verify,
        device_budget,
        sparse_chunk: hetmem_bench::dataset::sparse::DEFAULT_SPARSE_CHUNK,
    };
    options.validate()?;
    let spinner = ui.spinner(format!(
        "filtering {frames} frames of {width}x{height} RGB ({:.1} GB, {} memory), in place and copied \
         (bench dataset)",
        options.dataset_bytes() as f64 / 1e9,
        backing.name()
    ));
    let report = hetmem_bench::dataset::measure(device, &options).context("data set benchmark")?;
    spinner.finish_and_clear();
    emit.all(&report, &[dataset::table(&report), dataset::sparse_table(&report)], |_| Ok(Vec::new()))
}

fn require_gpu(device: &Device) -> anyhow::Result<()> {
    if device.as_cuda().is_none() {
        bail!(
            "this benchmark measures a GPU and none is in use ({}); GPU cells were not measured",
            device
                .cpu_fallback_reason()
                .map_or("the CPU backend was chosen".to_string(), ToString::to_string)
        );
    }
    Ok(())
}

/// The name an enum variant has in the JSON output (`event_sync`), for the text tables.
fn snake_name(value: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_value(value)?.as_str().unwrap_or_default().to_string())
}
