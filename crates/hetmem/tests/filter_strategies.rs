//! Every strategy filters fresh random frames of many sizes, layouts and sample types (8-bit
//! and 16-bit) exactly as the CPU path does (the two are bit-exact by construction), outputs
//! poisoned before each frame.

use hetmem::ops::gaussian::{
    Border, FrameFormat, Gaussian, GaussianOverlap, GaussianPlan, GaussianStage, PixelLayout, SampleType,
    Segments, gaussian_cpu,
};
use hetmem::placement::Where;
use hetmem::testing::cuda_device_or_skip;
use hetmem::{Device, DeviceBuf, FrameFilter, HostBuf, PinOptions, Queue, Strategy};

use crate::support::{first_mismatch, on_every_backend};

fn cases() -> Vec<(FrameFormat, Gaussian)> {
    let kernel = |radius, sigma, border| Gaussian::new(radius, sigma, border).unwrap();
    let format = |w, h, layout| FrameFormat::new(w, h, layout).unwrap();
    let wide = |w, h, layout| format(w, h, layout).with_sample(SampleType::U16);
    vec![
        (format(1920, 1080, PixelLayout::Rgb), kernel(None, None, Border::Reflect101)),
        (format(1919, 1081, PixelLayout::Rgb), kernel(Some(2), None, Border::Reflect101)),
        (format(7, 3, PixelLayout::Rgb), kernel(Some(2), None, Border::Reflect101)),
        (format(33, 17, PixelLayout::Rgba), kernel(Some(4), Some(2.0), Border::Replicate)),
        (format(640, 48, PixelLayout::Gray), kernel(Some(9), Some(3.0), Border::Reflect101)),
        (format(1919, 1081, PixelLayout::Yuv420), kernel(Some(3), None, Border::Reflect101)),
        (format(101, 77, PixelLayout::Yuv422), kernel(Some(1), None, Border::Replicate)),
        (format(64, 40, PixelLayout::Yuv444), kernel(Some(16), Some(6.0), Border::Reflect101)),
        // 16-bit samples: 10-bit video, 16-bit images, and sides not larger than the radius.
        (wide(1919, 1081, PixelLayout::Yuv420), kernel(Some(3), None, Border::Reflect101)),
        (wide(257, 129, PixelLayout::Rgb), kernel(None, None, Border::Reflect101)),
        (wide(33, 17, PixelLayout::Rgba), kernel(Some(4), Some(2.0), Border::Replicate)),
        (wide(640, 48, PixelLayout::Gray), kernel(Some(32), Some(10.0), Border::Reflect101)),
        (wide(7, 3, PixelLayout::Yuv422), kernel(Some(9), None, Border::Replicate)),
    ]
}

fn check_strategy(device: &Device, strategy: Strategy) {
    for (format, kernel) in cases() {
        let mut filter = FrameFilter::new(device, strategy, format, &kernel)
            .unwrap_or_else(|error| panic!("{strategy} {format:?}: {error}"));
        // The hybrid strategy places the frames and the table, which every tile reads: the
        // table in device memory, the frames mapped; the other strategies place by definition.
        match (filter.strategy(), filter.placement()) {
            (Strategy::Hybrid, Some(placement)) => {
                assert_eq!(placement.place_of("gaussian table"), Some(Where::Device), "{placement}");
                assert_eq!(placement.place_of("input 0"), Some(Where::Mapped), "{placement}");
                assert_eq!(placement.place_of("output 0"), Some(Where::Mapped), "{placement}");
            }
            (Strategy::Hybrid, None) => panic!("the hybrid filter has no placement"),
            (other, placement) => assert!(placement.is_none(), "{other} has a placement"),
        }
        for frame in 0..3 {
            filter_random_frame(&mut filter, &format, &kernel, &format!("{strategy}, frame {frame}"));
        }
    }
}

/// Filters a fresh random frame, the output poisoned first, and checks it against the CPU path.
fn filter_random_frame(
    filter: &mut FrameFilter<GaussianStage>,
    format: &FrameFormat,
    kernel: &Gaussian,
    what: &str,
) {
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let input: Vec<u8> = (0..format.frame_bytes()).map(|_| rng.u8(..)).collect();
    filter.input_mut().unwrap().copy_from_slice(&input);
    filter.fill_output(0xA5).unwrap();
    filter.run().unwrap();
    let mut want = vec![0u8; input.len()];
    gaussian_cpu(format, kernel, &input, &mut want).unwrap();
    assert_eq!(
        first_mismatch(filter.output().unwrap(), &want),
        None,
        "{what}, {}, radius {}, seed {seed:#x}",
        format.describe(),
        kernel.radius()
    );
}

#[test]
fn every_strategy_matches_the_cpu_path() {
    on_every_backend("every_strategy_matches_the_cpu_path", |device| {
        for strategy in Strategy::ALL {
            if strategy.check(device).is_ok() {
                check_strategy(device, strategy);
            }
        }
        check_strategy(device, Strategy::Auto);
    });
}

