//! `bench file`: a file into GPU memory, GB/s against the file's size, from a cold page cache
//! and a warm one, by every method of [`hetmem::data::FileStream`], beside the storage's own
//! read rate and the link's copy rate measured in the same run.
//!
//! The file is a safetensors file with a real model's tensor shapes ([`generate`]), made in the
//! folder given and removed after unless kept; each load lands every tensor at its offset in
//! one device allocation, and is checked by reading samples back from the device.

pub mod generate;
pub mod storage;
pub mod verify;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hetmem::data::{FileStream, LoadMethod, ReadMode, SafetensorsHeader, StreamOptions};
use hetmem::error::Error;
use hetmem::memory::{DeviceBuf, HostBuf, PinOptions};
use hetmem::{Device, Queue};
pub use storage::{CacheDrop, StorageRead, StorageRow};
pub use verify::Extent;

use crate::error::Result;

/// What `bench file` measures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileOptions {
    /// Target file sizes in bytes (each file is the largest model that fits).
    pub sizes: Vec<usize>,
    /// Where the files are made (and kept, with `keep`).
    #[serde(skip)]
    pub dir: PathBuf,
    /// The methods measured.
    pub methods: Vec<LoadMethod>,
    /// Timed loads per cell; the best is reported (the first cold load of each cell drops the
    /// cache again before every repeat).
    pub repeats: usize,
    /// Keep the files this run writes (`hetmem-bench-<size>.safetensors`) for the peers' script
    /// or a later run; files kept by an earlier run are reused and always left in place.
    pub keep: bool,
    /// Try `/proc/sys/vm/drop_caches` (root) before a cold run; else, and where it fails,
    /// `posix_fadvise(DONTNEED)` on the file.
    pub drop_caches: bool,
    /// The stream's tunables to measure, each with every method (whose own method field is
    /// replaced by the measured one): several to find the best threads, chunk and depth.
    pub tunings: Vec<StreamOptions>,
    /// Threads of the storage ceiling's many-stream reads.
    pub storage_streams: usize,
    /// Bytes of the file the storage ceiling reads (each of its four reads).
    pub ceiling_bytes: u64,
}

impl FileOptions {
    /// 1 GiB to 32 GiB, doubling; every method; one repeat.
    pub fn full(dir: &Path) -> FileOptions {
        FileOptions {
            sizes: (0..6).map(|step| (1usize << 30) << step).collect(),
            dir: dir.to_path_buf(),
            methods: LoadMethod::ALL.to_vec(),
            repeats: 1,
            keep: false,
            drop_caches: true,
            tunings: vec![StreamOptions::default()],
            storage_streams: 8,
            ceiling_bytes: 8 << 30,
        }
    }

    /// 64 MiB and 256 MiB: a check that everything runs (seconds, on any machine).
    pub fn quick(dir: &Path) -> FileOptions {
        FileOptions { sizes: vec![64 << 20, 256 << 20], ceiling_bytes: 256 << 20, ..FileOptions::full(dir) }
    }
}

/// The page cache's state during a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheState {
    /// Emptied of the file first.
    Cold,
    /// Holding the whole file (read once first).
    Warm,
}

/// One method at one file size and cache state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileRow {
    /// The method asked for.
    pub method: LoadMethod,
    /// The method that ran (what `auto` chose).
    pub ran: LoadMethod,
    /// Reader threads.
    pub threads: usize,
    /// Bytes per read and copy.
    pub chunk_bytes: usize,
    /// Staging buffers (or windows) in flight.
    pub ring_depth: usize,
    /// How the bytes came off storage.
    pub read_mode: ReadMode,
    /// The size asked for (the file is the largest model that fits in it).
    pub size: usize,
    /// The file's size in bytes.
    pub file_bytes: u64,
    /// The tensor bytes loaded.
    pub bytes: u64,
    /// The page cache's state.
    pub cache: CacheState,
    /// The best load's seconds.
    pub seconds: f64,
    /// Every load's seconds.
    pub seconds_all: Vec<f64>,
    /// The best load's rate, GB/s (10^9 bytes).
    pub gb_per_s: f64,
    /// Against the best storage read of the run (cold rows).
    pub of_storage: Option<f64>,
    /// Against the link's copy rate.
    pub of_link: Option<f64>,
}

