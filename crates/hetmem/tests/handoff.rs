//! The hand-off's run-time promises: guard mode faults stray CPU accesses, awaiting a lease does
//! not block an async runtime, and misuse gets clear errors.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hetmem::backend::cuda::raw::{RegisterFlags, Registration};
use hetmem::memory::{HostBuf, PageBox, PinOptions};
use hetmem::ops::affine_u32;
use hetmem::resident::Gate;
use hetmem::testing::cuda_device_or_skip;
use hetmem::{Device, Error, FenceKind, Queue, handoff::KernelArgs};

use crate::support::{
    POISON, assert_child_passes, child_role, cpu_device, first_mismatch, random_words, run_child,
};

/// In a child: lends a buffer (guarded or not) and writes it through a raw pointer kept from
/// before the lend, as buggy unsafe code or FFI might.
fn stray_write_child(guarded: bool) {
    let device = match std::env::var("HETMEM_TEST_BACKEND").as_deref() {
        Ok("cuda") => Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap()),
        _ => cpu_device(),
    };
    let queue = Queue::new(&device).unwrap();
    let mut buf = HostBuf::<u32>::pinned(&device, 4096, PinOptions::default()).unwrap();
    let raw = buf.as_mut_slice().as_mut_ptr();
    let lent = if guarded { queue.lend_guarded(buf).unwrap() } else { queue.lend(buf) };
    println!("about to write through a stale pointer");
    // SAFETY: deliberately none: this is the bug guard mode exists to catch. Without the guard
    // the write lands in memory that is still allocated (the lease holds it), so the unguarded
    // control run is a data race in principle but not a crash.
    unsafe { raw.write_volatile(7) };
    println!("the write went through");
    drop(lent);
}

fn check_stray_write(test: &str, backend: &str) {
    let run = |role: &str| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(crate::support::CHILD_ENV, role)
            .env("HETMEM_TEST_BACKEND", backend);
        command.output().unwrap()
    };
    let guarded = run("guarded");
    let stdout = String::from_utf8_lossy(&guarded.stdout);
    assert!(stdout.contains("about to write"), "the child never reached the write: {stdout}");
    assert!(!stdout.contains("the write went through"), "{stdout}");
    assert_eq!(guarded.status.signal(), Some(libc_sigsegv()), "expected SIGSEGV, got {:?}", guarded.status);
    let control = run("unguarded");
    assert!(control.status.success(), "the unguarded control run failed: {control:?}");
    assert!(String::from_utf8_lossy(&control.stdout).contains("the write went through"));
}

fn libc_sigsegv() -> i32 {
    rustix::process::Signal::SEGV.as_raw()
}

#[test]
fn a_stray_cpu_write_to_a_guarded_buffer_faults() {
    const TEST: &str = "handoff::a_stray_cpu_write_to_a_guarded_buffer_faults";
    match child_role().as_deref() {
        Some("guarded") => return stray_write_child(true),
        Some("unguarded") => return stray_write_child(false),
        _ => {}
    }
    check_stray_write(TEST, "cpu");
    if cuda_device_or_skip("a_stray_cpu_write_to_a_guarded_buffer_faults").is_some() {
        check_stray_write(TEST, "cuda");
    }
}

#[test]
fn awaiting_a_lease_does_not_block_the_runtime() {
    const TEST: &str = "handoff::awaiting_a_lease_does_not_block_the_runtime";
    if child_role().as_deref() == Some("await") {
        return await_child();
    }
    if cuda_device_or_skip("awaiting_a_lease_does_not_block_the_runtime").is_none() {
        return;
    }
    // In a process of its own: while the gate's kernel waits, any thread's call that
    // synchronises the device (freeing, registering) waits for it, and a test running beside
    // this one could stall it until the watchdog fires.
    assert_child_passes(TEST, "await");
}

