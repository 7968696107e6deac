//! Managed (unified) memory with explicit prefetches.
//!
//! A `ManagedBuf` has one address that is valid on the CPU and the GPU; the driver migrates its
//! pages to whichever side touches them. Migration on first touch means page faults, which are
//! slow on the GPU, so this example prefetches both buffers to the GPU before the kernel and the
//! output back to the host before the CPU reads it. Without a GPU the same program runs on
//! hetmem's CPU backend, where managed buffers are plain memory and prefetch and advice do
//! nothing.
//!
//! Run with `cargo run -p hetmem --example managed_prefetch`.

use hetmem::{Device, ManagedBuf, Queue, backend::cuda::Advice, backend::cuda::MemLocation, ops};

/// Words per buffer: a bit over 4 MiB, and not a multiple of the block size.
const LEN: usize = (1 << 20) + 7;

mod support;

use support::{XorShift32, check};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    if let Some(reason) = device.cpu_fallback_reason() {
        println!("  no GPU in use: {reason}");
    }
    if let Some(cuda) = device.as_cuda() {
        // hetmem only hands out managed buffers where the CPU and GPU may touch them at once.
        println!("  concurrent managed access: {}", cuda.attributes().concurrent_managed_access);
    }
    let queue = Queue::new(&device)?;
    // The GPU to prefetch to: the queue's device, when it is a GPU.
    let gpu = queue.cuda_device().map(|cuda| cuda.ordinal());

    // 1. Managed buffers, filled on the CPU: the pages start out on the host.
    let mut input = ManagedBuf::<u32>::new(&device, LEN)?;
    let output = ManagedBuf::<u32>::new(&device, LEN)?;
    let mut rng = XorShift32::from_time();
    input.as_mut_slice().fill_with(|| rng.next_u32());
    let (a, b) = (rng.next_u32() | 1, rng.next_u32());
    let mut expected = vec![0u32; LEN];
    ops::affine_u32_cpu(input.as_slice(), &mut expected, a, b);

    // 2. The input is written once (above) and from now on only read, by the kernel and by the
    //    check at the end. `ReadMostly` lets the driver keep a read-only copy on each side that
    //    reads it instead of moving the pages back and forth: the prefetch to the GPU then
    //    duplicates the pages rather than migrating them, and the CPU's later reads hit its own
    //    copy instead of faulting the pages back. (A write would invalidate the other copies,
    //    which is why it only suits data that is rarely written.)
    input.advise(Advice::ReadMostly)?;

    // 3. Lend both buffers to the queue: the CPU cannot touch them until they are reclaimed.
    let mut input_lent = queue.lend(input);
    let mut output_lent = queue.lend(output);

    // 4. Prefetch both to the GPU, queued before the kernel, so the kernel finds its pages
    //    resident instead of faulting them in one by one.
    if let Some(ordinal) = gpu {
        input_lent.prefetch(MemLocation::Device(ordinal))?;
        output_lent.prefetch(MemLocation::Device(ordinal))?;
        println!("queued prefetches of input and output to GPU {ordinal}");
    } else {
        println!("CPU backend: no prefetch needed, the memory is already where the work runs");
    }

    // 5. The kernel. A `Lent` lease is accepted as the input as well as a `Shared` one.
    ops::affine_u32(&queue, &input_lent, &mut output_lent, a, b)?;
    println!("queued affine_u32 (y = x * {a:#x} + {b:#x}) on the {} queue", queue.backend());

    // 6. Bring the output back to the host, queued after the kernel, so the CPU's reads below do
    //    not fault page by page. (A no-op on the CPU backend.)
    output_lent.prefetch(MemLocation::Host)?;

    // 7. Reclaim (waits for the kernel and the prefetches) and check.
    let output = output_lent.reclaim()?;
    let input = input_lent.reclaim()?;
    check("managed_prefetch", output.as_slice(), &expected)?;
    // The input was only read: it must be unchanged.
    let mut recomputed = vec![0u32; LEN];
    ops::affine_u32_cpu(input.as_slice(), &mut recomputed, a, b);
    check("managed_prefetch (input unchanged)", &recomputed, &expected)?;
    println!("ok: {LEN} words match the CPU reference on the {} backend", queue.backend());
    Ok(())
}
