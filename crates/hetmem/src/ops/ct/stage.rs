//! [`MaskedGaussianStage`]: the masked 3-D Gaussian as a [`Stage`] over volume frames, so that
//! every strategy of the pipeline ([`crate::FrameFilter`], [`crate::FrameRing`]) runs it: the
//! inputs are the HU volume (i16) and its label template (u8), the output the smoothed volume
//! (f32), each a [`FrameLayout::volume`]; the Gaussian's weights are its constant data.

use std::borrow::Cow;
use std::sync::Arc;

use super::smooth::{queue_masked_gaussian, radius_of};
use super::{VolumeShape, gaussian_weights, masked_gaussian_cpu};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::handoff::{Lease, Lent, Queue, Shared};
use crate::memory::{Buffer, DeviceBuf, HostBuf, PinOptions, WritableBuffer};
use crate::placement::Where;
use crate::stage::Strategy;
use crate::stage::{ConstantUse, FrameLayout, Runs, ScalarType, Stage};

/// The masked Gaussian of one organ of `depth x height x width` volumes, as a stage: input 0
/// the HU values (i16), input 1 the labels (u8), output 0 the organ smoothed and the rest of
/// the volume as it was (f32). On the GPU the four kernels of [`super::masked_gaussian`], on the
/// CPU [`masked_gaussian_cpu`]; they agree within 1e-5 relative.
///
/// # Examples
/// ```
/// use hetmem::ops::ct::{MaskedGaussianStage, VolumeShape};
/// use hetmem::{Device, FrameFilter, Strategy};
///
/// let device = Device::open_best()?;
/// let stage = MaskedGaussianStage::new(VolumeShape::new(8, 32, 32)?, 3, 1.5)?;
/// let mut filter = FrameFilter::with_stage(&device, Strategy::Auto, stage)?;
/// let hu: Vec<i16> = (0..8 * 32 * 32).map(|i| (i % 200) as i16).collect();
/// filter.input_mut_at(0)?.copy_from_slice(bytemuck::cast_slice(&hu));
/// filter.input_mut_at(1)?.fill(3); // every voxel is the organ
/// filter.run()?;
/// assert_eq!(filter.output()?.len(), 8 * 32 * 32 * 4);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct MaskedGaussianStage {
    shape: VolumeShape,
    organ: u8,
    weights: Arc<[f32]>,
    inputs: [FrameLayout; 2],
    output: [FrameLayout; 1],
}

/// What a [`MaskedGaussianStage`] keeps per queue: its weights where they were placed.
#[derive(Debug)]
pub struct MaskedGaussianPrepared {
    weights: Weights,
}

#[derive(Debug)]
enum Weights {
    /// A CPU-backend queue: the CPU path reads the stage's own weights.
    Cpu,
    Device(Shared<DeviceBuf<f32>>),
    Mapped(Shared<HostBuf<f32>>),
}

impl MaskedGaussianStage {
    /// The smoothing of the voxels labelled `organ` in `shape` volumes, by a Gaussian of
    /// `sigma` voxels ([`gaussian_weights`]).
    ///
    /// # Errors
    /// `sigma` out of range, or a volume too large to lay out.
    pub fn new(shape: VolumeShape, organ: u8, sigma: f32) -> Result<MaskedGaussianStage> {
        let layout = |element| FrameLayout::volume(shape.depth(), shape.height(), shape.width(), element);
        Ok(MaskedGaussianStage {
            shape,
            organ,
            weights: gaussian_weights(sigma)?.into(),
            inputs: [layout(ScalarType::I16)?, layout(ScalarType::U8)?],
            output: [layout(ScalarType::F32)?],
        })
    }

    /// The volumes' shape.
    pub fn shape(&self) -> VolumeShape {
        self.shape
    }

    /// Bytes of weights the kernels read per frame: each of the three passes reads every tap
    /// for every voxel.
    fn weight_bytes_read(&self) -> u64 {
        3 * self.shape.voxels() as u64 * std::mem::size_of_val(&self.weights[..]) as u64
    }
}

impl Stage for MaskedGaussianStage {
    type Prepared = MaskedGaussianPrepared;

    fn inputs(&self) -> &[FrameLayout] {
        &self.inputs
    }

    fn outputs(&self) -> &[FrameLayout] {
        &self.output
    }

    fn runs(&self) -> Runs {
        Runs { gpu: true, cpu: true }
    }

    fn constants(&self, _device: &Device) -> Vec<ConstantUse> {
        vec![ConstantUse {
            name: "gaussian weights".into(),
            bytes: std::mem::size_of_val(&self.weights[..]) as u64,
            bytes_read_per_frame: self.weight_bytes_read(),
        }]
    }

