//! [`GaussianStage`]: the blur as a [`Stage`], and the constructors of the filter and the ring
//! that run it.

use super::{
    FrameFormat, Gaussian, GaussianOverlap, GaussianPlan, GaussianTable, SampleType, Segments, gaussian,
    gaussian_cpu,
};
use crate::backend::{Capabilities, Device};
use crate::error::{Error, Result};
use crate::handoff::{Lease, Lent, Queue};
use crate::memory::{Buffer, WritableBuffer};
use crate::placement::Where;
use crate::stage::{ConstantUse, FrameLayout, PinnedFrame, PlaneLayout, Runs, ScalarType, Stage};
use crate::stage::{FrameMemory, Strategy};

/// The Gaussian blur of one frame format as a stage: one input and one output buffer per
/// frame, bit-exact on the CPU and the GPU. By the pinned-async strategy it overlaps the
/// upload, the blur and the download within each frame ([`GaussianOverlap`]).
#[derive(Debug, Clone)]
pub struct GaussianStage {
    format: FrameFormat,
    kernel: Gaussian,
    layout: [FrameLayout; 1],
    segments: Segments,
}

/// What the blur keeps per queue: the plan for the queue's GPU, its table uploaded for the
/// strategy, and the overlap's streams for pinned-async.
#[derive(Debug)]
pub struct GaussianPrepared {
    plan: GaussianPlan,
    table: Option<GaussianTable>,
    overlap: Option<Box<GaussianOverlap>>,
}

impl GaussianPrepared {
    /// Device memory besides the frames: the table and the overlap's signal words.
    pub fn device_bytes(&self) -> usize {
        self.table.as_ref().map_or(0, GaussianTable::device_bytes)
            + self.overlap.as_ref().map_or(0, |o| o.device_bytes())
    }

    /// Pinned host memory besides the frames: the table when it is mapped.
    pub fn host_bytes(&self) -> usize {
        self.table.as_ref().map_or(0, GaussianTable::host_bytes)
    }
}

impl From<&FrameFormat> for FrameLayout {
    /// The planes of a frame format, packed one after the other, of its sample type.
    fn from(format: &FrameFormat) -> FrameLayout {
        let element = match format.sample() {
            SampleType::U8 => ScalarType::U8,
            SampleType::U16 => ScalarType::U16,
        };
        let planes = format
            .planes()
            .iter()
            .map(|plane| {
                PlaneLayout::packed(plane.offset, plane.width, plane.height, plane.channels, element)
            })
            .collect();
        FrameLayout::new(planes).expect("frame formats lay out valid planes")
    }
}

impl GaussianStage {
    /// The blur of `format` frames with `kernel`.
    ///
    /// # Errors
    /// None today (every kernel blurs every frame size); kept fallible for formats to come.
    pub fn new(format: FrameFormat, kernel: &Gaussian) -> Result<GaussianStage> {
        GaussianPlan::new(&format, kernel, 1)?;
        Ok(GaussianStage {
            format,
            kernel: kernel.clone(),
            layout: [FrameLayout::from(&format)],
            segments: Segments::Auto,
        })
    }

    /// The segments the pinned-async strategy cuts each frame into (default automatic: about
    /// one per MiB).
    pub fn with_segments(mut self, segments: Segments) -> GaussianStage {
        self.segments = segments;
        self
    }

    /// The stage for a ring: [`Segments::Auto`] becomes one segment (a count asked for
    /// stays). In a ring, one frame's copies already overlap another's kernel, and the
    /// overlap's kernels, which wait on their segments, would take the GPU from the other
    /// frames' kernels: on the H200, 1080p frames streamed at 6,297 frames/s overlapped and
    /// at 7,300 to 7,600 plain (bench/results/2026-11-30-h200-stages).
    pub fn streamed(mut self) -> GaussianStage {
        if self.segments == Segments::Auto {
            self.segments = Segments::Count(1);
        }
        self
    }

    /// The frame format.
    pub fn format(&self) -> &FrameFormat {
        &self.format
    }

    /// The kernel.
    pub fn kernel(&self) -> &Gaussian {
        &self.kernel
    }

    /// The tiling `strategy`'s frames suit on a device that `offers` this (see
    /// [`mapped_tiling`]); the CPU's emulation plans as for one multiprocessor.
    fn plan(&self, offers: &Capabilities, strategy: Strategy) -> Result<GaussianPlan> {
        let multiprocessors = offers.multiprocessors;
        if mapped_tiling(strategy, offers) {
            GaussianPlan::for_mapped(&self.format, &self.kernel, multiprocessors)
        } else {
            GaussianPlan::new(&self.format, &self.kernel, multiprocessors)
        }
    }
}

/// Whether `strategy`'s frames take [`GaussianPlan::for_mapped`]'s tiling on a GPU with
/// `attributes`. Only the zero-copy and hybrid strategies keep frames in mapped host memory (the
/// hybrid placement never moves a frame into device memory). And only on a discrete GPU whose
/// host memory lies across PCIe, where that tiling was measured: on an integrated GPU mapped
/// memory is its own memory, and across a coherent link (NVLink-C2C, which reads host memory
/// through the CPU's page tables) the SMs rather than the link may bound a frame, and the
/// plain tiling uses every SM.
fn mapped_tiling(strategy: Strategy, offers: &Capabilities) -> bool {
    offers.gpu
        && strategy.traits().is_some_and(|traits| traits.frames == FrameMemory::Mapped)
        && !offers.integrated
        && !offers.host_memory_through_page_tables
}

