//! Raw video for ffmpeg users: `--raw WxH:pix_fmt`, as ffmpeg's `-f rawvideo -pix_fmt
//! pix_fmt -s WxH` reads and writes it. The stream is whole frames back to back, with no
//! header; the output is raw frames of the same size and format. The frames are read and
//! written by [`crate::frames`], as Y4M's are; how they lie in the stream is [`Packing`].
//!
//! ```text
//! ffmpeg -i in.mp4 -f rawvideo -pix_fmt nv12 - | hetmem filter --raw 1920x1080:nv12 - - \
//!     | ffmpeg -f rawvideo -pix_fmt nv12 -s 1920x1080 -i - out.mp4
//! ```
//!
//! nv12 holds U and V interleaved in one plane: each frame is de-interleaved into planar
//! 4:2:0 as it is read (so U and V are blurred as the separate planes they are, exactly as
//! yuv420p's) and interleaved again as it is written.

use std::fmt;

use anyhow::Context as _;
use hetmem::ops::gaussian::{FrameFormat, PixelLayout};

use crate::container::{Container, Packing, Video};

/// The pixel formats `--raw` takes, by ffmpeg's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixFmt {
    /// One 8-bit plane.
    Gray,
    /// Interleaved 8-bit R, G, B.
    Rgb24,
    /// Planar Y, U, V; U and V at half width and half height (rounded up).
    Yuv420p,
    /// Planar Y, then one plane of U and V interleaved, at half width and half height.
    Nv12,
}

impl PixFmt {
    pub(crate) const ALL: [PixFmt; 4] = [PixFmt::Gray, PixFmt::Rgb24, PixFmt::Yuv420p, PixFmt::Nv12];

    fn name(self) -> &'static str {
        match self {
            PixFmt::Gray => "gray",
            PixFmt::Rgb24 => "rgb24",
            PixFmt::Yuv420p => "yuv420p",
            PixFmt::Nv12 => "nv12",
        }
    }

    fn layout(self) -> PixelLayout {
        match self {
            PixFmt::Gray => PixelLayout::Gray,
            PixFmt::Rgb24 => PixelLayout::Rgb,
            PixFmt::Yuv420p | PixFmt::Nv12 => PixelLayout::Yuv420,
        }
    }
}

/// `--raw WxH:pix_fmt`: the size and pixel format of raw video, which the stream does not
/// say. [`video`] checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSpec {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// How the pixels are stored.
    pub pix_fmt: PixFmt,
}

impl fmt::Display for RawSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}:{}", self.width, self.height, self.pix_fmt.name())
    }
}

/// What `--raw` takes, for messages and `--help`.
pub const RAW_FORMATS: &str = "gray, rgb24, yuv420p, nv12";

/// Parses `--raw`: `WxH:pix_fmt`, e.g. `1920x1080:yuv420p`.
///
/// # Errors
/// Anything else, saying what is expected.
pub fn parse_spec(text: &str) -> Result<RawSpec, String> {
    let usage = format!("give WxH:pix_fmt, e.g. 1920x1080:yuv420p, with pix_fmt one of {RAW_FORMATS}");
    let (size, name) = text.split_once(':').ok_or_else(|| format!("no pixel format: {usage}"))?;
    let pix_fmt = PixFmt::ALL
        .into_iter()
        .find(|pix_fmt| pix_fmt.name() == name.trim().to_ascii_lowercase())
        .ok_or_else(|| {
            format!("unknown pixel format `{name}`: {usage} (convert others with ffmpeg's -pix_fmt)")
        })?;
    let side = |side: Option<&str>, what: &str| -> Result<usize, String> {
        // Digits only: `parse` would take a sign too.
        side.filter(|side| !side.is_empty() && side.bytes().all(|byte| byte.is_ascii_digit()))
            .and_then(|side| side.parse().ok())
            .ok_or_else(|| format!("no {what} in `{size}`: {usage}"))
    };
    let mut sides = size.split('x');
    let (width, height) = (side(sides.next(), "width")?, side(sides.next(), "height")?);
    if sides.next().is_some() {
        return Err(format!("`{size}` is not a size: {usage}"));
    }
    FrameFormat::new(width, height, pix_fmt.layout()).map_err(|error| error.to_string())?;
    Ok(RawSpec { width, height, pix_fmt })
}

/// The video `--raw spec` declares: what each frame is, and how the stream holds it.
///
/// # Errors
/// A size the pixel format cannot take.
pub fn video(spec: RawSpec) -> anyhow::Result<Video> {
    let format = FrameFormat::new(spec.width, spec.height, spec.pix_fmt.layout())
        .with_context(|| format!("--raw {spec}"))?;
    let packing = match spec.pix_fmt {
        PixFmt::Nv12 => Packing::Nv12 { luma: format.planes()[0].bytes() },
        _ => Packing::Planar,
    };
    Ok(Video {
        format,
        container: Container::Raw { packing },
        pixels: spec.pix_fmt.name().into(),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_as_ffmpeg_writes_them_and_bad_ones_say_what_is_expected() {
        assert_eq!(
            parse_spec("1920x1080:yuv420p").unwrap(),
            RawSpec { width: 1920, height: 1080, pix_fmt: PixFmt::Yuv420p }
        );
        assert_eq!(parse_spec("33x17:NV12").unwrap().pix_fmt, PixFmt::Nv12);
        assert_eq!(parse_spec("2x2:rgb24").unwrap().to_string(), "2x2:rgb24");
        for (bad, said) in [
            ("1920x1080", "no pixel format"),
            ("1920x1080:yuv422p", "unknown pixel format `yuv422p`"),
            ("1920:gray", "no height"),
            ("x1080:gray", "no width"),
            ("+1x2:gray", "no width"),
            ("1x2x3:gray", "is not a size"),
            ("0x2:gray", "width 0"),
            ("70000x2:gray", "width 70000"),
        ] {
            let error = parse_spec(bad).unwrap_err();
            assert!(error.contains(said), "{bad}: {error}");
        }
        assert!(parse_spec("1920x1080").unwrap_err().contains(RAW_FORMATS));
    }
}
