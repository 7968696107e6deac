//! Streaming throughput: frames pushed through a [`FrameRing`](hetmem::FrameRing) as fast as the ring takes them.
//!
//! A producer thread submits frames while the calling thread drains them, so upload, kernel
//! and download of different frames overlap as they would in a real stream. Each slot's input
//! is filled with fresh random bytes on its first use; after that the producer either leaves
//! the slot's bytes in place (`refill: false`: the ring and the link alone, what a producer
//! that decodes or captures straight into the slot would see) or copies a whole frame into it
//! every time (`refill: true`: the cost of a CPU memcpy per frame included). A round of frames
//! (one per slot) is checked against the CPU path before the clock starts and another after it
//! stops; the timed frames are not compared, as a CPU comparison would stall the ring.
//!
//! [`measure_fan_out`] streams through a [`FanOutRing`] over several devices (frame k to
//! device k mod N) and reports the aggregate rate and each device's share of the link.

use std::time::Instant;

use hetmem::backend::Device;
use hetmem::error::Error;
use hetmem::handoff::FenceKind;
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage};
use hetmem::pipeline::{FanOutRing, RingOptions, Strategy};
use hetmem::stage::Stage;

use crate::error::{BenchError, Result};
use crate::random::SplitMix64;

/// What to stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamingSetup {
    /// The strategy (`Auto` resolved).
    pub strategy: Strategy,
    /// The frames' format.
    pub format: FrameFormat,
    /// Slots in the ring.
    pub slots: usize,
    /// Frames to push through (at least two rounds of slots, so both checks run).
    pub frames: u64,
    /// Copy a whole frame into each input slot every time, not only on its first use.
    pub refill: bool,
    /// How the ring's queues signal completion.
    pub fence: FenceKind,
}

/// One streaming run, measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamingRun {
    /// What ran on each frame: `gaussian` (the built-in blur) or the name a caller gave.
    pub stage: String,
    /// The strategy that ran.
    pub strategy: Strategy,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Bytes per frame.
    pub frame_bytes: usize,
    /// Slots in the ring (per device).
    pub slots: usize,
    /// Whether every frame was copied into its slot.
    pub refill: bool,
    /// How the ring's queues signalled completion.
    pub fence: FenceKind,
    /// Frames pushed through.
    pub frames: u64,
    /// From the first submission to the last frame drained.
    pub wall_s: f64,
    /// Frames per second through the ring.
    pub frames_per_s: f64,
    /// Seconds during which a device was working on at least one frame (CUDA events around
    /// each frame's work, overlapping frames counted once: [`hetmem::FrameRing::gpu_busy_seconds`]),
    /// summed over the devices. 0 on the CPU.
    pub kernel_busy_s: f64,
    /// `kernel_busy_s / wall_s` per device, averaged over the devices: at most 1.
    pub kernel_busy_fraction: f64,
    /// Bytes crossing the host-GPU link per frame (see [`hetmem::FrameRing::link_bytes_per_frame`]).
    pub link_bytes_per_frame: u64,
    /// Link bytes per second, both directions together.
    pub link_bytes_per_s: f64,
    /// Host and device memory the ring allocated.
    pub host_bytes: usize,
    /// Device memory the ring allocated.
    pub device_bytes: usize,
    /// By the hybrid strategy, where each slot's buffers went and why, on the first device
    /// ([`hetmem::FrameRing::placement`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<hetmem::placement::Placement>,
    /// Each device the frames were fanned out over, in the order frames were dealt (one
    /// entry for one device; the totals above are over all of them).
    pub devices: Vec<DeviceShare>,
}