/// The hybrid strategy with its placement overridden: the Gaussian's table forced to stay
/// mapped (where the placer would put it in device memory) still filters exactly as the CPU
/// does, and the placement says the decision was the caller's; a frame forced into device
/// memory is refused by name.
#[test]
fn a_hybrid_filter_follows_its_overrides() {
    let Some(gpu) = cuda_device_or_skip("a_hybrid_filter_follows_its_overrides") else {
        return;
    };
    let device = Device::Cuda(gpu);
    let (format, kernel) = cases().swap_remove(1);
    let stage = GaussianStage::new(format, &kernel).unwrap();
    let mut filter =
        FrameFilter::with_placement(&device, stage.clone(), None, &[("gaussian table", Where::Mapped)])
            .unwrap();
    let placement = filter.placement().expect("a hybrid filter has a placement");
    let table = placement.decision("gaussian table").unwrap();
    assert!(table.place == Where::Mapped && table.overridden, "{placement}");
    filter_random_frame(&mut filter, &format, &kernel, "hybrid, table forced mapped");

    let error = FrameFilter::with_placement(&device, stage, None, &[("output 0", Where::Device)])
        .unwrap_err()
        .to_string();
    assert!(error.contains("output 0") && error.contains("pinned-async"), "{error}");
}

#[test]
fn gpu_strategies_on_the_cpu_backend_are_refused_by_name() {
    let cpu = crate::support::cpu_device();
    let format = FrameFormat::new(64, 64, PixelLayout::Rgb).unwrap();
    let kernel = Gaussian::new(None, None, Border::default()).unwrap();
    let error = FrameFilter::new(&cpu, Strategy::ZeroCopy, format, &kernel).unwrap_err().to_string();
    assert!(error.contains("zero-copy") && error.contains("needs a GPU"), "{error}");
}

/// The overlapped upload, blur and download (PinnedAsync's path), and the variant writing
/// mapped host memory, with one segment, a few, and the most: the segment hand-shake between
/// copy engines and kernel loses and repeats nothing.
#[test]
fn overlapped_frames_match_the_cpu_path_for_any_segment_count() {
    let Some(gpu) = cuda_device_or_skip("overlapped_frames_match_the_cpu_path_for_any_segment_count") else {
        return;
    };
    let device = Device::Cuda(gpu);
    let queue = Queue::new(&device).unwrap();
    let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
    for (format, kernel) in cases() {
        let plan = GaussianPlan::new(&format, &kernel, 132).unwrap();
        let frame = format.frame_bytes();
        for segments in [1, 3, 64] {
            let mut overlap =
                GaussianOverlap::with_segments(&device, &queue, &plan, Segments::Count(segments)).unwrap();
            let mut host_in = HostBuf::<u8>::pinned(&device, frame, unmapped).unwrap();
            let mut host_out = HostBuf::<u8>::pinned(&device, frame, unmapped).unwrap();
            let mut mapped_out = HostBuf::<u8>::pinned(&device, frame, PinOptions::default()).unwrap();
            let (mut dev_in, mut dev_out) = (
                DeviceBuf::<u8>::new(&device, frame).unwrap(),
                DeviceBuf::<u8>::new(&device, frame).unwrap(),
            );
            for frame_index in 0..3 {
                let seed = fastrand::u64(..);
                let mut rng = fastrand::Rng::with_seed(seed);
                host_in.as_mut_slice().iter_mut().for_each(|byte| *byte = rng.u8(..));
                host_out.as_mut_slice().fill(0xA5);
                dev_out.copy_from_slice(&vec![0x5A; frame]).unwrap();
                let shared_in = queue.share(host_in);
                let (mut lent_in, mut lent_out) = (queue.lend(dev_in), queue.lend(dev_out));
                let mut lent_host_out = queue.lend(host_out);
                overlap.run(&queue, &shared_in, &mut lent_in, &mut lent_out, &mut lent_host_out).unwrap();
                host_out = lent_host_out.reclaim().unwrap();
                (dev_in, dev_out) = (lent_in.reclaim().unwrap(), lent_out.reclaim().unwrap());
                host_in = shared_in.reclaim().unwrap();
                let mut want = vec![0u8; frame];
                gaussian_cpu(&format, &kernel, host_in.as_slice(), &mut want).unwrap();
                // The same frame again, written straight into mapped host memory.
                mapped_out.as_mut_slice().fill(0xA5);
                let (shared_in, mut lent_in) = (queue.share(host_in), queue.lend(dev_in));
                let mut lent_mapped_out = queue.lend(mapped_out);
                overlap.run_mapped_output(&queue, &shared_in, &mut lent_in, &mut lent_mapped_out).unwrap();
                (mapped_out, dev_in, host_in) = (
                    lent_mapped_out.reclaim().unwrap(),
                    lent_in.reclaim().unwrap(),
                    shared_in.reclaim().unwrap(),
                );
                assert_eq!(
                    first_mismatch(mapped_out.as_slice(), &want),
                    None,
                    "mapped output: {}, {segments} segments, frame {frame_index}, seed {seed:#x}",
                    format.describe()
                );
                assert_eq!(
                    first_mismatch(host_out.as_slice(), &want),
                    None,
                    "{}, {} segments asked, {} made, frame {frame_index}, seed {seed:#x}",
                    format.describe(),
                    segments,
                    overlap.segments()
                );
            }
        }
    }
}
