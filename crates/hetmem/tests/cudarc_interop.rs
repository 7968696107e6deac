//! cudarc on hetmem's memory: cudarc kernels and copies on leases give the CPU's results,
//! reclaiming waits for them on any stream, streams convert both ways, and misuse is refused.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, HostSlice, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use hetmem::backend::cuda::nvrtc;
use hetmem::kernels::{DEFAULT_CHECK_ARCH, KernelSource};
use hetmem::memory::Buffer;
use hetmem::ops::{affine_u32, affine_u32_cpu};
use hetmem::testing::{cuda_device_or_skip, nvrtc_or_skip};
use hetmem::{
    Device, HostBuf, Lease, Lent, MappedFile, PinOptions, Queue, Shared, handoff::CudarcHostMut,
    handoff::CudarcView, handoff::CudarcViewMut,
};

use crate::support::{POISON, first_mismatch, random_words};

/// The example's kernels: `scale_add` and `slow_scale_add`.
static KERNELS: KernelSource = KernelSource {
    name: "cudarc_interop",
    source: include_str!("../examples/cudarc_interop.cu"),
    entry_points: &["scale_add", "slow_scale_add"],
    options: &[],
    ptx: None,
};

/// Long enough that a CPU that did not wait would find the output still poisoned.
const SLOW_NANOS: u64 = 500_000_000;

const LEN: usize = (1 << 16) + 3;

/// A GPU, its primary context as cudarc's, and the test kernels loaded through cudarc; `None`
/// (after saying why) without a GPU or NVRTC.
struct Gpu {
    device: Device,
    ctx: Arc<CudaContext>,
    scale_add: CudaFunction,
    slow_scale_add: CudaFunction,
}

fn gpu_or_skip(test: &str) -> Option<Gpu> {
    let cuda = cuda_device_or_skip(test)?;
    nvrtc_or_skip(test)?;
    let ctx = CudaContext::new(cuda.ordinal()).unwrap();
    let (cubin, _) =
        hetmem::kernels::cache().get_or_compile(&KERNELS, &cuda.compute_capability().sm_name()).unwrap();
    let module = ctx.load_module(Ptx::from_binary(cubin)).unwrap();
    Some(Gpu {
        device: Device::Cuda(cuda),
        scale_add: module.load_function("scale_add").unwrap(),
        slow_scale_add: module.load_function("slow_scale_add").unwrap(),
        ctx,
    })
}

impl Gpu {
    /// A queue, its stream as cudarc's, and fresh words with coefficients and the CPU's result.
    fn setup(&self) -> Setup {
        let queue = Queue::new(&self.device).unwrap();
        let stream = queue.cudarc_stream(&self.ctx).unwrap();
        let words = random_words(LEN);
        let coefficients = (words[0] | 1, words[1]);
        let want = expected(&words, coefficients);
        Setup { queue, stream, words, coefficients, want }
    }

    /// Queues `scale_add` (`slow_scale_add` if `slow`) on `on`, from `input` into `output`
    /// through a view of `output` made for `views`, the lease's queue's stream.
    fn launch_into(
        &self,
        (views, on): (&CudaStream, &CudaStream),
        input: &CudarcView<'_, u32>,
        output: &mut Lent<HostBuf<u32>>,
        coefficients: (u32, u32),
        slow: bool,
    ) {
        let mut output = output.cudarc_view_mut(views).unwrap();
        let function = if slow { &self.slow_scale_add } else { &self.scale_add };
        launch(function, on, input, &mut output, coefficients, slow.then_some(SLOW_NANOS));
    }
}

struct Setup {
    queue: Queue,
    stream: Arc<CudaStream>,
    words: Vec<u32>,
    coefficients: (u32, u32),
    want: Vec<u32>,
}

impl Setup {
    fn input(&self) -> Shared<HostBuf<u32>> {
        self.queue.share(input_buffer(&self.queue, &self.words))
    }

    fn output(&self) -> Lent<HostBuf<u32>> {
        self.queue.lend(poisoned_buffer(&self.queue, self.words.len()))
    }
}

fn queue_device(queue: &Queue) -> Device {
    Device::Cuda(queue.cuda_device().expect("a CUDA queue").clone())
}

