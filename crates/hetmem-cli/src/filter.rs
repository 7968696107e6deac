//! `hetmem filter`: a Gaussian blur over images (PNG, JPEG, PPM/PGM/PAM) or video (Y4M, or
//! raw frames with `--raw`), from files or pipes.
//!
//! ```text
//! ffmpeg -i in.mp4 -f yuv4mpegpipe - | hetmem filter - - | ffmpeg -f yuv4mpegpipe -i - out.mp4
//! ```
//!
//! The input is opened once and its first bytes tell what it holds, so pipes work by path
//! (`/dev/stdin`, `<(...)`, a FIFO) as files do; an output that is the input under another
//! name is refused before it is opened. The size an input declares is checked against the
//! memory budget (`--max-pixels`) before anything that large is allocated. The readers and
//! writers, the endpoints and the budget are [`hetmem_media`]'s; here is the command around
//! them: its arguments, the ring or filter each input goes through, retries, Ctrl-C and the
//! summary.
//!
//! 16-bit images (PNG, PNM) and 9- to 16-bit video (Y4M `C420p10`, ...) are filtered as 16-bit
//! samples through the same path, never narrowed.
//!
//! An image is decoded straight into the strategy's input memory ([`hetmem::FrameFilter`]); a
//! video streams through a [`hetmem::FrameRing`]: each frame is read straight into the ring's
//! next input slot while earlier frames are filtered and written, in order, by a writer
//! thread. Ctrl-C stops the reading; every whole frame read is still filtered and written, and
//! the exit status is 130. stdout carries nothing but the video when the output is `-`: the
//! summary, warnings and progress go to stderr, and `--json` needs `--report FILE` then.

mod image;
mod interrupt;
mod recovery;
mod stats;
#[cfg(test)]
mod untrusted_input_tests;
mod video;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{Border, Gaussian, MAX_RADIUS, SampleType};
use hetmem::{Device, Strategy};
use hetmem_media::image::ImageKind;
use hetmem_media::raw::{self, RawSpec};
use hetmem_media::{Budget, DEFAULT_MAX_PIXELS, Endpoint, FrameSink, Input, Named, y4m};

use crate::choices::{self, StrategyName};
use crate::outputs::Outputs;
use crate::ui::Ui;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A PNG, JPEG or PPM/PGM/PAM image, a Y4M video, raw video with --raw, or `-`: stdin
    /// (any of them: its first bytes tell which). Pipes given as paths (/dev/stdin, <(...), a
    /// FIFO) work too. 16-bit images and 9- to 16-bit video (C420p10, ...) stay 16-bit.
    input: PathBuf,
    /// Where to write the result, of the input's kind: an image in the format of its extension
    /// (.png, .jpg, .ppm, .pgm, .pnm, .pam), a .y4m video, raw frames with --raw, or `-`: video
    /// on stdout. An existing file is refused unless -y.
    output: PathBuf,
    /// How frames reach the blur.
    #[arg(long, default_value = "auto", value_parser = choices::by_library::<StrategyName>())]
    strategy: StrategyName,
    /// Raw video in and out, as ffmpeg's `-f rawvideo -pix_fmt PIX_FMT -s WxH`: whole frames
    /// back to back, no header. PIX_FMT: gray, rgb24, yuv420p or nv12.
    #[arg(long, value_name = "WxH:PIX_FMT", value_parser = raw::parse_spec)]
    raw: Option<RawSpec>,
    /// Gaussian sigma. Default: OpenCV's for the radius.
    #[arg(long, allow_negative_numbers = true)]
    sigma: Option<f64>,
    /// Kernel radius (2 = 5x5), at most 32; any radius works on any image size. Default: from
    /// sigma, or 2.
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_RADIUS)))]
    radius: Option<u32>,
    /// What lies beyond the edges.
    #[arg(long, value_enum, default_value_t = BorderArg::Reflect101)]
    border: BorderArg,
    /// The most pixels (width x height) an input may declare; a larger one is refused before
    /// any memory is allocated for it. The default, 2^28, is 16384 x 16384.
    #[arg(long, default_value_t = DEFAULT_MAX_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    max_pixels: u64,
    /// Frames that may fail and be filtered again before the run gives up. A frame that fails
    /// (its copy, kernel or wait) is filtered again with the frames after it by a new ring; after
    /// a kernel fault, which loses the GPU for the rest of the process, on the CPU (the same
    /// result). Each retry is reported. Default 0: the first failure ends the run, after every
    /// frame before it is written.
    #[arg(long, default_value_t = 0)]
    retries: u32,
    /// Threads that read or write each video frame of a regular file at once (by position);
    /// pipes and stdout are read and written by one. Default: one per 4 MiB of a frame, up to
    /// the cores or 8 (an 8K 4:2:0 frame, 50 MB, takes 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    io_threads: Option<u32>,
    /// Test hook (built with the `testing` feature only): make the Nth call at a point fail,
    /// as POINT:N[:KIND] with POINT one of allocation, registration, launch, copy, fence-wait
    /// and KIND transient, sticky (the default) or trap; repeatable.
    #[cfg(feature = "testing")]
    #[arg(long, hide = true)]
    inject_fault: Vec<String>,
    /// Print the summary as JSON on stdout (under "schema": "hetmem.filter/2") instead of text
    /// on stderr. When the output is `-`, stdout carries the video: give --report FILE.
    #[arg(long)]
    json: bool,
    /// Write the summary as JSON to this file (refused if it exists, unless -y).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BorderArg {
    /// OpenCV's default: mirrored without repeating the edge (dcb|abcd|cba)
    Reflect101,
    /// The edge pixel repeated (aaa|abcd|ddd)
    Replicate,
}

