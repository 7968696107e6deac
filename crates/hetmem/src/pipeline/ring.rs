//! [`FrameRing`]: a stream of frames through the Gaussian blur, N frames in flight at once.
//!
//! The slot state machine is in `ring/state.rs`, model-tested there; the rules it keeps are
//! on [`FrameRing`].

mod state;

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use state::{RingState, Stall};

use super::Strategy;
use crate::backend::Device;
use crate::backend::cuda::{Event, MemLocation};
use crate::error::{Error, Result};
use crate::handoff::{FenceFuture, FenceKind, Lent, Queue, Shared};
use crate::memory::{Buffer, DeviceBuf, HostBuf, ManagedBuf, PinOptions, WritableBuffer};
use crate::ops::gaussian::{
    FrameFormat, Gaussian, GaussianPlan, GaussianTable, TablePlacement, gaussian, gaussian_cpu,
};
use crate::retry::RetryPolicy;

/// The slots a ring has unless told otherwise: one frame uploading, one filtering, one
/// downloading.
pub const DEFAULT_SLOTS: usize = 3;

/// How a [`FrameRing`] is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// Frames in the ring at once (at least 1). Default [`DEFAULT_SLOTS`].
    pub slots: usize,
    /// Time each frame's kernel with CUDA events, for [`FrameRing::gpu_busy_seconds`].
    /// Default off (two event records per frame).
    pub timing: bool,
    /// How the slots' queues signal that a frame's work has finished: CUDA events (the
    /// default: the consumer sleeps in the driver), or mapped flags (the consumer spins a core,
    /// and no event is made per copy and launch).
    pub fence: FenceKind,
    /// How a slot's allocation that fails for want of memory is retried. Default
    /// [`RetryPolicy::default`].
    pub retry: RetryPolicy,
    /// The fewest slots the ring settles for when pinned or device memory runs short even
    /// after the retries: the ring then runs with the slots it could allocate (at least this
    /// many), logs a warning, and [`FrameRing::slots`] says how many. Results are the same,
    /// only fewer frames overlap. Default 1; `slots` refuses any shortfall.
    pub min_slots: usize,
}

impl Default for RingOptions {
    fn default() -> RingOptions {
        RingOptions {
            slots: DEFAULT_SLOTS,
            timing: false,
            fence: FenceKind::Event,
            retry: RetryPolicy::default(),
            min_slots: 1,
        }
    }
}

/// A CPU stage run on each frame: reads the input, writes the output.
pub type CpuStage = dyn Fn(&[u8], &mut [u8]) -> Result<()> + Send + Sync;

/// A ring of frame slots between a producer, the GPU (or a CPU stage) and a consumer.
///
/// The producer writes frame k+1 straight into its slot ([`FrameRing::next_input`]) while the
/// GPU filters frame k and the consumer reads frame k-1 ([`FrameRing::next_output`]). Each
/// slot owns its memory and its own queue (a CUDA stream), so the work of different frames
/// overlaps: with the copy strategies, one frame's upload, another's kernel and a third's
/// download run at once on the copy engines and the SMs; with the mapped strategies, the
/// kernels of consecutive frames overlap their reads and writes across the link.
///
/// The rules (the slot state machine in `ring/state.rs`, model-tested there):
/// - frames come out in the order they went in, each exactly once, failed ones included;
/// - a slot held by the GPU or the consumer is never handed to the producer: a full ring blocks
///   ([`FrameRing::next_input`]) or refuses with [`Error::WouldBlock`]
///   ([`FrameRing::try_next_input`]), so memory stays bounded at N slots;
/// - while the GPU works on a slot its buffers are lent to it (the hand-off's [`Lent`] and
///   [`Shared`] leases), so no safe code can reach them until its fence completes;
/// - a frame whose work fails comes out as [`Error::FrameFailed`] naming its index; the frames
///   before it come out intact.
///
/// The producer and the consumer may be two threads sharing `&FrameRing`, or one thread that
/// drains an output whenever [`FrameRing::try_next_input`] says the ring is full.
///
/// # Examples
/// ```
/// use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout};
/// use hetmem::pipeline::{FrameRing, RingOptions};
/// use hetmem::{Device, Strategy};
///
/// let device = Device::open_best()?;
/// let format = FrameFormat::new(64, 48, PixelLayout::Rgb)?;
/// let kernel = Gaussian::new(None, None, Border::default())?;
/// let ring = FrameRing::new(&device, Strategy::Auto, format, &kernel, RingOptions::default())?;
/// std::thread::scope(|scope| {
///     scope.spawn(|| {
///         for frame in 0..10u8 {
///             let mut slot = ring.next_input()?;
///             slot.fill(frame);
///             slot.submit();
///         }
///         Ok::<(), hetmem::Error>(())
///     });
///     for frame in 0..10u8 {
///         let output = ring.next_output()?;
///         assert!(output.iter().all(|&byte| byte == frame)); // a flat frame stays flat
///     }
///     Ok::<(), hetmem::Error>(())
/// })?;
/// # Ok::<(), hetmem::Error>(())
/// ```
pub struct FrameRing {
    state: Mutex<RingState>,
    /// Notified on every change of `state`.
    changed: Condvar,
    /// One lock per slot; the state machine makes sure only one side ever wants it at a time,
    /// so these are never contended for long.
    slots: Vec<Mutex<Slot>>,
    work: Work,
    strategy: Strategy,
    frame_bytes: usize,
    link_bytes_per_frame: u64,
    host_bytes: usize,
    device_bytes: usize,
    busy_nanos: AtomicU64,
    /// Tasks awaiting [`FrameRing::next_output_async`] on an empty ring, woken with `changed`.
    wakers: Mutex<Vec<Waker>>,
}