fn await_child() {
    let device = Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap());
    for kind in [FenceKind::Flag, FenceKind::Event, FenceKind::HostCallback] {
        let queue = Queue::with_fence_kind(&device, kind).unwrap();
        let gate = Arc::new(Gate::new(&queue).unwrap());
        let data = random_words(1 << 16);
        let mut input = HostBuf::<u32>::pinned(&device, data.len(), PinOptions::default()).unwrap();
        input.as_mut_slice().copy_from_slice(&data);
        let mut output = HostBuf::<u32>::pinned(&device, data.len(), PinOptions::default()).unwrap();
        output.as_mut_slice().fill(POISON);
        let input = queue.share(input);
        let mut output = queue.lend(output);
        // Compile and load the affine kernel before the gate holds the GPU.
        hetmem::kernels::kernel(queue.cuda_device().unwrap(), &hetmem::kernels::AFFINE, "affine_u32")
            .unwrap();

        // If the await blocked the runtime's only thread, the opener would never run: a
        // watchdog then opens the gate after 20 s so the test fails instead of hanging.
        let blocked = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let (gate, blocked, finished) = (Arc::clone(&gate), Arc::clone(&blocked), Arc::clone(&finished));
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    if finished.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                blocked.store(true, Ordering::SeqCst);
                gate.open();
            })
        };
        // The kernel waits on the gate, so the affine kernel queued after it cannot finish
        // until the gate opens; only a task on the same single-threaded runtime opens it.
        gate.launch().unwrap();
        affine_u32(&queue, &input, &mut output, 5, 9).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let output = runtime.block_on(async {
            let opener = {
                let gate = Arc::clone(&gate);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    gate.open();
                })
            };
            let output = output.reclaim_async().await.unwrap();
            opener.await.unwrap();
            output
        });
        finished.store(true, Ordering::SeqCst);
        watchdog.join().unwrap();
        assert!(!blocked.load(Ordering::SeqCst), "{kind:?}: awaiting blocked the runtime");
        let mut want = vec![0; data.len()];
        hetmem::ops::affine_u32_cpu(&data, &mut want, 5, 9);
        assert_eq!(first_mismatch(output.as_slice(), &want), None, "{kind:?}");
        println!("{kind:?}: awaited without blocking");
    }
    dropping_a_lease_waits_for_the_gpu(&device);
}

/// A host-callback fence's eventfd is readable once, and only once, its work has finished, and
/// with the `tokio` feature the fence is awaited on tokio's reactor without blocking it.
#[test]
fn a_host_callback_fence_is_polled_by_its_eventfd_and_awaited_on_tokio() {
    const TEST: &str = "handoff::a_host_callback_fence_is_polled_by_its_eventfd_and_awaited_on_tokio";
    if child_role().as_deref() == Some("eventfd") {
        return eventfd_child();
    }
    if cuda_device_or_skip(TEST).is_none() {
        return;
    }
    // In a process of its own, as the await test above: the gate holds the GPU.
    assert_child_passes(TEST, "eventfd");
}

/// Whether `fd` becomes readable within `timeout`.
fn readable_within(fd: &impl std::os::fd::AsFd, timeout: Duration) -> bool {
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let timeout = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() == 1
}

fn eventfd_child() {
    let device = Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap());
    let queue = Queue::with_fence_kind(&device, FenceKind::HostCallback).unwrap();
    let gate = Arc::new(Gate::new(&queue).unwrap());
    gate.launch().unwrap();
    let fence = queue.signal().unwrap();
    let fd = fence.eventfd().expect("a host-callback fence has an eventfd");
    gate.wait_started();
    assert!(!readable_within(&fd, Duration::from_millis(50)), "readable while the kernel waits");
    assert!(!fence.is_complete().unwrap());
    gate.open();
    assert!(readable_within(&fd, Duration::from_secs(20)), "never readable after the kernel ended");
    assert!(fence.is_complete().unwrap());
    println!("the eventfd became readable when the kernel ended");
    #[cfg(feature = "tokio")]
    awaited_on_tokio(&queue, &gate);
}