impl From<BorderArg> for Border {
    fn from(border: BorderArg) -> Border {
        match border {
            BorderArg::Reflect101 => Border::Reflect101,
            BorderArg::Replicate => Border::Replicate,
        }
    }
}

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image(ImageKind),
    Video,
}

const OUTPUT_EXTENSIONS: &str = ".png, .jpg, .jpeg, .ppm, .pgm, .pnm, .pam, .y4m or - (Y4M on stdout)";

/// The kind an extension names.
fn kind_of_extension(path: &Path) -> Option<Kind> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match extension.as_str() {
        "png" => Kind::Image(ImageKind::Png),
        "jpg" | "jpeg" => Kind::Image(ImageKind::Jpeg),
        "ppm" | "pgm" | "pbm" | "pnm" | "pam" => Kind::Image(ImageKind::Pnm),
        "y4m" => Kind::Video,
        _ => return None,
    })
}

/// What an input holds, by its first bytes.
fn kind_of_content(head: &[u8]) -> Option<Kind> {
    if head.starts_with(y4m::MAGIC) {
        return Some(Kind::Video);
    }
    match ::image::guess_format(head) {
        Ok(::image::ImageFormat::Png) => Some(Kind::Image(ImageKind::Png)),
        Ok(::image::ImageFormat::Jpeg) => Some(Kind::Image(ImageKind::Jpeg)),
        Ok(::image::ImageFormat::Pnm) => Some(Kind::Image(ImageKind::Pnm)),
        _ => None,
    }
}

/// What an input holds: by its first bytes, else by its extension; stdin that is no image is
/// taken for video, for the Y4M reader to say what is wrong with it.
fn kind_of_input(input: &Input, endpoint: &Endpoint, name: &Named) -> anyhow::Result<Kind> {
    if input.head.is_empty() {
        bail!("{name} is empty: there is nothing to filter");
    }
    match (kind_of_content(&input.head), endpoint) {
        (Some(kind), _) => Ok(kind),
        (None, Endpoint::Std) => Ok(Kind::Video),
        // Not recognisable by content: the extension decides, and decoding says what is wrong.
        (None, Endpoint::File(path)) => kind_of_extension(path).with_context(|| {
            format!("{name}: not a PNG, JPEG, PNM image or a Y4M video (by its content or its extension)")
        }),
    }
}

