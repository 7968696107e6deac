//! The consumer of the shared ring, pipelined: one lane per slot, each with its own queue (a
//! CUDA stream), the stage prepared for it, and one frame's output memory, so the work of
//! consecutive frames overlaps as it does in a [`hetmem::FrameRing`]'s slots.
//!
//! A frame taken from the ring is shared with its lane's queue (a kernel reads it in place,
//! zero-copy, or the copy engines read it into device memory, pinned-async); its slot goes
//! back to the producer only when the lane's work completed: [`Lane::finish`] reclaims the
//! leases, last used first (which waits for the queue), and only then drops the frame.

use std::collections::VecDeque;
use std::time::Duration;

use hetmem::error::Error;
use hetmem::pipeline::shared_ring::{RingConsumer, SharedFrame};
use hetmem::placement::Where;
use hetmem::stage::{ConstantMemory, Stage};
use hetmem::{Device, DeviceBuf, HostBuf, Lent, PinOptions, Queue, RingOptions, Shared, Strategy};

use super::content::FrameContent;
use crate::error::{BenchError, Result};

/// One lane's memory while the CPU owns it.
enum Memory {
    /// The CPU strategy: the frame copied out (a `&[u8]` may not point into memory the
    /// producer's process can write), and the output.
    Cpu { copy: Vec<u8>, output: Vec<u8> },
    /// Zero-copy: the kernel reads the slot in place and writes mapped memory.
    Mapped { output: HostBuf<u8> },
    /// Pinned-async: the slot copied to device memory, blurred there, the result copied back.
    Pinned { device_in: DeviceBuf<u8>, device_out: DeviceBuf<u8>, output: HostBuf<u8> },
}

/// One lane's frame and memory while its work runs.
#[allow(clippy::large_enum_variant, reason = "one per lane, like the ring's slots")]
enum Flight {
    Cpu {
        frame: SharedFrame,
        copy: Vec<u8>,
        output: Vec<u8>,
    },
    Mapped {
        input: Shared<SharedFrame>,
        output: Lent<HostBuf<u8>>,
    },
    Pinned {
        input: Shared<SharedFrame>,
        device_in: Lent<DeviceBuf<u8>>,
        device_out: Lent<DeviceBuf<u8>>,
        output: Lent<HostBuf<u8>>,
    },
}

/// One frame's way through the stage: a queue, the stage prepared for it, output memory.
pub(super) struct Lane<S: Stage> {
    queue: Option<Queue>,
    prepared: S::Prepared,
    memory: Option<Memory>,
    /// The frame in flight and its index.
    flight: Option<(u64, Flight)>,
}

/// Where the stage's constant data goes by `strategy`, as the frame ring puts it.
fn constant_places<S: Stage>(device: &Device, stage: &S, strategy: Strategy) -> Vec<Where> {
    let mapped = strategy.traits().is_some_and(|traits| traits.constants == ConstantMemory::Mapped);
    stage.constants(device).iter().map(|_| if mapped { Where::Mapped } else { Where::Device }).collect()
}

impl<S: Stage> Lane<S> {
    /// A lane running `stage` by `strategy` (resolved: cpu, zero-copy or pinned-async).
    ///
    /// # Errors
    /// Another strategy; making the queue, preparing the stage or allocating memory failed.
    pub(super) fn new(device: &Device, strategy: Strategy, stage: &S) -> Result<Lane<S>> {
        let input_bytes = stage.inputs()[0].bytes();
        let output_bytes = stage.outputs()[0].bytes();
        let places = constant_places(device, stage, strategy);
        if strategy == Strategy::Cpu {
            let prepared = stage.prepare(&Queue::new(&Device::cpu())?, strategy, &places)?;
            let memory = Memory::Cpu { copy: vec![0; input_bytes], output: vec![0; output_bytes] };
            return Ok(Lane { queue: None, prepared, memory: Some(memory), flight: None });
        }
        // The frame ring's fences (events, by default), so both rings wait alike.
        let queue = Queue::with_fence_kind(device, RingOptions::default().fence)?;
        let prepared = stage.prepare(&queue, strategy, &places)?;
        let memory = match strategy {
            Strategy::ZeroCopy => {
                Memory::Mapped { output: HostBuf::pinned(device, output_bytes, PinOptions::default())? }
            }
            Strategy::PinnedAsync => Memory::Pinned {
                device_in: DeviceBuf::new(device, input_bytes)?,
                device_out: DeviceBuf::new(device, output_bytes)?,
                output: HostBuf::pinned(
                    device,
                    output_bytes,
                    PinOptions { mapped: false, ..PinOptions::default() },
                )?,
            },
            other => {
                return Err(Error::invalid(
                    "strategy",
                    format!("{other}: the cross-process bench runs cpu, zero-copy and pinned-async"),
                )
                .into());
            }
        };
        Ok(Lane { queue: Some(queue), prepared, memory: Some(memory), flight: None })
    }

