//! The GPU cells: copies through the driver and the copy engines, kernels reading and writing
//! host memory directly, and managed memory.
//!
//! Buffers are made once at the largest size; each cell uses a prefix. Outputs are poisoned
//! before each cell, so a check can only pass if the cell's own work wrote them. Each read
//! repetition folds its bytes into its own checksum slot, so every repetition is checked.
//!
//! The cells queue copies and kernels on raw streams by address, outside the hand-off's
//! leases, and any of their `?`s may return while that work is queued. So every piece of
//! memory the work touches is held in an [`InFlight`] naming the rig's streams (the buffers,
//! the checksum slots) from before the first work is queued on it: whatever path drops it
//! waits for the streams first, or leaks it. The waits happen at drop, outside timed regions.

use super::{
    BandwidthCell, LatencyCell, LatencyPath, LinkOptions, LinkPath, bench_word, doorbell_round_trip,
    first_pattern_mismatch,
};
use crate::completion::{self, CompletionReport};
use crate::error::{BenchError, Result};
use hetmem::backend::Device;
use hetmem::backend::cuda::CudaDevice;
use hetmem::handoff::Queue;

mod bandwidth;
mod buffers;
mod latency;
mod rig;

use buffers::Buffers;
use rig::Rig;

/// Checksum slots: one per repetition of a cell.
const SLOTS: usize = super::MAX_RUNS;
/// What outputs hold before a cell writes them.
const POISON: u32 = 0xA5A5_A5A5;
/// Threads per block of the bench kernels.
const BLOCK: u32 = 512;

/// The GPU cells and the completion signals.
pub(super) struct Measured {
    pub(super) bandwidth: Vec<BandwidthCell>,
    pub(super) latency: Vec<LatencyCell>,
    pub(super) completion: Option<CompletionReport>,
}

pub(super) fn measure(device: &Device, cuda: &CudaDevice, options: &LinkOptions) -> Result<Measured> {
    let mut rig = Rig::new(cuda)?;
    let largest = buffer_bytes(options);
    // Every `?` below may leave work queued on the rig's streams: dropping `buffers` waits for it.
    let mut buffers = Buffers::new(device, &rig, largest, &options.paths)?;
    let mut bandwidth = Vec::new();
    for &bytes in &options.sizes {
        for &path in &LinkPath::ALL {
            let ceiling = matches!(path, LinkPath::PinnedAsyncH2d | LinkPath::PinnedAsyncD2h);
            if path.needs_gpu() && (options.paths.contains(&path) || ceiling) {
                let (gb_s, verified_by) = rig
                    .bandwidth(&mut buffers, path, bytes, options)
                    .map_err(|error| in_cell(error, path.name(), bytes))?;
                bandwidth.push(BandwidthCell::new(path, bytes, gb_s, verified_by));
            }
        }
    }
    let mut latency = Vec::new();
    for &bytes in &options.latency_sizes {
        for path in [
            LatencyPath::PageableSyncH2d,
            LatencyPath::PinnedSyncH2d,
            LatencyPath::PinnedSyncD2h,
            LatencyPath::PinnedAsyncH2d,
            LatencyPath::PinnedAsyncD2h,
            LatencyPath::ZeroCopyKernelRead,
            LatencyPath::FileKernelRead,
        ] {
            let us = rig
                .latency(&mut buffers, path, bytes, options.latency_samples)
                .map_err(|error| in_cell(error, path.name(), bytes))?;
            let note = matches!(path, LatencyPath::ZeroCopyKernelRead | LatencyPath::FileKernelRead)
                .then(|| "includes the kernel launch and the stream synchronisation".to_string());
            latency.push(LatencyCell { path, bytes, us: Some(us), note });
        }
    }
    // Waits for the rig's streams (idle by now) before freeing: outside every timed region.
    drop(buffers);
    let completion = if options.latency_sizes.is_empty() || !options.completion {
        None
    } else {
        let queue = Queue::new(device)?;
        let report = completion::measure(&queue, options.latency_samples)?;
        let round_trip = report.rows.first().map(|row| row.go_to_known_us);
        latency.push(LatencyCell {
            path: LatencyPath::MappedFlagRoundTrip,
            bytes: 4,
            us: round_trip,
            note: Some("CPU write seen by a waiting kernel, its answer seen by the CPU".to_string()),
        });
        let doorbell = doorbell_round_trip(device, options.latency_samples)?;
        latency.push(LatencyCell {
            path: LatencyPath::Doorbell,
            bytes: 64,
            note: Some("a 64-byte request served by a persistent kernel, reply read by the CPU".into()),
            us: doorbell,
        });
        Some(report)
    };
    Ok(Measured { bandwidth, latency, completion })
}

/// The size every buffer is made at: enough for the largest bandwidth cell and the largest
/// latency transfer (read by the kernels in whole 16-byte vectors). Latency sizes may exceed
/// every bandwidth size (`--sizes 4KiB --latency-sizes 64KiB`); buffers made at the bandwidth
/// size alone once let those transfers run past them on the GPU.
fn buffer_bytes(options: &LinkOptions) -> usize {
    let bandwidth = options.sizes.iter().copied().max().expect("validated: at least one size");
    let latency = options.latency_sizes.iter().map(|&bytes| bytes.next_multiple_of(super::MIN_SIZE)).max();
    bandwidth.max(latency.unwrap_or(0))
}

fn in_cell(error: BenchError, path: &'static str, bytes: usize) -> BenchError {
    BenchError::BenchCellFailed { path, bytes, source: Box::new(error) }
}

/// Checks that `words` hold `bench_word(i, seed)`.
fn check_pattern(words: &[u32], seed: u32) -> Result<&'static str> {
    match first_pattern_mismatch(words, seed) {
        None => Ok("every word equals the pattern the CPU computes"),
        Some(at) => Err(BenchError::ResultMismatch {
            what: "the written data",
            detail: format!(
                "word {at} is {:#010x}, expected {:#010x}",
                words[at],
                bench_word(at as u64, seed)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_word_voids_the_measurement_by_variant() {
        let seed = 0x5EED;
        let mut words: Vec<u32> = (0..1024).map(|i| bench_word(i, seed)).collect();
        assert!(check_pattern(&words, seed).is_ok());
        words[700] ^= 1;
        match check_pattern(&words, seed) {
            Err(BenchError::ResultMismatch { what: "the written data", detail }) => {
                assert!(detail.starts_with("word 700 is"), "{detail}")
            }
            other => panic!("expected BenchError::ResultMismatch, got {other:?}"),
        }
    }

    #[test]
    fn a_failed_cell_keeps_its_cause() {
        let short = hetmem::error::CudaError {
            call: "cuMemAlloc",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        };
        let error = in_cell(short.into(), "pinned_async_h2d", 1 << 30);
        assert!(
            matches!(&error, BenchError::BenchCellFailed { path: "pinned_async_h2d", bytes, .. } if *bytes == 1 << 30),
            "{error:?}"
        );
        assert!(error.is_transient(), "a shortage in a cell may pass, as it would alone");
        assert!(error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"), "{error}");
    }

    #[test]
    fn buffers_hold_the_largest_transfer_of_either_kind() {
        let mut options = LinkOptions::quick();
        options.sizes = vec![4 << 10];
        options.latency_sizes = vec![4, 64 << 10];
        assert_eq!(buffer_bytes(&options), 64 << 10);
        options.latency_sizes = vec![4];
        assert_eq!(buffer_bytes(&options), 4 << 10);
        options.latency_sizes = vec![];
        options.sizes = vec![4 << 10, 1 << 20];
        assert_eq!(buffer_bytes(&options), 1 << 20);
    }
}
