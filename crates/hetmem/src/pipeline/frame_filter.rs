//! [`FrameFilter`]: one frame at a time through the Gaussian blur, by one strategy.
//!
//! The producer writes each frame straight into the strategy's own input memory
//! ([`FrameFilter::input_mut`]: pageable, pinned, mapped or managed), and the consumer reads
//! the result straight from its output memory ([`FrameFilter::output`]): no extra copies
//! beyond the ones that define the strategy.

use std::time::{Duration, Instant};

use super::Strategy;
use crate::backend::Device;
use crate::backend::cuda::MemLocation;
use crate::error::{Error, Result};
use crate::handoff::{Lent, Queue};
use crate::memory::{Buffer, DeviceBuf, HostBuf, ManagedBuf, PinOptions};
use crate::ops::gaussian::{
    FrameFormat, Gaussian, GaussianOverlap, GaussianPlan, GaussianTable, TablePlacement, gaussian,
    gaussian_cpu,
};

/// Each strategy's buffers. `Option`s are empty while lent to the GPU (inside `run`), or after
/// a failed frame left them with failed GPU work.
enum Slots {
    Cpu {
        input: Vec<u8>,
        output: Vec<u8>,
    },
    Copy {
        input: Vec<u8>,
        output: Vec<u8>,
        device_in: Option<DeviceBuf<u8>>,
        device_out: Option<DeviceBuf<u8>>,
    },
    PinnedAsync {
        input: Option<HostBuf<u8>>,
        output: Option<HostBuf<u8>>,
        device_in: Option<DeviceBuf<u8>>,
        device_out: Option<DeviceBuf<u8>>,
        overlap: Box<GaussianOverlap>,
    },
    Mapped {
        input: Option<HostBuf<u8>>,
        output: Option<HostBuf<u8>>,
    },
    Managed {
        input: Option<ManagedBuf<u8>>,
        output: Option<ManagedBuf<u8>>,
    },
}

/// A Gaussian blur of frames of one format, by one strategy, with its buffers allocated once.
pub struct FrameFilter {
    strategy: Strategy,
    plan: GaussianPlan,
    queue: Option<Queue>,
    table: Option<GaussianTable>,
    slots: Slots,
    host_bytes: usize,
    device_bytes: usize,
}

impl std::fmt::Debug for FrameFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameFilter")
            .field("strategy", &self.strategy)
            .field("format", self.plan.format())
            .finish_non_exhaustive()
    }
}

fn lost() -> Error {
    Error::FrameMemoryLost { holder: crate::error::FrameMemoryHolder::Filter, frame: None }
}