/// One device's part of a streaming run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceShare {
    /// The CUDA ordinal; `None` for the CPU.
    pub ordinal: Option<usize>,
    /// The device's name.
    pub name: String,
    /// Frames it filtered.
    pub frames: u64,
    /// Link bytes per second to and from it (counted: its frames' link bytes over the run's
    /// wall time, not read from NVML).
    pub link_bytes_per_s: f64,
    /// Seconds during which it worked on at least one frame (CUDA events; 0 on the CPU).
    pub kernel_busy_s: f64,
    /// All the PCIe traffic NVML's counters saw on its link during the run, mean MB/s (GPU to
    /// host, host to GPU): protocol traffic, the GPU's read requests and page migrations
    /// included, so above the payload of `link_bytes_per_s` for the mapped and managed
    /// strategies (NVML's traffic was 1.13-2.24x the counted bytes on the H200). Filled by
    /// callers that sample NVML (`hetmem bench`); `None` from [`measure_fan_out`] itself.
    pub nvml_pcie_traffic_mb_s: Option<(f64, f64)>,
}

/// Streams `setup.frames` random frames through a ring blurring them with `kernel`.
///
/// # Errors
/// A ring that cannot be made (strategy, memory), a failed frame, or an output that differs
/// from the CPU path (reported as an invalid-argument error naming the frame).
pub fn measure(device: &Device, kernel: &Gaussian, setup: &StreamingSetup) -> Result<StreamingRun> {
    measure_fan_out(std::slice::from_ref(device), kernel, setup)
}

/// Streams `setup.frames` random frames through a [`FanOutRing`] over `devices`
/// (`setup.slots` slots each), as [`measure`] does through one ring.
///
/// # Errors
/// No devices, devices on which the strategy resolves differently, and as for [`measure`].
pub fn measure_fan_out(
    devices: &[Device],
    kernel: &Gaussian,
    setup: &StreamingSetup,
) -> Result<StreamingRun> {
    measure_stage(devices, "gaussian", &GaussianStage::new(setup.format, kernel)?.streamed(), setup)
}

/// Streams `setup.frames` random frames of `setup.format`'s size through `stage` (one input
/// and one output buffer of that size) on a [`FanOutRing`] over `devices`, each checked
/// outputs against the stage's own CPU path; `name` names the stage in the report.
///
/// # Errors
/// As for [`measure_fan_out`]; a stage whose first input is not one frame of the format.
pub fn measure_stage<S: Stage + Clone>(
    devices: &[Device],
    name: &str,
    stage: &S,
    setup: &StreamingSetup,
) -> Result<StreamingRun> {
    let options =
        RingOptions { slots: setup.slots, timing: true, fence: setup.fence, ..RingOptions::default() };
    check_stage(stage, setup)?;
    let ring = FanOutRing::with_stage(devices, setup.strategy, stage, options)?;
    let strategy = one_strategy(&ring, setup)?;
    let slots = ring.slots() as u64;
    if setup.frames < 2 * slots {
        return Err(Error::invalid(
            "frames",
            format!("{}: stream at least two rounds of {slots} slots", setup.frames),
        )
        .into());
    }
    let frame_bytes = ring.frame_bytes();
    let mut rng = SplitMix64::fresh();
    let inputs: Vec<Vec<u8>> = (0..slots).map(|_| rng.bytes(frame_bytes)).collect();
    let output_bytes = stage.outputs()[0].bytes();
    let wanted: Vec<Vec<u8>> = inputs
        .iter()
        .map(|input| {
            let mut output = vec![0u8; output_bytes];
            stage.run_cpu(&[input], &mut [&mut output]).map(|()| output)
        })
        .collect::<hetmem::Result<_>>()?;
    ring.fill_outputs(0xA5)?;

    // One round of frames checked against the CPU path before the clock starts and one after it
    // stops: comparing a whole frame on the CPU takes milliseconds at 4K, and inside the timed
    // stream it would hold a slot and stall the ring (it cost 4K pinned-async about a fifth of
    // its frames per second, and more with more slots).
    let check = |round: &str| check_round(&ring, &inputs, &wanted, strategy, round);
    check("first")?;
    let before: Vec<(u64, f64)> =
        ring.rings().iter().map(|one| (one.drained(), one.gpu_busy_seconds())).collect();
    let start = Instant::now();
    stream_timed(&ring, &inputs, setup)?;
    let wall_s = start.elapsed().as_secs_f64();
    let after: Vec<(u64, f64)> =
        ring.rings().iter().map(|one| (one.drained(), one.gpu_busy_seconds())).collect();
    // Poisoned again: an output the last round failed to write would otherwise still hold a
    // right result from a timed frame of the same input.
    ring.fill_outputs(0xA5)?;
    check("last")?;
    let frames = setup.frames;
    let link_bytes_per_frame = ring.rings()[0].link_bytes_per_frame();
    let devices = device_shares(devices, &ring, &before, &after, wall_s);
    let kernel_busy_s = devices.iter().map(|share| share.kernel_busy_s).sum::<f64>();
    Ok(StreamingRun {
        stage: name.to_string(),
        strategy,
        width: setup.format.width(),
        height: setup.format.height(),
        frame_bytes,
        slots: setup.slots,
        refill: setup.refill,
        fence: setup.fence,
        frames,
        wall_s,
        frames_per_s: frames as f64 / wall_s,
        kernel_busy_s,
        kernel_busy_fraction: kernel_busy_s / (wall_s * devices.len() as f64),
        link_bytes_per_frame,
        link_bytes_per_s: devices.iter().map(|share| share.link_bytes_per_s).sum(),
        host_bytes: ring.rings().iter().map(|one| one.host_bytes()).sum(),
        device_bytes: ring.rings().iter().map(|one| one.device_bytes()).sum(),
        placement: ring.rings()[0].placement().cloned(),
        devices,
    })
}

