//! The strategies, implemented once: one frame's buffers in the memory a [`Strategy`] asks
//! for, and the work that moves them through a [`Stage`]. A [`crate::FrameFilter`] is one
//! [`Slot`] used a frame at a time; a [`crate::FrameRing`] is several, each with its own queue,
//! so their frames overlap.
//!
//! Which memory each strategy takes is [`Strategy::TRAITS`]' [`FrameMemory`]: one [`Memory`]
//! variant for each. A stage that can overlaps the pinned strategy's copies within the frame
//! ([`Stage::queue_pinned`]); the hybrid strategy's constant data is placed by `hybrid.rs`.

use std::sync::Arc;

use crate::backend::Device;
use crate::backend::cuda::{Event, MemLocation};
use crate::error::{Error, FrameMemoryHolder, Result};
use crate::handoff::{Fence, FenceKind, Lent, Queue, Shared};
use crate::memory::{DeviceBuf, HostBuf, ManagedBuf, PinOptions, check_within_memory};
use crate::pipeline::hybrid;
use crate::pipeline::setup_time::{SetupTime, timed};
use crate::placement::Placement;
use crate::stage::{FrameLayout, PinnedFrame, Stage};
use crate::stage::{FrameMemory, Strategy};

/// How a slot is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotOptions {
    /// How the slot's queue signals that work has finished.
    pub fence: FenceKind,
    /// Time each frame's GPU work with events.
    pub timing: bool,
    /// Who holds the slot, for the error when a failed frame loses its memory.
    pub holder: FrameMemoryHolder,
}

/// One frame's buffers while the CPU owns them.
#[allow(clippy::large_enum_variant, reason = "one per slot")]
enum Memory {
    Cpu {
        inputs: Vec<Vec<u8>>,
        outputs: Vec<Vec<u8>>,
    },
    Pageable {
        inputs: Vec<Vec<u8>>,
        outputs: Vec<Vec<u8>>,
        device_in: Vec<DeviceBuf<u8>>,
        device_out: Vec<DeviceBuf<u8>>,
    },
    Pinned {
        host_in: Vec<HostBuf<u8>>,
        host_out: Vec<HostBuf<u8>>,
        device_in: Vec<DeviceBuf<u8>>,
        device_out: Vec<DeviceBuf<u8>>,
    },
    Mapped {
        inputs: Vec<HostBuf<u8>>,
        outputs: Vec<HostBuf<u8>>,
    },
    Managed {
        inputs: Vec<ManagedBuf<u8>>,
        outputs: Vec<ManagedBuf<u8>>,
    },
}

/// One frame's buffers while GPU work uses them.
#[allow(clippy::large_enum_variant, reason = "one per slot")]
enum Flight {
    Pageable {
        inputs: Vec<Vec<u8>>,
        outputs: Vec<Vec<u8>>,
        device_in: Vec<Shared<DeviceBuf<u8>>>,
        device_out: Vec<Lent<DeviceBuf<u8>>>,
    },
    Pinned {
        host_in: Vec<Shared<HostBuf<u8>>>,
        device_in: Vec<Lent<DeviceBuf<u8>>>,
        device_out: Vec<Lent<DeviceBuf<u8>>>,
        host_out: Vec<Lent<HostBuf<u8>>>,
    },
    Mapped {
        inputs: Vec<Shared<HostBuf<u8>>>,
        outputs: Vec<Lent<HostBuf<u8>>>,
    },
    Managed {
        inputs: Vec<Lent<ManagedBuf<u8>>>,
        outputs: Vec<Lent<ManagedBuf<u8>>>,
    },
}

/// One frame's buffers by one strategy, the queue its work runs on, and the stage's state for
/// that queue.
pub(crate) struct Slot<S: Stage> {
    strategy: Strategy,
    queue: Option<Queue>,
    prepared: S::Prepared,
    /// The buffers while the CPU owns them; `None` while lent, or after failed work lost them.
    memory: Option<Memory>,
    /// The leases while GPU work uses the buffers.
    flight: Option<Flight>,
    failure: Option<Error>,
    /// The frame whose failure lost the buffers, for messages.
    lost_at: Option<u64>,
    /// Events around each frame's kernel, when timed.
    timing: Option<(Event, Event)>,
    /// Whether the frame in flight recorded the timing events (a stage that overlaps its own
    /// copies is not timed: its kernel spans them).
    timed: bool,
    holder: FrameMemoryHolder,
    /// The ring's reference event, recorded before any frame: frames' start and end times are
    /// taken against it, so the ring can merge them into the time the GPU was busy.
    origin: Option<Arc<Event>>,
    /// When the GPU worked on the last frame finished (milliseconds after `origin`), when timed.
    last_busy_ms: Option<(f64, f64)>,
    host_bytes: usize,
    device_bytes: usize,
    /// What building the slot spent, by part.
    setup: SetupTime,
}