/// A test file of the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestFile {
    /// Where it is (or was).
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Written by this run (else kept from an earlier one).
    pub written: bool,
    /// Left in place after the run.
    pub kept: bool,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileReport {
    /// The device loaded to.
    pub device: String,
    /// The options.
    pub options: FileOptions,
    /// The link's host-to-device copy rate from pinned memory, GB/s; `None` without a GPU.
    pub link_gb_per_s: Option<f64>,
    /// The storage's own read rates.
    pub storage: Vec<StorageRow>,
    /// The best of them, GB/s.
    pub storage_best_gb_per_s: Option<f64>,
    /// How the cache was emptied for cold rows.
    pub cache_drop: Option<CacheDrop>,
    /// The test files.
    pub files: Vec<TestFile>,
    /// The loads.
    pub rows: Vec<FileRow>,
}

/// Runs `bench file`: for each size, makes (or finds) the test file, measures the storage
/// ceiling on the first file of at least `ceiling_bytes` (else the largest), then each method
/// cold and warm. `status` hears what is being done.
///
/// # Errors
/// No sizes or methods; a file that cannot be written or read; a load failing or landing wrong
/// bytes ([`BenchError::ResultMismatch`](crate::BenchError::ResultMismatch)).
pub fn measure(device: &Device, options: &FileOptions, status: &dyn Fn(&str)) -> Result<FileReport> {
    if options.sizes.is_empty()
        || options.methods.is_empty()
        || options.tunings.is_empty()
        || options.repeats == 0
    {
        return Err(Error::invalid("bench file", "give at least one size, method, tuning and repeat").into());
    }
    std::fs::create_dir_all(&options.dir)
        .map_err(|source| Error::Io { context: format!("creating {}", options.dir.display()), source })?;
    let queue = Queue::new(device)?;
    status("measuring the link (pinned host to device copies)");
    let link = link_h2d_gb_per_s(device, &queue)?;
    let ceiling_size = options
        .sizes
        .iter()
        .copied()
        .find(|&size| size as u64 >= options.ceiling_bytes)
        .or(options.sizes.iter().copied().max())
        .expect("sizes is not empty");
    let mut streams = Vec::new();
    for tuning in &options.tunings {
        for &method in &options.methods {
            let stream = FileStream::new(device, &queue, StreamOptions { method, ..*tuning })?;
            // SAFETY: the benchmark's own files, which nothing modifies while they are read.
            streams.push((method, unsafe { stream.allow_windows() }));
        }
    }
    let mut report = FileReport {
        device: device.name(),
        options: options.clone(),
        link_gb_per_s: link,
        storage: Vec::new(),
        storage_best_gb_per_s: None,
        cache_drop: None,
        files: Vec::new(),
        rows: Vec::new(),
    };
    let loads = Loads { device, queue: &queue, options, status, link };
    for (index, &size) in options.sizes.iter().enumerate() {
        status(&format!("writing {}", generate::file_name(size)));
        let (path, written) = generate::ensure(&options.dir, size, index as u64 ^ 0x6865_746d_656d)?;
        let header = SafetensorsHeader::read(&path)?;
        let file_bytes = header.data.offset + header.data.len;
        report.files.push(TestFile {
            path: path.clone(),
            bytes: file_bytes,
            written,
            kept: options.keep || !written,
        });
        let file = SizedFile { size, path: &path, header: &header, file_bytes };
        let outcome = loads.file(&mut report, &mut streams, &file, size == ceiling_size);
        // A file kept by an earlier run stays: only what this run wrote is removed.
        if written && !options.keep {
            let _ = std::fs::remove_file(&path);
        }
        outcome?;
    }
    if let Some(best) = report.storage_best_gb_per_s {
        for row in report.rows.iter_mut().filter(|row| row.cache == CacheState::Cold) {
            row.of_storage = Some(row.gb_per_s / best);
        }
    }
    Ok(report)
}