/// Refuses a stage the streaming bench cannot feed: one input and one output buffer, the input
/// one frame of the format.
fn check_stage<S: Stage>(stage: &S, setup: &StreamingSetup) -> Result<()> {
    if stage.inputs().len() != 1 || stage.outputs().len() != 1 {
        return Err(Error::invalid(
            "stage",
            "the streaming bench takes stages of one input and one output buffer",
        )
        .into());
    }
    if stage.inputs()[0].bytes() != setup.format.frame_bytes() {
        return Err(Error::invalid(
            "stage",
            format!(
                "its input holds {} bytes, the frames {}",
                stage.inputs()[0].bytes(),
                setup.format.frame_bytes()
            ),
        )
        .into());
    }
    Ok(())
}

/// The strategy every device's ring resolved to; an error where they differ.
fn one_strategy<S: Stage>(ring: &FanOutRing<S>, setup: &StreamingSetup) -> Result<Strategy> {
    let strategy = ring.rings()[0].strategy();
    if let Some(other) = ring.rings().iter().find(|other| other.strategy() != strategy) {
        return Err(Error::invalid(
            "devices",
            format!(
                "{} resolves to {strategy} on one device and {} on another: name the strategy",
                setup.strategy,
                other.strategy()
            ),
        )
        .into());
    }
    Ok(strategy)
}

/// One round of frames (one per slot) through the ring, each output compared with the CPU's.
fn check_round<S: Stage>(
    ring: &FanOutRing<S>,
    inputs: &[Vec<u8>],
    wanted: &[Vec<u8>],
    strategy: Strategy,
    round: &str,
) -> Result<()> {
    for input in inputs {
        let mut slot = ring.next_input()?;
        slot.copy_from_slice(input);
        slot.submit();
    }
    for (index, wanted) in wanted.iter().enumerate() {
        let output = ring.next_output()?;
        if *output != wanted[..] {
            return Err(BenchError::ResultMismatch {
                what: "a streamed frame",
                detail: format!("{round} round, frame {index} by {strategy} on device {}", output.ring()),
            });
        }
    }
    Ok(())
}