/// The strategy `strategy` resolves to on `device` for a stage that runs as `stage` says.
///
/// # Errors
/// A strategy the device cannot run, a GPU strategy for a stage without a GPU path, or the CPU
/// strategy for one without a CPU path.
pub(crate) fn resolve<S: Stage>(device: &Device, strategy: Strategy, stage: &S) -> Result<Strategy> {
    let runs = stage.runs();
    let strategy = match strategy {
        Strategy::Auto if !runs.gpu => Strategy::Cpu,
        Strategy::Auto if !runs.cpu && !device.capabilities().gpu => {
            return Err(Error::NeedsGpu {
                what: "this stage".into(),
                detail: "it has no CPU path (give it one)".into(),
            });
        }
        strategy => strategy.resolve(device),
    };
    strategy.check(device)?;
    match strategy {
        Strategy::Cpu if !runs.cpu => Err(Error::invalid("strategy", "cpu: this stage has no CPU path")),
        Strategy::Cpu => Ok(strategy),
        _ if !runs.gpu => Err(Error::invalid(
            "strategy",
            format!("{strategy}: this stage runs on the CPU only; use the cpu strategy"),
        )),
        _ => Ok(strategy),
    }
}

fn sizes(layouts: &[FrameLayout]) -> impl Iterator<Item = usize> + '_ {
    layouts.iter().map(FrameLayout::bytes)
}

/// `bytes` zeroed bytes of pageable memory, or an error where the allocator has none (a
/// frame size from a caller must not abort the process, as `vec![0; bytes]` would).
fn zeroed(bytes: usize) -> Result<Vec<u8>> {
    // Where the kernel overcommits, the reservation below succeeds for any size and zeroing
    // it then runs the machine out of memory (a 256 GiB frame on the H200's 128 GiB ran past
    // a minute): refuse what the machine cannot hold first.
    check_within_memory("frame ring slot", bytes, "of frame memory", "every byte is written at once")?;
    let mut memory = Vec::new();
    memory.try_reserve_exact(bytes).map_err(|_| {
        Error::invalid(
            "frame ring slot",
            format!("{bytes} bytes of host memory are not to be had; make the frames smaller"),
        )
    })?;
    memory.resize(bytes, 0);
    Ok(memory)
}

impl Memory {
    fn new(
        device: &Device,
        strategy: Strategy,
        inputs: &[FrameLayout],
        outputs: &[FrameLayout],
    ) -> Result<Memory> {
        let vecs = |layouts: &[FrameLayout]| -> Result<Vec<Vec<u8>>> { sizes(layouts).map(zeroed).collect() };
        let pinned = |layouts: &[FrameLayout], options: PinOptions| -> Result<Vec<HostBuf<u8>>> {
            sizes(layouts).map(|bytes| HostBuf::pinned(device, bytes, options)).collect()
        };
        let on_device = |layouts: &[FrameLayout]| -> Result<Vec<DeviceBuf<u8>>> {
            sizes(layouts).map(|bytes| DeviceBuf::new(device, bytes)).collect()
        };
        let managed = |layouts: &[FrameLayout]| -> Result<Vec<ManagedBuf<u8>>> {
            sizes(layouts).map(|bytes| ManagedBuf::new(device, bytes)).collect()
        };
        let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
        let Some(traits) = strategy.traits() else { unreachable!("resolved before memory is made") };
        Ok(match traits.frames {
            FrameMemory::Host => Memory::Cpu { inputs: vecs(inputs)?, outputs: vecs(outputs)? },
            FrameMemory::PageableCopied => Memory::Pageable {
                inputs: vecs(inputs)?,
                outputs: vecs(outputs)?,
                device_in: on_device(inputs)?,
                device_out: on_device(outputs)?,
            },
            FrameMemory::PinnedCopied => Memory::Pinned {
                host_in: pinned(inputs, unmapped)?,
                host_out: pinned(outputs, unmapped)?,
                device_in: on_device(inputs)?,
                device_out: on_device(outputs)?,
            },
            FrameMemory::Mapped => Memory::Mapped {
                inputs: pinned(inputs, PinOptions::default())?,
                outputs: pinned(outputs, PinOptions::default())?,
            },
            FrameMemory::Managed => Memory::Managed { inputs: managed(inputs)?, outputs: managed(outputs)? },
        })
    }

