//! `hetmem bench link`: bandwidth and latency of every way bytes cross the CPU<->GPU link,
//! each bandwidth cell also as a ratio to the copy engines' own rate, measured in the same run.
//!
//! Method: buffers are allocated once at the largest size and filled with random data (never
//! zeros); each cell runs warm-up repetitions, then timed ones, and reports the median and
//! spread. GPU-side times come from device events around the work; synchronous copies and
//! latencies from the CPU clock. Every cell is checked: kernel reads fold the bytes into an
//! XOR checksum compared with the CPU's, writes and copies are compared word for word, so a
//! figure is never reported for work that did not happen. A mismatch is an error.
//!
//! Without a GPU only the host-side cells run, and the report says plainly that the GPU cells
//! were not measured.

mod cpu_cache;
mod doorbell;
mod gpu;
mod host;
mod pages;
mod profile;
mod words;

pub use doorbell::doorbell_round_trip;
pub use pages::page_sizes;
pub use profile::{PROFILE_PATHS, cached_or_measured, measure_profile, save_profile};
use words::{bench_word, fill_random, first_pattern_mismatch, random_read_checksum, xor_checksum};

use std::str::FromStr;

use super::completion::CompletionReport;
use super::{Summary, sizes};
use hetmem::backend::Device;
use hetmem::error::Error;

use crate::error::Result;

/// The smallest bandwidth size.
pub const MIN_SIZE: usize = 4 << 10;
/// The largest bandwidth size.
pub const MAX_SIZE: usize = 1 << 30;
/// The smallest latency size.
pub const MIN_LATENCY_SIZE: usize = 4;
/// The largest latency size.
pub const MAX_LATENCY_SIZE: usize = 64 << 10;
/// The most warm-up plus timed repetitions of one cell.
pub const MAX_RUNS: usize = 1024;

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Host to device.
    H2d,
    /// Device to host.
    D2h,
    /// Both at once; rates are per direction.
    Both,
    /// Host memory to host memory (no GPU).
    Host,
    /// Within device memory: no link crossed, so no copy-engine ceiling.
    Device,
}

/// A way of moving bytes, one row of the bandwidth table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkPath {
    /// `memcpy` between two host buffers, one thread: the host side of every other path.
    HostMemcpy,
    /// `cuMemcpyHtoD` from a plain (pageable) `Vec`: the driver stages through its own buffer.
    /// Timed to the call's return, as a caller sees it (the last staged chunk may still be on
    /// its way).
    PageableH2d,
    /// `cuMemcpyDtoH` into a plain `Vec`.
    PageableD2h,
    /// `cuMemcpyHtoD` from pinned memory, one call at a time (CPU clock).
    PinnedSyncH2d,
    /// `cuMemcpyDtoH` into pinned memory, one call at a time (CPU clock).
    PinnedSyncD2h,
    /// `cuMemcpyAsync` from pinned memory on a stream (device events): the copy engine's rate,
    /// the ceiling of host-to-device cells.
    PinnedAsyncH2d,
    /// `cuMemcpyAsync` into pinned memory: the ceiling of device-to-host cells.
    PinnedAsyncD2h,
    /// An upload and a download at once, on two streams; the rate is per direction.
    PinnedAsyncBoth,
    /// A kernel reading mapped pinned memory with coalesced 16-byte loads (zero-copy).
    ZeroCopyRead,
    /// A kernel writing mapped pinned memory with coalesced 16-byte stores.
    ZeroCopyWrite,
    /// A kernel reading one mapped buffer and writing another; the rate is per direction.
    ZeroCopyReadWrite,
    /// A kernel reading mapped memory 4 bytes at a time, neighbouring threads 128 bytes apart:
    /// the uncoalesced pitfall.
    ZeroCopyReadStrided,
    /// A kernel reading mapped pinned memory allocated write-combined
    /// (`CU_MEMHOSTALLOC_WRITECOMBINED`) with coalesced 16-byte loads. The seeds claim
    /// write-combining raises the link rate by 40% (and slows the CPU's reads: `hetmem bench
    /// pinning` measures those).
    WriteCombinedRead,
    /// A kernel reading memory the process allocated itself, registered with
    /// `cuMemHostRegister` (mapped).
    RegisteredVecRead,
    /// A kernel loading 16-byte vectors from random places of registered memory on base
    /// (4 KiB) pages: each load a page apart from its neighbours', so the GPU translates an
    /// address per load.
    #[serde(rename = "random_read_4k_pages")]
    RandomReadBasePages,
    /// As [`LinkPath::RandomReadBasePages`], on transparent huge (2 MiB) pages
    /// (`madvise(MADV_HUGEPAGE)`). The seeds claim huge pages speed the GPU's access to host
    /// memory through its TLB.
    #[serde(rename = "random_read_2m_pages")]
    RandomReadHugePages,
    /// A kernel reading a read-only file mapping registered read-only (page cache hot).
    RegisteredFileRead,
    /// A kernel reading managed memory resident on the host: pages migrate on fault.
    ManagedRead,
    /// `cuMemPrefetchAsync` of managed memory to the device, then the kernel's read, timed
    /// together.
    ManagedPrefetchRead,
    /// A kernel reading device memory with coalesced 16-byte loads: the rate placement
    /// predicts reads of a buffer in device memory from ([`LinkReport::profile`]).
    DeviceRead,
}

