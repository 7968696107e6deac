//! Soak: hetmem under load for minutes in one process, sampling every 10 s what would grow if
//! something leaked: host memory (RSS), GPU memory in use, open file descriptors and threads.
//! After a warm-up each must stay within 1% of its first sample after the warm-up; the run
//! prints one JSON object per sample and a summary, and exits 1 when anything grew or any frame
//! or load came out wrong.
//!
//! ```text
//! (any mode) --period=SECONDS    sample every SECONDS (default 10)
//! soak ring   [SECONDS]          1080p RGB frames through one pinned-async ring (default 570 s:
//!                                about 4 million frames at the link's rate), a sampled frame in
//!                                1,000 checked against the CPU
//! soak                           every mode briefly (20 s, 20 s, 20 loads of 256 MiB)
//! soak load   FILE [TIMES]       FILE (made of fresh random bytes if absent, 4 GiB) into device
//!                                memory TIMES times (default 200), a new stream each time,
//!                                staged and mapped windows in turn, each load's checksum on the
//!                                GPU compared with the file's
//! soak faults [SECONDS] [FILE]   faults injected at random points, transient and sticky: rings
//!                                built with allocation and registration faults, frames with
//!                                launch and copy faults, loads with copy, allocation and
//!                                registration faults; every frame written once and right, or
//!                                reported failed; every load whole and right, or an error
//! ```
//!
//! Needs the `testing` feature of hetmem for `faults` (the examples get it through
//! hetmem-bench's dev-dependencies). Failed fence waits are not injected: a ring whose wait
//! fails gives the slot up on purpose (the GPU may still use it), which a soak would count as
//! a leak.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hetmem::backend::cuda::CudaDevice;
use hetmem::data::{FileRange, FileStream, LoadMethod, StreamOptions};
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout, gaussian_cpu};
use hetmem::ops::{Checksum, checksum, checksum_cpu};
use hetmem::testing::faults::{self, FaultKind, FaultPoint};
use hetmem::{Device, Error, FrameRing, HostBuf, PinOptions, Queue, RingOptions, Strategy};
use rayon::prelude::*;

/// How often the sampler looks, unless `--period=SECONDS` says otherwise.
static PERIOD_S: AtomicU64 = AtomicU64::new(10);
/// How much a measure may move after the warm-up.
const TOLERANCE: f64 = 0.01;
/// Frames in a thousand whose output the ring soak compares with the CPU's.
const CHECK_EVERY: u64 = 1000;

type Failure = Box<dyn std::error::Error>;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|arg| arg.starts_with("--period=")) {
        let period = args.remove(at)["--period=".len()..].parse().unwrap_or(10);
        PERIOD_S.store(period, Ordering::Relaxed);
    }
    let outcome = match args.first().map(String::as_str) {
        Some("ring") => ring_soak(seconds(args.get(1), 570)),
        Some("load") => match args.get(1) {
            Some(file) => {
                load_soak(Path::new(file), args.get(2).map_or(Ok(200), |n| n.parse()).unwrap_or(200), 4 << 30)
            }
            None => Err("soak load FILE [TIMES]: name the file (made if absent)".into()),
        },
        Some("faults") => fault_soak(seconds(args.get(1), 240), args.get(2).map(PathBuf::from)),
        None => quick(),
        Some(_) => {
            Err("usage: soak ring [SECONDS] | soak load FILE [TIMES] | soak faults [SECONDS] [FILE]".into())
        }
    };
    if let Err(error) = outcome {
        eprintln!("soak failed: {error}");
        std::process::exit(1);
    }
}

/// Every mode briefly, sampling every 2 s: a check that the soak itself works (the GPU
/// bundle's runner runs every example without arguments).
fn quick() -> Result<(), Failure> {
    PERIOD_S.store(2, Ordering::Relaxed);
    ring_soak(Duration::from_secs(20))?;
    fault_soak(Duration::from_secs(20), None)?;
    let file = std::env::temp_dir().join(format!("hetmem-soak-quick-{}.bin", std::process::id()));
    let loaded = load_soak(&file, 20, 256 << 20);
    std::fs::remove_file(&file)?;
    loaded
}

