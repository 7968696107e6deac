//! [`RingState`]: the frame ring's slot state machine, with no memory and no backend, so that
//! the rules that keep frames in order, never lost, never duplicated and never overwritten
//! can be model-tested on their own.
//!
//! Frame `k` always uses slot `k % N`. A slot goes round
//! `Free -> Filling -> InFlight -> Done -> Draining -> Free`:
//! - the producer takes the slot of the next frame only when it is `Free` (`begin_input`),
//!   writes it, and hands it to the GPU (`submit`) or gives it back unused (`cancel_input`);
//! - the GPU work finishes (`complete`), in any order across slots;
//! - the consumer takes the oldest frame only once it is `Done` (`begin_output`), reads it
//!   and frees the slot (`finish_output`).
//!
//! A slot held by the GPU (`InFlight`) or by the consumer (`Done`, `Draining`) is therefore
//! never handed to the producer, and at most N frames exist at once.

/// Where one slot is in its round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Nobody holds it: the producer may take it for the next frame.
    Free,
    /// The producer is writing frame `index` into it.
    Filling { index: u64 },
    /// GPU work on frame `index` is queued or running.
    InFlight { index: u64 },
    /// Frame `index` is finished (or failed) and waits for the consumer.
    Done { index: u64 },
    /// The consumer is reading frame `index`.
    Draining { index: u64 },
}

/// Why a step cannot be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The next frame's slot is still held by the GPU or the consumer: the ring is full.
    Full,
    /// The oldest frame has not been submitted yet: the ring is empty.
    Empty,
    /// The oldest frame is submitted but its GPU work has not finished.
    Pending,
    /// The producer already holds an input slot (one at a time).
    InputHeld,
    /// The consumer already holds an output frame (one at a time).
    OutputHeld,
    /// The ring is closed: no more input, and every submitted frame has been drained.
    Closed,
}

/// The slots' states and the two frame counters.
#[derive(Debug, Clone)]
pub(crate) struct RingState {
    slots: Vec<SlotState>,
    /// Frames submitted so far: the index of the next frame the producer writes.
    submitted: u64,
    /// Frames the consumer has finished with: the index of the next frame it reads.
    drained: u64,
    /// No more frames will be submitted.
    closed: bool,
}

impl RingState {
    /// A ring of `slots` free slots (at least one).
    pub(crate) fn new(slots: usize) -> RingState {
        assert!(slots > 0, "a ring needs a slot");
        RingState { slots: vec![SlotState::Free; slots], submitted: 0, drained: 0, closed: false }
    }

    /// The number of slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The state of slot `slot`.
    pub(crate) fn slot(&self, slot: usize) -> SlotState {
        self.slots[slot]
    }

