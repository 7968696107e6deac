//! Images: PNG, JPEG and PNM (PPM, PGM, PBM, PAM) in; PNG, JPEG or PNM out, by the output's
//! extension.
//!
//! The encoded image is read into memory, from a file or a pipe alike, and its header is
//! read: the size it declares is checked against the budget before anything that large is
//! allocated. Gray, RGB and RGBA images of 8 or 16 bits per channel are then decoded straight
//! into the filter's input memory and encoded straight from its output memory, and keep their
//! pixel type: a 16-bit PNG or PNM stays 16-bit end to end (JPEG holds 8 bits only, so a
//! 16-bit image is not written as one). Gray with alpha is filtered as RGBA and written back
//! as gray with alpha. Float pixels are converted to 8 bits, with a warning: the output is
//! then 8-bit.
//!
//! A truncated file is refused, not filled in: a JPEG or PNG must reach its end marker
//! ([`ending`]), a binary PNM must hold every pixel byte its header declares.

mod ending;

use std::fs::File;
use std::io::{BufWriter, Cursor, Write as _};
use std::path::Path;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{FrameFormat, GaussianStage, PixelLayout, SampleType};
use hetmem::{Device, FrameFilter, Strategy};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::pnm::{PnmDecoder, PnmEncoder, PnmSubtype, SampleEncoding};
use image::{
    ColorType, DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, ImageError, ImageFormat,
    ImageReader, Limits,
};

use self::ending::Ending;
use super::budget::Budget;
use super::endpoint::Input;
use super::recovery::{self, Recovery, Retry};
use super::stats::{Clock, Facts, Report};
use super::{ImageKind, Job};

/// The most bytes the decoders may allocate for themselves per pixel of the cap (float RGBA
/// takes 16 a pixel): `image`'s own limit, under hetmem's check of the declared size.
const DECODER_BYTES_PER_PIXEL: u64 = 16;

/// JPEG output quality (image's own default is 75).
const JPEG_QUALITY: u8 = 90;

/// How a decoded pixel type is filtered and written.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// What the filter sees.
    layout: PixelLayout,
    sample: SampleType,
    /// Decoded straight into the filter (gray, RGB, RGBA of 8 or 16 bits), or converted first.
    direct: bool,
    /// What is written.
    written: ExtendedColorType,
}

fn plan(color: ColorType) -> Option<Plan> {
    use ExtendedColorType as Written;
    let (layout, sample, direct, written) = match color {
        ColorType::L8 => (PixelLayout::Gray, SampleType::U8, true, Written::L8),
        ColorType::Rgb8 => (PixelLayout::Rgb, SampleType::U8, true, Written::Rgb8),
        ColorType::Rgba8 => (PixelLayout::Rgba, SampleType::U8, true, Written::Rgba8),
        ColorType::La8 => (PixelLayout::Rgba, SampleType::U8, false, Written::La8),
        ColorType::L16 => (PixelLayout::Gray, SampleType::U16, true, Written::L16),
        ColorType::Rgb16 => (PixelLayout::Rgb, SampleType::U16, true, Written::Rgb16),
        ColorType::Rgba16 => (PixelLayout::Rgba, SampleType::U16, true, Written::Rgba16),
        ColorType::La16 => (PixelLayout::Rgba, SampleType::U16, false, Written::La16),
        ColorType::Rgb32F => (PixelLayout::Rgb, SampleType::U8, false, Written::Rgb8),
        ColorType::Rgba32F => (PixelLayout::Rgba, SampleType::U8, false, Written::Rgba8),
        _ => return None,
    };
    Some(Plan { layout, sample, direct, written })
}

fn describe(color: ExtendedColorType) -> &'static str {
    match color {
        ExtendedColorType::L8 => "gray",
        ExtendedColorType::La8 => "gray with alpha",
        ExtendedColorType::Rgb8 => "RGB",
        ExtendedColorType::Rgba8 => "RGBA",
        ExtendedColorType::L16 => "16-bit gray",
        ExtendedColorType::La16 => "16-bit gray with alpha",
        ExtendedColorType::Rgb16 => "16-bit RGB",
        ExtendedColorType::Rgba16 => "16-bit RGBA",
        _ => "other",
    }
}

