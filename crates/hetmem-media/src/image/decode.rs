//! Reading an image: its header first, the size it declares checked against the budget, then
//! its pixels straight into the caller's frame, whole or refused.

use std::io::Cursor;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{FrameFormat, PixelLayout, SampleType};
use image::codecs::pnm::{PnmDecoder, PnmSubtype, SampleEncoding};
use image::{ColorType, DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};

use super::ending::{self, Ending};
use super::{ImageKind, Plan, little_endian_in_place, plan};
use crate::budget::Budget;

/// The most bytes the decoders may allocate for themselves per pixel of the cap (float RGBA
/// takes 16 a pixel): `image`'s own limit, under hetmem's check of the declared size.
const DECODER_BYTES_PER_PIXEL: u64 = 16;

/// An encoded image whose header was read and whose declared size is within the budget:
/// nothing the size of the image is allocated yet.
pub struct Opened<'a> {
    decoder: Box<dyn ImageDecoder + 'a>,
    bytes: &'a [u8],
    kind: ImageKind,
    input: &'a str,
    budget: Budget,
    width: u32,
    height: u32,
    color: ColorType,
    plan: Plan,
    frame: FrameFormat,
}

impl std::fmt::Debug for Opened<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("kind", &self.kind)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("color", &self.color)
            .field("frame", &self.frame)
            .finish_non_exhaustive()
    }
}

impl<'a> Opened<'a> {
    /// Pixels per row and rows, as the header declares.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// The pixel type the decoder gives.
    pub fn color(&self) -> ColorType {
        self.color
    }

    /// How the pixels are filtered and written back.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// What the filter takes: one frame of this is what [`Opened::read_into`] fills.
    pub fn frame(&self) -> FrameFormat {
        self.frame
    }

    /// Reads the header of the `kind` image in `bytes` (named `input` in messages).
    ///
    /// # Errors
    /// A corrupt header, an unsupported pixel type, a size above the budget, or a binary PNM
    /// shorter than its header says.
    pub fn new(
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
        limits.max_alloc = Some(budget.max_pixels().saturating_mul(DECODER_BYTES_PER_PIXEL));
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
    /// `pixels` of another size than the frame, corrupt or truncated data.
    pub fn read_into(self, pixels: &mut [u8]) -> anyhow::Result<()> {
        let Opened { decoder, bytes, kind, input, budget, plan, frame, .. } = self;
        // The decoders panic on a buffer of another size than the image's: refused here instead.
        if pixels.len() != frame.frame_bytes() {
            bail!(
                "{input}: its frame takes {} bytes, and the memory given holds {}",
                frame.frame_bytes(),
                pixels.len()
            );
        }
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
            budget.max_pixels()
        ),
        _ => anyhow::Error::new(error).context(format!("cannot decode {input} as {}", kind.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_go_into_memory_of_the_frame_size_only() {
        let mut rng = fastrand::Rng::new();
        let pixels: Vec<u8> = (0..3 * 2).map(|_| rng.u8(1..)).collect();
        let mut pgm = b"P5\n3 2\n255\n".to_vec();
        pgm.extend_from_slice(&pixels);
        let open = || Opened::new(&pgm, ImageKind::Pnm, "in.pgm", &Budget::default()).unwrap();
        assert_eq!((open().size(), open().color(), open().frame().frame_bytes()), ((3, 2), ColorType::L8, 6));
        let error = open().read_into(&mut [0; 5]).unwrap_err().to_string();
        assert!(error.contains("in.pgm: its frame takes 6 bytes, and the memory given holds 5"), "{error}");
        let mut frame = [0; 6];
        open().read_into(&mut frame).unwrap();
        assert_eq!(frame[..], pixels[..]);
    }
}
