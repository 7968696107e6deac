//! `hetmem bench`: measurements of this machine's ways of sharing memory.
//!
//! Every subcommand prints a table, or JSON (`--json`), Markdown (`--markdown`) or CSV
//! (`--csv`, one per table); `--svg DIR` also draws plots and `--save DIR` also writes
//! `<name>.json`, `<name>.md` and a CSV per table, so one run gives every form. Files that
//! exist already are refused before anything is measured, unless `-y`.

mod ct;
mod dataset;
mod file;
mod link;
mod pipeline;
mod plot;
mod signals;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::backend::DeviceSelection;
use hetmem::data::StreamOptions;
use hetmem::{BackendChoice, Device, Queue, Strategy};
use hetmem_bench::ct::CtOptions;
use hetmem_bench::dataset::{Backing, DatasetOptions};
use hetmem_bench::file::FileOptions;
use hetmem_bench::link::LinkOptions;
use hetmem_bench::{compare, completion, pinning, sizes};

use crate::choices::{self, LinkPathName, LoadMethodName, StrategyName};
use crate::json::{self, Schema};
use crate::outputs::Outputs;
use crate::table::Table;
use crate::ui::Ui;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    /// Print JSON instead of a table (its "schema" field names it: "hetmem.bench.link/1", ...).
    #[arg(long, global = true, conflicts_with_all = ["markdown", "csv"])]
    json: bool,
    /// Print Markdown instead of a table.
    #[arg(long, global = true, conflicts_with = "csv")]
    markdown: bool,
    /// Print CSV instead of a table: one CSV per table, a blank line between them.
    #[arg(long, global = true)]
    csv: bool,
    /// Also draw SVG plots into this folder.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    svg: Option<PathBuf>,
    /// Also write <subcommand>.json, <subcommand>.md and <table>.csv for each table into this
    /// folder.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    save: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Bandwidth vs size and small-transfer latency of every path across the link, against the
    /// copy engines' own rate. Without a GPU: the host-side cells only.
    Link {
        /// A few sizes and repeats (under a minute on a GPU machine).
        #[arg(long)]
        quick: bool,
        /// Bandwidth sizes, comma-separated (4KiB..1GiB, multiples of 4 KiB). Default: 4KiB to
        /// 1GiB by x4.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<String>,
        /// Latency sizes, comma-separated (4 B..64KiB); `none` for no latency cells.
        #[arg(long, value_delimiter = ',')]
        latency_sizes: Vec<String>,
        /// Paths to measure, comma-separated (default: all).
        #[arg(long, value_delimiter = ',', value_parser = choices::by_library::<LinkPathName>())]
        paths: Vec<LinkPathName>,
        /// Timed repetitions per bandwidth cell of 64 MiB (up to 5x as many for smaller cells, fewer for larger ones, at least 3).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        repeats: Option<u64>,
        /// Leave the host buffers in the CPU's caches between cells instead of evicting them
        /// before each GPU cell: each cell then sees what the cell or check before it left there
        /// (the GPU reads lines a core holds more slowly).
        #[arg(long)]
        warm_cpu_cache: bool,
    },
    /// Copy vs zero-copy vs a file mapping, side by side: latency of a small transfer and
    /// bandwidth of a large one.
    ///
    /// cudaMemcpy from pinned and from pageable memory, a kernel reading mapped host memory,
    /// and one reading a registered file mapping (mmap).
    Compare {
        /// 256 MiB instead of 1 GiB, fewer repeats.
        #[arg(long)]
        quick: bool,
    },
    /// The per-strategy frame table (Gaussian 5x5 on RGB frames) at 1080p and 4K.
    Pipeline {
        /// 30 frames per strategy instead of 300.
        #[arg(long)]
        quick: bool,
        /// Frames per strategy (overrides --quick).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        frames: Option<u32>,
        /// Strategies to run, comma-separated (default: every one the machine has).
        #[arg(long, value_delimiter = ',', value_parser = choices::by_library::<StrategyName>())]
        strategies: Vec<StrategyName>,
        /// Stream frames through a FrameRing (upload, kernel and download of different frames
        /// at once) and report throughput instead of one frame's latency.
        #[arg(long)]
        pipelined: bool,
        /// Slots in the ring, with --pipelined.
        #[arg(long, default_value_t = 3, requires = "pipelined",
              value_parser = clap::value_parser!(u32).range(2..=16))]
        slots: u32,
        /// GPUs to fan the frames out over, with --pipelined: `all` or numbers such as `0,1`
        /// (frame k to the k mod N-th). Default: the one in use.
        #[arg(long, requires = "pipelined", value_parser = parse_devices)]
        devices: Option<DeviceSelection>,
        /// What runs on each frame, with --pipelined: `gaussian` (the built-in blur), `user` (a
        /// user's CUDA C kernel given through hetmem's stage API, reading and writing the same
        /// bytes), or both, comma-separated; with both, the table gives each user figure against
        /// the built-in one of the same run.
        #[arg(long, value_delimiter = ',', default_value = "gaussian", requires = "pipelined")]
        stage: Vec<pipeline::StageChoice>,
    },
    /// The CT case: per-organ statistics over a sweep of HU windows, a masked
    /// Gaussian of the liver and a maximum-intensity projection of a generated 512x512x300
    /// phantom, with the volume and the template copied per pass, mapped, hybrid (template in
    /// device memory) and placed by hetmem's placement, against the CPU; seconds per study.
    Ct {
        /// A 40x128x128 study, 2 runs.
        #[arg(long)]
        quick: bool,
        /// Studies stacked into one volume (the larger-than-budget run; statistics and the
        /// projection only).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        studies: u32,
        /// HU windows swept (each a pass per organ).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
        windows: u32,
        /// Timed runs per row.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
        repeats: Option<u32>,
        /// Device memory the placements may take, e.g. 512MiB (default 8GiB).
        #[arg(long)]
        device_budget: Option<String>,
        /// The link profile placement decides from: JSON of `hetmem bench link --json` (default:
        /// the one `hetmem bench link` saved for this GPU, else measured in this run and saved).
        #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        link_profile: Option<PathBuf>,
        /// Device-memory read rate, GB/s, for --link-profile JSON without a `device_read` cell
        /// (from a bench link before it measured one).
        #[arg(long, requires = "link_profile")]
        device_read_gb_s: Option<f64>,
        /// Write the maximum-intensity projection as a PNG.
        #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        mip: Option<PathBuf>,
        /// Write the volume, the template and the CPU's statistics into this folder, for
        /// bench/peers/ct_stats_torch.py.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        write_volume: Option<PathBuf>,
        /// A volume of HU values instead of the phantom: NIfTI-1 (.nii, .nii.gz) or raw
        /// little-endian i16 (with --shape).
        #[arg(long, value_name = "FILE", requires = "labels", value_hint = clap::ValueHint::FilePath)]
        volume: Option<PathBuf>,
        /// Its label template (labels 0 to 6 are read as the phantom's organs): NIfTI-1 or raw u8.
        #[arg(long, value_name = "FILE", requires = "volume", value_hint = clap::ValueHint::FilePath)]
        labels: Option<PathBuf>,
        /// The shape of raw files, DEPTHxHEIGHTxWIDTH (e.g. 300x512x512).
        #[arg(long, requires = "volume")]
        shape: Option<String>,
    },
    /// Time from a kernel's end to the CPU knowing, for every completion signal.
    Completion {
        /// Samples per signal.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        samples: u64,
    },
    /// A file into GPU memory: GB/s against its size, cold and warm, by every method of
    /// `hetmem load`, beside the storage's and the link's own rates.
    ///
    /// Writes a safetensors file with Llama 3 8B's tensor shapes (random bytes) for each size
    /// into --dir, named hetmem-bench-<size>.safetensors (e.g. hetmem-bench-8GiB.safetensors),
    /// and removes it after unless --keep; a kept file of the same shapes is reused.
    File {
        /// The folder for the test files (on the storage to measure). Needs the largest size
        /// free.
        #[arg(long, value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
        /// 64 MiB and 256 MiB only (a check that everything runs).
        #[arg(long)]
        quick: bool,
        /// File sizes, comma-separated (e.g. 1GiB,8GiB). Default: 1GiB to 32GiB, doubling.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<String>,
        /// Methods, comma-separated (default: all).
        #[arg(long, value_delimiter = ',', value_parser = choices::by_library::<LoadMethodName>())]
        methods: Vec<LoadMethodName>,
        /// Timed loads per cell, the best reported.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
        repeats: u64,
        /// Keep the test files this run writes (for the peers' script, or a later run); files
        /// kept by an earlier run are reused and left in place.
        #[arg(long)]
        keep: bool,
        /// Empty the whole page cache (/proc/sys/vm/drop_caches, as root) before cold loads;
        /// without it, or where not allowed, the file's own pages (posix_fadvise DONTNEED).
        #[arg(long)]
        drop_caches: bool,
        /// Reader threads of each load, comma-separated to compare several (e.g. 8,16).
        /// Default: the CPUs, at most 16.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
        threads: Vec<u32>,
        /// Bytes per read and copy (multiples of 4 KiB), comma-separated to compare several
        /// (e.g. 4MiB,16MiB,64MiB). Every threads and chunk pair is measured.
        #[arg(long, value_name = "SIZE", value_delimiter = ',', default_value = "8MiB")]
        chunk: Vec<String>,
        /// Staging buffers (or windows) in flight. Default: twice the threads.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        depth: Option<u32>,
        /// Threads of the storage's many-stream reads.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
        storage_streams: u32,
    },
    /// Pinning cost by method and size, CPU access to pinned memory, and pool reuse.
    Pinning {
        /// 64 MiB only, one repeat.
        #[arg(long)]
        quick: bool,
    },
    /// A data set larger than device memory: frames of RGB held whole in one portable mapped pinned allocation
    /// (or a file, mapped and registered), each filtered where it lies (the kernel reads the
    /// data set's device pointer + the frame's offset, no device memory), against copying each
    /// frame to the device and back. Frames/s and device memory used; a sample of frames of
    /// each run checked against the CPU. Default: 500 frames of 8K (49.8 GB).
    Dataset {
        /// Frames in the data set.
        #[arg(long, default_value_t = dataset::DEFAULT_FRAMES,
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
        frames: usize,
        /// Frame size, unless --width and --height give one.
        #[arg(long, value_enum, default_value = "8k", conflicts_with_all = ["width", "height"])]
        resolution: dataset::Resolution,
        /// Frame width in pixels (with --height).
        #[arg(long, requires = "height", value_parser = clap::value_parser!(u32).range(1..=65535))]
        width: Option<u32>,
        /// Frame height in pixels (with --width).
        #[arg(long, requires = "width", value_parser = clap::value_parser!(u32).range(1..=65535))]
        height: Option<u32>,
        /// Where the data set lives: `host` (one pinned, mapped, portable allocation) or `file`
        /// (written to --dir, mapped read-only and registered; removed at the end).
        #[arg(long, value_enum, default_value = "host")]
        backing: BackingArg,
        /// The folder for --backing file's file (default: the system's temp folder). It needs
        /// the data set's size free.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: Option<PathBuf>,
        /// Frames checked against the CPU per method: the first, the last, some between.
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1000))]
        verify: usize,
    },
}