fn seconds(arg: Option<&String>, default: u64) -> Duration {
    Duration::from_secs(arg.and_then(|text| text.parse().ok()).unwrap_or(default))
}

/// The best device, and its CUDA side (none on the CPU backend, where the soak runs the CPU
/// strategy and reports no GPU memory).
fn open() -> Result<(Device, Option<CudaDevice>), Failure> {
    let device = Device::open_best()?;
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let cuda = device.as_cuda().cloned();
    Ok((device, cuda))
}

/// What the sampler reads, once.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Sample {
    seconds: f64,
    rss_bytes: u64,
    gpu_used_bytes: u64,
    open_fds: u64,
    threads: u64,
    /// Frames or loads done so far.
    progress: u64,
}

impl Sample {
    /// What must not grow, by name.
    const MEASURES: [&str; 4] = ["rss_bytes", "gpu_used_bytes", "open_fds", "threads"];

    fn measures(&self) -> [u64; 4] {
        [self.rss_bytes, self.gpu_used_bytes, self.open_fds, self.threads]
    }
}

/// Reads this process's RSS and threads (`/proc/self/status`), its open descriptors
/// (`/proc/self/fd`) and the GPU's memory in use.
fn sample(start: Instant, cuda: Option<&CudaDevice>, progress: u64) -> Result<Sample, Failure> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64, Failure> {
        let line =
            status.lines().find(|line| line.starts_with(name)).ok_or(format!("no {name} in status"))?;
        Ok(line[name.len()..].trim().trim_end_matches(" kB").trim().parse()?)
    };
    let (free, total) = cuda.map(CudaDevice::memory_info).transpose()?.unwrap_or((0, 0));
    Ok(Sample {
        seconds: start.elapsed().as_secs_f64(),
        rss_bytes: field("VmRSS:")? * 1024,
        gpu_used_bytes: total - free,
        open_fds: std::fs::read_dir("/proc/self/fd")?.count() as u64,
        threads: field("Threads:")?,
        progress,
    })
}

/// Takes a [`Sample`] at the first checkpoint after each period: the work calls
/// [`Sampler::checkpoint`] where it is between steps (between loads, after a frame), so every
/// sample sees the process in the same state.
struct Sampler<'a> {
    cuda: Option<&'a CudaDevice>,
    start: Instant,
    period: Duration,
    next: Instant,
    samples: Vec<Sample>,
}

