//! Volumes and label templates from files: raw (the voxels alone, x fastest, little-endian)
//! and, with the `nifti` feature, NIfTI-1 (`.nii`, `.nii.gz`, through the `nifti` crate).

use std::path::Path;

use super::VolumeShape;
use crate::error::{Error, Result};

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })
}

fn check_size(path: &Path, bytes: usize, shape: VolumeShape, element: usize, kind: &str) -> Result<()> {
    let wanted = shape.voxels() * element;
    if bytes == wanted {
        return Ok(());
    }
    Err(Error::invalid(
        "raw volume",
        format!(
            "{} holds {bytes} bytes, but {}x{}x{} voxels of {kind} are {wanted} bytes: give the file's own shape \
             (depth x height x width)",
            path.display(),
            shape.depth(),
            shape.height(),
            shape.width()
        ),
    ))
}

/// A raw volume of little-endian i16 HU values of `shape`.
///
/// # Errors
/// A file that cannot be read, or whose size is not `shape`'s.
pub fn read_raw_hu(path: &Path, shape: VolumeShape) -> Result<Vec<i16>> {
    let bytes = read(path)?;
    check_size(path, bytes.len(), shape, 2, "i16")?;
    Ok(bytes.chunks_exact(2).map(|pair| i16::from_le_bytes([pair[0], pair[1]])).collect())
}

/// A raw label template of u8 labels of `shape`.
///
/// # Errors
/// A file that cannot be read, or whose size is not `shape`'s.
pub fn read_raw_labels(path: &Path, shape: VolumeShape) -> Result<Vec<u8>> {
    let bytes = read(path)?;
    check_size(path, bytes.len(), shape, 1, "u8")?;
    Ok(bytes)
}

#[cfg(feature = "nifti")]
mod nifti_file {
    use std::path::Path;

    use nifti::{NiftiHeader, NiftiObject, NiftiType, ReaderOptions};

    use super::super::VolumeShape;
    use crate::error::{Error, Result};

    fn malformed(path: &Path, problem: impl std::fmt::Display) -> Error {
        Error::invalid(
            "NIfTI file",
            format!("{}: {problem}; give a NIfTI-1 file (.nii or .nii.gz) of a 3-D volume", path.display()),
        )
    }

    /// The file's shape and its voxels as f64, scaled by `scl_slope` and `scl_inter` where set.
    /// The most a deflate stream expands: 1032 bytes out for each byte in.
    const GZIP_MAX_RATIO: u64 = 1032;

    /// Refuses a header that claims more voxel bytes than the file can hold, before the volume
    /// is read: the `nifti` crate reserves what the header claims, which a few bytes of header
    /// can make terabytes.
    fn check_claims(path: &Path) -> Result<()> {
        let header = NiftiHeader::from_file(path).map_err(|error| malformed(path, error))?;
        let size = std::fs::metadata(path)
            .map_err(|source| Error::Io { context: format!("reading {}", path.display()), source })?
            .len();
        let dim = header.dim().map_err(|error| malformed(path, error))?;
        let datatype = header.data_type().map_err(|error| malformed(path, error))?;
        let claimed = dim
            .iter()
            .try_fold(1u64, |voxels, &extent| voxels.checked_mul(u64::from(extent)))
            .and_then(|voxels| voxels.checked_mul(datatype.size_of() as u64));
        let gzip = path.file_name().is_some_and(|name| name.to_string_lossy().ends_with(".gz"));
        // A float's cast saturates: a negative or NaN offset counts as 0.
        let holds = if gzip {
            size.saturating_mul(GZIP_MAX_RATIO)
        } else {
            size.saturating_sub(header.vox_offset as u64)
        };
        check_extensions(path, &header, gzip)?;
        match claimed {
            Some(claimed) if claimed <= holds => Ok(()),
            _ => Err(malformed(
                path,
                format!(
                    "its header claims {} bytes of voxels ({dim:?} of {datatype:?}), more than a {size}-byte {}file \
                     can hold",
                    claimed.map_or_else(|| "more than 2^64".to_string(), |claimed| claimed.to_string()),
                    if gzip { "gzip " } else { "" }
                ),
            )),
        }
    }

    /// The bytes where the NIfTI-1 header and its extender end (348 + 4).
    const EXTENSIONS_START: u64 = 352;