/// Runs the command, which started at `started` (before `device` was opened).
pub fn run(
    device: &Device,
    started: Instant,
    args: &Args,
    ui: Ui,
    outputs: Outputs,
) -> anyhow::Result<ExitCode> {
    let opening_the_device = started.elapsed();
    let input = Endpoint::new(&args.input);
    let output = Endpoint::new(&args.output);
    let input_name = Named { endpoint: &input, std_name: "stdin" };
    let output_name = Named { endpoint: &output, std_name: "stdout" };
    if args.json && args.report.is_none() && matches!(output, Endpoint::Std) {
        bail!(
            "--json prints the summary on stdout, and stdout carries the video here (the output is -): give \
             --report FILE to write the JSON to a file"
        );
    }
    let StrategyName(strategy) = args.strategy;
    let strategy_chosen = strategy != Strategy::Auto;
    #[cfg(feature = "testing")]
    faults::arm(&args.inject_fault)?;
    // Resolved now so that messages name the strategy that runs, not `auto`.
    let strategy = strategy.resolve(device);
    // Checked before anything is opened; 16-bit inputs derive a radius left out by their own
    // rule (Job::kernel_for).
    let kernel = Gaussian::new(args.radius, args.sigma, args.border.into())
        .with_context(|| format!("cannot filter {input_name}"))?;
    let output_kind = match (&output, args.raw) {
        (Endpoint::Std, _) => Kind::Video,
        (Endpoint::File(path), None) => kind_of_extension(path).with_context(|| {
            format!(
                "cannot tell the output format of {output_name} from its extension: use {OUTPUT_EXTENSIONS}"
            )
        })?,
        (Endpoint::File(path), Some(spec)) => match kind_of_extension(path) {
            None => Kind::Video,
            Some(_) => bail!(
                "--raw {spec} writes raw frames, and the extension of {output_name} names another format: \
                 name it .yuv, .rgb, .gray, .nv12 or .raw, or write - (stdout)"
            ),
        },
    };
    if let Some(report) = &args.report {
        outputs.check(report)?;
    }
    let io_threads = args.io_threads.map_or_else(hetmem_media::default_threads, |threads| threads as usize);
    let source = Input::open(&input, &input_name.to_string(), io_threads)?;
    source.refuse_as_output(&output, &input_name.to_string(), &output_name.to_string())?;
    if let Endpoint::File(path) = &output {
        outputs.check(path)?;
    }
    let input_kind = match args.raw {
        None => kind_of_input(&source, &input, &input_name)?,
        Some(spec) => raw_input(&source, &input_name, spec)?,
    };
    let budget = Budget::new(args.max_pixels);
    let job = Job {
        device,
        strategy,
        strategy_chosen,
        kernel: &kernel,
        kernel_args: (args.radius, args.sigma, args.border.into()),
        input: input_name,
        output: output_name,
        budget,
        retries: args.retries,
        ui,
        outputs,
        started,
        opening_the_device,
    };
    let report = match (input_kind, output_kind) {
        (Kind::Video, Kind::Video) => {
            let file_len = source.file_len();
            let open_output = || -> anyhow::Result<FrameSink> {
                Ok(match &output {
                    Endpoint::Std => {
                        FrameSink::stream(hetmem_media::stdout().context("cannot write to stdout")?)
                    }
                    Endpoint::File(path) => FrameSink::file(outputs.create(path)?, io_threads),
                })
            };
            match args.raw {
                None => {
                    let mut frames = source.into_frames();
                    let video = y4m::read_header(&mut frames, &input_name.to_string())?;
                    video::filter(&job, video, frames, file_len, open_output)?
                }
                Some(spec) => {
                    video::filter(&job, raw::video(spec)?, source.into_frames(), file_len, open_output)?
                }
            }
        }
        (Kind::Image(from_kind), Kind::Image(to_kind)) => {
            let Endpoint::File(to) = &output else { unreachable!("`-` as an output is always video") };
            image::filter(&job, source, to, from_kind, to_kind)?
        }
        (Kind::Image(format), Kind::Video) => bail!(
            "{input_name} is a {} image, {output_name} is video (Y4M): write an image \
             (.png, .jpg, .ppm, .pgm, .pnm, .pam)",
            format.name()
        ),
        (Kind::Video, Kind::Image(format)) => bail!(
            "{input_name} is Y4M video, {output_name} is a {} image: write .y4m, or - for Y4M on stdout",
            format.name()
        ),
    };
    match (args.json, &args.report) {
        (false, _) => report.print_text(ui.quiet)?,
        (true, None) => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(report.to_json()?.as_bytes()).and_then(|()| stdout.flush())?;
        }
        // The JSON goes to the report alone.
        (true, Some(_)) => {}
    }
    if let Some(path) = &args.report {
        outputs.write(path, report.to_json()?)?;
    }
    // 128 + SIGINT, as shells report a process that Ctrl-C ended, after a clean finish.
    Ok(if report.interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

/// The kind of a `--raw` input: video, unless its first bytes say it is a Y4M stream (whose
/// header would be read as pixels).
fn raw_input(input: &Input, name: &Named, spec: RawSpec) -> anyhow::Result<Kind> {
    if input.head.is_empty() {
        bail!("{name} is empty: there is nothing to filter");
    }
    if input.head.starts_with(y4m::MAGIC) {
        bail!(
            "{name} is a Y4M stream, not raw video: leave out --raw {spec} (the Y4M header gives the size)"
        );
    }
    Ok(Kind::Video)
}

/// What both paths need.
#[derive(Debug)]
struct Job<'a> {
    device: &'a Device,
    strategy: Strategy,
    /// The user named the strategy (not `auto`): no fallback to another.
    strategy_chosen: bool,
    /// The kernel for 8-bit frames.
    kernel: &'a Gaussian,
    /// `--radius`, `--sigma` and `--border`: OpenCV derives a radius left out from sigma by
    /// another rule for 16-bit frames.
    kernel_args: (Option<u32>, Option<f64>, Border),
    input: Named<'a>,
    output: Named<'a>,
    budget: Budget,
    /// `--retries`.
    retries: u32,
    /// `-q`, for the progress bar.
    ui: Ui,
    /// `-y`, for the output.
    outputs: Outputs,
    /// When the command started, before the device was opened: the summary's wall time
    /// counts from here.
    started: Instant,
    /// What opening the device took.
    opening_the_device: Duration,
}

