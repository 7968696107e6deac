//! Faults injected into every point hetmem's frame path goes through (allocation,
//! registration, launch, copy, fence wait; transient, sticky, and on the GPU a kernel that
//! really faults), on the CPU backend and on the GPU: no frame lost or duplicated, no hang, a
//! clear error naming the frame.
//!
//! Fault rules are process-wide, so each case runs in a child process of its own
//! (`support::run_child`); the parent only checks that the child passed.

use std::time::Duration;

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout, gaussian_cpu};
use hetmem::testing::faults::{self, FaultKind, FaultPoint};
use hetmem::{
    Device, Error, FrameFilter, FrameRing, HostBuf, PinOptions, Queue, RingOptions, Strategy,
    error::FrameMemoryHolder,
};

use crate::support::{assert_child_passes, child_role, cpu_device};

/// How one frame of a stream came out.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Equal to the CPU path's result.
    Right,
    /// Out, but wrong (never allowed).
    Wrong,
    /// Reported failed, with the error's text and whether it is sticky.
    Failed { sticky: bool, text: String },
}

/// Streams up to `frames` random frames through `ring` one at a time (each drained before the
/// next is submitted, so a fault can only touch its own frame), and returns each frame's
/// outcome (the first of this call at 0) and, if the producer was refused a slot, the error it
/// got.
fn stream(
    ring: &FrameRing<GaussianStage>,
    format: &FrameFormat,
    kernel: &Gaussian,
    frames: u64,
) -> (Vec<Outcome>, Option<Error>) {
    let mut outcomes = Vec::new();
    let first = ring.submitted();
    for index in first..first + frames {
        let seed = fastrand::u64(..);
        let mut rng = fastrand::Rng::with_seed(seed);
        let input: Vec<u8> = (0..format.frame_bytes()).map(|_| rng.u8(..)).collect();
        let mut slot = match ring.next_input() {
            Ok(slot) => slot,
            Err(error) => return (outcomes, Some(error)),
        };
        assert_eq!(slot.index(), index, "indices run on without gaps");
        slot.copy_from_slice(&input);
        slot.submit();
        let outcome = match ring.next_output() {
            Ok(output) => {
                assert_eq!(output.index(), index, "frames come out in order, each once");
                let mut want = vec![0u8; input.len()];
                gaussian_cpu(format, kernel, &input, &mut want).unwrap();
                if output[..] == want[..] { Outcome::Right } else { Outcome::Wrong }
            }
            Err(Error::FrameFailed { index: failed, source }) => {
                assert_eq!(failed, index, "the failure names its own frame");
                Outcome::Failed { sticky: source.is_sticky(), text: source.to_string() }
            }
            Err(other) => panic!("frame {index}: not a frame failure: {other}"),
        };
        outcomes.push(outcome);
    }
    (outcomes, None)
}

fn small_format() -> (FrameFormat, Gaussian) {
    (
        FrameFormat::new(97, 61, PixelLayout::Rgb).unwrap(),
        Gaussian::new(Some(2), None, Border::default()).unwrap(),
    )
}

/// Fails frame `at` of a stream by `point` as `kind`: that frame alone is reported, with its
/// index and the injected error; every other frame comes out right, once, in order.
fn one_frame_fails(device: &Device, strategy: Strategy, point: FaultPoint, kind: FaultKind, at: u64) {
    let (format, kernel) = small_format();
    let ring = FrameRing::new(device, strategy, format, &kernel, RingOptions::default()).unwrap();
    faults::clear();
    // Calls at `point` per frame, counted on a frame that runs before the rule is armed.
    let before = faults::calls(point);
    let (first, _) = stream(&ring, &format, &kernel, 1);
    assert_eq!(first, [Outcome::Right]);
    let per_frame = faults::calls(point) - before;
    if per_frame == 0 {
        println!("{strategy}: no {point:?} per frame; nothing to inject");
        return;
    }
    faults::arm(point, at * per_frame, kind);
    let first = ring.submitted();
    let (outcomes, refused) = stream(&ring, &format, &kernel, 8);
    let fired = faults::fired();
    faults::clear();
    assert_eq!(fired.len(), 1, "{strategy} {point:?}: the fault fired once: {fired:?}");
    let failed: Vec<usize> =
        outcomes.iter().enumerate().filter(|(_, o)| **o != Outcome::Right).map(|(i, _)| i).collect();
    assert_eq!(
        failed,
        [at as usize - 1],
        "{strategy} {point:?} {kind:?}: only the faulted frame fails: {outcomes:?}"
    );
    let Outcome::Failed { sticky, text } = &outcomes[at as usize - 1] else { unreachable!() };
    assert!(text.contains("injected fault"), "{text}");
    assert_eq!(*sticky, kind != FaultKind::Transient, "{text}");
    match refused {
        // A fence wait that fails loses the frame's memory (the GPU may still use it): the ring
        // says so by name when the producer comes back to that slot.
        Some(error) => {
            assert_eq!(point, FaultPoint::FenceWait, "{strategy}: only a failed wait loses a slot: {error}");
            let text = error.to_string();
            assert!(
                text.contains("lost to an earlier failed frame") && text.contains("make a new ring"),
                "{text}"
            );
            match error {
                Error::FrameMemoryLost { holder: FrameMemoryHolder::RingSlot, frame } => {
                    assert_eq!(frame, Some(first + at - 1), "{strategy}: the loss names the failed frame")
                }
                other => panic!("{strategy}: a lost slot is Error::FrameMemoryLost, got {other:?}"),
            }
        }
        None => assert_eq!(outcomes.len(), 8, "{strategy} {point:?}: the stream went on to the end"),
    }
    println!("{strategy} {point:?} {kind:?} at frame {at}: {outcomes:?}");
}