impl std::fmt::Debug for FrameRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameRing")
            .field("strategy", &self.strategy)
            .field("slots", &self.slots.len())
            .field("frame_bytes", &self.frame_bytes)
            .finish_non_exhaustive()
    }
}

/// What happens to each frame.
enum Work {
    Cpu(Arc<CpuStage>),
    Gpu(GaussianPlan),
}

/// One slot's memory and, while the GPU works on it, its leases.
enum Slot {
    Cpu { input: Vec<u8>, output: Vec<u8>, failure: Option<Error> },
    Gpu(Box<GpuSlot>),
}

struct GpuSlot {
    queue: Queue,
    table: GaussianTable,
    /// The buffers while the CPU owns them; `None` while lent, or after failed work lost them.
    rest: Option<GpuMemory>,
    /// The leases while the GPU owns the buffers.
    flight: Option<Flight>,
    failure: Option<Error>,
    /// The frame whose failure lost the buffers, for the message.
    lost_at: Option<u64>,
    timing: Option<(Event, Event)>,
}

#[allow(clippy::large_enum_variant, reason = "one per slot, inside the slot's Box")]
enum GpuMemory {
    /// Pinned host memory in and out, device memory for the kernel: the copy strategies.
    Copied {
        host_in: HostBuf<u8>,
        host_out: HostBuf<u8>,
        device_in: DeviceBuf<u8>,
        device_out: DeviceBuf<u8>,
    },
    /// Mapped pinned host memory that the kernel reads and writes itself.
    Mapped {
        input: HostBuf<u8>,
        output: HostBuf<u8>,
    },
    Managed {
        input: ManagedBuf<u8>,
        output: ManagedBuf<u8>,
    },
}

