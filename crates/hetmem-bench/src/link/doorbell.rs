//! The doorbell's round trip: a request served by a persistent kernel polling mapped memory.

use hetmem::backend::Device;

use crate::Summary;
use crate::error::{BenchError, Result};
use crate::random::SplitMix64;

/// Round trips of a 64-byte request (gain over 16 random f32 samples) through the
/// persistent-kernel doorbell ([`hetmem::resident::Doorbell`]), `samples` times after a tenth as
/// many to warm up, one request in flight; every reply is checked bit for bit against the CPU.
/// `None` on the CPU backend.
///
/// The doorbell's kernel stays resident while it runs, so this starts it last and shuts it
/// down before returning: device-synchronising calls made meanwhile would wait for it.
///
/// # Errors
/// The doorbell failing to start, a request timing out, or a reply that differs.
pub fn doorbell_round_trip(device: &Device, samples: usize) -> Result<Option<Summary>> {
    use hetmem::resident::{Doorbell, Request};
    if device.as_cuda().is_none() {
        return Ok(None);
    }
    let mut rng = SplitMix64::fresh();
    let bell = Doorbell::start(device, 16)?;
    let mut round_trips = Vec::with_capacity(samples);
    let measured = (0..samples + samples / 10).try_for_each(|round| {
        let block: Vec<f32> =
            (0..16).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
        let request = Request::Gain { gain: 0.75, samples: &block };
        let start = std::time::Instant::now();
        let reply = bell.call(request)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        if reply.iter().map(|v| v.to_bits()).ne(request.reference().iter().map(|v| v.to_bits())) {
            return Err(BenchError::ResultMismatch {
                what: "the doorbell's reply",
                detail: format!("round {round} of the round trip benchmark"),
            });
        }
        if round >= samples / 10 {
            round_trips.push(elapsed);
        }
        Ok(())
    });
    let stopped = bell.shutdown();
    measured?;
    stopped?;
    Ok(Summary::of(&round_trips))
}
