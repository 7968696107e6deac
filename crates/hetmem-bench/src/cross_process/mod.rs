//! Two processes against one: frames through the cross-process ring
//! ([`hetmem::pipeline::shared_ring`]) and through the single-process [`hetmem::FrameRing`],
//! the same stage, strategy, slots and producer work, in the same run.
//!
//! The producer is a process of its own (the caller starts it: [`measure`] takes a function
//! that spawns it, and the producer side runs [`produce`]). It does the same cheap work per
//! frame in both rings: it writes a seeded base frame into each slot on the slot's first use,
//! then stamps each frame's first 4 KiB (its index and bytes seeded by it: `content.rs`).
//! A capture or a whole-frame copy would measure the producer, not the transport: a 6 MB
//! memcpy per 1080p frame takes longer than the ring's whole per-frame time on the H200.
//!
//! The consumer runs the stage by the strategy with one frame in flight per slot (`lanes.rs`):
//! frame k+1's work is queued before frame k's is waited for, each slot is freed only once the
//! work reading it completed, and outputs come in order. Each run of frames, in either ring:
//! 1. a first round (one frame per slot) streamed, outputs poisoned first and each compared
//!    with the CPU blur of the frame rebuilt from the seed (this warms the GPU too);
//! 2. the timed stream: frames per second, from the first frame taken to the last finished;
//! 3. one frame at a time: the producer publishes a frame only when the consumer has finished
//!    the last one and asks; the latency is from just before the producer's publish (after
//!    its stamp) to the consumer's result ready, both on `CLOCK_MONOTONIC`, which is one clock
//!    for every process; the first `checked` of these are compared with the CPU blur too.
//!
//! Every frame of the shared ring is checked on arrival: its index, and its stamp as the
//! producer wrote it (each frame arrives once, in order); the frame ring's outputs carry their
//! indices. On the CPU backend both rings run the CPU strategy (slow, but checked the same).

mod content;
mod lanes;
mod producer;
mod single;

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use hetmem::error::Error;
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage};
use hetmem::pipeline::shared_ring::RingConsumer;
use hetmem::stage::Stage;
use hetmem::{Device, Strategy};

pub use content::{FrameContent, STAMP_BYTES, monotonic_ns};
pub use producer::{ProducerPlan, produce};

use crate::Summary;
use crate::error::{BenchError, Result};
use lanes::Lane;
use producer::control_error;

/// How long the producer has to start and connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct CrossProcessSetup {
    /// The strategy: cpu, zero-copy or pinned-async (`Auto` resolved to one of these).
    pub strategy: Strategy,
    /// The frames' format (RGB 1080p for the comparison the library's goal names).
    pub format: FrameFormat,
    /// Slots in both rings; the consumer keeps a frame in flight per slot.
    pub slots: usize,
    /// Frames timed in the stream (after a checked first round of one per slot).
    pub frames: u64,
    /// Frames sent one at a time for the latency (at least 1).
    pub latency_frames: u64,
    /// How many of the one-at-a-time frames have their outputs compared with the CPU blur (the
    /// first round always is).
    pub checked: u64,
    /// The seed of the frames' content.
    pub seed: u64,
    /// How long the consumer waits on the producer for any one thing (a frame, a publish
    /// time, its exit) before it calls the producer stuck and fails the run: a producer that
    /// is alive but silent would otherwise hang the bench for ever.
    pub producer_timeout: Duration,
}

/// One ring's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RingFigures {
    /// Frames per second through the timed stream.
    pub frames_per_s: f64,
    /// Seconds the timed stream took.
    pub wall_s: f64,
    /// One frame's latency, microseconds: from the producer's publish to the result ready.
    pub latency_us: Summary,
}

