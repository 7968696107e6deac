//! `hetmem bench file`: a file into GPU memory by every method, cold and warm, as tables.

use hetmem_bench::file::{CacheDrop, FileReport};
use hetmem_bench::sizes;

use super::snake_name;
use crate::table::Table;

/// The loads table's name.
pub const LOADS_TABLE: &str = "file_loads";
/// The storage table's name.
pub const STORAGE_TABLE: &str = "file_storage";
/// Both, in print order.
pub const TABLES: [&str; 2] = [LOADS_TABLE, STORAGE_TABLE];

pub fn tables(report: &FileReport) -> Vec<Table> {
    let mut loads = Table::new(
        LOADS_TABLE,
        format!("a safetensors file into {} (best of {}), GB/s", report.device, report.options.repeats),
        &[
            "method",
            "ran",
            "size",
            "threads",
            "chunk",
            "cache",
            "GB/s",
            "seconds",
            "x storage",
            "x link",
            "read",
        ],
    );
    let ratio = |value: Option<f64>| value.map_or("-".to_string(), |value| format!("{value:.2}"));
    for row in &report.rows {
        loads.row(vec![
            row.method.to_string(),
            row.ran.to_string(),
            sizes::format(row.size).replace(' ', ""),
            row.threads.to_string(),
            sizes::format(row.chunk_bytes).replace(' ', ""),
            snake_name(&row.cache).unwrap_or_default(),
            format!("{:.2}", row.gb_per_s),
            format!("{:.3}", row.seconds),
            ratio(row.of_storage),
            ratio(row.of_link),
            row.read_mode.to_string(),
        ]);
    }
    loads.note(match report.cache_drop {
        Some(CacheDrop::DropCaches) => "cold: /proc/sys/vm/drop_caches before each load",
        Some(CacheDrop::FadviseDontneed) => {
            "cold: posix_fadvise(DONTNEED) on the file before each load (--drop-caches as root empties the whole cache)"
        }
        None => "cold: no cold loads",
    });
    loads.note(match report.link_gb_per_s {
        Some(link) => format!("link: {link:.1} GB/s (pinned host to device copies, best of 5 x 256 MiB)"),
        None => "link: none (CPU backend)".to_string(),
    });
    if let Some(depth) = report.rows.first().map(|row| row.ring_depth) {
        loads.note(format!(
            "staging buffers (or windows) in flight: {depth} (twice the threads unless --depth)"
        ));
    }
    for file in report.files.iter().filter(|file| file.kept) {
        loads.note(format!("kept {}", file.path.display()));
    }
    let mut storage = Table::new(
        STORAGE_TABLE,
        "the storage's own read rate into pageable memory (cold), GB/s",
        &["read", "streams", "GB/s", "seconds", "GiB"],
    );
    for row in &report.storage {
        storage.row(vec![
            snake_name(&row.read).unwrap_or_default(),
            row.streams.to_string(),
            format!("{:.2}", row.gb_per_s),
            format!("{:.3}", row.seconds),
            format!("{:.2}", row.bytes as f64 / (1u64 << 30) as f64),
        ]);
    }
    if report.storage.iter().all(|row| snake_name(&row.read).unwrap_or_default() != "direct") {
        storage.note("no O_DIRECT rows: the filesystem refuses O_DIRECT");
    }
    vec![loads, storage]
}