/// What every load of a run shares.
struct Loads<'a> {
    device: &'a Device,
    queue: &'a Queue,
    options: &'a FileOptions,
    status: &'a dyn Fn(&str),
    link: Option<f64>,
}

/// One test file, at the size it was made for.
struct SizedFile<'a> {
    size: usize,
    path: &'a Path,
    header: &'a SafetensorsHeader,
    file_bytes: u64,
}

impl Loads<'_> {
    /// The storage's ceiling (with `ceiling`), then each method of `streams` cold and warm on
    /// `file`, a row each.
    fn file(
        &self,
        report: &mut FileReport,
        streams: &mut [(LoadMethod, FileStream)],
        file: &SizedFile<'_>,
        ceiling: bool,
    ) -> Result<()> {
        let (options, status, path) = (self.options, self.status, file.path);
        if ceiling {
            status("measuring the storage (O_DIRECT and buffered, 1 and several streams)");
            report.storage = storage::ceiling(
                path,
                options.ceiling_bytes.min(file.file_bytes),
                options.storage_streams,
                8 << 20,
                &|| storage::drop_cache(path, options.drop_caches),
            )?;
            report.storage_best_gb_per_s = report.storage.iter().map(|row| row.gb_per_s).reduce(f64::max);
        }
        for cache in [CacheState::Cold, CacheState::Warm] {
            for (method, stream) in streams.iter_mut() {
                let row = self.cell(report, *method, stream, file, cache)?;
                report.rows.push(row);
            }
        }
        Ok(())
    }

    /// `options.repeats` loads of `file` by `stream` from a `cache` page cache, each read back
    /// and compared; the best is the row's.
    fn cell(
        &self,
        report: &mut FileReport,
        method: LoadMethod,
        stream: &mut FileStream,
        file: &SizedFile<'_>,
        cache: CacheState,
    ) -> Result<FileRow> {
        let (options, path) = (self.options, file.path);
        let tuning = stream.options();
        (self.status)(&format!(
            "{} {method}, {} threads, {} chunks, {:?} cache",
            generate::file_name(file.size),
            tuning.threads,
            crate::sizes::format(tuning.chunk_bytes),
            cache
        ));
        let mut seconds_all = Vec::new();
        let mut last = None;
        for _ in 0..options.repeats {
            match cache {
                CacheState::Cold => report.cache_drop = Some(storage::drop_cache(path, options.drop_caches)?),
                CacheState::Warm => warm(path)?,
            }
            let loaded = stream.load_safetensors(&[path], &|_| {})?;
            verify::compare_with_files(
                self.device,
                self.queue,
                loaded.buffer,
                &[(file.header.data.clone(), 0)],
                Extent::Samples,
            )?;
            seconds_all.push(loaded.report.seconds);
            last = Some(loaded.report);
        }
        let last = last.expect("repeats >= 1");
        let seconds = seconds_all.iter().copied().fold(f64::INFINITY, f64::min);
        let gb_per_s = last.bytes as f64 / seconds / 1e9;
        Ok(FileRow {
            method,
            ran: last.method,
            threads: tuning.threads,
            chunk_bytes: tuning.chunk_bytes,
            ring_depth: tuning.ring_depth,
            read_mode: last.read_mode,
            size: file.size,
            file_bytes: file.file_bytes,
            bytes: last.bytes,
            cache,
            seconds,
            seconds_all,
            gb_per_s,
            of_storage: None,
            of_link: self.link.map(|link| gb_per_s / link),
        })
    }
}