/// Memory that runs short while a ring is built is retried; once it runs short for good, the
/// ring settles for the slots it has, and says so; with no shortfall allowed, the error comes
/// back. (GPU rings: CPU slots are plain vectors, nothing for a shortage to hit.)
fn shortages_while_building(device: &Device, strategy: Strategy) {
    let (format, kernel) = small_format();
    let quick = hetmem::retry::RetryPolicy {
        retries: 2,
        first_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
    };
    let options = RingOptions { slots: 3, retry: quick, ..RingOptions::default() };
    for point in [FaultPoint::Allocation, FaultPoint::Registration] {
        faults::clear();
        faults::arm(point, 2, FaultKind::Transient);
        let ring = FrameRing::new(device, strategy, format, &kernel, options).unwrap();
        assert_eq!(ring.slots(), 3, "{strategy} {point:?}: one shortage is retried away");
        let fired = faults::fired();
        if point == FaultPoint::Registration && fired.is_empty() {
            continue; // This strategy pins nothing by registration (managed memory).
        }
        assert_eq!(fired.len(), 1, "{strategy} {point:?}: {fired:?}");
    }
    // Every allocation from the second slot on fails: the ring runs with one slot.
    faults::clear();
    let first_slot = {
        let _probe =
            FrameRing::new(device, strategy, format, &kernel, RingOptions { slots: 1, ..options }).unwrap();
        faults::calls(FaultPoint::Allocation)
    };
    faults::clear();
    for nth in first_slot + 1..first_slot + 40 {
        faults::arm(FaultPoint::Allocation, nth, FaultKind::Transient);
    }
    let ring = FrameRing::new(device, strategy, format, &kernel, options).unwrap();
    assert_eq!(ring.slots(), 1, "{strategy}: the ring settled for the slot it could make");
    let (outcomes, refused) = stream(&ring, &format, &kernel, 4);
    assert!(refused.is_none() && outcomes.iter().all(|o| *o == Outcome::Right), "{outcomes:?}");
    drop(ring);
    // With min_slots = slots, no shortfall is accepted: the error comes back.
    faults::clear();
    for nth in first_slot + 1..first_slot + 40 {
        faults::arm(FaultPoint::Allocation, nth, FaultKind::Transient);
    }
    let strict = RingOptions { min_slots: 3, ..options };
    let error = FrameRing::new(device, strategy, format, &kernel, strict).unwrap_err();
    assert!(error.is_transient() && error.to_string().contains("injected fault"), "{error}");
    faults::clear();
}

/// A copy and a lease reclaim that fail say so, and no buffer is freed under the GPU: the
/// reclaim's buffer is leaked, the copy's destination stays lent and is reclaimed intact.
fn lease_faults(device: &Device) {
    let queue = Queue::new(device).unwrap();
    let source = queue.share(HostBuf::<u32>::pinned(device, 4096, PinOptions::default()).unwrap());
    let mut target = queue.lend(HostBuf::<u32>::pinned(device, 4096, PinOptions::default()).unwrap());
    faults::clear();
    faults::arm(FaultPoint::Copy, 1, FaultKind::Transient);
    let error = queue.copy(&source, &mut target).unwrap_err();
    assert!(error.is_transient() && error.to_string().contains("Copy"), "{error}");
    queue.copy(&source, &mut target).unwrap();
    assert!(target.reclaim().is_ok());
    faults::arm(FaultPoint::FenceWait, 1, FaultKind::Sticky);
    let error = source.reclaim().unwrap_err();
    assert!(error.is_sticky() && error.to_string().contains("FenceWait"), "{error}");
    faults::clear();
}

