//! [`FanOutRing`]: one stream of frames dealt over several [`FrameRing`]s, one per device.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use super::Strategy;
use super::ring::{FrameRing, InputSlot, OutputFrame, RingOptions};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::stage::Stage;

/// A stream of frames fanned out over N rings (one per GPU): frame k goes to ring k mod N,
/// and the outputs come out in the stream's order.
///
/// Each ring keeps its own rules ([`FrameRing`]): its slots, its queues, its hand-off. The
/// fan-out adds two counters, each behind a lock held for as long as a slot or an output is
/// held, so that:
/// - frame k is submitted to ring k mod N only after frames 0..k were submitted, and comes
///   out only after frames 0..k came out: within one ring frames keep their order, and the
///   rings take turns, so the stream's order is kept;
/// - back-pressure is each ring's own: when ring k mod N is full, [`FanOutRing::next_input`]
///   waits (or [`FanOutRing::try_next_input`] says [`Error::WouldBlock`]) even if another
///   ring has room, since frame k may go nowhere else; memory stays bounded at the rings'
///   slots.
///
/// A frame whose work fails comes out as [`Error::FrameFailed`] with its index in the whole
/// stream. With one ring it behaves as that ring.
///
/// # Examples
/// ```
/// use hetmem::backend::{BackendChoice, DeviceSelection};
/// use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout};
/// use hetmem::pipeline::{FanOutRing, RingOptions};
/// use hetmem::{Device, Strategy};
///
/// let devices = Device::open_selection(BackendChoice::from_env()?, &DeviceSelection::All)?; // every GPU, or the CPU
/// let format = FrameFormat::new(64, 48, PixelLayout::Rgb)?;
/// let kernel = Gaussian::new(None, None, Border::default())?;
/// let stage = GaussianStage::new(format, &kernel)?;
/// let ring = FanOutRing::with_stage(&devices, Strategy::Auto, &stage, RingOptions::default())?;
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
///         assert_eq!(output.index(), u64::from(frame));
///         assert!(output.iter().all(|&byte| byte == frame)); // a flat frame stays flat
///     }
///     Ok::<(), hetmem::Error>(())
/// })?;
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct FanOutRing<S: Stage> {
    rings: Vec<FrameRing<S>>,
    /// The index of the next frame to submit.
    next_in: Mutex<u64>,
    /// The index of the next frame to come out.
    next_out: Mutex<u64>,
}

impl<S: Stage + Clone> FanOutRing<S> {
    /// One [`FrameRing`] per device, each with `options` (so `options.slots` per device), all
    /// running `stage` by `strategy` (`Auto` resolved per device).
    ///
    /// # Errors
    /// No devices, or a ring that cannot be made (see [`FrameRing::with_stage`]).
    pub fn with_stage(
        devices: &[Device],
        strategy: Strategy,
        stage: &S,
        options: RingOptions,
    ) -> Result<FanOutRing<S>> {
        let rings = devices
            .iter()
            .map(|device| FrameRing::with_stage(device, strategy, stage.clone(), options))
            .collect::<Result<_>>()?;
        FanOutRing::from_rings(rings)
    }
}

impl<S: Stage> FanOutRing<S> {
    /// Fans out over rings made elsewhere (for example CPU-stage rings).
    ///
    /// # Errors
    /// No rings, or rings of different frame sizes.
    pub fn from_rings(rings: Vec<FrameRing<S>>) -> Result<FanOutRing<S>> {
        let Some(first) = rings.first() else {
            return Err(Error::invalid("fan-out ring", "no rings: give at least one device"));
        };
        if let Some(other) = rings.iter().find(|ring| ring.frame_bytes() != first.frame_bytes()) {
            return Err(Error::invalid(
                "fan-out ring",
                format!(
                    "frames of {} and {} bytes: every ring takes one format",
                    first.frame_bytes(),
                    other.frame_bytes()
                ),
            ));
        }
        Ok(FanOutRing { rings, next_in: Mutex::new(0), next_out: Mutex::new(0) })
    }

    /// The rings, in the order frames are dealt to them (ring i takes frames i, i+N, ...).
    pub fn rings(&self) -> &[FrameRing<S>] {
        &self.rings
    }

