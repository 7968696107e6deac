//! `y = x * a + b` over 32-bit words (mod 2^32): the smallest operation that proves a memory
//! path end to end. Every input word is read once and every output word written once, so a
//! wrong index or a missed word shows in the result.

use crate::backend::cuda::LaunchConfig;
use crate::error::{Error, Result};
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue};
use crate::kernels::{self, AFFINE};
use crate::memory::{Buffer, WritableBuffer};

/// The CPU path: `output[i] = input[i] * a + b`, wrapping.
///
/// # Panics
/// When the slices differ in length.
pub fn affine_u32_cpu(input: &[u32], output: &mut [u32], a: u32, b: u32) {
    assert_eq!(input.len(), output.len(), "affine_u32_cpu: lengths differ");
    for (y, &x) in output.iter_mut().zip(input) {
        *y = x.wrapping_mul(a).wrapping_add(b);
    }
}

/// Queues `output[i] = input[i] * a + b` on `queue`: the `affine_u32` kernel on the GPU, the
/// CPU path on the CPU backend (which runs before this returns).
///
/// # Errors
/// Buffers of different lengths, leases of another queue, a buffer the device cannot address,
/// or a kernel that fails to compile or launch.
pub fn affine_u32<I, O>(queue: &Queue, input: &I, output: &mut Lent<O>, a: u32, b: u32) -> Result<()>
where
    I: Lease,
    I::Buf: Buffer<Elem = u32>,
    O: WritableBuffer<Elem = u32>,
{
    let len = input.len();
    if output.len() != len {
        return Err(Error::invalid(
            "affine_u32",
            format!("input of {len} words, output of {}", output.len()),
        ));
    }
    let Some(device) = queue.cuda_device() else {
        crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Launch)?;
        return input.cpu_read(|x| output.cpu_write(|y| affine_u32_cpu(x, y, a, b)))?;
    };
    let kernel = kernels::kernel(device, &AFFINE, "affine_u32")?;
    let blocks = device.attributes().multiprocessor_count * 8;
    let args = KernelArgs::new().read(input).write(output).value(len as u64).value(a).value(b);
    // SAFETY: affine_u32(const u32* x, u32* y, u64 n, u32 a, u32 b): the arguments match in
    // order and type, and the kernel touches x[0..n) and y[0..n), both n words long.
    unsafe { queue.launch(&kernel, LaunchConfig::linear(len, 256, blocks), args) }
}