impl FrameFilter {
    /// A filter for `format` frames on `device` by `strategy` (`Auto` resolved), with every
    /// buffer allocated now.
    ///
    /// # Errors
    /// A strategy the device cannot run, or an allocation failing.
    pub fn new(
        device: &Device,
        strategy: Strategy,
        format: FrameFormat,
        kernel: &Gaussian,
    ) -> Result<FrameFilter> {
        let strategy = strategy.resolve(device);
        strategy.check(device)?;
        let sms = device.as_cuda().map_or(1, |gpu| gpu.attributes().multiprocessor_count);
        let plan = GaussianPlan::new(&format, kernel, sms)?;
        let frame = format.frame_bytes();
        let mapped = PinOptions::default();
        let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
        let queue = match strategy {
            Strategy::Cpu => None,
            _ => Some(Queue::new(device)?),
        };
        let device_table = |queue: &Queue| plan.upload_table(queue, TablePlacement::Device);
        let (slots, table, host_bytes, device_bytes) = match (strategy, &queue) {
            (Strategy::Cpu, _) | (_, None) => {
                (Slots::Cpu { input: vec![0; frame], output: vec![0; frame] }, None, 2 * frame, 0)
            }
            (Strategy::Copy, Some(queue)) => {
                let table = device_table(queue)?;
                let table_bytes = table.device_bytes();
                (
                    Slots::Copy {
                        input: vec![0; frame],
                        output: vec![0; frame],
                        device_in: Some(DeviceBuf::new(device, frame)?),
                        device_out: Some(DeviceBuf::new(device, frame)?),
                    },
                    Some(table),
                    2 * frame,
                    2 * frame + table_bytes,
                )
            }
            (Strategy::PinnedAsync, Some(queue)) => {
                let overlap = GaussianOverlap::new(device, queue, &plan)?;
                let overlap_bytes = overlap.device_bytes();
                (
                    Slots::PinnedAsync {
                        input: Some(HostBuf::pinned(device, frame, unmapped)?),
                        output: Some(HostBuf::pinned(device, frame, unmapped)?),
                        device_in: Some(DeviceBuf::new(device, frame)?),
                        device_out: Some(DeviceBuf::new(device, frame)?),
                        overlap: Box::new(overlap),
                    },
                    None,
                    2 * frame,
                    2 * frame + overlap_bytes,
                )
            }
            (Strategy::ZeroCopy | Strategy::Hybrid, Some(queue)) => {
                let placement = if strategy == Strategy::ZeroCopy {
                    TablePlacement::Host
                } else {
                    TablePlacement::Device
                };
                let table = plan.upload_table(queue, placement)?;
                let (host_table, device_table_bytes) = (table.host_bytes(), table.device_bytes());
                (
                    Slots::Mapped {
                        input: Some(HostBuf::pinned(device, frame, mapped)?),
                        output: Some(HostBuf::pinned(device, frame, mapped)?),
                    },
                    Some(table),
                    2 * frame + host_table,
                    device_table_bytes,
                )
            }
            (Strategy::Managed, Some(queue)) => {
                let table = device_table(queue)?;
                let table_bytes = table.device_bytes();
                (
                    Slots::Managed {
                        input: Some(ManagedBuf::new(device, frame)?),
                        output: Some(ManagedBuf::new(device, frame)?),
                    },
                    Some(table),
                    2 * frame,
                    table_bytes,
                )
            }
            (Strategy::Auto, Some(_)) => unreachable!("resolved above"),
        };
        Ok(FrameFilter { strategy, plan, queue, table, slots, host_bytes, device_bytes })
    }

    /// The strategy (never `Auto`).
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The frame format.
    pub fn format(&self) -> &FrameFormat {
        self.plan.format()
    }

    /// Where to write the next frame.
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn input_mut(&mut self) -> Result<&mut [u8]> {
        Ok(match &mut self.slots {
            Slots::Cpu { input, .. } | Slots::Copy { input, .. } => input,
            Slots::PinnedAsync { input, .. } | Slots::Mapped { input, .. } => {
                input.as_mut().ok_or_else(lost)?.as_mut_slice()
            }
            Slots::Managed { input, .. } => input.as_mut().ok_or_else(lost)?.as_mut_slice(),
        })
    }

    /// The last frame filtered.
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn output(&self) -> Result<&[u8]> {
        Ok(match &self.slots {
            Slots::Cpu { output, .. } | Slots::Copy { output, .. } => output,
            Slots::PinnedAsync { output, .. } | Slots::Mapped { output, .. } => {
                output.as_ref().ok_or_else(lost)?.as_slice()
            }
            Slots::Managed { output, .. } => output.as_ref().ok_or_else(lost)?.as_slice(),
        })
    }

    /// Overwrites the output with `value`: tests poison it so an unwritten byte cannot pass.
    ///
    /// # Errors
    /// The buffers were lost to an earlier failed frame.
    pub fn fill_output(&mut self, value: u8) -> Result<()> {
        match &mut self.slots {
            Slots::Cpu { output, .. } | Slots::Copy { output, .. } => output.fill(value),
            Slots::PinnedAsync { output, .. } | Slots::Mapped { output, .. } => {
                output.as_mut().ok_or_else(lost)?.as_mut_slice().fill(value)
            }
            Slots::Managed { output, .. } => output.as_mut().ok_or_else(lost)?.as_mut_slice().fill(value),
        }
        Ok(())
    }

