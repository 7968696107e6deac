//! The frame ring: every strategy against the CPU path on fresh random frames, order and
//! back-pressure between threads, a failing frame in mid-stream, a consumer that stops.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, SampleType, gaussian_cpu};
use hetmem::stage::CpuStage;
use hetmem::{Device, Error, FenceKind, FrameRing, RingOptions, Strategy};

use crate::support::{first_mismatch, on_every_backend};

/// A random frame from a fresh seed, printed for replay.
fn random_frame(bytes: usize) -> (Vec<u8>, u64) {
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    ((0..bytes).map(|_| rng.u8(..)).collect(), seed)
}

/// Streams `frames` random frames through a ring by `strategy` from a producer thread, and
/// checks each output against the CPU path, in order.
fn stream_and_check(
    device: &Device,
    strategy: Strategy,
    fence: FenceKind,
    format: FrameFormat,
    kernel: &Gaussian,
    frames: usize,
) {
    let options = RingOptions { slots: 3, timing: true, fence, ..RingOptions::default() };
    let made = std::time::Instant::now();
    let ring = FrameRing::new(device, strategy, format, kernel, options)
        .unwrap_or_else(|error| panic!("{strategy} {format:?}: {error}"));
    ring.fill_outputs(0xA5).unwrap();
    let inputs: Vec<(Vec<u8>, u64)> = (0..frames).map(|_| random_frame(format.frame_bytes())).collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for (input, _) in &inputs {
                let mut slot = ring.next_input().unwrap();
                slot.copy_from_slice(input);
                slot.submit();
            }
        });
        for (index, (input, seed)) in inputs.iter().enumerate() {
            let output =
                ring.next_output().unwrap_or_else(|error| panic!("{strategy}: frame {index}: {error}"));
            assert_eq!(output.index(), index as u64);
            let mut want = vec![0u8; input.len()];
            gaussian_cpu(&format, kernel, input, &mut want).unwrap();
            assert_eq!(
                first_mismatch(&output, &want),
                None,
                "{strategy}, {}, frame {index}, seed {seed:#x}",
                format.describe()
            );
        }
    });
    assert_eq!((ring.submitted(), ring.drained()), (frames as u64, frames as u64));
    if strategy != Strategy::Cpu {
        // Frames overlap on the GPU: the busy time is their union, within the ring's lifetime.
        let (busy, lifetime) = (ring.gpu_busy_seconds(), made.elapsed().as_secs_f64());
        assert!(busy > 0.0 && busy <= lifetime, "{strategy}: busy {busy} s in {lifetime} s");
    }
}

#[test]
fn every_strategy_streams_frames_in_order_matching_the_cpu_path() {
    on_every_backend("every_strategy_streams_frames_in_order_matching_the_cpu_path", |device| {
        let kernel = Gaussian::new(None, None, Border::Reflect101).unwrap();
        let odd = Gaussian::new(Some(4), Some(2.0), Border::Replicate).unwrap();
        for strategy in Strategy::ALL {
            if strategy.check(device).is_err() {
                continue;
            }
            let hd = FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap();
            let odd_format = FrameFormat::new(101, 77, PixelLayout::Yuv420).unwrap();
            stream_and_check(device, strategy, FenceKind::Event, hd, &kernel, 8);
            stream_and_check(device, strategy, FenceKind::Flag, odd_format, &odd, 10);
            // 10-bit video: 16-bit samples through the same slots of bytes.
            let ten_bit = odd_format.with_sample(SampleType::U16);
            stream_and_check(device, strategy, FenceKind::Event, ten_bit, &odd, 6);
        }
    });
}

/// A CPU ring whose stage writes `!input` and fails on the frame whose first byte is `fail`.
fn inverting_ring(slots: usize, fail: Option<u8>) -> FrameRing<CpuStage> {
    FrameRing::with_cpu_stage(64, RingOptions { slots, ..RingOptions::default() }, move |input, output| {
        if Some(input[0]) == fail {
            return Err(Error::InvalidArgument { what: "test frame", problem: "injected failure".into() });
        }
        output.iter_mut().zip(input).for_each(|(out, &byte)| *out = !byte);
        Ok(())
    })
    .unwrap()
}