impl LinkPath {
    /// Every path, in table order.
    pub const ALL: [LinkPath; 20] = [
        LinkPath::HostMemcpy,
        LinkPath::PageableH2d,
        LinkPath::PageableD2h,
        LinkPath::PinnedSyncH2d,
        LinkPath::PinnedSyncD2h,
        LinkPath::PinnedAsyncH2d,
        LinkPath::PinnedAsyncD2h,
        LinkPath::PinnedAsyncBoth,
        LinkPath::ZeroCopyRead,
        LinkPath::ZeroCopyWrite,
        LinkPath::ZeroCopyReadWrite,
        LinkPath::ZeroCopyReadStrided,
        LinkPath::WriteCombinedRead,
        LinkPath::RegisteredVecRead,
        LinkPath::RandomReadBasePages,
        LinkPath::RandomReadHugePages,
        LinkPath::RegisteredFileRead,
        LinkPath::ManagedRead,
        LinkPath::ManagedPrefetchRead,
        LinkPath::DeviceRead,
    ];

    /// Why this path's figure moves between runs by more than its own samples spread, where
    /// it does: a quick run of it cannot be trusted to within 10% of a full run, however
    /// tight its samples, so its cells are marked. Measured on the H200 machine (2026-12-02, a
    /// quick and a full run in one call): pageable copies at 256 MiB 28% and 38% apart, random
    /// reads on 4 KiB pages 12-16%, strided zero-copy reads 11-12%, a 64 KiB host memcpy 13%,
    /// each with samples within 10% of their median.
    pub fn varies_between_runs(self) -> Option<&'static str> {
        match self {
            LinkPath::PageableH2d | LinkPath::PageableD2h => Some(
                "pageable copies moved up to 38% between runs on the H200 (the driver's staging, the pages' state)",
            ),
            LinkPath::RandomReadBasePages => Some(
                "random reads on 4 KiB pages moved up to 16% between runs on the H200 (the GPU's TLB misses)",
            ),
            LinkPath::ZeroCopyReadStrided => {
                Some("strided mapped reads moved up to 12% between runs on the H200")
            }
            LinkPath::HostMemcpy => {
                Some("a host memcpy moved up to 13% between runs on the H200 (the CPU's caches)")
            }
            _ => None,
        }
    }

    /// The name used in tables, JSON and `--paths`.
    pub fn name(self) -> &'static str {
        match self {
            LinkPath::HostMemcpy => "host_memcpy",
            LinkPath::PageableH2d => "pageable_h2d",
            LinkPath::PageableD2h => "pageable_d2h",
            LinkPath::PinnedSyncH2d => "pinned_sync_h2d",
            LinkPath::PinnedSyncD2h => "pinned_sync_d2h",
            LinkPath::PinnedAsyncH2d => "pinned_async_h2d",
            LinkPath::PinnedAsyncD2h => "pinned_async_d2h",
            LinkPath::PinnedAsyncBoth => "pinned_async_both",
            LinkPath::ZeroCopyRead => "zero_copy_read",
            LinkPath::ZeroCopyWrite => "zero_copy_write",
            LinkPath::ZeroCopyReadWrite => "zero_copy_read_write",
            LinkPath::ZeroCopyReadStrided => "zero_copy_read_strided",
            LinkPath::WriteCombinedRead => "write_combined_read",
            LinkPath::RegisteredVecRead => "registered_vec_read",
            LinkPath::RandomReadBasePages => "random_read_4k_pages",
            LinkPath::RandomReadHugePages => "random_read_2m_pages",
            LinkPath::RegisteredFileRead => "registered_file_read",
            LinkPath::ManagedRead => "managed_read",
            LinkPath::ManagedPrefetchRead => "managed_prefetch_read",
            LinkPath::DeviceRead => "device_read",
        }
    }

    /// Which way its bytes go.
    pub fn direction(self) -> Direction {
        match self {
            LinkPath::HostMemcpy => Direction::Host,
            LinkPath::PageableD2h
            | LinkPath::PinnedSyncD2h
            | LinkPath::PinnedAsyncD2h
            | LinkPath::ZeroCopyWrite => Direction::D2h,
            LinkPath::PinnedAsyncBoth | LinkPath::ZeroCopyReadWrite => Direction::Both,
            LinkPath::DeviceRead => Direction::Device,
            _ => Direction::H2d,
        }
    }

    /// Whether it needs a GPU.
    pub fn needs_gpu(self) -> bool {
        self != LinkPath::HostMemcpy
    }
}