/// The fence awaited by `Fence::wait_tokio` on a single-threaded runtime, whose other task
/// opens the gate: an await that blocked the thread would leave the gate to a watchdog.
#[cfg(feature = "tokio")]
fn awaited_on_tokio(queue: &Queue, gate: &Arc<Gate>) {
    gate.launch().unwrap();
    let fence = queue.signal().unwrap();
    let blocked = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (gate, blocked, finished) = (Arc::clone(gate), Arc::clone(&blocked), Arc::clone(&finished));
        std::thread::spawn(move || {
            for _ in 0..2000 {
                if finished.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            blocked.store(true, Ordering::SeqCst);
            gate.open();
        })
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let opener = {
            let gate = Arc::clone(gate);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                gate.open();
            })
        };
        fence.wait_tokio().await.unwrap();
        opener.await.unwrap();
    });
    finished.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    assert!(!blocked.load(Ordering::SeqCst), "awaiting on tokio blocked the runtime");
    println!("awaited on tokio's reactor without blocking it");
}

/// Dropping a lease whose kernel is still held by a gate must not return (and free the
/// buffer) until the kernel has finished.
fn dropping_a_lease_waits_for_the_gpu(device: &Device) {
    let queue = Queue::new(device).unwrap();
    let gate = Gate::new(&queue).unwrap();
    let input = queue.share(HostBuf::<u32>::pinned(device, 1 << 16, PinOptions::default()).unwrap());
    let mut output = queue.lend(HostBuf::<u32>::pinned(device, 1 << 16, PinOptions::default()).unwrap());
    hetmem::kernels::kernel(queue.cuda_device().unwrap(), &hetmem::kernels::AFFINE, "affine_u32").unwrap();
    gate.launch().unwrap();
    affine_u32(&queue, &input, &mut output, 3, 4).unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let dropper = {
        let dropped = Arc::clone(&dropped);
        std::thread::spawn(move || {
            drop(output);
            dropped.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(!dropped.load(Ordering::SeqCst), "the lease dropped while its kernel was still waiting");
    gate.open();
    dropper.join().unwrap();
    assert!(dropped.load(Ordering::SeqCst));
    println!("dropping a lease waited for its kernel");
}

#[test]
fn buffers_the_device_cannot_reach_are_refused_by_name() {
    let Some(gpu) = cuda_device_or_skip("buffers_the_device_cannot_reach_are_refused_by_name") else {
        return;
    };
    let device = Device::Cuda(gpu);
    let queue = Queue::new(&device).unwrap();
    let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
    let input = queue.share(HostBuf::<u32>::pinned(&device, 64, unmapped).unwrap());
    let mut output = queue.lend(HostBuf::<u32>::pinned(&device, 64, PinOptions::default()).unwrap());
    let error = affine_u32(&queue, &input, &mut output, 1, 1).unwrap_err().to_string();
    assert!(error.contains("not mapped"), "{error}");

    let cpu_input = queue.share(HostBuf::<u32>::pinned(&cpu_device(), 64, PinOptions::default()).unwrap());
    let error = affine_u32(&queue, &cpu_input, &mut output, 1, 1).unwrap_err().to_string();
    assert!(error.contains("CPU backend"), "{error}");

    let other = Queue::new(&device).unwrap();
    let foreign = other.share(HostBuf::<u32>::pinned(&device, 64, PinOptions::default()).unwrap());
    let error = affine_u32(&queue, &foreign, &mut output, 1, 1).unwrap_err().to_string();
    assert!(error.contains("belongs to another queue"), "{error}");

    let short = queue.share(HostBuf::<u32>::pinned(&device, 63, PinOptions::default()).unwrap());
    assert!(matches!(affine_u32(&queue, &short, &mut output, 1, 1), Err(Error::InvalidArgument { .. })));
    // A value argument wider than 8 bytes.
    let kernel =
        hetmem::kernels::kernel(queue.cuda_device().unwrap(), &hetmem::kernels::AFFINE, "affine_u32")
            .unwrap();
    let config = hetmem::backend::cuda::LaunchConfig::linear(64, 64, 1);
    // SAFETY: the launch is refused before the kernel runs (the 16-byte value).
    let refused = unsafe { queue.launch(&kernel, config, KernelArgs::new().value([0u64; 2])) };
    assert!(refused.unwrap_err().to_string().contains("16-byte value"));
    // After every refusal the queue still works.
    let output = output.reclaim().unwrap();
    assert_eq!(output.len(), 64);
}

/// A lease of a GPU queue handed to an operation on a CPU-backend queue: the operation's CPU
/// path must not touch the buffer while the GPU may use it, and the error says which GPU has
/// it.
#[test]
fn the_cpu_path_refuses_a_buffer_lent_to_a_gpu() {
    let Some(gpu) = cuda_device_or_skip("the_cpu_path_refuses_a_buffer_lent_to_a_gpu") else {
        return;
    };
    let ordinal = gpu.ordinal();
    let device = Device::Cuda(gpu);
    let gpu_queue = Queue::new(&device).unwrap();
    let cpu_queue = Queue::new(&cpu_device()).unwrap();
    let input = gpu_queue.share(HostBuf::<u32>::pinned(&device, 64, PinOptions::default()).unwrap());
    let mut output = gpu_queue.lend(HostBuf::<u32>::pinned(&device, 64, PinOptions::default()).unwrap());
    match affine_u32(&cpu_queue, &input, &mut output, 1, 1) {
        Err(Error::LentToGpu { device }) => assert_eq!(device, ordinal),
        other => panic!("expected Error::LentToGpu, got {other:?}"),
    }
    // Refused before anything ran: both buffers come back.
    assert_eq!(output.reclaim().unwrap().len(), 64);
    assert_eq!(input.reclaim().unwrap().len(), 64);
}

#[test]
fn registering_twice_and_read_only_mappings_get_driver_errors_with_remedies() {
    let Some(gpu) =
        cuda_device_or_skip("registering_twice_and_read_only_mappings_get_driver_errors_with_remedies")
    else {
        return;
    };
    let mut memory = PageBox::<u8>::zeroed(1 << 20).unwrap();
    let ptr = memory.as_mut_ptr();
    let flags = RegisterFlags { device_map: true, ..RegisterFlags::default() };
    // SAFETY: `memory` outlives both registrations (dropped at the end of the test).
    let first = unsafe { Registration::register(&gpu, ptr, 1 << 20, flags, usize::MAX, ()) }.unwrap();
    // SAFETY: as above; the driver refuses this second registration.
    match unsafe { Registration::register(&gpu, ptr, 1 << 20, flags, usize::MAX, ()) }
        .map_err(|f| Error::from(f.error))
    {
        Err(Error::Cuda(error)) => {
            assert_eq!(error.name, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
            assert!(error.to_string().contains("already registered"), "{error}");
        }
        other => panic!("a second registration should fail, got {other:?}"),
    }
    drop(first);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("read-only.bin");
    std::fs::write(&path, random_words(1 << 18).iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>())
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: the test owns the file and does not change it while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    #[allow(clippy::as_ptr_cast_mut, reason = "a read-only mapping, registered to be read only")]
    let start = map.as_ptr().cast_mut();
    // SAFETY: `map` outlives the attempt; the driver refuses it.
    match unsafe { Registration::register(&gpu, start, map.len(), flags, usize::MAX, ()) }
        .map_err(|f| Error::from(f.error))
    {
        Err(Error::Cuda(error)) => {
            assert_eq!(error.name, "CUDA_ERROR_INVALID_VALUE");
            assert!(error.to_string().contains("read-only flag"), "{error}");
        }
        other => panic!("registering a read-only mapping without the flag should fail, got {other:?}"),
    }
    let read_only = RegisterFlags { read_only: true, ..flags };
    // SAFETY: as above; with the read-only flag it succeeds.
    let registered = unsafe { Registration::register(&gpu, start, map.len(), read_only, usize::MAX, ()) };
    assert!(registered.is_ok(), "{registered:?}");
}

/// In a child without CAP_IPC_LOCK and with a 64 KiB RLIMIT_MEMLOCK: pins 64 MiB each way and
/// prints what happened.
fn memlock_child() {
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    let mut sets = capabilities(None).unwrap();
    sets.effective.remove(CapabilitySet::IPC_LOCK);
    sets.permitted.remove(CapabilitySet::IPC_LOCK);
    println!("dropping CAP_IPC_LOCK: {:?}", set_capabilities(None, sets));
    let limit = rustix::process::Rlimit { current: Some(64 << 10), maximum: Some(64 << 10) };
    println!(
        "RLIMIT_MEMLOCK 64 KiB: {:?}",
        rustix::process::setrlimit(rustix::process::Resource::Memlock, limit)
    );
    let device = Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap());
    for method in [hetmem::memory::PinMethod::HostAlloc, hetmem::memory::PinMethod::Register] {
        let options = PinOptions { method, ..PinOptions::default() };
        match HostBuf::<u8>::pinned(&device, 64 << 20, options) {
            Ok(_) => println!("{method:?}: pinned 64 MiB despite the limit"),
            Err(error) => println!("{method:?}: error: {error}"),
        }
    }
}

#[test]
fn pinning_past_the_memlock_limit_fails_clearly_or_is_not_limited() {
    const TEST: &str = "handoff::pinning_past_the_memlock_limit_fails_clearly_or_is_not_limited";
    if child_role().as_deref() == Some("memlock") {
        return memlock_child();
    }
    if cuda_device_or_skip("pinning_past_the_memlock_limit_fails_clearly_or_is_not_limited").is_none() {
        return;
    }
    let output = run_child(TEST, "memlock");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("memlock child said:\n{stdout}");
    assert!(output.status.success(), "the child failed: {:?}\n{stdout}\n{stderr}", output.status);
    for method in ["HostAlloc", "Register"] {
        let line = stdout
            .lines()
            .find(|line| line.starts_with(method))
            .unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
        assert!(
            line.contains("despite the limit") || line.contains("ulimit -l"),
            "a memlock failure must name the remedy: {line}"
        );
    }
}

/// `Queue::copy_range`: a part of one buffer lands at its offset in another, host to device and
/// back, nothing else written; ranges past either end are refused by name.
#[test]
fn copy_range_moves_exactly_the_range() {
    crate::support::on_every_backend("copy_range_moves_exactly_the_range", |device| {
        let queue = Queue::new(device).unwrap();
        let words = random_words(1000);
        let mut source = HostBuf::<u32>::pinned(device, words.len(), PinOptions::default()).unwrap();
        source.as_mut_slice().copy_from_slice(&words);
        let source = queue.share(source);
        let mut middle = hetmem::DeviceBuf::<u32>::new(device, 700).unwrap();
        middle.copy_from_slice(&[POISON; 700]).unwrap();
        let mut middle = queue.lend(middle);
        queue.copy_range(&source, 123, &mut middle, 50, 600).unwrap();
        let error = queue.copy_range(&source, 500, &mut middle, 0, 501).unwrap_err().to_string();
        assert!(error.contains("source element 500") && error.contains("1000"), "{error}");
        let error = queue.copy_range(&source, 0, &mut middle, 101, 600).unwrap_err().to_string();
        assert!(error.contains("destination element 101") && error.contains("700"), "{error}");
        let mut back = HostBuf::<u32>::pinned(device, 700, PinOptions::default()).unwrap();
        back.as_mut_slice().fill(POISON);
        let middle = middle.reclaim().unwrap();
        let middle = queue.share(middle);
        let mut back = queue.lend(back);
        queue.copy_range(&middle, 0, &mut back, 0, 700).unwrap();
        let back = back.reclaim().unwrap();
        let mut expected = vec![POISON; 700];
        expected[50..650].copy_from_slice(&words[123..723]);
        assert_eq!(first_mismatch(back.as_slice(), &expected), None);
        drop((middle, source));
    });
}