impl Stage for GaussianStage {
    type Prepared = GaussianPrepared;

    fn inputs(&self) -> &[FrameLayout] {
        &self.layout
    }

    fn outputs(&self) -> &[FrameLayout] {
        &self.layout
    }

    fn runs(&self) -> Runs {
        Runs { gpu: true, cpu: true }
    }

    /// The table of tile offsets and weights, which every tile reads. Only the hybrid strategy
    /// places it, so its reads per frame are those of the hybrid strategy's tiling.
    fn constants(&self, device: &Device) -> Vec<ConstantUse> {
        let plan = self
            .plan(&device.capabilities(), Strategy::Hybrid)
            .expect("the constructor planned this format and kernel");
        vec![ConstantUse {
            name: "gaussian table".into(),
            bytes: std::mem::size_of_val(plan.table()) as u64,
            bytes_read_per_frame: plan.bytes_read_of_table(),
        }]
    }

    fn prepare(&self, queue: &Queue, strategy: Strategy, constants: &[Where]) -> Result<GaussianPrepared> {
        let device = queue.device();
        let offers = device.capabilities();
        if !offers.gpu {
            // The CPU path reads the table from the plan itself.
            let plan = GaussianPlan::new(&self.format, &self.kernel, 1)?;
            return Ok(GaussianPrepared { plan, table: None, overlap: None });
        }
        let &[place] = constants else {
            return Err(Error::invalid(
                "gaussian stage",
                format!("{} places for its one constant buffer, the table", constants.len()),
            ));
        };
        let plan = self.plan(&offers, strategy)?;
        let table = plan.upload_table(queue, place)?;
        let overlap = match strategy {
            // One segment is the plain copy, blur, copy sequence: no overlap kernel for it.
            Strategy::PinnedAsync if self.segments != Segments::Count(1) => {
                Some(Box::new(GaussianOverlap::with_segments(&device, queue, &plan, self.segments)?))
            }
            _ => None,
        };
        Ok(GaussianPrepared { plan, table: Some(table), overlap })
    }

    fn queue<I, O>(
        &self,
        prepared: &mut GaussianPrepared,
        queue: &Queue,
        inputs: &[I],
        outputs: &mut [Lent<O>],
    ) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        let table = prepared.table.as_ref().expect("prepared on a GPU queue");
        gaussian(queue, &prepared.plan, table, &inputs[0], &mut outputs[0])
    }

    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        gaussian_cpu(&self.format, &self.kernel, inputs[0], outputs[0])
    }

    fn mapped_bytes_read(&self, prepared: &GaussianPrepared, _strategy: Strategy) -> u64 {
        let plan = &prepared.plan;
        // The table is read across the link by every tile only when it is mapped.
        match prepared.table.as_ref().is_some_and(|table| table.host_bytes() > 0) {
            true => plan.bytes_read(),
            false => plan.bytes_read() - plan.bytes_read_of_table(),
        }
    }

    fn queue_pinned(
        &self,
        prepared: &mut GaussianPrepared,
        queue: &Queue,
        frame: PinnedFrame<'_>,
    ) -> Option<Result<()>> {
        let overlap = prepared.overlap.as_mut()?;
        Some(overlap.run(
            queue,
            &frame.host_inputs[0],
            &mut frame.device_inputs[0],
            &mut frame.device_outputs[0],
            &mut frame.host_outputs[0],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gaussian::{Border, PixelLayout};

    #[test]
    fn a_format_lays_out_its_planes_in_its_sample_type() {
        for sample in [SampleType::U8, SampleType::U16] {
            let format = FrameFormat::new(1919, 1081, PixelLayout::Yuv420).unwrap().with_sample(sample);
            let layout = FrameLayout::from(&format);
            assert_eq!(layout.bytes(), format.frame_bytes(), "{sample:?}");
            assert_eq!(layout.planes().len(), 3);
            assert_eq!(layout.planes()[1].element.size(), sample.bytes());
            let stage =
                GaussianStage::new(format, &Gaussian::new(None, None, Border::default()).unwrap()).unwrap();
            assert_eq!(stage.inputs()[0].bytes(), format.frame_bytes());
        }
    }

    #[test]
    fn only_mapped_frames_across_pcie_take_the_mapped_tiling() {
        let discrete = Capabilities {
            gpu: true,
            maps_host_memory: true,
            concurrent_managed_access: true,
            multiprocessors: 132,
            integrated: false,
            host_memory_through_page_tables: false,
            host_native_atomics: false,
        };
        let integrated = Capabilities { integrated: true, ..discrete };
        let coherent = Capabilities { host_memory_through_page_tables: true, ..discrete };
        let cpu = Capabilities { gpu: false, maps_host_memory: false, multiprocessors: 1, ..discrete };
        for strategy in Strategy::ALL {
            let mapped = matches!(strategy, Strategy::ZeroCopy | Strategy::Hybrid);
            assert_eq!(mapped_tiling(strategy, &discrete), mapped, "{strategy:?}");
            assert!(!mapped_tiling(strategy, &integrated) && !mapped_tiling(strategy, &coherent));
            assert!(!mapped_tiling(strategy, &cpu));
        }
    }
}