    fn prepare(
        &self,
        queue: &Queue,
        _strategy: Strategy,
        constants: &[Where],
    ) -> Result<MaskedGaussianPrepared> {
        if queue.cuda_device().is_none() {
            return Ok(MaskedGaussianPrepared { weights: Weights::Cpu });
        }
        let &[place] = constants else {
            return Err(Error::invalid(
                "masked Gaussian stage",
                format!("{} places for its one constant buffer, the weights", constants.len()),
            ));
        };
        let device = queue.device();
        let weights = match place {
            Where::Device => {
                let mut buffer = DeviceBuf::<f32>::new(&device, self.weights.len())?;
                buffer.copy_from_slice(&self.weights)?;
                Weights::Device(queue.share(buffer))
            }
            Where::Mapped => {
                let mut buffer = HostBuf::<f32>::pinned(&device, self.weights.len(), PinOptions::default())?;
                buffer.as_mut_slice().copy_from_slice(&self.weights);
                Weights::Mapped(queue.share(buffer))
            }
        };
        Ok(MaskedGaussianPrepared { weights })
    }

    fn queue<I, O>(
        &self,
        prepared: &mut MaskedGaussianPrepared,
        queue: &Queue,
        inputs: &[I],
        outputs: &mut [Lent<O>],
    ) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        let (Some(gpu), [hu, labels], [out]) = (queue.cuda_device(), inputs, outputs) else {
            return Err(Error::invalid(
                "masked Gaussian stage",
                "queued without a GPU, or without its two inputs and one output: run it through a \
                 FrameFilter or FrameRing",
            ));
        };
        let radius = radius_of(self.weights.len())?;
        let (shape, organ) = (self.shape, self.organ);
        match &prepared.weights {
            Weights::Device(weights) => {
                queue_masked_gaussian(queue, gpu, shape, hu, labels, organ, weights, radius, out)
            }
            Weights::Mapped(weights) => {
                queue_masked_gaussian(queue, gpu, shape, hu, labels, organ, weights, radius, out)
            }
            Weights::Cpu => Err(Error::NeedsGpu {
                what: "the masked Gaussian stage's GPU path".into(),
                detail: "it was prepared on a queue of the CPU backend".into(),
            }),
        }
    }

    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let (&[hu, labels], [out]) = (inputs, outputs) else {
            return Err(Error::invalid("masked Gaussian stage", "it takes two inputs and one output"));
        };
        // The pipeline's buffers are aligned allocations; a slice that is not is decoded.
        let hu: Cow<[i16]> = match bytemuck::try_cast_slice(hu) {
            Ok(values) => Cow::Borrowed(values),
            Err(_) => Cow::Owned(hu.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]])).collect()),
        };
        let smoothed = masked_gaussian_cpu(self.shape, &hu, labels, self.organ, &self.weights)?;
        for (bytes, value) in out.chunks_exact_mut(4).zip(&smoothed) {
            bytes.copy_from_slice(&value.to_le_bytes());
        }
        Ok(())
    }

    /// The volume and the template are each read twice (masking, then finishing), and the
    /// weights by every voxel of every pass when they are mapped.
    fn mapped_bytes_read(&self, prepared: &MaskedGaussianPrepared, _strategy: Strategy) -> u64 {
        let frames: u64 = self.inputs.iter().map(|layout| layout.bytes() as u64).sum();
        let weights = match prepared.weights {
            Weights::Mapped(_) => self.weight_bytes_read(),
            Weights::Device(_) | Weights::Cpu => 0,
        };
        2 * frames + weights
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_path_reads_a_volume_at_any_alignment_and_writes_little_endian_f32() {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let shape = VolumeShape::new(rng.usize(2..6), rng.usize(3..20), rng.usize(3..20)).unwrap();
        let hu: Vec<i16> = (0..shape.voxels()).map(|_| rng.i16(-1024..3072)).collect();
        let labels: Vec<u8> = (0..shape.voxels()).map(|_| rng.u8(0..3)).collect();
        let stage = MaskedGaussianStage::new(shape, 1, 1.0).unwrap();
        let expected = masked_gaussian_cpu(shape, &hu, &labels, 1, &gaussian_weights(1.0).unwrap()).unwrap();
        // One byte in, so the HU bytes are misaligned for i16 whatever the allocator gave.
        let mut shifted = vec![0u8; 2 * hu.len() + 2];
        let at = if (shifted.as_ptr() as usize).is_multiple_of(2) { 1 } else { 0 };
        shifted[at..at + 2 * hu.len()].copy_from_slice(bytemuck::cast_slice(&hu));
        let mut out = vec![0xA5u8; 4 * shape.voxels()];
        stage.run_cpu(&[&shifted[at..at + 2 * hu.len()], &labels], &mut [&mut out]).unwrap();
        for (i, (bytes, want)) in out.chunks_exact(4).zip(&expected).enumerate() {
            let got = f32::from_le_bytes(bytes.try_into().unwrap());
            assert_eq!(got.to_bits(), want.to_bits(), "voxel {i}");
        }
        let error = stage.run_cpu(&[&labels], &mut [&mut out]).unwrap_err().to_string();
        assert!(error.contains("two inputs"), "{error}");
    }
}