/// `--backing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackingArg {
    /// One pinned, mapped, portable host allocation
    Host,
    /// A file, mapped read-only and registered
    File,
}

fn parse_devices(text: &str) -> Result<DeviceSelection, hetmem::Error> {
    Ok(text.parse::<DeviceSelection>()?)
}

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
        What::Link { quick, sizes, latency_sizes, paths, repeats, warm_cpu_cache } => {
            let mut options = link_options(*quick, sizes, latency_sizes, paths, *repeats)?;
            options.cold_cpu_cache = !warm_cpu_cache;
            let spinner = ui.spinner("measuring the link (bench link)");
            let report = hetmem_bench::link::measure(device, &options).context("link benchmark")?;
            spinner.finish_and_clear();
            let mut tables = link::tables(&report);
            if let Some(gpu) = device.as_cuda() {
                tables[0].note(match hetmem_bench::link::save_profile(gpu, &report) {
                    Ok(path) => format!(
                        "link profile saved to {}: placements on this GPU decide from it",
                        path.display()
                    ),
                    Err(error) => format!("link profile not saved: {error}"),
                });
            }
            emit.all(&report, &tables, |dir| link::plots(&report, dir))
        }
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
        What::Ct {
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
        } => {
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
            outputs.check_all(
                mip.iter().cloned().chain(write_volume.iter().flat_map(|dir| ct::volume_files(dir))),
            )?;
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
        What::Completion { samples } => {
            require_gpu(device)?;
            let queue = Queue::new(device)?;
            let spinner = ui.spinner(format!("measuring {samples} samples of each completion signal"));
            let report = completion::measure(&queue, *samples as usize).context("completion benchmark")?;
            spinner.finish_and_clear();
            let table = signals::completion_table(&report);
            emit.all(&report, &[table], |dir| signals::completion_plots(&report, dir))
        }
        What::Dataset { frames, resolution, width, height, backing, dir, verify } => {
            let (width, height) = match (width, height) {
                (Some(width), Some(height)) => (*width as usize, *height as usize),
                _ => resolution.size(),
            };
            let backing = match backing {
                BackingArg::Host => Backing::Host,
                BackingArg::File => Backing::File,
            };
            let options =
                DatasetOptions { frames: *frames, width, height, backing, dir: dir.clone(), verify: *verify };
            options.validate()?;
            let spinner = ui.spinner(format!(
                "filtering {frames} frames of {width}x{height} RGB ({:.1} GB, {} memory), in place and copied \
                 (bench dataset)",
                options.dataset_bytes() as f64 / 1e9,
                backing.name()
            ));
            let report = hetmem_bench::dataset::measure(device, &options).context("data set benchmark")?;
            spinner.finish_and_clear();
            emit.all(&report, &[dataset::table(&report)], |_| Ok(Vec::new()))
        }
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

/// The files a subcommand may write: its name (`<name>.json`, `<name>.md`), its tables'
/// names (`<table>.csv`) and its plots, every one it can write, known before it runs.
struct Files {
    name: &'static str,
    schema: Schema,
    tables: Vec<String>,
    plots: Vec<String>,
}

impl Files {
    fn of(what: &What) -> Files {
        let names = |names: &[&str]| names.iter().map(ToString::to_string).collect();
        let (name, schema, tables, plots) = match what {
            What::Link { .. } => ("link", "hetmem.bench.link/1", names(&link::TABLES), names(&link::PLOTS)),
            What::Compare { .. } => (
                "compare",
                "hetmem.bench.compare/1",
                names(&[link::COMPARE_TABLE]),
                names(&link::COMPARE_PLOTS),
            ),
            What::Pipeline { pipelined: true, .. } => {
                ("pipelined", "hetmem.bench.pipelined/1", names(&pipeline::STREAMING_TABLES), Vec::new())
            }
            What::Pipeline { pipelined: false, .. } => {
                let tables: Vec<String> = pipeline::RESOLUTIONS
                    .iter()
                    .map(|&(width, height)| crate::frame_strategies::table_name(width, height))
                    .collect();
                let plots = tables.iter().map(|table| format!("{table}.svg")).collect();
                ("pipeline", "hetmem.bench.pipeline/1", tables, plots)
            }
            What::Ct { .. } => ("ct", "hetmem.bench.ct/1", names(&ct::TABLES), Vec::new()),
            What::Completion { .. } => (
                "completion",
                "hetmem.bench.completion/1",
                names(&[signals::COMPLETION_TABLE]),
                names(&[signals::COMPLETION_PLOT]),
            ),
            What::Dataset { .. } => {
                ("dataset", "hetmem.bench.dataset/1", names(&[dataset::TABLE]), Vec::new())
            }
            What::File { .. } => ("file", "hetmem.bench.file/1", names(&file::TABLES), Vec::new()),
            What::Pinning { .. } => (
                "pinning",
                "hetmem.bench.pinning/1",
                names(&[signals::PINNING_TABLE]),
                names(&[signals::PINNING_PLOT]),
            ),
        };
        Files { name, schema: Schema(schema), tables, plots }
    }

    /// What `--save DIR` writes.
    fn saved(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files = vec![dir.join(format!("{}.json", self.name)), dir.join(format!("{}.md", self.name))];
        files.extend(self.tables.iter().map(|table| dir.join(format!("{table}.csv"))));
        files
    }
}

/// The link options from the command line: the quick or full set, with sizes, paths and
/// repeats replaced where given.
fn link_options(
    quick: bool,
    sizes_given: &[String],
    latency_given: &[String],
    paths: &[LinkPathName],
    repeats: Option<u64>,
) -> anyhow::Result<LinkOptions> {
    let mut options = if quick { LinkOptions::quick() } else { LinkOptions::full() };
    for (flag, given, example) in [
        ("--sizes", sizes_given, "4KiB,1MiB,1GiB (4 KiB to 1 GiB)"),
        ("--latency-sizes", latency_given, "4,64KiB (4 B to 64 KiB), or none"),
    ] {
        no_empty_items(flag, given, example)?;
    }
    if !sizes_given.is_empty() {
        options.sizes = sizes_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if latency_given.iter().any(|text| text == "none") {
        options.latency_sizes.clear();
    } else if !latency_given.is_empty() {
        options.latency_sizes =
            latency_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if !paths.is_empty() {
        options.paths = paths.iter().map(|path| path.0).collect();
    }
    if let Some(repeats) = repeats {
        options.repeats = repeats as usize;
    }
    options.validate()?;
    Ok(options)
}

/// The file benchmark's options from the command line.
fn file_options(what: &What) -> anyhow::Result<FileOptions> {
    let What::File {
        dir,
        quick,
        sizes: sizes_given,
        methods,
        repeats,
        keep,
        drop_caches,
        threads,
        chunk,
        depth,
        storage_streams,
    } = what
    else {
        unreachable!("called for bench file only")
    };
    no_empty_items("--sizes", sizes_given, "1GiB,8GiB")?;
    let mut options = if *quick { FileOptions::quick(dir) } else { FileOptions::full(dir) };
    if !sizes_given.is_empty() {
        options.sizes = sizes_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if !methods.is_empty() {
        options.methods = methods.iter().map(|method| method.0).collect();
    }
    options.repeats = *repeats as usize;
    options.keep = *keep;
    options.drop_caches = *drop_caches;
    options.storage_streams = *storage_streams as usize;
    no_empty_items("--chunk", chunk, "4MiB,16MiB")?;
    let default = StreamOptions::default();
    let threads: Vec<usize> = if threads.is_empty() {
        vec![default.threads]
    } else {
        threads.iter().map(|&n| n as usize).collect()
    };
    let chunks =
        chunk.iter().map(|text| sizes::parse(text).context("--chunk")).collect::<anyhow::Result<Vec<_>>>()?;
    options.tunings = threads
        .iter()
        .flat_map(|&threads| {
            chunks.iter().map(move |&chunk_bytes| StreamOptions {
                threads,
                chunk_bytes,
                ring_depth: depth.map_or(2 * threads, |depth| depth as usize),
                ..default
            })
        })
        .collect();
    Ok(options)
}

/// `--strategies`, as the library's.
fn strategies_of(names: &[StrategyName]) -> Vec<Strategy> {
    names.iter().map(|name| name.0).collect()
}

/// Refuses a list option given empty (`--sizes ""`) or with an empty item (`4KiB,,1MiB`),
/// which would otherwise read as a size or name that is not one.
fn no_empty_items(flag: &str, given: &[String], example: &str) -> anyhow::Result<()> {
    if given.iter().all(|item| item.trim().is_empty()) && !given.is_empty() {
        bail!(
            "{flag} is empty: give a comma-separated list such as {example}, or leave {flag} out for the default"
        );
    }
    if given.iter().any(|item| item.trim().is_empty()) {
        bail!("{flag} {} has an empty item: give a comma-separated list such as {example}", given.join(","));
    }
    Ok(())
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

/// How a subcommand's results leave: stdout in the form asked for, and the files asked for.
struct Emit<'a> {
    args: &'a Args,
    ui: Ui,
    outputs: Outputs,
    files: Files,
}

impl Emit<'_> {
    /// Prints the report as asked, and writes the saved forms and plots.
    fn all(
        &self,
        report: &impl serde::Serialize,
        tables: &[Table],
        plots: impl FnOnce(&Path) -> anyhow::Result<Vec<PathBuf>>,
    ) -> anyhow::Result<ExitCode> {
        let Emit { args, ui, outputs, files } = self;
        let mut out = std::io::stdout().lock();
        if args.json {
            json::write(&mut out, files.schema, report)?;
        } else {
            for (index, table) in tables.iter().enumerate() {
                if args.markdown {
                    table.write_markdown(&mut out)?;
                } else if args.csv {
                    if index > 0 {
                        out.write_all(b"\r\n")?;
                    }
                    table.write_csv(&mut out)?;
                } else {
                    table.write_text(&mut out)?;
                }
            }
        }
        out.flush()?;
        if let Some(dir) = &args.save {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let name = files.name;
            outputs.write(&dir.join(format!("{name}.json")), json::to_string(files.schema, report)?)?;
            let mut markdown = Vec::new();
            writeln!(markdown, "## hetmem bench {name}\n")?;
            for table in tables {
                table.write_markdown(&mut markdown)?;
            }
            outputs.write(&dir.join(format!("{name}.md")), markdown)?;
            for table in tables {
                debug_assert!(
                    files.tables.contains(&table.name),
                    "{} is not among the files checked",
                    table.name
                );
                let mut csv = Vec::new();
                table.write_csv(&mut csv)?;
                outputs.write(&dir.join(format!("{}.csv", table.name)), csv)?;
            }
        }
        if let Some(dir) = &args.svg {
            for file in plots(dir)? {
                ui.info(format_args!("wrote {}", file.display()));
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The name an enum variant has in the JSON output (`event_sync`), for the text tables.
fn snake_name(value: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_value(value)?.as_str().unwrap_or_default().to_string())
}