fn input_buffer(queue: &Queue, words: &[u32]) -> HostBuf<u32> {
    let mut buf = HostBuf::<u32>::pinned(&queue_device(queue), words.len(), PinOptions::default()).unwrap();
    buf.as_mut_slice().copy_from_slice(words);
    buf
}

fn poisoned_buffer(queue: &Queue, len: usize) -> HostBuf<u32> {
    let mut buf = HostBuf::<u32>::pinned(&queue_device(queue), len, PinOptions::default()).unwrap();
    buf.as_mut_slice().fill(POISON);
    buf
}

/// Launches `scale_add` (or, with `nanos`, `slow_scale_add`) on `stream`, reading `input` and
/// writing `output`; returns when it is queued, with the `SyncOnDrop`s dropped.
fn launch(
    function: &CudaFunction,
    stream: &CudaStream,
    input: &impl DevicePtr<u32>,
    output: &mut impl DevicePtrMut<u32>,
    (a, b): (u32, u32),
    nanos: Option<u64>,
) {
    let n = input.len() as u32;
    let (input_ptr, _input_queued) = input.device_ptr(stream);
    let (output_ptr, _output_queued) = output.device_ptr_mut(stream);
    let mut builder = stream.launch_builder(function);
    builder.arg(&input_ptr).arg(&output_ptr).arg(&n).arg(&a).arg(&b);
    if let Some(nanos) = &nanos {
        builder.arg(nanos);
    }
    let config = LaunchConfig { grid_dim: (64, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: (slow_)scale_add(const unsigned*, unsigned*, unsigned n, unsigned a, unsigned b
    // [, unsigned long long]) matches the arguments; it reads n words of the input and writes n
    // of the output, whose lengths are n; it is queued on the stream both addresses were asked
    // for, while the views and their SyncOnDrops live.
    unsafe { builder.launch(config) }.unwrap();
}

fn expected(words: &[u32], (a, b): (u32, u32)) -> Vec<u32> {
    let mut want = vec![0; words.len()];
    affine_u32_cpu(words, &mut want, a, b);
    want
}

fn check(what: &str, got: &[u32], want: &[u32]) {
    assert_eq!(first_mismatch(got, want), None, "{what}: (index, got, expected)");
}

#[test]
fn a_cudarc_kernel_on_leases_gives_the_cpu_s_result() {
    let Some(gpu) = gpu_or_skip("a_cudarc_kernel_on_leases_gives_the_cpu_s_result") else { return };
    let run = gpu.setup();
    let input = run.input();
    let mut output = run.output();
    let own = (&*run.stream, &*run.stream);
    gpu.launch_into(own, &input.cudarc_view(&run.stream).unwrap(), &mut output, run.coefficients, false);
    let output = output.reclaim().unwrap();
    check("scale_add on a shared and a lent HostBuf", output.as_slice(), &run.want);

    // cudarc's safe copies on the same lease: host to lent memory, lent memory to host.
    let fresh = random_words(LEN);
    let mut output = run.queue.lend(output);
    {
        let mut view = output.cudarc_view_mut(&run.stream).unwrap();
        run.stream.memcpy_htod(&fresh, &mut view).unwrap();
        check("memcpy_htod then clone_dtoh", &run.stream.clone_dtoh(&view).unwrap(), &fresh);
    }
    check("memcpy_htod into a lent HostBuf", output.reclaim().unwrap().as_slice(), &fresh);
    drop(input.reclaim().unwrap());
}

/// `CudarcView::of` for code generic over leases (a stage's inputs): any lease's view.
fn view_of<'a, L>(lease: &'a L, stream: &CudaStream) -> CudarcView<'a, u32>
where
    L: Lease,
    L::Buf: Buffer<Elem = u32>,
{
    CudarcView::of(lease, stream).unwrap()
}

#[test]
fn a_view_of_any_lease_reads_what_the_lease_s_own_view_reads() {
    let Some(gpu) = gpu_or_skip("a_view_of_any_lease_reads_what_the_lease_s_own_view_reads") else { return };
    let run = gpu.setup();
    let input = run.input();
    let mut output = run.output();
    gpu.launch_into(
        (&run.stream, &run.stream),
        &view_of(&input, &run.stream),
        &mut output,
        run.coefficients,
        false,
    );
    let output = run.queue.lend(output.reclaim().unwrap());
    check(
        "scale_add through CudarcView::of a Shared",
        &run.stream.clone_dtoh(&view_of(&output, &run.stream)).unwrap(),
        &run.want,
    );
    check("CudarcView::of a Lent, reclaimed", output.reclaim().unwrap().as_slice(), &run.want);
    drop(input.reclaim().unwrap());
}

#[test]
fn a_cudarc_kernel_reads_a_registered_read_only_file() {
    let Some(gpu) = gpu_or_skip("a_cudarc_kernel_reads_a_registered_read_only_file") else { return };
    let run = gpu.setup();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.bin");
    std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&run.words)).unwrap();
    // SAFETY: the file is this test's own, in a fresh temporary folder, and nothing writes or
    // truncates it while it is mapped.
    let file = unsafe { MappedFile::<u32>::open(&gpu.device, &path) }.unwrap();
    assert!(file.is_registered(), "the mapping was not registered with the GPU");
    let file = run.queue.share(file);
    let mut output = run.output();
    {
        let view = file.cudarc_view(&run.stream).unwrap();
        gpu.launch_into((&run.stream, &run.stream), &view, &mut output, run.coefficients, false);
        check("clone_dtoh of a registered file", &run.stream.clone_dtoh(&view).unwrap(), &run.words);
    }
    check("scale_add from a registered file", output.reclaim().unwrap().as_slice(), &run.want);
    drop(file.reclaim().unwrap());
}