impl<'a> Sampler<'a> {
    /// A sampler with the period `--period` set (10 s by default).
    fn new(cuda: Option<&'a CudaDevice>) -> Sampler<'a> {
        Sampler::every(cuda, Duration::from_secs(PERIOD_S.load(Ordering::Relaxed)))
    }

    /// A sampler that samples at the first checkpoint after each `period` (at every
    /// checkpoint for a zero period).
    fn every(cuda: Option<&'a CudaDevice>, period: Duration) -> Sampler<'a> {
        let start = Instant::now();
        Sampler { cuda, start, period, next: start, samples: Vec::new() }
    }

    /// Samples if a period has passed since the last sample.
    fn checkpoint(&mut self, progress: u64) -> Result<(), Failure> {
        if Instant::now() < self.next {
            return Ok(());
        }
        self.next += self.period;
        let now = sample(self.start, self.cuda, progress)?;
        println!("{}", serde_json::json!({ "sample": now }));
        self.samples.push(now);
        Ok(())
    }

    /// Judges the samples taken after `warm_up` (see [`judge`]).
    fn held(&self, warm_up: Duration) -> bool {
        judge(&self.samples, warm_up)
    }
}

/// The warm-up of a soak of `duration`: a minute, or a fifth of a shorter run.
fn warm_up(duration: Duration) -> Duration {
    (duration / 5).min(Duration::from_secs(60))
}

/// Prints how far each measure moved after the warm-up; true when none moved more than
/// [`TOLERANCE`].
fn judge(samples: &[Sample], warm_up: Duration) -> bool {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.seconds >= warm_up.as_secs_f64()).collect();
    if after.len() < 3 {
        println!(
            "{}",
            serde_json::json!({ "judged": false, "why": "fewer than 3 samples after the warm-up" })
        );
        return false;
    }
    let mut held = true;
    let mut verdicts = serde_json::Map::new();
    for (at, name) in Sample::MEASURES.into_iter().enumerate() {
        let base = after[0].measures()[at] as f64;
        let values: Vec<f64> = after.iter().map(|s| s.measures()[at] as f64).collect();
        let worst = values.iter().map(|v| (v - base).abs() / base.max(1.0)).fold(0.0, f64::max);
        let last = *values.last().expect("three samples");
        let within = worst <= TOLERANCE;
        held &= within;
        verdicts.insert(
            name.to_string(),
            serde_json::json!({
                "after_warm_up": base, "last": last,
                "min": values.iter().copied().fold(f64::INFINITY, f64::min),
                "max": values.iter().copied().fold(0.0, f64::max),
                "worst_relative_change": worst, "within_1_percent": within,
            }),
        );
    }
    println!(
        "{}",
        serde_json::json!({ "judged": true, "samples_after_warm_up": after.len(),
                            "warm_up_s": warm_up.as_secs_f64(), "held": held, "measures": verdicts })
    );
    held
}

/// The soak's frames: 1080p RGB and the 5x5 blur.
fn frame_setup() -> Result<(FrameFormat, Gaussian), Failure> {
    Ok((FrameFormat::new(1920, 1080, PixelLayout::Rgb)?, Gaussian::new(None, None, Border::Reflect101)?))
}

/// Frames of fresh random bytes, and the CPU's blur of each.
struct Frames {
    inputs: Vec<Vec<u8>>,
    wanted: Vec<Vec<u8>>,
}

/// `count` frames of fresh random bytes and the CPU's blur of each.
fn frames_and_results(format: &FrameFormat, kernel: &Gaussian, count: usize) -> Result<Frames, Failure> {
    let mut rng = fastrand::Rng::new();
    let inputs: Vec<Vec<u8>> = (0..count)
        .map(|_| {
            let mut frame = vec![0u8; format.frame_bytes()];
            rng.fill(&mut frame);
            frame
        })
        .collect();
    let wanted = inputs
        .iter()
        .map(|input| {
            let mut want = vec![0u8; input.len()];
            gaussian_cpu(format, kernel, input, &mut want).map(|()| want)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Frames { inputs, wanted })
}

fn ring_soak(duration: Duration) -> Result<(), Failure> {
    let (device, cuda) = open()?;
    let (format, kernel) = frame_setup()?;
    let strategy = if cuda.is_some() { Strategy::PinnedAsync } else { Strategy::Cpu };
    let ring = FrameRing::new(&device, strategy, format, &kernel, RingOptions::default())?;
    let slots = ring.slots() as u64;
    let Frames { inputs, wanted } = frames_and_results(&format, &kernel, ring.slots())?;
    ring.fill_outputs(0xA5)?;
    // Each slot keeps the input written on its first use (frame k goes to slot k mod slots).
    for input in &inputs {
        let mut slot = ring.next_input()?;
        slot.copy_from_slice(input);
        slot.submit();
    }
    let mut sampler = Sampler::new(cuda.as_ref());
    let (mut frames, mut checked) = (0u64, 0u64);
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<(), Failure> {
        let producer = scope.spawn(|| -> Result<(), Error> {
            loop {
                ring.next_input()?.submit();
            }
        });
        let consumed = (|| -> Result<(), Failure> {
            while start.elapsed() < duration {
                let output = ring.next_output()?;
                let index = output.index();
                if index.is_multiple_of(CHECK_EVERY) {
                    if *output != wanted[(index % slots) as usize][..] {
                        return Err(format!("frame {index} differs from the CPU's blur").into());
                    }
                    checked += 1;
                }
                drop(output);
                frames += 1;
                sampler.checkpoint(frames)?;
            }
            Ok(())
        })();
        // The producer stops at its next slot; the frames it submitted before drain out.
        ring.close();
        while ring.next_output().is_ok() {}
        match producer.join().expect("the producer does not panic") {
            Ok(()) | Err(Error::RingClosed) => {}
            Err(error) => return Err(error.into()),
        }
        consumed
    })?;
    let held = sampler.held(warm_up(duration));
    println!(
        "{}",
        serde_json::json!({ "soak": "ring", "strategy": ring.strategy(), "frames": frames,
                            "frames_checked": checked,
                            "seconds": start.elapsed().as_secs_f64(),
                            "frames_per_s": frames as f64 / start.elapsed().as_secs_f64(), "held": held })
    );
    if held {
        Ok(())
    } else {
        Err("the soak did not hold: a measure moved more than 1% after the warm-up, or too few samples (see the judgement above)".into())
    }
}

/// Makes `path` a file of `bytes` fresh random bytes unless it exists; returns its checksum.
fn test_file(path: &Path, bytes: u64) -> Result<Checksum, Failure> {
    use std::os::unix::fs::FileExt;
    const PART: u64 = 64 << 20;
    if !path.exists() {
        let seed = fastrand::u64(..);
        let file = std::fs::File::create(path)?;
        file.set_len(bytes)?;
        (0..bytes.div_ceil(PART)).into_par_iter().try_for_each(|part| {
            let offset = part * PART;
            let mut chunk = vec![0u8; (bytes - offset).min(PART) as usize];
            fastrand::Rng::with_seed(seed ^ part).fill(&mut chunk);
            file.write_all_at(&chunk, offset)
        })?;
    }
    let file = std::fs::File::open(path)?;
    let bytes = file.metadata()?.len();
    (0..bytes.div_ceil(PART))
        .into_par_iter()
        .map(|part| {
            let offset = part * PART;
            let mut chunk = vec![0u8; (bytes - offset).min(PART) as usize];
            file.read_exact_at(&mut chunk, offset).map(|()| checksum_cpu(&chunk, offset))
        })
        .try_reduce(Checksum::default, |a, b| Ok(a.combine(b)))
        .map_err(Into::into)
}

/// The checksum of `buffer` (device memory), by the GPU.
fn device_checksum(
    queue: &Queue,
    device: &Device,
    buffer: hetmem::DeviceBuf<u8>,
) -> Result<(Checksum, hetmem::DeviceBuf<u8>), Failure> {
    let len = buffer.len();
    let shared = queue.share(buffer);
    let mut sums = queue.lend(HostBuf::<u64>::pinned(device, 2, PinOptions::default())?);
    checksum(queue, &shared, 0, len, 0, &mut sums, 0)?;
    let sums = sums.reclaim()?;
    Ok((Checksum { sum: sums.as_slice()[0], weighted: sums.as_slice()[1] }, shared.reclaim()?))
}

/// One load of `range` by `method` with a new stream, checked; the loaded buffer is freed.
fn load_once(
    device: &Device,
    queue: &Queue,
    range: &FileRange,
    method: LoadMethod,
    want: Checksum,
) -> Result<(), Failure> {
    let options = StreamOptions { method, ..StreamOptions::default() };
    // SAFETY: the soak's files are made by it and not changed while it runs.
    let mut stream = unsafe { FileStream::new(device, queue, options)?.allow_windows() };
    let (buffer, _report) = stream.load(std::slice::from_ref(range), &|_| {})?;
    let (got, buffer) = device_checksum(queue, device, buffer)?;
    drop(buffer);
    if got != want {
        return Err(
            format!("a {} load of {} differs from the file", method.name(), range.path.display()).into()
        );
    }
    Ok(())
}

fn load_soak(path: &Path, times: u64, bytes: u64) -> Result<(), Failure> {
    let (device, cuda) = open()?;
    let queue = Queue::new(&device)?;
    let want = test_file(path, bytes)?;
    let range = FileRange::whole(path)?;
    let start = Instant::now();
    // After every load: each is a quiet point, and a few hundred samples are cheap.
    let mut sampler = Sampler::every(cuda.as_ref(), Duration::ZERO);
    // The first tenth of the loads warm up (the page cache, the driver's pools).
    let mut warm_up = Duration::ZERO;
    for index in 0..times {
        let method = if index % 2 == 0 { LoadMethod::Staged } else { LoadMethod::Windows };
        load_once(&device, &queue, &range, method, want)?;
        if index + 1 == (times / 10).max(1) {
            warm_up = sampler.start.elapsed();
        }
        sampler.checkpoint(index + 1)?;
    }
    let held = sampler.held(warm_up);
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({ "soak": "load", "file_bytes": range.len, "loads": times, "seconds": seconds,
                            "gb_per_s_with_setup_and_check": (range.len * times) as f64 / seconds / 1e9,
                            "held": held })
    );
    if held {
        Ok(())
    } else {
        Err("the soak did not hold: a measure moved more than 1% after the warm-up, or too few samples (see the judgement above)".into())
    }
}

