//! The maximum-intensity projection: [`mip_height`] and its CPU reference.

use rayon::prelude::*;

use super::{HuLease, HuWindow, VolumeShape};
use crate::backend::cuda::LaunchConfig;
use crate::error::Result;
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue};
use crate::kernels::{self, CT};
use crate::memory::WritableBuffer;

/// The CPU path: the brightest voxel of each column front to back, a `depth x width` picture
/// (`out[z * width + x]`), like a coronal X-ray.
///
/// # Errors
/// A slice that does not hold `shape`.
pub fn mip_height_cpu(shape: VolumeShape, hu: &[i16]) -> Result<Vec<i16>> {
    shape.check_len("maximum-intensity projection", hu.len())?;
    let mut out = vec![i16::MIN; shape.depth() * shape.width()];
    let slice = shape.height() * shape.width();
    out.par_chunks_mut(shape.width()).zip(hu.par_chunks(slice)).for_each(|(row, slice)| {
        for line in slice.chunks(shape.width()) {
            for (best, &value) in row.iter_mut().zip(line) {
                *best = (*best).max(value);
            }
        }
    });
    Ok(out)
}

/// Queues the projection of `hu` into `out` (`depth * width` values): the `mip_height` kernel
/// on the GPU, the CPU path on the CPU backend.
///
/// # Errors
/// Buffers that do not hold `shape` or the picture, leases of another queue, or a kernel that
/// fails to compile or launch.
pub fn mip_height<H: HuLease, O>(queue: &Queue, shape: VolumeShape, hu: &H, out: &mut Lent<O>) -> Result<()>
where
    O: WritableBuffer<Elem = i16>,
{
    shape.check_len("maximum-intensity projection", hu.len())?;
    let picture = VolumeShape::new(shape.depth(), 1, shape.width())?;
    picture.check_len("maximum-intensity projection output", out.len())?;
    let Some(device) = queue.cuda_device() else {
        let projection = hu.cpu_read(|hu| mip_height_cpu(shape, hu))??;
        return out.cpu_write(|out| out.copy_from_slice(&projection));
    };
    let kernel = kernels::kernel(device, &CT, "mip_height")?;
    let blocks = device.attributes().multiprocessor_count * 8;
    let args = KernelArgs::new()
        .read(hu)
        .value(shape.depth() as u64)
        .value(shape.height() as u64)
        .value(shape.width() as u64)
        .write(out);
    // SAFETY: mip_height(const i16* hu, u64 depth, u64 height, u64 width, i16* out): the
    // arguments match in order and type; hu holds depth*height*width values and out
    // depth*width (checked above).
    unsafe { queue.launch(&kernel, LaunchConfig::linear(picture.voxels(), 256, blocks), args) }
}

/// Grey levels for a picture of HU values: `window.lo()` and below black, `window.hi()` and above
/// white, linear between.
pub fn window_to_gray(values: &[i16], window: HuWindow) -> Vec<u8> {
    let (lo, span) = (f32::from(window.lo()), f32::from(window.hi()) - f32::from(window.lo()));
    values
        .iter()
        .map(|&v| {
            if span <= 0.0 {
                255 * u8::from(v >= window.hi())
            } else {
                ((f32::from(v) - lo) / span * 255.0).round().clamp(0.0, 255.0) as u8
            }
        })
        .collect()
}