    fn idle(&self) -> &Memory {
        self.memory.as_ref().expect("a lane's output is read only between frames")
    }

    /// The last frame's output.
    pub(super) fn output(&self) -> &[u8] {
        match self.idle() {
            Memory::Cpu { output, .. } => output,
            Memory::Mapped { output } | Memory::Pinned { output, .. } => output.as_slice(),
        }
    }

    /// Fills the output with `byte`, so a frame that fails to write it is seen.
    pub(super) fn poison(&mut self, byte: u8) {
        let memory = self.memory.as_mut().expect("poisoned only between frames");
        match memory {
            Memory::Cpu { output, .. } => output.fill(byte),
            Memory::Mapped { output } | Memory::Pinned { output, .. } => output.as_mut_slice().fill(byte),
        }
    }

    /// Starts frame `sequence`'s work: queued on the GPU (returns at once), or run now on the
    /// CPU. The lane holds the frame, and with it the slot, until [`Lane::finish`].
    ///
    /// # Errors
    /// Queueing (or running) the work failed; the frame's slot is freed once whatever was
    /// queued of it has completed (the leases' drops wait).
    pub(super) fn submit(&mut self, sequence: u64, frame: SharedFrame, stage: &S) -> Result<()> {
        let memory = self.memory.take().expect("a lane takes one frame at a time");
        let flight = match memory {
            Memory::Cpu { mut copy, mut output } => {
                frame.read_at(0, &mut copy)?;
                stage.run_cpu(&[&copy], &mut [&mut output])?;
                Flight::Cpu { frame, copy, output }
            }
            Memory::Mapped { output } => {
                let queue = self.queue.as_ref().expect("GPU strategies have a queue");
                let input = queue.share(frame);
                let mut output = queue.lend(output);
                stage.queue(
                    &mut self.prepared,
                    queue,
                    std::slice::from_ref(&input),
                    std::slice::from_mut(&mut output),
                )?;
                Flight::Mapped { input, output }
            }
            Memory::Pinned { device_in, device_out, output } => {
                let queue = self.queue.as_ref().expect("GPU strategies have a queue");
                let input = queue.share(frame);
                let (mut device_in, mut device_out) = (queue.lend(device_in), queue.lend(device_out));
                let mut output = queue.lend(output);
                queue.copy(&input, &mut device_in)?;
                stage.queue(
                    &mut self.prepared,
                    queue,
                    std::slice::from_ref(&device_in),
                    std::slice::from_mut(&mut device_out),
                )?;
                queue.copy(&device_out, &mut output)?;
                Flight::Pinned { input, device_in, device_out, output }
            }
        };
        self.flight = Some((sequence, flight));
        Ok(())
    }