/// The timed stream: a producer thread submits `setup.frames` frames while this thread drains
/// them.
fn stream_timed<S: Stage>(ring: &FanOutRing<S>, inputs: &[Vec<u8>], setup: &StreamingSetup) -> Result<()> {
    let slots = ring.slots() as u64;
    let drained = std::thread::scope(|scope| {
        let producer = scope.spawn(|| -> hetmem::Result<()> {
            for index in 0..setup.frames {
                let mut slot = ring.next_input()?;
                // Without refill, each slot keeps the input the first round wrote.
                if setup.refill {
                    slot.copy_from_slice(&inputs[(index % slots) as usize]);
                }
                slot.submit();
            }
            Ok(())
        });
        let drained = (0..setup.frames).try_for_each(|_| ring.next_output().map(drop));
        if drained.is_err() {
            ring.close();
        }
        let produced = producer.join().expect("the producer thread does not panic");
        drained.and(produced.or_else(|error| match error {
            Error::RingClosed => Ok(()),
            error => Err(error),
        }))
    });
    drained?;
    Ok(())
}

/// Each device's part of the run, from its ring's (frames drained, busy seconds) before and
/// after the timed stream.
fn device_shares<S: Stage>(
    devices: &[Device],
    ring: &FanOutRing<S>,
    before: &[(u64, f64)],
    after: &[(u64, f64)],
    wall_s: f64,
) -> Vec<DeviceShare> {
    devices
        .iter()
        .zip(ring.rings())
        .zip(before.iter().zip(after))
        .map(|((device, one), (&(drained_before, busy_before), &(drained_after, busy_after)))| {
            let frames = drained_after - drained_before;
            DeviceShare {
                ordinal: device.as_cuda().map(|cuda| cuda.ordinal()),
                name: device.name(),
                frames,
                link_bytes_per_s: (one.link_bytes_per_frame() * frames) as f64 / wall_s,
                kernel_busy_s: busy_after - busy_before,
                nvml_pcie_traffic_mb_s: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::backend::{BackendChoice, BackendKind};
    use hetmem::ops::gaussian::{Border, PixelLayout};

    #[test]
    fn the_cpu_ring_streams_and_reports_its_rate() {
        let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let kernel = Gaussian::new(None, None, Border::default()).unwrap();
        let format = FrameFormat::new(64, 48, PixelLayout::Rgb).unwrap();
        for refill in [false, true] {
            let setup = StreamingSetup {
                strategy: Strategy::Auto,
                format,
                slots: 3,
                frames: 12,
                refill,
                fence: FenceKind::Event,
            };
            let run = measure(&device, &kernel, &setup).unwrap();
            assert_eq!((run.strategy, run.frames, run.frame_bytes), (Strategy::Cpu, 12, 64 * 48 * 3));
            assert!(run.frames_per_s > 0.0 && run.wall_s > 0.0);
            assert_eq!((run.link_bytes_per_frame, run.kernel_busy_s), (0, 0.0));
        }
        let short = StreamingSetup {
            strategy: Strategy::Cpu,
            format,
            slots: 3,
            frames: 5,
            refill: false,
            fence: FenceKind::Flag,
        };
        assert!(measure(&device, &kernel, &short).is_err());
    }

    #[test]
    fn fanned_out_over_two_cpu_devices_each_takes_half_the_frames() {
        let cpu = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let kernel = Gaussian::new(None, None, Border::default()).unwrap();
        let format = FrameFormat::new(32, 24, PixelLayout::Rgb).unwrap();
        let setup = StreamingSetup {
            strategy: Strategy::Cpu,
            format,
            slots: 2,
            frames: 14,
            refill: true,
            fence: FenceKind::Event,
        };
        let run = measure_fan_out(&[cpu.clone(), cpu], &kernel, &setup).unwrap();
        let frames: Vec<u64> = run.devices.iter().map(|share| share.frames).collect();
        assert_eq!((run.frames, frames, run.slots), (14, vec![7, 7], 2));
        assert_eq!(run.host_bytes, 2 * 2 * 2 * format.frame_bytes());
        assert!(measure_fan_out(&[], &kernel, &setup).is_err());
    }
}
