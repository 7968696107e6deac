//! The masked, separable 3-D Gaussian: [`masked_gaussian`] and its CPU reference.
//!
//! Smoothing only an organ without bleeding its neighbours in: the numerator (HU where the
//! label is the organ, 0 elsewhere) and the denominator (1 there, 0 elsewhere) are each
//! convolved along x, then y, then z; inside the organ the result is their quotient, outside it
//! the HU value. Both paths add the taps in the same order without fused multiply-adds, so they
//! agree to rounding.

use rayon::prelude::*;

use super::{HuLease, LabelLease, VolumeShape};
use crate::backend::cuda::LaunchConfig;
use crate::error::{Error, Result};
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue};
use crate::kernels::{self, CT};
use crate::memory::{Buffer, DeviceBuf, Sealed, WritableBuffer};

/// The widest smoothing taken, in voxels (a wider one wants a smaller volume first).
const MAX_SIGMA: f32 = 8.0;

/// Normalised Gaussian weights of standard deviation `sigma` voxels, `2 * ceil(3 sigma) + 1` of
/// them.
///
/// # Errors
/// `sigma` not in `(0, 8]`.
pub fn gaussian_weights(sigma: f32) -> Result<Vec<f32>> {
    if !(sigma > 0.0 && sigma <= MAX_SIGMA) {
        return Err(Error::invalid(
            "Gaussian sigma",
            format!("{sigma} voxels: give a sigma in (0, {MAX_SIGMA}]"),
        ));
    }
    let radius = (3.0 * sigma).ceil() as i32;
    let raw: Vec<f64> = (-radius..=radius)
        .map(|k| (-f64::from(k * k) / (2.0 * f64::from(sigma) * f64::from(sigma))).exp())
        .collect();
    let total: f64 = raw.iter().sum();
    Ok(raw.iter().map(|w| (w / total) as f32).collect())
}

/// The radius of `weights_len` weights from [`gaussian_weights`].
///
/// # Errors
/// A count [`gaussian_weights`] does not make.
pub(super) fn radius_of(weights_len: usize) -> Result<i32> {
    if weights_len.is_multiple_of(2) || weights_len > 2 * (3 * MAX_SIGMA as usize) + 1 {
        return Err(Error::invalid(
            "Gaussian weights",
            format!("{weights_len} weights: expected an odd count from gaussian_weights"),
        ));
    }
    Ok((weights_len / 2) as i32)
}

/// One axis of the separable convolution, as the `smooth_axis` kernel does it.
fn smooth_axis_cpu(shape: VolumeShape, input: &[f32], output: &mut [f32], axis: usize, weights: &[f32]) {
    let radius = (weights.len() / 2) as i64;
    let (extent, step) = match axis {
        0 => (shape.width(), 1),
        1 => (shape.height(), shape.width()),
        _ => (shape.depth(), shape.width() * shape.height()),
    };
    output.par_chunks_mut(shape.width()).enumerate().for_each(|(row, out)| {
        for (x, value) in out.iter_mut().enumerate() {
            let i = row * shape.width() + x;
            let at = ((i / step) % extent) as i64;
            let mut sum = 0.0f32;
            for k in -radius..=radius {
                let j = at + k;
                if j < 0 || j >= extent as i64 {
                    continue;
                }
                let source = (i as i64 + k * step as i64) as usize;
                sum += weights[(k + radius) as usize] * input[source];
            }
            *value = sum;
        }
    });
}

/// The CPU path: `organ` of the volume smoothed by `weights` ([`gaussian_weights`]) along each
/// axis, the rest of the volume as it is, as f32.
///
/// # Errors
/// Slices that do not hold `shape`, or weights not from [`gaussian_weights`].
pub fn masked_gaussian_cpu(
    shape: VolumeShape,
    hu: &[i16],
    labels: &[u8],
    organ: u8,
    weights: &[f32],
) -> Result<Vec<f32>> {
    shape.check_len("masked Gaussian HU", hu.len())?;
    shape.check_len("masked Gaussian labels", labels.len())?;
    radius_of(weights.len())?;
    let mut num: Vec<f32> =
        hu.par_iter().zip(labels).map(|(&v, &l)| if l == organ { f32::from(v) } else { 0.0 }).collect();
    let mut den: Vec<f32> = labels.par_iter().map(|&l| if l == organ { 1.0 } else { 0.0 }).collect();
    let mut scratch = vec![0.0f32; shape.voxels()];
    for axis in 0..3 {
        smooth_axis_cpu(shape, &num, &mut scratch, axis, weights);
        std::mem::swap(&mut num, &mut scratch);
        smooth_axis_cpu(shape, &den, &mut scratch, axis, weights);
        std::mem::swap(&mut den, &mut scratch);
    }
    Ok(hu
        .par_iter()
        .zip(labels)
        .zip(num.par_iter().zip(&den))
        .map(|((&v, &l), (&n, &d))| if l == organ { n / d } else { f32::from(v) })
        .collect())
}

/// Queues the masked Gaussian of `organ` into `out` (f32, one per voxel): four kernels on the
/// GPU, with four f32 volumes of scratch in device memory, freed when the queue is done with
/// them; the CPU path on the CPU backend.
///
/// `hu`, `labels` and `weights` may be device memory or mapped host memory.
///
/// # Errors
/// Buffers that do not hold `shape`, weights not from [`gaussian_weights`], leases of another
/// queue, device memory exhausted, or a kernel that fails to compile or launch.
pub fn masked_gaussian<H: HuLease, L: LabelLease, W, O>(
    queue: &Queue,
    shape: VolumeShape,
    hu: &H,
    labels: &L,
    organ: u8,
    weights: &W,
    out: &mut Lent<O>,
) -> Result<()>
where
    W: Lease,
    W::Buf: Buffer<Elem = f32>,
    O: WritableBuffer<Elem = f32>,
{
    shape.check_len("masked Gaussian HU", hu.len())?;
    shape.check_len("masked Gaussian labels", labels.len())?;
    shape.check_len("masked Gaussian output", out.len())?;
    let radius = radius_of(weights.len())?;
    let Some(device) = queue.cuda_device() else {
        let smoothed = hu.cpu_read(|hu| {
            labels.cpu_read(|labels| {
                weights.cpu_read(|weights| masked_gaussian_cpu(shape, hu, labels, organ, weights))
            })
        })????;
        return out.cpu_write(|out| out.copy_from_slice(&smoothed));
    };
    queue_masked_gaussian(queue, device, shape, hu, labels, organ, weights, radius, out)
}