    /// Bytes per frame.
    pub fn frame_bytes(&self) -> usize {
        self.rings[0].frame_bytes()
    }

    /// Slots in all rings together: the most frames in flight.
    pub fn slots(&self) -> usize {
        self.rings.iter().map(FrameRing::<S>::slots).sum()
    }

    /// Frames submitted so far.
    pub fn submitted(&self) -> u64 {
        self.rings.iter().map(FrameRing::<S>::submitted).sum()
    }

    /// Frames the consumer has finished with so far.
    pub fn drained(&self) -> u64 {
        self.rings.iter().map(FrameRing::<S>::drained).sum()
    }

    /// Overwrites every ring's output memory with `value` (see [`FrameRing::fill_outputs`]).
    ///
    /// # Errors
    /// As for [`FrameRing::fill_outputs`].
    pub fn fill_outputs(&self, value: u8) -> Result<()> {
        self.rings.iter().try_for_each(|ring| ring.fill_outputs(value))
    }

    /// Closes every ring (see [`FrameRing::close`]).
    pub fn close(&self) {
        self.rings.iter().for_each(FrameRing::<S>::close);
    }

    /// The next frame's input slot, on ring (index mod N), waiting while that ring is full.
    ///
    /// # Errors
    /// As for [`FrameRing::next_input`].
    pub fn next_input(&self) -> Result<FanInput<'_, S>> {
        self.input(true)
    }

    /// The next frame's input slot, or [`Error::WouldBlock`] at once when its ring is full.
    ///
    /// # Errors
    /// As for [`FrameRing::try_next_input`].
    pub fn try_next_input(&self) -> Result<FanInput<'_, S>> {
        self.input(false)
    }

    fn input(&self, block: bool) -> Result<FanInput<'_, S>> {
        let next = lock(&self.next_in);
        let ring = self.ring_of(*next);
        let slot = if block { self.rings[ring].next_input()? } else { self.rings[ring].try_next_input()? };
        Ok(FanInput { slot, next, ring })
    }

    /// The oldest frame, once filtered (waiting for it); dropping it frees its slot.
    ///
    /// # Errors
    /// As for [`FrameRing::next_output`]; a failed frame's [`Error::FrameFailed`] names its
    /// index in the whole stream.
    pub fn next_output(&self) -> Result<FanOutput<'_, S>> {
        self.output(true)
    }

    /// The oldest frame if it is filtered, or [`Error::WouldBlock`] at once.
    ///
    /// # Errors
    /// As for [`FanOutRing::next_output`], and [`Error::WouldBlock`].
    pub fn try_next_output(&self) -> Result<FanOutput<'_, S>> {
        self.output(false)
    }

    fn output(&self, block: bool) -> Result<FanOutput<'_, S>> {
        let mut next = lock(&self.next_out);
        let ring = self.ring_of(*next);
        let taken = if block { self.rings[ring].next_output() } else { self.rings[ring].try_next_output() };
        match taken {
            Ok(frame) => Ok(FanOutput { frame, next, ring }),
            Err(Error::FrameFailed { source, .. }) => {
                let index = *next;
                *next += 1;
                Err(Error::FrameFailed { index, source })
            }
            Err(error) => Err(error),
        }
    }

    fn ring_of(&self, index: u64) -> usize {
        (index % self.rings.len() as u64) as usize
    }
}

/// The producer's hold on the next frame's slot (see [`InputSlot`]); it also holds the
/// fan-out's input turn, so one frame is being written at a time.
pub struct FanInput<'fan, S: Stage> {
    slot: InputSlot<'fan, S>,
    next: MutexGuard<'fan, u64>,
    ring: usize,
}

impl<S: Stage> std::fmt::Debug for FanInput<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanInput").field("index", &*self.next).field("ring", &self.ring).finish()
    }
}

impl<S: Stage> FanInput<'_, S> {
    /// The index this frame will have in the whole stream.
    pub fn index(&self) -> u64 {
        *self.next
    }

    /// Which ring (device) takes the frame.
    pub fn ring(&self) -> usize {
        self.ring
    }

    /// Input buffer `buffer` of the frame (see [`InputSlot::input_mut`]).
    ///
    /// # Errors
    /// No such buffer.
    pub fn input_mut(&mut self, buffer: usize) -> Result<&mut [u8]> {
        self.slot.input_mut(buffer)
    }

    /// Hands the frame to its ring's GPU and returns its index in the whole stream.
    pub fn submit(mut self) -> u64 {
        let index = *self.next;
        self.slot.submit();
        *self.next += 1;
        index
    }
}