#[test]
fn reclaiming_waits_for_a_cudarc_launch() {
    let Some(gpu) = gpu_or_skip("reclaiming_waits_for_a_cudarc_launch") else { return };
    let run = gpu.setup();
    let own = (&*run.stream, &*run.stream);
    let input = run.input();
    let view = || input.cudarc_view(&run.stream).unwrap();

    // The output's view drops right after the launch: the lease's fence is after the kernel.
    // The kernel spins SLOW_NANOS from its start, after `launched`: reclaim returning at least
    // that long after `launched` waited for it (cudarc's launch itself sometimes waits, which
    // then leaves the reclaim nothing to wait for: said, not failed).
    let mut output = run.output();
    let launched = Instant::now();
    gpu.launch_into(own, &view(), &mut output, run.coefficients, true);
    if output.is_complete().unwrap() {
        println!("cudarc's launch returned after the kernel ({:?})", launched.elapsed());
    }
    let output = output.reclaim().unwrap();
    let waited = launched.elapsed();
    assert!(waited >= Duration::from_nanos(SLOW_NANOS), "reclaim returned {waited:?} after the launch began");
    check("reclaimed after a slow cudarc kernel", output.as_slice(), &run.want);

    // A leaked view never records its fence: the lease then waits for the whole stream.
    let mut output = run.queue.lend(output);
    {
        let mut out = output.cudarc_view_mut(&run.stream).unwrap();
        run.stream.memset_zeros(&mut out).unwrap();
        launch(&gpu.slow_scale_add, &run.stream, &view(), &mut out, run.coefficients, Some(SLOW_NANOS));
        std::mem::forget(out);
    }
    check("reclaimed after a leaked view", output.reclaim().unwrap().as_slice(), &run.want);

    // Dropping the lease instead of reclaiming it waits too, rather than free the memory under
    // the kernel. The kernel spins SLOW_NANOS from its start, which is after `launched`: when
    // the drop returns at least that long after `launched`, it waited (whether the wait was in
    // the drop or, as cudarc's launch can, before it returned).
    let mut output = run.output();
    let launched = Instant::now();
    gpu.launch_into(own, &view(), &mut output, run.coefficients, true);
    drop(output);
    let waited = launched.elapsed();
    assert!(waited >= Duration::from_nanos(SLOW_NANOS), "drop returned {waited:?} after the launch began");
    drop(input.reclaim().unwrap());
}

