//! Gaussian blur of 8-bit and 16-bit images: gray, RGB, RGBA and planar YUV (4:2:0, 4:2:2,
//! 4:4:4, each plane filtered), any size, any odd kernel size, reflect-101 (OpenCV's default)
//! or replicate borders.
//!
//! # Arithmetic
//! The filter is separable and runs in fixed point, the same on the CPU and the GPU, so the two
//! paths are **bit-exact**, and each is OpenCV's own bit-exact path for `cv2.GaussianBlur`
//! (`GaussianBlurFixedPoint` in OpenCV's `smooth.simd.hpp`), which the CI test compares with on
//! real photographs (tests/opencv.rs):
//!
//! - 8-bit samples: OpenCV's 8-bit weights (Q8, error-diffused so they sum to exactly 256),
//!   stored as Q16; the horizontal pass is exact (sums of at most 65280, 16 bits), the vertical
//!   pass sums in 32 bits and rounds once to 8 bits.
//! - 16-bit samples ([`SampleType::U16`]): OpenCV's 16-bit weights (Q16, error-diffused to sum
//!   to exactly 65536); the horizontal pass is exact (sums below 2^32), the vertical pass sums
//!   Q16 x Q16 products in 64 bits and rounds once, half up, to 16 bits. No step saturates.
//!
//! Kernel size and sigma follow OpenCV: a missing sigma is `0.3 * ((ksize - 1) / 2 - 1) + 0.8`
//! and kernels of size 1, 3, 5, 7 and 9 without a sigma use OpenCV's fixed tables; a missing
//! size is `round(sigma * 6 + 1) | 1` for 8-bit images ([`Gaussian::new`]) and
//! `round(sigma * 8 + 1) | 1` for 16-bit ones ([`Gaussian::for_samples`]).

mod cpu;
mod format;
mod gpu;
mod overlap;
mod resident;
mod stage;

pub use cpu::gaussian_cpu;
pub use format::{FrameFormat, MAX_SIDE, PixelLayout, Plane, SampleType};
pub use gpu::{GaussianPlan, GaussianTable, gaussian};
pub use overlap::{GaussianOverlap, MAX_SEGMENTS, Segments};
pub use resident::{
    DEFAULT_TIMEOUT as RESIDENT_TIMEOUT, MIN_TIMEOUT as RESIDENT_MIN_TIMEOUT, ResidentGaussian,
    ResidentOptions,
};
pub use stage::{GaussianPrepared, GaussianStage};

use crate::error::{Error, Result};

/// The largest radius the GPU path supports (a 65 x 65 kernel).
pub const MAX_RADIUS: u32 = 32;

/// Taps per sigma when no radius is given, as OpenCV derives a kernel size for each sample
/// type (`createGaussianKernels`: `round(sigma * (depth == CV_8U ? 3 : 4) * 2 + 1) | 1`), and
/// the sigma from which that size passes [`MAX_RADIUS`] (67 taps).
fn taps_per_sigma(sample: SampleType) -> (f64, f64) {
    match sample {
        SampleType::U8 => (6.0, 10.75),
        SampleType::U16 => (8.0, 8.0625),
    }
}

/// How pixels beyond the image edge are made up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Border {
    /// `gfedcb|abcdefgh|gfedcba`: mirror without repeating the edge (OpenCV's default).
    #[default]
    Reflect101,
    /// `aaaaaa|abcdefgh|hhhhhhh`: repeat the edge pixel.
    Replicate,
}

impl Border {
    /// The index inside `0..len` that stands for `index` (which may lie outside).
    pub fn resolve(self, index: i64, len: i64) -> i64 {
        match self {
            Border::Replicate => index.clamp(0, len - 1),
            Border::Reflect101 if len == 1 => 0,
            Border::Reflect101 => {
                let period = 2 * (len - 1);
                let folded = index.rem_euclid(period);
                if folded < len { folded } else { period - folded }
            }
        }
    }

    /// The kernel's code for this border.
    pub(crate) fn code(self) -> u32 {
        match self {
            Border::Reflect101 => 0,
            Border::Replicate => 1,
        }
    }
}

/// The kernel: radius, sigma and border, with its Q16 weights for 8-bit and for 16-bit samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gaussian {
    radius: u32,
    sigma_milli: u64,
    border: Border,
    weights: Vec<u32>,
    weights_u16: Vec<u32>,
}