impl std::fmt::Display for LinkPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LinkPath {
    type Err = Error;

    fn from_str(text: &str) -> Result<LinkPath, Error> {
        LinkPath::ALL.into_iter().find(|path| path.name() == text.trim()).ok_or_else(|| {
            let names: Vec<&str> = LinkPath::ALL.iter().map(|path| path.name()).collect();
            Error::invalid("path", format!("`{text}`: the paths are {}", names.join(", ")))
        })
    }
}

/// A way of getting a few bytes across, one row of the latency table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyPath {
    /// `memcpy` of the bytes between two host buffers.
    HostMemcpy,
    /// `cuMemcpyHtoD` from pageable memory.
    PageableSyncH2d,
    /// `cuMemcpyHtoD` from pinned memory.
    PinnedSyncH2d,
    /// `cuMemcpyDtoH` into pinned memory.
    PinnedSyncD2h,
    /// `cuMemcpyAsync` from pinned memory, then `cuStreamSynchronize`.
    PinnedAsyncH2d,
    /// `cuMemcpyAsync` into pinned memory, then `cuStreamSynchronize`.
    PinnedAsyncD2h,
    /// Launching a kernel that reads the bytes from mapped pinned memory, then
    /// `cuStreamSynchronize`.
    ZeroCopyKernelRead,
    /// Launching a kernel that reads the bytes from a registered read-only file mapping, then
    /// `cuStreamSynchronize`.
    FileKernelRead,
    /// The CPU writes a word in mapped memory, a waiting kernel sees it and writes an answer
    /// the CPU sees (a round trip; 4 bytes each way; from the completion benchmark's
    /// baseline).
    MappedFlagRoundTrip,
    /// A request through a persistent kernel polling mapped memory, and its answer: the
    /// doorbell ([`hetmem::resident::Doorbell`]), measured by [`doorbell_round_trip`].
    Doorbell,
}

impl LatencyPath {
    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            LatencyPath::HostMemcpy => "host_memcpy",
            LatencyPath::PageableSyncH2d => "pageable_sync_h2d",
            LatencyPath::PinnedSyncH2d => "pinned_sync_h2d",
            LatencyPath::PinnedSyncD2h => "pinned_sync_d2h",
            LatencyPath::PinnedAsyncH2d => "pinned_async_h2d",
            LatencyPath::PinnedAsyncD2h => "pinned_async_d2h",
            LatencyPath::ZeroCopyKernelRead => "zero_copy_kernel_read",
            LatencyPath::FileKernelRead => "file_kernel_read",
            LatencyPath::MappedFlagRoundTrip => "mapped_flag_round_trip",
            LatencyPath::Doorbell => "doorbell",
        }
    }
}

