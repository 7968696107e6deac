//! Frame formats: how the bytes of one frame are laid out in planes of samples.

use crate::error::{Error, Result};

/// How one sample (one channel of one pixel) is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum SampleType {
    /// One byte, 0 to 255.
    #[default]
    U8,
    /// Two bytes, little-endian, 0 to 65535: 16-bit images, and 9- to 16-bit video (a 10-bit
    /// sample holds 0 to 1023 in the low bits, as ffmpeg's `yuv420p10le` and Y4M's `C420p10` do).
    U16,
}

impl SampleType {
    /// Bytes per sample.
    pub fn bytes(self) -> usize {
        match self {
            SampleType::U8 => 1,
            SampleType::U16 => 2,
        }
    }

    /// Bits per sample.
    pub fn bits(self) -> u32 {
        8 * self.bytes() as u32
    }
}

/// How a frame's pixels are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum PixelLayout {
    /// One channel.
    Gray,
    /// Interleaved R, G, B.
    Rgb,
    /// Interleaved R, G, B, A (alpha is filtered like the others).
    Rgba,
    /// Planar Y, then U and V at half width and half height (rounded up).
    Yuv420,
    /// Planar Y, then U and V at half width (rounded up), full height.
    Yuv422,
    /// Planar Y, U, V, all full size.
    Yuv444,
}

/// One plane of a frame: a grid of pixels of `channels` interleaved samples each.
///
/// Only [`FrameFormat::planes`] makes the planes hetmem works on, and nothing in hetmem takes a
/// `Plane` from its caller, so its fields may be public: a plane a caller builds reaches no
/// kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plane {
    /// Byte offset of the plane in the frame.
    pub offset: usize,
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Samples per pixel.
    pub channels: usize,
    /// How each sample is stored.
    pub sample: SampleType,
}

impl Plane {
    /// Samples per row.
    pub fn row_samples(&self) -> usize {
        self.width * self.channels
    }

    /// Bytes per pixel.
    pub fn pixel_bytes(&self) -> usize {
        self.channels * self.sample.bytes()
    }

    /// Bytes per row (rows are packed, no padding).
    pub fn row_bytes(&self) -> usize {
        self.row_samples() * self.sample.bytes()
    }

    /// The plane's size in bytes.
    pub fn bytes(&self) -> usize {
        self.row_bytes() * self.height
    }
}

/// The size and layout of a frame, made by [`FrameFormat::new`]: its sides are 1 to
/// [`MAX_SIDE`], which the GPU's tiling and every byte count of the frame rely on, so the
/// fields are private (read them with [`FrameFormat::width`] and the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FrameFormat {
    width: usize,
    height: usize,
    layout: PixelLayout,
    sample: SampleType,
}

/// The largest side hetmem accepts: far beyond any real frame, small enough that sizes never
/// overflow.
pub const MAX_SIDE: usize = 1 << 16;

// The byte counts of a frame (`planes`, `frame_bytes`) are plain products of the sides: with
// both sides at most MAX_SIDE, the largest frame (RGBA, 16-bit; a 4:4:4 frame is smaller) is
// 2^35 bytes, far inside usize and inside the frames a stage lays out.
const _: () = assert!(MAX_SIDE * MAX_SIDE * 4 * 2 <= crate::stage::MAX_FRAME_BYTES);

impl FrameFormat {
    /// A frame format of 8-bit samples, checked.
    ///
    /// # Errors
    /// A zero side or one above [`MAX_SIDE`].
    pub fn new(width: usize, height: usize, layout: PixelLayout) -> Result<FrameFormat> {
        for (name, side) in [("width", width), ("height", height)] {
            if side == 0 || side > MAX_SIDE {
                return Err(Error::invalid(
                    "frame size",
                    format!("{name} {side}: give 1 to {MAX_SIDE} pixels"),
                ));
            }
        }
        Ok(FrameFormat { width, height, layout, sample: SampleType::U8 })
    }

    /// The same format with samples stored as `sample`.
    ///
    /// ```
    /// use hetmem::ops::gaussian::{FrameFormat, PixelLayout, SampleType};
    /// let format = FrameFormat::new(1920, 1080, PixelLayout::Yuv420)?.with_sample(SampleType::U16);
    /// assert_eq!(format.frame_bytes(), 2 * (1920 * 1080 + 2 * 960 * 540));
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn with_sample(self, sample: SampleType) -> FrameFormat {
        FrameFormat { sample, ..self }
    }

