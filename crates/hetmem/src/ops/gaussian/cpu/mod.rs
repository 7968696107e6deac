//! The CPU path of the Gaussian blur: the CPU backend, and the reference the GPU is tested
//! against.
//!
//! A plane is cut into bands of rows, blurred in parallel (rayon). Each band keeps a ring of
//! 2r+1 rows of horizontal sums: each new input row is summed horizontally into the ring, and
//! as soon as the ring holds the 2r+1 rows an output row needs, the vertical pass writes that
//! row. The sums stay in the L1/L2 cache instead of making a trip through memory in a
//! frame-sized intermediate, and the row kernels ([`rows`]) are loops the compiler
//! vectorises. The horizontal pass reads the input row where it lies, but for the r pixels at
//! each end, which are summed from small copies padded with their border pixels; borders cost
//! that and a row index per output row. A band computes the 2r rows of sums above it again:
//! bands are made tall enough that this costs little.

#[cfg(test)]
mod reference;
mod rows;

use rayon::prelude::*;

use super::{Border, FrameFormat, Gaussian, MAX_RADIUS, Plane, SampleType};
use crate::error::{Error, Result};
use rows::Isa;

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
    blur_frame(format, kernel, Isa::detect(), input, output);
    Ok(())
}

/// [`gaussian_cpu`] with the row kernels compiled for `isa`, on buffers already checked.
fn blur_frame(format: &FrameFormat, kernel: &Gaussian, isa: Isa, input: &[u8], output: &mut [u8]) {
    // The weights are symmetric: the row kernels take the centre's and one side's.
    let radius = kernel.radius() as usize;
    for plane in format.planes() {
        let range = plane.offset..plane.offset + plane.bytes();
        let (input, output) = (&input[range.clone()], &mut output[range]);
        match plane.sample {
            SampleType::U8 => {
                // The Q16 weights of 8-bit samples are OpenCV's Q8 ones times 256.
                let half: Vec<u16> = kernel.weights()[radius..].iter().map(|&w| (w >> 8) as u16).collect();
                blur_plane::<EightBit>(&plane, &half, kernel.border(), isa, input, output);
            }
            SampleType::U16 => {
                let half = &kernel.weights_u16()[radius..];
                blur_plane::<SixteenBit>(&plane, half, kernel.border(), isa, input, output)
            }
        }
    }
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

/// The fixed-point arithmetic of one sample type: what an input row holds, what the
/// horizontal pass sums into, and the row kernels.
trait Arithmetic {
    /// One input sample, decoded.
    type Sample: Copy + Default + Send;
    /// One horizontal sum.
    type Sum: Copy + Default + Send + Sync;
    /// One weight.
    type Weight: Sync;
    /// The input bytes as samples where they lie, when they can be read so.
    fn view(bytes: &[u8]) -> Option<&[Self::Sample]>;
    /// Decodes a row of input bytes into samples.
    fn decode(bytes: &[u8], samples: &mut [Self::Sample]);
    /// Sums a row horizontally: `sums[i]` from `padded[i + t * channels]` for each tap `t`.
    fn horizontal(
        isa: Isa,
        half: &[Self::Weight],
        channels: usize,
        padded: &[Self::Sample],
        sums: &mut [Self::Sum],
    );
    /// Sums 2r+1 rows of horizontal sums vertically into a row of output bytes.
    fn vertical(isa: Isa, half: &[Self::Weight], rows: &[&[Self::Sum]], out: &mut [u8]);
}

/// 8-bit samples: Q8 weights, 16-bit horizontal sums, 32-bit vertical ones (OpenCV's 8-bit
/// fixed-point path).
enum EightBit {}

impl Arithmetic for EightBit {
    type Sample = u8;
    type Sum = u16;
    type Weight = u16;
    fn view(bytes: &[u8]) -> Option<&[u8]> {
        Some(bytes)
    }
    fn decode(bytes: &[u8], samples: &mut [u8]) {
        samples.copy_from_slice(bytes);
    }
    fn horizontal(isa: Isa, half: &[u16], channels: usize, padded: &[u8], sums: &mut [u16]) {
        rows::horizontal_u8(isa, half, channels, padded, sums);
    }
    fn vertical(isa: Isa, half: &[u16], rows: &[&[u16]], out: &mut [u8]) {
        rows::vertical_u8(isa, half, rows, out);
    }
}

/// 16-bit little-endian samples: Q16 weights, 32-bit horizontal sums, 64-bit vertical ones
/// (OpenCV's CV_16U path).
enum SixteenBit {}

impl Arithmetic for SixteenBit {
    type Sample = u16;
    type Sum = u32;
    type Weight = u32;
    fn view(bytes: &[u8]) -> Option<&[u16]> {
        // Little-endian samples at an even address are u16s already.
        if cfg!(target_endian = "little") { bytemuck::try_cast_slice(bytes).ok() } else { None }
    }
    fn decode(bytes: &[u8], samples: &mut [u16]) {
        for (sample, pair) in samples.iter_mut().zip(bytes.chunks_exact(2)) {
            *sample = u16::from_le_bytes([pair[0], pair[1]]);
        }
    }
    fn horizontal(isa: Isa, half: &[u32], channels: usize, padded: &[u16], sums: &mut [u32]) {
        rows::horizontal_u16(isa, half, channels, padded, sums);
    }
    fn vertical(isa: Isa, half: &[u32], rows: &[&[u32]], out: &mut [u8]) {
        rows::vertical_u16(isa, half, rows, out);
    }
}

/// Rows per band: about two bands per rayon thread, so that a thread held up elsewhere
/// delays little, and at least 8 times the 2r rows of sums a band computes again above it.
fn band_rows(height: usize, radius: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    height.div_ceil(2 * threads).max(16 * radius).max(8).min(height)
}

/// One band's working memory, reused from band to band on a thread: the ring of 2r+1 rows of
/// horizontal sums, the padded copies of a row's ends (3r pixels each), and a whole padded row
/// for rows that cannot be read where they lie or are not wider than 2r pixels.
struct Scratch<A: Arithmetic> {
    ring: Vec<A::Sum>,
    ends: Vec<A::Sample>,
    padded: Vec<A::Sample>,
}

/// What every band of a plane shares.
struct PlaneJob<'a, A: Arithmetic> {
    plane: &'a Plane,
    /// The kernel's half weights: the centre's, then each side's outwards.
    half: &'a [A::Weight],
    border: Border,
    isa: Isa,
    input: &'a [u8],
}