#[allow(clippy::large_enum_variant, reason = "one per slot, inside the slot's Box")]
enum Flight {
    Copied {
        host_in: Shared<HostBuf<u8>>,
        device_in: Lent<DeviceBuf<u8>>,
        device_out: Lent<DeviceBuf<u8>>,
        host_out: Lent<HostBuf<u8>>,
    },
    Mapped {
        input: Shared<HostBuf<u8>>,
        output: Lent<HostBuf<u8>>,
    },
    Managed {
        input: Lent<ManagedBuf<u8>>,
        output: Lent<ManagedBuf<u8>>,
    },
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl FrameRing {
    /// A ring of `options.slots` slots blurring `format` frames with `kernel` on `device` by
    /// `strategy` (`Auto` resolved), with all its memory allocated now.
    ///
    /// `Copy` and `PinnedAsync` both stream through pinned host memory and device buffers
    /// (pageable memory cannot overlap copies with other work); `ZeroCopy` and `Hybrid` through
    /// mapped host memory; `Managed` through managed memory, prefetched each way.
    ///
    /// Each slot's memory is allocated with `options.retry` for shortages; a ring that still
    /// runs short settles for fewer slots, down to `options.min_slots` (see [`RingOptions`]).
    ///
    /// # Errors
    /// No slots, a strategy the device cannot run, or an allocation failing (for the first
    /// `options.min_slots` slots).
    pub fn new(
        device: &Device,
        strategy: Strategy,
        format: FrameFormat,
        kernel: &Gaussian,
        options: RingOptions,
    ) -> Result<FrameRing> {
        check_slots(options.slots)?;
        let strategy = strategy.resolve(device);
        strategy.check(device)?;
        let frame = format.frame_bytes();
        if strategy == Strategy::Cpu {
            // The plan checks the frame and the kernel, as the GPU path does.
            GaussianPlan::new(&format, kernel, 1)?;
            let kernel = kernel.clone();
            let stage = move |input: &[u8], output: &mut [u8]| gaussian_cpu(&format, &kernel, input, output);
            return FrameRing::with_cpu_stage(frame, options, stage);
        }
        let gpu = device.as_cuda().expect("checked: GPU strategies run on a CUDA device");
        let plan = GaussianPlan::new(&format, kernel, gpu.attributes().multiprocessor_count)?;
        let mut slots = Vec::with_capacity(options.slots);
        let (mut host_bytes, mut device_bytes) = (0, 0);
        for _ in 0..options.slots {
            let made = options
                .retry
                .run("allocating a frame ring slot", || GpuSlot::new(device, strategy, &plan, &options));
            let slot = match made {
                Ok(slot) => slot,
                Err(error)
                    if error.is_transient() && !slots.is_empty() && slots.len() >= options.min_slots =>
                {
                    tracing::warn!(
                        "memory ran short for slot {} of the ring ({error}): running with {} of the {} \
                         slots asked for (same results, fewer frames in flight)",
                        slots.len() + 1,
                        slots.len(),
                        options.slots
                    );
                    break;
                }
                Err(error) => return Err(error),
            };
            host_bytes += 2 * frame + slot.table.host_bytes();
            device_bytes += slot.table.device_bytes()
                + if matches!(strategy, Strategy::Copy | Strategy::PinnedAsync) { 2 * frame } else { 0 };
            slots.push(Mutex::new(Slot::Gpu(Box::new(slot))));
        }
        let slot_count = slots.len();
        let link_bytes_per_frame = match strategy {
            Strategy::ZeroCopy => plan.bytes_read() + frame as u64,
            Strategy::Hybrid => plan.bytes_read() - plan.bytes_read_of_table() + frame as u64,
            _ => 2 * frame as u64,
        };
        Ok(FrameRing {
            state: Mutex::new(RingState::new(slot_count)),
            changed: Condvar::new(),
            slots,
            work: Work::Gpu(plan),
            strategy,
            frame_bytes: frame,
            link_bytes_per_frame,
            host_bytes,
            device_bytes,
            busy_nanos: AtomicU64::new(0),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// A ring on the CPU whose frames of `frame_bytes` bytes go through `stage` (on the
    /// producer's thread, at [`InputSlot::submit`]). A stage that fails makes its frame come out
    /// as [`Error::FrameFailed`]; the ring carries on with the next frame.
    ///
    /// # Errors
    /// No slots, or zero-byte frames.
    pub fn with_cpu_stage(
        frame_bytes: usize,
        options: RingOptions,
        stage: impl Fn(&[u8], &mut [u8]) -> Result<()> + Send + Sync + 'static,
    ) -> Result<FrameRing> {
        check_slots(options.slots)?;
        if frame_bytes == 0 {
            return Err(Error::invalid("frame size", "0 bytes: frames hold at least one byte"));
        }
        let slots = (0..options.slots)
            .map(|_| {
                Mutex::new(Slot::Cpu {
                    input: vec![0; frame_bytes],
                    output: vec![0; frame_bytes],
                    failure: None,
                })
            })
            .collect();
        Ok(FrameRing {
            state: Mutex::new(RingState::new(options.slots)),
            changed: Condvar::new(),
            slots,
            work: Work::Cpu(Arc::new(stage)),
            strategy: Strategy::Cpu,
            frame_bytes,
            link_bytes_per_frame: 0,
            host_bytes: 2 * frame_bytes * options.slots,
            device_bytes: 0,
            busy_nanos: AtomicU64::new(0),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// The strategy (never `Auto`).
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes per frame.
    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// Bytes that cross the host-GPU link per frame, as for [`crate::FrameFilter`]: copies
    /// move the frame in and out; mapped strategies move what the kernel reads (with re-read
    /// halos, and the table when it is in host memory) and writes.
    pub fn link_bytes_per_frame(&self) -> u64 {
        self.link_bytes_per_frame
    }

    /// Host memory the ring allocated, in bytes.
    pub fn host_bytes(&self) -> usize {
        self.host_bytes
    }

    /// Device memory the ring allocated, in bytes.
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// Frames submitted so far.
    pub fn submitted(&self) -> u64 {
        lock(&self.state).submitted()
    }

    /// Frames the consumer has finished with so far.
    pub fn drained(&self) -> u64 {
        lock(&self.state).drained()
    }

    /// Seconds the GPU spent in the kernels of the frames drained so far, from CUDA events
    /// around each kernel ([`RingOptions::timing`]; 0 without it, or on the CPU). Kernels of
    /// different slots may overlap, so this can exceed the wall time.
    pub fn gpu_busy_seconds(&self) -> f64 {
        self.busy_nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Overwrites every slot's output memory with `value`: tests poison outputs so that an
    /// unwritten byte cannot pass for a right one.
    ///
    /// # Errors
    /// Frames are in the ring (only an idle ring can be poisoned), or a slot's memory was lost
    /// to a failed frame.
    pub fn fill_outputs(&self, value: u8) -> Result<()> {
        let state = lock(&self.state);
        if (0..state.len()).any(|slot| state.slot(slot) != state::SlotState::Free) {
            return Err(Error::invalid(
                "frame ring",
                "frames are in it: drain it before filling its outputs",
            ));
        }
        for slot in &self.slots {
            match &mut *lock(slot) {
                Slot::Cpu { output, .. } => output.fill(value),
                Slot::Gpu(gpu) => {
                    let lost = gpu.lost();
                    match gpu.rest.as_mut().ok_or(lost)? {
                        GpuMemory::Copied { host_out, .. } => host_out.as_mut_slice().fill(value),
                        GpuMemory::Mapped { output, .. } => output.as_mut_slice().fill(value),
                        GpuMemory::Managed { output, .. } => output.as_mut_slice().fill(value),
                    }
                }
            }
        }
        Ok(())
    }

    /// The next frame's input slot, waiting while the ring is full (until the consumer
    /// finishes with the oldest frame).
    ///
    /// # Errors
    /// [`Error::RingClosed`]; an input slot is already held; the slot's memory was lost to an
    /// earlier failed frame.
    pub fn next_input(&self) -> Result<InputSlot<'_>> {
        self.input(true)
    }

    /// The next frame's input slot, or [`Error::WouldBlock`] at once when the ring is full.
    ///
    /// # Errors
    /// As for [`FrameRing::next_input`], and [`Error::WouldBlock`].
    pub fn try_next_input(&self) -> Result<InputSlot<'_>> {
        self.input(false)
    }

    fn input(&self, block: bool) -> Result<InputSlot<'_>> {
        let mut state = lock(&self.state);
        let (slot, index) = loop {
            match state.begin_input() {
                Ok(taken) => break taken,
                Err(Stall::Full) if block => {
                    state = self.changed.wait(state).unwrap_or_else(|poison| poison.into_inner())
                }
                Err(Stall::Full) => {
                    return Err(Error::WouldBlock("a frame ring's next input (the ring is full)"));
                }
                Err(Stall::Closed) => return Err(Error::RingClosed),
                Err(_) => {
                    return Err(Error::invalid(
                        "frame ring",
                        "an input slot is already held: submit it first",
                    ));
                }
            }
        };
        drop(state);
        let guard = lock(&self.slots[slot]);
        if let Slot::Gpu(gpu) = &*guard
            && gpu.rest.is_none()
        {
            let error = gpu.lost();
            drop(guard);
            lock(&self.state).cancel_input(slot);
            self.notify();
            return Err(error);
        }
        Ok(InputSlot { ring: self, guard: Some(guard), slot, index })
    }

    /// Takes no more frames: [`FrameRing::next_input`] (also one waiting now) returns
    /// [`Error::RingClosed`], and so does [`FrameRing::next_output`] once every frame submitted
    /// before has come out. How a producer says the stream has ended, or a consumer that gives
    /// up says so to a producer waiting on a full ring.
    pub fn close(&self) {
        lock(&self.state).close();
        self.notify();
    }

    /// The oldest frame, once filtered, waiting for it to be submitted and for its work to
    /// finish. Dropping the returned [`OutputFrame`] frees its slot for the producer.
    ///
    /// # Errors
    /// [`Error::FrameFailed`] for a frame whose work failed (its slot is freed, and the next
    /// call returns the next frame); [`Error::RingClosed`] after the last frame of a closed
    /// ring; an output frame is already held.
    pub fn next_output(&self) -> Result<OutputFrame<'_>> {
        self.output(true)
    }

    /// The oldest frame if it is filtered, or [`Error::WouldBlock`] at once when it has not
    /// been submitted yet or its work is still running.
    ///
    /// # Errors
    /// As for [`FrameRing::next_output`], and [`Error::WouldBlock`].
    pub fn try_next_output(&self) -> Result<OutputFrame<'_>> {
        self.output(false)
    }

    fn output(&self, block: bool) -> Result<OutputFrame<'_>> {
        let mut state = lock(&self.state);
        let (slot, index) = loop {
            match state.begin_output() {
                Ok(taken) => break taken,
                Err(Stall::Pending) => {
                    let (slot, index) = state.oldest_in_flight().expect("a pending frame is in flight");
                    drop(state);
                    // Only the consumer touches in-flight slots, so waiting here holds up no one.
                    let finished = self.finish_work(slot, index, block);
                    state = lock(&self.state);
                    if finished {
                        // Another consumer thread may have completed it meanwhile.
                        if matches!(state.slot(slot), state::SlotState::InFlight { .. }) {
                            state.complete(slot);
                        }
                        self.notify();
                    } else {
                        return Err(Error::WouldBlock(
                            "a frame ring's next output (its frame is still on the GPU)",
                        ));
                    }
                }
                Err(Stall::Empty) if block => {
                    state = self.changed.wait(state).unwrap_or_else(|poison| poison.into_inner())
                }
                Err(Stall::Empty) => {
                    return Err(Error::WouldBlock("a frame ring's next output (no frame was submitted)"));
                }
                Err(Stall::Closed) => return Err(Error::RingClosed),
                Err(_) => {
                    return Err(Error::invalid(
                        "frame ring",
                        "an output frame is already held: drop it first",
                    ));
                }
            }
        };
        drop(state);
        let mut guard = lock(&self.slots[slot]);
        let failure = match &mut *guard {
            Slot::Cpu { failure, .. } => failure.take(),
            Slot::Gpu(gpu) => gpu.failure.take(),
        };
        if let Some(source) = failure {
            drop(guard);
            lock(&self.state).finish_output(slot);
            self.notify();
            return Err(Error::FrameFailed { index, source: Box::new(source) });
        }
        Ok(OutputFrame { ring: self, guard: Some(guard), slot, index })
    }

    /// The oldest frame, as a future: like [`FrameRing::next_output`], but a task waiting for
    /// its GPU work awaits a fence through the hand-off's poller thread, and a task waiting for
    /// the producer is woken by [`InputSlot::submit`] or [`FrameRing::close`]; no thread blocks.
    pub fn next_output_async(&self) -> NextOutput<'_> {
        NextOutput { ring: self, fence: None }
    }

    /// Wakes every thread and task waiting for the ring to change.
    fn notify(&self) {
        self.changed.notify_all();
        for waker in lock(&self.wakers).drain(..) {
            waker.wake();
        }
    }

    /// A fence after the oldest frame's GPU work, if it is on the GPU now.
    fn oldest_fence(&self) -> Result<Option<crate::handoff::Fence>> {
        let Ok((slot, _)) = lock(&self.state).oldest_in_flight() else { return Ok(None) };
        match &*lock(&self.slots[slot]) {
            // Work on one queue finishes in order: a fence queued now follows the frame's work.
            Slot::Gpu(gpu) if gpu.flight.is_some() => gpu.queue.signal().map(Some),
            _ => Ok(None),
        }
    }

    /// Finishes the GPU work of the in-flight `slot`: gives its buffers back, or records its
    /// failure. Returns false when `block` is false and the work is still running.
    fn finish_work(&self, slot: usize, index: u64, block: bool) -> bool {
        let mut guard = lock(&self.slots[slot]);
        let Slot::Gpu(gpu) = &mut *guard else { return true };
        let Some(flight) = gpu.flight.take() else { return true };
        if !block {
            match flight.is_complete() {
                Ok(true) => {}
                Ok(false) => {
                    gpu.flight = Some(flight);
                    return false;
                }
                // The reclaim below reports it.
                Err(_) => {}
            }
        }
        match flight.reclaim() {
            Ok(memory) => {
                gpu.rest = Some(memory);
                if let Some((start, end)) = &gpu.timing {
                    // The end event is recorded after the launch's fence (the leases' last one
                    // for mapped memory), so it may complete just after the reclaim: wait for it.
                    match end.synchronize().and_then(|()| end.elapsed_ms_since(start)) {
                        Ok(ms) => {
                            self.busy_nanos.fetch_add((f64::from(ms) * 1e6) as u64, Ordering::Relaxed);
                        }
                        Err(error) => tracing::warn!("timing a ring frame's kernel failed: {error}"),
                    }
                }
            }
            Err(error) => {
                gpu.failure = Some(error);
                gpu.lost_at = Some(index);
            }
        }
        true
    }
}

fn check_slots(slots: usize) -> Result<()> {
    if slots == 0 {
        return Err(Error::invalid("ring slots", "0: a ring needs at least one slot"));
    }
    Ok(())
}

impl GpuSlot {
    /// A slot's queue, table and frame memory for `strategy`.
    fn new(
        device: &Device,
        strategy: Strategy,
        plan: &GaussianPlan,
        options: &RingOptions,
    ) -> Result<GpuSlot> {
        let frame = plan.format().frame_bytes();
        let queue = Queue::with_fence_kind(device, options.fence)?;
        let placement =
            if strategy == Strategy::ZeroCopy { TablePlacement::Host } else { TablePlacement::Device };
        let table = plan.upload_table(&queue, placement)?;
        let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
        let rest = match strategy {
            Strategy::Copy | Strategy::PinnedAsync => GpuMemory::Copied {
                host_in: HostBuf::pinned(device, frame, unmapped)?,
                host_out: HostBuf::pinned(device, frame, unmapped)?,
                device_in: DeviceBuf::new(device, frame)?,
                device_out: DeviceBuf::new(device, frame)?,
            },
            Strategy::ZeroCopy | Strategy::Hybrid => GpuMemory::Mapped {
                input: HostBuf::pinned(device, frame, PinOptions::default())?,
                output: HostBuf::pinned(device, frame, PinOptions::default())?,
            },
            Strategy::Managed => GpuMemory::Managed {
                input: ManagedBuf::new(device, frame)?,
                output: ManagedBuf::new(device, frame)?,
            },
            Strategy::Cpu | Strategy::Auto => unreachable!("GPU slots are made for GPU strategies"),
        };
        let gpu = device.as_cuda().expect("GPU strategies run on a CUDA device");
        let timing = match options.timing {
            true => Some((Event::new(gpu, true)?, Event::new(gpu, true)?)),
            false => None,
        };
        Ok(GpuSlot { queue, table, rest: Some(rest), flight: None, failure: None, lost_at: None, timing })
    }