impl<S: Stage> Deref for FanInput<'_, S> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.slot
    }
}

impl<S: Stage> DerefMut for FanInput<'_, S> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.slot
    }
}

/// The consumer's hold on the oldest filtered frame (see [`OutputFrame`]); dropping it frees
/// its slot and lets the next frame out.
pub struct FanOutput<'fan, S: Stage> {
    frame: OutputFrame<'fan, S>,
    next: MutexGuard<'fan, u64>,
    ring: usize,
}

impl<S: Stage> std::fmt::Debug for FanOutput<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOutput").field("index", &*self.next).field("ring", &self.ring).finish()
    }
}

impl<S: Stage> FanOutput<'_, S> {
    /// The frame's index in the whole stream.
    pub fn index(&self) -> u64 {
        *self.next
    }

    /// Which ring (device) filtered it.
    pub fn ring(&self) -> usize {
        self.ring
    }

    /// Output buffer `buffer` of the frame (see [`OutputFrame::output`]).
    ///
    /// # Errors
    /// No such buffer.
    pub fn output(&self, buffer: usize) -> Result<&[u8]> {
        self.frame.output(buffer)
    }
}

impl<S: Stage> Deref for FanOutput<'_, S> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.frame
    }
}

impl<S: Stage> Drop for FanOutput<'_, S> {
    fn drop(&mut self) {
        // The turn passes on while the guard is still held; the slot is freed just after.
        *self.next += 1;
    }
}

