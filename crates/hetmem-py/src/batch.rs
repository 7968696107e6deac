//! The data loader's pre-processing where there is no GPU (hetmem's CPU backend): gather a
//! batch of uint8 records, crop each at its own origin, flip some horizontally, normalise
//! `x * scale[c] + shift[c]` in f32 and store f32, f16 or bf16 (rounded to nearest, ties to
//! even), channels last. On a GPU the loader does the same with PyTorch on its own stream;
//! this is what runs without one, and what the loader's NumPy reference test checks on CI.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::memory::Memory;
use crate::size::{Int, checked_add, product, sizes};
use crate::truncation;

/// The element types a batch can be stored as.
#[derive(Clone, Copy, Debug)]
enum Stored {
    F32,
    F16,
    Bf16,
}

impl Stored {
    fn parse(name: &str) -> PyResult<Stored> {
        match name {
            "float32" => Ok(Stored::F32),
            "float16" => Ok(Stored::F16),
            "bfloat16" => Ok(Stored::Bf16),
            other => Err(PyValueError::new_err(format!(
                "batch: element type {other:?}; use \"float32\", \"float16\" or \"bfloat16\""
            ))),
        }
    }

    fn size(self) -> usize {
        match self {
            Stored::F32 => 4,
            Stored::F16 | Stored::Bf16 => 2,
        }
    }
}

/// `value` as IEEE binary16 bits, rounded to nearest, ties to even (overflow to infinity,
/// underflow through the subnormals to zero).
fn f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        return sign | 0x7c00 | if mantissa != 0 { 0x200 } else { 0 };
    }
    let half_exponent = exponent - 127 + 15;
    if half_exponent >= 0x1f {
        return sign | 0x7c00;
    }
    if half_exponent <= 0 {
        if half_exponent < -10 {
            return sign;
        }
        // A subnormal half: the implicit bit joins the mantissa, shifted by the missing
        // exponent; a carry out of the subnormals lands on the smallest normal, as it should.
        let full = mantissa | 0x80_0000;
        let shift = (14 - half_exponent) as u32;
        return sign | round_shifted(full, shift) as u16;
    }
    // A carry out of the mantissa raises the exponent (to infinity at the top), as it should.
    sign | round_shifted(((half_exponent as u32) << 23) | mantissa, 13) as u16
}

/// `value >> shift`, rounded to nearest, ties to even.
fn round_shifted(value: u32, shift: u32) -> u32 {
    let kept = value >> shift;
    let rest = value & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) { kept + 1 } else { kept }
}

/// `value` as bfloat16 bits, rounded to nearest, ties to even (a NaN stays a NaN).
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The geometry of a batch, checked against the memory it reads and writes.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Record height, width and channels.
    record: (usize, usize, usize),
    /// Crop height and width.
    crop: (usize, usize),
}

