//! `hetmem bench`'s command line: the subcommands and their options.

use std::path::PathBuf;

use hetmem::backend::DeviceSelection;

use super::{dataset, pipeline};
use crate::choices::{self, LinkPathName, LoadMethodName, StrategyName};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub(super) what: What,
    /// Print JSON instead of a table (its "schema" field names it: "hetmem.bench.link/1", ...).
    #[arg(long, global = true, conflicts_with_all = ["markdown", "csv"])]
    pub(super) json: bool,
    /// Print Markdown instead of a table.
    #[arg(long, global = true, conflicts_with = "csv")]
    pub(super) markdown: bool,
    /// Print CSV instead of a table: one CSV per table, a blank line between them.
    #[arg(long, global = true)]
    pub(super) csv: bool,
    /// Also draw SVG plots into this folder.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub(super) svg: Option<PathBuf>,
    /// Also write <subcommand>.json, <subcommand>.md and <table>.csv for each table into this
    /// folder.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub(super) save: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub(super) enum What {
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
        /// Default: the CPUs, at most 12.
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
        threads: Vec<u32>,
        /// Bytes per read and copy (multiples of 4 KiB), comma-separated to compare several
        /// (e.g. 4MiB,16MiB,64MiB). Every threads and chunk pair is measured. Default: the
        /// loads' own, 4MiB.
        #[arg(long, value_name = "SIZE", value_delimiter = ',')]
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
        /// Device memory the copying methods may hold, e.g. 8GiB: give less than the data set
        /// to measure a set larger than it (default: what the device has free). The sparse
        /// pass's copy-all copies the whole set through it, a piece at a time.
        #[arg(long, value_name = "SIZE")]
        device_budget: Option<String>,
    },
}

/// `--backing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum BackingArg {
    /// One pinned, mapped, portable host allocation
    Host,
    /// A file, mapped read-only and registered
    File,
}

fn parse_devices(text: &str) -> Result<DeviceSelection, hetmem::Error> {
    Ok(text.parse::<DeviceSelection>()?)
}