/// On the GPU, a kernel that really stores to an illegal address in frame 3: frames 0 to 2
/// came out intact before it, frame 3 fails with the driver's sticky error, the ring refuses
/// to go on by name, and nothing hangs or crashes (the drops skip releases in the lost
/// context).
fn a_real_trap(device: &Device) {
    let (format, kernel) = small_format();
    let ring = FrameRing::new(device, Strategy::ZeroCopy, format, &kernel, RingOptions::default()).unwrap();
    faults::clear();
    faults::arm(FaultPoint::Launch, 4, FaultKind::Trap);
    let (outcomes, refused) = stream(&ring, &format, &kernel, 8);
    assert_eq!(outcomes[..3], [Outcome::Right, Outcome::Right, Outcome::Right], "{outcomes:?}");
    let Outcome::Failed { sticky: true, text } = &outcomes[3] else { panic!("frame 3: {outcomes:?}") };
    // The driver says ILLEGAL_ADDRESS; under compute-sanitizer, which stops the kernel itself,
    // LAUNCH_FAILED.
    assert!(
        text.contains("CUDA_ERROR_ILLEGAL_ADDRESS") || text.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{text}"
    );
    // Every later frame fails or is refused with the same loss, none comes out wrong.
    assert!(outcomes[4..].iter().all(|o| matches!(o, Outcome::Failed { sticky: true, .. })), "{outcomes:?}");
    if let Some(error) = refused {
        println!("refused after the trap: {error}");
    }
    drop(ring);
    let error = hetmem::Error::from(device.as_cuda().unwrap().synchronize().unwrap_err());
    assert!(error.is_sticky(), "{error}");
    println!("a real trap: {outcomes:?}");
}

/// A frame filter whose frame fails keeps its buffers when the failed work could be waited
/// for, and blurs the next frame right; when the wait fails too, it gives the buffers up (the
/// GPU may still use them) and every later use says so by variant instead of running on
/// memory it no longer has.
fn filter_faults(device: &Device) {
    let (format, kernel) = small_format();
    let mut filter = FrameFilter::new(device, Strategy::ZeroCopy, format, &kernel).unwrap();
    let blurs_right = |filter: &mut FrameFilter<GaussianStage>| {
        let seed = fastrand::u64(..);
        let mut rng = fastrand::Rng::with_seed(seed);
        let input: Vec<u8> = (0..format.frame_bytes()).map(|_| rng.u8(..)).collect();
        filter.fill_output(0xA5).unwrap();
        filter.input_mut().unwrap().copy_from_slice(&input);
        filter.run().unwrap();
        let mut want = vec![0u8; input.len()];
        gaussian_cpu(&format, &kernel, &input, &mut want).unwrap();
        assert!(
            filter.output().unwrap() == &want[..],
            "the filter's output differs from the CPU's (seed {seed:#x})"
        );
    };
    blurs_right(&mut filter);
    faults::clear();
    faults::arm(FaultPoint::Launch, 1, FaultKind::Transient);
    let failed = filter.run().unwrap_err();
    assert!(failed.to_string().contains("injected fault"), "{failed}");
    faults::clear();
    blurs_right(&mut filter);

    faults::arm(FaultPoint::Launch, 1, FaultKind::Transient);
    faults::arm(FaultPoint::FenceWait, 1, FaultKind::Sticky);
    let failed = filter.run().unwrap_err();
    assert!(failed.to_string().contains("injected fault"), "{failed}");
    faults::clear();
    for (call, error) in [
        ("input_mut", filter.input_mut().map(|_| ()).unwrap_err()),
        ("output", filter.output().map(|_| ()).unwrap_err()),
        ("run", filter.run().map(|_| ()).unwrap_err()),
    ] {
        match error {
            Error::FrameMemoryLost { holder: FrameMemoryHolder::Filter, frame: None } => {}
            other => panic!("{call} after a failed frame: expected Error::FrameMemoryLost, got {other:?}"),
        }
    }
}

fn gpu() -> Device {
    Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap())
}

const POINTS: [(FaultPoint, FaultKind); 5] = [
    (FaultPoint::Launch, FaultKind::Transient),
    (FaultPoint::Launch, FaultKind::Sticky),
    (FaultPoint::Copy, FaultKind::Transient),
    (FaultPoint::Copy, FaultKind::Sticky),
    (FaultPoint::FenceWait, FaultKind::Sticky),
];

fn cpu_child() {
    let device = cpu_device();
    for (point, kind) in POINTS {
        one_frame_fails(&device, Strategy::Cpu, point, kind, 3);
    }
    // Plain host memory can run short too: the error says it may pass.
    faults::arm(FaultPoint::Allocation, 1, FaultKind::Transient);
    let error = HostBuf::<u8>::pinned(&device, 1 << 20, PinOptions::default()).unwrap_err();
    assert!(error.is_transient() && error.to_string().contains("Allocation"), "{error}");
    faults::clear();
    lease_faults(&device);
}

