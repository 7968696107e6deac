//! The doorbell: replies bit-exact with the CPU reference on random data, a bounded queue, the
//! watchdog on a request that never finishes, clean shutdown. On the GPU each check runs in a
//! child process: while the persistent kernel runs, another test's device-synchronising call
//! (freeing memory) would wait for it.

use std::time::{Duration, Instant};

use hetmem::handoff::doorbell::{DoorbellOptions, MAX_SAMPLES, MAX_TAPS};
use hetmem::handoff::{Doorbell, Request};
use hetmem::{Device, Error};

use crate::support::{child_role, cpu_device, run_child};

/// `len` random samples in [-1, 1) from a fresh seed, printed for replay.
fn random_samples(rng: &mut fastrand::Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.f32() * 2.0 - 1.0).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|value| value.to_bits()).collect()
}

/// Many random gain and FIR requests, several queued at once, each reply bit-exact.
fn replies_match_the_cpu(device: &Device) {
    let seed = fastrand::u64(..);
    eprintln!("doorbell replies: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let bell = Doorbell::start(device, 8).unwrap();
    for round in 0..200 {
        let batch: Vec<(Vec<f32>, Vec<f32>, f32)> = (0..rng.usize(1..=8))
            .map(|_| {
                let (len, taps) = (rng.usize(1..=MAX_SAMPLES), rng.usize(1..=MAX_TAPS));
                let samples = random_samples(&mut rng, len);
                let taps = random_samples(&mut rng, taps);
                (samples, taps, rng.f32() * 4.0 - 2.0)
            })
            .collect();
        let requests: Vec<Request<'_>> = batch
            .iter()
            .enumerate()
            .map(|(i, (samples, taps, gain))| {
                if i % 2 == 0 {
                    Request::Fir { taps, samples }
                } else {
                    Request::Gain { gain: *gain, samples }
                }
            })
            .collect();
        let tickets: Vec<_> = requests.iter().map(|request| bell.submit(*request).unwrap()).collect();
        for (ticket, request) in tickets.into_iter().zip(&requests) {
            let got = ticket.wait().unwrap();
            assert_eq!(bits(&got), bits(&request.reference()), "round {round}, seed {seed:#x}: {request:?}");
        }
    }
    bell.shutdown().unwrap();
}

/// A full queue refuses or waits; the watchdog turns a request that never finishes into an
/// error naming it; shutdown still ends the server.
fn queue_and_watchdog(device: &Device) {
    let options = DoorbellOptions { depth: 2, timeout: Duration::from_millis(300) };
    let bell = Doorbell::start_with(device, options).unwrap();
    let samples = [1.5f32; 16];
    let first = bell.submit(Request::Gain { gain: 2.0, samples: &samples }).unwrap();
    let second = bell.submit(Request::Gain { gain: 3.0, samples: &samples }).unwrap();
    // Both slots hold tickets not yet waited on.
    assert!(matches!(
        bell.try_submit(Request::Gain { gain: 1.0, samples: &samples }),
        Err(Error::WouldBlock(_))
    ));
    assert_eq!(first.wait().unwrap(), [3.0f32; 16]);
    assert_eq!(second.wait().unwrap(), [4.5f32; 16]);

    let stalled = bell.submit(Request::Stall).unwrap();
    let sequence = stalled.sequence();
    let start = Instant::now();
    match stalled.wait() {
        Err(Error::DoorbellTimeout { sequence: named, .. }) => assert_eq!(named, sequence),
        other => panic!("the watchdog did not fire: {other:?}"),
    }
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5), "{waited:?}");
    // Behind the stalled request, a new one times out too (its slot's server never gets there).
    let behind = bell.submit(Request::Gain { gain: 1.0, samples: &samples }).unwrap();
    assert!(matches!(behind.wait(), Err(Error::DoorbellTimeout { .. })));
    bell.shutdown().unwrap();
}