    /// Refuses extensions that the `nifti` crate would reserve memory for before reading them:
    /// it takes each extension's size from the file and reserves it, so a few bytes claiming
    /// 2 GiB cost 2 GiB. Walked here first, on the (decompressed) stream: each size at least
    /// 8, inside the header's `vox_offset`, and its bytes really there.
    fn check_extensions(path: &Path, header: &NiftiHeader, gzip: bool) -> Result<()> {
        use std::io::Read;
        let io_error = |source| Error::Io { context: format!("reading {}", path.display()), source };
        let file = std::io::BufReader::new(std::fs::File::open(path).map_err(io_error)?);
        let mut stream: Box<dyn Read> =
            if gzip { Box::new(flate2::bufread::GzDecoder::new(file)) } else { Box::new(file) };
        let mut start = [0u8; EXTENSIONS_START as usize];
        if stream.read_exact(&mut start).is_err() || start[348] == 0 {
            return Ok(()); // too short for extensions (the reader says so), or none
        }
        // A float's cast saturates: a negative or NaN offset counts as 0.
        let end = (header.vox_offset as u64).saturating_sub(EXTENSIONS_START);
        let mut at = 0u64;
        while at < end {
            let mut sizes = [0u8; 8];
            if stream.read_exact(&mut sizes).is_err() {
                return Err(malformed(
                    path,
                    format!("the file ends inside extension {at} bytes past its header"),
                ));
            }
            let word = [sizes[0], sizes[1], sizes[2], sizes[3]];
            let esize = if header.endianness == nifti::Endianness::Big {
                i32::from_be_bytes(word)
            } else {
                i32::from_le_bytes(word)
            };
            let fits = u64::try_from(esize).is_ok_and(|esize| esize >= 8 && esize <= end - at);
            if !fits {
                return Err(malformed(
                    path,
                    format!(
                        "an extension {at} bytes past its header claims {esize} bytes, outside the {end} bytes \
                         before its voxels (vox_offset {})",
                        header.vox_offset
                    ),
                ));
            }
            let data = esize as u64 - 8;
            let skipped =
                std::io::copy(&mut (&mut stream).take(data), &mut std::io::sink()).map_err(io_error)?;
            if skipped != data {
                return Err(malformed(
                    path,
                    format!(
                        "an extension {at} bytes past its header claims {esize} bytes; the file ends first"
                    ),
                ));
            }
            at += esize as u64;
        }
        Ok(())
    }

    fn read_scaled(path: &Path) -> Result<(VolumeShape, Vec<f64>)> {
        check_claims(path)?;
        let object = ReaderOptions::new().read_file(path).map_err(|error| malformed(path, error))?;
        let header = object.header().clone();
        let dim = header.dim().map_err(|error| malformed(path, error))?;
        let (width, height, depth) = match dim {
            [x, y, z] => (*x, *y, *z),
            [x, y, z, 1] => (*x, *y, *z),
            other => return Err(malformed(path, format!("{} dimensions ({other:?}), not 3", other.len()))),
        };
        let shape = VolumeShape::new(usize::from(depth), usize::from(height), usize::from(width))?;
        let (slope, inter) = (f64::from(header.scl_slope), f64::from(header.scl_inter));
        let scaled = slope != 0.0 && (slope, inter) != (1.0, 0.0);
        let datatype = header.data_type().map_err(|error| malformed(path, error))?;
        let volume = object.into_volume();
        let typed = |error| malformed(path, error);
        let values: Vec<f64> = match datatype {
            NiftiType::Uint8 => {
                volume.into_nifti_typed_data::<u8>().map_err(typed)?.into_iter().map(f64::from).collect()
            }
            NiftiType::Int16 => {
                volume.into_nifti_typed_data::<i16>().map_err(typed)?.into_iter().map(f64::from).collect()
            }
            NiftiType::Uint16 => {
                volume.into_nifti_typed_data::<u16>().map_err(typed)?.into_iter().map(f64::from).collect()
            }
            NiftiType::Int32 => {
                volume.into_nifti_typed_data::<i32>().map_err(typed)?.into_iter().map(f64::from).collect()
            }
            NiftiType::Float32 => {
                volume.into_nifti_typed_data::<f32>().map_err(typed)?.into_iter().map(f64::from).collect()
            }
            other => {
                return Err(malformed(
                    path,
                    format!("voxels of type {other:?}; u8, i16, u16, i32 or f32 are read"),
                ));
            }
        };
        if values.len() != shape.voxels() {
            return Err(malformed(path, format!("{} voxels for dimensions {dim:?}", values.len())));
        }
        let values = if scaled { values.into_iter().map(|v| v * slope + inter).collect() } else { values };
        Ok((shape, values))
    }

    fn narrow<T>(
        path: &Path,
        values: Vec<f64>,
        kind: &str,
        convert: impl Fn(f64) -> Option<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(values.len());
        for (index, value) in values.into_iter().enumerate() {
            match convert(value.round()) {
                Some(converted) => out.push(converted),
                None => {
                    return Err(malformed(
                        path,
                        format!("voxel {index} is {value}, outside the range of {kind}"),
                    ));
                }
            }
        }
        Ok(out)
    }