    /// Waits for the frame's work, takes the memory back, and only then frees the frame's slot
    /// for the producer. Returns the frame's index.
    ///
    /// # Errors
    /// The work failed.
    pub(super) fn finish(&mut self) -> Result<u64> {
        let (sequence, flight) = self.flight.take().expect("finished only with a frame in flight");
        // Work on one queue completes in order: the last-used lease's reclaim waits for all of
        // it; the frame's own lease is reclaimed last, and its drop frees the slot.
        let (memory, frame) = match flight {
            Flight::Cpu { frame, copy, output } => (Memory::Cpu { copy, output }, frame),
            Flight::Mapped { input, output } => {
                let output = output.reclaim()?;
                (Memory::Mapped { output }, input.reclaim()?)
            }
            Flight::Pinned { input, device_in, device_out, output } => {
                let output = output.reclaim()?;
                let device_out = device_out.reclaim()?;
                let device_in = device_in.reclaim()?;
                (Memory::Pinned { device_in, device_out, output }, input.reclaim()?)
            }
        };
        drop(frame);
        self.memory = Some(memory);
        Ok(sequence)
    }
}

/// Takes frame `sequence` from `ring`, waiting at most `timeout` for it, and checks that it is
/// that frame, as the producer wrote it: its index, and its stamp (`stamp` and `arrived` are
/// scratch of the stamp's size).
///
/// # Errors
/// The producer gone, done, or alive but sending nothing within `timeout` (stuck: without a
/// bound the consumer would wait for ever); a frame other than `sequence`.
pub(super) fn take_frame(
    ring: &mut RingConsumer,
    content: &FrameContent,
    sequence: u64,
    timeout: Duration,
    stamp: &mut [u8],
    arrived: &mut [u8],
) -> Result<SharedFrame> {
    let Some(next) = ring.next_frame_within(Some(timeout))? else {
        return Err(Error::invalid(
            "producer process",
            format!(
                "it (pid {}) is running but sent no frame {sequence} within {timeout:?}: it is stuck or too \
                 slow; give a longer producer timeout if it is only slow",
                ring.producer_pid()
            ),
        )
        .into());
    };
    let Some(frame) = next else {
        return Err(Error::invalid(
            "shared ring",
            format!("the producer closed the stream before frame {sequence}"),
        )
        .into());
    };
    frame.read_at(0, arrived)?;
    content.stamp(sequence, stamp);
    if frame.sequence() != sequence || arrived != stamp {
        return Err(BenchError::ResultMismatch {
            what: "a frame through the shared ring",
            detail: format!(
                "frame {sequence} came as frame {} stamped {}, its stamp {}",
                frame.sequence(),
                FrameContent::index_of(arrived),
                if arrived == stamp { "intact" } else { "differing from what the producer wrote" }
            ),
        });
    }
    Ok(frame)
}

/// Streams `count` frames from `first` on through `lanes`, one frame in flight per lane: frame
/// k+1's work is queued before frame k's is waited for, and frame k's slot is freed only once
/// its work completed. `done` sees each frame's index and output, in order. Each frame is
/// waited for at most `timeout`.
///
/// # Errors
/// A frame missing, late, out of order or not as written; a frame's work failed; `done`'s
/// error.
pub(super) fn stream<S: Stage>(
    ring: &mut RingConsumer,
    lanes: &mut [Lane<S>],
    stage: &S,
    content: &FrameContent,
    frames: std::ops::Range<u64>,
    timeout: Duration,
    mut done: impl FnMut(u64, &mut Lane<S>) -> Result<()>,
) -> Result<()> {
    let (mut stamp, mut arrived) = (vec![0u8; content.stamp_len()], vec![0u8; content.stamp_len()]);
    let mut in_flight: VecDeque<usize> = VecDeque::with_capacity(lanes.len());
    for sequence in frames {
        if in_flight.len() == lanes.len() {
            let oldest = in_flight.pop_front().expect("every lane is in flight");
            let finished = lanes[oldest].finish()?;
            done(finished, &mut lanes[oldest])?;
        }
        let frame = take_frame(ring, content, sequence, timeout, &mut stamp, &mut arrived)?;
        // Frames finish in order, so frame k's lane, k mod lanes, is the one just finished.
        let lane = (sequence % lanes.len() as u64) as usize;
        lanes[lane].submit(sequence, frame, stage)?;
        in_flight.push_back(lane);
    }
    while let Some(oldest) = in_flight.pop_front() {
        let finished = lanes[oldest].finish()?;
        done(finished, &mut lanes[oldest])?;
    }
    Ok(())
}
