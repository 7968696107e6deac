//! `hetmem bench dataset`: an 8K data set larger than device memory, filtered in place, frame by frame, against
//! copying each frame to the device and back (`hetmem_bench::dataset`).

use hetmem_bench::dataset::sparse::SparseMethod;
use hetmem_bench::dataset::{self, Backing, DatasetReport};

use crate::table::Table;

/// The table's name.
pub const TABLE: &str = "dataset";

/// The frame sizes `--resolution` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Resolution {
    /// 7680 x 4320
    #[value(name = "8k")]
    Uhd8k,
    /// 3840 x 2160
    #[value(name = "4k")]
    Uhd4k,
    /// 1920 x 1080
    #[value(name = "1080p")]
    Hd1080,
}

impl Resolution {
    pub fn size(self) -> (usize, usize) {
        match self {
            Resolution::Uhd8k => dataset::DEFAULT_SIZE,
            Resolution::Uhd4k => (3840, 2160),
            Resolution::Hd1080 => (1920, 1080),
        }
    }
}

/// The default frame count.
pub const DEFAULT_FRAMES: usize = dataset::DEFAULT_FRAMES;

/// Bytes in GiB, or MiB below one GiB (a frame or two of a small run).
fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// One row per method.
pub fn table(report: &DatasetReport) -> Table {
    let against = report.device_total_bytes.map_or(String::new(), |total| {
        format!(", {:.1}x the device's {}", report.dataset_bytes as f64 / total as f64, gib(total))
    });
    let mut table = Table::new(
        TABLE,
        format!(
            "{} frames of {}x{} RGB ({}{against}) in {}, 3x3 blur of every frame on {}",
            report.frames,
            report.width,
            report.height,
            gib(report.dataset_bytes),
            match report.backing {
                Backing::Host => "pinned host memory",
                Backing::File => "a registered file",
            },
            report.device
        ),
        &[
            "method",
            "frames/s",
            "GB/s",
            "seconds",
            "device memory allocated",
            "device memory used",
            "checked frames",
        ],
    );
    for run in &report.runs {
        table.row(vec![
            run.method.name().to_string(),
            format!("{:.1}", run.frames_s),
            format!("{:.2}", run.gb_s),
            format!("{:.2}", run.seconds),
            gib(run.device_bytes),
            run.device_used_bytes.map_or("-".into(), gib),
            format!("{:?}", run.verified_frames),
        ]);
    }
    table.note(format!(
        "mapped: the kernel reads frame k at the data set's device pointer + k x {} bytes and writes a mapped \
         host frame; copy-each: each frame copied to a device frame, filtered into another, copied back. \
         Set up (fill with random bytes{}): {:.1} s. Checked frames match the CPU's blur byte for byte.",
        report.frame_bytes,
        match report.backing {
            Backing::Host => ", pin",
            Backing::File => ", write the file, map and register it",
        },
        report.setup_seconds
    ));
    table.note(format!(
        "device budget {} ({} the data set)",
        gib(report.device_budget_bytes),
        if report.dataset_bytes > report.device_budget_bytes { "smaller than" } else { "not smaller than" }
    ));
    table
}

/// The sparse pass's table's name.
pub const SPARSE_TABLE: &str = "dataset_sparse";

/// The sparse pass: mapped against copy-all, with the speed-up.
pub fn sparse_table(report: &DatasetReport) -> Table {
    let mut table = Table::new(
        SPARSE_TABLE,
        format!(
            "a kernel touching {:.1}% of the data set's {} (one 64 KiB chunk in every 20), on {}",
            report.sparse.first().map_or(0.0, |run| run.share_touched * 100.0),
            gib(report.dataset_bytes),
            report.device
        ),
        &["method", "seconds", "vs copy-all", "bytes copied", "device memory", "checked"],
    );
    let copy_all =
        report.sparse.iter().find(|run| run.method == SparseMethod::CopyAll).map(|run| run.seconds);
    for run in &report.sparse {
        table.row(vec![
            run.method.name().to_string(),
            format!("{:.4}", run.seconds),
            copy_all.map_or("-".into(), |copy_all| format!("{:.2}x", copy_all / run.seconds)),
            gib(run.copied_bytes),
            gib(run.device_bytes),
            if run.verified { "XOR = the CPU's" } else { "NO" }.to_string(),
        ]);
    }
    table.note(
        "sparse mapped: the kernel reads the chunks where the data set lies; sparse copy-all: the whole set \
         copied into device memory a piece within the budget at a time, the kernel reading each piece's chunks",
    );
    table
}