#[test]
fn a_failed_frame_is_named_and_the_frames_around_it_come_out_intact() {
    let ring = inverting_ring(3, Some(5));
    ring.fill_outputs(0xA5).unwrap();
    let mut outcomes = Vec::new();
    for frame in 0..10u8 {
        let mut slot = loop {
            match ring.try_next_input() {
                Ok(slot) => break slot,
                Err(Error::WouldBlock(_)) => outcomes.push(ring.next_output().map(|output| output.to_vec())),
                Err(error) => panic!("{error}"),
            }
        };
        slot.fill(frame);
        slot.submit();
    }
    while ring.drained() < ring.submitted() {
        outcomes.push(ring.next_output().map(|output| output.to_vec()));
    }
    assert_eq!(outcomes.len(), 10);
    for (frame, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Err(Error::FrameFailed { index, source }) => {
                assert_eq!((frame, index), (5, 5));
                assert!(source.to_string().contains("injected failure"), "{source}");
            }
            Ok(bytes) => assert_eq!(bytes, vec![!(frame as u8); 64], "frame {frame}"),
            Err(error) => panic!("frame {frame}: {error}"),
        }
    }
}

#[test]
fn a_fast_producer_is_held_back_and_loses_nothing() {
    let ring = inverting_ring(3, None);
    let most_ahead = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for frame in 0..60u8 {
                let mut slot = ring.next_input().unwrap();
                assert_eq!(slot.index(), u64::from(frame));
                slot.fill(frame);
                slot.submit();
                most_ahead.fetch_max(ring.submitted() - ring.drained(), Ordering::Relaxed);
            }
        });
        for frame in 0..60u8 {
            let output = ring.next_output().unwrap();
            assert_eq!((output.index(), &output[..]), (u64::from(frame), &[!frame; 64][..]));
            // A slow consumer.
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    assert_eq!(ring.drained(), 60);
    let ahead = most_ahead.into_inner();
    assert!(ahead <= 3, "the producer got {ahead} frames ahead of a 3-slot ring");
    assert_eq!(ahead, 3, "the producer never filled the ring, so back-pressure was not tested");
}

#[test]
fn a_stopped_consumer_blocks_the_producer_until_it_drains() {
    let ring = inverting_ring(2, None);
    for frame in 0..2u8 {
        let mut slot = ring.try_next_input().unwrap();
        slot.fill(frame);
        slot.submit();
    }
    assert!(matches!(ring.try_next_input(), Err(Error::WouldBlock(_))));
    let unblocked = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut slot = ring.next_input().unwrap();
            unblocked.store(true, Ordering::SeqCst);
            slot.fill(2);
            slot.submit();
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!unblocked.load(Ordering::SeqCst), "the producer wrote into a full ring");
        let output = ring.next_output().unwrap();
        assert_eq!(&output[..], &[!0u8; 64][..]);
        drop(output);
    });
    assert!(unblocked.into_inner());
    for frame in 1..3u8 {
        assert_eq!(&ring.next_output().unwrap()[..], &[!frame; 64][..]);
    }
    assert!(matches!(ring.try_next_output(), Err(Error::WouldBlock(_))));
}

#[test]
fn one_slot_at_a_time_per_side() {
    let ring = inverting_ring(3, None);
    let held = ring.try_next_input().unwrap();
    assert!(matches!(
        ring.try_next_input(),
        Err(Error::StillHeld { what: "the frame ring's input slot", .. })
    ));
    // Dropping an unsubmitted slot gives it back: the next frame is still frame 0.
    drop(held);
    let mut slot = ring.try_next_input().unwrap();
    assert_eq!(slot.index(), 0);
    slot.fill(7);
    slot.submit();
    let output = ring.try_next_output().unwrap();
    assert!(matches!(
        ring.try_next_output(),
        Err(Error::StillHeld { what: "the frame ring's output frame", .. })
    ));
    assert!(ring.fill_outputs(0).is_err(), "poisoning a busy ring");
    assert_eq!(&output[..], &[!7u8; 64][..]);
}

