//! Images: PNG, JPEG and PNM (PPM, PGM, PBM, PAM) in; PNG, JPEG or PNM out, by the output's
//! extension.
//!
//! 8-bit gray, RGB and RGBA images are decoded straight into the filter's input memory and
//! encoded straight from its output memory, and keep their pixel type. Gray with alpha is
//! filtered as RGBA and written back as gray with alpha. Other pixel types (16-bit, float)
//! are converted to 8 bits, with a warning: the output is then 8-bit.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write as _};
use std::path::Path;

use anyhow::{Context as _, bail};
use hetmem::FrameFilter;
use hetmem::ops::gaussian::{FrameFormat, PixelLayout};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::pnm::{PnmEncoder, PnmSubtype, SampleEncoding};
use image::{
    ColorType, DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, ImageFormat, ImageReader,
};

use super::stats::{Clock, Facts, Report};
use super::{ImageKind, Job};

/// JPEG output quality (image's own default is 75).
const JPEG_QUALITY: u8 = 90;

/// How a decoded pixel type is filtered and written.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// What the filter sees.
    layout: PixelLayout,
    /// Decoded straight into the filter (8-bit gray, RGB, RGBA), or converted first.
    direct: bool,
    /// What is written.
    written: ExtendedColorType,
}

fn plan(color: ColorType) -> Option<Plan> {
    let (layout, direct, written) = match color {
        ColorType::L8 => (PixelLayout::Gray, true, ExtendedColorType::L8),
        ColorType::Rgb8 => (PixelLayout::Rgb, true, ExtendedColorType::Rgb8),
        ColorType::Rgba8 => (PixelLayout::Rgba, true, ExtendedColorType::Rgba8),
        ColorType::L16 => (PixelLayout::Gray, false, ExtendedColorType::L8),
        ColorType::La8 | ColorType::La16 => (PixelLayout::Rgba, false, ExtendedColorType::La8),
        ColorType::Rgb16 | ColorType::Rgb32F => (PixelLayout::Rgb, false, ExtendedColorType::Rgb8),
        ColorType::Rgba16 | ColorType::Rgba32F => (PixelLayout::Rgba, false, ExtendedColorType::Rgba8),
        _ => return None,
    };
    Some(Plan { layout, direct, written })
}

fn describe(color: ExtendedColorType) -> &'static str {
    match color {
        ExtendedColorType::L8 => "gray",
        ExtendedColorType::La8 => "gray with alpha",
        ExtendedColorType::Rgb8 => "RGB",
        ExtendedColorType::Rgba8 => "RGBA",
        _ => "other",
    }
}

/// The encoder for the output's extension, checked against the pixels before any work.
#[derive(Debug, Clone, Copy)]
enum Encoding {
    Png,
    Jpeg,
    Pnm(Option<PnmSubtype>),
}

fn encoding(to: &Path, kind: ImageKind, color: ExtendedColorType, output: &str) -> anyhow::Result<Encoding> {
    let extension = to.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let what = describe(color);
    let alpha = matches!(color, ExtendedColorType::La8 | ExtendedColorType::Rgba8);
    Ok(match kind {
        ImageKind::Png => Encoding::Png,
        ImageKind::Jpeg if alpha => {
            bail!("{output}: JPEG has no alpha channel and the image is {what}: write .png or .pam")
        }
        ImageKind::Jpeg => Encoding::Jpeg,
        ImageKind::Pnm => {
            let binary = SampleEncoding::Binary;
            match (extension.as_str(), color) {
                ("pgm" | "pnm", ExtendedColorType::L8) => Encoding::Pnm(Some(PnmSubtype::Graymap(binary))),
                ("ppm" | "pnm", ExtendedColorType::Rgb8) => Encoding::Pnm(Some(PnmSubtype::Pixmap(binary))),
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
    from: &Path,
    to: &Path,
    kind: ImageKind,
    output_kind: ImageKind,
) -> anyhow::Result<Report> {
    let mut clock = Clock::start();
    let (input, output) = (job.input.to_string(), job.output.to_string());
    let file = File::open(from).with_context(|| format!("cannot open {input}"))?;
    let format = match kind {
        ImageKind::Png => ImageFormat::Png,
        ImageKind::Jpeg => ImageFormat::Jpeg,
        ImageKind::Pnm => ImageFormat::Pnm,
    };
    let cannot_decode = || format!("cannot decode {input} as {}", kind.name());
    let decoder =
        ImageReader::with_format(BufReader::new(file), format).into_decoder().with_context(cannot_decode)?;
    let (width, height) = decoder.dimensions();
    let color = decoder.color_type();
    let plan = plan(color).with_context(|| {
        format!("{input}: {color:?} pixels are not supported: hetmem filters 8-bit gray, RGB and RGBA")
    })?;
    let encoding = encoding(to, output_kind, plan.written, &output)?;
    let mut warnings = Vec::new();
    if !matches!(color, ColorType::L8 | ColorType::La8 | ColorType::Rgb8 | ColorType::Rgba8) {
        warnings.push(format!(
            "{input} has {color:?} pixels: hetmem filters 8 bits per channel, so they were converted to 8 bits \
             and {output} is 8-bit"
        ));
    }
    let frame = FrameFormat::new(width as usize, height as usize, plan.layout)
        .with_context(|| format!("cannot filter {input} ({width}x{height})"))?;
    let mut filter = FrameFilter::new(job.device, job.strategy, frame, job.kernel).with_context(|| {
        format!("cannot filter {input} ({width}x{height}) by the {} strategy", job.strategy)
    })?;
    if plan.direct {
        decoder.read_image(filter.input_mut()?).with_context(cannot_decode)?;
    } else {
        let image = DynamicImage::from_decoder(decoder).with_context(cannot_decode)?;
        let pixels = match plan.layout {
            PixelLayout::Gray => image.into_luma8().into_raw(),
            PixelLayout::Rgb => image.into_rgb8().into_raw(),
            _ => image.into_rgba8().into_raw(),
        };
        filter.input_mut()?.copy_from_slice(&pixels);
    }

    let latency =
        filter.run().with_context(|| format!("filtering {input} by the {} strategy", filter.strategy()))?;
    clock.frame(latency);

    let result = filter.output()?;
    let gray_alpha: Vec<u8>;
    let pixels = if plan.written == ExtendedColorType::La8 {
        // Filtered as RGBA with R = G = B, so R is the gray: the same weights on the same values.
        gray_alpha = result.chunks_exact(4).flat_map(|p| [p[0], p[3]]).collect();
        &gray_alpha[..]
    } else {
        result
    };
    write(to, encoding, pixels, width, height, plan.written)
        .with_context(|| format!("cannot write {output}"))?;
    let facts = Facts {
        input,
        output,
        kind: "image",
        format: format!("{} {color:?}", kind.name()),
        width: width as usize,
        height: height as usize,
        layout: plan.layout,
        strategy: filter.strategy(),
        warnings,
    };
    Ok(Report::new(facts, job.kernel, &clock))
}

fn write(
    to: &Path,
    encoding: Encoding,
    pixels: &[u8],
    width: u32,
    height: u32,
    color: ExtendedColorType,
) -> anyhow::Result<()> {
    let mut out = BufWriter::new(File::create(to)?);
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
    }
    out.flush()?;
    Ok(())
}