fn lock(counter: &Mutex<u64>) -> MutexGuard<'_, u64> {
    counter.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::stage::CpuStage;

    const FRAME: usize = 16;

    /// Frame `index`'s input: different for every frame and byte, never all zeros.
    fn input_of(index: u64) -> Vec<u8> {
        (0..FRAME as u64).map(|byte| (index * 31 + byte * 7 + 1) as u8).collect()
    }

    /// `rings` CPU rings of `slots` slots; ring r writes r into byte 0 and the input's other
    /// bytes flipped, and fails frames whose byte 1 is `fail_on`.
    fn cpu_fan_out(rings: usize, slots: usize, fail_on: Option<u8>) -> FanOutRing<CpuStage> {
        let options = RingOptions { slots, ..RingOptions::default() };
        let rings = (0..rings)
            .map(|ring| {
                FrameRing::with_cpu_stage(FRAME, options, move |input: &[u8], output: &mut [u8]| {
                    if fail_on == Some(input[1]) {
                        return Err(Error::invalid("test frame", "fails on purpose"));
                    }
                    output[0] = ring as u8;
                    output[1..].iter_mut().zip(&input[1..]).for_each(|(out, byte)| *out = byte ^ 0x5A);
                    Ok(())
                })
                .unwrap()
            })
            .collect();
        FanOutRing::from_rings(rings).unwrap()
    }

    fn check_output(output: &FanOutput<'_, CpuStage>, index: u64, rings: usize) {
        assert_eq!(output.index(), index);
        assert_eq!(output.ring(), index as usize % rings);
        assert_eq!(output[0], (index as usize % rings) as u8, "frame {index} went to ring k mod N");
        let want: Vec<u8> = input_of(index)[1..].iter().map(|byte| byte ^ 0x5A).collect();
        assert_eq!(&output[1..], &want[..], "frame {index}");
    }

    proptest! {
        /// Any interleaving of a producer and a consumer on one thread: frames come out in
        /// order, each once, from ring k mod N, and a ring takes no more than its slots.
        #[test]
        fn frames_come_out_in_order_from_ring_k_mod_n(
            rings in 1usize..4,
            slots in 1usize..4,
            steps in proptest::collection::vec(any::<bool>(), 1..120),
        ) {
            let fan = cpu_fan_out(rings, slots, None);
            fan.fill_outputs(0xA5).unwrap();
            let (mut submitted, mut drained) = (0u64, 0u64);
            for produce in steps {
                if produce {
                    let in_ring = (drained..submitted).filter(|k| k % rings as u64 == submitted % rings as u64);
                    let room = in_ring.count() < slots;
                    match fan.try_next_input() {
                        Ok(mut slot) => {
                            prop_assert!(room, "ring {} took more than {slots} frames", slot.ring());
                            prop_assert_eq!(slot.index(), submitted);
                            slot.copy_from_slice(&input_of(submitted));
                            prop_assert_eq!(slot.submit(), submitted);
                            submitted += 1;
                        }
                        Err(Error::WouldBlock(_)) => prop_assert!(!room, "frame {submitted} refused with room"),
                        Err(error) => panic!("{error}"),
                    }
                } else {
                    match fan.try_next_output() {
                        Ok(output) => {
                            prop_assert!(drained < submitted);
                            check_output(&output, drained, rings);
                            drained += 1;
                        }
                        Err(Error::WouldBlock(_)) => prop_assert_eq!(drained, submitted),
                        Err(error) => panic!("{error}"),
                    }
                }
            }
            prop_assert_eq!((fan.submitted(), fan.drained()), (submitted, drained));
        }
    }

    #[test]
    fn a_producer_and_a_consumer_thread_keep_the_order() {
        let fan = cpu_fan_out(3, 2, None);
        let frames = 200;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for index in 0..frames {
                    let mut slot = fan.next_input().unwrap();
                    slot.copy_from_slice(&input_of(index));
                    slot.submit();
                }
                fan.close();
            });
            // A failing check closes the ring, so the producer stops instead of waiting forever.
            let _close_on_panic = CloseOnDrop(&fan);
            for index in 0..frames {
                check_output(&fan.next_output().unwrap(), index, 3);
            }
            assert!(matches!(fan.next_output(), Err(Error::RingClosed)));
        });
        assert_eq!((fan.submitted(), fan.drained()), (frames, frames));
    }

    struct CloseOnDrop<'a>(&'a FanOutRing<CpuStage>);

    impl Drop for CloseOnDrop<'_> {
        fn drop(&mut self) {
            self.0.close();
        }
    }

    #[test]
    fn a_failed_frame_is_named_by_its_index_in_the_stream() {
        // Frame 4 (ring 0's third frame of two rings) fails; the frames around it pass.
        let failing = input_of(4)[1];
        assert!((0..8).filter(|&index| input_of(index)[1] == failing).eq([4]));
        let fan = cpu_fan_out(2, 4, Some(failing));
        for index in 0..8 {
            let mut slot = fan.next_input().unwrap();
            slot.copy_from_slice(&input_of(index));
            slot.submit();
        }
        for index in 0..8 {
            match fan.next_output() {
                Ok(output) => check_output(&output, index, 2),
                Err(Error::FrameFailed { index: failed, .. }) => assert_eq!((index, failed), (4, 4)),
                Err(error) => panic!("frame {index}: {error}"),
            }
        }
        assert_eq!(fan.drained(), 8);
    }

    #[test]
    fn an_unsubmitted_slot_gives_its_turn_back() {
        let fan = cpu_fan_out(2, 1, None);
        let slot = fan.next_input().unwrap();
        assert_eq!((slot.index(), slot.ring()), (0, 0));
        drop(slot);
        let mut slot = fan.next_input().unwrap();
        assert_eq!(slot.index(), 0);
        slot.copy_from_slice(&input_of(0));
        slot.submit();
        assert_eq!(fan.next_input().unwrap().ring(), 1);
    }

    #[test]
    fn rings_must_exist_and_agree_on_the_frame_size() {
        assert!(FanOutRing::<CpuStage>::from_rings(Vec::new()).unwrap_err().to_string().contains("no rings"));
        let stage = |_: &[u8], _: &mut [u8]| Ok(());
        let small = FrameRing::with_cpu_stage(8, RingOptions::default(), stage).unwrap();
        let large = FrameRing::with_cpu_stage(9, RingOptions::default(), stage).unwrap();
        let error = FanOutRing::from_rings(vec![small, large]).unwrap_err().to_string();
        assert!(error.contains("frames of 8 and 9 bytes"), "{error}");
    }
}
