//! The CPU Gaussian as it was first written, kept as a test reference for the fast path: the
//! same fixed-point arithmetic in the plainest form (a frame-sized intermediate, every border
//! pixel resolved by index, fresh buffers per row), compared with [`super::blur_frame`] on
//! random frames of random sizes, kernels, borders, layouts and sample types, at even and odd
//! addresses, for every instruction set this CPU runs.

use proptest::prelude::*;
use rayon::prelude::*;

use super::rows::Isa;
use crate::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, Plane, SampleType};

/// The reference blur of one frame.
fn reference_cpu(format: &FrameFormat, kernel: &Gaussian, input: &[u8], output: &mut [u8]) {
    for plane in format.planes() {
        let range = plane.offset..plane.offset + plane.bytes();
        let (input, output) = (&input[range.clone()], &mut output[range]);
        match plane.sample {
            SampleType::U8 => blur_plane_u8(&plane, kernel, input, output),
            SampleType::U16 => blur_plane_u16(&plane, kernel, input, output),
        }
    }
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

/// A random frame format: sides from 1 pixel (narrower than any kernel) to a few tiles of
/// row kernels wide and a few bands tall.
fn format() -> impl Strategy<Value = FrameFormat> {
    let layout = prop::sample::select(vec![
        PixelLayout::Gray,
        PixelLayout::Rgb,
        PixelLayout::Rgba,
        PixelLayout::Yuv420,
        PixelLayout::Yuv422,
        PixelLayout::Yuv444,
    ]);
    let sample = prop::sample::select(vec![SampleType::U8, SampleType::U16]);
    let side = prop_oneof![1..12usize, 12..300usize];
    (side.clone(), side, layout, sample).prop_map(|(width, height, layout, sample)| {
        FrameFormat::new(width, height, layout).unwrap().with_sample(sample)
    })
}

/// A random kernel: any radius up to the largest, small ones more often, with or without a
/// sigma (without one, radii 0 to 4 use OpenCV's fixed tables).
fn kernel() -> impl Strategy<Value = Gaussian> {
    let radius = prop_oneof![3 => 0..5u32, 1 => 5..=crate::ops::gaussian::MAX_RADIUS];
    let sigma = prop::option::of(0.2..12.0f64);
    let border = prop::sample::select(vec![Border::Reflect101, Border::Replicate]);
    (radius, sigma, border)
        .prop_map(|(radius, sigma, border)| Gaussian::new(Some(radius), sigma, border).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_fast_path_equals_the_reference_bit_for_bit(
        format in format(),
        kernel in kernel(),
        seed in any::<u64>(),
        // An input at an odd address: 16-bit samples are then decoded, not read in place.
        misaligned in any::<bool>(),
    ) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let buffer: Vec<u8> = (0..format.frame_bytes() + 1).map(|_| rng.u8(..)).collect();
        // The offset that gives the input's address the parity asked for.
        let offset = (usize::from(misaligned) + (buffer.as_ptr() as usize & 1)) % 2;
        let input = &buffer[offset..][..format.frame_bytes()];
        let mut want = vec![0x5Au8; input.len()];
        reference_cpu(&format, &kernel, input, &mut want);
        for isa in Isa::available() {
            let mut got = vec![0xA5u8; input.len()];
            super::blur_frame(&format, &kernel, isa, input, &mut got);
            let first = got.iter().zip(&want).position(|(g, w)| g != w);
            prop_assert_eq!(first, None, "{} {:?} {:?}", format.describe(), kernel, isa);
        }
    }
}
