//! The doorbell: replies bit-exact with the CPU reference on random data, a bounded queue, the
//! watchdog on a request that never finishes, clean shutdown, and the resident-kernel rules.
//! On the GPU each check runs in a child process: while the persistent kernel runs, hetmem
//! refuses module loads and device synchronisation, which would fail tests running beside it.

use std::time::{Duration, Instant};

use hetmem::resident::doorbell::{MAX_SAMPLES, MAX_TAPS};
use hetmem::resident::{Doorbell, DoorbellOptions, Request};
use hetmem::{Device, DeviceBuf, Error, HostBuf, PinOptions, Queue};

use crate::support::{POISON, first_mismatch, on_cpu_then_gpu_child, random_words};

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
                // Half small enough to travel in the slot's lines (taps and samples at most
                // 26 words, replies at most 27), half anywhere up to the limits.
                let (len, taps) = if rng.bool() {
                    (rng.usize(1..=28), rng.usize(1..=4))
                } else {
                    (rng.usize(1..=MAX_SAMPLES), rng.usize(1..=MAX_TAPS))
                };
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

/// Runs `check` on the CPU here, and on the GPU in a child process (skipping without a GPU).
fn on_both(test: &str, role: &str, check: fn(&Device)) {
    on_cpu_then_gpu_child(&format!("doorbell::{test}"), role, check);
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
    // The wedge outlasts any stall a loaded test machine puts between these lines: a wedge
    // that ended before the shutdown began would let the server stop in time.
    let submitted = Instant::now();
    drop(bell.submit(Request::Wedge { millis: 20_000 }).unwrap());
    let start = Instant::now();
    let stopped = bell.shutdown();
    let waited = start.elapsed();
    assert!(
        matches!(stopped, Err(Error::DoorbellStuck { .. })),
        "{stopped:?} after {waited:?}, {:?} after the submission",
        submitted.elapsed()
    );
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

/// A kernel no other code loads, so that its load in [`resident_kernel_rules`] is a first one.
static NOT_YET_LOADED: hetmem::kernels::KernelSource = hetmem::kernels::KernelSource {
    name: "doorbell-test-not-yet-loaded",
    source: "extern \"C\" __global__ void not_yet_loaded(unsigned int* out) { *out = 1; }",
    entry_points: &["not_yet_loaded"],
    options: &[],
    // Where no NVRTC is installed the load takes this PTX, as hetmem's own kernels do.
    ptx: Some(
        ".version 8.0\n.target sm_70\n.address_size 64\n\
         .visible .entry not_yet_loaded(.param .u64 out)\n{\n\
         .reg .b32 %r<2>;\n.reg .b64 %rd<3>;\n\
         ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd2, %rd1;\n\
         mov.u32 %r1, 1;\nst.global.u32 [%rd2], %r1;\nret;\n}\n",
    ),
};

/// While a doorbell runs, a free that would wait for it is deferred (the call returns, the
/// memory stays allocated until shutdown), a first kernel load and a device synchronisation
/// fail at once naming the cause, and other GPU work goes on. Before hetmem enforced this,
/// the drop below hung until the doorbell stopped, and a load or synchronisation for ever.
fn resident_kernel_rules(device: &Device) {
    let Some(gpu) = device.as_cuda() else { return };
    // A hang is the failure this test looks for: end the child instead of waiting for ever.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("resident_kernel_rules: still running after 60 s: a call waited for the doorbell");
        std::process::exit(3);
    });
    hetmem::kernels::kernel(gpu, &hetmem::kernels::AFFINE, "affine_u32").unwrap();
    // Free memory is the whole GPU's, and the tests beside this child's parent allocate and
    // free meanwhile (up to about 1 GiB at once): the deferred buffer is far larger than that,
    // and each check allows half of it. A 512 MiB buffer let that noise fail the check on the
    // H200 when kernels compiled slowly (an empty kernel cache).
    let big_bytes = (gpu.total_memory() / 8).clamp(512 << 20, 8 << 30);
    let big = DeviceBuf::<u8>::new(device, big_bytes as usize).unwrap();
    // Another open of the same device (a library of its own, a second `CudaDevice::open`) must
    // see the doorbell too.
    let other_open = Device::Cuda(hetmem::backend::cuda::CudaDevice::open(gpu.ordinal()).unwrap());
    let big_elsewhere = DeviceBuf::<u8>::new(&other_open, big_bytes as usize).unwrap();
    let bell = Doorbell::start(device, 4).unwrap();
    let free_before = gpu.memory_info().unwrap().0;
    drop(big);
    let free_deferred = gpu.memory_info().unwrap().0;
    assert!(
        free_deferred < free_before + big_bytes / 2,
        "the free ran while the doorbell ran: {free_before} -> {free_deferred} bytes free"
    );
    match hetmem::kernels::kernel(gpu, &NOT_YET_LOADED, "not_yet_loaded") {
        Err(Error::ResidentKernelRunning { call: "cuModuleLoadData", running: 1 }) => {}
        other => panic!("a first kernel load should be refused while the doorbell runs, got {other:?}"),
    }
    let refused = gpu.synchronize().unwrap_err().to_string();
    assert!(refused.contains("cuCtxSynchronize") && refused.contains("shut it down"), "{refused}");
    let refused = other_open.as_cuda().unwrap().synchronize().unwrap_err().to_string();
    assert!(
        refused.contains("cuCtxSynchronize"),
        "another open of the device waited for the doorbell: {refused}"
    );
    drop(big_elsewhere);
    let free_deferred_elsewhere = gpu.memory_info().unwrap().0;
    assert!(
        free_deferred_elsewhere < free_deferred + big_bytes / 2,
        "a free through another open ran while the doorbell ran: {free_deferred} -> {free_deferred_elsewhere}"
    );
    // Allocating, pinning, launching and copying on another queue go on meanwhile.
    let queue = Queue::new(device).unwrap();
    let data = random_words(1 << 20);
    let mut input = HostBuf::<u32>::pinned(device, data.len(), PinOptions::default()).unwrap();
    input.as_mut_slice().copy_from_slice(&data);
    let mut output = HostBuf::<u32>::pinned(device, data.len(), PinOptions::default()).unwrap();
    output.as_mut_slice().fill(POISON);
    let (input, mut output) = (queue.share(input), queue.lend(output));
    hetmem::ops::affine_u32(&queue, &input, &mut output, 7, 3).unwrap();
    let output = output.reclaim().unwrap();
    let mut want = vec![0; data.len()];
    hetmem::ops::affine_u32_cpu(&data, &mut want, 7, 3);
    assert_eq!(first_mismatch(output.as_slice(), &want), None);
    drop((input, output));
    let samples: Vec<f32> = (0..256).map(|i| i as f32 * 0.5 - 3.0).collect();
    let request = Request::Gain { gain: 1.5, samples: &samples };
    assert_eq!(bits(&bell.call(request).unwrap()), bits(&request.reference()));
    bell.shutdown().unwrap();
    // The deferred frees ran at shutdown.
    let free_after = gpu.memory_info().unwrap().0;
    // Both buffers, each allowed half its size of noise.
    assert!(
        free_after >= free_deferred_elsewhere + big_bytes,
        "the deferred frees did not run at shutdown: {free_deferred_elsewhere} -> {free_after} bytes free"
    );
    gpu.synchronize().unwrap();
    hetmem::kernels::kernel(gpu, &NOT_YET_LOADED, "not_yet_loaded").unwrap();
    println!("resident kernel rules: free deferred, load and synchronise refused, other work went on");
}

#[test]
fn a_running_doorbell_defers_frees_and_refuses_calls_that_would_wait_for_it() {
    on_both(
        "a_running_doorbell_defers_frees_and_refuses_calls_that_would_wait_for_it",
        "resident",
        resident_kernel_rules,
    );
}
