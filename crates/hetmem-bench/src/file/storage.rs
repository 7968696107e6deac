//! The storage's own read rate, the ceiling `bench file` divides by: one stream and several,
//! `O_DIRECT` and through the page cache, into pageable memory (what `dd` and `fio` measure);
//! and emptying the page cache of a file for a cold run.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use hetmem::error::{Error, Result};
use hetmem::memory::PageBox;

/// How the page cache was emptied before a cold run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheDrop {
    /// `echo 3 > /proc/sys/vm/drop_caches` (root): the whole page cache.
    DropCaches,
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on the file, after syncing it: its clean pages.
    FadviseDontneed,
}

/// Empties the page cache of `path`: the whole cache with `drop_caches` where allowed (root),
/// else the file's own pages.
///
/// # Errors
/// The file cannot be opened or synced.
pub fn drop_cache(path: &Path, try_drop_caches: bool) -> Result<CacheDrop> {
    let file = File::open(path)
        .map_err(|source| Error::Io { context: format!("opening {}", path.display()), source })?;
    file.sync_all().map_err(|source| Error::Io { context: format!("syncing {}", path.display()), source })?;
    if try_drop_caches && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok() {
        return Ok(CacheDrop::DropCaches);
    }
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).map_err(|error| Error::Io {
        context: format!("dropping {} from the page cache", path.display()),
        source: error.into(),
    })?;
    Ok(CacheDrop::FadviseDontneed)
}

/// One way of reading the file into pageable memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageRead {
    /// `O_DIRECT`, past the page cache (`dd iflag=direct`).
    Direct,
    /// Through the page cache, from a dropped cache.
    Buffered,
}

/// The storage read at one setting.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageRow {
    /// How.
    pub read: StorageRead,
    /// Threads, each reading its own contiguous part.
    pub streams: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
    /// GB/s (10^9 bytes).
    pub gb_per_s: f64,
}

/// The storage's rate on the first `bytes` of `path` (whole 4 KiB blocks), read in `block`-byte
/// reads by 1 and by `streams` threads, `O_DIRECT` (where the filesystem allows it) and
/// buffered, the cache emptied by `drop` before each.
///
/// # Errors
/// The file cannot be read; `drop` failing.
pub fn ceiling(
    path: &Path,
    bytes: u64,
    streams: usize,
    block: usize,
    drop: &dyn Fn() -> Result<CacheDrop>,
) -> Result<Vec<StorageRow>> {
    let bytes = bytes / 4096 * 4096;
    let mut rows = Vec::new();
    for read in [StorageRead::Direct, StorageRead::Buffered] {
        for threads in [1, streams.max(1)] {
            if threads == streams && streams == 1 && rows.iter().any(|row: &StorageRow| row.read == read) {
                continue;
            }
            drop()?;
            let file = match open(path, read) {
                Ok(file) => file,
                // A filesystem without O_DIRECT: the rows say so by their absence.
                Err(_) if read == StorageRead::Direct => break,
                Err(source) => {
                    return Err(Error::Io { context: format!("opening {}", path.display()), source });
                }
            };
            let started = Instant::now();
            read_in_parts(&file, bytes, threads, block)
                .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })?;
            let seconds = started.elapsed().as_secs_f64();
            rows.push(StorageRow {
                read,
                streams: threads,
                bytes,
                seconds,
                gb_per_s: bytes as f64 / seconds / 1e9,
            });
        }
    }
    Ok(rows)
}

fn open(path: &Path, read: StorageRead) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if read == StorageRead::Direct {
        options.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
    }
    options.open(path)
}

/// `threads` threads, each reading its contiguous part of the first `bytes` into its own
/// page-aligned block (aligned as `O_DIRECT` needs).
fn read_in_parts(file: &File, bytes: u64, threads: usize, block: usize) -> std::io::Result<()> {
    let part = (bytes / threads as u64).div_ceil(4096) * 4096;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|index| {
                scope.spawn(move || -> std::io::Result<()> {
                    let mut buffer = PageBox::<u8>::zeroed(block).map_err(std::io::Error::other)?;
                    let (start, end) = ((index * part).min(bytes), ((index + 1) * part).min(bytes));
                    let mut at = start;
                    while at < end {
                        let len = block.min((end - at) as usize).next_multiple_of(4096);
                        match file.read_at(&mut buffer[..len], at)? {
                            0 => break,
                            n => at += n as u64,
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| worker.join().expect("a reader panicked"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_reads_every_way_and_the_cache_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("storage.bin");
        std::fs::write(&path, (0..4 << 20).map(|_| fastrand::u8(1..)).collect::<Vec<u8>>()).unwrap();
        let rows = ceiling(&path, 4 << 20, 3, 1 << 20, &|| drop_cache(&path, false)).unwrap();
        assert!(rows.iter().any(|row| row.read == StorageRead::Buffered && row.streams == 3), "{rows:?}");
        assert!(rows.iter().all(|row| row.bytes == 4 << 20 && row.gb_per_s > 0.0), "{rows:?}");
        assert_eq!(drop_cache(&path, false).unwrap(), CacheDrop::FadviseDontneed);
    }
}
