//! Streaming throughput of the frame ring: RGB frames through the 5x5 Gaussian blur, by every
//! strategy the device runs, printed as one JSON object per run (one per line).
//!
//! The goals on the H200 machine: 1080p >= 7,000 frames/s, 4K >= 1,750 frames/s.
//! Each run reports frames/s, kernel busy time (CUDA events) and link bytes/s. Runs with
//! `"refill": false` leave each slot's random input in place after its first use (the ring and
//! the link alone); `"refill": true` copies a whole frame into the slot every time (a CPU
//! memcpy per frame included).
//!
//! Run with `cargo run --release -p hetmem-bench --example ring_throughput [FRAMES]` (default
//! 2000 1080p frames on a GPU, 12 small frames on the CPU backend).

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, FenceKind, Strategy};
use hetmem_bench::streaming::{StreamingSetup, measure};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    let frames_arg: Option<u64> = std::env::args().nth(1).map(|text| text.parse()).transpose()?;
    let kernel = Gaussian::new(None, None, Border::Reflect101)?;
    let (sizes, strategies, frames): (Vec<(usize, usize)>, Vec<Strategy>, u64) = match device.as_cuda() {
        Some(_) => (
            vec![(1920, 1080), (3840, 2160)],
            vec![Strategy::PinnedAsync, Strategy::ZeroCopy, Strategy::Hybrid, Strategy::Managed],
            frames_arg.unwrap_or(2000),
        ),
        None => (vec![(320, 240)], vec![Strategy::Cpu], frames_arg.unwrap_or(12)),
    };
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let mut failures = 0;
    for (width, height) in sizes {
        let format = FrameFormat::new(width, height, PixelLayout::Rgb)?;
        // 4K frames are four times the bytes: a quarter as many keeps the run time even.
        let frames = if width > 1920 { (frames / 4).max(12) } else { frames };
        for &strategy in &strategies {
            if let Err(why) = strategy.check(&device) {
                eprintln!("{strategy}: skipped: {why}");
                continue;
            }
            let configs = [
                (3, false, FenceKind::Event),
                (4, false, FenceKind::Event),
                (4, false, FenceKind::Flag),
                (3, true, FenceKind::Event),
            ];
            for (slots, refill, fence) in configs {
                let setup = StreamingSetup { strategy, format, slots, frames, refill, fence };
                match measure(&device, &kernel, &setup) {
                    Ok(run) => println!("{}", serde_json::to_string(&run)?),
                    Err(error) => {
                        failures += 1;
                        eprintln!(
                            "{strategy} {width}x{height} slots {slots} refill {refill}: error: {error}"
                        );
                    }
                }
            }
        }
    }
    if failures > 0 {
        return Err(format!("{failures} runs failed").into());
    }
    Ok(())
}