/// The encoder for the output's extension, checked against the pixels before any work.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    Png,
    Jpeg,
    Pnm(Option<PnmSubtype>),
    /// A binary PGM (`P5`) or PPM (`P6`) of 16-bit samples, which `image`'s PNM encoder writes
    /// at 8 bits only: the magic number.
    Pnm16(&'static str),
}

fn encoding(to: &Path, kind: ImageKind, color: ExtendedColorType, output: &str) -> anyhow::Result<Encoding> {
    let extension = to.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let what = describe(color);
    let alpha = matches!(
        color,
        ExtendedColorType::La8
            | ExtendedColorType::Rgba8
            | ExtendedColorType::La16
            | ExtendedColorType::Rgba16
    );
    let wide = color.bits_per_pixel() / u16::from(color.channel_count()) == 16;
    Ok(match kind {
        ImageKind::Png => Encoding::Png,
        ImageKind::Jpeg if alpha => {
            bail!("{output}: JPEG has no alpha channel and the image is {what}: write .png or .pam")
        }
        ImageKind::Jpeg if wide => bail!(
            "{output}: JPEG holds 8 bits per channel and the image is {what}: write .png, .pnm or .pam to keep \
             its 16 bits"
        ),
        ImageKind::Jpeg => Encoding::Jpeg,
        ImageKind::Pnm => {
            let binary = SampleEncoding::Binary;
            match (extension.as_str(), color) {
                ("pgm" | "pnm", ExtendedColorType::L8) => Encoding::Pnm(Some(PnmSubtype::Graymap(binary))),
                ("ppm" | "pnm", ExtendedColorType::Rgb8) => Encoding::Pnm(Some(PnmSubtype::Pixmap(binary))),
                ("pgm" | "pnm", ExtendedColorType::L16) => Encoding::Pnm16("P5"),
                ("ppm" | "pnm", ExtendedColorType::Rgb16) => Encoding::Pnm16("P6"),
                // PAM holds any of them; `None` lets the encoder write its header.
                ("pam" | "pnm", _) => Encoding::Pnm(None),
                ("pgm", _) => bail!(
                    "{output}: a PGM holds gray pixels and the image is {what}: write .png, .pnm or .pam"
                ),
                ("ppm", _) => bail!(
                    "{output}: a PPM holds RGB pixels and the image is {what}: write .png, .pnm or .pam"
                ),
                _ => bail!("{output}: PBM holds 1-bit pixels: write .pgm, .ppm, .pnm, .pam or .png"),
            }
        }
    })
}

