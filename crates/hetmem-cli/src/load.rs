//! `hetmem load FILE...`: files into device memory (safetensors files tensor by tensor), or
//! through the checksum stage, with the rate against the link's and the storage's.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::data::{
    FilePieceData, FileRange, FileStream, LoadReport, SafetensorsHeader, StreamOptions, TensorEntry,
};
use hetmem::ops::{Checksum, checksum, checksum_cpu};
use hetmem::{Device, DeviceBuf, Queue};
use hetmem_bench::file::{Extent, link_h2d_gb_per_s, verify::compare_with_files};
use hetmem_bench::sizes;

use crate::choices::{self, LoadMethodName};
use crate::json::{self, Schema};
use crate::ui::Ui;

/// What `load --json` prints.
const SCHEMA: Schema = Schema("hetmem.load/1");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The files, loaded one after another. `.safetensors` files land tensor by tensor (each
    /// at its own offset of one device allocation); other files as their bytes.
    #[arg(required = true, value_hint = clap::ValueHint::FilePath)]
    files: Vec<PathBuf>,
    /// How the bytes reach the GPU. Default: chosen by sampling how much of the files the
    /// page cache holds.
    #[arg(long, default_value = "auto", value_parser = choices::by_library::<LoadMethodName>())]
    method: LoadMethodName,
    /// What runs on the bytes: `copy` them into device memory, or `checksum` them with a
    /// kernel that reads each piece where it lies (staging or window), checked against the
    /// CPU's checksum of each file.
    #[arg(long, value_enum, default_value_t = LoadWork::Copy)]
    stage: LoadWork,
    /// Load `.safetensors` files as plain bytes.
    #[arg(long)]
    raw: bool,
    /// Reader threads. Default: the CPUs, at most 12.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// Bytes per read and per copy (a multiple of 4 KiB), e.g. 8MiB. Default: 4MiB, which
    /// keeps the staging ring (depth x chunk) inside the CPU's last-level cache.
    #[arg(long, value_name = "SIZE")]
    chunk: Option<String>,
    /// Staging buffers (or windows) in flight. Default: twice the threads.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    depth: Option<u32>,
    /// The storage's read rate to compare with, in GB/s (`hetmem bench file` measures it; it
    /// is not measured here, which would take as long as the load).
    #[arg(long, value_name = "GB/S")]
    storage_rate: Option<f64>,
    /// The link's rate to compare with, in GB/s. Default: measured (5 copies of 256 MiB from
    /// pinned memory, a few tens of milliseconds), on a GPU.
    #[arg(long, value_name = "GB/S")]
    link_rate: Option<f64>,
    /// Refuse to load more than this into device memory, e.g. 40GiB. Default: the GPU's free
    /// memory.
    #[arg(long, value_name = "SIZE")]
    max_device_memory: Option<String>,
    /// Read everything back from the device and compare it with the files.
    #[arg(long)]
    verify: bool,
    /// List every tensor (name, dtype, shape, offset) in the text output.
    #[arg(long)]
    tensors: bool,
    /// Print JSON (under "schema": "hetmem.load/1") instead of text.
    #[arg(long)]
    json: bool,
    /// Test hook (built with the `testing` feature only): once BYTES are loaded, truncate the
    /// first file to LEN bytes, as BYTES:LEN: a file shrinking under the load, at a point the
    /// CLI's tests choose (with one thread and one buffer in flight, before the next piece is
    /// read or mapped).
    #[cfg(feature = "testing")]
    #[arg(long, hide = true, value_name = "BYTES:LEN")]
    truncate_after: Option<String>,
}

/// `--stage`: what the GPU does with the loaded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum LoadWork {
    /// Into device memory.
    Copy,
    /// Through the checksum kernel, reading the pieces in place.
    Checksum,
}

/// One file's checksum, from the GPU's stage and the CPU.
#[derive(Debug, serde::Serialize)]
struct FileChecksum {
    path: PathBuf,
    stage: Checksum,
    cpu: Checksum,
}