/// The most repetitions a small cell takes, as a multiple of [`LinkOptions::repeats`].
const MID_SIZE_REPEATS_FACTOR: usize = 5;
/// The fewest timed repetitions of a cell (unless [`LinkOptions::repeats`] asks fewer): with
/// fewer, one slow stretch of the link moves the median. A quick run once reported
/// `pinned_async_both` at 256 MiB 22% below the full run from 3 samples.
pub const MIN_TIMED: usize = 5;
/// Bytes the warm-up of a cell moves at least (unless [`LinkOptions::warm_up`] is 0): one
/// warm-up repetition of a large cell is a few milliseconds, too short for the link to leave
/// an idle state (a quick run's first cells at 256 MiB read up to 33% low).
pub const WARM_UP_BYTES: usize = 1 << 30;
/// The most warm-up repetitions [`WARM_UP_BYTES`] adds to a small cell.
const MAX_WARM_UP: usize = 16;
/// A cell whose samples spread wider than this share of its median (slowest to fastest, as
/// p99) is marked unsure.
pub const WIDE_SPREAD: f64 = 0.10;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkOptions {
    /// Bandwidth sizes in bytes, each a multiple of 4 KiB in [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub sizes: Vec<usize>,
    /// Bandwidth paths. The pinned async H2D and D2H paths (the ceiling) are measured on a GPU
    /// whether listed or not.
    pub paths: Vec<LinkPath>,
    /// Timed repetitions per bandwidth cell (fewer for the largest sizes, at least 3).
    pub repeats: usize,
    /// Untimed repetitions before them.
    pub warm_up: usize,
    /// Latency sizes in bytes, in [`MIN_LATENCY_SIZE`]..=[`MAX_LATENCY_SIZE`]; empty: none.
    pub latency_sizes: Vec<usize>,
    /// Samples per latency cell, and per completion signal.
    pub latency_samples: usize,
    /// Also measure every completion signal (with latency sizes, on a GPU).
    pub completion: bool,
    /// Evict each GPU bandwidth cell's host buffers (managed memory excepted) from the CPU's
    /// caches before the cell, so every cell starts alike (the default). Off, a cell sees
    /// whatever the cell or check before it left in the caches: the GPU's reads of lines a core
    /// holds are slower. Without a GPU there is nothing to evict.
    pub cold_cpu_cache: bool,
}

impl LinkOptions {
    /// The full sweep: 4 KiB to 1 GiB by x4, 4 B to 64 KiB latencies, 20 repeats.
    pub fn full() -> LinkOptions {
        LinkOptions {
            sizes: sizes::log_steps(MIN_SIZE, MAX_SIZE, 4).expect("constant range"),
            paths: LinkPath::ALL.to_vec(),
            repeats: 20,
            warm_up: 3,
            latency_sizes: sizes::log_steps(MIN_LATENCY_SIZE, MAX_LATENCY_SIZE, 4).expect("constant range"),
            latency_samples: 1000,
            completion: true,
            cold_cpu_cache: true,
        }
    }

    /// A few sizes and repeats: under a minute on the H200 machine.
    pub fn quick() -> LinkOptions {
        LinkOptions {
            sizes: vec![64 << 10, 4 << 20, 256 << 20],
            paths: LinkPath::ALL.to_vec(),
            repeats: 5,
            warm_up: 1,
            latency_sizes: vec![4, 64 << 10],
            latency_samples: 200,
            completion: true,
            cold_cpu_cache: true,
        }
    }

    /// Checks every size and count.
    ///
    /// # Errors
    /// A size out of range or not a multiple of 4 KiB, no sizes or paths, zero repeats or more
    /// than [`MAX_RUNS`] with the warm-up, or latency sizes without samples; the message lists
    /// what is accepted.
    pub fn validate(&self) -> hetmem::Result<()> {
        let range = format!("{} to {}", sizes::format(MIN_SIZE), sizes::format(MAX_SIZE));
        if self.sizes.is_empty() {
            return Err(Error::invalid("sizes", format!("none given: give sizes from {range}")));
        }
        for &size in &self.sizes {
            if !(MIN_SIZE..=MAX_SIZE).contains(&size) || !size.is_multiple_of(MIN_SIZE) {
                return Err(Error::invalid(
                    "size",
                    format!("{size} bytes: bandwidth sizes are multiples of 4 KiB from {range}"),
                ));
            }
        }
        for &size in &self.latency_sizes {
            if !(MIN_LATENCY_SIZE..=MAX_LATENCY_SIZE).contains(&size) || !size.is_multiple_of(4) {
                return Err(Error::invalid(
                    "latency size",
                    format!(
                        "{size} bytes: latency sizes are multiples of 4 bytes from {} to {}",
                        sizes::format(MIN_LATENCY_SIZE),
                        sizes::format(MAX_LATENCY_SIZE)
                    ),
                ));
            }
        }
        if self.paths.is_empty() {
            return Err(Error::invalid("paths", "none given"));
        }
        if self.repeats == 0 || (!self.latency_sizes.is_empty() && self.latency_samples == 0) {
            return Err(Error::invalid("repeats", "need at least one timed repetition and sample"));
        }
        if self.warm_up + self.repeats > MAX_RUNS {
            return Err(Error::invalid(
                "repeats",
                format!("{} warm-up and {} timed: at most {MAX_RUNS} together", self.warm_up, self.repeats),
            ));
        }
        Ok(())
    }