pub(super) fn filter(
    job: &Job,
    input: Input,
    to: &Path,
    kind: ImageKind,
    output_kind: ImageKind,
) -> anyhow::Result<Report> {
    let mut clock = Clock::start();
    let (input_name, output) = (job.input.to_string(), job.output.to_string());
    let bytes = input.read_all(&job.budget, &input_name)?;
    let image = Opened::new(&bytes, kind, &input_name, &job.budget)?;
    let (width, height, color, plan) = (image.width, image.height, image.color, image.plan);
    let encoding = encoding(to, output_kind, plan.written, &output)?;
    let mut warnings = Vec::new();
    if matches!(color, ColorType::Rgb32F | ColorType::Rgba32F) {
        warnings.push(format!(
            "{input_name} has {color:?} pixels: hetmem filters 8 or 16 bits per channel, so they were converted \
             to 8 bits and {output} is 8-bit"
        ));
    }
    let kernel = job
        .kernel_for(plan.sample)
        .with_context(|| format!("cannot filter {input_name} ({width}x{height} {color:?})"))?;
    let stage = GaussianStage::new(image.frame, &kernel)?.with_segments(crate::environment::segments()?);
    let build = |device: &Device,
                 strategy: Strategy,
                 warnings: &mut Vec<String>|
     -> anyhow::Result<FrameFilter<GaussianStage>> {
        let context =
            |strategy| format!("cannot filter {input_name} ({width}x{height}) by the {strategy} strategy");
        match FrameFilter::with_stage(device, strategy, stage.clone()) {
            Ok(filter) => Ok(filter),
            // Memory short even after the library's retries: an `auto` run goes on on the CPU.
            Err(error) if error.is_transient() && !job.strategy_chosen && strategy != Strategy::Cpu => {
                warnings.push(format!(
                    "{}: {error}; filtering by the cpu strategy instead (the same result)",
                    context(strategy)
                ));
                FrameFilter::with_stage(device, Strategy::Cpu, stage.clone())
                    .with_context(|| context(Strategy::Cpu))
            }
            Err(error) => Err(error).with_context(|| context(strategy)),
        }
    };
    let mut filter = build(job.device, job.strategy, &mut warnings)?;
    image.read_into(filter.input_mut()?)?;
    // Kept for --retries: a failed run may lose the filter's input memory.
    let kept = (job.retries > 0).then(|| filter.input_mut().map(|input| input.to_vec())).transpose()?;
    let mut recovery = Recovery::new(job.retries);
    let cpu = recovery::cpu();
    let latency = loop {
        let ran = filter
            .run()
            .with_context(|| format!("filtering {input_name} by the {} strategy", filter.strategy()));
        let error = match ran {
            Ok(latency) => break latency,
            Err(error) => error,
        };
        let (device, strategy) = match recovery.after(job.device, filter.strategy(), 0, &error) {
            None => return Err(error),
            Some(Retry::Cpu) => (&cpu, Strategy::Cpu),
            Some(Retry::Same) => (job.device, filter.strategy()),
        };
        filter = build(device, strategy, &mut warnings)?;
        filter.input_mut()?.copy_from_slice(kept.as_deref().expect("kept when retries are allowed"));
    };
    warnings.extend(recovery.warnings());
    clock.frame(latency);

    let result = filter.output()?;
    // Filtered as RGBA with R = G = B, so R is the gray: the same weights on the same values.
    let gray_alpha: Vec<u8> = match plan.written {
        ExtendedColorType::La8 => result.chunks_exact(4).flat_map(|p| [p[0], p[3]]).collect(),
        ExtendedColorType::La16 => result.chunks_exact(8).flat_map(|p| [p[0], p[1], p[6], p[7]]).collect(),
        _ => Vec::new(),
    };
    let pixels = if gray_alpha.is_empty() { result } else { &gray_alpha[..] };
    let pixels = native_endian(pixels, plan.sample);
    let file = job.outputs.create(to)?;
    write(file, encoding, &pixels, width, height, plan.written)
        .with_context(|| format!("cannot write {output}"))?;
    let facts = Facts {
        input: input_name,
        output,
        kind: "image",
        format: format!("{} {color:?}", kind.name()),
        width: width as usize,
        height: height as usize,
        layout: plan.layout,
        sample: plan.sample,
        strategy: filter.strategy(),
        warnings,
    };
    let mut report = Report::new(facts, &kernel, &clock);
    report.retried = recovery.retried;
    Ok(report)
}

/// An encoded image whose header was read and whose declared size is within the budget:
/// nothing the size of the image is allocated yet.
pub(super) struct Opened<'a> {
    decoder: Box<dyn ImageDecoder + 'a>,
    bytes: &'a [u8],
    kind: ImageKind,
    input: &'a str,
    budget: Budget,
    pub width: u32,
    pub height: u32,
    pub color: ColorType,
    plan: Plan,
    /// What the filter takes: one frame of this is what [`Opened::read_into`] fills.
    pub frame: FrameFormat,
}

