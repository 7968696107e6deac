//! [`FrameFilter`]: one frame at a time through a stage, by one strategy: the strategies'
//! [`Slot`] used synchronously (a ring runs several at once).
//!
//! The producer writes each frame straight into the strategy's own input memory
//! ([`FrameFilter::input_mut`]: pageable, pinned, mapped or managed), and the consumer reads
//! the result straight from its output memory ([`FrameFilter::output`]): no extra copies
//! beyond the ones that define the strategy.

use std::time::{Duration, Instant};

use super::ring::link_bytes;
use super::setup_time::{SetupTime, timed};
use super::slot::{self, Slot, SlotOptions};
use super::{Strategy, hybrid};
use crate::backend::Device;
use crate::error::{FrameMemoryHolder, Result};
use crate::handoff::FenceKind;
use crate::placement::{Placement, Where};
use crate::stage::Stage;

/// A stage run on frames one at a time, by one strategy, with its buffers allocated once.
pub struct FrameFilter<S: Stage> {
    slot: Slot<S>,
    stage: S,
    link_bytes_per_frame: u64,
    placement: Option<Placement>,
    setup: SetupTime,
}

impl<S: Stage> std::fmt::Debug for FrameFilter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameFilter")
            .field("strategy", &self.slot.strategy())
            .field("inputs", &self.stage.inputs())
            .finish_non_exhaustive()
    }
}

impl<S: Stage> FrameFilter<S> {
    /// A filter running `stage` on `device` by `strategy` (`Auto` resolved), with every buffer
    /// allocated now. By the hybrid strategy, its buffers are placed within what the device has
    /// free (see [`FrameFilter::placement`]).
    ///
    /// # Errors
    /// A strategy the device or the stage cannot run, or an allocation failing.
    pub fn with_stage(device: &Device, strategy: Strategy, stage: S) -> Result<FrameFilter<S>> {
        FrameFilter::build(device, strategy, stage, None, &[])
    }

    /// A filter by the hybrid strategy whose placement the caller steers: within `budget`
    /// bytes of device memory (`None`: what the device has free), with `overrides` putting
    /// named buffers where the caller says whatever the profile predicts ([`Placer::force`]):
    /// the stage's constants ([`Stage::constants`] names them) either way, the frames
    /// (`input 0`, `output 0`, ...) only mapped, as the hybrid strategy keeps them.
    ///
    /// # Errors
    /// As for [`FrameFilter::with_stage`]; an override naming no buffer, putting a frame in
    /// device memory, or forcing more into device memory than `budget`.
    ///
    /// [`Placer::force`]: crate::placement::Placer::force
    pub fn with_placement(
        device: &Device,
        stage: S,
        budget: Option<u64>,
        overrides: &[(&str, Where)],
    ) -> Result<FrameFilter<S>> {
        FrameFilter::build(device, Strategy::Hybrid, stage, budget, overrides)
    }

    fn build(
        device: &Device,
        strategy: Strategy,
        stage: S,
        budget: Option<u64>,
        overrides: &[(&str, Where)],
    ) -> Result<FrameFilter<S>> {
        let strategy = slot::resolve(device, strategy, &stage)?;
        let mut placed_in = Duration::ZERO;
        let placement =
            timed(&mut placed_in, || hybrid::placement_for(strategy, device, &stage, budget, 1, overrides))?;
        let options =
            SlotOptions { fence: FenceKind::Event, timing: false, holder: FrameMemoryHolder::Filter };
        let slot = Slot::new(device, strategy, &stage, options, placement.as_ref())?;
        let link_bytes_per_frame = link_bytes(&stage, slot.prepared(), strategy);
        let setup = SetupTime { placement: placed_in, ..slot.setup_time() };
        Ok(FrameFilter { slot, stage, link_bytes_per_frame, placement, setup })
    }

    /// What building the filter spent, by part: placement, the queue, the kernel's first load
    /// and the frame memory (pinning, mapping or device allocation).
    pub fn setup_time(&self) -> SetupTime {
        self.setup
    }

    /// By the hybrid strategy, where each buffer went and why: the frames (`input 0`,
    /// `output 0`, ...) and the stage's constant data ([`Stage::constants`]), with the link
    /// profile decided from. `None` by the other strategies, which place by definition.
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// The stage.
    pub fn stage(&self) -> &S {
        &self.stage
    }

    /// The strategy (never `Auto`).
    pub fn strategy(&self) -> Strategy {
        self.slot.strategy()
    }

    /// Where to write the next frame (its first input buffer).
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn input_mut(&mut self) -> Result<&mut [u8]> {
        self.input_mut_at(0)
    }

    /// Input buffer `buffer` of the next frame.
    ///
    /// # Errors
    /// No such buffer, or the buffers were lost to an earlier failed frame.
    pub fn input_mut_at(&mut self, buffer: usize) -> Result<&mut [u8]> {
        super::check_index("input", buffer, self.stage.inputs().len())?;
        self.slot.input_mut(buffer)
    }

    /// The last frame's result (its first output buffer).
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn output(&self) -> Result<&[u8]> {
        self.output_at(0)
    }

    /// Output buffer `buffer` of the last frame.
    ///
    /// # Errors
    /// No such buffer, or the buffers were lost to an earlier failed frame.
    pub fn output_at(&self, buffer: usize) -> Result<&[u8]> {
        super::check_index("output", buffer, self.stage.outputs().len())?;
        self.slot.output(buffer)
    }

    /// Overwrites every output buffer with `value`: tests poison them so an unwritten byte
    /// cannot pass.
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn fill_output(&mut self, value: u8) -> Result<()> {
        for buffer in 0..self.stage.outputs().len() {
            self.slot.output_mut(buffer)?.fill(value);
        }
        Ok(())
    }

    /// Runs the frame in the input buffers through the stage into the output buffers, and
    /// returns the latency: from handing the frame over to the result being readable by the
    /// CPU.
    ///
    /// # Errors
    /// A failed copy or kernel. The buffers survive a failure to queue the work; a failure of
    /// the work itself may lose them (later calls say so).
    pub fn run(&mut self) -> Result<Duration> {
        let start = Instant::now();
        self.slot.submit(&self.stage, 0);
        self.slot.finish(0, true);
        match self.slot.take_failure() {
            Some(error) => Err(error),
            None => Ok(start.elapsed()),
        }
    }

    /// Bytes that cross the host-GPU link per frame, counted from what the strategy moves:
    /// copies move the frame in and out; mapped strategies move what the kernel reads (with
    /// re-read halos, and constant data when it is in host memory) and writes.
    pub fn link_bytes_per_frame(&self) -> u64 {
        self.link_bytes_per_frame
    }

    /// Host memory the filter's frame buffers take, in bytes.
    pub fn host_bytes(&self) -> usize {
        self.slot.footprint().0
    }

    /// Device memory the filter's frame buffers take, in bytes.
    pub fn device_bytes(&self) -> usize {
        self.slot.footprint().1
    }
}
