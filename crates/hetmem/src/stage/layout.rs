//! Frame layouts: the planes of one frame buffer, each a grid of samples of one element type,
//! with its own size and row pitch.

use crate::error::{Error, Result};

/// The type of one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ScalarType {
    /// Unsigned 8-bit.
    U8,
    /// Unsigned 16-bit, little-endian (10- and 12-bit video is stored this way too).
    U16,
    /// Signed 16-bit, little-endian.
    I16,
    /// IEEE half precision, carried as its raw 16 bits (hetmem never does arithmetic on it).
    F16,
    /// IEEE single precision.
    F32,
    /// Unsigned 32-bit (counters, indices, sums).
    U32,
}

impl ScalarType {
    /// Bytes per sample.
    pub fn size(self) -> usize {
        match self {
            ScalarType::U8 => 1,
            ScalarType::U16 | ScalarType::I16 | ScalarType::F16 => 2,
            ScalarType::F32 | ScalarType::U32 => 4,
        }
    }
}

/// One plane of a frame: `height` rows of `width` pixels of `channels` samples each, the rows
/// `pitch` bytes apart, the first at `offset` bytes into the frame buffer.
///
/// A description a caller fills in, so its fields are public: it reaches a kernel only inside
/// a [`FrameLayout`], whose constructor checks every field with checked arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PlaneLayout {
    /// Byte offset of the first row in the frame buffer.
    pub offset: usize,
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Interleaved samples per pixel.
    pub channels: usize,
    /// The samples' type.
    pub element: ScalarType,
    /// Bytes from one row's start to the next's (at least `row_bytes`).
    pub pitch: usize,
}

impl PlaneLayout {
    /// A plane with packed rows (`pitch` = `row_bytes`), at `offset`.
    pub fn packed(
        offset: usize,
        width: usize,
        height: usize,
        channels: usize,
        element: ScalarType,
    ) -> PlaneLayout {
        let plane = PlaneLayout { offset, width, height, channels, element, pitch: 0 };
        PlaneLayout { pitch: plane.row_bytes(), ..plane }
    }

    /// Bytes of samples in one row (without padding); `usize::MAX` for a row too long to count,
    /// which [`FrameLayout::new`] refuses.
    pub fn row_bytes(&self) -> usize {
        self.width.saturating_mul(self.channels).saturating_mul(self.element.size())
    }

    /// Bytes from the plane's first byte to one past its last sample; `usize::MAX` for a plane
    /// too long to count, which [`FrameLayout::new`] refuses.
    pub fn span(&self) -> usize {
        match self.height {
            0 => 0,
            rows => (rows - 1).saturating_mul(self.pitch).saturating_add(self.row_bytes()),
        }
    }
}

/// The largest frame hetmem lays out: far beyond any real frame, small enough that offsets
/// never overflow 64-bit arithmetic in kernels.
pub const MAX_FRAME_BYTES: usize = 1 << 40;

/// The most planes a frame has: a volume of this many slices is far beyond any scan, and a
/// layout's planes stay a list that fits in memory.
pub const MAX_PLANES: usize = 1 << 16;

/// The layout of one frame buffer: its planes, and its size in bytes.
///
/// # Examples
/// ```
/// use hetmem::stage::{ScalarType, FrameLayout, PlaneLayout};
/// // 10-bit 4:2:0 video, as Y4M C420p10 stores it: 16-bit samples, three packed planes.
/// let (w, h) = (1920, 1080);
/// let luma = PlaneLayout::packed(0, w, h, 1, ScalarType::U16);
/// let u = PlaneLayout::packed(luma.span(), w / 2, h / 2, 1, ScalarType::U16);
/// let v = PlaneLayout::packed(u.offset + u.span(), w / 2, h / 2, 1, ScalarType::U16);
/// let layout = FrameLayout::new(vec![luma, u, v])?;
/// assert_eq!(layout.bytes(), 2 * (w * h + 2 * (w / 2) * (h / 2)));
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FrameLayout {
    planes: Vec<PlaneLayout>,
    bytes: usize,
}