/// The link's host-to-device rate: the best of 5 copies of 256 MiB from pinned memory into
/// device memory, GB/s; `None` on the CPU backend.
///
/// # Errors
/// Pinning, allocating or copying failed.
pub fn link_h2d_gb_per_s(device: &Device, queue: &Queue) -> Result<Option<f64>> {
    if device.as_cuda().is_none() {
        return Ok(None);
    }
    let bytes = 256 << 20;
    let mut host = HostBuf::<u8>::pinned(device, bytes, PinOptions::default())?;
    host.as_mut_slice().iter_mut().enumerate().for_each(|(index, byte)| *byte = (index % 251) as u8 + 1);
    let host = queue.share(host);
    let mut dst = queue.lend(DeviceBuf::<u8>::new(device, bytes)?);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        queue.copy(&host, &mut dst)?;
        queue.synchronize()?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    dst.reclaim()?;
    host.reclaim()?;
    Ok(Some(bytes as f64 / best / 1e9))
}

/// Reads the whole file through the page cache (8 threads), so a warm load finds it there.
fn warm(path: &Path) -> hetmem::Result<()> {
    let file = std::fs::File::open(path)
        .map_err(|source| Error::Io { context: format!("opening {}", path.display()), source })?;
    let len = file
        .metadata()
        .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })?
        .len();
    let part = len.div_ceil(8);
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..8u64)
            .map(|index| {
                let file = &file;
                scope.spawn(move || -> std::io::Result<()> {
                    let mut buffer = vec![0u8; 8 << 20];
                    let (mut at, end) = ((index * part).min(len), ((index + 1) * part).min(len));
                    while at < end {
                        let want = buffer.len().min((end - at) as usize);
                        match file.read_at(&mut buffer[..want], at)? {
                            0 => break,
                            n => at += n as u64,
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        readers.into_iter().try_for_each(|reader| reader.join().expect("a reader panicked"))
    })
    .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::{BackendChoice, BackendKind};

    #[test]
    fn every_method_is_measured_cold_and_warm_and_the_files_go() {
        let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let options = FileOptions {
            sizes: vec![1 << 20, 3 << 20],
            ceiling_bytes: 2 << 20,
            storage_streams: 2,
            tunings: [(2, 256 << 10), (3, 64 << 10)]
                .map(|(threads, chunk_bytes)| StreamOptions {
                    threads,
                    chunk_bytes,
                    ring_depth: 3,
                    ..StreamOptions::default()
                })
                .to_vec(),
            drop_caches: false,
            ..FileOptions::quick(dir.path())
        };
        let report = measure(&device, &options, &|_| {}).unwrap();
        assert_eq!(
            report.rows.len(),
            2 * 2 * LoadMethod::ALL.len() * 2,
            "sizes x tunings x methods x caches"
        );
        assert!(report.rows.iter().any(|row| row.threads == 3 && row.chunk_bytes == 64 << 10));
        assert!(
            report.rows.iter().all(|row| row.gb_per_s > 0.0 && row.ran != LoadMethod::Auto),
            "{:?}",
            report.rows
        );
        assert!(
            report
                .rows
                .iter()
                .filter(|row| row.cache == CacheState::Cold)
                .all(|row| row.of_storage.is_some())
        );
        assert!(report.storage.iter().any(|row| row.read == StorageRead::Buffered), "{:?}", report.storage);
        assert_eq!(report.cache_drop, Some(CacheDrop::FadviseDontneed));
        assert!(report.files.iter().all(|file| !file.path.exists()), "removed without keep");
        let kept = generate::ensure(dir.path(), 1 << 20, 7).unwrap().0;
        let again = measure(&device, &FileOptions { sizes: vec![1 << 20], ..options }, &|_| {}).unwrap();
        assert!(
            kept.exists() && again.files[0].kept && !again.files[0].written,
            "an earlier run's file stays"
        );
        assert_eq!(report.link_gb_per_s, None, "no link on the CPU backend");
    }
}
