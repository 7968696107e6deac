//! `cross_process` end to end: a small run of both rings on each backend, the producer a child
//! process (this test binary again, in the `ring-producer` role); and producers that break the
//! stream (other frames, too few frames) caught by the consumer's checks.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
use hetmem::{Device, Strategy};
use hetmem_bench::BenchError;
use hetmem_bench::cross_process::{CrossProcessSetup, ProducerPlan, measure, produce};

use crate::support::{CHILD_ENV, child_role, cpu_device, on_every_backend};

/// The child's socket and plan, as `SOCKET PLAN...` separated by spaces.
const PRODUCER_ARGS_ENV: &str = "HETMEM_TEST_RING_PRODUCER";

/// Starts this binary as the producer of `plan` on `socket`.
fn spawn_producer(socket: &Path, plan: &ProducerPlan) -> std::io::Result<Child> {
    let args = std::iter::once(socket.to_str().expect("a UTF-8 temporary path").to_string())
        .chain(plan.to_args())
        .collect::<Vec<_>>()
        .join(" ");
    Command::new(std::env::current_exe()?)
        .args(["bench_cross_process::ring_producer_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "ring-producer")
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
