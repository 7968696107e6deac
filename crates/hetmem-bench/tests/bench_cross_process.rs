//! `cross_process` end to end: a small run of both rings on each backend, the producer a child
//! process (this test binary again, in the `ring-producer` role); and producers that break the
//! stream (other frames, too few frames) caught by the consumer's checks.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::pipeline::shared_ring::RingProducer;
use hetmem::{Device, Strategy};
use hetmem_bench::BenchError;
use hetmem_bench::cross_process::{CrossProcessSetup, FrameContent, ProducerPlan, measure, produce};

use crate::support::{CHILD_ENV, child_role, cpu_device, on_every_backend};

/// The child's socket and plan, as `SOCKET PLAN...` separated by spaces.
const PRODUCER_ARGS_ENV: &str = "HETMEM_TEST_RING_PRODUCER";

/// Starts this binary as the producer of `plan` on `socket`.
fn spawn_producer(socket: &Path, plan: &ProducerPlan) -> std::io::Result<Child> {
    spawn_child("ring_producer_child", "ring-producer", socket, plan)
}

/// Starts this binary in `role`, its test `test`, with `socket` and `plan` as arguments.
fn spawn_child(test: &str, role: &str, socket: &Path, plan: &ProducerPlan) -> std::io::Result<Child> {
    let args = std::iter::once(socket.to_str().expect("a UTF-8 temporary path").to_string())
        .chain(plan.to_args())
        .collect::<Vec<_>>()
        .join(" ");
    Command::new(std::env::current_exe()?)
        .args([&format!("bench_cross_process::{test}"), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(PRODUCER_ARGS_ENV, args)
        .stdout(Stdio::null())
        .spawn()
}

/// The producer process of the tests here; a test of its own only when started by them.
#[test]
fn ring_producer_child() {
    if child_role().as_deref() != Some("ring-producer") {
        return;
    }
    let args: Vec<String> = std::env::var(PRODUCER_ARGS_ENV).unwrap().split(' ').map(String::from).collect();
    produce(Path::new(&args[0]), &ProducerPlan::parse(&args[1..]).unwrap()).unwrap();
}

fn setup(strategy: Strategy) -> CrossProcessSetup {
    CrossProcessSetup {
        strategy,
        format: FrameFormat::new(96, 40, PixelLayout::Rgb).unwrap(),
        slots: 3,
        frames: 20,
        latency_frames: 5,
        checked: 2,
        seed: hetmem_bench::random::fresh_seed(),
        producer_timeout: Duration::from_secs(60),
    }
}

fn kernel() -> Gaussian {
    Gaussian::new(Some(2), None, Border::Reflect101).unwrap()
}

#[test]
fn both_rings_stream_checked_frames_on_every_backend() {
    on_every_backend("both_rings_stream_checked_frames_on_every_backend", |device: &Device| {
        let strategies = match device.gpu_ordinal() {
            Some(_) => vec![Strategy::ZeroCopy, Strategy::PinnedAsync],
            None => vec![Strategy::Cpu],
        };
        for strategy in strategies {
            let setup = setup(strategy);
            eprintln!("{strategy} on {}: seed {}", device.name(), setup.seed);
            let run = measure(device, &kernel(), &setup, &mut spawn_producer).unwrap();
            assert_eq!((run.strategy, run.frames, run.slots), (strategy, 20, 3));
            assert_eq!((run.frame_bytes, run.checked_outputs), (96 * 40 * 3, 3 + 2));
            for figures in [&run.cross_process, &run.single_process] {
                assert!(figures.frames_per_s.is_finite() && figures.frames_per_s > 0.0, "{figures:?}");
                assert_eq!(figures.latency_us.samples, 5);
                assert!(figures.latency_us.min > 0.0 && figures.latency_us.min <= figures.latency_us.median);
            }
            assert!(run.throughput_ratio > 0.0 && run.latency_difference_us.is_finite(), "{run:?}");
        }
    });
}

/// Runs the bench with a producer whose plan `damage` changed from the one agreed.
fn with_broken_producer(damage: impl Fn(&mut ProducerPlan)) -> BenchError {
    let mut spawn = |socket: &Path, plan: &ProducerPlan| {
        let mut plan = *plan;
        damage(&mut plan);
        spawn_producer(socket, &plan)
    };
    measure(&cpu_device(), &kernel(), &setup(Strategy::Cpu), &mut spawn).unwrap_err()
}

#[test]
fn frames_other_than_the_agreed_ones_are_caught() {
    let error = with_broken_producer(|plan| plan.seed ^= 1);
    assert!(matches!(error, BenchError::ResultMismatch { .. }), "{error}");
    assert!(error.to_string().contains("frame 0 came as frame 0"), "{error}");
}

#[test]
fn a_producer_that_stops_early_is_caught() {
    // 3 slots + 20 timed frames streamed, then 5 one at a time: frames 0 to 27.
    let error = with_broken_producer(|plan| {
        plan.streamed -= 1;
        plan.one_at_a_time = 0;
    });
    assert!(error.to_string().contains("closed the stream before frame 22"), "{error}");
    let error = with_broken_producer(|plan| plan.one_at_a_time -= 1);
    assert!(error.to_string().contains("closed the stream before frame 27"), "{error}");
}

/// A producer that connects, makes the ring its plan says (the tests change it from the one
/// agreed), publishes its first `streamed` frames, then stays alive and silent: what a hung
/// capture process looks like to the consumer.
#[test]
fn silent_producer_child() {
    if child_role().as_deref() != Some("silent-producer") {
        return;
    }
    let args: Vec<String> = std::env::var(PRODUCER_ARGS_ENV).unwrap().split(' ').map(String::from).collect();
    let plan = ProducerPlan::parse(&args[1..]).unwrap();
    let ring_socket = std::os::unix::net::UnixStream::connect(&args[0]).unwrap();
    let _control = std::os::unix::net::UnixStream::connect(&args[0]).unwrap();
    let mut ring =
        RingProducer::create(&Device::cpu(), &ring_socket, plan.frame_bytes, plan.slots, Default::default())
            .unwrap();
    let content = FrameContent::new(plan.seed, plan.frame_bytes);
    for index in 0..plan.streamed {
        let mut slot = ring.next_slot().unwrap();
        slot.write_at(0, &content.frame(index)).unwrap();
        slot.publish();
    }
    std::thread::sleep(Duration::from_secs(600));
}

/// Runs the bench on the CPU with a silent producer whose plan `damage` changed.
fn with_silent_producer(producer_timeout: Duration, damage: impl Fn(&mut ProducerPlan)) -> (BenchError, f64) {
    let mut spawn = |socket: &Path, plan: &ProducerPlan| {
        let mut plan = *plan;
        damage(&mut plan);
        spawn_child("silent_producer_child", "silent-producer", socket, &plan)
    };
    let setup = CrossProcessSetup { producer_timeout, ..setup(Strategy::Cpu) };
    let started = Instant::now();
    let error = measure(&cpu_device(), &kernel(), &setup, &mut spawn).unwrap_err();
    (error, started.elapsed().as_secs_f64())
}

#[test]
fn a_producer_alive_but_silent_is_an_error_within_the_producer_timeout() {
    // It waited for ever: the ring only notices a producer that exits.
    let (error, took) = with_silent_producer(Duration::from_millis(500), |plan| plan.streamed = 0);
    let text = error.to_string();
    assert!(text.contains("sent no frame 0 within 500ms") && text.contains("stuck"), "{text}");
    assert!((0.45..30.0).contains(&took), "{took} s");
    // Silent after the first frames, mid-stream.
    let (error, _) = with_silent_producer(Duration::from_millis(300), |plan| plan.streamed = 2);
    assert!(error.to_string().contains("sent no frame 2 within 300ms"), "{error}");
}

#[test]
fn a_producer_ring_of_another_shape_is_refused_naming_both() {
    let (error, _) = with_silent_producer(Duration::from_secs(60), |plan| plan.slots += 1);
    let text = error.to_string();
    assert!(text.contains("4 slots of 11520 bytes where 3 slots of 11520 bytes were agreed"), "{text}");
    let (error, _) = with_silent_producer(Duration::from_secs(60), |plan| plan.frame_bytes -= 8);
    assert!(error.to_string().contains("3 slots of 11512 bytes where 3 slots of 11520"), "{error}");
}

#[test]
fn a_producer_timeout_of_zero_is_refused() {
    let setup = CrossProcessSetup { producer_timeout: Duration::ZERO, ..setup(Strategy::Cpu) };
    let error = measure(&cpu_device(), &kernel(), &setup, &mut spawn_producer).unwrap_err();
    assert!(error.to_string().contains("producer timeout of 0"), "{error}");
}