/// Both rings, measured in one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CrossProcessRun {
    /// The strategy both ran.
    pub strategy: Strategy,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Bytes per frame.
    pub frame_bytes: usize,
    /// Slots in both rings.
    pub slots: usize,
    /// Frames timed in each stream.
    pub frames: u64,
    /// Frames sent one at a time in each ring.
    pub latency_frames: u64,
    /// Outputs compared with the CPU blur, in each ring.
    pub checked_outputs: u64,
    /// The seed of the frames.
    pub seed: u64,
    /// What the producer did per frame.
    pub producer_work: String,
    /// The cross-process ring (two processes).
    pub cross_process: RingFigures,
    /// The single-process frame ring.
    pub single_process: RingFigures,
    /// Cross-process frames/s over single-process frames/s.
    pub throughput_ratio: f64,
    /// Cross-process median latency minus single-process median latency, microseconds.
    pub latency_difference_us: f64,
}

/// The frames a run sends, by phase.
#[derive(Debug, Clone, Copy)]
struct Sample {
    slots: usize,
    timed: u64,
    one_at_a_time: u64,
    checked: u64,
    producer_timeout: Duration,
}

fn figures(frames: u64, wall_s: f64, latency_us: &[f64]) -> RingFigures {
    RingFigures {
        frames_per_s: frames as f64 / wall_s,
        wall_s,
        latency_us: Summary::of(latency_us).expect("at least one latency frame"),
    }
}

/// Compares `output` with the CPU blur of frame `index`.
fn check_output<S: Stage>(
    stage: &S,
    content: &FrameContent,
    index: u64,
    output: &[u8],
    wanted: &mut [u8],
    ring: &str,
) -> Result<()> {
    stage.run_cpu(&[&content.frame(index)], &mut [&mut *wanted])?;
    if let Some(byte) = output.iter().zip(wanted.iter()).position(|(got, want)| got != want) {
        return Err(BenchError::ResultMismatch {
            what: "a blurred frame",
            detail: format!(
                "{ring}, frame {index}: byte {byte} is {}, the CPU blur gives {}",
                output[byte], wanted[byte]
            ),
        });
    }
    Ok(())
}

/// Kills and reaps the producer if the run stops before it ends by itself.
struct ProducerProcess(Option<Child>);