#[test]
fn closing_wakes_a_waiting_producer_and_ends_the_stream_after_the_last_frame() {
    let ring = inverting_ring(1, None);
    let mut slot = ring.try_next_input().unwrap();
    slot.fill(1);
    slot.submit();
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| ring.next_input().map(|slot| slot.index()));
        std::thread::sleep(Duration::from_millis(50));
        ring.close();
        assert!(matches!(waiting.join().unwrap(), Err(Error::RingClosed)));
    });
    assert_eq!(&ring.next_output().unwrap()[..], &[!1u8; 64][..]);
    assert!(matches!(ring.next_output(), Err(Error::RingClosed)));
}

/// Fills the next input slot of `ring` with `frame` and submits it.
fn submit_frame(ring: &FrameRing<CpuStage>, frame: &[u8]) {
    let mut slot = ring.try_next_input().unwrap();
    slot.input_mut(0).unwrap().copy_from_slice(frame);
    slot.submit();
}

fn inverted(frame: &[u8]) -> Vec<u8> {
    frame.iter().map(|&byte| !byte).collect()
}

#[test]
fn a_bounded_wait_on_a_full_ring_times_out_taking_nothing_and_a_freed_slot_is_returned() {
    let ring = inverting_ring(1, None);
    ring.fill_outputs(0xa5).unwrap();
    let (first, seed) = random_frame(64);
    println!("seed {seed}");
    submit_frame(&ring, &first);
    let started = Instant::now();
    assert!(ring.next_input_within(Some(Duration::from_millis(100))).unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(100), "gave up early: {:?}", started.elapsed());
    assert!(ring.next_input_within(Some(Duration::ZERO)).unwrap().is_none());
    // Nothing was taken: the ring still holds frame 0 alone, intact, and refuses input.
    assert_eq!((ring.submitted(), ring.drained()), (1, 0));
    assert!(matches!(ring.try_next_input(), Err(Error::WouldBlock(_))));
    let (second, _) = random_frame(64);
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let mut slot =
                ring.next_input_within(Some(Duration::from_secs(20))).unwrap().expect("a slot came free");
            let got = Instant::now();
            assert_eq!(slot.index(), 1);
            slot.input_mut(0).unwrap().copy_from_slice(&second);
            slot.submit();
            got
        });
        std::thread::sleep(Duration::from_millis(150));
        let output = ring.next_output_within(Some(Duration::ZERO)).unwrap().expect("frame 0 is done");
        assert_eq!(output.index(), 0);
        assert_eq!(&output[..], &inverted(&first)[..]);
        let freed = Instant::now();
        drop(output);
        let got = waiting.join().unwrap();
        // Only the release frees the slot; woken by it, not by the 20 s wait running out.
        assert!(got >= freed, "a slot came before one was freed");
        assert!(got - freed < Duration::from_secs(10), "woken {:?} after the release", got - freed);
    });
    assert_eq!(&ring.next_output().unwrap()[..], &inverted(&second)[..]);
}

#[test]
fn a_bounded_wait_on_an_empty_ring_times_out_taking_nothing_and_a_submitted_frame_is_returned() {
    let ring = inverting_ring(2, None);
    ring.fill_outputs(0xa5).unwrap();
    let started = Instant::now();
    assert!(ring.next_output_within(Some(Duration::from_millis(100))).unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(100), "gave up early: {:?}", started.elapsed());
    assert_eq!((ring.submitted(), ring.drained()), (0, 0));
    let (frame, seed) = random_frame(64);
    println!("seed {seed}");
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let output =
                ring.next_output_within(Some(Duration::from_secs(20))).unwrap().expect("frame 0 came");
            (output.index(), output.to_vec(), Instant::now())
        });
        std::thread::sleep(Duration::from_millis(150));
        let submitting = Instant::now();
        submit_frame(&ring, &frame);
        let (index, bytes, got) = waiting.join().unwrap();
        assert_eq!((index, bytes), (0, inverted(&frame)));
        // Woken by the submission, not by the 20 s wait running out.
        assert!(
            got - submitting < Duration::from_secs(10),
            "woken {:?} after the submission",
            got - submitting
        );
    });
    assert_eq!((ring.submitted(), ring.drained()), (1, 1));
    // A close ends a bounded wait as it ends a blocking one.
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let taken = ring.next_output_within(Some(Duration::from_secs(20))).map(|frame| frame.is_some());
            (taken, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(50));
        let closing = Instant::now();
        ring.close();
        let (taken, ended) = waiting.join().unwrap();
        assert!(matches!(taken, Err(Error::RingClosed)));
        assert!(ended - closing < Duration::from_secs(10), "woken {:?} after the close", ended - closing);
    });
    assert!(matches!(ring.next_input_within(Some(Duration::from_secs(20))), Err(Error::RingClosed)));
}