#[test]
fn reclaiming_waits_for_a_cudarc_copy_into_lent_host_memory() {
    let Some(gpu) = gpu_or_skip("reclaiming_waits_for_a_cudarc_copy_into_lent_host_memory") else { return };
    let run = gpu.setup();
    let input = run.input();
    let mut on_gpu = run.stream.alloc_zeros::<u32>(LEN).unwrap();
    // Pinned memory that is not mapped: cudarc's copies need no device address for it.
    let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
    let mut host = HostBuf::<u32>::pinned(&gpu.device, LEN, unmapped).unwrap();
    host.as_mut_slice().fill(POISON);
    let mut lent = run.queue.lend(host);

    // The copy is queued behind a kernel that spins SLOW_NANOS, so it is still pending when
    // `memcpy_dtoh` returns: a reclaim that did not wait would find the poison.
    let launched = Instant::now();
    launch(
        &gpu.slow_scale_add,
        &run.stream,
        &input.cudarc_view(&run.stream).unwrap(),
        &mut on_gpu,
        run.coefficients,
        Some(SLOW_NANOS),
    );
    run.stream.memcpy_dtoh(&on_gpu, &mut lent.cudarc_host_mut(&run.stream).unwrap()).unwrap();
    let host = lent.reclaim().unwrap();
    let waited = launched.elapsed();
    assert!(waited >= Duration::from_nanos(SLOW_NANOS), "reclaim returned {waited:?} after the launch began");
    check("memcpy_dtoh into a lent HostBuf's host memory", host.as_slice(), &run.want);

    // And the other way: cudarc reads the lent host memory into device memory.
    let fresh = random_words(LEN);
    let mut host = host;
    host.as_mut_slice().copy_from_slice(&fresh);
    let mut lent = run.queue.lend(host);
    let copied = run.stream.clone_htod(&lent.cudarc_host_mut(&run.stream).unwrap()).unwrap();
    check("clone_htod from a lent HostBuf", &run.stream.clone_dtoh(&copied).unwrap(), &fresh);
    drop(lent.reclaim().unwrap());

    // A host view is made only for the lease's own stream, and only of host memory.
    let unrelated = gpu.ctx.new_stream().unwrap();
    let mut lent = run.output();
    let error = lent.cudarc_host_mut(&unrelated).unwrap_err().to_string();
    assert!(error.contains("not the stream of the lease's queue"), "{error}");
    let mut view = lent.cudarc_host_mut(&run.stream).unwrap();
    assert_panics("other than its queue's", || {
        let _ = unrelated.memcpy_dtoh(&on_gpu, &mut view);
    });
    drop(view);
    drop(lent.reclaim().unwrap());
    let mut device = run.queue.lend(hetmem::DeviceBuf::<u32>::new(&gpu.device, 64).unwrap());
    let error = device.cudarc_host_mut(&run.stream).unwrap_err().to_string();
    assert!(error.contains("no host memory"), "{error}");
    drop(input.reclaim().unwrap());
}