    /// The timed repetitions at `bytes`: as many as fit 64 MiB per repetition's share, from 5x
    /// `repeats` for cells of 12 MiB and less down to 3 for the largest, so a 1 GiB managed cell
    /// does not take a minute while a 4 MiB cell (a tenth of a millisecond each) gets a median
    /// of 100. On the H200 machine, mid-size cells ran slow for stretches of milliseconds at a
    /// time (23-39 GB/s for one cell from run to run with 20 repetitions): the link is shared
    /// with the rest of the host. Never more than fit beside the warm-up in [`MAX_RUNS`]: each
    /// run has one checksum slot on the GPU.
    pub fn repeats_at(&self, bytes: usize) -> usize {
        let scaled = self.repeats.saturating_mul(64 << 20) / bytes.max(1);
        let scaled =
            scaled.clamp(self.repeats.min(MIN_TIMED), MID_SIZE_REPEATS_FACTOR.saturating_mul(self.repeats));
        scaled.min(MAX_RUNS.saturating_sub(self.warm_up_at(bytes)))
    }

    /// The untimed repetitions before a cell of `bytes`: [`LinkOptions::warm_up`], or as many
    /// as move [`WARM_UP_BYTES`] (up to 16) when that is more; none when `warm_up` is 0.
    pub fn warm_up_at(&self, bytes: usize) -> usize {
        if self.warm_up == 0 {
            return 0;
        }
        let by_bytes = WARM_UP_BYTES.div_ceil(bytes.max(1)).min(MAX_WARM_UP);
        self.warm_up.max(by_bytes).min(MAX_RUNS - self.repeats.min(MAX_RUNS))
    }
}

/// One bandwidth cell: a path at a size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BandwidthCell {
    /// The path.
    pub path: LinkPath,
    /// Which way (the ratio's ceiling follows it).
    pub direction: Direction,
    /// Bytes moved per repetition, per direction.
    pub bytes: usize,
    /// GB/s (10^9 bytes per second) per direction, over the repetitions. `min` is the slowest.
    pub gb_s: Summary,
    /// The median over the ceiling of its direction (both directions: the slower ceiling);
    /// `None` for host cells and where no ceiling was measured.
    pub ratio_to_ceiling: Option<f64>,
    /// How the result was checked against the CPU.
    pub verified_by: &'static str,
    /// The samples' spread, slowest to fastest (p99), as a share of the median.
    pub spread: f64,
    /// Why the median may be off, when it may: too few samples, or a spread wider than
    /// [`WIDE_SPREAD`]; `None` for a cell to trust.
    pub unsure: Option<String>,
}

impl BandwidthCell {
    /// The cell of `path` at `bytes`, its spread and how sure it is taken from `gb_s`.
    pub(crate) fn new(
        path: LinkPath,
        bytes: usize,
        gb_s: Summary,
        verified_by: &'static str,
    ) -> BandwidthCell {
        let spread = if gb_s.median > 0.0 { (gb_s.p99 - gb_s.min) / gb_s.median } else { 0.0 };
        let unsure = if gb_s.samples < MIN_TIMED {
            Some(format!("{} samples: too few", gb_s.samples))
        } else if spread > WIDE_SPREAD {
            Some(format!(
                "samples spread {:.0}% of the median ({:.2} to {:.2} GB/s)",
                spread * 100.0,
                gb_s.min,
                gb_s.p99
            ))
        } else {
            path.varies_between_runs()
                .map(|why| format!("{why}; its samples agree within {:.0}%", spread * 100.0))
        };
        BandwidthCell {
            path,
            direction: path.direction(),
            bytes,
            gb_s,
            ratio_to_ceiling: None,
            verified_by,
            spread,
            unsure,
        }
    }
}

/// The copy engines' own rate in this run: the best median of the pinned async copies.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ceiling {
    /// Host to device, GB/s.
    pub h2d_gb_s: f64,
    /// Device to host, GB/s.
    pub d2h_gb_s: f64,
}