impl Gaussian {
    /// A kernel of `2 * radius + 1` taps. Either may be left out, as in OpenCV; with neither,
    /// the 5 x 5 kernel (radius 2, sigma 1.1). A radius left out is derived from sigma as
    /// OpenCV does for 8-bit images, `round(sigma * 6 + 1) | 1` taps (see
    /// [`Gaussian::for_samples`] for 16-bit ones).
    ///
    /// # Errors
    /// A sigma that is not a positive finite number, or a radius above [`MAX_RADIUS`].
    pub fn new(radius: Option<u32>, sigma: Option<f64>, border: Border) -> Result<Gaussian> {
        Gaussian::for_samples(radius, sigma, border, SampleType::U8)
    }

    /// As [`Gaussian::new`], with a radius left out derived from sigma as OpenCV does for
    /// images of `sample`s: `round(sigma * 6 + 1) | 1` taps for 8-bit ones,
    /// `round(sigma * 8 + 1) | 1` for 16-bit ones. With a radius given, the same kernel as
    /// [`Gaussian::new`]'s.
    ///
    /// # Errors
    /// As for [`Gaussian::new`].
    pub fn for_samples(
        radius: Option<u32>,
        sigma: Option<f64>,
        border: Border,
        sample: SampleType,
    ) -> Result<Gaussian> {
        if let Some(sigma) = sigma
            && !(sigma.is_finite() && sigma > 0.0)
        {
            return Err(Error::invalid(
                "sigma",
                format!("{sigma}: sigma must be a positive number, such as 1.5"),
            ));
        }
        let (per_sigma, max_sigma_alone) = taps_per_sigma(sample);
        let (radius, implied) = match (radius, sigma) {
            (Some(radius), _) => (radius, false),
            (None, Some(sigma)) => (((sigma * per_sigma + 1.0).round() as u32 | 1) / 2, true),
            (None, None) => (2, false),
        };
        if radius > MAX_RADIUS {
            let most = 2 * MAX_RADIUS + 1;
            return Err(match sigma {
                // A radius nobody gave: blame the sigma it came from.
                Some(sigma) if implied => Error::invalid(
                    "sigma",
                    format!(
                        "sigma {sigma} implies radius {radius}{0} (a {1} x {1} kernel), above the maximum \
                         radius {MAX_RADIUS} ({most} x {most}): give a sigma below {max_sigma_alone}, or \
                         a radius of at most {MAX_RADIUS} with it (the kernel is then cut there)",
                        if sample == SampleType::U8 { "" } else { " for 16-bit samples" },
                        2 * u64::from(radius) + 1
                    ),
                ),
                _ => Error::invalid(
                    "radius",
                    format!("{radius}: at most {MAX_RADIUS} (a {most} x {most} kernel)"),
                ),
            });
        }
        let size = 2 * radius as usize + 1;
        let auto_sigma = 0.3 * ((size as f64 - 1.0) * 0.5 - 1.0) + 0.8;
        // OpenCV's fixed tables for small kernels without a sigma, already whole Q8 numbers
        // (`getGaussianKernelBitExact`). Each is exact in Q8, so it is the same table in Q16.
        let table: Option<&[u32]> = match (sigma, size) {
            (None, 1) => Some(&[256]),
            (None, 3) => Some(&[64, 128, 64]),
            (None, 5) => Some(&[16, 64, 96, 64, 16]),
            (None, 7) => Some(&[8, 28, 56, 72, 56, 28, 8]),
            (None, 9) => Some(&[4, 13, 30, 51, 60, 51, 30, 13, 4]),
            _ => None,
        };
        let sigma = sigma.unwrap_or(auto_sigma);
        let (q8, q16) = match table {
            Some(table) => (table.to_vec(), table.iter().map(|w| w << 8).collect()),
            None => (opencv_fixed_point(size, sigma, 8), opencv_fixed_point(size, sigma, 16)),
        };
        let weights = q8.iter().map(|w| w << 8).collect();
        Ok(Gaussian {
            radius,
            sigma_milli: (sigma * 1000.0).round() as u64,
            border,
            weights,
            weights_u16: q16,
        })
    }

    /// The radius: the kernel has `2 * radius + 1` taps.
    pub fn radius(&self) -> u32 {
        self.radius
    }

    /// Sigma, to three decimals.
    pub fn sigma(&self) -> f64 {
        self.sigma_milli as f64 / 1000.0
    }

    /// The border mode.
    pub fn border(&self) -> Border {
        self.border
    }