/// Async completions: a task awaits each frame without blocking its runtime's only
/// thread, whether the frame is still on the GPU (a fence through the poller) or not yet
/// submitted (woken by the producer).
#[test]
fn frames_can_be_awaited_in_order() {
    on_every_backend("frames_can_be_awaited_in_order", |device| {
        let kernel = Gaussian::new(None, None, Border::Reflect101).unwrap();
        let format = FrameFormat::new(640, 360, PixelLayout::Rgb).unwrap();
        let strategy = Strategy::Auto.resolve(device);
        let ring = FrameRing::new(device, strategy, format, &kernel, RingOptions::default()).unwrap();
        ring.fill_outputs(0xA5).unwrap();
        let inputs: Vec<(Vec<u8>, u64)> = (0..12).map(|_| random_frame(format.frame_bytes())).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        // A ticking task on the runtime's thread: the producer submits a frame only once the
        // ticker has ticked since the last one, so while the consumer awaits a frame not yet
        // submitted, the ticker must run. A blocking await would stall the producer, which
        // gives up after a while and says so.
        let ticks = std::sync::Arc::new(AtomicU64::new(0));
        let stalled = AtomicU64::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for (input, _) in &inputs {
                    let seen = ticks.load(Ordering::Acquire);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while ticks.load(Ordering::Acquire) == seen {
                        if Instant::now() > deadline {
                            stalled.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    let mut slot = ring.next_input().unwrap();
                    slot.copy_from_slice(input);
                    slot.submit();
                }
            });
            runtime.block_on(async {
                let counter = std::sync::Arc::clone(&ticks);
                let ticker = tokio::spawn(async move {
                    loop {
                        counter.fetch_add(1, Ordering::Release);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
                for (index, (input, seed)) in inputs.iter().enumerate() {
                    let output = ring.next_output_async().await.unwrap();
                    assert_eq!(output.index(), index as u64);
                    let mut want = vec![0u8; input.len()];
                    gaussian_cpu(&format, &kernel, input, &mut want).unwrap();
                    assert_eq!(
                        first_mismatch(&output, &want),
                        None,
                        "{strategy}: frame {index}, seed {seed:#x}"
                    );
                }
                ticker.abort();
            });
        });
        assert_eq!(
            stalled.load(Ordering::Relaxed),
            0,
            "the runtime's thread was blocked while awaiting a frame"
        );
    });
}

#[test]
fn a_ring_refuses_what_the_filter_refuses() {
    let cpu = crate::support::cpu_device();
    let tiny = FrameFormat::new(7, 3, PixelLayout::Rgb).unwrap();
    // A kernel wider than the frame is no reason to refuse: its borders fold.
    let wide = Gaussian::new(Some(9), None, Border::Reflect101).unwrap();
    assert!(FrameRing::new(&cpu, Strategy::Auto, tiny, &wide, RingOptions::default()).is_ok());
    let kernel = Gaussian::new(None, None, Border::Reflect101).unwrap();
    let error = FrameRing::new(&cpu, Strategy::ZeroCopy, tiny, &kernel, RingOptions::default()).unwrap_err();
    assert!(error.to_string().contains("needs a GPU"), "{error}");
    let none = RingOptions { slots: 0, ..RingOptions::default() };
    assert!(FrameRing::new(&cpu, Strategy::Cpu, tiny, &kernel, none).is_err());
}