impl Ceiling {
    fn for_direction(self, direction: Direction) -> Option<f64> {
        match direction {
            Direction::H2d => Some(self.h2d_gb_s),
            Direction::D2h => Some(self.d2h_gb_s),
            Direction::Both => Some(self.h2d_gb_s.min(self.d2h_gb_s)),
            Direction::Host | Direction::Device => None,
        }
    }
}

/// One latency cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatencyCell {
    /// The path.
    pub path: LatencyPath,
    /// Bytes moved.
    pub bytes: usize,
    /// Microseconds per transfer; `None` when not measured (see `note`).
    pub us: Option<Summary>,
    /// Why it was not measured, or how to read it.
    pub note: Option<String>,
}

/// The link report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkReport {
    /// The device (or the CPU backend's name).
    pub device: String,
    /// Whether GPU cells were measured.
    pub gpu_measured: bool,
    /// Why not, in plain words, when they were not.
    pub gpu_not_measured_because: Option<String>,
    /// Timed repetitions per bandwidth cell (the most; large sizes use fewer).
    pub repeats: usize,
    /// [`LinkOptions::cold_cpu_cache`] as asked: whether each GPU bandwidth cell's host buffers
    /// were evicted from the CPU's caches before it (when GPU cells were measured).
    pub cold_cpu_cache: bool,
    /// The copy-engine ceiling, on a GPU.
    pub ceiling: Option<Ceiling>,
    /// Bandwidth cells, by size then path.
    pub bandwidth: Vec<BandwidthCell>,
    /// Latency cells, by size then path.
    pub latency: Vec<LatencyCell>,
    /// Every completion signal of the hand-off, on a GPU with latency sizes.
    pub completion: Option<CompletionReport>,
}

/// Measures the link of `device` as `options` say.
///
/// # Errors
/// Invalid options (see [`LinkOptions::validate`]); memory that cannot be allocated or pinned;
/// a kernel failing to compile or launch; a checked result differing from the CPU's.
pub fn measure(device: &Device, options: &LinkOptions) -> Result<LinkReport> {
    options.validate()?;
    let mut bandwidth = Vec::new();
    let mut latency = Vec::new();
    if options.paths.contains(&LinkPath::HostMemcpy) {
        bandwidth.extend(host::bandwidth(options)?);
    }
    latency.extend(host::latency(options));
    let Some(cuda) = device.as_cuda() else {
        let because = device
            .cpu_fallback_reason()
            .map_or("the CPU backend was chosen".to_string(), ToString::to_string);
        return Ok(LinkReport {
            device: device.name(),
            gpu_measured: false,
            gpu_not_measured_because: Some(format!("GPU cells were not measured: {because}")),
            repeats: options.repeats,
            cold_cpu_cache: options.cold_cpu_cache,
            ceiling: None,
            bandwidth,
            latency,
            completion: None,
        });
    };
    let measured = gpu::measure(device, cuda, options)?;
    bandwidth.extend(measured.bandwidth);
    latency.extend(measured.latency);
    let ceiling = ceiling_of(&bandwidth);
    if let Some(ceiling) = ceiling {
        for cell in &mut bandwidth {
            cell.ratio_to_ceiling = ceiling.for_direction(cell.direction).map(|top| cell.gb_s.median / top);
        }
    }
    if !options.paths.contains(&LinkPath::PinnedAsyncH2d)
        || !options.paths.contains(&LinkPath::PinnedAsyncD2h)
    {
        bandwidth.retain(|cell| {
            options.paths.contains(&cell.path)
                || !matches!(cell.path, LinkPath::PinnedAsyncH2d | LinkPath::PinnedAsyncD2h)
        });
    }
    Ok(LinkReport {
        device: cuda.name().to_string(),
        gpu_measured: true,
        gpu_not_measured_because: None,
        repeats: options.repeats,
        cold_cpu_cache: options.cold_cpu_cache,
        ceiling,
        bandwidth,
        latency,
        completion: measured.completion,
    })
}

