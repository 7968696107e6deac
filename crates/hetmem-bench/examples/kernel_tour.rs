//! Every kernel entry point of hetmem and hetmem-bench, once, on small random data, each result
//! checked against the CPU: the program the GPU bundle runs under compute-sanitizer (memcheck,
//! racecheck, synccheck, initcheck), where a full test run would take too long.
//!
//! - `affine_u32` on mapped memory;
//! - `checksum_words` on mapped memory, from an offset, with a partial last word;
//! - `gaussian_u8` and `gaussian_u16` by every GPU strategy, and `gaussian_u8_overlap` and
//!   `gaussian_u16_overlap` (pinned-async), on RGB frames and 4:2:0 frames whose sides are not
//!   multiples of anything, of 8-bit and of 16-bit samples, and `gaussian_u8_resident` and
//!   `gaussian_u16_resident` (the resident blur, zero-copy and hybrid, two frames each);
//! - the link benchmark's `bench_read_u4`, `bench_read_strided`, `bench_write_u4` and
//!   `bench_copy_u4` (each checked by the benchmark itself), the gate's `wait_for_go` and the
//!   `doorbell`, through a tiny `hetmem_bench::link::measure`;
//! - the CT kernels (`zero_u64`, `organ_window_stats`, `mask_organ`, `smooth_axis`,
//!   `masked_finish`, `mip_height`) with the volume and template copied, mapped, hybrid and
//!   placed, through a tiny `hetmem_bench::ct::measure` (each row checked against the CPU).
//!
//! `fault.cu`'s `illegal_store` is left out: it faults on purpose (hetmem's tests/faults.rs).
//!
//! Run with `cargo run -p hetmem-bench --example kernel_tour` (set `HETMEM_BACKEND=cuda` to
//! insist on the GPU).

use hetmem::ops::ct::VolumeShape;
use hetmem::ops::gaussian::{
    Border, FrameFormat, Gaussian, PixelLayout, ResidentGaussian, ResidentOptions, SampleType, gaussian_cpu,
};
use hetmem::placement::LinkProfile;
use hetmem::{Device, DeviceBuf, FrameFilter, HostBuf, PinOptions, Queue, Strategy, ops};
use hetmem_bench::ct::{self, CtOptions};
use hetmem_bench::link::{self, LinkOptions, LinkPath};

mod support;

