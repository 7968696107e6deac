//! [`VolumeShape`] and [`LabelledVolume`]: the size of a volume, checked once, and a volume with
//! its template that holds it. Each in a module of its own, so that no other code of hetmem can
//! build one without its constructor's checks either.

use crate::error::{Error, Result};

/// The size of a volume: `depth` slices of `height` rows of `width` voxels, x fastest.
///
/// Made by [`VolumeShape::new`] only, which checks that every side is at least 1 and that the
/// volume's bytes (four per voxel, the widest element the CT kernels use) fit in `usize`: the
/// kernels walk the volume by its sides, and the buffers they get are checked against
/// [`VolumeShape::voxels`], so the fields are private.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VolumeShape {
    depth: usize,
    height: usize,
    width: usize,
}

impl VolumeShape {
    /// A shape; every side at least 1.
    ///
    /// ```
    /// use hetmem::ops::ct::VolumeShape;
    /// assert_eq!(VolumeShape::new(300, 512, 512)?.voxels(), 300 * 512 * 512);
    /// // A product that would wrap around to a small number is refused.
    /// assert!(VolumeShape::new(2, (1 << 63) + 1, 1).is_err());
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    ///
    /// # Errors
    /// A side of 0, or more voxels than memory can address.
    pub fn new(depth: usize, height: usize, width: usize) -> Result<VolumeShape> {
        if depth == 0 || height == 0 || width == 0 {
            return Err(Error::invalid(
                "volume shape",
                format!("{depth}x{height}x{width}: every side must be at least 1 voxel"),
            ));
        }
        let bytes =
            depth.checked_mul(height).and_then(|n| n.checked_mul(width)).and_then(|n| n.checked_mul(4));
        if bytes.is_none() {
            return Err(Error::invalid(
                "volume shape",
                format!(
                    "{depth}x{height}x{width}: more voxels than memory can address; give the \
                     volume's own sides (depth x height x width)"
                ),
            ));
        }
        Ok(VolumeShape { depth, height, width })
    }

    /// Slices.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Rows per slice.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Voxels per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Voxels in the volume (the constructor checked that the product, and four bytes of each,
    /// fits).
    pub fn voxels(&self) -> usize {
        self.depth * self.height * self.width
    }

    /// Fails unless a buffer of `len` elements holds exactly this volume.
    pub(crate) fn check_len(&self, what: &'static str, len: usize) -> Result<()> {
        if len == self.voxels() {
            return Ok(());
        }
        Err(Error::invalid(
            what,
            format!(
                "{len} elements for a {}x{}x{} volume of {} voxels",
                self.depth,
                self.height,
                self.width,
                self.voxels()
            ),
        ))
    }
}

/// A volume of HU values and its label template, of one shape: [`LabelledVolume::new`] checks
/// that both hold the shape, and the fields are private so that they keep doing so.
#[derive(Debug, Clone)]
pub struct LabelledVolume {
    shape: VolumeShape,
    hu: Vec<i16>,
    labels: Vec<u8>,
}

impl LabelledVolume {
    /// A volume and its template.
    ///
    /// # Errors
    /// Either of another size than `shape`.
    pub fn new(shape: VolumeShape, hu: Vec<i16>, labels: Vec<u8>) -> Result<LabelledVolume> {
        shape.check_len("volume", hu.len())?;
        shape.check_len("label template", labels.len())?;
        Ok(LabelledVolume { shape, hu, labels })
    }

    /// Its shape.
    pub fn shape(&self) -> VolumeShape {
        self.shape
    }

    /// HU values, x fastest, then y (front to back), then z (head to feet).
    pub fn hu(&self) -> &[i16] {
        &self.hu
    }

    /// The template: a label per voxel.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The shape, the HU values and the template, taken apart.
    pub fn into_parts(self) -> (VolumeShape, Vec<i16>, Vec<u8>) {
        (self.shape, self.hu, self.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_whose_voxels_wrap_are_refused() {
        // The product of the sides wraps to 2: a shape the 2-voxel buffer would have passed.
        let error = VolumeShape::new(2, (1 << 63) + 1, 1).unwrap_err().to_string();
        assert!(error.contains("more voxels than memory can address"), "{error}");
        assert!(VolumeShape::new(1, usize::MAX / 2, 3).is_err(), "the bytes wrap, not the voxels");
        assert!(VolumeShape::new(1, usize::MAX / 4, 1).is_ok(), "four bytes a voxel still fit");
        let error = VolumeShape::new(3, 0, 4).unwrap_err().to_string();
        assert!(error.contains("at least 1"), "{error}");
    }
}