/// The best median of each pinned async copy direction.
fn ceiling_of(cells: &[BandwidthCell]) -> Option<Ceiling> {
    let best = |path: LinkPath| {
        cells.iter().filter(|cell| cell.path == path).map(|cell| cell.gb_s.median).reduce(f64::max)
    };
    Some(Ceiling { h2d_gb_s: best(LinkPath::PinnedAsyncH2d)?, d2h_gb_s: best(LinkPath::PinnedAsyncD2h)? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::fresh_seed;

    #[test]
    fn path_names_round_trip_and_unknown_names_list_the_valid_ones() {
        for path in LinkPath::ALL {
            assert_eq!(path.name().parse::<LinkPath>().unwrap(), path);
            assert_eq!(serde_json::to_value(path).unwrap(), path.name());
        }
        let error = "warp_drive".parse::<LinkPath>().unwrap_err().to_string();
        assert!(error.contains("warp_drive") && error.contains("zero_copy_read_strided"), "{error}");
    }

    #[test]
    fn options_reject_sizes_out_of_range_with_the_range() {
        assert!(LinkOptions::quick().validate().is_ok());
        assert!(LinkOptions::full().validate().is_ok());
        let mut options = LinkOptions::quick();
        options.sizes = vec![2 << 30];
        let error = options.validate().unwrap_err().to_string();
        assert!(error.contains("4 KiB to 1 GiB"), "{error}");
        options.sizes = vec![6000];
        assert!(options.validate().is_err());
        options.sizes = vec![4096];
        options.latency_sizes = vec![128 << 10];
        assert!(options.validate().unwrap_err().to_string().contains("64 KiB"));
        options.latency_sizes = vec![4];
        options.repeats = MAX_RUNS;
        assert!(options.validate().unwrap_err().to_string().contains("at most 1024"));
    }

    #[test]
    fn small_cells_get_up_to_five_times_the_repeats_and_large_ones_at_least_five() {
        let options = LinkOptions::full();
        assert_eq!(options.repeats_at(4096), 100);
        assert_eq!(options.repeats_at(4 << 20), 100);
        assert_eq!(options.repeats_at(64 << 20), 20);
        assert_eq!(options.repeats_at(256 << 20), MIN_TIMED);
        assert_eq!(options.repeats_at(1 << 30), MIN_TIMED);
        let quick = LinkOptions::quick();
        assert_eq!(
            quick.repeats_at(256 << 20),
            MIN_TIMED,
            "a quick cell takes as many samples as a full one"
        );
        // A user asking fewer gets fewer.
        assert_eq!(LinkOptions { repeats: 2, ..LinkOptions::full() }.repeats_at(1 << 30), 2);
    }

    #[test]
    fn warm_up_moves_a_gib_at_least_unless_none_is_asked() {
        let quick = LinkOptions::quick();
        assert_eq!(quick.warm_up_at(256 << 20), 4, "4 x 256 MiB, not the 1 that let the link idle");
        assert_eq!(quick.warm_up_at(1 << 30), 1);
        assert_eq!(quick.warm_up_at(4096), MAX_WARM_UP);
        assert_eq!(LinkOptions::full().warm_up_at(1 << 30), 3, "the asked count when it is more");
        assert_eq!(LinkOptions { warm_up: 0, ..LinkOptions::quick() }.warm_up_at(4096), 0);
        for options in [LinkOptions::quick(), LinkOptions::full()] {
            for bytes in [4096, 64 << 10, 4 << 20, 256 << 20, 1 << 30] {
                assert!(options.warm_up_at(bytes) + options.repeats_at(bytes) <= MAX_RUNS);
            }
        }
    }

    #[test]
    fn cells_with_few_samples_or_a_wide_spread_are_marked_unsure() {
        let cell = |samples: &[f64]| {
            BandwidthCell::new(LinkPath::PinnedAsyncBoth, 256 << 20, Summary::of(samples).unwrap(), "test")
        };
        // The quick run's cell that read 22% low: 3 samples, 33.4 to 39.1.
        let few = cell(&[33.4, 38.8, 39.1]);
        assert!(few.unsure.as_deref().is_some_and(|why| why.contains("3 samples")), "{:?}", few.unsure);
        let wide = cell(&[33.4, 38.8, 39.1, 45.0, 49.0]);
        assert!(wide.spread > WIDE_SPREAD);
        assert!(wide.unsure.as_deref().is_some_and(|why| why.contains("spread")), "{:?}", wide.unsure);
        // The full run's: 49.9 to 50.5.
        let tight = cell(&[49.9, 50.1, 50.2, 50.4, 50.5]);
        assert!(tight.spread < 0.02 && tight.unsure.is_none(), "{tight:?}");
        // A path whose figure moves between runs is marked however tight its samples.
        let pageable = BandwidthCell::new(
            LinkPath::PageableH2d,
            256 << 20,
            Summary::of(&[9.9, 10.0, 10.1, 10.0, 10.0]).unwrap(),
            "test",
        );
        assert!(
            pageable.unsure.as_deref().is_some_and(|why| why.contains("between runs")),
            "{:?}",
            pageable.unsure
        );
    }

    /// Each run XORs into a slot of its own on the GPU: five times 205 repeats of a small cell
    /// would write past the slots.
    #[test]
    fn scaled_repeats_never_pass_the_checksum_slots() {
        let options = LinkOptions { repeats: 205, warm_up: 3, ..LinkOptions::full() };
        options.validate().unwrap();
        assert_eq!(options.warm_up_at(4096) + options.repeats_at(4096), MAX_RUNS);
        let options = LinkOptions { repeats: 1000, warm_up: 24, ..LinkOptions::full() };
        assert_eq!(options.warm_up_at(4096) + options.repeats_at(4096), MAX_RUNS);
    }

    #[test]
    fn the_full_sweep_covers_4_kib_to_1_gib() {
        let options = LinkOptions::full();
        assert_eq!((options.sizes[0], *options.sizes.last().unwrap()), (MIN_SIZE, MAX_SIZE));
        assert_eq!(options.latency_sizes, [4, 16, 64, 256, 1024, 4096, 16384, 65536]);
    }

    #[test]
    fn random_data_is_not_zeros_and_checksums_see_every_word() {
        let mut words = vec![0u32; 1 << 20];
        fill_random(&mut words, fresh_seed());
        assert!(words.iter().filter(|&&w| w == 0).count() < 4);
        let sum = xor_checksum(&words);
        words[777_777] ^= 1 << 9;
        assert_eq!(xor_checksum(&words), sum ^ (1 << 9));
    }

    /// The random reads' checksum is the XOR of the vectors at the mixed indices (a naive loop
    /// over the same indices agrees), the indices stay inside the cell and scatter over its
    /// pages, and a changed word in a vector that is read changes the checksum.
    #[test]
    fn random_reads_scatter_inside_the_cell_and_their_checksum_sees_each_load() {
        let seed = fresh_seed();
        eprintln!("seed {seed:#x}");
        let mut words = vec![0u32; 1 << 16];
        fill_random(&mut words, seed);
        let read_seed = seed as u32 ^ 0x1234_5678;
        let n16 = (words.len() / 4) as u64;
        let indices: Vec<u64> = (0..n16).map(|i| words::random_index(i, read_seed, n16)).collect();
        assert!(indices.iter().all(|&at| at < n16));
        let pages: std::collections::HashSet<u64> = indices.iter().map(|&at| at * 16 / 4096).collect();
        assert_eq!(pages.len() as u64, n16 * 16 / 4096, "every 4 KiB page of the cell is read");
        let neighbours_far = indices.windows(2).filter(|pair| pair[0].abs_diff(pair[1]) * 16 >= 4096).count();
        assert!(neighbours_far as u64 > n16 * 9 / 10, "neighbouring loads land pages apart");
        let naive = indices.iter().fold(0u32, |acc, &at| {
            let at = at as usize * 4;
            acc ^ words[at] ^ words[at + 1] ^ words[at + 2] ^ words[at + 3]
        });
        let sum = random_read_checksum(&words, read_seed);
        assert_eq!(sum, naive);
        // A vector read an odd number of times: flipping a bit in it flips the checksum.
        let mut counts = std::collections::HashMap::new();
        for &at in &indices {
            *counts.entry(at).or_insert(0u32) += 1;
        }
        let (&odd, _) = counts.iter().find(|(_, count)| **count % 2 == 1).expect("some vector read once");
        words[odd as usize * 4 + 2] ^= 1 << 5;
        assert_eq!(random_read_checksum(&words, read_seed), sum ^ (1 << 5));
    }

    #[test]
    fn the_write_pattern_is_checked_word_for_word() {
        let mut words: Vec<u32> = (0..4096u64).map(|i| bench_word(i, 7)).collect();
        assert_eq!(first_pattern_mismatch(&words, 7), None);
        assert!(first_pattern_mismatch(&words, 8).is_some());
        words[1234] ^= 1;
        assert_eq!(first_pattern_mismatch(&words, 7), Some(1234));
    }
}
