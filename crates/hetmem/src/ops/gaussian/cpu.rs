//! The CPU path of the Gaussian blur: the CPU backend, and the reference the GPU is tested
//! against. Rows run in parallel (rayon); the inner loops run over contiguous samples with the
//! taps outermost, so the compiler vectorises them.

use rayon::prelude::*;

use super::{FrameFormat, Gaussian, Plane, SampleType};
use crate::error::{Error, Result};

/// Blurs every plane of one frame from `input` into `output`.
///
/// Any radius works on any frame size: a plane narrower or shorter than the kernel folds its
/// border again and again ([`Border::resolve`](super::Border::resolve)), as OpenCV's
/// `BORDER_REFLECT_101` does, and `Replicate` repeats the edge.
///
/// # Errors
/// Buffers that are not one frame long.
pub fn gaussian_cpu(format: &FrameFormat, kernel: &Gaussian, input: &[u8], output: &mut [u8]) -> Result<()> {
    check(format, kernel, input.len(), output.len())?;
    for plane in format.planes() {
        let range = plane.offset..plane.offset + plane.bytes();
        let (input, output) = (&input[range.clone()], &mut output[range]);
        match plane.sample {
            SampleType::U8 => blur_plane_u8(&plane, kernel, input, output),
            SampleType::U16 => blur_plane_u16(&plane, kernel, input, output),
        }
    }
    Ok(())
}

/// The checks both paths make before touching a frame: buffers one frame long. The kernel
/// needs no check: any radius fits any frame, since the borders fold.
pub(crate) fn check(format: &FrameFormat, _kernel: &Gaussian, input: usize, output: usize) -> Result<()> {
    let frame = format.frame_bytes();
    for (name, len) in [("input", input), ("output", output)] {
        if len != frame {
            return Err(Error::invalid(
                "frame buffer",
                format!("the {name} holds {len} bytes; a {} frame is {frame}", format.describe()),
            ));
        }
    }
    Ok(())
}

/// An 8-bit plane: horizontal sums rounded to Q8 (16 bits), vertical sums rounded to 8 bits.
fn blur_plane_u8(plane: &Plane, kernel: &Gaussian, input: &[u8], output: &mut [u8]) {
    let (width, height, channels) = (plane.width, plane.height, plane.channels);
    let row_bytes = plane.row_bytes();
    let radius = kernel.radius() as usize;
    let weights = kernel.weights();
    let border = kernel.border();

    // Horizontal pass: each row, padded with its border pixels, into Q8 sums.
    let mut middle = vec![0u16; row_bytes * height];
    middle.par_chunks_mut(row_bytes).zip(input.par_chunks(row_bytes)).for_each(|(mid, row)| {
        let padded_width = width + 2 * radius;
        let mut padded = vec![0u8; padded_width * channels];
        for (x, pixel) in padded.chunks_exact_mut(channels).enumerate() {
            let source = border.resolve(x as i64 - radius as i64, width as i64) as usize;
            pixel.copy_from_slice(&row[source * channels..(source + 1) * channels]);
        }
        let mut sums = vec![0u32; row_bytes];
        for (tap, &weight) in weights.iter().enumerate() {
            let shifted = &padded[tap * channels..tap * channels + row_bytes];
            for (sum, &byte) in sums.iter_mut().zip(shifted) {
                *sum += weight * u32::from(byte);
            }
        }
        for (out, sum) in mid.iter_mut().zip(sums) {
            *out = ((sum + (1 << 7)) >> 8) as u16;
        }
    });

    // Vertical pass: each output row from 2r+1 rows of the middle.
    output.par_chunks_mut(row_bytes).enumerate().for_each(|(y, out)| {
        let mut sums = vec![1u32 << 23; row_bytes];
        for (tap, &weight) in weights.iter().enumerate() {
            let source = border.resolve(y as i64 + tap as i64 - radius as i64, height as i64) as usize;
            let mid = &middle[source * row_bytes..(source + 1) * row_bytes];
            for (sum, &value) in sums.iter_mut().zip(mid) {
                *sum += weight * u32::from(value);
            }
        }
        for (byte, sum) in out.iter_mut().zip(sums) {
            *byte = (sum >> 24) as u8;
        }
    });
}