impl FrameLayout {
    /// A layout of `planes`, checked: each plane non-empty, its pitch at least its row, its
    /// samples aligned to their size, and no two planes overlapping. The frame is as long as
    /// the furthest plane end.
    ///
    /// # Errors
    /// No planes or more than [`MAX_PLANES`], an empty plane, a pitch shorter than a row, a
    /// misaligned plane, overlapping planes, or a frame above [`MAX_FRAME_BYTES`].
    pub fn new(planes: Vec<PlaneLayout>) -> Result<FrameLayout> {
        if planes.is_empty() {
            return Err(Error::invalid("frame layout", "no planes: a frame has at least one"));
        }
        if planes.len() > MAX_PLANES {
            return Err(too_many_planes(planes.len()));
        }
        let mut extents = Vec::with_capacity(planes.len());
        for (index, plane) in planes.iter().enumerate() {
            let bad = |problem: String| Error::invalid("frame layout", format!("plane {index}: {problem}"));
            if plane.width == 0 || plane.height == 0 || plane.channels == 0 {
                return Err(bad(format!(
                    "{}x{} pixels of {} channels: none may be 0",
                    plane.width, plane.height, plane.channels
                )));
            }
            let row = plane
                .width
                .checked_mul(plane.channels)
                .and_then(|samples| samples.checked_mul(plane.element.size()))
                .filter(|&row| row <= MAX_FRAME_BYTES)
                .ok_or_else(|| bad("a row overflows".into()))?;
            if plane.pitch < row {
                return Err(bad(format!("pitch {} bytes is shorter than a row of {row} bytes", plane.pitch)));
            }
            let size = plane.element.size();
            if !plane.offset.is_multiple_of(size) || !plane.pitch.is_multiple_of(size) {
                return Err(bad(format!(
                    "offset {} and pitch {} must be multiples of the {size}-byte samples",
                    plane.offset, plane.pitch
                )));
            }
            let end = (plane.height - 1)
                .checked_mul(plane.pitch)
                .and_then(|rows| rows.checked_add(row))
                .and_then(|span| span.checked_add(plane.offset))
                .filter(|&end| end <= MAX_FRAME_BYTES)
                .ok_or_else(|| bad(format!("ends beyond {MAX_FRAME_BYTES} bytes")))?;
            extents.push((plane.offset, end, index));
        }
        extents.sort_unstable();
        for pair in extents.windows(2) {
            let ((_, end, first), (start, _, second)) = (pair[0], pair[1]);
            if start < end {
                return Err(Error::invalid("frame layout", format!("planes {first} and {second} overlap")));
            }
        }
        let bytes = extents.iter().map(|&(_, end, _)| end).max().expect("at least one plane");
        Ok(FrameLayout { planes, bytes })
    }

    /// One packed plane of `width` x `height` pixels of `channels` samples.
    ///
    /// # Errors
    /// As for [`FrameLayout::new`].
    pub fn packed(width: usize, height: usize, channels: usize, element: ScalarType) -> Result<FrameLayout> {
        FrameLayout::new(vec![PlaneLayout::packed(0, width, height, channels, element)])
    }