    fn lost(&self) -> Error {
        Error::FrameMemoryLost { holder: crate::error::FrameMemoryHolder::RingSlot, frame: self.lost_at }
    }

    /// Lends the slot's memory to the GPU and queues the frame's work on the slot's queue.
    ///
    /// When queueing fails part-way, the work queued before the failure is waited for and the
    /// slot keeps its memory: only this frame fails, and the ring goes on. Only a failed wait
    /// (the GPU's context lost) loses the memory, and with it the slot.
    fn queue_frame(&mut self, plan: &GaussianPlan, index: u64) {
        let memory = self.rest.take().expect("an input slot holds its memory");
        let (flight, queued) = self.queue_work(memory, plan);
        match queued {
            Ok(()) => self.flight = Some(flight),
            Err(error) => {
                match flight.reclaim() {
                    Ok(memory) => self.rest = Some(memory),
                    Err(wait) => {
                        tracing::error!("after frame {index} failed, its earlier work failed too: {wait}");
                        self.lost_at = Some(index);
                    }
                }
                self.failure = Some(error);
            }
        }
    }

    /// The frame's leases, and whether all its work was queued.
    fn queue_work(&self, memory: GpuMemory, plan: &GaussianPlan) -> (Flight, Result<()>) {
        let queue = &self.queue;
        match memory {
            GpuMemory::Copied { host_in, host_out, device_in, device_out } => {
                let host_in = queue.share(host_in);
                let mut device_in = queue.lend(device_in);
                let mut device_out = queue.lend(device_out);
                let mut host_out = queue.lend(host_out);
                let queued = (|| {
                    queue.copy(&host_in, &mut device_in)?;
                    self.timed(|| self.filter(plan, &device_in, &mut device_out))?;
                    queue.copy(&device_out, &mut host_out)
                })();
                (Flight::Copied { host_in, device_in, device_out, host_out }, queued)
            }
            GpuMemory::Mapped { input, output } => {
                let input = queue.share(input);
                let mut output = queue.lend(output);
                let queued = self.timed(|| self.filter(plan, &input, &mut output));
                (Flight::Mapped { input, output }, queued)
            }
            GpuMemory::Managed { input, output } => {
                let ordinal = queue.cuda_device().map_or(0, |gpu| gpu.ordinal());
                let mut input = queue.lend(input);
                let mut output = queue.lend(output);
                let queued = (|| {
                    input.prefetch(MemLocation::Device(ordinal))?;
                    output.prefetch(MemLocation::Device(ordinal))?;
                    self.timed(|| self.filter(plan, &input, &mut output))?;
                    output.prefetch(MemLocation::Host)
                })();
                (Flight::Managed { input, output }, queued)
            }
        }
    }