/// A 16-bit little-endian plane, as OpenCV's CV_16U path: horizontal sums kept exact in Q16
/// (a weight of at most 65536 times a sample of at most 65535, and the weights sum to 65536:
/// below 2^32), vertical sums of Q16 x Q16 products exact in 64 bits, rounded once, half up.
fn blur_plane_u16(plane: &Plane, kernel: &Gaussian, input: &[u8], output: &mut [u8]) {
    let (width, height, channels) = (plane.width, plane.height, plane.channels);
    let (row_samples, row_bytes) = (plane.row_samples(), plane.row_bytes());
    let radius = kernel.radius() as usize;
    let weights = kernel.weights_u16();
    let border = kernel.border();

    let mut middle = vec![0u32; row_samples * height];
    middle.par_chunks_mut(row_samples).zip(input.par_chunks(row_bytes)).for_each(|(mid, row)| {
        let padded_width = width + 2 * radius;
        let mut padded = vec![0u32; padded_width * channels];
        for (x, pixel) in padded.chunks_exact_mut(channels).enumerate() {
            let source = border.resolve(x as i64 - radius as i64, width as i64) as usize;
            let bytes = &row[source * channels * 2..(source + 1) * channels * 2];
            for (sample, pair) in pixel.iter_mut().zip(bytes.chunks_exact(2)) {
                *sample = u32::from(u16::from_le_bytes([pair[0], pair[1]]));
            }
        }
        for (tap, &weight) in weights.iter().enumerate() {
            let shifted = &padded[tap * channels..tap * channels + row_samples];
            for (sum, &sample) in mid.iter_mut().zip(shifted) {
                *sum += weight * sample;
            }
        }
    });

    output.par_chunks_mut(row_bytes).enumerate().for_each(|(y, out)| {
        let mut sums = vec![1u64 << 31; row_samples];
        for (tap, &weight) in weights.iter().enumerate() {
            let source = border.resolve(y as i64 + tap as i64 - radius as i64, height as i64) as usize;
            let mid = &middle[source * row_samples..(source + 1) * row_samples];
            for (sum, &value) in sums.iter_mut().zip(mid) {
                *sum += u64::from(weight) * u64::from(value);
            }
        }
        for (pair, sum) in out.chunks_exact_mut(2).zip(sums) {
            pair.copy_from_slice(&((sum >> 32) as u16).to_le_bytes());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gaussian::{Border, PixelLayout};

    /// The filter straight from its definition, in f64: the test oracle.
    fn reference(plane: &Plane, kernel: &Gaussian, input: &[u8]) -> Vec<f64> {
        let radius = kernel.radius() as i64;
        let w: Vec<f64> = kernel.weights().iter().map(|&w| w as f64 / 65536.0).collect();
        let (width, height, c) = (plane.width as i64, plane.height as i64, plane.channels as i64);
        let at = |x: i64, y: i64, ch: i64| {
            let x = kernel.border().resolve(x, width);
            let y = kernel.border().resolve(y, height);
            input[((y * width + x) * c + ch) as usize] as f64
        };
        let mut out = Vec::new();
        for y in 0..height {
            for x in 0..width {
                for ch in 0..c {
                    let mut sum = 0.0;
                    for dy in -radius..=radius {
                        for dx in -radius..=radius {
                            sum += w[(dy + radius) as usize]
                                * w[(dx + radius) as usize]
                                * at(x + dx, y + dy, ch);
                        }
                    }
                    out.push(sum);
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_within_one_on_random_frames() {
        for (w, h, layout, radius, sigma, border) in [
            (37, 23, PixelLayout::Rgb, Some(2), None, Border::Reflect101),
            (7, 3, PixelLayout::Rgba, Some(2), None, Border::Replicate),
            (16, 9, PixelLayout::Gray, Some(5), Some(2.0), Border::Reflect101),
            (9, 8, PixelLayout::Yuv420, Some(1), None, Border::Reflect101),
            // Sides not larger than the radius: the border folds again and again.
            (1, 1, PixelLayout::Gray, Some(2), None, Border::Reflect101),
            (2, 3, PixelLayout::Rgb, Some(9), None, Border::Reflect101),
            (3, 1, PixelLayout::Rgba, Some(5), Some(2.0), Border::Reflect101),
            (2, 3, PixelLayout::Gray, Some(7), None, Border::Replicate),
            (3, 2, PixelLayout::Yuv420, Some(4), None, Border::Reflect101),
        ] {
            let format = FrameFormat::new(w, h, layout).unwrap();
            let kernel = Gaussian::new(radius, sigma, border).unwrap();
            let input: Vec<u8> = (0..format.frame_bytes()).map(|_| fastrand::u8(..)).collect();
            let mut output = vec![0xA5u8; input.len()];
            gaussian_cpu(&format, &kernel, &input, &mut output).unwrap();
            for plane in format.planes() {
                let want = reference(&plane, &kernel, &input[plane.offset..plane.offset + plane.bytes()]);
                let got = &output[plane.offset..plane.offset + plane.bytes()];
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!((g as f64 - e).abs() <= 1.0, "{layout:?} {w}x{h} byte {i}: {g} vs {e:.3}");
                }
            }
        }
    }

    /// Sides not larger than the radius, by hand: OpenCV's `BORDER_REFLECT_101` folds a 2-pixel
    /// row into `a b a b a`, a 1-pixel one into `a a a`; `BORDER_REPLICATE` repeats the edges.
    #[test]
    fn tiny_images_fold_their_borders_like_opencv() {
        let kernel = |border| Gaussian::new(Some(2), None, border).unwrap();
        let run = |width, height, border, input: &[u8]| {
            let format = FrameFormat::new(width, height, PixelLayout::Gray).unwrap();
            let mut output = vec![0xA5; input.len()];
            gaussian_cpu(&format, &kernel(border), input, &mut output).unwrap();
            output
        };
        // x = 0 sees 0 255 0 255 0 and x = 1 sees 255 0 255 0 255: 128/256 of 255 both times.
        assert_eq!(run(2, 1, Border::Reflect101, &[0, 255]), [128, 128]);
        // x = 0 sees 0 0 0 255 255 (80/256 of 255), x = 1 sees 0 0 255 255 255 (176/256).
        assert_eq!(run(2, 1, Border::Replicate, &[0, 255]), [80, 175]);
        assert_eq!(run(1, 2, Border::Replicate, &[0, 255]), [80, 175]);
        for border in [Border::Reflect101, Border::Replicate] {
            let value = fastrand::u8(..);
            assert_eq!(run(1, 1, border, &[value]), [value], "{border:?}");
        }
    }

    #[test]
    fn a_constant_image_stays_constant() {
        let format = FrameFormat::new(33, 17, PixelLayout::Rgb).unwrap();
        let kernel = Gaussian::new(Some(4), Some(3.0), Border::Reflect101).unwrap();
        let value = fastrand::u8(1..);
        let input = vec![value; format.frame_bytes()];
        let mut output = vec![!value; input.len()];
        gaussian_cpu(&format, &kernel, &input, &mut output).unwrap();
        assert!(output.iter().all(|&b| b == value));
    }

    /// 16-bit samples of a frame, little-endian.
    fn samples(bytes: &[u8]) -> Vec<u16> {
        bytes.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]])).collect()
    }

    /// OpenCV's 16-bit result straight from its definition, in exact integers and in two
    /// dimensions at once: the sum of every Q16 x Q16 weight product times its sample,
    /// rounded once, half up.
    fn reference_u16(plane: &Plane, kernel: &Gaussian, input: &[u16]) -> Vec<u16> {
        let radius = kernel.radius() as i64;
        let w = kernel.weights_u16();
        let (width, height, c) = (plane.width as i64, plane.height as i64, plane.channels as i64);
        let at = |x: i64, y: i64, ch: i64| {
            let x = kernel.border().resolve(x, width);
            let y = kernel.border().resolve(y, height);
            u128::from(input[((y * width + x) * c + ch) as usize])
        };
        let mut out = Vec::new();
        for y in 0..height {
            for x in 0..width {
                for ch in 0..c {
                    let mut sum = 1u128 << 31;
                    for dy in -radius..=radius {
                        for dx in -radius..=radius {
                            let weight = u128::from(w[(dy + radius) as usize] * w[(dx + radius) as usize]);
                            sum += weight * at(x + dx, y + dy, ch);
                        }
                    }
                    out.push((sum >> 32) as u16);
                }
            }
        }
        out
    }

    #[test]
    fn sixteen_bit_frames_are_the_exact_two_dimensional_sum_rounded_once() {
        for (w, h, layout, radius, sigma, border) in [
            (37, 23, PixelLayout::Rgb, Some(2), None, Border::Reflect101),
            (7, 3, PixelLayout::Rgba, Some(3), None, Border::Replicate),
            (16, 9, PixelLayout::Gray, Some(5), Some(2.0), Border::Reflect101),
            (9, 8, PixelLayout::Yuv420, Some(1), None, Border::Reflect101),
            (11, 6, PixelLayout::Yuv422, Some(4), None, Border::Replicate),
            (40, 33, PixelLayout::Gray, Some(32), Some(9.0), Border::Reflect101),
            (1, 1, PixelLayout::Gray, Some(2), None, Border::Reflect101),
            (2, 3, PixelLayout::Rgb, Some(9), None, Border::Reflect101),
            (3, 1, PixelLayout::Rgba, Some(5), Some(2.0), Border::Replicate),
            (3, 2, PixelLayout::Yuv444, Some(4), Some(0.3), Border::Reflect101),
        ] {
            let format = FrameFormat::new(w, h, layout).unwrap().with_sample(SampleType::U16);
            let kernel = Gaussian::new(radius, sigma, border).unwrap();
            // Full-range samples, and bright ones near 65535 where a narrower sum would wrap.
            for bright in [false, true] {
                let input: Vec<u8> = (0..format.frame_bytes() / 2)
                    .flat_map(|_| {
                        if bright { fastrand::u16(65000..) } else { fastrand::u16(..) }.to_le_bytes()
                    })
                    .collect();
                let mut output = vec![0xA5u8; input.len()];
                gaussian_cpu(&format, &kernel, &input, &mut output).unwrap();
                for plane in format.planes() {
                    let range = plane.offset..plane.offset + plane.bytes();
                    let want = reference_u16(&plane, &kernel, &samples(&input[range.clone()]));
                    let got = samples(&output[range]);
                    let first = got.iter().zip(&want).position(|(g, e)| g != e);
                    assert_eq!(first, None, "{layout:?} {w}x{h} r={radius:?} bright={bright}");
                }
            }
        }
    }

    /// cv2.GaussianBlur on a CV_16U row [0, 65535], 5 x 5: the halves round up.
    #[test]
    fn sixteen_bit_tiny_images_fold_and_round_like_opencv() {
        let kernel = |border| Gaussian::new(Some(2), None, border).unwrap();
        let run = |width, height, border, input: &[u16]| {
            let format =
                FrameFormat::new(width, height, PixelLayout::Gray).unwrap().with_sample(SampleType::U16);
            let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut output = vec![0xA5; bytes.len()];
            gaussian_cpu(&format, &kernel(border), &bytes, &mut output).unwrap();
            samples(&output)
        };
        // Half of 65535 is 32767.5: up to 32768 both times.
        assert_eq!(run(2, 1, Border::Reflect101, &[0, 65535]), [32768, 32768]);
        // 80/256 and 176/256 of 65535: 20479.69 and 45055.31.
        assert_eq!(run(2, 1, Border::Replicate, &[0, 65535]), [20480, 45055]);
        assert_eq!(run(1, 2, Border::Replicate, &[0, 65535]), [20480, 45055]);
        let value = fastrand::u16(..);
        assert_eq!(run(1, 1, Border::Reflect101, &[value]), [value]);
    }

    #[test]
    fn a_constant_sixteen_bit_image_stays_constant_even_at_full_scale() {
        let format = FrameFormat::new(33, 17, PixelLayout::Rgb).unwrap().with_sample(SampleType::U16);
        let kernel = Gaussian::new(Some(7), Some(3.0), Border::Reflect101).unwrap();
        for value in [fastrand::u16(1..), 65535] {
            let input: Vec<u8> = (0..format.frame_bytes() / 2).flat_map(|_| value.to_le_bytes()).collect();
            let mut output = vec![0u8; input.len()];
            gaussian_cpu(&format, &kernel, &input, &mut output).unwrap();
            assert!(samples(&output).iter().all(|&v| v == value), "{value}");
        }
    }

    #[test]
    fn wrong_sizes_are_refused() {
        let format = FrameFormat::new(7, 3, PixelLayout::Rgb).unwrap();
        let kernel = Gaussian::new(Some(2), None, Border::Reflect101).unwrap();
        let mut output = vec![0; 63];
        let error = gaussian_cpu(&format, &kernel, &[0; 62], &mut output).unwrap_err().to_string();
        assert!(error.contains("62 bytes") && error.contains("63"), "{error}");
        let format = format.with_sample(SampleType::U16);
        let error = gaussian_cpu(&format, &kernel, &[0; 63], &mut output).unwrap_err().to_string();
        assert!(error.contains("7x3 Rgb 16-bit frame is 126"), "{error}");
    }
}