impl ProducerProcess {
    /// Waits up to `timeout` for the producer to exit; an error unless it succeeded (one that
    /// is still running then is killed, by the drop).
    fn wait(mut self, timeout: Duration) -> Result<()> {
        let child = self.0.as_mut().expect("waited once");
        let start = Instant::now();
        let status = loop {
            let exited = child
                .try_wait()
                .map_err(|source| Error::Io { context: "waiting for the producer".into(), source })?;
            if let Some(status) = exited {
                break status;
            }
            if start.elapsed() > timeout {
                return Err(Error::invalid(
                    "producer process",
                    format!(
                        "it (pid {}) sent every frame but did not exit within {timeout:?}: killed",
                        child.id()
                    ),
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        self.0 = None;
        if !status.success() {
            return Err(Error::invalid("producer process", format!("it failed: {status}")).into());
        }
        Ok(())
    }
}

impl Drop for ProducerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Accepts the producer's next connection, watching it: an error if it exits first or takes
/// longer than [`CONNECT_TIMEOUT`].
fn accept(listener: &UnixListener, producer: &mut ProducerProcess, what: &str) -> Result<UnixStream> {
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(control_error("making it blocking"))?;
                return Ok(stream);
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(Error::Io { context: format!("accepting the producer's {what}"), source }.into());
            }
        }
        let child = producer.0.as_mut().expect("running");
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error::invalid(
                "producer process",
                format!("it exited ({status}) before connecting its {what}"),
            )
            .into());
        }
        if start.elapsed() > CONNECT_TIMEOUT {
            return Err(Error::invalid(
                "producer process",
                format!("it did not connect its {what} within {CONNECT_TIMEOUT:?}"),
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Measures `setup` on `device`: the cross-process ring, with a producer process that `spawn`
/// starts (given the socket to connect to and the plan to pass to [`produce`]), then the
/// single-process ring, blurring with `kernel`.
///
/// # Errors
/// A strategy other than cpu, zero-copy or pinned-async, or one the device cannot run; fewer
/// than 1 slot, timed frame or latency frame; a producer timeout of 0; frames under 8 bytes; the
/// producer failing to start, connect or finish, making a ring other than agreed, or sending
/// nothing within the producer timeout; a frame lost, out of order or not as written; an output
/// that differs from the CPU blur.
pub fn measure(
    device: &Device,
    kernel: &Gaussian,
    setup: &CrossProcessSetup,
    spawn: &mut dyn FnMut(&Path, &ProducerPlan) -> std::io::Result<Child>,
) -> Result<CrossProcessRun> {
    let strategy = setup.strategy.resolve(device);
    strategy.check(device)?;
    if !matches!(strategy, Strategy::Cpu | Strategy::ZeroCopy | Strategy::PinnedAsync) {
        return Err(
            Error::invalid("strategy", format!("{strategy}: give cpu, zero-copy or pinned-async")).into()
        );
    }
    if setup.latency_frames == 0 || setup.slots == 0 || setup.frames == 0 {
        return Err(Error::invalid(
            "cross-process bench",
            "give at least one slot, one timed frame and one latency frame",
        )
        .into());
    }
    if setup.producer_timeout.is_zero() {
        return Err(Error::invalid(
            "cross-process bench",
            "a producer timeout of 0: give the producer some time for each frame (60 s is ample)",
        )
        .into());
    }
    if setup.format.frame_bytes() < 8 {
        return Err(
            Error::invalid("frame format", "frames of fewer than 8 bytes cannot carry their index").into()
        );
    }
    let stage = GaussianStage::new(setup.format, kernel)?.streamed();
    let frame_bytes = setup.format.frame_bytes();
    let content = FrameContent::new(setup.seed, frame_bytes);
    let sample = Sample {
        slots: setup.slots,
        timed: setup.frames,
        one_at_a_time: setup.latency_frames,
        checked: setup.checked.min(setup.latency_frames),
        producer_timeout: setup.producer_timeout,
    };
    let streamed =
        (setup.slots as u64).checked_add(setup.frames).ok_or_else(|| Error::invalid("frames", "too many"))?;
    streamed.checked_add(setup.latency_frames).ok_or_else(|| Error::invalid("latency frames", "too many"))?;
    let plan = ProducerPlan {
        frame_bytes,
        slots: setup.slots,
        streamed,
        one_at_a_time: setup.latency_frames,
        seed: setup.seed,
    };

    let cross_process = measure_shared(device, strategy, &stage, &content, &sample, &plan, spawn)?;
    let single_process = single::measure(device, strategy, stage, &content, &sample)?;
    Ok(CrossProcessRun {
        strategy,
        width: setup.format.width(),
        height: setup.format.height(),
        frame_bytes,
        slots: setup.slots,
        frames: setup.frames,
        latency_frames: setup.latency_frames,
        checked_outputs: setup.slots as u64 + sample.checked,
        seed: setup.seed,
        producer_work: format!(
            "a base frame into each slot on its first use, then a {}-byte stamp per frame",
            content.stamp_len()
        ),
        throughput_ratio: cross_process.frames_per_s / single_process.frames_per_s,
        latency_difference_us: cross_process.latency_us.median - single_process.latency_us.median,
        cross_process,
        single_process,
    })
}

/// The cross-process half of [`measure`].
fn measure_shared(
    device: &Device,
    strategy: Strategy,
    stage: &GaussianStage,
    content: &FrameContent,
    sample: &Sample,
    plan: &ProducerPlan,
    spawn: &mut dyn FnMut(&Path, &ProducerPlan) -> std::io::Result<Child>,
) -> Result<RingFigures> {
    use std::io::{Read, Write};

    let dir = std::env::temp_dir().join(format!("hetmem-cross-process-{}-{}", std::process::id(), plan.seed));
    std::fs::create_dir_all(&dir)
        .map_err(|source| Error::Io { context: format!("creating {}", dir.display()), source })?;
    let socket_path = dir.join("ring.sock");
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path)
        .map_err(|source| Error::Io { context: format!("binding {}", socket_path.display()), source })?;
    listener.set_nonblocking(true).map_err(control_error("making the listener non-blocking"))?;
    let child = spawn(&socket_path, plan)
        .map_err(|source| Error::Io { context: "starting the producer".into(), source });
    let mut producer = ProducerProcess(Some(child?));
    let connected = (|| {
        let ring_socket = accept(&listener, &mut producer, "ring's socket")?;
        let control = accept(&listener, &mut producer, "control socket")?;
        let ring =
            RingConsumer::connect_within(device, &ring_socket, Default::default(), Some(CONNECT_TIMEOUT))?;
        Ok::<_, BenchError>((ring_socket, control, ring))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (_ring_socket, mut control, mut ring) = connected?;
    // The producer's own word on the ring's shape is checked, not trusted: the lanes hold a
    // frame per slot, and the stage reads a whole frame.
    if (ring.frame_bytes(), ring.slots()) != (plan.frame_bytes, plan.slots) {
        return Err(Error::invalid(
            "producer process",
            format!(
                "it (pid {}) made a ring of {} slots of {} bytes where {} slots of {} bytes were agreed",
                ring.producer_pid(),
                ring.slots(),
                ring.frame_bytes(),
                plan.slots,
                plan.frame_bytes
            ),
        )
        .into());
    }
    let timeout = sample.producer_timeout;
    for set in [UnixStream::set_read_timeout, UnixStream::set_write_timeout] {
        set(&control, Some(timeout)).map_err(control_error("bounding its waits"))?;
    }

    let mut lanes: Vec<Lane<GaussianStage>> =
        (0..sample.slots).map(|_| Lane::new(device, strategy, stage)).collect::<Result<_>>()?;
    let mut wanted = vec![0u8; stage.outputs()[0].bytes()];
    let slots = sample.slots as u64;

    lanes.iter_mut().for_each(|lane| lane.poison(0xA5));
    lanes::stream(&mut ring, &mut lanes, stage, content, 0..slots, timeout, |index, lane| {
        check_output(stage, content, index, lane.output(), &mut wanted, "the shared ring")
    })?;

    let timed = slots..slots + sample.timed;
    let start = Instant::now();
    lanes::stream(&mut ring, &mut lanes, stage, content, timed.clone(), timeout, |_, _| Ok(()))?;
    let wall_s = start.elapsed().as_secs_f64();

    let (mut stamp, mut arrived) = (vec![0u8; content.stamp_len()], vec![0u8; content.stamp_len()]);
    let mut latency_us = Vec::new();
    let lane = &mut lanes[0];
    for (nth, index) in (timed.end..timed.end + sample.one_at_a_time).enumerate() {
        let checking = (nth as u64) < sample.checked;
        if checking {
            lane.poison(0xA5);
        }
        // A producer gone or done fails the ask; the ring says what became of it better.
        let asked = control.write_all(&[1]);
        let frame = lanes::take_frame(&mut ring, content, index, timeout, &mut stamp, &mut arrived)?;
        asked.map_err(control_error("asking for the next frame"))?;
        lane.submit(index, frame, stage)?;
        lane.finish()?;
        let ready = monotonic_ns();
        let mut published = [0u8; 8];
        control.read_exact(&mut published).map_err(control_error("reading a publish time"))?;
        latency_us.push(ready.saturating_sub(u64::from_le_bytes(published)) as f64 / 1e3);
        if checking {
            check_output(stage, content, index, lane.output(), &mut wanted, "the shared ring")?;
        }
    }
    match ring.next_frame_within(Some(timeout))? {
        Some(None) => {}
        Some(Some(_)) => {
            return Err(Error::invalid("shared ring", "the producer sent more frames than planned").into());
        }
        None => {
            return Err(Error::invalid(
                "producer process",
                format!("it sent every frame but did not close the ring within {timeout:?}"),
            )
            .into());
        }
    }
    drop(ring);
    producer.wait(timeout)?;
    Ok(figures(sample.timed, wall_s, &latency_us))
}