/// Blurs one plane, its bands in parallel.
fn blur_plane<A: Arithmetic>(
    plane: &Plane,
    half: &[A::Weight],
    border: Border,
    isa: Isa,
    input: &[u8],
    output: &mut [u8],
) {
    let radius = half.len() - 1;
    let job = PlaneJob::<A> { plane, half, border, isa, input };
    let band = band_rows(plane.height, radius);
    let scratch = || Scratch::<A> {
        ring: vec![A::Sum::default(); (2 * radius + 1) * plane.row_samples()],
        ends: vec![A::Sample::default(); 3 * radius * plane.channels],
        padded: vec![A::Sample::default(); (plane.width + 2 * radius) * plane.channels],
    };
    output
        .par_chunks_mut(band * plane.row_bytes())
        .enumerate()
        .for_each_init(scratch, |scratch, (index, out)| job.blur_band(index * band, out, scratch));
}

impl<A: Arithmetic> PlaneJob<'_, A> {
    /// Blurs the rows from `first` into `out` (whole rows).
    fn blur_band(&self, first: usize, out: &mut [u8], scratch: &mut Scratch<A>) {
        let (radius, row_samples) = (self.half.len() - 1, self.plane.row_samples());
        let taps = 2 * radius + 1;
        let first = first as i64;
        let (radius_i, taps_i) = (radius as i64, taps as i64);
        let slot = |row: i64| row.rem_euclid(taps_i) as usize * row_samples;
        for row in first - radius_i..first + radius_i {
            self.sum_row(
                row,
                &mut scratch.ends,
                &mut scratch.padded,
                &mut scratch.ring[slot(row)..][..row_samples],
            );
        }
        for (y, out_row) in (first..).zip(out.chunks_exact_mut(self.plane.row_bytes())) {
            let newest = y + radius_i;
            let sums = &mut scratch.ring[slot(newest)..][..row_samples];
            self.sum_row(newest, &mut scratch.ends, &mut scratch.padded, sums);
            let mut rows: [&[A::Sum]; 2 * MAX_RADIUS as usize + 1] = [&[]; 2 * MAX_RADIUS as usize + 1];
            for (tap, row) in rows[..taps].iter_mut().enumerate() {
                *row = &scratch.ring[slot(y - radius_i + tap as i64)..][..row_samples];
            }
            A::vertical(self.isa, self.half, &rows[..taps], out_row);
        }
    }

    /// The horizontal sums of row `row` of the plane extended by its border (any row index).
    fn sum_row(&self, row: i64, ends: &mut [A::Sample], padded: &mut [A::Sample], sums: &mut [A::Sum]) {
        let Plane { width, height, channels, .. } = *self.plane;
        let radius = self.half.len() - 1;
        let source = self.border.resolve(row, height as i64) as usize;
        let row_bytes = self.plane.row_bytes();
        let bytes = &self.input[source * row_bytes..][..row_bytes];
        // The index in `0..width` of pixel `x`, which may lie beyond either end.
        let resolve = |x: i64| self.border.resolve(x, width as i64) as usize;
        let (edge, n) = (radius * channels, width * channels);
        match A::view(bytes) {
            Some(samples) if width > 2 * radius => {
                // The middle straight from the input: sum i reads samples i - r..=i + r pixels.
                A::horizontal(self.isa, self.half, channels, samples, &mut sums[edge..n - edge]);
                // Each end from a copy of its 2r pixels beside r border pixels (which lie
                // among those 2r, the row being wider than 2r).
                let pixel = |p: usize| &samples[p * channels..(p + 1) * channels];
                ends[edge..].copy_from_slice(&samples[..2 * edge]);
                for x in 0..radius {
                    ends[x * channels..(x + 1) * channels]
                        .copy_from_slice(pixel(resolve(x as i64 - radius as i64)));
                }
                A::horizontal(self.isa, self.half, channels, ends, &mut sums[..edge]);
                ends[..2 * edge].copy_from_slice(&samples[n - 2 * edge..]);
                for x in 0..radius {
                    let at = 2 * edge + x * channels;
                    ends[at..at + channels].copy_from_slice(pixel(resolve((width + x) as i64)));
                }
                A::horizontal(self.isa, self.half, channels, ends, &mut sums[n - edge..]);
            }
            _ => {
                // The whole row, decoded and padded: its border pixels copied from the row
                // itself (which the resolved index lies in).
                A::decode(bytes, &mut padded[edge..edge + n]);
                for x in (0..radius).chain(width + radius..width + 2 * radius) {
                    let from = resolve(x as i64 - radius as i64) + radius;
                    padded.copy_within(from * channels..(from + 1) * channels, x * channels);
                }
                A::horizontal(self.isa, self.half, channels, padded, sums);
            }
        }
    }
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
