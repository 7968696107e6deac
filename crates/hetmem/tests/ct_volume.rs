//! The CT computation on every backend: organ statistics, the masked Gaussian and
//! the maximum-intensity projection of fresh random volumes, with the HU volume and the label
//! template each in device memory or mapped host memory, outputs poisoned, equal to the CPU
//! reference (integers bit for bit, f32 within 1e-5 relative).

use hetmem::ops::ct::{
    self, HuWindow, LabelledVolume, MaskedGaussianStage, OrganStats, STATS_WORDS, VolumeShape,
    gaussian_weights, masked_gaussian_cpu, mip_height_cpu, organ_stats_cpu,
};
use hetmem::placement::Where;
use hetmem::{Device, DeviceBuf, FrameFilter, HostBuf, PinOptions, Queue, Strategy};

use crate::support::{POISON, on_every_backend};

/// A random volume of random shape (its voxel count rarely a multiple of 16, so the kernels'
/// tails run), random HU and labels 0..5 in runs, as organs are.
fn random_volume(rng: &mut fastrand::Rng) -> (VolumeShape, Vec<i16>, Vec<u8>) {
    let shape = VolumeShape::new(rng.usize(3..12), rng.usize(5..40), rng.usize(5..70)).unwrap();
    let hu: Vec<i16> = (0..shape.voxels()).map(|_| rng.i16(-1024..3072)).collect();
    let mut labels = Vec::with_capacity(shape.voxels());
    while labels.len() < shape.voxels() {
        let label = rng.u8(0..5);
        let run = rng.usize(1..40).min(shape.voxels() - labels.len());
        labels.extend(std::iter::repeat_n(label, run));
    }
    (shape, hu, labels)
}

fn seeded(test: &str) -> fastrand::Rng {
    let seed = fastrand::u64(..);
    eprintln!("{test}: seed {seed:#x}");
    fastrand::Rng::with_seed(seed)
}

fn mapped<T: hetmem::Element>(device: &Device, data: &[T]) -> HostBuf<T> {
    let mut buf = HostBuf::pinned(device, data.len(), PinOptions::default()).unwrap();
    buf.as_mut_slice().copy_from_slice(data);
    buf
}

fn on_device<T: hetmem::Element>(device: &Device, data: &[T]) -> DeviceBuf<T> {
    let mut buf = DeviceBuf::new(device, data.len()).unwrap();
    buf.copy_from_slice(data).unwrap();
    buf
}

#[test]
fn organ_statistics_equal_the_cpu_reference_in_every_placement() {
    on_every_backend("organ_statistics_equal_the_cpu_reference_in_every_placement", |device| {
        let mut rng = seeded("organ_statistics_equal_the_cpu_reference_in_every_placement");
        let (_, hu, labels) = random_volume(&mut rng);
        let queue = Queue::new(device).unwrap();
        let (a, b) = (rng.i16(-1100..3100), rng.i16(-1100..3100));
        let window = HuWindow::new(a.min(b), a.max(b)).unwrap();
        let run = |placement: &str, stats_of: &dyn Fn(u8, &mut hetmem::Lent<HostBuf<u64>>)| {
            for organ in 0..6u8 {
                let mut out = mapped(device, &vec![u64::from(POISON) << 32 | u64::from(POISON); STATS_WORDS]);
                out.as_mut_slice()[0] = u64::from(POISON);
                let mut out = queue.lend(out);
                stats_of(organ, &mut out);
                let out = out.reclaim().unwrap();
                let got = OrganStats::from_words(out.as_slice()).unwrap();
                let expected = organ_stats_cpu(&hu, &labels, organ, window).unwrap();
                assert_eq!(got, expected, "{placement}, organ {organ}, window {window:?}");
            }
        };
        let (hu_mapped, labels_mapped) =
            (queue.share(mapped(device, &hu)), queue.share(mapped(device, &labels)));
        let (hu_device, labels_device) =
            (queue.share(on_device(device, &hu)), queue.share(on_device(device, &labels)));
        run("all mapped", &|organ, out| {
            ct::organ_stats(&queue, &hu_mapped, &labels_mapped, organ, window, out).unwrap()
        });
        run("hybrid", &|organ, out| {
            ct::organ_stats(&queue, &hu_mapped, &labels_device, organ, window, out).unwrap()
        });
        run("all device", &|organ, out| {
            ct::organ_stats(&queue, &hu_device, &labels_device, organ, window, out).unwrap()
        });
    });
}

#[test]
fn the_masked_gaussian_equals_the_cpu_reference_within_1e_5() {
    on_every_backend("the_masked_gaussian_equals_the_cpu_reference_within_1e_5", |device| {
        let mut rng = seeded("the_masked_gaussian_equals_the_cpu_reference_within_1e_5");
        let (shape, hu, labels) = random_volume(&mut rng);
        let organ = rng.u8(0..5);
        let weights = gaussian_weights(0.5 + rng.f32() * 2.0).unwrap();
        let expected = masked_gaussian_cpu(shape, &hu, &labels, organ, &weights).unwrap();
        let queue = Queue::new(device).unwrap();
        let hu_buf = queue.share(mapped(device, &hu));
        let labels_buf = queue.share(on_device(device, &labels));
        let weights_buf = queue.share(on_device(device, &weights));
        let mut out = queue.lend(mapped(device, &vec![f32::from_bits(POISON); shape.voxels()]));
        ct::masked_gaussian(&queue, shape, &hu_buf, &labels_buf, organ, &weights_buf, &mut out).unwrap();
        let out = out.reclaim().unwrap();
        for (i, (&got, &want)) in out.as_slice().iter().zip(&expected).enumerate() {
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "voxel {i}: {got} vs {want}");
        }
        let inside = labels.iter().zip(&expected).zip(&hu).filter(|((l, _), _)| **l == organ);
        assert!(inside.clone().any(|((_, e), h)| *e != f32::from(*h)), "the smoothing changed nothing");
    });
}

