//! The producer process: fills the shared ring's slots with the run's frames, streamed as fast
//! as the consumer frees slots, then one at a time when the consumer asks (the latency frames).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use hetmem::Device;
use hetmem::error::Error;
use hetmem::pipeline::shared_ring::RingProducer;

use super::content::{FrameContent, monotonic_ns};
use crate::error::Result;

/// What the producer process sends, agreed with the consumer before it starts (as arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerPlan {
    /// Bytes per frame.
    pub frame_bytes: usize,
    /// Slots in the ring.
    pub slots: usize,
    /// Frames streamed: the checked first round (one per slot), then the timed ones.
    pub streamed: u64,
    /// Frames sent one at a time after them, each when the consumer asks, for the latency.
    pub one_at_a_time: u64,
    /// The seed of the frames' content.
    pub seed: u64,
}

impl ProducerPlan {
    /// The plan as command-line arguments, for [`ProducerPlan::parse`] in the producer.
    pub fn to_args(&self) -> Vec<String> {
        [self.frame_bytes as u64, self.slots as u64, self.streamed, self.one_at_a_time, self.seed]
            .iter()
            .map(u64::to_string)
            .collect()
    }

    /// The plan from [`ProducerPlan::to_args`]' arguments.
    ///
    /// # Errors
    /// Not five unsigned numbers.
    pub fn parse(args: &[String]) -> Result<ProducerPlan> {
        let numbers: Vec<u64> =
            args.iter().map(|arg| arg.parse::<u64>()).collect::<Result<_, _>>().map_err(|error| {
                Error::invalid("producer plan", format!("{args:?}: {error}; give five unsigned numbers"))
            })?;
        let &[frame_bytes, slots, streamed, one_at_a_time, seed] = numbers.as_slice() else {
            return Err(Error::invalid(
                "producer plan",
                format!("{args:?}: five numbers, not {}", args.len()),
            )
            .into());
        };
        let size = |what: &'static str, value: u64| {
            usize::try_from(value)
                .map_err(|_| Error::invalid(what, format!("{value} does not fit this machine")))
        };
        if frame_bytes < 8 || streamed.checked_add(one_at_a_time).is_none() {
            return Err(Error::invalid(
                "producer plan",
                format!("{args:?}: frames of at least 8 bytes, and frame counts whose sum fits 64 bits"),
            )
            .into());
        }
        Ok(ProducerPlan {
            frame_bytes: size("frame bytes", frame_bytes)?,
            slots: size("slots", slots)?,
            streamed,
            one_at_a_time,
            seed,
        })
    }
}

/// The error for a failed call on the control socket.
pub(super) fn control_error(doing: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { context: format!("the bench's control socket, {doing}"), source }
}

/// Runs the producer: connects twice to the consumer's socket at `socket_path` (first the
/// ring's socket, then the control socket that asks for each latency frame and carries its
/// publish time back), makes the ring, and sends `plan`'s frames. Each slot gets the base frame
/// on its first use; every frame then gets only its stamp (see `content.rs`).
///
/// # Errors
/// The consumer unreachable or gone, the ring refused.
pub fn produce(socket_path: &Path, plan: &ProducerPlan) -> Result<()> {
    let connect = |what: &'static str| {
        UnixStream::connect(socket_path).map_err(|source| Error::Io {
            context: format!("connecting the {what} to {}", socket_path.display()),
            source,
        })
    };
    let ring_socket = connect("ring's socket")?;
    let mut control = connect("control socket")?;
    // The producer's CPU writes the slots: nothing to register with a GPU in this process.
    let mut ring =
        RingProducer::create(&Device::cpu(), &ring_socket, plan.frame_bytes, plan.slots, Default::default())?;
    let content = FrameContent::new(plan.seed, plan.frame_bytes);
    let mut stamp = vec![0u8; content.stamp_len()];
    for index in 0..plan.streamed {
        let mut slot = ring.next_slot()?;
        if index < plan.slots as u64 {
            slot.write_at(0, content.base())?;
        }
        content.stamp(index, &mut stamp);
        slot.write_at(0, &stamp)?;
        slot.publish();
    }
    for index in plan.streamed..plan.streamed + plan.one_at_a_time {
        let mut go = [0u8];
        control.read_exact(&mut go).map_err(control_error("waiting for the next latency frame's turn"))?;
        let mut slot = ring.next_slot()?;
        content.stamp(index, &mut stamp);
        slot.write_at(0, &stamp)?;
        let published = monotonic_ns();
        slot.publish();
        control.write_all(&published.to_le_bytes()).map_err(control_error("sending a publish time"))?;
    }
    ring.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_goes_through_arguments_unchanged_and_bad_ones_are_refused() {
        let plan = ProducerPlan {
            frame_bytes: 6_220_800,
            slots: 4,
            streamed: 3004,
            one_at_a_time: 300,
            seed: 0xdead_beef,
        };
        assert_eq!(ProducerPlan::parse(&plan.to_args()).unwrap(), plan);
        let args = |text: &str| text.split(' ').map(String::from).collect::<Vec<_>>();
        for bad in ["1 2 3 4", "1 2 3 4 5 6", "100 2 x 4 5", "7 2 3 4 5", "100 2 18446744073709551615 1 5"] {
            assert!(ProducerPlan::parse(&args(bad)).is_err(), "{bad}");
        }
    }
}
