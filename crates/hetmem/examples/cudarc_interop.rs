//! cudarc kernels on hetmem's memory: a stream shared both ways, mapped host buffers and a
//! registered read-only file read by a kernel launched through cudarc, under the hand-off.
//!
//! 1. cudarc makes the context and a stream; `Queue::from_cudarc` makes a hetmem queue on that
//!    stream, and `queue.cudarc_stream` hands the same stream back to cudarc.
//! 2. The kernel (`cudarc_interop.cu`) is compiled by hetmem's kernel cache and loaded by cudarc.
//! 3. A cudarc kernel reads a shared, mapped `HostBuf` and writes a lent one; hetmem's
//!    `affine_u32` then reads that on the same stream, with no wait in between. The result is
//!    checked against the CPU on fresh random data, the outputs poisoned first.
//! 4. The kernel reads a file mapped read-only and registered with the GPU (`MappedFile`).
//!
//! Without a GPU, cudarc has nothing to run on: the example says so and runs the same steps
//! by hetmem's CPU backend, checked the same way.
//!
//! Run with `cargo run -p hetmem --example cudarc_interop`.

use std::error::Error;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use hetmem::kernels::KernelSource;
use hetmem::{Device, HostBuf, MappedFile, PinOptions, Queue, ops};

mod support;

use support::{XorShift32, check};

/// Words per buffer: a bit over 4 MiB, and not a multiple of the block size.
const LEN: usize = (1 << 20) + 7;

/// Written into outputs first, so a word the GPU never wrote cannot pass for a right one.
const POISON: u32 = 0xA5A5_A5A5;

/// The kernel, a user's own: hetmem compiles it with NVRTC and caches the machine code.
static KERNELS: KernelSource = KernelSource {
    name: "cudarc_interop",
    source: include_str!("cudarc_interop.cu"),
    entry_points: &["scale_add", "slow_scale_add"],
    options: &[],
    ptx: None,
};

fn main() -> Result<(), Box<dyn Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    let mut rng = XorShift32::from_time();
    let words: Vec<u32> = (0..LEN).map(|_| rng.next_u32()).collect();
    let (first, second) = ((rng.next_u32() | 1, rng.next_u32()), (rng.next_u32() | 1, rng.next_u32()));
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), bytemuck::cast_slice::<u32, u8>(&words))?;
    // SAFETY: a file mapping is sound only while nobody truncates or writes the file; this one
    // is a fresh temporary file, written above and deleted after the mapping is dropped.
    let mapped = unsafe { MappedFile::<u32>::open(&device, file.path()) }?;

    let steps = Steps { words: &words, file: mapped, first, second };
    let (chained, from_file) = match &device {
        Device::Cuda(_) => on_the_gpu(&device, steps)?,
        Device::Cpu(_) => {
            let reason =
                device.cpu_fallback_reason().map_or("the CPU backend was chosen".into(), |r| r.to_string());
            println!("cudarc needs a GPU ({reason}): running the same steps by hetmem's CPU backend");
            on_the_cpu(&device, steps)?
        }
    };

    let mut once = vec![0; LEN];
    ops::affine_u32_cpu(&words, &mut once, first.0, first.1);
    let mut twice = vec![0; LEN];
    ops::affine_u32_cpu(&once, &mut twice, second.0, second.1);
    check("kernel then affine_u32 on one stream", &chained, &twice)?;
    check("kernel reading the registered file", &from_file, &once)?;
    println!("ok: {LEN} words, twice, match the CPU reference on the {} backend", device.backend());
    Ok(())
}

/// What both paths compute: `words` through `first` then `second` (`y = x * a + b`), and the
/// file through `first`.
struct Steps<'a> {
    words: &'a [u32],
    file: MappedFile<u32>,
    first: (u32, u32),
    second: (u32, u32),
}

/// The chained result and the file's.
type Results = (Vec<u32>, Vec<u32>);

