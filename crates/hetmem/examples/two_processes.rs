//! Two processes, one ring of shared memory: a capture-like producer process writes 1080p RGB
//! frames into the slots of a shared ring, and this process blurs them (5x5 Gaussian) where
//! they lie: on the GPU when there is one, the kernel reading each slot in place over the link
//! (zero-copy, no copy between the processes or to the device), else on the CPU. The first
//! `--check` frames' blurs are compared with the CPU blur of the same frame, and the
//! producer's frames with what it wrote; frames per second are printed at the end.
//!
//! ```text
//! cargo run --release -p hetmem --example two_processes -- --frames 600 --slots 4 --check 5
//! ```
//! The producer is this program again (`--producer SOCKET`), started by the consumer; the
//! socket is a Unix socket in a fresh temporary directory.
//!
//! Its frames per second are the producer's `capture()`, one frame at a time. What the ring
//! itself carries, pipelined, against the single-process ring: hetmem-bench's example
//! `two_process_ring`.

use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;
use std::time::Instant;

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout, gaussian_cpu};
use hetmem::pipeline::shared_ring::{RingConsumer, RingProducer};
use hetmem::placement::Where;
use hetmem::stage::Stage;
use hetmem::{Device, HostBuf, PinOptions, Queue, Strategy};

const WIDTH: usize = 1920;
const HEIGHT: usize = 1080;

/// What a camera might deliver: a gradient that moves with the frame index, and noise seeded
/// by it, so the consumer can regenerate any frame to check it arrived intact.
fn capture(index: u64, frame: &mut [u8]) {
    let mut rng = fastrand::Rng::with_seed(index.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
    rng.fill(frame);
    for (row, line) in frame.chunks_exact_mut(WIDTH * 3).enumerate() {
        let shade = (row as u64 + index) as u8;
        line.iter_mut().step_by(7).for_each(|byte| *byte = byte.wrapping_add(shade));
    }
}

fn produce(socket_path: &str, frames: u64, slots: usize) -> Result<(), Box<dyn std::error::Error>> {
    let socket = UnixStream::connect(socket_path)?;
    // The producer's CPU writes the slots; nothing to register with a GPU here.
    let mut ring =
        RingProducer::create(&Device::cpu(), &socket, WIDTH * HEIGHT * 3, slots, Default::default())?;
    // Captured here, then copied into the slot: the consumer's process maps the slot too, so
    // safe code writes it only through copies (a `&mut [u8]` of it takes `unsafe`).
    let mut captured = vec![0u8; ring.frame_bytes()];
    for index in 0..frames {
        let mut slot = ring.next_slot()?;
        capture(index, &mut captured);
        slot.write_at(0, &captured)?;
        slot.publish();
    }
    ring.close();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut frames, mut slots, mut check, mut producer) = (600u64, 4usize, 5u64, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--frames" => frames = value()?.parse()?,
            "--slots" => slots = value()?.parse()?,
            "--check" => check = value()?.parse()?,
            "--producer" => producer = Some(value()?),
            other => {
                return Err(format!("unknown argument {other}: give --frames N, --slots N, --check N").into());
            }
        }
    }
    if let Some(socket_path) = producer {
        return produce(&socket_path, frames, slots);
    }

    let dir = tempfile::tempdir()?;
    let socket_path = dir.path().join("ring.sock");
    let listener = UnixListener::bind(&socket_path)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--producer", socket_path.to_str().ok_or("a temporary path that is not UTF-8")?])
        .args(["--frames", &frames.to_string(), "--slots", &slots.to_string()])
        .spawn()?;
    let (socket, _) = listener.accept()?;

    let device = Device::open_best()?;
    let format = FrameFormat::new(WIDTH, HEIGHT, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    let stage = GaussianStage::new(format, &kernel)?;
    let queue = Queue::new(&device)?;
    let mut prepared = stage.prepare(&queue, Strategy::ZeroCopy, &[Where::Mapped])?;
    let mut ring = RingConsumer::connect(&device, &socket, Default::default())?;
    let gpu = device.gpu_ordinal().is_some();
    println!(
        "consumer on {} ({}), producer pid {}, {slots} slots of {} bytes",
        device.name(),
        if gpu { "the GPU reads each slot in place" } else { "CPU backend" },
        ring.producer_pid(),
        ring.frame_bytes()
    );

    let mut output = HostBuf::<u8>::pinned(&device, format.frame_bytes(), PinOptions::default())?;
    let (mut expected, mut reference) = (vec![0u8; format.frame_bytes()], vec![0u8; format.frame_bytes()]);
    let mut received = 0u64;
    let start = Instant::now();
    while let Some(frame) = ring.next_frame()? {
        let index = frame.sequence();
        let checking = index < check;
        if checking {
            output.as_mut_slice().fill(0xA5);
        }
        let frame = if gpu {
            let input = queue.share(frame);
            let mut lent = queue.lend(output);
            stage.queue(
                &mut prepared,
                &queue,
                std::slice::from_ref(&input),
                std::slice::from_mut(&mut lent),
            )?;
            output = lent.reclaim()?;
            input.reclaim()?
        } else {
            // The CPU path reads a copy; the GPU path above reads the slot in place.
            stage.run_cpu(&[&frame.to_vec()], &mut [output.as_mut_slice()])?;
            frame
        };
        if checking {
            capture(index, &mut expected);
            let arrived = frame.to_vec();
            if arrived != expected {
                return Err(format!("frame {index} did not arrive as the producer wrote it").into());
            }
            gaussian_cpu(&format, &kernel, &arrived, &mut reference)?;
            if output.as_slice() != &reference[..] {
                return Err(format!("frame {index}: the blur differs from the CPU blur").into());
            }
        }
        received += 1;
        // Dropping the frame frees its slot for the producer.
    }
    let seconds = start.elapsed().as_secs_f64();
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("the producer failed: {status}").into());
    }
    if received != frames {
        return Err(format!("{received} frames arrived of {frames}").into());
    }
    println!(
        "{received} frames in {seconds:.3} s: {:.1} frames/s ({:.2} GB/s of frames); the first {} checked \
         against the CPU blur",
        received as f64 / seconds,
        (received as f64 * format.frame_bytes() as f64) / seconds / 1e9,
        check.min(received)
    );
    Ok(())
}
