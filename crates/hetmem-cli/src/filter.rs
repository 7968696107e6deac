//! `hetmem filter`: a Gaussian blur over images (PNG, JPEG, PPM/PGM/PAM) or Y4M video, from
//! files or pipes.
//!
//! ```text
//! ffmpeg -i in.mp4 -f yuv4mpegpipe - | hetmem filter - - | ffmpeg -f yuv4mpegpipe -i - out.mp4
//! ```
//!
//! An image is read straight into the strategy's input memory ([`hetmem::FrameFilter`]); a
//! video streams through a [`hetmem::FrameRing`]: each frame is read straight into the ring's
//! next input slot while earlier frames are filtered and written, in order, by a writer
//! thread. Ctrl-C stops the reading; every frame read is still filtered and written, and the
//! exit status is 130. stdout carries nothing but the video when the
//! output is `-`: the summary, warnings and progress go to stderr.

mod image;
mod stats;
mod y4m;

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{Border, Gaussian};
use hetmem::{Device, Strategy};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A PNG, JPEG or PPM/PGM/PAM image, a Y4M video, or `-`: Y4M video on stdin.
    input: PathBuf,
    /// Where to write the result, of the input's kind: an image in the format of its extension
    /// (.png, .jpg, .ppm, .pgm, .pnm, .pam), a .y4m video, or `-`: Y4M video on stdout.
    output: PathBuf,
    /// How frames reach the blur: auto, cpu, copy, pinned-async, zero-copy, managed or hybrid.
    #[arg(long, default_value = "auto")]
    strategy: String,
    /// Gaussian sigma. Default: OpenCV's for the radius.
    #[arg(long)]
    sigma: Option<f64>,
    /// Kernel radius (2 = 5x5). Default: from sigma, or 2.
    #[arg(long)]
    radius: Option<u32>,
    /// What lies beyond the edges: reflect101 (OpenCV's default) or replicate.
    #[arg(long, value_enum, default_value_t = BorderArg::Reflect101)]
    border: BorderArg,
    /// Print the summary as JSON (on stderr: stdout may carry the video).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BorderArg {
    Reflect101,
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

/// An input or output: a file, or `-` (stdin for the input, stdout for the output).
#[derive(Debug, Clone)]
enum Endpoint {
    Std,
    File(PathBuf),
}

impl Endpoint {
    fn new(path: &Path) -> Endpoint {
        if path.as_os_str() == "-" { Endpoint::Std } else { Endpoint::File(path.to_path_buf()) }
    }
}

/// How endpoints are named in messages: the path, or stdin/stdout for `-`.
#[derive(Debug, Clone, Copy)]
struct Named<'a> {
    endpoint: &'a Endpoint,
    std_name: &'static str,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.endpoint {
            Endpoint::Std => f.write_str(self.std_name),
            Endpoint::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The image formats, by what the `image` crate calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageKind {
    Png,
    Jpeg,
    /// PPM, PGM, PBM or PAM; the extension picks the flavour on output.
    Pnm,
}

impl ImageKind {
    fn name(self) -> &'static str {
        match self {
            ImageKind::Png => "PNG",
            ImageKind::Jpeg => "JPEG",
            ImageKind::Pnm => "PNM",
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

/// The kind of an input file: by its first bytes, else by its extension.
fn sniff(path: &Path) -> anyhow::Result<Kind> {
    let mut start = Vec::with_capacity(16);
    std::fs::File::open(path)
        .and_then(|file| file.take(16).read_to_end(&mut start))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if start.starts_with(y4m::MAGIC) {
        return Ok(Kind::Video);
    }
    let by_content = match ::image::guess_format(&start) {
        Ok(::image::ImageFormat::Png) => Some(ImageKind::Png),
        Ok(::image::ImageFormat::Jpeg) => Some(ImageKind::Jpeg),
        Ok(::image::ImageFormat::Pnm) => Some(ImageKind::Pnm),
        _ => None,
    };
    match (by_content, kind_of_extension(path)) {
        (Some(kind), _) => Ok(Kind::Image(kind)),
        // Not recognisable by content: the extension decides, and decoding says what is wrong.
        (None, Some(kind)) => Ok(kind),
        (None, None) => bail!(
            "{}: not a PNG, JPEG, PNM image or a Y4M video (by its content or its extension)",
            path.display()
        ),
    }
}

pub fn run(device: &Device, args: &Args) -> anyhow::Result<ExitCode> {
    let input = Endpoint::new(&args.input);
    let output = Endpoint::new(&args.output);
    let input_name = Named { endpoint: &input, std_name: "stdin" };
    let output_name = Named { endpoint: &output, std_name: "stdout" };
    let strategy: Strategy = args.strategy.parse().with_context(|| format!("cannot filter {input_name}"))?;
    // Resolved now so that messages name the strategy that runs, not `auto`.
    let strategy = strategy.resolve(device);
    let kernel = Gaussian::new(args.radius, args.sigma, args.border.into())
        .with_context(|| format!("cannot filter {input_name}"))?;
    let input_kind = match &input {
        Endpoint::Std => Kind::Video,
        Endpoint::File(path) => sniff(path)?,
    };
    let output_kind = match &output {
        Endpoint::Std => Kind::Video,
        Endpoint::File(path) => kind_of_extension(path).with_context(|| {
            format!(
                "cannot tell the output format of {output_name} from its extension: use {OUTPUT_EXTENSIONS}"
            )
        })?,
    };
    let job = Job { device, strategy, kernel: &kernel, input: input_name, output: output_name };
    let report = match (input_kind, output_kind) {
        (Kind::Video, Kind::Video) => y4m::filter(&job)?,
        (Kind::Image(from_kind), Kind::Image(to_kind)) => {
            let (Endpoint::File(from), Endpoint::File(to)) = (&input, &output) else {
                unreachable!("`-` is always video")
            };
            image::filter(&job, from, to, from_kind, to_kind)?
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
    report.print(args.json)?;
    // 128 + SIGINT, as shells report a process that Ctrl-C ended, after a clean finish.
    Ok(if report.interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

/// What both paths need.
#[derive(Debug)]
struct Job<'a> {
    device: &'a Device,
    strategy: Strategy,
    kernel: &'a Gaussian,
    input: Named<'a>,
    output: Named<'a>,
}
