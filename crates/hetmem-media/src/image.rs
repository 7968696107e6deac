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
//! A truncated file is refused, not filled in: a JPEG or PNG must reach its end marker, a
//! binary PNM must hold every pixel byte its header declares.
//!
//! Reading is [`Opened`] (the header, the budget, then the pixels into the caller's frame);
//! writing is [`encoding`] (checked before any work) and [`write()`].

mod decode;
mod encode;
mod ending;

use hetmem::ops::gaussian::{PixelLayout, SampleType};
use image::{ColorType, ExtendedColorType};

pub use self::decode::Opened;
pub use self::encode::{Encoding, encoding, write};

/// The image formats, by what the `image` crate calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// PNG.
    Png,
    /// JPEG.
    Jpeg,
    /// PPM, PGM, PBM or PAM; the extension picks the flavour on output.
    Pnm,
}

impl ImageKind {
    /// `PNG`, `JPEG` or `PNM`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::Png => "PNG",
            ImageKind::Jpeg => "JPEG",
            ImageKind::Pnm => "PNM",
        }
    }
}

/// How a decoded pixel type is filtered and written: what the filter sees, and what is
/// written back ([`Opened::plan`]).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// What the filter sees.
    layout: PixelLayout,
    sample: SampleType,
    /// Decoded straight into the filter (gray, RGB, RGBA of 8 or 16 bits), or converted first.
    direct: bool,
    /// What is written.
    written: ExtendedColorType,
}

impl Plan {
    /// The pixel layout the filter sees (gray with alpha is filtered as RGBA).
    pub fn layout(&self) -> PixelLayout {
        self.layout
    }

    /// The sample type the filter sees: 8 bits, or 16 (little-endian in the frame).
    pub fn sample(&self) -> SampleType {
        self.sample
    }

    /// The pixel type written back.
    pub fn written(&self) -> ExtendedColorType {
        self.written
    }
}

/// How pixels of `color` are filtered and written; `None` for types hetmem does not filter.
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

/// A pixel type in words, for messages.
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

/// Turns 16-bit samples in this machine's byte order into little-endian ones (the frame's
/// order), in place: nothing to do on a little-endian machine.
pub(crate) fn little_endian_in_place(pixels: &mut [u8], sample: SampleType) {
    if cfg!(target_endian = "big") && sample == SampleType::U16 {
        for pair in pixels.chunks_exact_mut(2) {
            pair.swap(0, 1);
        }
    }
}