    fn input_mut(&mut self, index: usize) -> &mut [u8] {
        match self {
            Memory::Cpu { inputs, .. } | Memory::Pageable { inputs, .. } => &mut inputs[index],
            Memory::Pinned { host_in, .. } => host_in[index].as_mut_slice(),
            Memory::Mapped { inputs, .. } => inputs[index].as_mut_slice(),
            Memory::Managed { inputs, .. } => inputs[index].as_mut_slice(),
        }
    }

    fn input(&self, index: usize) -> &[u8] {
        match self {
            Memory::Cpu { inputs, .. } | Memory::Pageable { inputs, .. } => &inputs[index],
            Memory::Pinned { host_in, .. } => host_in[index].as_slice(),
            Memory::Mapped { inputs, .. } => inputs[index].as_slice(),
            Memory::Managed { inputs, .. } => inputs[index].as_slice(),
        }
    }

    fn output(&self, index: usize) -> &[u8] {
        match self {
            Memory::Cpu { outputs, .. } | Memory::Pageable { outputs, .. } => &outputs[index],
            Memory::Pinned { host_out, .. } => host_out[index].as_slice(),
            Memory::Mapped { outputs, .. } => outputs[index].as_slice(),
            Memory::Managed { outputs, .. } => outputs[index].as_slice(),
        }
    }

    fn output_mut(&mut self, index: usize) -> &mut [u8] {
        match self {
            Memory::Cpu { outputs, .. } | Memory::Pageable { outputs, .. } => &mut outputs[index],
            Memory::Pinned { host_out, .. } => host_out[index].as_mut_slice(),
            Memory::Mapped { outputs, .. } => outputs[index].as_mut_slice(),
            Memory::Managed { outputs, .. } => outputs[index].as_mut_slice(),
        }
    }

    /// Host and device bytes the buffers take.
    fn footprint(&self, inputs: &[FrameLayout], outputs: &[FrameLayout]) -> (usize, usize) {
        let frame: usize = sizes(inputs).chain(sizes(outputs)).sum();
        match self {
            Memory::Cpu { .. } | Memory::Mapped { .. } | Memory::Managed { .. } => (frame, 0),
            Memory::Pageable { .. } | Memory::Pinned { .. } => (frame, frame),
        }
    }
}

impl<S: Stage> Slot<S> {
    /// A slot for `stage` by `strategy` (resolved) on `device`: its queue, the stage prepared
    /// for it (its constant data where `placement` put it, by the hybrid strategy), and one
    /// frame's buffers.
    ///
    /// # Errors
    /// Creating the queue, preparing the stage or allocating the buffers failed.
    pub(crate) fn new(
        device: &Device,
        strategy: Strategy,
        stage: &S,
        options: SlotOptions,
        placement: Option<&Placement>,
    ) -> Result<Slot<S>> {
        let mut setup = SetupTime::default();
        let queue = timed(&mut setup.queues, || match strategy {
            Strategy::Cpu => Ok(None),
            _ => Queue::with_fence_kind(device, options.fence).map(Some),
        })?;
        let places = hybrid::constant_places(strategy, &stage.constants(device), placement);
        let prepared = timed(&mut setup.kernel, || match &queue {
            Some(queue) => stage.prepare(queue, strategy, &places),
            // The CPU strategy's stage is prepared on a queue of the CPU backend.
            None => stage.prepare(&Queue::new(&Device::cpu())?, strategy, &places),
        })?;
        let memory = timed(&mut setup.frame_memory, || {
            Memory::new(device, strategy, stage.inputs(), stage.outputs())
        })?;
        let (host_bytes, device_bytes) = memory.footprint(stage.inputs(), stage.outputs());
        // Events exist on a GPU's queue only (the CPU strategy has no queue).
        let timing = match (&queue, options.timing) {
            (Some(queue), true) => queue.timing_event()?.zip(queue.timing_event()?),
            _ => None,
        };
        Ok(Slot {
            strategy,
            queue,
            prepared,
            memory: Some(memory),
            flight: None,
            failure: None,
            lost_at: None,
            timing,
            timed: false,
            holder: options.holder,
            origin: None,
            last_busy_ms: None,
            host_bytes,
            device_bytes,
            setup,
        })
    }

