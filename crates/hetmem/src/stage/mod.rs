//! Stages: what runs on each frame that [`crate::FrameFilter`], [`crate::FrameRing`] and
//! [`crate::pipeline::FanOutRing`] move through a strategy.
//!
//! A stage takes one frame's input buffers and writes its output buffers, each laid out by a
//! [`FrameLayout`] (planes of any [`ScalarType`] type, size and pitch). The pipeline owns the
//! buffers, in the memory the strategy asks for, and hands them to the stage through the
//! hand-off's leases; the stage only says what to run:
//! - [`KernelStage`]: a user's kernel, from CUDA C (compiled by NVRTC through hetmem's cache),
//!   PTX or CUBIN, with its launch configuration and typed parameters; optionally with a CPU
//!   closure that does the same, for the CPU backend and as its test reference;
//! - [`CpuStage`]: a CPU closure alone;
//! - the built-in Gaussian ([`crate::ops::gaussian::GaussianStage`]).
//!
//! Implementing [`Stage`] is safe: the pipeline checks every buffer against the stage's
//! layouts, and the only way to reach the GPU is through [`crate::Queue::launch`], which is
//! `unsafe` with its contract stated there. A [`KernelStage`] states its kernel's contract
//! once, on its `unsafe` constructor.

mod cpu;
mod kernel;
mod layout;
mod strategy;

pub use cpu::CpuStage;
pub use kernel::{KernelCode, KernelPrepared, KernelStage, Param};
pub use layout::{FrameLayout, MAX_FRAME_BYTES, MAX_PLANES, PlaneLayout, ScalarType};
pub use strategy::{ConstantMemory, FrameMemory, Requirement, Strategy, StrategyTraits};

use crate::backend::Device;
use crate::error::Result;
use crate::handoff::{Lease, Lent, Queue, Shared};
use crate::memory::{Buffer, DeviceBuf, HostBuf, WritableBuffer};
use crate::placement::Where;

/// Where a stage can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    /// It queues GPU work ([`Stage::queue`]).
    pub gpu: bool,
    /// It has a CPU path ([`Stage::run_cpu`]).
    pub cpu: bool,
}

/// One buffer of a stage's constant data (filter taps, a lookup table, a template), as the
/// stage declares it ([`Stage::constants`]) for the hybrid strategy to place: the same bytes
/// for every frame, read by the stage's kernels on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstantUse {
    /// The name its placement decision carries.
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// Bytes of it one frame's work reads (more than `bytes` when every block reads it).
    pub bytes_read_per_frame: u64,
}

/// The buffers of one frame by the pinned-async strategy, for a stage that overlaps the
/// copies with its own work ([`Stage::queue_pinned`]).
#[derive(Debug)]
pub struct PinnedFrame<'a> {
    /// The pinned host inputs, shared with the GPU.
    pub host_inputs: &'a [Shared<HostBuf<u8>>],
    /// Their device copies.
    pub device_inputs: &'a mut [Lent<DeviceBuf<u8>>],
    /// The device outputs.
    pub device_outputs: &'a mut [Lent<DeviceBuf<u8>>],
    /// The pinned host outputs.
    pub host_outputs: &'a mut [Lent<HostBuf<u8>>],
}

/// What runs on each frame. See the [module documentation](self).
///
/// The pipeline calls [`Stage::prepare`] once for each queue it runs the stage on (a ring's
/// slot, a filter), then [`Stage::queue`] for each frame on the GPU, or [`Stage::run_cpu`] on
/// the CPU; every buffer it passes is one frame of the matching layout, exactly
/// `layout.bytes()` long.
pub trait Stage: Send + Sync + 'static {
    /// What the stage keeps for each queue: loaded kernels, constant data uploaded for it.
    type Prepared: Send + 'static;

    /// The layouts of one frame's input buffers, in order (at least one).
    fn inputs(&self) -> &[FrameLayout];

    /// The layouts of one frame's output buffers, in order (at least one).
    fn outputs(&self) -> &[FrameLayout];

    /// Where it can run.
    fn runs(&self) -> Runs;

    /// The stage's constant data on `device`, one entry per buffer in the order
    /// [`Stage::prepare`] receives their places: what the hybrid strategy declares to its
    /// [`crate::placement::Placer`] beside the frames. By default none.
    fn constants(&self, device: &Device) -> Vec<ConstantUse> {
        let _ = device;
        Vec::new()
    }

    /// Loads the stage's kernels and uploads its constant data for work on `queue` by
    /// `strategy`, constant buffer `i` of [`Stage::constants`] to `constants[i]`: mapped host
    /// memory for [`Strategy::ZeroCopy`], device memory for the copying strategies, and where
    /// the placement decided for [`Strategy::Hybrid`]. Called on a CPU-backend queue too, when
    /// the stage runs there.
    ///
    /// # Errors
    /// A kernel that fails to compile or load, an allocation failing.
    fn prepare(&self, queue: &Queue, strategy: Strategy, constants: &[Where]) -> Result<Self::Prepared>;

    /// Queues one frame's work on `queue`: reads `inputs`, writes `outputs`.
    ///
    /// # Errors
    /// The launch failing, or a queue on the CPU backend.
    fn queue<I, O>(
        &self,
        prepared: &mut Self::Prepared,
        queue: &Queue,
        inputs: &[I],
        outputs: &mut [Lent<O>],
    ) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>;

    /// The CPU path: reads `inputs`, writes `outputs`.
    ///
    /// # Errors
    /// A stage without a CPU path, or whatever the CPU path reports.
    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()>;

    /// Bytes the stage's kernel reads per frame when its inputs are mapped host memory (what
    /// crosses the link inbound by the zero-copy and hybrid strategies): by default every input
    /// byte once. `prepared` is the stage as prepared for `strategy`, which knows where its
    /// constant data lives.
    fn mapped_bytes_read(&self, prepared: &Self::Prepared, strategy: Strategy) -> u64 {
        let _ = (prepared, strategy);
        self.inputs().iter().map(|layout| layout.bytes() as u64).sum()
    }

    /// By the pinned-async strategy, queues the uploads, the work and the downloads itself,
    /// overlapped within the frame, or returns `None` to let the pipeline queue the uploads,
    /// [`Stage::queue`] and the downloads in turn (the default).
    ///
    /// # Errors
    /// As for [`Stage::queue`].
    fn queue_pinned(
        &self,
        prepared: &mut Self::Prepared,
        queue: &Queue,
        frame: PinnedFrame<'_>,
    ) -> Option<Result<()>> {
        let _ = (prepared, queue, frame);
        None
    }
}