/// A file the soak made, removed when it ends (also on an error).
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// How the frames of a faulted run came out.
#[derive(Debug, Default, serde::Serialize)]
struct Tally {
    rings: u64,
    rings_refused: u64,
    frames_submitted: u64,
    frames_right: u64,
    frames_failed_transient: u64,
    frames_failed_sticky: u64,
    loads_right: u64,
    loads_failed: u64,
    faults_fired: u64,
}

const FRAME_FAULTS: [(FaultPoint, FaultKind); 4] = [
    (FaultPoint::Launch, FaultKind::Transient),
    (FaultPoint::Launch, FaultKind::Sticky),
    (FaultPoint::Copy, FaultKind::Transient),
    (FaultPoint::Copy, FaultKind::Sticky),
];

fn fault_soak(duration: Duration, file: Option<PathBuf>) -> Result<(), Failure> {
    let (device, cuda) = open()?;
    let queue = Queue::new(&device)?;
    let (format, kernel) = frame_setup()?;
    let Frames { inputs, wanted } = frames_and_results(&format, &kernel, 8)?;
    // A file of its own unless one is named, removed at the end.
    let made = file.is_none();
    let path = file.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("hetmem-soak-faults-{}.bin", std::process::id()))
    });
    let _removed = made.then(|| RemovedOnDrop(path.clone()));
    let want = test_file(&path, 256 << 20)?;
    let range = FileRange::whole(&path)?;
    let strategies: &[Strategy] = if cuda.is_some() {
        &[Strategy::PinnedAsync, Strategy::ZeroCopy, Strategy::Hybrid]
    } else {
        &[Strategy::Cpu]
    };
    let mut rng = fastrand::Rng::new();
    let mut tally = Tally::default();
    let start = Instant::now();
    // After every cycle (a ring, its frames and two loads): each ends at a quiet point.
    let mut sampler = Sampler::every(cuda.as_ref(), Duration::ZERO);
    let mut cycles = 0;
    while start.elapsed() < duration {
        let strategy = strategies[tally.rings as usize % strategies.len()];
        tally.rings += 1;
        faults::clear();
        // Building: a shortage at one of the first allocations or registrations.
        let point = if rng.bool() { FaultPoint::Allocation } else { FaultPoint::Registration };
        faults::arm(point, rng.u64(1..=12), FaultKind::Transient);
        let options = RingOptions { slots: 4, ..RingOptions::default() };
        let ring = match FrameRing::new(&device, strategy, format, &kernel, options) {
            Ok(ring) => ring,
            Err(error) if error.is_transient() => {
                tally.rings_refused += 1;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        tally.faults_fired += faults::fired().len() as u64;
        faults::clear();
        stream_with_faults(&ring, &inputs, &wanted, &mut rng, &mut tally)?;
        tally.faults_fired += faults::fired().len() as u64;
        faults::clear();
        drop(ring);
        // A load with a fault somewhere in it, then one without: the first is whole and right
        // or an error, the second right.
        let (point, nth) = match rng.u8(0..3) {
            0 => (FaultPoint::Copy, rng.u64(1..=32)),
            1 => (FaultPoint::Allocation, rng.u64(1..=4)),
            _ => (FaultPoint::Registration, rng.u64(1..=4)),
        };
        let kind = if rng.bool() { FaultKind::Transient } else { FaultKind::Sticky };
        faults::arm(point, nth, kind);
        let method = if rng.bool() { LoadMethod::Staged } else { LoadMethod::Windows };
        match load_once(&device, &queue, &range, method, want) {
            Ok(()) => tally.loads_right += 1,
            Err(error) if error.downcast_ref::<Error>().is_some() => tally.loads_failed += 1,
            Err(error) => return Err(error),
        }
        tally.faults_fired += faults::fired().len() as u64;
        faults::clear();
        load_once(&device, &queue, &range, LoadMethod::Staged, want)?;
        tally.loads_right += 1;
        cycles += 1;
        sampler.checkpoint(cycles)?;
    }
    let held = sampler.held(warm_up(duration));
    println!(
        "{}",
        serde_json::json!({ "soak": "faults", "seconds": start.elapsed().as_secs_f64(), "tally": tally, "held": held })
    );
    if held {
        Ok(())
    } else {
        Err("the soak did not hold: a measure moved more than 1% after the warm-up, or too few samples (see the judgement above)".into())
    }
}

/// Streams 400 frames through `ring`, up to its slots in flight, with a frame fault armed
/// every 40 frames; every frame must come out once, in order, right or reported failed.
fn stream_with_faults(
    ring: &FrameRing<GaussianStage>,
    inputs: &[Vec<u8>],
    wanted: &[Vec<u8>],
    rng: &mut fastrand::Rng,
    tally: &mut Tally,
) -> Result<(), Failure> {
    const FRAMES: u64 = 400;
    let first = ring.submitted();
    let mut next_out = first;
    let mut in_flight = std::collections::VecDeque::new();
    let mut drain_one = |in_flight: &mut std::collections::VecDeque<usize>,
                         tally: &mut Tally|
     -> Result<(), Failure> {
        let input = in_flight.pop_front().expect("a frame in flight");
        match ring.next_output() {
            Ok(output) => {
                if output.index() != next_out {
                    return Err(format!("frame {} came out where {next_out} was due", output.index()).into());
                }
                if *output != wanted[input][..] {
                    return Err(format!("frame {next_out} came out wrong").into());
                }
                tally.frames_right += 1;
            }
            Err(Error::FrameFailed { index, source }) => {
                if index != next_out {
                    return Err(format!("frame {index} failed where {next_out} was due").into());
                }
                if !source.to_string().contains("injected fault") {
                    return Err(format!("frame {index} failed of something not injected: {source}").into());
                }
                if source.is_sticky() {
                    tally.frames_failed_sticky += 1
                } else {
                    tally.frames_failed_transient += 1
                }
            }
            Err(other) => return Err(format!("frame {next_out}: {other}").into()),
        }
        next_out += 1;
        Ok(())
    };
    for frame in 0..FRAMES {
        if frame % 40 == 20 {
            let (point, kind) = FRAME_FAULTS[rng.usize(..FRAME_FAULTS.len())];
            faults::arm(point, rng.u64(1..=8), kind);
        }
        if in_flight.len() == ring.slots() {
            drain_one(&mut in_flight, tally)?;
        }
        let input = rng.usize(..inputs.len());
        let mut slot = ring.next_input()?;
        slot.copy_from_slice(&inputs[input]);
        slot.submit();
        in_flight.push_back(input);
        tally.frames_submitted += 1;
    }
    while !in_flight.is_empty() {
        drain_one(&mut in_flight, tally)?;
    }
    debug_assert_eq!(next_out, first + FRAMES);
    Ok(())
}