fn bad_requests_are_refused(device: &Device) {
    let bell = Doorbell::start(device, 4).unwrap();
    let long = vec![0.5f32; MAX_SAMPLES + 1];
    assert!(bell.submit(Request::Gain { gain: 1.0, samples: &long }).is_err());
    assert!(bell.submit(Request::Gain { gain: 1.0, samples: &[] }).is_err());
    assert!(bell.submit(Request::Fir { taps: &[0.5; MAX_TAPS + 1], samples: &[1.0] }).is_err());
    assert!(Doorbell::start(device, 3).is_err(), "depth not a power of two");
    // The doorbell still works after refusing.
    assert_eq!(bell.call(Request::Fir { taps: &[1.0, 0.5], samples: &[2.0, 4.0] }).unwrap(), [2.0, 5.0]);
}

fn async_wait(device: &Device) {
    let bell = Doorbell::start(device, 4).unwrap();
    let samples: Vec<f32> = (0..64).map(|i| i as f32 - 20.25).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let got = runtime.block_on(async {
        let ticket = bell.submit(Request::Gain { gain: -0.75, samples: &samples }).unwrap();
        ticket.wait_async().await
    });
    assert_eq!(bits(&got.unwrap()), bits(&Request::Gain { gain: -0.75, samples: &samples }.reference()));
    bell.shutdown().unwrap();
}

fn gpu_device() -> Device {
    Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap())
}

/// Runs `check` on the CPU here, and on the GPU in a child process (skipping without a GPU).
fn on_both(test: &str, role: &str, check: fn(&Device)) {
    if child_role().as_deref() == Some(role) {
        return check(&gpu_device());
    }
    check(&cpu_device());
    if hetmem::testing::cuda_device_or_skip(test).is_none() {
        return;
    }
    let output = run_child(&format!("doorbell::{test}"), role);
    assert!(
        output.status.success(),
        "the GPU child failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn doorbell_replies_are_bit_exact_with_the_cpu() {
    on_both("doorbell_replies_are_bit_exact_with_the_cpu", "replies", replies_match_the_cpu);
}

#[test]
fn doorbell_queue_is_bounded_and_the_watchdog_fires() {
    on_both("doorbell_queue_is_bounded_and_the_watchdog_fires", "watchdog", queue_and_watchdog);
}

#[test]
fn doorbell_refuses_bad_requests() {
    on_both("doorbell_refuses_bad_requests", "refuses", bad_requests_are_refused);
}

#[test]
fn doorbell_replies_can_be_awaited() {
    on_both("doorbell_replies_can_be_awaited", "async", async_wait);
}

/// Shutting down a server that does not stop returns an error within the timeout (its memory
/// leaked, never freed under it) instead of hanging.
fn stuck_shutdown_is_bounded(device: &Device) {
    let options = DoorbellOptions { depth: 2, timeout: Duration::from_millis(300) };
    let bell = Doorbell::start_with(device, options).unwrap();
    drop(bell.submit(Request::Wedge { millis: 2500 }).unwrap());
    let start = Instant::now();
    let stopped = bell.shutdown();
    let waited = start.elapsed();
    assert!(matches!(stopped, Err(Error::DoorbellStuck { .. })), "{stopped:?}");
    assert!(waited < Duration::from_secs(2), "shutdown waited {waited:?}");
}

#[test]
fn doorbell_shutdown_of_a_stuck_server_is_bounded() {
    on_both("doorbell_shutdown_of_a_stuck_server_is_bounded", "stuck", stuck_shutdown_is_bounded);
}

/// Several threads share one doorbell: each gets its own replies, in its own order.
fn threads_share_a_doorbell(device: &Device) {
    let bell = Doorbell::start(device, 4).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4u32 {
            let bell = &bell;
            scope.spawn(move || {
                let mut rng = fastrand::Rng::new();
                for round in 0..300 {
                    let samples = random_samples(&mut rng, 1 + round % 64);
                    let gain = thread as f32 + 0.5;
                    let request = Request::Gain { gain, samples: &samples };
                    assert_eq!(
                        bits(&bell.call(request).unwrap()),
                        bits(&request.reference()),
                        "thread {thread}, round {round}"
                    );
                }
            });
        }
    });
    bell.shutdown().unwrap();
}

#[test]
fn doorbell_is_shared_by_threads() {
    on_both("doorbell_is_shared_by_threads", "threads", threads_share_a_doorbell);
}