    /// A NIfTI volume of HU values (after the header's scaling), as i16.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, not 3-D, of an unread voxel type, or with values
    /// outside i16.
    pub fn read_nifti_hu(path: &Path) -> Result<(VolumeShape, Vec<i16>)> {
        let (shape, values) = read_scaled(path)?;
        let hu = narrow(path, values, "i16", |v| {
            (f64::from(i16::MIN)..=f64::from(i16::MAX)).contains(&v).then_some(v as i16)
        })?;
        Ok((shape, hu))
    }

    /// A NIfTI label template, as u8.
    ///
    /// # Errors
    /// As [`read_nifti_hu`], and labels outside 0..=255.
    pub fn read_nifti_labels(path: &Path) -> Result<(VolumeShape, Vec<u8>)> {
        let (shape, values) = read_scaled(path)?;
        let labels = narrow(path, values, "u8 labels", |v| (0.0..=255.0).contains(&v).then_some(v as u8))?;
        Ok((shape, labels))
    }
}

#[cfg(feature = "nifti")]
pub use nifti_file::{read_nifti_hu, read_nifti_labels};

#[cfg(test)]
mod tests {
    use super::*;

    fn random_shape(rng: &mut fastrand::Rng) -> VolumeShape {
        VolumeShape::new(rng.usize(1..9), rng.usize(1..20), rng.usize(1..30)).unwrap()
    }

