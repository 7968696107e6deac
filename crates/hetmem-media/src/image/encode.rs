//! Writing an image: the encoder for the output's extension, checked against the pixels before
//! any work, then the filter's output memory encoded straight into the file.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::Path;

use anyhow::bail;
use hetmem::ops::gaussian::{FrameFormat, SampleType};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::pnm::{PnmEncoder, PnmSubtype, SampleEncoding};
use image::{ExtendedColorType, ImageEncoder};

use super::{ImageKind, Plan, describe, little_endian_in_place};

/// JPEG output quality (image's own default is 75).
const JPEG_QUALITY: u8 = 90;

/// The encoder for the output's extension, checked against the pixels before any work.
#[derive(Debug, Clone, Copy)]
pub struct Encoding(Encoder);

#[derive(Debug, Clone, Copy)]
enum Encoder {
    Png,
    Jpeg,
    Pnm(Option<PnmSubtype>),
    /// A binary PGM (`P5`) or PPM (`P6`) of 16-bit samples, which `image`'s PNM encoder writes
    /// at 8 bits only: the magic number.
    Pnm16(&'static str),
}

/// The encoder for an output of `kind` at `to` (named `output` in messages), for pixels of
/// `color` ([`Plan::written`](super::Plan::written)): the extension picks PNM's flavour.
///
/// # Errors
/// The format cannot hold the pixels (alpha or 16 bits in JPEG, colour in a PGM, ...).
pub fn encoding(
    to: &Path,
    kind: ImageKind,
    color: ExtendedColorType,
    output: &str,
) -> anyhow::Result<Encoding> {
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
    Ok(Encoding(match kind {
        ImageKind::Png => Encoder::Png,
        ImageKind::Jpeg if alpha => {
            bail!("{output}: JPEG has no alpha channel and the image is {what}: write .png or .pam")
        }
        ImageKind::Jpeg if wide => bail!(
            "{output}: JPEG holds 8 bits per channel and the image is {what}: write .png, .pnm or .pam to keep \
             its 16 bits"
        ),
        ImageKind::Jpeg => Encoder::Jpeg,
        ImageKind::Pnm => {
            let binary = SampleEncoding::Binary;
            match (extension.as_str(), color) {
                ("pgm" | "pnm", ExtendedColorType::L8) => Encoder::Pnm(Some(PnmSubtype::Graymap(binary))),
                ("ppm" | "pnm", ExtendedColorType::Rgb8) => Encoder::Pnm(Some(PnmSubtype::Pixmap(binary))),
                ("pgm" | "pnm", ExtendedColorType::L16) => Encoder::Pnm16("P5"),
                ("ppm" | "pnm", ExtendedColorType::Rgb16) => Encoder::Pnm16("P6"),
                // PAM holds any of them; `None` lets the encoder write its header.
                ("pam" | "pnm", _) => Encoder::Pnm(None),
                ("pgm", _) => bail!(
                    "{output}: a PGM holds gray pixels and the image is {what}: write .png, .pnm or .pam"
                ),
                ("ppm", _) => bail!(
                    "{output}: a PPM holds RGB pixels and the image is {what}: write .png, .pnm or .pam"
                ),
                _ => bail!("{output}: PBM holds 1-bit pixels: write .pgm, .ppm, .pnm, .pam or .png"),
            }
        }
    }))
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

/// Writes `frame` (the filter's output: one frame of [`Opened::frame`](super::Opened::frame),
/// 16-bit samples little-endian), a `width` x `height` image filtered as `plan` says, to `file`
/// by `encoding`.
///
/// # Errors
/// A frame of another size than `width` x `height` of the plan's pixels, the encoder or the
/// file failing.
pub fn write(
    file: File,
    encoding: Encoding,
    frame: &[u8],
    (width, height): (u32, u32),
    plan: Plan,
) -> anyhow::Result<()> {
    // The encoders panic on a buffer of another size than the image's: refused here instead.
    let expected = FrameFormat::new(width as usize, height as usize, plan.layout)?.with_sample(plan.sample);
    if frame.len() != expected.frame_bytes() {
        bail!(
            "a {width}x{height} image of {} samples takes {} bytes, and the frame holds {}",
            describe(plan.written),
            expected.frame_bytes(),
            frame.len()
        );
    }
    // Filtered as RGBA with R = G = B, so R is the gray: the same weights on the same values.
    let gray_alpha: Vec<u8> = match plan.written {
        ExtendedColorType::La8 => frame.chunks_exact(4).flat_map(|p| [p[0], p[3]]).collect(),
        ExtendedColorType::La16 => frame.chunks_exact(8).flat_map(|p| [p[0], p[1], p[6], p[7]]).collect(),
        _ => Vec::new(),
    };
    let pixels = if gray_alpha.is_empty() { frame } else { &gray_alpha[..] };
    let pixels = &native_endian(pixels, plan.sample)[..];
    let color = plan.written;
    let mut out = BufWriter::new(file);
    match encoding.0 {
        Encoder::Png => PngEncoder::new(&mut out).write_image(pixels, width, height, color)?,
        Encoder::Jpeg => {
            JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY).write_image(pixels, width, height, color)?
        }
        Encoder::Pnm(subtype) => {
            let encoder = PnmEncoder::new(&mut out);
            let encoder = match subtype {
                Some(subtype) => encoder.with_subtype(subtype),
                None => encoder,
            };
            encoder.write_image(pixels, width, height, color)?;
        }
        Encoder::Pnm16(magic) => {
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

#[cfg(test)]
mod tests {
    use image::ColorType;

    use super::*;

    #[test]
    fn a_frame_is_written_whole_or_refused_by_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("out.png");
        let plan = super::super::plan(ColorType::Rgb8).unwrap();
        let encoding = encoding(&to, ImageKind::Png, plan.written(), "out.png").unwrap();
        let mut rng = fastrand::Rng::new();
        let frame: Vec<u8> = (0..5 * 3 * 3).map(|_| rng.u8(1..)).collect();
        let error = write(File::create(&to).unwrap(), encoding, &frame[1..], (5, 3), plan).unwrap_err();
        assert!(error.to_string().contains("takes 45 bytes, and the frame holds 44"), "{error}");
        write(File::create(&to).unwrap(), encoding, &frame, (5, 3), plan).unwrap();
        let back = image::open(&to).unwrap().into_rgb8();
        assert_eq!(back.dimensions(), (5, 3));
        assert!(back.into_raw() == frame, "the PNG read back differs from the frame written");
    }
}