    /// Pixels per row, 1 to [`MAX_SIDE`].
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows, 1 to [`MAX_SIDE`].
    pub fn height(&self) -> usize {
        self.height
    }

    /// How the pixels are stored.
    pub fn layout(&self) -> PixelLayout {
        self.layout
    }

    /// How each sample is stored: 8 bits unless [`FrameFormat::with_sample`] says otherwise.
    pub fn sample(&self) -> SampleType {
        self.sample
    }

    /// What the format is, for messages: `1920x1080 Yuv420`, with `16-bit` for 16-bit samples.
    pub fn describe(&self) -> String {
        let bits = match self.sample {
            SampleType::U8 => String::new(),
            other => format!(" {}-bit", other.bits()),
        };
        format!("{}x{} {:?}{bits}", self.width, self.height, self.layout)
    }

    /// The planes, in order.
    pub fn planes(&self) -> Vec<Plane> {
        let (w, h, sample) = (self.width, self.height, self.sample);
        let bytes = sample.bytes();
        let plane = |offset, width, height, channels| Plane { offset, width, height, channels, sample };
        match self.layout {
            PixelLayout::Gray => vec![plane(0, w, h, 1)],
            PixelLayout::Rgb => vec![plane(0, w, h, 3)],
            PixelLayout::Rgba => vec![plane(0, w, h, 4)],
            PixelLayout::Yuv420 | PixelLayout::Yuv422 | PixelLayout::Yuv444 => {
                let (cw, ch) = match self.layout {
                    PixelLayout::Yuv420 => (w.div_ceil(2), h.div_ceil(2)),
                    PixelLayout::Yuv422 => (w.div_ceil(2), h),
                    _ => (w, h),
                };
                let luma = w * h * bytes;
                vec![plane(0, w, h, 1), plane(luma, cw, ch, 1), plane(luma + cw * ch * bytes, cw, ch, 1)]
            }
        }
    }

    /// Bytes in one frame.
    pub fn frame_bytes(&self) -> usize {
        self.planes().iter().map(Plane::bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plane_sizes_round_chroma_up() {
        let format = FrameFormat::new(1919, 1081, PixelLayout::Yuv420).unwrap();
        let planes = format.planes();
        assert_eq!((planes[1].width, planes[1].height), (960, 541));
        assert_eq!(planes[2].offset, 1919 * 1081 + 960 * 541);
        assert_eq!(format.frame_bytes(), 1919 * 1081 + 2 * 960 * 541);
        assert_eq!(FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap().frame_bytes(), 6_220_800);
        assert_eq!(FrameFormat::new(7, 3, PixelLayout::Yuv422).unwrap().frame_bytes(), 21 + 2 * 4 * 3);
    }

    #[test]
    fn sixteen_bit_samples_take_two_bytes_each_plane_after_plane() {
        let format = FrameFormat::new(1919, 1081, PixelLayout::Yuv420).unwrap().with_sample(SampleType::U16);
        let planes = format.planes();
        assert_eq!(planes[1].offset, 2 * 1919 * 1081);
        assert_eq!(planes[2].offset, 2 * (1919 * 1081 + 960 * 541));
        assert_eq!((planes[2].row_samples(), planes[2].row_bytes()), (960, 1920));
        assert_eq!(format.frame_bytes(), 2 * (1919 * 1081 + 2 * 960 * 541));
        let rgba = FrameFormat::new(7, 3, PixelLayout::Rgba).unwrap().with_sample(SampleType::U16);
        assert_eq!((rgba.planes()[0].pixel_bytes(), rgba.frame_bytes()), (8, 7 * 3 * 8));
        assert_eq!(rgba.describe(), "7x3 Rgba 16-bit");
        assert_eq!(FrameFormat::new(7, 3, PixelLayout::Rgba).unwrap().describe(), "7x3 Rgba");
        assert_eq!(FrameFormat::new(7, 3, PixelLayout::Gray).unwrap().sample(), SampleType::U8);
    }

    #[test]
    fn absurd_sizes_are_refused() {
        assert!(FrameFormat::new(0, 10, PixelLayout::Gray).is_err());
        assert!(FrameFormat::new(10, MAX_SIDE + 1, PixelLayout::Gray).is_err());
    }
}
