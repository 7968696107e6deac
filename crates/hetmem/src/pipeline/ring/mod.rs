//! [`FrameRing`]: a stream of frames through a [`Stage`], N frames in flight at once.
//!
//! The slot state machine is in `state.rs`, model-tested there; each slot's memory and work
//! is a [`Slot`] (the strategies' one implementation, `pipeline/slot.rs`); the producer's and
//! consumer's holds on a slot are in `frames.rs`, the async output in `future.rs`.

mod busy;
mod frames;
mod future;
mod state;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use busy::BusyTime;
use state::{RingState, Stall};

pub use frames::{InputSlot, OutputFrame};
pub use future::NextOutput;

use super::setup_time::{SetupTime, timed};
use super::slot::{self, Slot, SlotOptions};
use super::{Strategy, hybrid};
use crate::backend::Device;
use crate::error::{Error, FrameMemoryHolder, Result};
use crate::handoff::FenceKind;
use crate::placement::{Placement, Where};
use crate::retry::RetryPolicy;
use crate::stage::{CpuStage, FrameLayout, FrameMemory, Stage};

/// The slots a ring has unless told otherwise: one frame uploading, one filtering, one
/// downloading.
pub const DEFAULT_SLOTS: usize = 3;

/// How a [`FrameRing`] is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingOptions {
    /// Frames in the ring at once (at least 1). Default [`DEFAULT_SLOTS`].
    pub slots: usize,
    /// Time each frame's GPU work with CUDA events, for [`FrameRing::gpu_busy_seconds`].
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
    /// The device memory the hybrid strategy places the slots' buffers within, shared evenly
    /// by the slots (see [`FrameRing::placement`]). Default `None`: what the device has free
    /// when the ring is made.
    pub device_budget: Option<u64>,
}

impl Default for RingOptions {
    fn default() -> RingOptions {
        RingOptions {
            slots: DEFAULT_SLOTS,
            timing: false,
            fence: FenceKind::Event,
            retry: RetryPolicy::default(),
            min_slots: 1,
            device_budget: None,
        }
    }
}

/// A ring of frame slots between a producer, the GPU (or the CPU) and a consumer, running each
/// frame through a [`Stage`].
///
/// The producer writes frame k+1 straight into its slot ([`FrameRing::next_input`]) while the
/// GPU works on frame k and the consumer reads frame k-1 ([`FrameRing::next_output`]). Each
/// slot owns its memory and its own queue (a CUDA stream), so the work of different frames
/// overlaps: with the copy strategies, one frame's upload, another's kernel and a third's
/// download run at once on the copy engines and the SMs; with the mapped strategies, the
/// kernels of consecutive frames overlap their reads and writes across the link.
///
/// The rules (the slot state machine in `ring/state.rs`, model-tested there):
/// - frames come out in the order they went in, each exactly once, failed ones included;
/// - a slot held by the GPU or the consumer is never handed to the producer: a full ring blocks
///   ([`FrameRing::next_input`]; for a while, [`FrameRing::next_input_within`]) or refuses with
///   [`Error::WouldBlock`] ([`FrameRing::try_next_input`]), so memory stays bounded at N slots;
/// - while the GPU works on a slot its buffers are lent to it (the hand-off's leases), so no
///   safe code can reach them until its fence completes;
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
pub struct FrameRing<S: Stage> {
    state: Mutex<RingState>,
    /// Notified on every change of `state`.
    changed: Condvar,
    /// One lock per slot; the state machine makes sure only one side ever wants it at a time,
    /// so these are never contended for long.
    slots: Vec<Mutex<Slot<S>>>,
    stage: S,
    strategy: Strategy,
    link_bytes_per_frame: u64,
    host_bytes: usize,
    device_bytes: usize,
    /// By the hybrid strategy, where each slot's buffers went and why.
    placement: Option<Placement>,
    /// What building the ring spent, by part.
    setup: SetupTime,
    /// When the GPU worked on the frames drained so far, when timed.
    busy: Mutex<BusyTime>,
    /// Tasks awaiting [`FrameRing::next_output_async`] on an empty ring, woken with `changed`.
    wakers: Mutex<Vec<Waker>>,
}

