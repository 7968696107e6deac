//! How the segment count of the overlapped upload, blur and download (the PinnedAsync
//! strategy's path) changes a 1080p RGB frame's latency, and where the time goes: queueing the
//! work on the CPU, or waiting for the GPU. Also compares pinning by registration with
//! `cuMemHostAlloc` for the copies.
//!
//! Run with `cargo run --release -p hetmem --example overlap_segments` on a GPU machine; on the
//! CPU backend it says there is nothing to measure. Prints a table, then one JSON line.

use std::time::{Duration, Instant};

use hetmem::ops::gaussian::{
    FrameFormat, Gaussian, GaussianOverlap, GaussianPlan, PixelLayout, Segments, gaussian, gaussian_cpu,
};
use hetmem::placement::Where;
use hetmem::{Device, DeviceBuf, HostBuf, PinOptions, Queue, memory::PinMethod};

mod support;

use support::{XorShift32, check};

const FRAMES: usize = 300;
const WARM_UP: usize = 20;

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// One variant's timings: queueing the frame, and the whole frame, after the warm-up.
#[derive(Default)]
struct Timings {
    queued: Vec<Duration>,
    total: Vec<Duration>,
}

impl Timings {
    fn record(&mut self, index: usize, queued: Duration, total: Duration) {
        if index >= WARM_UP {
            self.queued.push(queued);
            self.total.push(total);
        }
    }

    /// Prints the row and adds its JSON to `rows`.
    fn report(self, label: &str, segments: usize, rows: &mut Vec<String>) {
        let (queued, total) = (median(self.queued), median(self.total));
        println!("{label:<10} {segments:>9} {queued:>12.1} {total:>12.1}");
        rows.push(format!(
            r#"{{"pinning":"{label}","segments":{segments},"queue_us":{queued:.2},"frame_us":{total:.2}}}"#
        ));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    if device.as_cuda().is_none() {
        println!("ok: nothing to measure on the {} backend (the overlap needs a GPU)", device.backend());
        return Ok(());
    }
    let queue = Queue::new(&device)?;
    let format = FrameFormat::new(1920, 1080, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(None, None, Default::default())?;
    let sms = device.as_cuda().map_or(1, |gpu| gpu.attributes().multiprocessor_count);
    let plan = GaussianPlan::new(&format, &kernel, sms)?;
    let frame = format.frame_bytes();
    let mut rng = XorShift32::from_time();
    let input: Vec<u8> = (0..frame).map(|_| rng.next_u32() as u8).collect();
    // Words, so the shared check can compare them (the frame is a whole number of words).
    let mut want = vec![0u32; frame / 4];
    gaussian_cpu(&format, &kernel, &input, bytemuck::cast_slice_mut(&mut want))?;

    println!("{:<10} {:>9} {:>12} {:>12}", "pinning", "segments", "queue us", "frame us");
    let mut rows = Vec::new();
    for method in [PinMethod::Register, PinMethod::HostAlloc] {
        let options = PinOptions { mapped: false, method, ..PinOptions::default() };
        let mut host_in = HostBuf::<u8>::pinned(&device, frame, options)?;
        let mut host_out = HostBuf::<u8>::pinned(&device, frame, options)?;
        host_in.as_mut_slice().copy_from_slice(&input);
        let (mut dev_in, mut dev_out) =
            (DeviceBuf::<u8>::new(&device, frame)?, DeviceBuf::<u8>::new(&device, frame)?);
        // The plain sequence for reference: copy in, blur, copy out, one after the other.
        let table = plan.upload_table(&queue, Where::Device)?;
        let mut timings = Timings::default();
        for index in 0..WARM_UP + FRAMES {
            host_out.as_mut_slice().fill(0xA5);
            let start = Instant::now();
            let shared_in = queue.share(host_in);
            let (mut lent_in, mut lent_out, mut lent_host_out) =
                (queue.lend(dev_in), queue.lend(dev_out), queue.lend(host_out));
            queue.copy(&shared_in, &mut lent_in)?;
            gaussian(&queue, &plan, &table, &lent_in, &mut lent_out)?;
            queue.copy(&lent_out, &mut lent_host_out)?;
            let enqueued = start.elapsed();
            host_out = lent_host_out.reclaim()?;
            let done = start.elapsed();
            (dev_in, dev_out, host_in) = (lent_in.reclaim()?, lent_out.reclaim()?, shared_in.reclaim()?);
            check(
                &format!("{method:?}, plain, frame {index}"),
                bytemuck::cast_slice(host_out.as_slice()),
                &want,
            )?;
            timings.record(index, enqueued, done);
        }
        // Segment count 0 stands for the plain sequence.
        timings.report(&format!("{method:?}"), 0, &mut rows);
        for segments in [1, 2, 3, 4, 6, 8, 12, 24] {
            let mut overlap =
                GaussianOverlap::with_segments(&device, &queue, &plan, Segments::Count(segments))?;
            let mut timings = Timings::default();
            for index in 0..WARM_UP + FRAMES {
                host_out.as_mut_slice().fill(0xA5);
                let start = Instant::now();
                let shared_in = queue.share(host_in);
                let (mut lent_in, mut lent_out, mut lent_host_out) =
                    (queue.lend(dev_in), queue.lend(dev_out), queue.lend(host_out));
                overlap.run(&queue, &shared_in, &mut lent_in, &mut lent_out, &mut lent_host_out)?;
                let enqueued = start.elapsed();
                host_out = lent_host_out.reclaim()?;
                let done = start.elapsed();
                (dev_in, dev_out, host_in) = (lent_in.reclaim()?, lent_out.reclaim()?, shared_in.reclaim()?);
                let what = format!("{method:?}, {segments} segments, frame {index}");
                check(&what, bytemuck::cast_slice(host_out.as_slice()), &want)?;
                timings.record(index, enqueued, done);
            }
            timings.report(&format!("{method:?}"), overlap.segments(), &mut rows);
        }
    }

    // The variant that writes the result straight into mapped host memory: no download.
    let mut host_in =
        HostBuf::<u8>::pinned(&device, frame, PinOptions { mapped: false, ..PinOptions::default() })?;
    host_in.as_mut_slice().copy_from_slice(&input);
    let mut host_out = HostBuf::<u8>::pinned(&device, frame, PinOptions::default())?;
    let mut dev_in = DeviceBuf::<u8>::new(&device, frame)?;
    for segments in [1, 2, 3, 4, 6, 8, 12] {
        let mut overlap = GaussianOverlap::with_segments(&device, &queue, &plan, Segments::Count(segments))?;
        let mut timings = Timings::default();
        for index in 0..WARM_UP + FRAMES {
            host_out.as_mut_slice().fill(0xA5);
            let start = Instant::now();
            let shared_in = queue.share(host_in);
            let (mut lent_in, mut lent_host_out) = (queue.lend(dev_in), queue.lend(host_out));
            overlap.run_mapped_output(&queue, &shared_in, &mut lent_in, &mut lent_host_out)?;
            let enqueued = start.elapsed();
            host_out = lent_host_out.reclaim()?;
            let done = start.elapsed();
            (dev_in, host_in) = (lent_in.reclaim()?, shared_in.reclaim()?);
            let what = format!("mapped output, {segments} segments, frame {index}");
            check(&what, bytemuck::cast_slice(host_out.as_slice()), &want)?;
            timings.record(index, enqueued, done);
        }
        timings.report("mapped-out", overlap.segments(), &mut rows);
    }
    println!("[{}]", rows.join(","));
    Ok(())
}