impl Job<'_> {
    /// The kernel for frames of `sample`s: with no `--radius`, a 16-bit frame takes
    /// `round(8 * sigma + 1) | 1` taps where an 8-bit one takes `round(6 * sigma + 1) | 1`, as
    /// `cv2.GaussianBlur` does.
    ///
    /// # Errors
    /// A sigma whose radius for 16-bit samples is above the largest.
    fn kernel_for(&self, sample: SampleType) -> hetmem::Result<Gaussian> {
        match sample {
            SampleType::U8 => Ok(self.kernel.clone()),
            _ => {
                let (radius, sigma, border) = self.kernel_args;
                Gaussian::for_samples(radius, sigma, border, sample)
            }
        }
    }
}

/// `--inject-fault`, with the `testing` feature: fault rules for the CLI's own tests.
#[cfg(feature = "testing")]
mod faults {
    use anyhow::{Context as _, bail};
    use hetmem::testing::faults::{self, FaultKind, FaultPoint};

    pub(super) fn arm(rules: &[String]) -> anyhow::Result<()> {
        for rule in rules {
            let parts: Vec<&str> = rule.split(':').collect();
            let point = match parts[0] {
                "allocation" => FaultPoint::Allocation,
                "registration" => FaultPoint::Registration,
                "launch" => FaultPoint::Launch,
                "copy" => FaultPoint::Copy,
                "fence-wait" => FaultPoint::FenceWait,
                other => bail!("--inject-fault {rule}: unknown point {other}"),
            };
            let nth: u64 = parts
                .get(1)
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("--inject-fault {rule}: give POINT:N[:KIND]"))?;
            let kind = match parts.get(2).copied().unwrap_or("sticky") {
                "transient" => FaultKind::Transient,
                "sticky" => FaultKind::Sticky,
                "trap" => FaultKind::Trap,
                other => bail!("--inject-fault {rule}: unknown kind {other}"),
            };
            faults::arm(point, nth, kind);
        }
        Ok(())
    }
}