    /// Frames submitted so far.
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted
    }

    /// Frames drained so far.
    pub(crate) fn drained(&self) -> u64 {
        self.drained
    }

    /// Takes no more input: the producer is refused from now on, and the consumer, once it
    /// has drained every submitted frame, learns that the stream has ended.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    fn slot_of(&self, index: u64) -> usize {
        (index % self.slots.len() as u64) as usize
    }

    /// Takes the next frame's slot for the producer: `(slot, frame index)`.
    pub(crate) fn begin_input(&mut self) -> Result<(usize, u64), Stall> {
        if self.closed {
            return Err(Stall::Closed);
        }
        let index = self.submitted;
        let slot = self.slot_of(index);
        match self.slots[slot] {
            SlotState::Free => {
                self.slots[slot] = SlotState::Filling { index };
                Ok((slot, index))
            }
            SlotState::Filling { .. } => Err(Stall::InputHeld),
            _ => Err(Stall::Full),
        }
    }

    /// Gives an input slot back unsubmitted (the producer had no frame for it after all).
    pub(crate) fn cancel_input(&mut self, slot: usize) {
        assert!(matches!(self.slots[slot], SlotState::Filling { .. }), "cancelling a slot not being filled");
        self.slots[slot] = SlotState::Free;
    }

    /// Hands the filled slot to the GPU; returns its frame index.
    pub(crate) fn submit(&mut self, slot: usize) -> u64 {
        let SlotState::Filling { index } = self.slots[slot] else {
            panic!("submitting slot {slot} in state {:?}", self.slots[slot]);
        };
        self.slots[slot] = SlotState::InFlight { index };
        self.submitted += 1;
        index
    }

    /// The slot and index of the oldest frame if it is in flight: the one the consumer waits
    /// on next.
    pub(crate) fn oldest_in_flight(&self) -> Result<(usize, u64), Stall> {
        let index = self.drained;
        let slot = self.slot_of(index);
        match self.slots[slot] {
            SlotState::InFlight { index: at } if at == index => Ok((slot, index)),
            SlotState::Done { index: at } if at == index => Err(Stall::Pending),
            SlotState::Draining { .. } => Err(Stall::OutputHeld),
            _ => Err(Stall::Empty),
        }
    }

    /// Records that the GPU work on the frame in `slot` has finished.
    pub(crate) fn complete(&mut self, slot: usize) {
        let SlotState::InFlight { index } = self.slots[slot] else {
            panic!("completing slot {slot} in state {:?}", self.slots[slot]);
        };
        self.slots[slot] = SlotState::Done { index };
    }

    /// Takes the oldest frame for the consumer once it is done: `(slot, frame index)`.
    pub(crate) fn begin_output(&mut self) -> Result<(usize, u64), Stall> {
        let index = self.drained;
        let slot = self.slot_of(index);
        match self.slots[slot] {
            SlotState::Done { index: at } if at == index => {
                self.slots[slot] = SlotState::Draining { index };
                Ok((slot, index))
            }
            SlotState::InFlight { index: at } if at == index => Err(Stall::Pending),
            SlotState::Draining { .. } => Err(Stall::OutputHeld),
            _ if self.closed && self.submitted == self.drained => Err(Stall::Closed),
            _ => Err(Stall::Empty),
        }
    }

    /// Frees the slot the consumer has finished reading.
    pub(crate) fn finish_output(&mut self, slot: usize) {
        assert!(
            matches!(self.slots[slot], SlotState::Draining { index } if index == self.drained),
            "finishing slot {slot} in state {:?}",
            self.slots[slot]
        );
        self.slots[slot] = SlotState::Free;
        self.drained += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One step of the producer, the GPU or the consumer.
    #[derive(Debug, Clone)]
    enum Op {
        BeginInput,
        /// Write the frame's id into the held input slot and submit it.
        Submit,
        CancelInput,
        /// The GPU finishes the frame in flight in the `n % in_flight`-th busy slot: any order.
        Complete(usize),
        BeginOutput,
        FinishOutput,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::BeginInput),
            3 => Just(Op::Submit),
            1 => Just(Op::CancelInput),
            3 => any::<usize>().prop_map(Op::Complete),
            3 => Just(Op::BeginOutput),
            3 => Just(Op::FinishOutput),
        ]
    }

    /// The model: what each slot's memory holds, and what the consumer has seen.
    struct Model {
        state: RingState,
        /// The frame id last written into each slot's memory (the GPU keeps it there).
        memory: Vec<Option<u64>>,
        input: Option<(usize, u64)>,
        output: Option<(usize, u64)>,
        seen: Vec<u64>,
    }

    impl Model {
        fn new(slots: usize) -> Model {
            Model {
                state: RingState::new(slots),
                memory: vec![None; slots],
                input: None,
                output: None,
                seen: vec![],
            }
        }

        fn held_by_others(&self, slot: usize) -> bool {
            matches!(
                self.state.slot(slot),
                SlotState::InFlight { .. } | SlotState::Done { .. } | SlotState::Draining { .. }
            )
        }

        fn step(&mut self, op: Op) {
            let n = self.state.len();
            let in_ring = self.state.submitted() - self.state.drained();
            match op {
                Op::BeginInput => match self.state.begin_input() {
                    Ok((slot, index)) => {
                        assert!(self.input.is_none(), "a second input slot was handed out");
                        assert_eq!(slot as u64, index % n as u64);
                        assert_eq!(index, self.state.submitted());
                        assert!(in_ring < n as u64, "the ring handed out more than {n} slots");
                        self.input = Some((slot, index));
                    }
                    Err(Stall::InputHeld) => assert!(self.input.is_some()),
                    Err(Stall::Full) => {
                        assert!(self.input.is_none());
                        let slot = (self.state.submitted() % n as u64) as usize;
                        assert!(self.held_by_others(slot), "refused a free slot");
                    }
                    Err(other) => panic!("begin_input stalled with {other:?}"),
                },
                Op::Submit => {
                    if let Some((slot, index)) = self.input.take() {
                        // The producer writes only a slot no one else holds.
                        assert!(
                            !self.held_by_others(slot),
                            "writing slot {slot} held by the GPU or consumer"
                        );
                        self.memory[slot] = Some(index);
                        assert_eq!(self.state.submit(slot), index);
                    }
                }
                Op::CancelInput => {
                    if let Some((slot, _)) = self.input.take() {
                        self.state.cancel_input(slot);
                    }
                }
                Op::Complete(pick) => {
                    let busy: Vec<usize> = (0..n)
                        .filter(|&slot| matches!(self.state.slot(slot), SlotState::InFlight { .. }))
                        .collect();
                    if !busy.is_empty() {
                        self.state.complete(busy[pick % busy.len()]);
                    }
                }
                Op::BeginOutput => {
                    let expected = self.state.drained();
                    let slot = (expected % n as u64) as usize;
                    match self.state.begin_output() {
                        Ok((got_slot, index)) => {
                            assert!(self.output.is_none());
                            assert_eq!((got_slot, index), (slot, expected), "out of order");
                            // The frame is still in the slot: nothing overwrote it.
                            assert_eq!(self.memory[slot], Some(index), "frame {index} was overwritten");
                            self.output = Some((slot, index));
                        }
                        Err(Stall::OutputHeld) => assert!(self.output.is_some()),
                        Err(Stall::Pending) => {
                            assert_eq!(self.state.slot(slot), SlotState::InFlight { index: expected })
                        }
                        Err(Stall::Empty) => assert_eq!(self.state.submitted(), expected, "refused a frame"),
                        Err(other) => panic!("begin_output stalled with {other:?}"),
                    }
                }
                Op::FinishOutput => {
                    if let Some((slot, index)) = self.output.take() {
                        self.seen.push(index);
                        self.state.finish_output(slot);
                    }
                }
            }
        }

        /// Finishes everything: the GPU completes, the consumer drains.
        fn drain(&mut self) {
            if let Some((slot, _)) = self.input.take() {
                self.state.cancel_input(slot);
            }
            if let Some((slot, index)) = self.output.take() {
                self.seen.push(index);
                self.state.finish_output(slot);
            }
            while self.state.drained() < self.state.submitted() {
                if let Ok((slot, _)) = self.state.oldest_in_flight() {
                    self.state.complete(slot);
                }
                let (slot, index) = self.state.begin_output().expect("a submitted frame can be drained");
                assert_eq!(self.memory[slot], Some(index));
                self.seen.push(index);
                self.state.finish_output(slot);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any interleaving of producer, GPU and consumer: frames come out in order, each
        /// exactly once, never overwritten while held, and never more than N in the ring.
        #[test]
        fn frames_come_out_in_order_once_and_intact(
            slots in 1usize..6,
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            let mut model = Model::new(slots);
            for op in ops {
                model.step(op);
            }
            let submitted = model.state.submitted();
            model.drain();
            let expected: Vec<u64> = (0..submitted).collect();
            prop_assert_eq!(&model.seen, &expected);
            prop_assert!((0..slots).all(|slot| model.state.slot(slot) == SlotState::Free));
        }
    }

    #[test]
    fn a_full_ring_refuses_input_until_the_consumer_frees_the_oldest_slot() {
        let mut state = RingState::new(2);
        for _ in 0..2 {
            let (slot, _) = state.begin_input().unwrap();
            state.submit(slot);
        }
        assert_eq!(state.begin_input(), Err(Stall::Full));
        // Finishing on the GPU is not enough: the consumer still holds the frame.
        let (slot, index) = state.oldest_in_flight().unwrap();
        assert_eq!(index, 0);
        state.complete(slot);
        assert_eq!(state.begin_input(), Err(Stall::Full));
        let (slot, _) = state.begin_output().unwrap();
        assert_eq!(state.begin_input(), Err(Stall::Full));
        state.finish_output(slot);
        assert_eq!(state.begin_input(), Ok((0, 2)));
    }

    #[test]
    fn an_empty_ring_refuses_output_and_a_pending_frame_waits() {
        let mut state = RingState::new(3);
        assert_eq!(state.begin_output(), Err(Stall::Empty));
        let (slot, _) = state.begin_input().unwrap();
        assert_eq!(state.begin_output(), Err(Stall::Empty));
        state.submit(slot);
        assert_eq!(state.begin_output(), Err(Stall::Pending));
        state.complete(slot);
        assert_eq!(state.begin_output(), Ok((0, 0)));
        assert_eq!(state.begin_output(), Err(Stall::OutputHeld));
    }

    #[test]
    fn a_closed_ring_refuses_input_and_ends_the_output_after_the_last_frame() {
        let mut state = RingState::new(3);
        let (slot, _) = state.begin_input().unwrap();
        state.submit(slot);
        state.close();
        assert_eq!(state.begin_input(), Err(Stall::Closed));
        assert_eq!(state.begin_output(), Err(Stall::Pending));
        state.complete(slot);
        let (slot, _) = state.begin_output().unwrap();
        state.finish_output(slot);
        assert_eq!(state.begin_output(), Err(Stall::Closed));
    }
}
