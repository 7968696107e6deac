//! Several devices: the fan-out ring over one device against the plain ring, over two opens of
//! one GPU, and a portable buffer used by queues of two opens of one GPU and, on a machine
//! with two GPUs, by both GPUs (skipped with one GPU).

use hetmem::backend::{BackendChoice, DeviceSelection};
use hetmem::ops::affine_u32_cpu;
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, gaussian_cpu};
use hetmem::pipeline::FanOutRing;
use hetmem::stage::Stage;
use hetmem::testing::cuda_device_or_skip;
use hetmem::{Device, FrameRing, HostBuf, PinOptions, Queue, RingOptions, Strategy, memory::PinMethod, ops};

use crate::support::{POISON, first_mismatch, on_every_backend, random_words};

/// `frames` random frames, from a fresh seed (printed for replay).
fn random_frames(frames: usize, bytes: usize) -> Vec<Vec<u8>> {
    let seed = fastrand::u64(..);
    eprintln!("random_frames: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..frames).map(|_| (0..bytes).map(|_| rng.u8(..)).collect()).collect()
}

/// Streams `inputs` through `ring` from a producer thread; the outputs, in order.
fn stream_fan_out<S: Stage>(ring: &FanOutRing<S>, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for input in inputs {
                let mut slot = ring.next_input().unwrap();
                slot.copy_from_slice(input);
                slot.submit();
            }
        });
        (0..inputs.len())
            .map(|index| {
                let output = ring.next_output().unwrap_or_else(|error| {
                    ring.close();
                    panic!("frame {index}: {error}")
                });
                assert_eq!(output.index(), index as u64);
                output.to_vec()
            })
            .collect()
    })
}

fn stream_plain<S: Stage>(ring: &FrameRing<S>, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for input in inputs {
                let mut slot = ring.next_input().unwrap();
                slot.copy_from_slice(input);
                slot.submit();
            }
        });
        (0..inputs.len()).map(|_| ring.next_output().unwrap().to_vec()).collect()
    })
}

fn check_against_cpu(
    outputs: &[Vec<u8>],
    inputs: &[Vec<u8>],
    format: &FrameFormat,
    kernel: &Gaussian,
    what: &str,
) {
    for (index, (output, input)) in outputs.iter().zip(inputs).enumerate() {
        let mut want = vec![0u8; input.len()];
        gaussian_cpu(format, kernel, input, &mut want).unwrap();
        assert_eq!(first_mismatch(output, &want), None, "{what}: frame {index}");
    }
}

#[test]
fn a_fan_out_over_one_device_gives_what_the_plain_ring_gives() {
    on_every_backend("a_fan_out_over_one_device_gives_what_the_plain_ring_gives", |device| {
        let format = FrameFormat::new(320, 181, PixelLayout::Rgb).unwrap();
        let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
        let options = RingOptions { slots: 3, ..RingOptions::default() };
        let inputs = random_frames(11, format.frame_bytes());
        for strategy in Strategy::ALL.into_iter().filter(|strategy| strategy.check(device).is_ok()) {
            let fan =
                FanOutRing::new(std::slice::from_ref(device), strategy, format, &kernel, options).unwrap();
            fan.fill_outputs(0xA5).unwrap();
            let plain = FrameRing::new(device, strategy, format, &kernel, options).unwrap();
            plain.fill_outputs(0x5A).unwrap();
            let fanned = stream_fan_out(&fan, &inputs);
            assert_eq!(fanned, stream_plain(&plain, &inputs), "{strategy}");
            check_against_cpu(&fanned, &inputs, &format, &kernel, strategy.name());
        }
    });
}

#[test]
fn a_fan_out_over_two_opens_of_one_gpu_keeps_order_and_matches_the_cpu() {
    let Some(gpu) =
        cuda_device_or_skip("a_fan_out_over_two_opens_of_one_gpu_keeps_order_and_matches_the_cpu")
    else {
        return;
    };
    // Two Devices for GPU 0: each ring has its own streams; they share the primary context.
    let devices = [Device::Cuda(gpu), Device::open_ordinal(0).unwrap()];
    let format = FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap();
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
    let inputs = random_frames(13, format.frame_bytes());
    for strategy in [Strategy::ZeroCopy, Strategy::PinnedAsync, Strategy::Hybrid] {
        let options = RingOptions { slots: 2, timing: true, ..RingOptions::default() };
        let fan = FanOutRing::new(&devices, strategy, format, &kernel, options).unwrap();
        fan.fill_outputs(0xA5).unwrap();
        let outputs = stream_fan_out(&fan, &inputs);
        check_against_cpu(&outputs, &inputs, &format, &kernel, strategy.name());
        let frames: Vec<u64> = fan.rings().iter().map(FrameRing::drained).collect();
        assert_eq!(frames, [7, 6], "{strategy}: frame k on ring k mod 2");
        assert!(fan.rings().iter().all(|ring| ring.gpu_busy_seconds() > 0.0), "{strategy}");
    }
}

