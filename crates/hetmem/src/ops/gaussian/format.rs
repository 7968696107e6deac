//! Frame formats: how the bytes of one frame are laid out in planes.

use crate::error::{Error, Result};

/// How a frame's pixels are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PixelLayout {
    /// One 8-bit channel.
    Gray,
    /// Interleaved 8-bit R, G, B.
    Rgb,
    /// Interleaved 8-bit R, G, B, A (alpha is filtered like the others).
    Rgba,
    /// Planar Y, then U and V at half width and half height (rounded up).
    Yuv420,
    /// Planar Y, then U and V at half width (rounded up), full height.
    Yuv422,
    /// Planar Y, U, V, all full size.
    Yuv444,
}

/// One plane of a frame: a grid of pixels of `channels` interleaved bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plane {
    /// Byte offset of the plane in the frame.
    pub offset: usize,
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Bytes per pixel.
    pub channels: usize,
}

impl Plane {
    /// Bytes per row (rows are packed, no padding).
    pub fn row_bytes(&self) -> usize {
        self.width * self.channels
    }

    /// The plane's size in bytes.
    pub fn bytes(&self) -> usize {
        self.row_bytes() * self.height
    }
}

/// The size and layout of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct FrameFormat {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// The layout.
    pub layout: PixelLayout,
}

/// The largest side hetmem accepts: far beyond any real frame, small enough that sizes never
/// overflow.
pub const MAX_SIDE: usize = 1 << 16;

impl FrameFormat {
    /// A frame format, checked.
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
        Ok(FrameFormat { width, height, layout })
    }

    /// The planes, in order.
    pub fn planes(&self) -> Vec<Plane> {
        let (w, h) = (self.width, self.height);
        let plane = |offset, width, height, channels| Plane { offset, width, height, channels };
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
                let luma = w * h;
                vec![plane(0, w, h, 1), plane(luma, cw, ch, 1), plane(luma + cw * ch, cw, ch, 1)]
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
    fn absurd_sizes_are_refused() {
        assert!(FrameFormat::new(0, 10, PixelLayout::Gray).is_err());
        assert!(FrameFormat::new(10, MAX_SIDE + 1, PixelLayout::Gray).is_err());
    }
}