#[test]
fn a_lease_is_used_by_cudarc_on_its_queue_s_stream_only() {
    let Some(gpu) = gpu_or_skip("a_lease_is_used_by_cudarc_on_its_queue_s_stream_only") else { return };
    let run = gpu.setup();
    let unrelated = gpu.ctx.new_stream().unwrap();
    let other_queue_stream = Queue::new(&gpu.device).unwrap().cudarc_stream(&gpu.ctx).unwrap();
    let other_ctx = CudaContext::new_non_primary(gpu.ctx.ordinal(), 0).unwrap();
    let foreign = other_ctx.new_stream().unwrap();
    let input = run.input();
    let mut output = run.output();

    // A view is made only for the stream of the lease's own queue.
    for stream in [&unrelated, &other_queue_stream, &foreign] {
        let error = input.cudarc_view(stream).unwrap_err().to_string();
        assert!(error.contains("not the stream of the lease's queue"), "{error}");
        let error = output.cudarc_view_mut(stream).unwrap_err().to_string();
        assert!(error.contains("not the stream of the lease's queue"), "{error}");
    }
    let error = Queue::from_cudarc(&foreign).unwrap_err().to_string();
    assert!(error.contains("not the device's primary one"), "{error}");
    let error = run.queue.cudarc_stream(&other_ctx).unwrap_err().to_string();
    assert!(error.contains("CudaContext::new(0)"), "{error}");

    // A view's address is refused, before anything is queued, for any other stream: the one
    // the view reports to cudarc, an unrelated one, another queue's, another context's; also
    // when cudarc's safe copies ask for it.
    let view = input.cudarc_view(&run.stream).unwrap();
    let mut out = output.cudarc_view_mut(&run.stream).unwrap();
    let bookkeeping = Arc::clone(DeviceSlice::stream(&view));
    let refusals = [
        (&bookkeeping, "DeviceSlice::stream"),
        (&unrelated, "other than its queue's"),
        (&other_queue_stream, "other than its queue's"),
        (&foreign, "another CUDA context"),
    ];
    for (stream, why) in refusals {
        assert_panics(why, || drop(view.device_ptr(stream)));
        assert_panics(why, || drop(out.device_ptr_mut(stream)));
    }
    assert_panics("other than its queue's", || drop(unrelated.clone_dtoh(&view)));
    assert_panics("other than its queue's", || {
        let _ = unrelated.memset_zeros(&mut out);
    });

    // Through any wrapper of the queue's stream, the leases work as before the refusals.
    drop(out);
    let another_wrapper = run.queue.cudarc_stream(&gpu.ctx).unwrap();
    gpu.launch_into((&run.stream, &another_wrapper), &view, &mut output, run.coefficients, false);
    drop(view);
    check("after the refusals", output.reclaim().unwrap().as_slice(), &run.want);
    drop(input.reclaim().unwrap());
}