impl<'a> Opened<'a> {
    /// Reads the header of the `kind` image in `bytes` (named `input` in messages).
    ///
    /// # Errors
    /// A corrupt header, an unsupported pixel type, a size above the budget, or a binary PNM
    /// shorter than its header says.
    pub(super) fn new(
        bytes: &'a [u8],
        kind: ImageKind,
        input: &'a str,
        budget: &Budget,
    ) -> anyhow::Result<Opened<'a>> {
        let format = match kind {
            ImageKind::Png => ImageFormat::Png,
            ImageKind::Jpeg => ImageFormat::Jpeg,
            ImageKind::Pnm => ImageFormat::Pnm,
        };
        let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
        let mut limits = Limits::no_limits();
        limits.max_alloc = Some(budget.max_pixels.saturating_mul(DECODER_BYTES_PER_PIXEL));
        reader.limits(limits);
        let decoder =
            reader.into_decoder().map_err(|error| decode_error(error, kind, bytes, input, budget))?;
        let (width, height) = decoder.dimensions();
        let color = decoder.color_type();
        let plan = plan(color).with_context(|| {
            format!(
                "{input}: {color:?} pixels are not supported: hetmem filters gray, RGB and RGBA of 8 or 16 \
                 bits per channel"
            )
        })?;
        let frame = FrameFormat::new(width as usize, height as usize, plan.layout)
            .with_context(|| format!("cannot filter {input} ({width}x{height})"))?
            .with_sample(plan.sample);
        let what = format!("its {} header", kind.name());
        let memory = memory(&frame, decoder.total_bytes(), plan.direct);
        budget.check(input, &what, width.into(), height.into(), memory)?;
        if kind == ImageKind::Pnm {
            check_pnm_length(bytes, input)?;
        }
        Ok(Opened {
            decoder: Box::new(decoder),
            bytes,
            kind,
            input,
            budget: *budget,
            width,
            height,
            color,
            plan,
            frame,
        })
    }

    /// Decodes the pixels into `pixels`, one frame of [`Opened::frame`] (the filter's input
    /// memory, 16-bit samples little-endian), converted where the pixel type needs it.
    ///
    /// # Errors
    /// Corrupt or truncated data.
    pub(super) fn read_into(self, pixels: &mut [u8]) -> anyhow::Result<()> {
        let Opened { decoder, bytes, kind, input, budget, plan, .. } = self;
        let decoded = if plan.direct {
            // The decoders give 16-bit samples in this machine's byte order.
            decoder.read_image(pixels).map(|()| little_endian_in_place(pixels, plan.sample))
        } else {
            DynamicImage::from_decoder(decoder).map(|image| match (plan.layout, plan.sample) {
                (PixelLayout::Rgba, SampleType::U16) => {
                    let converted = image.into_rgba16().into_raw();
                    for (pair, value) in pixels.chunks_exact_mut(2).zip(converted) {
                        pair.copy_from_slice(&value.to_le_bytes());
                    }
                }
                (layout, _) => {
                    let converted = match layout {
                        PixelLayout::Gray => image.into_luma8().into_raw(),
                        PixelLayout::Rgb => image.into_rgb8().into_raw(),
                        _ => image.into_rgba8().into_raw(),
                    };
                    pixels.copy_from_slice(&converted);
                }
            })
        };
        match decoded {
            Err(error) => Err(decode_error(error, kind, bytes, input, &budget)),
            // Whole only if it ends as it should: the JPEG decoder fills a truncated file in.
            Ok(()) => match ending(kind, bytes) {
                Ending::Truncated(at) => Err(truncated(kind, input, at)),
                _ => Ok(()),
            },
        }
    }
}

/// How the `kind` image in `bytes` ends, where its container says.
fn ending(kind: ImageKind, bytes: &[u8]) -> Ending {
    match kind {
        ImageKind::Jpeg => ending::jpeg(bytes),
        ImageKind::Png => ending::png(bytes),
        // A binary PNM is checked by its length (check_pnm_length); an ASCII one has no end mark.
        ImageKind::Pnm => Ending::Unknown,
    }
}

fn truncated(kind: ImageKind, input: &str, at: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{input}: truncated {}: the file ends {at}; hetmem does not fill in what is missing: get the whole \
         file again",
        kind.name()
    )
}

/// Memory filtering one image takes: the filter's input and output frames and the CPU blur's
/// intermediate (twice the frame), and for a converted pixel type the decoded image and its
/// converted copy. 16-bit samples count two bytes each, in the frame's own size.
fn memory(frame: &FrameFormat, decoded_bytes: u64, direct: bool) -> u64 {
    let frame = frame.frame_bytes() as u64;
    4 * frame + if direct { 0 } else { decoded_bytes + frame }
}

