//! Speed of the CPU Gaussian (`gaussian_cpu`, the CPU backend) on 1080p and 4K frames, RGB
//! and gray, 5x5 reflect-101, printed as one JSON object per case: the same cases and fields
//! as `bench/peers/opencv_cpu.py`, which times `cv2.GaussianBlur` (the goal is >= 0.7x
//! OpenCV's speed at the same thread count).
//!
//! The thread count is rayon's: set `RAYON_NUM_THREADS` to the count given to the peer's
//! `--threads`. Each case blurs one fresh random frame (never zeros) `--runs` times after
//! `--warmup` untimed runs and reports the median, minimum and 90th percentile of the wall
//! time, and the median CPU time of the whole process per run (`cpu_median_ms`: all threads
//! together; on a machine shared with other work it shows what the blur itself costs, where
//! the wall time also counts the time the threads waited for a core).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hetmem --example cpu_gaussian_speed -- --runs 200
//! python3 bench/peers/opencv_cpu.py --threads 2 --runs 200
//! ```
//! `--sixteen-bit` adds 16-bit cases (OpenCV's CV_16U path). `scripts/bench-cpu` runs both in
//! turn for several rounds and tabulates them.

use std::time::Instant;

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, SampleType, gaussian_cpu};

/// The frame sizes measured, as the peer script's.
const SIZES: [(usize, usize); 2] = [(1920, 1080), (3840, 2160)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut runs = 200usize;
    let mut warmup = 20usize;
    let mut sixteen_bit = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a number"));
        match arg.as_str() {
            "--runs" => runs = value()?.parse()?,
            "--warmup" => warmup = value()?.parse()?,
            "--sixteen-bit" => sixteen_bit = true,
            other => {
                return Err(
                    format!("unknown argument {other}: give --runs N, --warmup N, --sixteen-bit").into()
                );
            }
        }
    }
    if runs == 0 {
        return Err("--runs 0: give at least 1 timed run".into());
    }
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    let samples: &[SampleType] =
        if sixteen_bit { &[SampleType::U8, SampleType::U16] } else { &[SampleType::U8] };
    for &sample in samples {
        for (width, height) in SIZES {
            for layout in [PixelLayout::Rgb, PixelLayout::Gray] {
                let format = FrameFormat::new(width, height, layout)?.with_sample(sample);
                let input: Vec<u8> = (0..format.frame_bytes()).map(|_| fastrand::u8(..)).collect();
                let mut output = vec![0u8; input.len()];
                let (mut times, mut cpu_times) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
                for run in 0..warmup + runs {
                    let (start, cpu_start) = (Instant::now(), process_cpu_ms());
                    gaussian_cpu(&format, &kernel, &input, &mut output)?;
                    if run >= warmup {
                        times.push(start.elapsed().as_secs_f64() * 1e3);
                        cpu_times.push(process_cpu_ms() - cpu_start);
                    }
                }
                times.sort_by(f64::total_cmp);
                cpu_times.sort_by(f64::total_cmp);
                let record = serde_json::json!({
                    "library": "hetmem",
                    "width": width,
                    "height": height,
                    "channels": if layout == PixelLayout::Rgb { 3 } else { 1 },
                    "bits": sample.bits(),
                    "ksize": 5,
                    "border": "reflect101",
                    "threads": rayon::current_num_threads(),
                    "runs": runs,
                    "median_ms": times[runs / 2],
                    "min_ms": times[0],
                    "p90_ms": times[runs * 9 / 10],
                    "cpu_median_ms": cpu_times[runs / 2],
                });
                println!("{record}");
            }
        }
    }
    Ok(())
}

/// CPU time used by the whole process so far, in milliseconds.
fn process_cpu_ms() -> f64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    time.tv_sec as f64 * 1e3 + time.tv_nsec as f64 / 1e6
}