#[test]
fn every_selected_gpu_opens_in_order() {
    let Some(gpu) = cuda_device_or_skip("every_selected_gpu_opens_in_order") else {
        return;
    };
    let all = Device::open_selection(BackendChoice::Auto, &DeviceSelection::All).unwrap();
    assert_eq!(all[0].as_cuda().unwrap().ordinal(), gpu.ordinal());
    let count = all.len();
    let error = Device::open_selection(BackendChoice::Auto, &DeviceSelection::Ordinals(vec![count]))
        .unwrap_err()
        .to_string();
    assert!(error.contains(&format!("GPU {count} asked for")) && error.contains(gpu.name()), "{error}");
}

#[test]
fn a_portable_buffer_serves_queues_of_two_opens_of_one_gpu_in_turn() {
    let Some(gpu) = cuda_device_or_skip("a_portable_buffer_serves_queues_of_two_opens_of_one_gpu_in_turn")
    else {
        return;
    };
    portable_round_trip(&Device::Cuda(gpu), &Device::open_ordinal(0).unwrap());
}

/// The same across two distinct GPUs, where the machine has them: each GPU's kernel reads and
/// writes the other's portable buffers through its own context's address for them; a buffer
/// that is not portable is refused by the other GPU's queue, naming the remedy.
#[test]
fn a_portable_buffer_serves_two_gpus_in_turn() {
    let Some(gpu) = cuda_device_or_skip("a_portable_buffer_serves_two_gpus_in_turn") else {
        return;
    };
    let Ok(second) = Device::open_ordinal(1) else {
        eprintln!("a_portable_buffer_serves_two_gpus_in_turn: skipped: one GPU (needs GPU 1)");
        return;
    };
    let first = Device::Cuda(gpu);
    portable_round_trip(&first, &second);
    let private = HostBuf::<u32>::pinned(&first, 1024, PinOptions::default()).unwrap();
    let (queue, mut output) =
        (Queue::new(&second).unwrap(), HostBuf::<u32>::pinned(&second, 1024, PinOptions::default()).unwrap());
    output.as_mut_slice().fill(POISON);
    let (input, mut lent) = (queue.share(private), queue.lend(output));
    let error = ops::affine_u32(&queue, &input, &mut lent, 3, 7).unwrap_err().to_string();
    assert!(error.contains("portable: true"), "{error}");
}

/// Affine on `first`'s queue from a portable input into a portable output, then back the
/// other way on `second`'s queue, each checked against the CPU with outputs poisoned.
fn portable_round_trip(first: &Device, second: &Device) {
    let (one, two) = (Queue::new(first).unwrap(), Queue::new(second).unwrap());
    for method in [PinMethod::HostAlloc, PinMethod::Register] {
        let options = PinOptions { portable: true, method, ..PinOptions::default() };
        let mut input = HostBuf::<u32>::pinned(first, 40_000, options).unwrap();
        assert!(input.is_portable() && input.is_mapped(), "{method:?}");
        let words = random_words(input.len());
        input.as_mut_slice().copy_from_slice(&words);
        let mut output = HostBuf::<u32>::pinned(second, words.len(), options).unwrap();
        output.as_mut_slice().fill(POISON);

        // On the first queue, then the same buffers on the second: one lease at a time.
        let input = one.share(input);
        let mut lent = one.lend(output);
        ops::affine_u32(&one, &input, &mut lent, 3, 7).unwrap();
        let (input, output) = (input.reclaim().unwrap(), lent.reclaim().unwrap());
        let mut want = vec![0u32; words.len()];
        affine_u32_cpu(&words, &mut want, 3, 7);
        assert_eq!(first_mismatch(output.as_slice(), &want), None, "{method:?} on the first queue");

        // Back the other way on the second queue: the first result in, the first input's
        // buffer (poisoned again) out.
        let mut input = input;
        input.as_mut_slice().fill(POISON);
        let shared = two.share(output);
        let mut lent = two.lend(input);
        ops::affine_u32(&two, &shared, &mut lent, 5, 1).unwrap();
        let output = lent.reclaim().unwrap();
        drop(shared.reclaim().unwrap());
        let mut again = vec![0u32; words.len()];
        affine_u32_cpu(&want, &mut again, 5, 1);
        assert_eq!(first_mismatch(output.as_slice(), &again), None, "{method:?} on the second queue");
    }
}