    /// What building this slot spent, by part (its placement not included: that is chosen once
    /// for every slot).
    pub(crate) fn setup_time(&self) -> SetupTime {
        self.setup
    }

    /// The strategy.
    pub(crate) fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The stage as prepared for this slot's queue.
    pub(crate) fn prepared(&self) -> &S::Prepared {
        &self.prepared
    }

    /// Host and device bytes of the frame buffers (the stage's constant data not included).
    pub(crate) fn footprint(&self) -> (usize, usize) {
        (self.host_bytes, self.device_bytes)
    }

    /// Why the buffers are gone, when a failed frame lost them.
    pub(crate) fn lost(&self) -> Option<Error> {
        if self.memory.is_some() || self.flight.is_some() {
            return None;
        }
        // A filter's frames have no index in a stream: it names none.
        let frame = self.lost_at.filter(|_| self.holder != FrameMemoryHolder::Filter);
        Some(Error::FrameMemoryLost { holder: self.holder, frame })
    }

    fn lent() -> Error {
        Error::StillHeld {
            what: "the frame buffers",
            remedy: "they are lent to GPU work: finish the frame first".into(),
        }
    }

    fn memory(&self) -> Result<&Memory> {
        self.memory.as_ref().ok_or_else(|| self.lost().unwrap_or_else(|| Self::lent()))
    }

    fn memory_mut(&mut self) -> Result<&mut Memory> {
        let error = self.lost().unwrap_or_else(|| Self::lent());
        self.memory.as_mut().ok_or(error)
    }