/// Runs `f`, which must panic with a message containing `why`.
fn assert_panics(why: &str, f: impl FnOnce()) {
    let panic = catch_unwind(AssertUnwindSafe(f)).expect_err(why);
    let text = panic_text(&panic);
    assert!(text.contains(why), "expected a panic naming {why:?}, got {text:?}");
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_queue_and_a_cudarc_stream_convert_both_ways() {
    let Some(gpu) = gpu_or_skip("a_queue_and_a_cudarc_stream_convert_both_ways") else { return };
    let words = random_words(LEN);
    let (first, second) = ((words[8] | 1, words[9]), (words[10] | 1, words[11]));
    let want = expected(&expected(&words, first), second);

    // hetmem's stream to cudarc and back: one CUDA stream, so hetmem's op and cudarc's kernel
    // after it run in order.
    let queue = Queue::new(&gpu.device).unwrap();
    let stream = queue.cudarc_stream(&gpu.ctx).unwrap();
    let again = Queue::from_cudarc(&stream).unwrap();
    assert_eq!(again.cudarc_stream(&gpu.ctx).unwrap().cu_stream(), stream.cu_stream());
    check(
        "hetmem then cudarc on a round-tripped queue",
        &two_steps(&gpu, &again, &stream, &words, first, second),
        &want,
    );

    // cudarc's streams to hetmem: one it made, and its context's default stream.
    for cudarc_made in [gpu.ctx.new_stream().unwrap(), gpu.ctx.default_stream()] {
        let queue = Queue::from_cudarc(&cudarc_made).unwrap();
        check(
            "a queue on a cudarc stream",
            &two_steps(&gpu, &queue, &cudarc_made, &words, first, second),
            &want,
        );
        drop(queue);
        // hetmem borrowed the stream: cudarc's still works after the queue is gone.
        let zeros = cudarc_made.alloc_zeros::<u32>(16).unwrap();
        assert_eq!(cudarc_made.clone_dtoh(&zeros).unwrap(), vec![0; 16]);
    }

    // The per-thread default stream is another stream on each thread.
    let error = Queue::from_cudarc(&gpu.ctx.per_thread_stream()).unwrap_err().to_string();
    assert!(error.contains("per-thread"), "{error}");

    // A wrapper that outlives its queue still names a live stream.
    let wrapper = Queue::new(&gpu.device).unwrap().cudarc_stream(&gpu.ctx).unwrap();
    let zeros = wrapper.alloc_zeros::<u32>(16).unwrap();
    assert_eq!(wrapper.clone_dtoh(&zeros).unwrap(), vec![0; 16]);
    wrapper.synchronize().unwrap();
}

/// `affine_u32` by hetmem on `queue`, then `scale_add` by cudarc on `stream` (the queue's own),
/// with no wait in between; the final output.
fn two_steps(
    gpu: &Gpu,
    queue: &Queue,
    stream: &CudaStream,
    words: &[u32],
    first: (u32, u32),
    second: (u32, u32),
) -> Vec<u32> {
    let input = queue.share(input_buffer(queue, words));
    let mut middle = queue.lend(poisoned_buffer(queue, words.len()));
    let mut output = queue.lend(poisoned_buffer(queue, words.len()));
    affine_u32(queue, &input, &mut middle, first.0, first.1).unwrap();
    gpu.launch_into((stream, stream), &middle.cudarc_view(stream).unwrap(), &mut output, second, false);
    let result = output.reclaim().unwrap().as_slice().to_vec();
    drop((input.reclaim().unwrap(), middle.reclaim().unwrap()));
    result
}

#[test]
fn views_are_refused_on_the_cpu_backend_by_name() {
    // No cudarc stream can be made without a GPU, so the CPU-backend refusal is checked with a
    // GPU's stream and a CPU-backend lease.
    let Some(gpu) = gpu_or_skip("views_are_refused_on_the_cpu_backend_by_name") else { return };
    let stream = Queue::new(&gpu.device).unwrap().cudarc_stream(&gpu.ctx).unwrap();
    let cpu = crate::support::cpu_device();
    let cpu_queue = Queue::new(&cpu).unwrap();
    let shared = cpu_queue.share(HostBuf::<u32>::pinned(&cpu, 3, PinOptions::default()).unwrap());
    let error = shared.cudarc_view(&stream).unwrap_err().to_string();
    assert!(error.contains("CPU backend"), "{error}");
    let mut lent = cpu_queue.lend(HostBuf::<u32>::pinned(&cpu, 3, PinOptions::default()).unwrap());
    let error = lent.cudarc_host_mut(&stream).unwrap_err().to_string();
    assert!(error.contains("CPU backend"), "{error}");
    let error = cpu_queue.cudarc_stream(&gpu.ctx).unwrap_err().to_string();
    assert!(error.contains("CPU backend"), "{error}");

    // Pinned memory that is not mapped has no address a kernel could use.
    let queue = Queue::new(&gpu.device).unwrap();
    let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
    let lent: Lent<HostBuf<u32>> = queue.lend(HostBuf::pinned(&gpu.device, 64, unmapped).unwrap());
    let own = queue.cudarc_stream(&gpu.ctx).unwrap();
    let error = lent.cudarc_view(&own).unwrap_err().to_string();
    assert!(error.contains("not mapped"), "{error}");
}

#[test]
fn the_interop_kernels_compile() {
    if nvrtc_or_skip("the_interop_kernels_compile").is_none() {
        return;
    }
    let cubin = nvrtc::compile_cubin(KERNELS.name, KERNELS.source, DEFAULT_CHECK_ARCH, KERNELS.options)
        .unwrap_or_else(|error| panic!("{error}"));
    for entry in KERNELS.entry_points {
        assert!(cubin.windows(entry.len()).any(|window| window == entry.as_bytes()), "{entry} missing");
    }
}

/// The views' types name what cudarc may do with them: both read, only the `Lent`'s writes;
/// a lent buffer's host view is host memory for cudarc's copies.
#[allow(dead_code, reason = "checked by the compiler, never run")]
fn views_implement_cudarc_s_traits(
    read: CudarcView<'_, u32>,
    write: CudarcViewMut<'_, u32>,
    host: CudarcHostMut<'_, u32>,
) {
    fn reads(_: &impl DevicePtr<u32>) {}
    fn writes(_: &mut impl DevicePtrMut<u32>) {}
    fn host_memory(_: &mut impl HostSlice<u32>) {}
    let mut write = write;
    let mut host = host;
    reads(&read);
    reads(&write);
    writes(&mut write);
    host_memory(&mut host);
}