/// Writes `indices.len()` images into `out`: image `i` is record `indices[i]` of `records`
/// (uint8, `record_shape` = height x width x channels, back to back), cropped to `crop_shape`
/// at `origins[i]` (top, left), mirrored left-right where `flips[i]`, each value
/// `x * scale[c] + shift[c]`, stored as `element` ("float32", "float16", "bfloat16") in
/// `out` as batch x crop height x crop width x channels (channels last).
///
/// Every integer is checked here and every size derived with checked arithmetic: the loops
/// below trust nothing else.
#[pyfunction]
#[allow(clippy::too_many_arguments, reason = "the batch's description, as the loader keeps it")]
pub fn prepare_batch(
    py: Python<'_>,
    records: &Memory,
    record_shape: (Int, Int, Int),
    indices: Vec<Int>,
    origins: Vec<(Int, Int)>,
    flips: Vec<bool>,
    crop_shape: (Int, Int),
    scale: Vec<f32>,
    shift: Vec<f32>,
    out: &Memory,
    element: &str,
) -> PyResult<()> {
    let element = Stored::parse(element)?;
    let record_shape = (
        record_shape.0.size("batch record height")?,
        record_shape.1.size("batch record width")?,
        record_shape.2.size("batch record channels")?,
    );
    let crop_shape = (crop_shape.0.size("batch crop height")?, crop_shape.1.size("batch crop width")?);
    let indices = sizes(&indices, "batch indices")?;
    let origins = origins
        .iter()
        .enumerate()
        .map(|(at, (top, left))| {
            Ok((
                top.size(&format!("batch origins[{at}] top"))?,
                left.size(&format!("batch origins[{at}] left"))?,
            ))
        })
        .collect::<PyResult<Vec<(usize, usize)>>>()?;
    let geometry = Geometry { record: record_shape, crop: crop_shape };
    let (height, width, channels) = record_shape;
    let record_bytes = product([height, width, channels], "batch record shape")?;
    let (records_ptr, records_bytes, _) = records.host_range()?;
    if record_bytes == 0 {
        return Err(PyValueError::new_err(format!("batch: record shape {record_shape:?} holds no bytes")));
    }
    if indices.len() != origins.len() || indices.len() != flips.len() {
        return Err(PyValueError::new_err(format!(
            "batch: {} indices, {} crop origins, {} flips; give one of each per image",
            indices.len(),
            origins.len(),
            flips.len()
        )));
    }
    if scale.len() != channels || shift.len() != channels {
        return Err(PyValueError::new_err(format!(
            "batch: {} scales and {} shifts for {channels} channels; give one per channel",
            scale.len(),
            shift.len()
        )));
    }
    let (crop_height, crop_width) = crop_shape;
    if crop_height == 0 || crop_width == 0 || crop_height > height || crop_width > width {
        return Err(PyValueError::new_err(format!(
            "batch: crop {crop_shape:?} of a {height} x {width} record; a crop is at least 1 x 1 and fits the record"
        )));
    }
    let count = records_bytes / record_bytes;
    for (&index, &(top, left)) in indices.iter().zip(&origins) {
        if index >= count {
            return Err(PyValueError::new_err(format!("batch: record {index} of {count}")));
        }
        let bottom = checked_add(top, crop_height, "batch crop top + height")?;
        let right = checked_add(left, crop_width, "batch crop left + width")?;
        if bottom > height || right > width {
            return Err(PyValueError::new_err(format!(
                "batch: a {crop_height} x {crop_width} crop at ({top}, {left}) leaves the {height} x {width} record"
            )));
        }
    }
    // The crop fits the record, so it holds no more elements than the record has bytes; the
    // image sizes are derived checked all the same.
    let image_bytes = product([crop_height, crop_width, channels, element.size()], "batch image")?;
    let needed = product([indices.len(), image_bytes], "batch output")?;
    let out_ptr = out.output_for(needed, records, "batch")?;
    // A window's file is checked, and a truncation while the loop runs recovered: an
    // exception, not SIGBUS.
    let batch = || {
        for (image, ((&index, &origin), &flip)) in indices.iter().zip(&origins).zip(&flips).enumerate() {
            // index < count and image < indices.len(): both products lie inside their memory.
            let source = records_ptr + index * record_bytes;
            let target = out_ptr + image * image_bytes;
            // SAFETY: the record lies inside `records` and the image inside `out` (checked
            // above, with checked arithmetic), which the caller's references keep alive; the
            // two do not overlap (checked above), and `out` is writable (its address came from
            // a mutable slice, and it is not read-only). As with any NumPy array, another
            // thread (or GPU work through a view handed out earlier) writing the memory
            // meanwhile would be the caller's race on its contents; it cannot move or free it.
            unsafe {
                prepare_image(
                    std::ptr::with_exposed_provenance::<u8>(source),
                    std::ptr::with_exposed_provenance_mut::<u8>(target),
                    geometry,
                    origin,
                    flip,
                    &scale,
                    &shift,
                    element,
                )
            };
        }
    };
    py.detach(|| truncation::guarded(records, || truncation::guarded(out, batch)))
        .and_then(|inner| inner)
        .map_err(crate::to_py_err)
}

/// One image of [`prepare_batch`].
///
/// # Safety
/// `source` points to a whole record of `geometry.record`; `target` to room for the cropped
/// image of `element`s, writable, not overlapping the record, and touched by no one else.
#[allow(clippy::too_many_arguments, reason = "one image's share of prepare_batch's arguments")]
unsafe fn prepare_image(
    source: *const u8,
    target: *mut u8,
    geometry: Geometry,
    (top, left): (usize, usize),
    flip: bool,
    scale: &[f32],
    shift: &[f32],
    element: Stored,
) {
    let (_, width, channels) = geometry.record;
    let (crop_height, crop_width) = geometry.crop;
    let mut out = 0;
    for y in 0..crop_height {
        for x in 0..crop_width {
            let column = if flip { left + crop_width - 1 - x } else { left + x };
            let pixel = ((top + y) * width + column) * channels;
            for channel in 0..channels {
                // SAFETY: `pixel + channel` lies inside the record (the crop fits it).
                let raw = unsafe { source.add(pixel + channel).read() };
                let value = f32::from(raw) * scale[channel] + shift[channel];
                // SAFETY: `out` counts the cropped image's elements, all inside `target`
                // (the function's contract); unaligned writes, since `target` need not be.
                unsafe {
                    match element {
                        Stored::F32 => target.cast::<f32>().add(out).write_unaligned(value),
                        Stored::F16 => target.cast::<u16>().add(out).write_unaligned(f16_bits(value)),
                        Stored::Bf16 => target.cast::<u16>().add(out).write_unaligned(bf16_bits(value)),
                    }
                }
                out += 1;
            }
        }
    }
}