    #[test]
    fn raw_files_read_back_and_a_wrong_size_names_both_sizes() {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let shape = random_shape(&mut rng);
        let hu: Vec<i16> = (0..shape.voxels()).map(|_| rng.i16(..)).collect();
        let labels: Vec<u8> = (0..shape.voxels()).map(|_| rng.u8(..)).collect();
        let dir = tempfile::tempdir().unwrap();
        let (hu_path, labels_path) = (dir.path().join("hu.i16"), dir.path().join("labels.u8"));
        std::fs::write(&hu_path, hu.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        std::fs::write(&labels_path, &labels).unwrap();
        assert_eq!(read_raw_hu(&hu_path, shape).unwrap(), hu);
        assert_eq!(read_raw_labels(&labels_path, shape).unwrap(), labels);
        let bigger = VolumeShape::new(shape.depth() + 1, shape.height(), shape.width()).unwrap();
        let error = read_raw_hu(&hu_path, bigger).unwrap_err().to_string();
        assert!(error.contains(&format!("{} bytes", hu.len() * 2)) && error.contains("shape"), "{error}");
        let missing = read_raw_labels(&dir.path().join("absent"), shape).unwrap_err().to_string();
        assert!(missing.contains("absent"), "{missing}");
    }

    /// A NIfTI-1 single file (`.nii`): the 348-byte header, 4 bytes of no extension, the voxels.
    #[cfg(feature = "nifti")]
    fn nifti_file(dims: &[u16], datatype: i16, bitpix: i16, slope_inter: (f32, f32), data: &[u8]) -> Vec<u8> {
        let mut header = vec![0u8; 352];
        header[0..4].copy_from_slice(&348i32.to_le_bytes());
        let mut dim = [1i16; 8];
        dim[0] = dims.len() as i16;
        for (slot, &side) in dim[1..].iter_mut().zip(dims) {
            *slot = side as i16;
        }
        for (i, value) in dim.iter().enumerate() {
            header[40 + 2 * i..42 + 2 * i].copy_from_slice(&value.to_le_bytes());
        }
        header[70..72].copy_from_slice(&datatype.to_le_bytes());
        header[72..74].copy_from_slice(&bitpix.to_le_bytes());
        for i in 0..8 {
            header[76 + 4 * i..80 + 4 * i].copy_from_slice(&1f32.to_le_bytes());
        }
        header[108..112].copy_from_slice(&352f32.to_le_bytes());
        header[112..116].copy_from_slice(&slope_inter.0.to_le_bytes());
        header[116..120].copy_from_slice(&slope_inter.1.to_le_bytes());
        header[344..348].copy_from_slice(b"n+1\0");
        header.extend_from_slice(data);
        header
    }

    /// The same file with one extension of `esize` bytes claimed (and `data.len()` of them
    /// there) between the header and the voxels, `vox_offset` moved past it.
    #[cfg(feature = "nifti")]
    fn with_extension(file: &[u8], esize: i32, data: &[u8], voxels_at: usize) -> Vec<u8> {
        let mut out = file[..352].to_vec();
        out[108..112].copy_from_slice(&(voxels_at as f32).to_le_bytes());
        out[348] = 1; // the extender: extensions follow
        out.extend_from_slice(&esize.to_le_bytes());
        out.extend_from_slice(&40i32.to_le_bytes()); // ecode: a comment
        out.extend_from_slice(data);
        out.resize(voxels_at, 0);
        out.extend_from_slice(&file[352..]);
        out
    }

    /// An extension whose size lies (the `nifti` crate reserved what it claimed: 2 GiB for a
    /// 60-byte file, found by fuzzing) is refused before the crate reads it; a true one reads.
    #[cfg(feature = "nifti")]
    #[test]
    fn a_nifti_extension_is_read_and_one_claiming_more_than_there_is_refused() {
        let voxels: Vec<u8> = (0..2 * 3 * 4).map(|v| (v * 7 % 251) as u8).collect();
        let plain = nifti_file(&[2, 3, 4], 2, 8, (0.0, 0.0), &voxels);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volume.nii");
        let comment = [b'h'; 24];
        std::fs::write(&path, with_extension(&plain, 32, &comment, 384)).unwrap();
        let (shape, labels) = read_nifti_labels(&path).unwrap();
        assert_eq!((shape.voxels(), labels), (24, voxels.clone()));
        for (esize, why) in
            [(0x7fff_fff0, "claims 2147483632 bytes"), (4, "claims 4 bytes"), (-8, "claims -8")]
        {
            std::fs::write(&path, with_extension(&plain, esize, &comment, 384)).unwrap();
            let error = read_nifti_labels(&path).unwrap_err().to_string();
            assert!(error.contains(why) && error.contains("header claims"), "{esize}: {error}");
        }
        // Inside vox_offset, but the file ends before its bytes do.
        let cut = with_extension(&plain, 1 << 20, &comment, (1 << 20) + 352);
        std::fs::write(&path, &cut[..400]).unwrap();
        let error = read_nifti_labels(&path).unwrap_err().to_string();
        assert!(error.contains("NIfTI file"), "{error}");
    }

    #[cfg(feature = "nifti")]
    #[test]
    fn nifti_volumes_read_back_scaled_and_malformed_files_are_clear_errors() {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let shape = random_shape(&mut rng);
        let dims = [shape.width() as u16, shape.height() as u16, shape.depth() as u16];
        let dir = tempfile::tempdir().unwrap();
        // u16 stored, HU = stored - 1024 (a common CT encoding).
        let stored: Vec<u16> = (0..shape.voxels()).map(|_| rng.u16(0..4096)).collect();
        let bytes: Vec<u8> = stored.iter().flat_map(|v| v.to_le_bytes()).collect();
        let path = dir.path().join("ct.nii");
        std::fs::write(&path, nifti_file(&dims, 512, 16, (1.0, -1024.0), &bytes)).unwrap();
        let (read_shape, hu) = read_nifti_hu(&path).unwrap();
        assert_eq!(read_shape, shape);
        assert_eq!(hu, stored.iter().map(|&v| v as i16 - 1024).collect::<Vec<i16>>());
        let labels: Vec<u8> = (0..shape.voxels()).map(|_| rng.u8(0..7)).collect();
        let labels_path = dir.path().join("labels.nii");
        std::fs::write(&labels_path, nifti_file(&dims, 2, 8, (0.0, 0.0), &labels)).unwrap();
        assert_eq!(read_nifti_labels(&labels_path).unwrap(), (shape, labels));
        // i16 labels out of the u8 range.
        let wide = dir.path().join("wide.nii");
        let values: Vec<u8> =
            (0..shape.voxels()).flat_map(|i| (if i == 0 { 300i16 } else { 1 }).to_le_bytes()).collect();
        std::fs::write(&wide, nifti_file(&dims, 4, 16, (0.0, 0.0), &values)).unwrap();
        let error = read_nifti_labels(&wide).unwrap_err().to_string();
        assert!(error.contains("voxel 0 is 300"), "{error}");
        // Not NIfTI at all.
        let garbage = dir.path().join("garbage.nii");
        std::fs::write(&garbage, (0..400).map(|_| rng.u8(..)).collect::<Vec<u8>>()).unwrap();
        let error = read_nifti_hu(&garbage).unwrap_err().to_string();
        assert!(error.contains("garbage.nii") && error.contains("NIfTI-1"), "{error}");
        // Two dimensions.
        let flat = dir.path().join("flat.nii");
        std::fs::write(&flat, nifti_file(&[4, 5], 2, 8, (0.0, 0.0), &[7u8; 20])).unwrap();
        let error = read_nifti_hu(&flat).unwrap_err().to_string();
        assert!(error.contains("2 dimensions"), "{error}");
    }
}