/// The masked Gaussian as a stage over volume frames (i16 and u8 in, f32 out), run by a
/// FrameFilter by every strategy the device has, equal to the CPU closure (bit for bit on the
/// CPU, within 1e-5 relative on a GPU), outputs poisoned; by the hybrid strategy the weights,
/// read by every voxel, are placed in device memory.
#[test]
fn the_masked_gaussian_stage_runs_volumes_by_every_strategy_equal_to_the_cpu_closure() {
    let test = "the_masked_gaussian_stage_runs_volumes_by_every_strategy_equal_to_the_cpu_closure";
    on_every_backend(test, |device| {
        let mut rng = seeded(test);
        let (shape, hu, labels) = random_volume(&mut rng);
        let (organ, sigma) = (rng.u8(0..5), 0.5 + rng.f32() * 2.0);
        let stage = MaskedGaussianStage::new(shape, organ, sigma).unwrap();
        let expected =
            masked_gaussian_cpu(shape, &hu, &labels, organ, &gaussian_weights(sigma).unwrap()).unwrap();
        let strategies: Vec<Strategy> = match device.as_cuda() {
            None => vec![Strategy::Cpu],
            Some(_) => Strategy::ALL.into_iter().filter(|strategy| strategy.check(device).is_ok()).collect(),
        };
        for strategy in strategies {
            let mut filter = FrameFilter::with_stage(device, strategy, stage.clone()).unwrap();
            filter.input_mut_at(0).unwrap().copy_from_slice(bytemuck::cast_slice(&hu));
            filter.input_mut_at(1).unwrap().copy_from_slice(&labels);
            // Every byte of POISON is 0xA5: the output is f32::from_bits(POISON) throughout.
            filter.fill_output(POISON.to_le_bytes()[0]).unwrap();
            filter.run().unwrap();
            let got: Vec<f32> = filter
                .output()
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got.len(), expected.len());
            for (i, (&got, &want)) in got.iter().zip(&expected).enumerate() {
                match strategy {
                    Strategy::Cpu => assert_eq!(got.to_bits(), want.to_bits(), "{strategy}, voxel {i}"),
                    _ => assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{strategy}, voxel {i}: {got} vs {want}"
                    ),
                }
            }
            if strategy == Strategy::Hybrid {
                let placement = filter.placement().expect("the hybrid strategy places");
                assert_eq!(placement.place_of("gaussian weights"), Some(Where::Device), "{placement}");
                assert_eq!(placement.place_of("input 0"), Some(Where::Mapped), "{placement}");
            }
            eprintln!("{test}: {strategy} equal to the CPU closure");
        }
    });
}

#[test]
fn the_projection_equals_the_cpu_reference() {
    on_every_backend("the_projection_equals_the_cpu_reference", |device| {
        let mut rng = seeded("the_projection_equals_the_cpu_reference");
        let (shape, hu, _) = random_volume(&mut rng);
        let expected = mip_height_cpu(shape, &hu).unwrap();
        let plain: Vec<i16> = (0..shape.depth() * shape.width())
            .map(|i| {
                (0..shape.height())
                    .map(|y| {
                        hu[(i / shape.width()) * shape.height() * shape.width()
                            + y * shape.width()
                            + i % shape.width()]
                    })
                    .max()
                    .unwrap()
            })
            .collect();
        assert_eq!(expected, plain);
        let queue = Queue::new(device).unwrap();
        let hu_buf = queue.share(mapped(device, &hu));
        let mut out = queue.lend(mapped(device, &vec![POISON as i16; expected.len()]));
        ct::mip_height(&queue, shape, &hu_buf, &mut out).unwrap();
        assert_eq!(out.reclaim().unwrap().as_slice(), &expected[..]);
    });
}

#[test]
fn a_phantom_reads_back_the_same_through_the_gpu_path() {
    on_every_backend("a_phantom_reads_back_the_same_through_the_gpu_path", |device| {
        let shape = VolumeShape::new(30, 64, 80).unwrap();
        let phantom = LabelledVolume::phantom(shape, fastrand::u64(..));
        let queue = Queue::new(device).unwrap();
        let hu = queue.share(mapped(device, phantom.hu()));
        let labels = queue.share(on_device(device, phantom.labels()));
        let window = HuWindow::new(-1000, 1000).unwrap();
        for organ in ct::Organ::ALL {
            let mut out = queue.lend(mapped(device, &vec![u64::from(POISON); STATS_WORDS]));
            ct::organ_stats(&queue, &hu, &labels, organ.label(), window, &mut out).unwrap();
            let got = OrganStats::from_words(out.reclaim().unwrap().as_slice()).unwrap();
            assert_eq!(got, organ_stats_cpu(phantom.hu(), phantom.labels(), organ.label(), window).unwrap());
            assert!(got.count > 0, "{}", organ.name());
        }
    });
}

#[test]
fn buffers_of_the_wrong_size_are_refused() {
    let device = crate::support::cpu_device();
    let queue = Queue::new(&device).unwrap();
    let shape = VolumeShape::new(2, 3, 4).unwrap();
    let hu = queue.share(mapped(&device, &[1i16; 23]));
    let mut out = queue.lend(mapped(&device, &[0i16; 8]));
    let error = ct::mip_height(&queue, shape, &hu, &mut out).unwrap_err().to_string();
    assert!(error.contains("23 elements") && error.contains("24 voxels"), "{error}");
    assert!(VolumeShape::new(0, 3, 4).is_err());
    assert!(gaussian_weights(0.0).is_err() && gaussian_weights(9.0).is_err());
}