    /// Runs `launch` between the slot's timing events, when it has them.
    fn timed(&self, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let (Some((start, end)), Some(stream)) = (&self.timing, self.queue.stream()) else {
            return launch();
        };
        start.record(stream)?;
        launch()?;
        end.record(stream)?;
        Ok(())
    }

    fn filter<I, O>(&self, plan: &GaussianPlan, input: &I, output: &mut Lent<O>) -> Result<()>
    where
        I: crate::handoff::Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        gaussian(&self.queue, plan, &self.table, input, output)
    }
}

impl Flight {
    /// Whether the frame's last work has finished (leases on one queue finish in order, so the
    /// last-used buffer's fence covers the rest).
    fn is_complete(&self) -> Result<bool> {
        match self {
            Flight::Copied { host_out, .. } => host_out.is_complete(),
            Flight::Mapped { output, .. } => output.is_complete(),
            Flight::Managed { output, .. } => output.is_complete(),
        }
    }

    /// Waits for the frame's work and takes the buffers back.
    fn reclaim(self) -> Result<GpuMemory> {
        Ok(match self {
            Flight::Copied { host_in, device_in, device_out, host_out } => {
                let host_out = host_out.reclaim()?;
                GpuMemory::Copied {
                    host_out,
                    device_out: device_out.reclaim()?,
                    device_in: device_in.reclaim()?,
                    host_in: host_in.reclaim()?,
                }
            }
            Flight::Mapped { input, output } => {
                let output = output.reclaim()?;
                GpuMemory::Mapped { output, input: input.reclaim()? }
            }
            Flight::Managed { input, output } => {
                let output = output.reclaim()?;
                GpuMemory::Managed { output, input: input.reclaim()? }
            }
        })
    }
}