impl<S: Stage> std::fmt::Debug for FrameRing<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameRing")
            .field("strategy", &self.strategy)
            .field("slots", &self.slots.len())
            .field("inputs", &self.stage.inputs())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// How long a take waits for the other side (the consumer freeing a slot, the producer
/// submitting a frame).
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Not at all: [`Error::WouldBlock`].
    Never,
    /// Until the deadline (`None`: for ever); past it, no hold and `Ok(None)`.
    Until(Option<Instant>),
}

impl Wait {
    fn within(timeout: Option<Duration>) -> Wait {
        // A timeout past what the clock holds (centuries) is a wait for ever.
        Wait::Until(timeout.and_then(|timeout| Instant::now().checked_add(timeout)))
    }
}

/// Waits on `changed` with `state` until `deadline` (`None`: for ever); `None` back once the
/// deadline has passed (the lock let go), else the state to look at again.
fn wait_for_change<'a>(
    changed: &Condvar,
    state: MutexGuard<'a, RingState>,
    deadline: Option<Instant>,
) -> Option<MutexGuard<'a, RingState>> {
    let Some(deadline) = deadline else {
        return Some(changed.wait(state).unwrap_or_else(|poison| poison.into_inner()));
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return None;
    }
    // A spurious or early wake-up only makes the caller look again, with less time left.
    Some(changed.wait_timeout(state, left).unwrap_or_else(|poison| poison.into_inner()).0)
}

fn check_slots(slots: usize) -> Result<()> {
    if slots == 0 {
        return Err(Error::invalid("ring slots", "0: a ring needs at least one slot"));
    }
    Ok(())
}

/// Gives every timed slot one reference event, recorded before any frame, so the frames'
/// intervals on the GPU can be merged (events of one context compare across streams).
fn time_against_one_origin<S: Stage>(slots: &[Mutex<Slot<S>>]) -> Result<()> {
    let first = lock(&slots[0]);
    let Some(queue) = first.queue() else { return Ok(()) };
    let Some(origin) = queue.timing_event()? else { return Ok(()) };
    queue.record(&origin)?;
    origin.synchronize()?;
    let origin = Arc::new(origin);
    drop(first);
    for slot in slots {
        if !lock(slot).time_against(&origin) {
            break;
        }
    }
    Ok(())
}

/// Bytes that cross the host-GPU link per frame by `strategy`: copies move every input in and
/// every output out; mapped strategies move what the kernel reads and writes.
pub(crate) fn link_bytes<S: Stage>(stage: &S, prepared: &S::Prepared, strategy: Strategy) -> u64 {
    let total = |layouts: &[FrameLayout]| layouts.iter().map(|layout| layout.bytes() as u64).sum::<u64>();
    match strategy.traits().map(|traits| traits.frames) {
        None | Some(FrameMemory::Host) => 0,
        Some(FrameMemory::PageableCopied | FrameMemory::PinnedCopied | FrameMemory::Managed) => {
            total(stage.inputs()) + total(stage.outputs())
        }
        Some(FrameMemory::Mapped) => stage.mapped_bytes_read(prepared, strategy) + total(stage.outputs()),
    }
}

impl<S: Stage> FrameRing<S> {
    /// A ring of `options.slots` slots running `stage` on `device` by `strategy` (`Auto`
    /// resolved: the CPU for a stage with no GPU path), with all its memory allocated now.
    ///
    /// Each slot's memory is allocated with `options.retry` for shortages; a ring that still
    /// runs short settles for fewer slots, down to `options.min_slots` (see [`RingOptions`]).
    ///
    /// # Errors
    /// No slots, a strategy the device or the stage cannot run, or an allocation failing (for
    /// the first `options.min_slots` slots).
    pub fn with_stage(
        device: &Device,
        strategy: Strategy,
        stage: S,
        options: RingOptions,
    ) -> Result<FrameRing<S>> {
        FrameRing::build(device, strategy, stage, options, &[])
    }

