//! A Y4M stream through a [`FrameRing`] by zero-copy: each frame is read straight into the
//! ring's next input slot (mapped host memory, which the GPU's blur reads over the bus), and
//! each result is written straight from the ring's output memory to a Y4M file, in order,
//! with a checksum of the results.
//!
//! Run with `cargo run -p hetmem-media --example y4m_ring [IN.y4m [OUT.y4m]]`. With no input, a
//! small 4:2:0 stream of fresh random pixels is made in a temporary folder. On the CPU backend
//! (no GPU, or `HETMEM_BACKEND=cpu`) zero-copy cannot run and the CPU strategy filters instead:
//! the same result.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::PathBuf;

use hetmem::ops::gaussian::{Border, Gaussian, GaussianStage};
use hetmem::{Device, FrameRing, RingOptions, Strategy};
use hetmem_media::{Budget, Endpoint, FrameSink, Input, Start, frames, y4m};

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let input = args.next().map_or_else(|| generate(&dir.path().join("in.y4m")), Ok)?;
    let output = args.next().unwrap_or_else(|| dir.path().join("out.y4m"));

    let device = Device::open_best()?;
    let strategy = match Strategy::ZeroCopy.check(&device) {
        Ok(()) => Strategy::ZeroCopy,
        Err(why) => {
            println!("{why}: filtering by the cpu strategy instead (the same result)");
            Strategy::Cpu
        }
    };
    let name = input.display().to_string();
    let mut reader =
        Input::open(&Endpoint::File(input), &name, hetmem_media::default_threads())?.into_frames();
    let video = y4m::read_header(&mut reader, &name)?;
    let (format, packing) = (video.format, video.container.packing());
    // The size the header declares, checked before the ring's slots are allocated.
    let slot_bytes = 2 * RingOptions::default().slots as u64 * format.frame_bytes() as u64;
    Budget::default().check(
        &name,
        "its Y4M header",
        format.width() as u64,
        format.height() as u64,
        slot_bytes,
    )?;
    let kernel = Gaussian::new(Some(2), None, Border::Reflect101)?;
    let stage = GaussianStage::new(format, &kernel)?.streamed();
    let ring = FrameRing::with_stage(&device, strategy, stage, RingOptions::default())?;
    let mut out = FrameSink::file(std::fs::File::create(&output)?, hetmem_media::default_threads());
    out.write_all(video.container.header())?;

    // One thread: up to a ring's worth of frames in flight, so the blur of one overlaps the
    // reading of the next; each result is written as it comes out, in order.
    let (mut lines, mut line) = (VecDeque::new(), Vec::new());
    let (mut scratch, mut read_scratch) = (Vec::new(), Vec::new());
    let (mut frames, mut checksum) = (0, 0xcbf2_9ce4_8422_2325_u64);
    let mut write_next = |lines: &mut VecDeque<Vec<u8>>| -> anyhow::Result<()> {
        let result = ring.next_output()?;
        out.write_all(&lines.pop_front().expect("a line per frame in flight"))?;
        packing.write(&mut out, &result, &mut scratch)?;
        // FNV-1a over every filtered byte.
        checksum =
            result.iter().fold(checksum, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        frames += 1;
        Ok(())
    };
    for index in 0.. {
        match frames::read_start(&video.container, &mut reader, &mut line, index, &name, "")? {
            Start::Frame => {}
            Start::End => break,
            Start::Cut(error) => return Err(error),
        }
        let mut slot = ring.next_input()?;
        // Straight from the file into the ring's memory: no buffer in between.
        let read = packing.read(&mut reader, &mut slot, &mut read_scratch)?;
        anyhow::ensure!(read == slot.len(), "{name}: frame {index} is truncated");
        slot.submit();
        lines.push_back(line.clone());
        if lines.len() == ring.slots() {
            write_next(&mut lines)?;
        }
    }
    while !lines.is_empty() {
        write_next(&mut lines)?;
    }
    out.flush()?;
    println!(
        "{frames} frames of {}x{} {} through a {} ring on {}: checksum {checksum:016x}, written to {}",
        format.width(),
        format.height(),
        video.pixels,
        ring.strategy(),
        device.name(),
        output.display()
    );
    Ok(())
}

/// A 4:2:0 stream of 8 frames of 64x48 fresh random pixels, none zero, at `path`.
fn generate(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let seed = fastrand::u64(..);
    println!("generated input: 8 frames of 64x48 C420jpeg, random pixels (seed {seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut stream = b"YUV4MPEG2 W64 H48 F25:1 Ip A1:1 C420jpeg\n".to_vec();
    for _ in 0..8 {
        stream.extend_from_slice(b"FRAME\n");
        stream.extend((0..64 * 48 * 3 / 2).map(|_| rng.u8(1..)));
    }
    std::fs::write(path, stream)?;
    Ok(path.to_path_buf())
}