/// The producer's hold on the next frame's slot: write the frame through `DerefMut`, then
/// [`InputSlot::submit`] it. Dropped without submitting, the slot goes back unused.
pub struct InputSlot<'ring> {
    ring: &'ring FrameRing,
    guard: Option<MutexGuard<'ring, Slot>>,
    slot: usize,
    index: u64,
}

impl std::fmt::Debug for InputSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputSlot").field("slot", &self.slot).field("index", &self.index).finish()
    }
}

impl InputSlot<'_> {
    /// The index this frame will have in the stream.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Hands the frame to the GPU (or the CPU stage) and returns its index. Failures of its
    /// work come out at [`FrameRing::next_output`], in order, as [`Error::FrameFailed`].
    pub fn submit(mut self) -> u64 {
        let mut guard = self.guard.take().expect("an input slot holds its slot until submitted");
        match (&mut *guard, &self.ring.work) {
            (Slot::Cpu { input, output, failure }, Work::Cpu(stage)) => {
                *failure = crate::faults::fail(crate::faults::FaultPoint::Launch)
                    .and_then(|()| stage(input, output))
                    .err();
            }
            (Slot::Gpu(gpu), Work::Gpu(plan)) => gpu.queue_frame(plan, self.index),
            _ => unreachable!("a ring's slots match its work"),
        }
        drop(guard);
        lock(&self.ring.state).submit(self.slot);
        self.ring.notify();
        self.index
    }
}