    /// A ring by the hybrid strategy whose placement the caller steers, as
    /// [`crate::FrameFilter::with_placement`] does for a filter: `overrides` put named buffers
    /// (the stage's constants either way, the frames only mapped) where the caller says, within
    /// `options.device_budget`.
    ///
    /// # Errors
    /// As for [`FrameRing::with_stage`]; an override naming no buffer, putting a frame in device
    /// memory, or forcing more into device memory than a slot's share of the budget.
    pub fn with_placement(
        device: &Device,
        stage: S,
        options: RingOptions,
        overrides: &[(&str, Where)],
    ) -> Result<FrameRing<S>> {
        FrameRing::build(device, Strategy::Hybrid, stage, options, overrides)
    }

    fn build(
        device: &Device,
        strategy: Strategy,
        stage: S,
        options: RingOptions,
        overrides: &[(&str, Where)],
    ) -> Result<FrameRing<S>> {
        check_slots(options.slots)?;
        let strategy = slot::resolve(device, strategy, &stage)?;
        let mut setup = SetupTime::default();
        let placement = timed(&mut setup.placement, || {
            hybrid::placement_for(strategy, device, &stage, options.device_budget, options.slots, overrides)
        })?;
        let slot_options =
            SlotOptions { fence: options.fence, timing: options.timing, holder: FrameMemoryHolder::RingSlot };
        let mut slots: Vec<Mutex<Slot<S>>> = Vec::new();
        // A slot count from a caller must not abort the process where the list cannot be had.
        slots.try_reserve_exact(options.slots).map_err(|_| {
            Error::invalid(
                "ring slots",
                format!("{}: more slots than memory holds; ask for a few", options.slots),
            )
        })?;
        for _ in 0..options.slots {
            let made = options.retry.run("allocating a frame ring slot", || {
                Slot::new(device, strategy, &stage, slot_options, placement.as_ref())
            });
            match made {
                Ok(slot) => slots.push(Mutex::new(slot)),
                Err(error)
                    if error.is_transient() && !slots.is_empty() && slots.len() >= options.min_slots =>
                {
                    tracing::warn!(
                        "memory ran short for slot {} of the ring ({error}): running with {} of the {} slots \
                         asked for (same results, fewer frames in flight)",
                        slots.len() + 1,
                        slots.len(),
                        options.slots
                    );
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        if options.timing {
            time_against_one_origin(&slots)?;
        }
        for slot in &slots {
            setup += lock(slot).setup_time();
        }
        let (host_bytes, device_bytes) = slots.iter().fold((0, 0), |(host, device), slot| {
            let (h, d) = lock(slot).footprint();
            (host + h, device + d)
        });
        let link_bytes_per_frame = {
            let first = lock(&slots[0]);
            link_bytes(&stage, first.prepared(), strategy)
        };
        Ok(FrameRing {
            state: Mutex::new(RingState::new(slots.len())),
            changed: Condvar::new(),
            slots,
            stage,
            strategy,
            link_bytes_per_frame,
            host_bytes,
            device_bytes,
            placement,
            setup,
            busy: Mutex::new(BusyTime::default()),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// The stage.
    pub fn stage(&self) -> &S {
        &self.stage
    }

    /// The strategy (never `Auto`).
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// What building the ring spent, by part: placement, queues, the kernel's first load and
    /// each slot's frame memory (pinning, mapping or device allocation). A program that reports
    /// frames per second over its frames alone names this as setup.
    pub fn setup_time(&self) -> SetupTime {
        self.setup
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of the first input buffer of a frame (the frame, for one-buffer stages).
    pub fn frame_bytes(&self) -> usize {
        self.stage.inputs()[0].bytes()
    }

    /// Bytes that cross the host-GPU link per frame, as for [`crate::FrameFilter`]: copies
    /// move the frame in and out; mapped strategies move what the kernel reads (with re-read
    /// halos, and constant data when it is in host memory) and writes.
    pub fn link_bytes_per_frame(&self) -> u64 {
        self.link_bytes_per_frame
    }

    /// Host memory the ring's frame buffers take, in bytes.
    pub fn host_bytes(&self) -> usize {
        self.host_bytes
    }

    /// By the hybrid strategy, where each slot's buffers went and why (every slot places
    /// alike, each within its share of [`RingOptions::device_budget`]); `None` by the other
    /// strategies, which place by definition.
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// Device memory the ring's frame buffers take, in bytes.
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

    /// Seconds during which the GPU was working on at least one of the frames drained so far,
    /// from CUDA events around each frame's work ([`RingOptions::timing`]; 0 without it, or on
    /// the CPU). Frames of different slots overlap on the GPU; overlapping time counts once, so
    /// this never exceeds the wall time since the ring was made.
    pub fn gpu_busy_seconds(&self) -> f64 {
        lock(&self.busy).seconds()
    }

    /// Overwrites every slot's output buffers with `value`: tests poison outputs so that an
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
            let mut slot = lock(slot);
            for index in 0..self.stage.outputs().len() {
                slot.output_mut(index)?.fill(value);
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
    pub fn next_input(&self) -> Result<InputSlot<'_, S>> {
        Ok(self.next_input_within(None)?.expect("no deadline: waits until a slot is free"))
    }

    /// [`FrameRing::next_input`], waiting at most `timeout` (`None` for ever) for the consumer
    /// to free the next frame's slot: `Ok(None)` when none came free in time, with nothing
    /// taken (the ring is as it was; call again). For callers that must wake up now and then,
    /// as a binding checking for Ctrl-C. [`FrameRing::close`] ends the wait at once.
    ///
    /// # Errors
    /// As for [`FrameRing::next_input`].
    pub fn next_input_within(&self, timeout: Option<Duration>) -> Result<Option<InputSlot<'_, S>>> {
        self.input(Wait::within(timeout))
    }

    /// The next frame's input slot, or [`Error::WouldBlock`] at once when the ring is full.
    ///
    /// # Errors
    /// As for [`FrameRing::next_input`], and [`Error::WouldBlock`].
    pub fn try_next_input(&self) -> Result<InputSlot<'_, S>> {
        Ok(self.input(Wait::Never)?.expect("a take that does not wait refuses rather than times out"))
    }

    fn input(&self, wait: Wait) -> Result<Option<InputSlot<'_, S>>> {
        let mut state = lock(&self.state);
        let (slot, index) = loop {
            match (state.begin_input(), wait) {
                (Ok(taken), _) => break taken,
                (Err(Stall::Full), Wait::Until(deadline)) => {
                    match wait_for_change(&self.changed, state, deadline) {
                        Some(again) => state = again,
                        None => return Ok(None),
                    }
                }
                (Err(Stall::Full), Wait::Never) => {
                    return Err(Error::WouldBlock("a frame ring's next input (the ring is full)"));
                }
                (Err(Stall::Closed), _) => return Err(Error::RingClosed),
                (Err(_), _) => {
                    return Err(Error::StillHeld {
                        what: "the frame ring's input slot",
                        remedy: "submit it before asking for the next".into(),
                    });
                }
            }
        };
        drop(state);
        let guard = lock(&self.slots[slot]);
        if let Some(error) = guard.lost() {
            drop(guard);
            lock(&self.state).cancel_input(slot);
            self.notify();
            return Err(error);
        }
        Ok(Some(InputSlot::new(self, guard, slot, index)))
    }

    /// Takes no more frames: [`FrameRing::next_input`] (also one waiting now) returns
    /// [`Error::RingClosed`], and so does [`FrameRing::next_output`] once every frame submitted
    /// before has come out. How a producer says the stream has ended, or a consumer that gives
    /// up says so to a producer waiting on a full ring.
    pub fn close(&self) {
        lock(&self.state).close();
        self.notify();
    }

    /// The oldest frame, once through the stage, waiting for it to be submitted and for its
    /// work to finish. Dropping the returned [`OutputFrame`] frees its slot for the producer.
    ///
    /// # Errors
    /// [`Error::FrameFailed`] for a frame whose work failed (its slot is freed, and the next
    /// call returns the next frame); [`Error::RingClosed`] after the last frame of a closed
    /// ring; an output frame is already held.
    pub fn next_output(&self) -> Result<OutputFrame<'_, S>> {
        Ok(self.next_output_within(None)?.expect("no deadline: waits until a frame is done"))
    }

    /// [`FrameRing::next_output`], waiting at most `timeout` (`None` for ever) for the
    /// producer to submit the oldest frame: `Ok(None)` when none was submitted in time, with
    /// nothing taken (call again). For callers that must wake up now and then, as a binding
    /// checking for Ctrl-C. A frame already submitted is waited for until its GPU work ends,
    /// past the timeout: that work ends on its own (on the CPU it is done at the submit).
    ///
    /// # Errors
    /// As for [`FrameRing::next_output`].
    pub fn next_output_within(&self, timeout: Option<Duration>) -> Result<Option<OutputFrame<'_, S>>> {
        self.output(Wait::within(timeout))
    }

    /// The oldest frame if it is done, or [`Error::WouldBlock`] at once when it has not been
    /// submitted yet or its work is still running.
    ///
    /// # Errors
    /// As for [`FrameRing::next_output`], and [`Error::WouldBlock`].
    pub fn try_next_output(&self) -> Result<OutputFrame<'_, S>> {
        Ok(self.output(Wait::Never)?.expect("a take that does not wait refuses rather than times out"))
    }

    fn output(&self, wait: Wait) -> Result<Option<OutputFrame<'_, S>>> {
        let block = matches!(wait, Wait::Until(_));
        let mut state = lock(&self.state);
        let (slot, index) = loop {
            match (state.begin_output(), wait) {
                (Ok(taken), _) => break taken,
                (Err(Stall::Pending), _) => {
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
                (Err(Stall::Empty), Wait::Until(deadline)) => {
                    match wait_for_change(&self.changed, state, deadline) {
                        Some(again) => state = again,
                        None => return Ok(None),
                    }
                }
                (Err(Stall::Empty), Wait::Never) => {
                    return Err(Error::WouldBlock("a frame ring's next output (no frame was submitted)"));
                }
                (Err(Stall::Closed), _) => return Err(Error::RingClosed),
                (Err(_), _) => {
                    return Err(Error::StillHeld {
                        what: "the frame ring's output frame",
                        remedy: "drop it before asking for the next".into(),
                    });
                }
            }
        };
        drop(state);
        let mut guard = lock(&self.slots[slot]);
        if let Some(source) = guard.take_failure() {
            drop(guard);
            lock(&self.state).finish_output(slot);
            self.notify();
            return Err(Error::FrameFailed { index, source: Box::new(source) });
        }
        Ok(Some(OutputFrame::new(self, guard, slot, index)))
    }

    /// The oldest frame, as a future: like [`FrameRing::next_output`], but a task waiting for
    /// its GPU work awaits a fence through the hand-off's poller thread, and a task waiting for
    /// the producer is woken by [`InputSlot::submit`] or [`FrameRing::close`]; no thread blocks.
    pub fn next_output_async(&self) -> NextOutput<'_, S> {
        NextOutput::new(self)
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
        lock(&self.slots[slot]).fence()
    }

    /// Finishes the GPU work of the in-flight `slot`: gives its buffers back, or records its
    /// failure. Returns false when `block` is false and the work is still running.
    fn finish_work(&self, slot: usize, index: u64, block: bool) -> bool {
        let mut guard = lock(&self.slots[slot]);
        let finished = guard.finish(index, block);
        if let Some((start, end)) = guard.take_busy_ms() {
            lock(&self.busy).add(start, end);
        }
        finished
    }
}

impl FrameRing<CpuStage> {
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
    ) -> Result<FrameRing<CpuStage>> {
        let layout = FrameLayout::samples(frame_bytes, crate::stage::ScalarType::U8).map_err(|_| {
            Error::invalid("frame size", format!("{frame_bytes} bytes: frames hold at least one byte"))
        })?;
        let stage = CpuStage::map(layout.clone(), layout, stage)?;
        FrameRing::with_stage(&Device::cpu(), Strategy::Cpu, stage, options)
    }
}