/// A binary PNM's pixels are the rest of the file after its header, each sample a fixed
/// number of bytes: all of them must be there. (The decoder would only say "failed to fill
/// whole buffer".) ASCII PNMs have no fixed size: their decoder says where they end.
fn check_pnm_length(bytes: &[u8], input: &str) -> anyhow::Result<()> {
    let mut cursor = Cursor::new(bytes);
    // The header parsed once already; this second parse is for where it ends.
    let Ok(decoder) = PnmDecoder::new(&mut cursor) else {
        return Ok(());
    };
    let (width, height) = decoder.dimensions();
    let (name, expected) = match decoder.subtype() {
        PnmSubtype::Bitmap(SampleEncoding::Binary) => {
            ("PBM", u64::from(width.div_ceil(8)) * u64::from(height))
        }
        PnmSubtype::Graymap(SampleEncoding::Binary) => ("PGM", decoder.total_bytes()),
        PnmSubtype::Pixmap(SampleEncoding::Binary) => ("PPM", decoder.total_bytes()),
        PnmSubtype::ArbitraryMap => ("PAM", decoder.total_bytes()),
        _ => return Ok(()),
    };
    drop(decoder);
    let got = bytes.len() as u64 - cursor.position();
    if got < expected {
        bail!(
            "{input}: truncated {name}: its header declares {width}x{height} pixels, so {expected} bytes of \
             pixels are expected after it, but the file holds {got}: get the whole file again"
        );
    }
    Ok(())
}

/// A decoder's error, with what it means here: a file that ends early is truncated (whatever
/// the decoder makes of the missing bytes), a limit reached is the budget's.
fn decode_error(
    error: ImageError,
    kind: ImageKind,
    bytes: &[u8],
    input: &str,
    budget: &Budget,
) -> anyhow::Error {
    if let Ending::Truncated(at) = ending(kind, bytes) {
        return truncated(kind, input, at);
    }
    match &error {
        ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            truncated(kind, input, "before its pixels do")
        }
        ImageError::Limits(limit) => anyhow::anyhow!(
            "{input}: decoding it needs more memory than --max-pixels {} allows ({limit}): pass a larger \
             --max-pixels if the image is genuine",
            budget.max_pixels
        ),
        _ => anyhow::Error::new(error).context(format!("cannot decode {input} as {}", kind.name())),
    }
}

/// Turns 16-bit samples in this machine's byte order into little-endian ones (the frame's
/// order), in place: nothing to do on a little-endian machine.
fn little_endian_in_place(pixels: &mut [u8], sample: SampleType) {
    if cfg!(target_endian = "big") && sample == SampleType::U16 {
        for pair in pixels.chunks_exact_mut(2) {
            pair.swap(0, 1);
        }
    }
}

/// The filtered samples in the order the encoders take (this machine's): borrowed on a
/// little-endian machine.
fn native_endian(pixels: &[u8], sample: SampleType) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "big") && sample == SampleType::U16 {
        let mut swapped = pixels.to_vec();
        little_endian_in_place(&mut swapped, sample);
        swapped.into()
    } else {
        pixels.into()
    }
}

fn write(
    file: File,
    encoding: Encoding,
    pixels: &[u8],
    width: u32,
    height: u32,
    color: ExtendedColorType,
) -> anyhow::Result<()> {
    let mut out = BufWriter::new(file);
    match encoding {
        Encoding::Png => PngEncoder::new(&mut out).write_image(pixels, width, height, color)?,
        Encoding::Jpeg => {
            JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY).write_image(pixels, width, height, color)?
        }
        Encoding::Pnm(subtype) => {
            let encoder = PnmEncoder::new(&mut out);
            let encoder = match subtype {
                Some(subtype) => encoder.with_subtype(subtype),
                None => encoder,
            };
            encoder.write_image(pixels, width, height, color)?;
        }
        Encoding::Pnm16(magic) => {
            // Netpbm's 16-bit samples: big-endian, under a maxval of 65535.
            write!(out, "{magic}\n{width} {height}\n65535\n")?;
            let samples: Vec<u8> = pixels
                .chunks_exact(2)
                .flat_map(|pair| u16::from_ne_bytes([pair[0], pair[1]]).to_be_bytes())
                .collect();
            out.write_all(&samples)?;
        }
    }
    out.flush()?;
    Ok(())
}