/// What `load` prints.
#[derive(Debug, serde::Serialize)]
struct Loaded {
    device: String,
    stage: LoadWork,
    files: Vec<FileRange>,
    #[serde(flatten)]
    report: LoadReport,
    gb_per_s: f64,
    link_gb_per_s: Option<f64>,
    link_measured: bool,
    of_link: Option<f64>,
    storage_gb_per_s: Option<f64>,
    of_storage: Option<f64>,
    verified: bool,
    tensors: Option<BTreeMap<String, TensorEntry>>,
    checksums: Option<Vec<FileChecksum>>,
}

pub fn run(device: &Device, args: &Args, ui: Ui) -> anyhow::Result<ExitCode> {
    let defaults = StreamOptions::default();
    let chunk = match &args.chunk {
        Some(chunk) => sizes::parse(chunk).context("--chunk")?,
        None => defaults.chunk_bytes,
    };
    let threads = args.threads.map_or(defaults.threads, |threads| threads as usize);
    let options = StreamOptions {
        method: args.method.0,
        threads,
        chunk_bytes: chunk,
        ring_depth: args.depth.map_or(2 * threads, |depth| depth as usize),
    };
    let safetensors = |path: &Path| !args.raw && path.extension().is_some_and(|ext| ext == "safetensors");
    let as_tensors = args.stage == LoadWork::Copy && args.files.iter().any(|path| safetensors(path));
    if as_tensors && !args.files.iter().all(|path| safetensors(path)) {
        bail!(
            "some files are .safetensors and some are not: load them apart, or pass --raw to load all as bytes"
        );
    }
    let ranges = if as_tensors {
        let headers = args
            .files
            .iter()
            .map(|path| {
                SafetensorsHeader::read(path).with_context(|| format!("cannot load {}", path.display()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        headers.into_iter().map(|header| header.data).collect::<Vec<_>>()
    } else {
        args.files
            .iter()
            .map(|path| FileRange::whole(path).with_context(|| format!("cannot load {}", path.display())))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let total: u64 = ranges.iter().map(|range| range.len).sum();
    if total == 0 {
        bail!("nothing to load: the files are empty");
    }
    if args.stage == LoadWork::Copy {
        check_fits(device, total, args.max_device_memory.as_deref())?;
    }
    let queue = Queue::new(device)?;
    let stream = FileStream::new(device, &queue, options).context("--threads, --chunk or --depth")?;
    // SAFETY: the files are the user's; like any program that maps files (safetensors' own
    // loader included), the load assumes they are not truncated while it reads them, which
    // the help of `--method windows` says.
    let mut stream = unsafe { stream.allow_windows() };
    let (link, link_measured) = match args.link_rate {
        Some(rate) => (Some(rate), false),
        None => (link_h2d_gb_per_s(device, &queue).context("measuring the link")?, true),
    };
    let bar = ui.bytes(total, format!("loading {} file(s)", args.files.len()));
    #[cfg(feature = "testing")]
    let truncate = truncate_hook::parse(args)?;
    let progress = |done: u64| {
        bar.set_position(done);
        #[cfg(feature = "testing")]
        truncate.fire(done);
    };
    let loading = || format!("loading {} file(s) by method {}", args.files.len(), args.method.0);
    let (report, tensors, checksums, verified) = match args.stage {
        LoadWork::Copy if as_tensors => {
            let loaded = stream.load_safetensors(&args.files, &progress).with_context(loading)?;
            let mut verified = false;
            if args.verify {
                let parts = place(&loaded.tensors, &ranges, &args.files)?;
                compare_with_files(device, &queue, loaded.buffer, &parts, Extent::Whole)?;
                verified = true;
            }
            (loaded.report, Some(loaded.tensors), None, verified)
        }
        LoadWork::Copy => {
            let (buffer, report) = stream.load(&ranges, &progress).with_context(loading)?;
            let mut verified = false;
            if args.verify {
                let mut offset = 0;
                let parts: Vec<(FileRange, usize)> = ranges
                    .iter()
                    .map(|range| {
                        let part = (range.clone(), offset);
                        offset += range.len as usize;
                        part
                    })
                    .collect();
                compare_with_files(device, &queue, buffer, &parts, Extent::Whole)?;
                verified = true;
            }
            (report, None, None, verified)
        }
        LoadWork::Checksum => {
            let (report, checksums) =
                checksum_stage(device, &mut stream, &ranges, &progress).with_context(loading)?;
            (report, None, Some(checksums), true)
        }
    };
    bar.finish_and_clear();
    let gb_per_s = report.gb_per_s();
    let loaded = Loaded {
        device: device.name(),
        stage: args.stage,
        files: ranges,
        gb_per_s,
        link_gb_per_s: link,
        link_measured,
        of_link: link.map(|link| gb_per_s / link),
        storage_gb_per_s: args.storage_rate,
        of_storage: args.storage_rate.map(|storage| gb_per_s / storage),
        verified,
        report,
        tensors,
        checksums,
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        json::write(&mut out, SCHEMA, &loaded)?;
    } else {
        out.write_all(text(&loaded, args.tensors).as_bytes())?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses a load larger than `--max-device-memory`, or than the GPU's free memory.
fn check_fits(device: &Device, total: u64, limit: Option<&str>) -> anyhow::Result<()> {
    let (limit, what) = match limit {
        Some(text) => (sizes::parse(text).context("--max-device-memory")? as u64, "--max-device-memory"),
        None => match device.free_device_memory()? {
            Some(free) => (free, "the GPU's free memory"),
            None => return Ok(()),
        },
    };
    if total > limit {
        bail!(
            "{total} bytes do not fit in device memory: {limit} bytes allowed ({what}) on {}; load fewer files, \
             free device memory, or stream them through a stage (--stage checksum)",
            device.name()
        );
    }
    Ok(())
}

/// Each file's data section and where `load_safetensors` put it (its first tensor's offset
/// less that tensor's offset in the file).
fn place(
    tensors: &BTreeMap<String, TensorEntry>,
    ranges: &[FileRange],
    files: &[PathBuf],
) -> anyhow::Result<Vec<(FileRange, usize)>> {
    ranges
        .iter()
        .zip(files)
        .filter(|(range, _)| range.len > 0)
        .map(|(range, path)| {
            let header = SafetensorsHeader::read(path)?;
            let (name, entry) = header
                .tensors
                .iter()
                .find(|(_, entry)| entry.bytes > 0)
                .context("a file with bytes has a tensor")?;
            Ok((range.clone(), tensors[name].offset - entry.offset))
        })
        .collect()
}

/// Streams the files through the checksum kernel, then checks each file's sums against the
/// CPU's.
fn checksum_stage(
    device: &Device,
    stream: &mut FileStream,
    ranges: &[FileRange],
    progress: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<(LoadReport, Vec<FileChecksum>)> {
    let queue = stream.queue().clone();
    let mut sums = queue.lend(DeviceBuf::<u64>::new(device, 2 * ranges.len())?);
    let report = stream.for_each_chunk(ranges, progress, |chunk| match chunk.data {
        FilePieceData::Staging { lease, offset } => {
            checksum(&queue, lease, offset, chunk.len, chunk.source_offset, &mut sums, chunk.source)
        }
        FilePieceData::Window { lease, offset } => {
            checksum(&queue, lease, offset, chunk.len, chunk.source_offset, &mut sums, chunk.source)
        }
    })?;
    let sums = sums.reclaim()?.to_vec()?;
    let mut checksums = Vec::new();
    for (index, range) in ranges.iter().enumerate() {
        let stage = Checksum { sum: sums[2 * index], weighted: sums[2 * index + 1] };
        let cpu = cpu_checksum(range)?;
        if stage != cpu {
            return Err(hetmem_bench::BenchError::ResultMismatch {
                what: "the checksum stage",
                detail: format!("{}: {stage:?} from the stage, {cpu:?} from the CPU", range.path.display()),
            }
            .into());
        }
        checksums.push(FileChecksum { path: range.path.clone(), stage, cpu });
    }
    Ok((report, checksums))
}

/// The CPU's checksum of a range, read through the page cache.
fn cpu_checksum(range: &FileRange) -> anyhow::Result<Checksum> {
    let file =
        std::fs::File::open(&range.path).with_context(|| format!("opening {}", range.path.display()))?;
    let mut buffer = vec![0u8; 8 << 20];
    let mut total = Checksum::default();
    let mut at = 0u64;
    while at < range.len {
        let len = buffer.len().min((range.len - at) as usize);
        file.read_exact_at(&mut buffer[..len], range.offset + at)
            .with_context(|| format!("reading {}", range.path.display()))?;
        total = total.combine(checksum_cpu(&buffer[..len], at));
        at += len as u64;
    }
    Ok(total)
}

fn text(loaded: &Loaded, list_tensors: bool) -> String {
    let report = &loaded.report;
    let mut out = String::new();
    let what = match &loaded.tensors {
        Some(tensors) => format!("{} tensors, ", tensors.len()),
        None => String::new(),
    };
    let into = match loaded.stage {
        LoadWork::Copy => format!("into {}", loaded.device),
        LoadWork::Checksum => format!("through the checksum stage on {}", loaded.device),
    };
    out += &format!(
        "loaded {} file(s), {what}{:.3} GB {into} in {:.3} s: {:.2} GB/s\n",
        loaded.files.len(),
        report.bytes as f64 / 1e9,
        report.seconds,
        loaded.gb_per_s
    );
    out += &format!("  method   {}, read {}", report.method, report.read_mode);
    if let Some(reason) = &report.auto_reason {
        out += &format!(" (auto: {reason})");
    }
    out += "\n";
    if let Some(refused) = &report.direct_refused {
        out += &format!("  note     {refused}\n");
    }
    if report.setup_seconds > 0.0 {
        out +=
            &format!("  setup    {:.3} s pinning the staging ring (not in the rate)\n", report.setup_seconds);
    }
    match (loaded.link_gb_per_s, loaded.of_link) {
        (Some(link), Some(ratio)) => {
            let how = if loaded.link_measured { "measured" } else { "given" };
            out += &format!("  link     {link:.1} GB/s ({how}): {:.0}% of it\n", ratio * 100.0);
        }
        _ => out += "  link     none (CPU backend)\n",
    }
    match (loaded.storage_gb_per_s, loaded.of_storage) {
        (Some(storage), Some(ratio)) => {
            out += &format!("  storage  {storage:.2} GB/s (given): {ratio:.2}x\n")
        }
        _ => out += "  storage  not given (--storage-rate; `hetmem bench file` measures it)\n",
    }
    if loaded.verified && loaded.stage == LoadWork::Copy {
        out += "  verified every byte against the files\n";
    }
    for checksum in loaded.checksums.iter().flatten() {
        out += &format!(
            "  checksum {}: sum {:#018x}, weighted {:#018x} (the CPU agrees)\n",
            checksum.path.display(),
            checksum.stage.sum,
            checksum.stage.weighted
        );
    }
    if list_tensors {
        for (name, entry) in loaded.tensors.iter().flatten() {
            out += &format!(
                "  {name}  {} {:?} at byte {} ({} bytes)\n",
                entry.dtype, entry.shape, entry.offset, entry.bytes
            );
        }
    }
    out
}

/// `--truncate-after`, with the `testing` feature: the CLI's tests shrink a file under a load.
#[cfg(feature = "testing")]
mod truncate_hook {
    use std::path::PathBuf;
    use std::sync::Once;

    use anyhow::Context as _;

    /// Where and how far to truncate, once.
    pub(super) struct Truncate {
        rule: Option<(u64, u64, PathBuf)>,
        once: Once,
    }

    pub(super) fn parse(args: &super::Args) -> anyhow::Result<Truncate> {
        let rule = args
            .truncate_after
            .as_deref()
            .map(|rule| {
                let (after, len) = rule
                    .split_once(':')
                    .and_then(|(after, len)| Some((after.parse().ok()?, len.parse().ok()?)))
                    .with_context(|| format!("--truncate-after {rule}: give BYTES:LEN"))?;
                anyhow::Ok((after, len, args.files[0].clone()))
            })
            .transpose()?;
        Ok(Truncate { rule, once: Once::new() })
    }

    impl Truncate {
        /// Truncates the file the first time the load has done the bytes asked for.
        pub(super) fn fire(&self, done: u64) {
            let Some((after, len, path)) = &self.rule else { return };
            if done >= *after {
                self.once.call_once(|| {
                    let truncated =
                        std::fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(*len));
                    if let Err(error) = truncated {
                        eprintln!("--truncate-after: cannot truncate {}: {error}", path.display());
                    }
                });
            }
        }
    }
}