    /// Filters the frame in [`FrameFilter::input_mut`] into [`FrameFilter::output`] and returns
    /// the latency: from handing the frame over to the result being readable by the CPU.
    ///
    /// # Errors
    /// A failed copy or kernel. The filter's buffers may then be lost (later calls say so).
    pub fn run(&mut self) -> Result<Duration> {
        let start = Instant::now();
        let plan = &self.plan;
        let queue = self.queue.as_ref();
        match &mut self.slots {
            Slots::Cpu { input, output } => {
                crate::faults::fail(crate::faults::FaultPoint::Launch)?;
                gaussian_cpu(plan.format(), plan.kernel(), input, output)?
            }
            Slots::Copy { input, output, device_in, device_out } => {
                let queue = queue.expect("GPU strategies have a queue");
                let mut device_input = device_in.take().ok_or_else(lost)?;
                device_input.copy_from_slice(input)?;
                let device_input = queue.share(device_input);
                let mut device_output = queue.lend(device_out.take().ok_or_else(lost)?);
                run_kernel(queue, plan, self.table.as_ref(), &device_input, &mut device_output)?;
                let result = device_output.reclaim()?;
                result.copy_to_slice(output)?;
                *device_out = Some(result);
                *device_in = Some(device_input.reclaim()?);
            }
            Slots::PinnedAsync { input, output, device_in, device_out, overlap } => {
                let queue = queue.expect("GPU strategies have a queue");
                let host_input = queue.share(input.take().ok_or_else(lost)?);
                let mut device_input = queue.lend(device_in.take().ok_or_else(lost)?);
                let mut device_output = queue.lend(device_out.take().ok_or_else(lost)?);
                let mut host_output = queue.lend(output.take().ok_or_else(lost)?);
                overlap.run(queue, &host_input, &mut device_input, &mut device_output, &mut host_output)?;
                *output = Some(host_output.reclaim()?);
                *device_out = Some(device_output.reclaim()?);
                *device_in = Some(device_input.reclaim()?);
                *input = Some(host_input.reclaim()?);
            }
            Slots::Mapped { input, output } => {
                let queue = queue.expect("GPU strategies have a queue");
                let host_input = queue.share(input.take().ok_or_else(lost)?);
                let mut host_output = queue.lend(output.take().ok_or_else(lost)?);
                run_kernel(queue, plan, self.table.as_ref(), &host_input, &mut host_output)?;
                *output = Some(host_output.reclaim()?);
                *input = Some(host_input.reclaim()?);
            }
            Slots::Managed { input, output } => {
                let queue = queue.expect("GPU strategies have a queue");
                let ordinal = queue.cuda_device().map_or(0, |gpu| gpu.ordinal());
                let mut managed_input = queue.lend(input.take().ok_or_else(lost)?);
                let mut managed_output = queue.lend(output.take().ok_or_else(lost)?);
                managed_input.prefetch(MemLocation::Device(ordinal))?;
                managed_output.prefetch(MemLocation::Device(ordinal))?;
                run_kernel(queue, plan, self.table.as_ref(), &managed_input, &mut managed_output)?;
                managed_output.prefetch(MemLocation::Host)?;
                *output = Some(managed_output.reclaim()?);
                *input = Some(managed_input.reclaim()?);
            }
        }
        Ok(start.elapsed())
    }

    /// Bytes that cross the host-GPU link per frame, counted from what the strategy moves:
    /// copies move the frame in and out; mapped strategies move what the kernel reads (the
    /// input with its re-read halos, the table when it is in host memory) and writes.
    pub fn link_bytes_per_frame(&self) -> u64 {
        let frame = self.plan.format().frame_bytes() as u64;
        match self.strategy {
            Strategy::Cpu | Strategy::Auto => 0,
            Strategy::Copy | Strategy::PinnedAsync | Strategy::Managed => 2 * frame,
            Strategy::ZeroCopy => self.plan.bytes_read() + frame,
            Strategy::Hybrid => {
                let table_reads = self.plan.bytes_read_of_table();
                self.plan.bytes_read() - table_reads + frame
            }
        }
    }

    /// Host memory the filter allocated, in bytes.
    pub fn host_bytes(&self) -> usize {
        self.host_bytes
    }

    /// Device memory the filter allocated, in bytes.
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }
}

/// The blur with whichever table the strategy keeps.
fn run_kernel<I, O>(
    queue: &Queue,
    plan: &GaussianPlan,
    table: Option<&GaussianTable>,
    input: &I,
    output: &mut Lent<O>,
) -> Result<()>
where
    I: crate::handoff::Lease,
    I::Buf: Buffer<Elem = u8>,
    O: crate::memory::WritableBuffer<Elem = u8>,
{
    gaussian(queue, plan, table.expect("GPU strategies have a table"), input, output)
}
