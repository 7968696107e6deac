//! [`CpuStage`]: a CPU closure as a stage.

use std::sync::Arc;

use super::Strategy;
use super::{FrameLayout, Runs, Stage};
use crate::error::{Error, Result};
use crate::handoff::{Lease, Lent, Queue};
use crate::memory::{Buffer, WritableBuffer};
use crate::placement::Where;

/// A closure that reads one frame's inputs and writes its outputs.
pub(crate) type CpuFn = dyn Fn(&[&[u8]], &mut [&mut [u8]]) -> Result<()> + Send + Sync;

/// A stage that runs a closure on the CPU: the CPU backend's work, and the reference a GPU
/// stage is tested against. It runs by the CPU strategy only.
///
/// # Examples
/// ```
/// use hetmem::stage::{CpuStage, ScalarType, FrameLayout};
/// let block = FrameLayout::samples(256, ScalarType::F32)?;
/// let gain = CpuStage::map(block.clone(), block, |input, output| {
///     let (x, y): (&[f32], &mut [f32]) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
///     y.iter_mut().zip(x).for_each(|(y, x)| *y = 0.5 * x);
///     Ok(())
/// })?;
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Clone)]
pub struct CpuStage {
    inputs: Vec<FrameLayout>,
    outputs: Vec<FrameLayout>,
    run: Arc<CpuFn>,
}

impl std::fmt::Debug for CpuStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuStage").field("inputs", &self.inputs).field("outputs", &self.outputs).finish()
    }
}

impl CpuStage {
    /// A stage of `inputs` and `outputs` buffers per frame, run by `run`.
    ///
    /// # Errors
    /// No inputs or no outputs.
    pub fn new(
        inputs: Vec<FrameLayout>,
        outputs: Vec<FrameLayout>,
        run: impl Fn(&[&[u8]], &mut [&mut [u8]]) -> Result<()> + Send + Sync + 'static,
    ) -> Result<CpuStage> {
        check_buffers(&inputs, &outputs)?;
        Ok(CpuStage { inputs, outputs, run: Arc::new(run) })
    }

    /// A stage of one input and one output buffer per frame.
    ///
    /// # Errors
    /// As for [`CpuStage::new`].
    pub fn map(
        input: FrameLayout,
        output: FrameLayout,
        run: impl Fn(&[u8], &mut [u8]) -> Result<()> + Send + Sync + 'static,
    ) -> Result<CpuStage> {
        CpuStage::new(vec![input], vec![output], move |inputs, outputs| run(inputs[0], outputs[0]))
    }
}

/// At least one buffer each way: a frame goes in and comes out.
pub(crate) fn check_buffers(inputs: &[FrameLayout], outputs: &[FrameLayout]) -> Result<()> {
    if inputs.is_empty() || outputs.is_empty() {
        return Err(Error::invalid(
            "stage",
            format!(
                "{} input and {} output buffers: a stage needs at least one of each",
                inputs.len(),
                outputs.len()
            ),
        ));
    }
    Ok(())
}

impl Stage for CpuStage {
    type Prepared = ();

    fn inputs(&self) -> &[FrameLayout] {
        &self.inputs
    }

    fn outputs(&self) -> &[FrameLayout] {
        &self.outputs
    }

    fn runs(&self) -> Runs {
        Runs { gpu: false, cpu: true }
    }

    fn prepare(&self, _queue: &Queue, _strategy: Strategy, _constants: &[Where]) -> Result<()> {
        Ok(())
    }

    fn queue<I, O>(&self, _: &mut (), _: &Queue, _: &[I], _: &mut [Lent<O>]) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        Err(Error::invalid("stage", "a CPU stage has no GPU path: run it by the cpu strategy"))
    }

    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        (self.run)(inputs, outputs)
    }
}
