//! Gaussian blur of 8-bit images: gray, RGB, RGBA and planar YUV (4:2:0, 4:2:2, 4:4:4, each
//! plane filtered), any size, any odd kernel size, reflect-101 (OpenCV's default) or
//! replicate borders.
//!
//! # Arithmetic
//! The filter is separable and runs in fixed point, the same on the CPU and the GPU, so the two
//! paths are **bit-exact**. The weights are OpenCV's for 8-bit images (Q8, error-diffused so
//! they sum to exactly 256), stored as Q16; the horizontal pass is exact (sums of at most
//! 65280, 16 bits), the vertical pass sums in 32 bits and rounds once to 8 bits. That is
//! OpenCV's own bit-exact path for `cv2.GaussianBlur` on 8-bit images, and the CI test compares
//! with it on real photographs (tests/opencv.rs).
//!
//! Kernel size and sigma follow OpenCV: a missing sigma is `0.3 * ((ksize - 1) / 2 - 1) + 0.8`
//! and kernels of size 1, 3, 5 and 7 without a sigma use OpenCV's fixed binomial tables; a
//! missing size is `round(sigma * 6 + 1) | 1`.

mod cpu;
mod format;
mod gpu;
mod overlap;
mod stage;

pub use cpu::gaussian_cpu;
pub use format::{FrameFormat, MAX_SIDE, PixelLayout, Plane};
pub use gpu::{GaussianPlan, GaussianTable, TablePlacement, gaussian};
pub use overlap::{GaussianOverlap, MAX_SEGMENTS, Segments};
pub use stage::{GaussianPrepared, GaussianStage};

use crate::error::{Error, Result};

/// The largest radius the GPU path supports (a 65 x 65 kernel).
pub const MAX_RADIUS: u32 = 32;

/// Sigmas from here on imply a radius above [`MAX_RADIUS`] when no radius is given
/// (`round(6 * sigma + 1) | 1` taps: 67 from 10.75).
const MAX_SIGMA_ALONE: f64 = 10.75;

/// How pixels beyond the image edge are made up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
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

/// The kernel: radius, sigma and border, with its Q16 weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gaussian {
    radius: u32,
    sigma_milli: u64,
    border: Border,
    weights: Vec<u32>,
}

impl Gaussian {
    /// A kernel of `2 * radius + 1` taps. Either may be left out, as in OpenCV; with neither,
    /// the 5 x 5 kernel (radius 2, sigma 1.1).
    ///
    /// # Errors
    /// A sigma that is not a positive finite number, or a radius above [`MAX_RADIUS`].
    pub fn new(radius: Option<u32>, sigma: Option<f64>, border: Border) -> Result<Gaussian> {
        if let Some(sigma) = sigma
            && !(sigma.is_finite() && sigma > 0.0)
        {
            return Err(Error::invalid(
                "sigma",
                format!("{sigma}: sigma must be a positive number, such as 1.5"),
            ));
        }
        let (radius, implied) = match (radius, sigma) {
            (Some(radius), _) => (radius, false),
            (None, Some(sigma)) => (((sigma * 6.0 + 1.0).round() as u32 | 1) / 2, true),
            (None, None) => (2, false),
        };
        if radius > MAX_RADIUS {
            let most = 2 * MAX_RADIUS + 1;
            return Err(match sigma {
                // A radius nobody gave: blame the sigma it came from.
                Some(sigma) if implied => Error::invalid(
                    "sigma",
                    format!(
                        "sigma {sigma} implies radius {radius} (a {0} x {0} kernel), above the maximum \
                         radius {MAX_RADIUS} ({most} x {most}): give a sigma below {MAX_SIGMA_ALONE}, or \
                         a radius of at most {MAX_RADIUS} with it (the kernel is then cut there)",
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
        // OpenCV's fixed tables for small kernels without a sigma, already whole Q8 numbers.
        let table: Option<&[u32]> = match (sigma, size) {
            (None, 1) => Some(&[256]),
            (None, 3) => Some(&[64, 128, 64]),
            (None, 5) => Some(&[16, 64, 96, 64, 16]),
            (None, 7) => Some(&[8, 28, 56, 72, 56, 28, 8]),
            _ => None,
        };
        let sigma = sigma.unwrap_or(auto_sigma);
        let q8 = match table {
            Some(table) => table.to_vec(),
            None => opencv_q8(size, sigma),
        };
        let weights = q8.iter().map(|w| w << 8).collect();
        Ok(Gaussian { radius, sigma_milli: (sigma * 1000.0).round() as u64, border, weights })
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

    /// The weights in Q16 (OpenCV's Q8 weights times 256), summing to exactly 65536.
    pub fn weights(&self) -> &[u32] {
        &self.weights
    }
}

/// OpenCV's 8-bit Gaussian kernel (`getGaussianKernelBitExact` then
/// `getGaussianKernelFixedPoint_ED` with 8 fraction bits): the taps in double precision,
/// rounded to Q8 from the outside in with each rounding error carried to the next tap, ties to
/// even, and the centre taking whatever makes the sum exactly 256.
fn opencv_q8(size: usize, sigma: f64) -> Vec<u32> {
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
        let adjusted = value * normaliser * 256.0 + error;
        let rounded = adjusted.round_ties_even();
        error = adjusted - rounded;
        weights[i] = rounded as u32;
        weights[size - 1 - i] = rounded as u32;
        sum += rounded as u32;
    }
    weights[half] = 256 - 2 * sum;
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
            let w = kernel.weights();
            assert_eq!(w.iter().sum::<u32>(), 65536, "{radius:?} {sigma:?}");
            assert!(w.iter().eq(w.iter().rev()), "{w:?}");
            assert_eq!(w.len(), 2 * kernel.radius() as usize + 1);
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
        assert_eq!(Gaussian::new(None, Some(1.0), Border::default()).unwrap().radius(), 3);
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
