//! The host-side cells: what one CPU thread's `memcpy` moves, which every path that stages
//! through host memory pays, and which runs without a GPU.

use std::hint::black_box;
use std::time::Instant;

use super::{BandwidthCell, LatencyCell, LatencyPath, LinkOptions, LinkPath, fill_random};
use crate::Summary;
use crate::error::{BenchError, Result};
use crate::random::fresh_seed;

/// `memcpy` bandwidth at every size, each copy checked.
pub(super) fn bandwidth(options: &LinkOptions) -> Result<Vec<BandwidthCell>> {
    let largest = options.sizes.iter().copied().max().unwrap_or(0) / 4;
    let mut src = vec![0u32; largest];
    let mut dst = vec![0u32; largest];
    fill_random(&mut src, fresh_seed());
    let mut cells = Vec::new();
    for &bytes in &options.sizes {
        let words = bytes / 4;
        let mut rates = Vec::new();
        let warm_up = options.warm_up_at(bytes);
        for repeat in 0..warm_up + options.repeats_at(bytes) {
            let start = Instant::now();
            dst[..words].copy_from_slice(black_box(&src[..words]));
            black_box(&mut dst);
            let seconds = start.elapsed().as_secs_f64();
            if repeat >= warm_up {
                rates.push(bytes as f64 / seconds / 1e9);
            }
        }
        if dst[..words] != src[..words] {
            return Err(BenchError::ResultMismatch {
                what: "host_memcpy",
                detail: format!("the copy of {bytes} bytes differs"),
            });
        }
        let gb_s = Summary::of(&rates).expect("at least one repeat");
        cells.push(BandwidthCell::new(LinkPath::HostMemcpy, bytes, gb_s, "compared word for word"));
    }
    Ok(cells)
}

/// `memcpy` latency at every latency size.
pub(super) fn latency(options: &LinkOptions) -> Vec<LatencyCell> {
    let mut src = vec![0u32; super::MAX_LATENCY_SIZE / 4];
    let mut dst = vec![0u32; src.len()];
    fill_random(&mut src, fresh_seed());
    options
        .latency_sizes
        .iter()
        .map(|&bytes| {
            let words = bytes / 4;
            let samples: Vec<f64> = (0..options.latency_samples)
                .map(|_| {
                    let start = Instant::now();
                    dst[..words].copy_from_slice(black_box(&src[..words]));
                    black_box(&mut dst);
                    start.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            LatencyCell { path: LatencyPath::HostMemcpy, bytes, us: Summary::of(&samples), note: None }
        })
        .collect()
}