impl Deref for InputSlot<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &**self.guard.as_ref().expect("held until submitted") {
            Slot::Cpu { input, .. } => input,
            Slot::Gpu(gpu) => match gpu.rest.as_ref().expect("checked when the slot was taken") {
                GpuMemory::Copied { host_in, .. } => host_in.as_slice(),
                GpuMemory::Mapped { input, .. } => input.as_slice(),
                GpuMemory::Managed { input, .. } => input.as_slice(),
            },
        }
    }
}

impl DerefMut for InputSlot<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut **self.guard.as_mut().expect("held until submitted") {
            Slot::Cpu { input, .. } => input,
            Slot::Gpu(gpu) => match gpu.rest.as_mut().expect("checked when the slot was taken") {
                GpuMemory::Copied { host_in, .. } => host_in.as_mut_slice(),
                GpuMemory::Mapped { input, .. } => input.as_mut_slice(),
                GpuMemory::Managed { input, .. } => input.as_mut_slice(),
            },
        }
    }
}

impl Drop for InputSlot<'_> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            lock(&self.ring.state).cancel_input(self.slot);
            self.ring.notify();
        }
    }
}

/// The consumer's hold on the oldest filtered frame: read it through `Deref`; dropping it
/// frees the slot for the producer.
pub struct OutputFrame<'ring> {
    ring: &'ring FrameRing,
    guard: Option<MutexGuard<'ring, Slot>>,
    slot: usize,
    index: u64,
}