fn gpu_child() {
    let device = gpu();
    for strategy in [Strategy::Copy, Strategy::ZeroCopy, Strategy::Managed] {
        for (point, kind) in POINTS {
            one_frame_fails(&device, strategy, point, kind, 3);
        }
        shortages_while_building(&device, strategy);
    }
    lease_faults(&device);
    filter_faults(&device);
}

fn in_child(test: &str, role: &str, body: fn()) {
    if child_role().as_deref() == Some(role) {
        return body();
    }
    assert_child_passes(&format!("faults::{test}"), role);
}

#[test]
fn injected_faults_on_the_cpu_lose_no_frame_and_name_the_frame() {
    in_child("injected_faults_on_the_cpu_lose_no_frame_and_name_the_frame", "cpu", cpu_child);
}

#[test]
fn injected_faults_on_the_gpu_lose_no_frame_and_name_the_frame() {
    if child_role().is_none()
        && hetmem::testing::cuda_device_or_skip("injected_faults_on_the_gpu_lose_no_frame_and_name_the_frame")
            .is_none()
    {
        return;
    }
    in_child("injected_faults_on_the_gpu_lose_no_frame_and_name_the_frame", "gpu", gpu_child);
}

#[test]
fn a_kernel_that_really_faults_loses_the_context_and_nothing_else() {
    if child_role().is_none()
        && hetmem::testing::cuda_device_or_skip(
            "a_kernel_that_really_faults_loses_the_context_and_nothing_else",
        )
        .is_none()
    {
        return;
    }
    in_child(
        "a_kernel_that_really_faults_loses_the_context_and_nothing_else",
        "trap",
        || a_real_trap(&gpu()),
    );
}

/// A registration in pieces that fails after its first piece while a resident kernel runs
/// cannot unregister that piece until the kernel ends: the memory it covers must be kept (not
/// handed back, not freed) until then, and freed once the release has run.
#[test]
fn a_registration_failing_part_way_beside_a_resident_kernel_keeps_its_memory_until_unregistered() {
    const TEST: &str =
        "a_registration_failing_part_way_beside_a_resident_kernel_keeps_its_memory_until_unregistered";
    if child_role().is_none() && hetmem::testing::cuda_device_or_skip(TEST).is_none() {
        return;
    }
    in_child(TEST, "partial-registration", partial_registration);
}

fn partial_registration() {
    use std::ptr::NonNull;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use hetmem::resident::Gate;
    use hetmem::{PageBox, memory::RegisterOptions};

    /// Memory that says when it is freed.
    struct Owner {
        _memory: PageBox<u8>,
        freed: Arc<AtomicBool>,
    }
    impl Drop for Owner {
        fn drop(&mut self) {
            self.freed.store(true, Ordering::SeqCst);
        }
    }

    let device = gpu();
    let queue = Queue::new(&device).unwrap();
    let gate = Gate::new(&queue).unwrap();
    gate.launch().unwrap();
    gate.wait_started();

    let bytes = 4 << 20;
    let mut memory = PageBox::<u8>::zeroed(bytes).unwrap();
    let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
    let freed = Arc::new(AtomicBool::new(false));
    let owner = Owner { _memory: memory, freed: Arc::clone(&freed) };
    // The first registration check is the call's own, the second comes before its second piece.
    faults::arm(FaultPoint::Registration, 2, FaultKind::Transient);
    let options = RegisterOptions { max_piece_bytes: 1 << 20, ..RegisterOptions::default() };
    // SAFETY: `owner` owns the page-aligned `bytes` at `ptr` (a PageBox does not move its
    // memory) and moves into the call.
    let failure =
        unsafe { HostBuf::<u8>::register_in_place(&device, owner, ptr, bytes, options) }.unwrap_err();
    assert!(failure.to_string().contains("injected"), "{failure}");
    assert!(failure.memory.is_none(), "memory handed back while a piece of it is still registered");
    drop(failure);
    assert!(!freed.load(Ordering::SeqCst), "memory freed while a piece of it is still registered");

    // The kernel let go, the deferred unregistration runs, and the memory goes with it.
    gate.open();
    assert!(freed.load(Ordering::SeqCst), "memory kept after its registration was undone");
    drop(gate);
    faults::clear();

    // Without a resident kernel the same failure hands the memory back at once.
    let mut memory = PageBox::<u8>::zeroed(bytes).unwrap();
    let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
    faults::arm(FaultPoint::Registration, 2, FaultKind::Transient);
    // SAFETY: as above.
    let failure =
        unsafe { HostBuf::<u8>::register_in_place(&device, memory, ptr, bytes, options) }.unwrap_err();
    assert!(failure.memory.is_some(), "no resident kernel: the memory comes back");
    println!("a registration failing part-way kept its memory until its first piece was unregistered");
}