    /// A 3-D frame: `depth` packed planes of `height` rows of `width` samples, one after
    /// another (x fastest, then y, then z), as a CT or MR volume is stored.
    ///
    /// # Examples
    /// ```
    /// use hetmem::stage::{ScalarType, FrameLayout};
    /// let ct = FrameLayout::volume(300, 512, 512, ScalarType::I16)?;
    /// assert_eq!((ct.planes().len(), ct.bytes()), (300, 300 * 512 * 512 * 2));
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    ///
    /// # Errors
    /// A side of 0, more than [`MAX_PLANES`] slices, or as for [`FrameLayout::new`] (a volume
    /// above [`MAX_FRAME_BYTES`] among them).
    pub fn volume(depth: usize, height: usize, width: usize, element: ScalarType) -> Result<FrameLayout> {
        if depth == 0 {
            return Err(Error::invalid("frame layout", "a volume of depth 0: it has at least one slice"));
        }
        if depth > MAX_PLANES {
            return Err(too_many_planes(depth));
        }
        // One slice checked alone first, so that its size is a true count; then the whole
        // volume, before a plane is listed.
        let slice = FrameLayout::packed(width, height, 1, element)?.planes[0];
        let slice_bytes = slice.span();
        if depth.checked_mul(slice_bytes).is_none_or(|bytes| bytes > MAX_FRAME_BYTES) {
            return Err(Error::invalid(
                "frame layout",
                format!(
                    "a volume of {depth} slices of {slice_bytes} bytes is above {MAX_FRAME_BYTES} bytes: \
                     give fewer or smaller slices"
                ),
            ));
        }
        FrameLayout::new((0..depth).map(|z| PlaneLayout { offset: z * slice_bytes, ..slice }).collect())
    }

    /// `len` samples in a row: a signal block, a vector.
    ///
    /// # Errors
    /// As for [`FrameLayout::new`].
    pub fn samples(len: usize, element: ScalarType) -> Result<FrameLayout> {
        FrameLayout::packed(len, 1, 1, element)
    }

    /// The planes, in the order given.
    pub fn planes(&self) -> &[PlaneLayout] {
        &self.planes
    }

    /// Bytes in one frame buffer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

fn too_many_planes(planes: usize) -> Error {
    Error::invalid(
        "frame layout",
        format!("{planes} planes: a frame has at most {MAX_PLANES}; cut the data into several frames"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitch_alignment_and_overlap_are_checked() {
        let plane = PlaneLayout {
            offset: 0,
            width: 100,
            height: 4,
            channels: 3,
            element: ScalarType::F32,
            pitch: 1216,
        };
        let layout = FrameLayout::new(vec![plane]).unwrap();
        assert_eq!(layout.bytes(), 3 * 1216 + 1200, "the last row has no padding after it");
        let short = PlaneLayout { pitch: 1196, ..plane };
        assert!(FrameLayout::new(vec![short]).unwrap_err().to_string().contains("shorter than a row"));
        let misaligned = PlaneLayout { offset: 2, ..plane };
        assert!(FrameLayout::new(vec![misaligned]).unwrap_err().to_string().contains("multiples"));
        let overlapping = PlaneLayout { offset: 1216, ..plane };
        assert!(FrameLayout::new(vec![plane, overlapping]).unwrap_err().to_string().contains("overlap"));
        let after = PlaneLayout { offset: layout.bytes(), ..plane };
        assert_eq!(FrameLayout::new(vec![plane, after]).unwrap().bytes(), 2 * layout.bytes());
        assert!(FrameLayout::new(vec![]).is_err());
        assert!(FrameLayout::packed(0, 1, 1, ScalarType::U8).is_err());
        assert!(FrameLayout::packed(usize::MAX / 2, 3, 1, ScalarType::U16).is_err());
        assert_eq!(FrameLayout::samples(1024, ScalarType::F32).unwrap().bytes(), 4096);
    }

    #[test]
    fn a_volume_is_its_slices_packed_one_after_another() {
        for element in [ScalarType::I16, ScalarType::U16, ScalarType::F32, ScalarType::U8] {
            let (d, h, w) = (fastrand::usize(1..20), fastrand::usize(1..40), fastrand::usize(1..40));
            let volume = FrameLayout::volume(d, h, w, element).unwrap();
            assert_eq!(volume.bytes(), d * h * w * element.size(), "{element:?}");
            assert_eq!(volume.planes().len(), d);
            for (z, plane) in volume.planes().iter().enumerate() {
                assert_eq!((plane.offset, plane.width, plane.height), (z * h * w * element.size(), w, h));
            }
        }
        assert!(FrameLayout::volume(0, 4, 4, ScalarType::I16).unwrap_err().to_string().contains("depth 0"));
        assert!(FrameLayout::volume(3, 0, 4, ScalarType::F32).is_err());
    }
}