/// The steps by cudarc and hetmem on one stream.
fn on_the_gpu(
    device: &Device,
    Steps { words, file, first, second }: Steps<'_>,
) -> Result<Results, Box<dyn Error>> {
    let Device::Cuda(cuda) = device else { unreachable!("called for CUDA devices") };

    // 1. One stream, both ways: cudarc's stream as a hetmem queue, and back.
    let ctx = CudaContext::new(cuda.ordinal())?;
    let stream = ctx.new_stream()?;
    let queue = Queue::from_cudarc(&stream)?;
    let back = queue.cudarc_stream(&ctx)?;
    println!(
        "cudarc stream {:?} is the queue's stream: {}",
        stream.cu_stream(),
        back.cu_stream() == stream.cu_stream()
    );

    // 2. hetmem's kernel cache compiles the kernel for this GPU; cudarc loads it.
    let (cubin, outcome) =
        hetmem::kernels::cache().get_or_compile(&KERNELS, &cuda.compute_capability().sm_name())?;
    let scale_add = ctx.load_module(Ptx::from_binary(cubin))?.load_function("scale_add")?;
    println!("kernel scale_add: {outcome:?} in hetmem's kernel cache, loaded by cudarc");

    // 3. cudarc's kernel reads a shared mapped buffer and writes a lent one; hetmem's
    //    affine_u32 reads that on the same stream, queued straight after.
    let mut input = HostBuf::<u32>::pinned(device, LEN, PinOptions::default())?;
    input.as_mut_slice().copy_from_slice(words);
    let input = queue.share(input);
    let mut middle = queue.lend(poisoned(device)?);
    let mut output = queue.lend(poisoned(device)?);
    {
        let input = input.cudarc_view(&stream)?;
        let mut middle = middle.cudarc_view_mut(&stream)?;
        launch(&scale_add, &stream, &input, &mut middle, first)?;
    } // the views drop: each lease records a fence after the kernel
    ops::affine_u32(&queue, &middle, &mut output, second.0, second.1)?;
    let chained = output.reclaim()?.as_slice().to_vec(); // waits for both kernels
    drop((input.reclaim()?, middle.reclaim()?));

    // 4. The same kernel reads a file mapped read-only and registered with the GPU.
    println!("file mapping registered with the GPU (read-only): {}", file.is_registered());
    let file = queue.share(file);
    let mut output = queue.lend(poisoned(device)?);
    {
        let file = file.cudarc_view(&stream)?;
        let mut output = output.cudarc_view_mut(&stream)?;
        launch(&scale_add, &stream, &file, &mut output, first)?;
    }
    let from_file = output.reclaim()?.as_slice().to_vec();
    drop(file.reclaim()?);
    Ok((chained, from_file))
}

/// The same steps by hetmem's CPU backend, where `affine_u32` stands in for the kernel.
fn on_the_cpu(
    device: &Device,
    Steps { words, file, first, second }: Steps<'_>,
) -> Result<Results, Box<dyn Error>> {
    let queue = Queue::new(device)?;
    let mut input = HostBuf::<u32>::pinned(device, LEN, PinOptions::default())?;
    input.as_mut_slice().copy_from_slice(words);
    let input = queue.share(input);
    let mut middle = queue.lend(poisoned(device)?);
    let mut output = queue.lend(poisoned(device)?);
    ops::affine_u32(&queue, &input, &mut middle, first.0, first.1)?;
    ops::affine_u32(&queue, &middle, &mut output, second.0, second.1)?;
    let chained = output.reclaim()?.as_slice().to_vec();

    let file = queue.share(file);
    let mut output = queue.lend(poisoned(device)?);
    ops::affine_u32(&queue, &file, &mut output, first.0, first.1)?;
    Ok((chained, output.reclaim()?.as_slice().to_vec()))
}

fn poisoned(device: &Device) -> hetmem::Result<HostBuf<u32>> {
    let mut buf = HostBuf::<u32>::pinned(device, LEN, PinOptions::default())?;
    buf.as_mut_slice().fill(POISON);
    Ok(buf)
}

/// Queues `scale_add(input, output, n, a, b)` on `stream`.
fn launch(
    scale_add: &CudaFunction,
    stream: &Arc<CudaStream>,
    input: &impl DevicePtr<u32>,
    output: &mut impl DevicePtrMut<u32>,
    (a, b): (u32, u32),
) -> Result<(), Box<dyn Error>> {
    let n = u32::try_from(input.len())?;
    // Each address comes with what cudarc drops once the work using it is queued.
    let (input_ptr, _input_queued) = input.device_ptr(stream);
    let (output_ptr, _output_queued) = output.device_ptr_mut(stream);
    let mut builder = stream.launch_builder(scale_add);
    builder.arg(&input_ptr).arg(&output_ptr).arg(&n).arg(&a).arg(&b);
    let config = LaunchConfig { grid_dim: (1024, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: scale_add(const unsigned*, unsigned*, unsigned n, unsigned a, unsigned b) matches
    // the arguments; it reads n words of the input and writes n of the output, which have n
    // words each; it is queued on the stream both addresses were asked for, while the views
    // and their SyncOnDrops live; it writes only the output, whose view is a DevicePtrMut.
    unsafe { builder.launch(config) }?;
    Ok(())
}
