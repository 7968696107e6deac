//! Zero-copy: a kernel reads and writes pinned, mapped host memory directly.
//!
//! The input and output live in page-locked host memory that is also mapped into the GPU's
//! address space, so `affine_u32` (`y = x * a + b`) reads the input and writes the output over
//! the bus without any copy to or from device memory. Without a GPU the same program runs on
//! hetmem's CPU backend.
//!
//! Run with `cargo run -p hetmem --example zero_copy` (set `HETMEM_BACKEND=cpu` to force the CPU).

use hetmem::{Device, HostBuf, PinOptions, Queue, ops};

/// Words per buffer: a bit over 4 MiB, and not a multiple of the block size, so the kernel's
/// tail handling is exercised too.
const LEN: usize = (1 << 20) + 7;

mod support;

use support::{XorShift32, check};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The best device: the first GPU, else the CPU (with the reason).
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    if let Some(reason) = device.cpu_fallback_reason() {
        println!("  no GPU in use: {reason}");
    }
    if let Some(cuda) = device.as_cuda() {
        // Zero-copy needs the device to map host memory into its address space.
        let can_map = cuda.attributes().can_map_host_memory;
        println!("  can map host memory: {can_map}");
        if !can_map {
            println!("  (pinned buffers will not be mapped, and the kernel launch will be refused)");
        }
    }
    let queue = Queue::new(&device)?;

    // 2. Pinned host buffers. `PinOptions::default()` has `mapped: true`, so on a GPU each
    //    buffer also gets a device address that kernels can dereference. On the CPU backend they
    //    are plain page-aligned memory and have no device address.
    let mut input = HostBuf::<u32>::pinned(&device, LEN, PinOptions::default())?;
    let output = HostBuf::<u32>::pinned(&device, LEN, PinOptions::default())?;
    for (name, buf) in [("input", &input), ("output", &output)] {
        println!(
            "{name}: {} words, {:?}, mapped: {}, device pointer: {}",
            buf.as_slice().len(),
            buf.kind(),
            buf.is_mapped(),
            buf.device_ptr().map_or_else(|| "none".to_string(), |ptr| format!("{ptr:#x}")),
        );
    }

    // 3. Fill the input on the CPU, straight into the pinned memory: no staging copy.
    let mut rng = XorShift32::from_time();
    input.as_mut_slice().fill_with(|| rng.next_u32());
    let (a, b) = (rng.next_u32() | 1, rng.next_u32());
    // The CPU reference, computed before the buffers are handed over.
    let mut expected = vec![0u32; LEN];
    ops::affine_u32_cpu(input.as_slice(), &mut expected, a, b);

    // 4. Hand the buffers to the queue. `share` lets the GPU read the input (and the CPU still
    //    read it); `lend` gives the GPU the output exclusively: from here until `reclaim`, the
    //    compiler refuses any CPU access to it.
    let input = queue.share(input);
    let mut output = queue.lend(output);

    // 5. The kernel reads `input` and writes `output` in host memory, over the bus.
    ops::affine_u32(&queue, &input, &mut output, a, b)?;
    println!("queued affine_u32 (y = x * {a:#x} + {b:#x}) on the {} queue", queue.backend());

    // 6. Reclaiming waits for the kernel, then gives the buffers back to the CPU.
    let output = output.reclaim()?;
    let input = input.reclaim()?;

    // 7. Check every word against the CPU computation.
    check("zero_copy", output.as_slice(), &expected)?;
    println!(
        "ok: {LEN} words match the CPU reference (e.g. {:#010x} -> {:#010x}) on the {} backend",
        input.as_slice()[0],
        output.as_slice()[0],
        queue.backend()
    );
    Ok(())
}