    /// Input buffer `index`, for the CPU to write the next frame into.
    pub(crate) fn input_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        Ok(self.memory_mut()?.input_mut(index))
    }

    /// Input buffer `index`, as the CPU wrote it.
    pub(crate) fn input(&self, index: usize) -> Result<&[u8]> {
        Ok(self.memory()?.input(index))
    }

    /// Output buffer `index`, as the last frame left it.
    pub(crate) fn output(&self, index: usize) -> Result<&[u8]> {
        Ok(self.memory()?.output(index))
    }

    /// Output buffer `index`, for poisoning.
    pub(crate) fn output_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        Ok(self.memory_mut()?.output_mut(index))
    }

    /// Runs frame `index` through `stage`: now on the CPU, or queued on the GPU. A failure is
    /// kept for [`Slot::take_failure`]; when queueing fails part-way, the work queued before is
    /// waited for and the slot keeps its buffers, so only this frame fails.
    pub(crate) fn submit(&mut self, stage: &S, index: u64) {
        let Some(memory) = self.memory.take() else {
            self.failure = self.lost();
            return;
        };
        let (flight, queued) = match memory {
            Memory::Cpu { inputs, mut outputs } => {
                let ran = crate::faults::fail(crate::faults::FaultPoint::Launch).and_then(|()| {
                    let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                    let mut outputs: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
                    stage.run_cpu(&inputs, &mut outputs)
                });
                self.memory = Some(Memory::Cpu { inputs, outputs });
                self.failure = ran.err();
                return;
            }
            memory => self.queue_work(stage, memory),
        };
        match queued {
            Ok(()) => self.flight = Some(flight),
            Err(error) => {
                match self.reclaim(flight) {
                    Ok((memory, _)) => self.memory = Some(memory),
                    Err(wait) => {
                        tracing::error!("after frame {index} failed, its earlier work failed too: {wait}");
                        self.lost_at = Some(index);
                    }
                }
                self.failure = Some(error);
            }
        }
    }

    /// Lends the buffers and queues the frame's work; returns the leases and whether all of it
    /// was queued.
    fn queue_work(&mut self, stage: &S, memory: Memory) -> (Flight, Result<()>) {
        let queue = self.queue.clone().expect("GPU strategies have a queue");
        let (prepared, timing) = (&mut self.prepared, &self.timing);
        let timed_frame = std::cell::Cell::new(false);
        // Records the events around the kernel, when the slot times. Each is recorded once per
        // frame: recording an event again while its last record is still queued slowed 1080p
        // pinned-async streaming by 30% on the H200.
        let timed = |launch: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let Some((start, end)) = timing else { return launch() };
            queue.record(start)?;
            launch()?;
            queue.record(end)?;
            timed_frame.set(true);
            Ok(())
        };
        let work = match memory {
            Memory::Pageable { inputs, outputs, mut device_in, device_out } => {
                let uploaded = device_in
                    .iter_mut()
                    .zip(&inputs)
                    .try_for_each(|(device, host)| device.copy_from_slice(host));
                let device_in: Vec<_> = device_in.into_iter().map(|buffer| queue.share(buffer)).collect();
                let mut device_out: Vec<_> =
                    device_out.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let queued = uploaded
                    .and_then(|()| timed(&mut || stage.queue(prepared, &queue, &device_in, &mut device_out)));
                (Flight::Pageable { inputs, outputs, device_in, device_out }, queued)
            }
            Memory::Pinned { host_in, host_out, device_in, device_out } => {
                let host_in: Vec<_> = host_in.into_iter().map(|buffer| queue.share(buffer)).collect();
                let mut device_in: Vec<_> = device_in.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let mut device_out: Vec<_> =
                    device_out.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let mut host_out: Vec<_> = host_out.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let queued = (|| {
                    let frame = PinnedFrame {
                        host_inputs: &host_in,
                        device_inputs: &mut device_in,
                        device_outputs: &mut device_out,
                        host_outputs: &mut host_out,
                    };
                    if let Some(queued) = stage.queue_pinned(prepared, &queue, frame) {
                        return queued;
                    }
                    for (host, device) in host_in.iter().zip(device_in.iter_mut()) {
                        queue.copy(host, device)?;
                    }
                    timed(&mut || stage.queue(prepared, &queue, &device_in, &mut device_out))?;
                    for (device, host) in device_out.iter().zip(host_out.iter_mut()) {
                        queue.copy(device, host)?;
                    }
                    Ok(())
                })();
                (Flight::Pinned { host_in, device_in, device_out, host_out }, queued)
            }
            Memory::Mapped { inputs, outputs } => {
                let inputs: Vec<_> = inputs.into_iter().map(|buffer| queue.share(buffer)).collect();
                let mut outputs: Vec<_> = outputs.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let queued = timed(&mut || stage.queue(prepared, &queue, &inputs, &mut outputs));
                (Flight::Mapped { inputs, outputs }, queued)
            }
            Memory::Managed { inputs, outputs } => {
                let ordinal = queue.cuda_device().map_or(0, |gpu| gpu.ordinal());
                let mut inputs: Vec<_> = inputs.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let mut outputs: Vec<_> = outputs.into_iter().map(|buffer| queue.lend(buffer)).collect();
                let queued = (|| {
                    for buffer in inputs.iter_mut().chain(outputs.iter_mut()) {
                        buffer.prefetch(MemLocation::Device(ordinal))?;
                    }
                    timed(&mut || stage.queue(prepared, &queue, &inputs, &mut outputs))?;
                    outputs.iter_mut().try_for_each(|buffer| buffer.prefetch(MemLocation::Host))
                })();
                (Flight::Managed { inputs, outputs }, queued)
            }
            Memory::Cpu { .. } => unreachable!("the CPU strategy runs in submit"),
        };
        self.timed = timed_frame.get();
        work
    }

    /// Waits for the frame's work and takes the buffers back (copying the outputs to the host
    /// for the copy strategy).
    fn reclaim(&self, flight: Flight) -> Result<(Memory, Result<()>)> {
        // The last buffer used first: work on one queue finishes in order. A failed wait leaves
        // the rest to their drops, which wait too, or leak.
        Ok(match flight {
            Flight::Pageable { inputs, mut outputs, device_in, device_out } => {
                let device_out: Vec<_> = device_out.into_iter().map(Lent::reclaim).collect::<Result<_>>()?;
                let device_in = device_in.into_iter().map(Shared::reclaim).collect::<Result<_>>()?;
                // The GPU is done with the buffers: a failed download fails the frame, and the
                // slot keeps its memory.
                let downloaded = device_out
                    .iter()
                    .zip(outputs.iter_mut())
                    .try_for_each(|(device, host)| device.copy_to_slice(host));
                (Memory::Pageable { inputs, outputs, device_in, device_out }, downloaded)
            }
            Flight::Pinned { host_in, device_in, device_out, host_out } => {
                let host_out = host_out.into_iter().map(Lent::reclaim).collect::<Result<_>>()?;
                let memory = Memory::Pinned {
                    host_out,
                    device_out: device_out.into_iter().map(Lent::reclaim).collect::<Result<_>>()?,
                    device_in: device_in.into_iter().map(Lent::reclaim).collect::<Result<_>>()?,
                    host_in: host_in.into_iter().map(Shared::reclaim).collect::<Result<_>>()?,
                };
                (memory, Ok(()))
            }
            Flight::Mapped { inputs, outputs } => {
                let outputs = outputs.into_iter().map(Lent::reclaim).collect::<Result<_>>()?;
                let inputs = inputs.into_iter().map(Shared::reclaim).collect::<Result<_>>()?;
                (Memory::Mapped { outputs, inputs }, Ok(()))
            }
            Flight::Managed { inputs, outputs } => {
                let outputs = outputs.into_iter().map(Lent::reclaim).collect::<Result<_>>()?;
                let inputs = inputs.into_iter().map(Lent::reclaim).collect::<Result<_>>()?;
                (Memory::Managed { outputs, inputs }, Ok(()))
            }
        })
    }

    /// A fence after the frame's work, if it is on the GPU now (work on one queue finishes in
    /// order, so a fence queued now follows it).
    pub(crate) fn fence(&self) -> Result<Option<Fence>> {
        match (&self.flight, &self.queue) {
            (Some(_), Some(queue)) => queue.signal().map(Some),
            _ => Ok(None),
        }
    }

    /// Finishes the GPU work of frame `index`: gives the buffers back, or records its failure.
    /// Returns false when `block` is false and the work is still running.
    pub(crate) fn finish(&mut self, index: u64, block: bool) -> bool {
        let Some(flight) = self.flight.take() else { return true };
        // Still running: come back later. Complete, or failed: the reclaim below reports it.
        if !block && matches!(flight.is_complete(), Ok(false)) {
            self.flight = Some(flight);
            return false;
        }
        match self.reclaim(flight) {
            Ok((memory, finished)) => {
                self.memory = Some(memory);
                self.failure = finished.err();
                self.last_busy_ms = None;
                if let (Some((start, end)), Some(origin)) =
                    (self.timing.as_ref().filter(|_| self.timed), &self.origin)
                {
                    // The end event is recorded after the launch's fence (the leases' last one
                    // for mapped memory), so it may complete just after the reclaim: wait. The
                    // frame's length comes from its own two events, not from two offsets to the
                    // origin: f32 milliseconds lose microseconds a few minutes after the origin.
                    let times = end
                        .synchronize()
                        .and_then(|()| Ok((start.elapsed_ms_since(origin)?, end.elapsed_ms_since(start)?)));
                    match times {
                        Ok((from, length)) => {
                            self.last_busy_ms = Some((f64::from(from), f64::from(from) + f64::from(length)))
                        }
                        Err(error) => tracing::warn!("timing frame {index}'s work failed: {error}"),
                    }
                }
            }
            Err(error) => {
                self.failure = Some(error);
                self.lost_at = Some(index);
            }
        }
        true
    }

    /// The failure of the last frame, if it failed.
    pub(crate) fn take_failure(&mut self) -> Option<Error> {
        self.failure.take()
    }

    /// When the GPU worked on the last frame finished: (start, end) in milliseconds after the
    /// origin given to [`Slot::time_against`], when timed.
    pub(crate) fn take_busy_ms(&mut self) -> Option<(f64, f64)> {
        self.last_busy_ms.take()
    }

    /// Times this slot's frames against `origin`, an event recorded (and complete) before the
    /// slot's first frame. Returns false, dropping `origin`, when the slot does not time.
    pub(crate) fn time_against(&mut self, origin: &Arc<Event>) -> bool {
        if self.timing.is_none() {
            return false;
        }
        self.origin = Some(Arc::clone(origin));
        true
    }

    /// The slot's queue, if it has one (GPU strategies).
    pub(crate) fn queue(&self) -> Option<&Queue> {
        self.queue.as_ref()
    }
}

impl Flight {
    /// Whether the frame's last work has finished (leases on one queue finish in order, so the
    /// last-used buffer's fence covers the rest).
    fn is_complete(&self) -> Result<bool> {
        let last = match self {
            Flight::Pageable { device_out, .. } => device_out.last().map(Lent::is_complete),
            Flight::Pinned { host_out, .. } => host_out.last().map(Lent::is_complete),
            Flight::Mapped { outputs, .. } => outputs.last().map(Lent::is_complete),
            Flight::Managed { outputs, .. } => outputs.last().map(Lent::is_complete),
        };
        last.unwrap_or(Ok(true))
    }
}
