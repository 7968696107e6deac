//! The readers of untrusted bytes, for the fuzz targets (`fuzz/` at the workspace root,
//! feature `fuzzing`): each as a user of this crate runs it (as `hetmem filter` does, short of
//! the ring), under a small pixel cap: the header, the budget, then every frame into one
//! frame's memory and out to a sink. Whatever the bytes, a reader returns (an error, or
//! frames); it never panics, hangs, or allocates what a header claims beyond the cap. The fuzz
//! targets add libFuzzer's allocation limit, which catches an allocation the cap should have
//! refused.

use std::io::{self, Write as _};

use anyhow::bail;

use crate::budget::Budget;
use crate::container::{Container, Start, Video};
use crate::frame_io::{FrameRead, FrameSink};
use crate::image::{ImageKind, Opened};
use crate::raw::{self, PixFmt, RawSpec};
use crate::{frames, y4m};

/// The pixel cap the readers run under: 64 x 64, so that a frame the cap allows stays small.
pub const MAX_PIXELS: u64 = 1 << 12;

/// What the stream is called in messages.
const INPUT: &str = "stdin";

fn budget() -> Budget {
    Budget::new(MAX_PIXELS)
}

/// Every frame of `video`, which `reader` holds next, read into one frame's memory (allocated
/// once the budget allowed it) and written to a sink.
fn frames(video: Video, mut reader: impl FrameRead) -> anyhow::Result<()> {
    let Video { format, container, .. } = video;
    let packing = container.packing();
    let declared_by = match container {
        Container::Y4m { .. } => "its Y4M header",
        Container::Raw { .. } => "--raw",
    };
    let bytes = 2 * format.frame_bytes() as u64 + 2 * packing.scratch_bytes(&format) as u64;
    budget().check(INPUT, declared_by, format.width() as u64, format.height() as u64, bytes)?;
    let mut frame = vec![0; format.frame_bytes()];
    let mut out = FrameSink::stream(Box::new(io::sink()));
    out.write_all(container.header())?;
    let (mut line, mut scratch) = (Vec::new(), Vec::new());
    for index in 0.. {
        match frames::read_start(&container, &mut reader, &mut line, index, INPUT, "")? {
            Start::Frame => {}
            Start::End => break,
            Start::Cut(error) => return Err(error),
        }
        let read = packing.read(&mut reader, &mut frame, &mut scratch)?;
        if read < frame.len() {
            bail!(
                "{INPUT}: frame {index} (counting from 0) is truncated: {read} of its {} bytes",
                frame.len()
            );
        }
        out.write_all(&line)?;
        packing.write(&mut out, &frame, &mut scratch)?;
    }
    out.flush()?;
    Ok(())
}

/// The Y4M reader on `bytes`.
///
/// # Errors
/// What the reader says of the bytes.
pub fn y4m(bytes: &[u8]) -> anyhow::Result<()> {
    let mut reader = bytes;
    let video = y4m::read_header(&mut reader, INPUT)?;
    frames(video, reader)
}

/// The raw video reader on `bytes`, frames of `width` x `height` in the pixel format `format`
/// picks (modulo the formats there are): the size and format come from the command line, the
/// frames from the stream.
///
/// # Errors
/// A size the pixel format cannot take, or what the reader says of the bytes.
pub fn raw(width: usize, height: usize, format: u8, bytes: &[u8]) -> anyhow::Result<()> {
    let pix_fmt = PixFmt::ALL[usize::from(format) % PixFmt::ALL.len()];
    let spec = RawSpec { width, height, pix_fmt };
    frames(raw::video(spec)?, bytes)
}

/// The PNM reader (PBM, PGM, PPM, PAM) on `bytes`: the header, the cap, then the pixels into
/// a frame of the size the header declares.
///
/// # Errors
/// What the reader says of the bytes.
pub fn pnm(bytes: &[u8]) -> anyhow::Result<()> {
    let image = Opened::new(bytes, ImageKind::Pnm, "input", &budget())?;
    let mut pixels = vec![0; image.frame().frame_bytes()];
    image.read_into(&mut pixels)
}

/// The fuzz targets' own decoding of an input, for replaying their files here.
#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// The files of `fuzz/<kind>/<target>/` at the workspace root.
    fn files(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        let mut files: Vec<_> = entries
            .map(|entry| entry.unwrap().path())
            .map(|path| {
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect();
        files.sort();
        files
    }

    /// As fuzz/fuzz_targets/raw.rs decodes its input.
    fn raw(bytes: &[u8]) -> anyhow::Result<()> {
        let (head, stream) = bytes.split_first_chunk::<5>().expect("a raw input starts with 5 bytes");
        let width = usize::from(u16::from_le_bytes([head[0], head[1]]));
        let height = usize::from(u16::from_le_bytes([head[2], head[3]]));
        super::raw(width, height, head[4], stream)
    }

    type Reader = fn(&[u8]) -> anyhow::Result<()>;

    const TARGETS: [(&str, Reader); 3] = [("y4m", super::y4m), ("raw", raw), ("pnm", super::pnm)];

    /// The fuzz targets' seeds are valid files: each reader takes them whole (so the fuzzers
    /// start from inputs that reach past the headers).
    #[test]
    fn the_fuzz_seeds_are_read_whole() {
        for (target, read) in TARGETS {
            let seeds = files("seeds", target);
            assert!(!seeds.is_empty(), "no seeds for {target} in fuzz/seeds");
            for (path, bytes) in seeds {
                read(&bytes).unwrap_or_else(|error| panic!("{}: {error:#}", path.display()));
            }
        }
    }

    /// Every input a fuzzer found a crash, hang or allocation with (kept in
    /// fuzz/regressions/), replayed: each now ends in an error, not a panic.
    #[test]
    fn the_fuzz_regressions_end_in_errors() {
        for (target, read) in TARGETS {
            for (path, bytes) in files("regressions", target) {
                assert!(read(&bytes).is_err(), "{} is read as valid", path.display());
            }
        }
    }
}