/// The GPU work of [`masked_gaussian`] on `device`, on leases of any element type (the volume
/// stage's are bytes): `hu` must hold `shape`'s voxels as i16, `labels` as u8 and `out` as f32,
/// and `weights` the `2 * radius + 1` f32 weights of [`gaussian_weights`], which is checked
/// here in bytes.
#[allow(clippy::too_many_arguments, reason = "the kernel's own arguments, passed through")]
pub(super) fn queue_masked_gaussian<H, L, W, O>(
    queue: &Queue,
    device: &crate::backend::cuda::CudaDevice,
    shape: VolumeShape,
    hu: &H,
    labels: &L,
    organ: u8,
    weights: &W,
    radius: i32,
    out: &mut Lent<O>,
) -> Result<()>
where
    H: Lease,
    L: Lease,
    W: Lease,
    O: WritableBuffer,
{
    let n = shape.voxels();
    let sizes = [
        ("HU volume", bytes_of(hu), 2 * n),
        ("label template", bytes_of(labels), n),
        ("weights", bytes_of(weights), 4 * (2 * radius as usize + 1)),
        ("output", bytes_of(&*out), 4 * n),
    ];
    if let Some((what, got, want)) = sizes.into_iter().find(|(_, got, want)| got != want) {
        return Err(Error::invalid(
            "masked Gaussian",
            format!(
                "the {what} holds {got} bytes; a {}x{}x{} volume needs {want}",
                shape.depth(),
                shape.height(),
                shape.width()
            ),
        ));
    }
    // The kernels read i16 and f32 and write f32 through these addresses; a chunk of a byte
    // buffer (the volume stage's leases) may start anywhere.
    let aligned = [
        ("HU volume", hu.region().device, 2),
        ("weights", weights.region().device, 4),
        ("output", out.region().device, 4),
    ];
    if let Some((what, Some(address), align)) =
        aligned.into_iter().find(|(_, address, align)| address.is_some_and(|a| a % align != 0))
    {
        return Err(Error::invalid(
            "masked Gaussian",
            format!(
                "the {what} starts at device address {address:#x}, not a multiple of {align} bytes as its \
                 elements need: give a whole buffer, or a chunk starting at a multiple of {align} bytes"
            ),
        ));
    }
    let gpu = queue.device();
    let mut scratch = Vec::with_capacity(4);
    for _ in 0..4 {
        scratch.push(queue.lend(DeviceBuf::<f32>::new(&gpu, n)?));
    }
    let [mut num, mut den, mut num2, mut den2]: [Lent<DeviceBuf<f32>>; 4] =
        scratch.try_into().map_err(|_| Error::invalid("masked Gaussian", "scratch buffers"))?;
    let blocks = device.attributes().multiprocessor_count * 8;
    let config = LaunchConfig::linear(n, 256, blocks);
    let mask = kernels::kernel(device, &CT, "mask_organ")?;
    let smooth = kernels::kernel(device, &CT, "smooth_axis")?;
    let finish = kernels::kernel(device, &CT, "masked_finish")?;
    let args = KernelArgs::new()
        .read(hu)
        .read(labels)
        .value(n as u64)
        .value(u32::from(organ))
        .write(&mut num)
        .write(&mut den);
    // SAFETY: mask_organ(const i16* hu, const u8* labels, u64 n, u32 organ, f32* num, f32* den):
    // the arguments match in order and type; every buffer holds n elements (checked above in
    // bytes; the scratch buffers were made so).
    unsafe { queue.launch(&mask, config, args)? };
    for axis in 0..3u32 {
        let args = KernelArgs::new()
            .read(&num)
            .read(&den)
            .write(&mut num2)
            .write(&mut den2)
            .value(shape.depth() as u64)
            .value(shape.height() as u64)
            .value(shape.width() as u64)
            .value(axis)
            .read(weights)
            .value(radius);
        // SAFETY: smooth_axis(const f32* num_in, const f32* den_in, f32* num_out, f32* den_out,
        // u64 depth, u64 height, u64 width, u32 axis, const f32* weights, i32 radius): the
        // arguments match in order and type; the four volumes hold depth*height*width
        // elements, the taps it reads stay inside the volume, and weights holds 2*radius+1.
        unsafe { queue.launch(&smooth, config, args)? };
        std::mem::swap(&mut num, &mut num2);
        std::mem::swap(&mut den, &mut den2);
    }
    let args = KernelArgs::new()
        .read(hu)
        .read(labels)
        .value(n as u64)
        .value(u32::from(organ))
        .read(&num)
        .read(&den)
        .write(out);
    // SAFETY: masked_finish(const i16* hu, const u8* labels, u64 n, u32 organ, const f32* num,
    // const f32* den, f32* out): the arguments match in order and type; all hold n elements.
    unsafe { queue.launch(&finish, config, args) }
}

/// The bytes a lease's buffer holds, whatever its elements.
fn bytes_of<L: Lease>(lease: &L) -> usize {
    lease.region().bytes
}