impl std::fmt::Debug for OutputFrame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFrame").field("slot", &self.slot).field("index", &self.index).finish()
    }
}

impl OutputFrame<'_> {
    /// The frame's index in the stream.
    pub fn index(&self) -> u64 {
        self.index
    }
}

impl Deref for OutputFrame<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &**self.guard.as_ref().expect("held until dropped") {
            Slot::Cpu { output, .. } => output,
            Slot::Gpu(gpu) => match gpu.rest.as_ref().expect("a finished frame's slot holds its memory") {
                GpuMemory::Copied { host_out, .. } => host_out.as_slice(),
                GpuMemory::Mapped { output, .. } => output.as_slice(),
                GpuMemory::Managed { output, .. } => output.as_slice(),
            },
        }
    }
}

impl Drop for OutputFrame<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        lock(&self.ring.state).finish_output(self.slot);
        self.ring.notify();
    }
}

/// The future of [`FrameRing::next_output_async`].
#[must_use = "a future does nothing unless awaited"]
pub struct NextOutput<'ring> {
    ring: &'ring FrameRing,
    fence: Option<FenceFuture>,
}

impl std::fmt::Debug for NextOutput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextOutput").field("awaiting_gpu", &self.fence.is_some()).finish()
    }
}

impl<'ring> Future for NextOutput<'ring> {
    type Output = Result<OutputFrame<'ring>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ring = self.ring;
        loop {
            if let Some(fence) = self.fence.as_mut() {
                match Pin::new(fence).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    // A failed fence: the frame's own reclaim below reports the failure.
                    Poll::Ready(_) => self.fence = None,
                }
            }
            match ring.try_next_output() {
                Err(Error::WouldBlock(_)) => {}
                done => return Poll::Ready(done),
            }
            match ring.oldest_fence() {
                Ok(Some(fence)) => self.fence = Some(fence.wait_async()),
                Ok(None) => {
                    // Nothing submitted yet: wait for the producer. Registered before looking
                    // again, so a submission in between is not missed.
                    let mut wakers = lock(&ring.wakers);
                    if !wakers.iter().any(|waker| waker.will_wake(cx.waker())) {
                        wakers.push(cx.waker().clone());
                    }
                    drop(wakers);
                    return match ring.try_next_output() {
                        Err(Error::WouldBlock(_)) => Poll::Pending,
                        done => Poll::Ready(done),
                    };
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}
