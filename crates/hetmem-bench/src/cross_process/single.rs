//! The peer measured in the same run: the single-process [`FrameRing`] with the same stage,
//! strategy, slots and producer work (a producer thread stamping each frame into its slot),
//! streamed, then one frame at a time for the latency.

use std::time::Instant;

use hetmem::error::Error;
use hetmem::stage::Stage;
use hetmem::{Device, FrameRing, RingOptions, Strategy};

use super::content::{FrameContent, monotonic_ns};
use super::{RingFigures, Sample, check_output, figures};
use crate::error::{BenchError, Result};

/// Frame `index` into the ring: the base on a slot's first use (`first_use`), then the stamp.
fn send<S: Stage>(
    ring: &FrameRing<S>,
    content: &FrameContent,
    index: u64,
    first_use: bool,
    stamp: &mut [u8],
) -> Result<u64> {
    let mut slot = ring.next_input()?;
    if first_use {
        slot.copy_from_slice(content.base());
    }
    content.stamp(index, stamp);
    slot[..stamp.len()].copy_from_slice(stamp);
    let published = monotonic_ns();
    slot.submit();
    Ok(published)
}

/// Takes the next output and checks it is frame `index`'s.
fn receive<S: Stage>(ring: &FrameRing<S>, index: u64) -> Result<hetmem::pipeline::OutputFrame<'_, S>> {
    let output = ring.next_output()?;
    if output.index() != index {
        return Err(BenchError::ResultMismatch {
            what: "a frame through the frame ring",
            detail: format!("frame {index} came out as frame {}", output.index()),
        });
    }
    Ok(output)
}

/// Runs the single-process ring as [`super::measure`] runs the shared one: `sample`'s frames
/// from index 0 (the first round checked, the timed stream, the one-at-a-time frames).
///
/// # Errors
/// Making the ring (fewer slots than asked included), a failed frame, an output that differs.
pub(super) fn measure<S: Stage>(
    device: &Device,
    strategy: Strategy,
    stage: S,
    content: &FrameContent,
    sample: &Sample,
) -> Result<RingFigures> {
    let options = RingOptions { slots: sample.slots, min_slots: sample.slots, ..RingOptions::default() };
    let ring = FrameRing::with_stage(device, strategy, stage, options)?;
    let slots = sample.slots as u64;
    let mut stamp = vec![0u8; content.stamp_len()];
    let mut wanted = vec![0u8; ring.stage().outputs()[0].bytes()];

    ring.fill_outputs(0xA5)?;
    for index in 0..slots {
        send(&ring, content, index, true, &mut stamp)?;
    }
    for index in 0..slots {
        let output = receive(&ring, index)?;
        check_output(ring.stage(), content, index, &output, &mut wanted, "the frame ring")?;
    }

    let timed = slots..slots + sample.timed;
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let producer = scope.spawn(|| -> Result<()> {
            let mut stamp = vec![0u8; content.stamp_len()];
            for index in timed.clone() {
                send(&ring, content, index, false, &mut stamp)?;
            }
            Ok(())
        });
        let drained = timed.clone().try_for_each(|index| receive(&ring, index).map(drop));
        if drained.is_err() {
            ring.close();
        }
        let produced = producer.join().expect("the producer thread does not panic");
        drained.and(produced.or_else(|error| match error {
            BenchError::Hetmem(Error::RingClosed) => Ok(()),
            error => Err(error),
        }))
    })?;
    let wall_s = start.elapsed().as_secs_f64();

    let mut latency_us = Vec::new();
    for (nth, index) in (timed.end..timed.end + sample.one_at_a_time).enumerate() {
        let checking = (nth as u64) < sample.checked;
        if checking {
            ring.fill_outputs(0xA5)?;
        }
        let published = send(&ring, content, index, false, &mut stamp)?;
        let output = receive(&ring, index)?;
        latency_us.push(monotonic_ns().saturating_sub(published) as f64 / 1e3);
        if checking {
            check_output(ring.stage(), content, index, &output, &mut wanted, "the frame ring")?;
        }
    }
    Ok(figures(sample.timed, wall_s, &latency_us))
}