use support::{FreshWords, check};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    let mut rng = FreshWords::from_time();

    // affine_u32 on mapped memory, with an odd length for the tail.
    let queue = Queue::new(&device)?;
    let data: Vec<u32> = (0..(1 << 16) + 5).map(|_| rng.next_u32()).collect();
    let mut input = HostBuf::<u32>::pinned(&device, data.len(), PinOptions::default())?;
    input.as_mut_slice().copy_from_slice(&data);
    let mut output = HostBuf::<u32>::pinned(&device, data.len(), PinOptions::default())?;
    output.as_mut_slice().fill(0xA5A5_A5A5);
    let (input, mut output) = (queue.share(input), queue.lend(output));
    ops::affine_u32(&queue, &input, &mut output, 2_654_435_761, 17)?;
    let output = output.reclaim()?;
    let mut want = vec![0; data.len()];
    ops::affine_u32_cpu(&data, &mut want, 2_654_435_761, 17);
    check("affine_u32", output.as_slice(), &want)?;
    drop((input, output));
    println!("affine_u32: equal to the CPU");

    // checksum_words from byte 8 of mapped memory, ending 3 bytes into a word, into the second
    // pair of sums.
    let bytes: Vec<u8> = (0..(1 << 16) + 11).map(|_| rng.next_u32() as u8).collect();
    let mut input = HostBuf::<u8>::pinned(&device, bytes.len(), PinOptions::default())?;
    input.as_mut_slice().copy_from_slice(&bytes);
    let input = queue.share(input);
    let mut sums = queue.lend(DeviceBuf::<u64>::new(&device, 4)?);
    ops::checksum(&queue, &input, 8, bytes.len() - 8, 8, &mut sums, 1)?;
    let sums = sums.reclaim()?.to_vec()?;
    let want = ops::checksum_cpu(&bytes[8..], 8);
    if sums != [0, 0, want.sum, want.weighted] {
        return Err(format!("checksum_words: {sums:x?}, the CPU {want:x?}").into());
    }
    drop(input);
    println!("checksum_words: equal to the CPU");

    // gaussian_u8, gaussian_u16 and their overlap variants, every strategy the device has.
    let strategies =
        [Strategy::Copy, Strategy::PinnedAsync, Strategy::ZeroCopy, Strategy::Managed, Strategy::Hybrid];
    for (width, height, layout, radius, sample) in [
        (97, 61, PixelLayout::Rgb, 2, SampleType::U8),
        (131, 77, PixelLayout::Yuv420, 4, SampleType::U8),
        (97, 61, PixelLayout::Rgb, 2, SampleType::U16),
        (131, 77, PixelLayout::Yuv420, 4, SampleType::U16),
    ] {
        let format = FrameFormat::new(width, height, layout)?.with_sample(sample);
        let kernel = Gaussian::new(Some(radius), None, Border::Reflect101)?;
        let frame: Vec<u8> = (0..format.frame_bytes()).map(|_| rng.next_u32() as u8).collect();
        let mut want = vec![0u8; frame.len()];
        gaussian_cpu(&format, &kernel, &frame, &mut want)?;
        for strategy in strategies {
            if strategy.check(&device).is_err() {
                continue;
            }
            let mut filter = FrameFilter::new(&device, strategy, format, &kernel)?;
            filter.fill_output(0xA5)?;
            filter.input_mut()?.copy_from_slice(&frame);
            filter.run()?;
            if filter.output()? != want {
                return Err(format!("{strategy} on {} differs from the CPU", format.describe()).into());
            }
            println!("gaussian {strategy} {}: equal to the CPU", format.describe());
        }
        // The resident kernel: two frames each, so the second reads the same addresses anew.
        for strategy in [Strategy::ZeroCopy, Strategy::Hybrid] {
            // Three blocks that wait on each other; a watchdog long enough for compute-sanitizer.
            let timeout = std::time::Duration::from_secs(20);
            let options = ResidentOptions { strategy, tiles: Some(3), timeout };
            let mut filter = ResidentGaussian::start_with(&device, format, &kernel, options)?;
            for round in 0..2u8 {
                let frame: Vec<u8> = frame.iter().map(|byte| byte ^ round.wrapping_mul(0x5B)).collect();
                let mut want = vec![0u8; frame.len()];
                gaussian_cpu(&format, &kernel, &frame, &mut want)?;
                filter.fill_output(0xA5)?;
                filter.input_mut()?.copy_from_slice(&frame);
                filter.run()?;
                if filter.output()? != want {
                    return Err(
                        format!("resident {strategy} on {} differs from the CPU", format.describe()).into()
                    );
                }
            }
            filter.shutdown()?;
            println!("gaussian resident {strategy} {}: equal to the CPU", format.describe());
        }
    }

    // The benchmark's kernels, the gate and the doorbell: the measurement checks each itself.
    // Latency transfers larger than every bandwidth cell: the buffers must hold them too.
    let options = LinkOptions {
        sizes: vec![4 << 10],
        paths: LinkPath::ALL.to_vec(),
        repeats: 1,
        warm_up: 0,
        latency_sizes: vec![64, 64 << 10],
        latency_samples: 2,
        completion: true,
        cold_cpu_cache: true,
    };
    let report = link::measure(&device, &options)?;
    println!("bench kernels, gate and doorbell: {} cells checked", report.bandwidth.len());

    // The CT kernels, every placement; a voxel count that is no multiple of 16, for the tails.
    let options = CtOptions {
        shape: VolumeShape::new(7, 21, 37)?,
        windows: 2,
        repeats: 1,
        profile: Some(LinkProfile::new(3000.0, 50.0, 2.5, 55.0)?),
        ..CtOptions::quick()
    };
    let run = ct::measure(&device, &options)?;
    let ran = run.report.rows.iter().filter(|row| row.seconds_per_study.is_some()).count();
    println!("CT kernels: {ran} placements equal to the CPU");
    Ok(())
}
