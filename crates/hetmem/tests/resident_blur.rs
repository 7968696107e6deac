//! The resident blur (`ResidentGaussian`): every frame bit-exact with the CPU path on fresh
//! random data over a poisoned output, by zero-copy and hybrid, in several formats and tilings,
//! many frames through one kernel, and a second kernel after the first is shut down. On the GPU
//! each check runs in a child process: while the resident kernel runs, hetmem refuses module
//! loads and device synchronisation, which would fail tests running beside it.

use hetmem::Device;
use hetmem::ops::gaussian::{
    Border, FrameFormat, Gaussian, PixelLayout, ResidentGaussian, ResidentOptions, SampleType, gaussian_cpu,
};
use hetmem::stage::Strategy;

use crate::support::{first_mismatch, on_cpu_then_gpu_child};

/// Runs `check` on the CPU here, and on the GPU in a child process (skipping without a GPU).
fn on_both(test: &str, role: &str, check: fn(&Device)) {
    on_cpu_then_gpu_child(&format!("resident_blur::{test}"), role, check);
}

/// Runs `frames` fresh random frames through `filter`, each over a poisoned output, and
/// compares each result with the CPU path's.
fn check_frames(
    filter: &mut ResidentGaussian,
    kernel: &Gaussian,
    frames: usize,
    rng: &mut fastrand::Rng,
    what: &str,
) {
    let format = *filter.plan().format();
    for frame in 0..frames {
        let input: Vec<u8> = (0..format.frame_bytes()).map(|_| rng.u8(..)).collect();
        let mut want = vec![0u8; input.len()];
        gaussian_cpu(&format, kernel, &input, &mut want).unwrap();
        filter.input_mut().unwrap().copy_from_slice(&input);
        filter.fill_output(0xA5).unwrap();
        filter.run().unwrap();
        let got = filter.output().unwrap();
        assert_eq!(
            first_mismatch(got, &want),
            None,
            "{what}, frame {frame}: first difference (index, got, want)"
        );
    }
}

fn frames_match_the_cpu(device: &Device) {
    let seed = fastrand::u64(..);
    eprintln!("resident blur: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let cases = [
        (
            FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap(),
            Gaussian::new(Some(2), None, Border::Reflect101),
        ),
        (
            FrameFormat::new(641, 479, PixelLayout::Gray).unwrap().with_sample(SampleType::U16),
            Gaussian::for_samples(Some(5), None, Border::Replicate, SampleType::U16),
        ),
        (
            FrameFormat::new(322, 242, PixelLayout::Yuv420).unwrap(),
            Gaussian::new(Some(3), None, Border::Reflect101),
        ),
        (
            FrameFormat::new(97, 13, PixelLayout::Rgba).unwrap(),
            Gaussian::new(Some(1), None, Border::Replicate),
        ),
    ];
    for (format, kernel) in cases {
        let kernel = kernel.unwrap();
        for strategy in [Strategy::ZeroCopy, Strategy::Hybrid] {
            for tiles in [None, Some(1), Some(7)] {
                let options = ResidentOptions { strategy, tiles, ..ResidentOptions::default() };
                let mut filter = ResidentGaussian::start_with(device, format, &kernel, options).unwrap();
                let what = format!(
                    "{} by {strategy}, {} tiles in {} blocks, seed {seed:#x}",
                    format.describe(),
                    filter.plan().tiles(),
                    filter.plan().blocks()
                );
                check_frames(&mut filter, &kernel, 3, &mut rng, &what);
                assert_eq!(filter.frames(), 3);
                filter.shutdown().unwrap();
            }
        }
    }
}

#[test]
fn resident_blur_frames_are_bit_exact_with_the_cpu() {
    on_both("resident_blur_frames_are_bit_exact_with_the_cpu", "formats", frames_match_the_cpu);
}

/// Hundreds of frames through one kernel (every block waits for every frame's bell), then a
/// second kernel in the same process once the first has stopped.
fn many_frames_then_a_second_kernel(device: &Device) {
    let seed = fastrand::u64(..);
    eprintln!("resident blur, many frames: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let format = FrameFormat::new(320, 180, PixelLayout::Rgb).unwrap();
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
    let mut first = ResidentGaussian::start(device, format, &kernel).unwrap();
    check_frames(&mut first, &kernel, 300, &mut rng, &format!("first kernel, seed {seed:#x}"));
    first.shutdown().unwrap();
    let mut second = ResidentGaussian::start(device, format, &kernel).unwrap();
    check_frames(&mut second, &kernel, 20, &mut rng, &format!("second kernel, seed {seed:#x}"));
    // Dropped without a shutdown: Drop stops it.
    drop(second);
}

#[test]
fn resident_blur_runs_many_frames_and_starts_again() {
    on_both("resident_blur_runs_many_frames_and_starts_again", "many", many_frames_then_a_second_kernel);
}
