//! The readers of untrusted bytes, for the fuzz targets (`fuzz/` at the workspace root,
//! feature `fuzzing`): each as `hetmem filter` runs it, on the CPU backend, under a small
//! pixel cap, into a sink. Whatever the bytes, a reader returns (an error, or frames); it
//! never panics, hangs, or allocates what a header claims beyond the cap. The fuzz targets
//! add libFuzzer's allocation limit, which catches an allocation the cap should have refused.

use std::io;

use hetmem::ops::gaussian::{Border, Gaussian};
use hetmem::{BackendChoice, BackendKind, Device};

use super::budget::Budget;
use super::endpoint::{Endpoint, Named};
use super::frame_io::FrameSink;
use super::image::Opened;
use super::raw::{PixFmt, RawSpec};
use super::{ImageKind, Job, raw, video, y4m};

/// The pixel cap the readers run under: 64 x 64, so that a frame the cap allows stays small.
pub const MAX_PIXELS: u64 = 1 << 12;

fn budget() -> Budget {
    Budget { max_pixels: MAX_PIXELS }
}

/// Runs `read` with a job as `hetmem filter - - --strategy cpu -q` makes it.
fn with_job<R>(read: impl FnOnce(&Job) -> R) -> R {
    let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).expect("the CPU backend always opens");
    let kernel = Gaussian::new(Some(1), None, Border::Reflect101).expect("radius 1 is a kernel");
    let (input, output) = (Endpoint::Std, Endpoint::Std);
    let job = Job {
        device: &device,
        strategy: hetmem::Strategy::Cpu,
        strategy_chosen: true,
        kernel: &kernel,
        kernel_args: (Some(1), None, Border::Reflect101),
        input: Named { endpoint: &input, std_name: "stdin" },
        output: Named { endpoint: &output, std_name: "stdout" },
        budget: budget(),
        retries: 0,
        ui: crate::ui::Ui { quiet: true },
        outputs: crate::outputs::Outputs { overwrite: false },
    };
    read(&job)
}

fn sink() -> anyhow::Result<FrameSink> {
    Ok(FrameSink::stream(Box::new(io::sink())))
}

/// The Y4M reader on `bytes`, as a file of that size.
///
/// # Errors
/// What the reader says of the bytes.
pub fn y4m(bytes: &[u8]) -> anyhow::Result<()> {
    with_job(|job| {
        let mut reader = bytes;
        let video = y4m::read_header(&mut reader, &job.input.to_string())?;
        video::filter(job, video, reader, Some(bytes.len() as u64), sink).map(drop)
    })
}

/// The raw video reader on `bytes`, as a pipe (no size known) of frames of `width` x `height`
/// in the pixel format `format` picks (modulo the formats there are): the size and format
/// come from the command line, the frames from the stream.
///
/// # Errors
/// A size the pixel format cannot take, or what the reader says of the bytes.
pub fn raw(width: usize, height: usize, format: u8, bytes: &[u8]) -> anyhow::Result<()> {
    let pix_fmt = PixFmt::ALL[usize::from(format) % PixFmt::ALL.len()];
    let spec = RawSpec { width, height, pix_fmt };
    with_job(|job| video::filter(job, raw::video(spec)?, bytes, None, sink).map(drop))
}

/// The PNM reader (PBM, PGM, PPM, PAM) on `bytes`: the header, the cap, then the pixels into
/// a frame of the size the header declares.
///
/// # Errors
/// What the reader says of the bytes.
pub fn pnm(bytes: &[u8]) -> anyhow::Result<()> {
    let image = Opened::new(bytes, ImageKind::Pnm, "input", &budget())?;
    let mut pixels = vec![0; image.frame.frame_bytes()];
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