    /// The weights for 8-bit samples in Q16 (OpenCV's Q8 weights times 256), summing to
    /// exactly 65536.
    pub fn weights(&self) -> &[u32] {
        &self.weights
    }

    /// The weights for 16-bit samples: OpenCV's Q16 weights (error-diffused at 16 bits, not
    /// the 8-bit ones scaled), summing to exactly 65536.
    pub fn weights_u16(&self) -> &[u32] {
        &self.weights_u16
    }

    /// The weights for samples of type `sample`.
    pub fn weights_for(&self, sample: SampleType) -> &[u32] {
        match sample {
            SampleType::U8 => &self.weights,
            SampleType::U16 => &self.weights_u16,
        }
    }
}

/// OpenCV's fixed-point Gaussian kernel with `bits` fraction bits, 8 for 8-bit images and 16
/// for 16-bit ones (`getGaussianKernelBitExact` then `getGaussianKernelFixedPoint_ED`): the
/// taps in double precision, rounded from the outside in with each rounding error carried to
/// the next tap, ties to even, and the centre taking whatever makes the sum exactly `1 << bits`.
fn opencv_fixed_point(size: usize, sigma: f64, bits: u32) -> Vec<u32> {
    let half = size / 2;
    let scale = -0.125 / (sigma * sigma);
    // x runs over 2 * offset, as in OpenCV, from the outermost left tap.
    let side: Vec<f64> = (0..half)
        .map(|i| {
            let x = (2 * i as i64 + 1 - size as i64) as f64;
            (x * x * scale).exp()
        })
        .collect();
    let normaliser = 1.0 / (side.iter().sum::<f64>() * 2.0 + 1.0);
    let mut weights = vec![0u32; size];
    let (mut error, mut sum) = (0.0f64, 0u32);
    for (i, &value) in side.iter().enumerate() {
        let adjusted = value * normaliser * f64::from(1u32 << bits) + error;
        let rounded = adjusted.round_ties_even();
        error = adjusted - rounded;
        weights[i] = rounded as u32;
        weights[size - 1 - i] = rounded as u32;
        sum += rounded as u32;
    }
    weights[half] = (1 << bits) - 2 * sum;
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borders_fold_like_opencv() {
        let reflect: Vec<i64> = (-3..9).map(|i| Border::Reflect101.resolve(i, 6)).collect();
        assert_eq!(reflect, [3, 2, 1, 0, 1, 2, 3, 4, 5, 4, 3, 2]);
        let replicate: Vec<i64> = (-2..8).map(|i| Border::Replicate.resolve(i, 6)).collect();
        assert_eq!(replicate, [0, 0, 0, 1, 2, 3, 4, 5, 5, 5]);
        // A radius beyond the image folds again and again, still inside it.
        assert!((-50..50).all(|i| (0..3).contains(&Border::Reflect101.resolve(i, 3))));
        assert_eq!(Border::Reflect101.resolve(-4, 1), 0);
    }

    #[test]
    fn weights_sum_to_one_in_q16_and_are_symmetric() {
        for (radius, sigma) in
            [(Some(2), None), (Some(7), Some(2.5)), (None, Some(0.8)), (Some(32), Some(12.0))]
        {
            let kernel = Gaussian::new(radius, sigma, Border::default()).unwrap();
            for w in [kernel.weights(), kernel.weights_u16()] {
                assert_eq!(w.iter().sum::<u32>(), 65536, "{radius:?} {sigma:?}");
                assert!(w.iter().eq(w.iter().rev()), "{w:?}");
                assert_eq!(w.len(), 2 * kernel.radius() as usize + 1);
            }
        }
    }

    #[test]
    fn the_default_is_opencvs_5x5() {
        let kernel = Gaussian::new(None, None, Border::default()).unwrap();
        assert_eq!(kernel.weights(), [4096, 16384, 24576, 16384, 4096]);
        // OpenCV's bit-exact Q8 kernels for a given sigma (cv::getGaussianKernel then its
        // fixed-point error diffusion): k=5 sigma 1.5 and k=7 sigma 2.
        let q8 = |radius, sigma| -> Vec<u32> {
            Gaussian::new(Some(radius), Some(sigma), Border::default())
                .unwrap()
                .weights()
                .iter()
                .map(|w| w >> 8)
                .collect()
        };
        assert_eq!(q8(2, 1.5), [31, 60, 74, 60, 31]);
        assert_eq!(q8(3, 2.0), [18, 34, 48, 56, 48, 34, 18]);
        assert_eq!(kernel.sigma(), 1.1);
        // 9 taps without a sigma: OpenCV's table, which its Q8 error diffusion gives anyway.
        assert_eq!(q8(4, 1.7), [4, 13, 30, 51, 60, 51, 30, 13, 4]);
        assert_eq!(Gaussian::new(None, Some(1.0), Border::default()).unwrap().radius(), 3);
    }

    /// OpenCV 5.0's CV_16U kernels, read off `cv2.GaussianBlur` of a 1-row impulse of 65535
    /// (with a vertical kernel of 1 its output is each Q16 weight).
    #[test]
    fn sixteen_bit_weights_are_opencvs() {
        let q16 = |radius, sigma| {
            let kernel = Gaussian::new(Some(radius), sigma, Border::default()).unwrap();
            assert_eq!(kernel.weights_for(SampleType::U16), kernel.weights_u16());
            kernel.weights_u16()[..radius as usize + 1].to_vec()
        };
        // The fixed tables, exact in Q16 too.
        assert_eq!(q16(1, None), [16384, 32768]);
        assert_eq!(q16(4, None), [1024, 3328, 7680, 13056, 15360]);
        // Computed ones: error-diffused at 16 bits, not the Q8 weights scaled.
        assert_eq!(q16(2, Some(1.5)), [7869, 15328, 19142]);
        assert_eq!(&q16(5, None)[..5], [578, 1778, 4268, 7972, 11600]);
        assert_eq!(&q16(6, Some(2.5))[..5], [592, 1428, 2934, 5136, 7662]);
        assert_eq!(&q16(32, Some(10.0))[..5], [16, 21, 29, 39, 52]);
        assert_eq!(&q16(32, None)[..5], [17, 23, 32, 42, 56]);
    }

    /// OpenCV derives a kernel size from sigma alone by 8 sigma for 16-bit images, 6 for 8-bit
    /// ones (cv2.GaussianBlur of a CV_16U impulse with ksize (0, 0) and sigma 1: 9 taps).
    #[test]
    fn sixteen_bit_kernels_from_sigma_alone_are_wider() {
        let radius = |sigma, sample| {
            Gaussian::for_samples(None, Some(sigma), Border::default(), sample).map(|kernel| kernel.radius())
        };
        assert_eq!((radius(1.0, SampleType::U8).unwrap(), radius(1.0, SampleType::U16).unwrap()), (3, 4));
        assert_eq!(radius(2.5, SampleType::U16).unwrap(), 10);
        assert_eq!(radius(8.06, SampleType::U16).unwrap(), 32);
        let error = radius(9.0, SampleType::U16).unwrap_err().to_string();
        assert!(error.contains("sigma 9 implies radius 36 for 16-bit samples (a 73 x 73 kernel)"), "{error}");
        assert!(error.contains("below 8.0625") && error.contains("at most 32"), "{error}");
        // A radius given is the radius used, whatever the samples.
        let given = |sample| Gaussian::for_samples(Some(5), Some(9.0), Border::Replicate, sample).unwrap();
        assert_eq!(given(SampleType::U16), given(SampleType::U8));
        assert_eq!(given(SampleType::U8), Gaussian::new(Some(5), Some(9.0), Border::Replicate).unwrap());
    }

    #[test]
    fn bad_kernels_are_refused() {
        assert!(Gaussian::new(Some(33), None, Border::default()).is_err());
        let error = Gaussian::new(None, Some(-1.0), Border::default()).unwrap_err().to_string();
        assert!(error.contains("sigma must be a positive number"), "{error}");
        // A sigma alone that needs a radius above the maximum is blamed on the sigma.
        let error = Gaussian::new(None, Some(11.0), Border::default()).unwrap_err().to_string();
        assert!(error.contains("sigma 11 implies radius 33 (a 67 x 67 kernel)"), "{error}");
        assert!(error.contains("below 10.75") && error.contains("at most 32"), "{error}");
        assert_eq!(Gaussian::new(None, Some(10.74), Border::default()).unwrap().radius(), 32);
        assert!(Gaussian::new(None, Some(10.75), Border::default()).is_err());
        assert_eq!(Gaussian::new(Some(32), Some(11.0), Border::default()).unwrap().radius(), 32);
        assert!(Gaussian::new(None, Some(f64::NAN), Border::default()).is_err());
    }
}
