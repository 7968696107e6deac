//! `gaussian_cpu` against OpenCV's `cv2.GaussianBlur` on real photographs: every sample equal,
//! as the `hetmem::ops::gaussian` docs claim (hetmem uses OpenCV's fixed-point weights and
//! rounding: its 8-bit path for 8-bit samples, its CV_16U path for 16-bit ones, on the same
//! photographs scaled to 16 and to 10 bits with random low bits).
//!
//! The reference folder is made by `scripts/opencv-reference.py` (photographs shipped with
//! scikit-image, blurred by OpenCV) and named by `HETMEM_OPENCV_REFERENCE`; nothing is
//! downloaded here. Without it the test skips visibly, unless `HETMEM_REQUIRE_OPENCV=1`
//! (as in CI), when it fails.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, SampleType, gaussian_cpu};

const REFERENCE_ENV: &str = "HETMEM_OPENCV_REFERENCE";
const REQUIRE_ENV: &str = "HETMEM_REQUIRE_OPENCV";

/// The reference folder, or `None` after saying why the test skips.
fn reference_or_skip(test: &str) -> Option<PathBuf> {
    match std::env::var_os(REFERENCE_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
                panic!(
                    "{test}: {REQUIRE_ENV}=1 but {REFERENCE_ENV} is not set \
                     (run scripts/opencv-reference.py DIR and set it to DIR)"
                );
            }
            // Bypasses the harness's capture, which hides a passing test's output.
            let _ = writeln!(
                std::io::stderr(),
                "{test}: skipped: {REFERENCE_ENV} is not set (make one with scripts/opencv-reference.py)"
            );
            None
        }
    }
}

/// One case of the manifest.
#[derive(Debug)]
struct Case {
    input: String,
    output: String,
    width: usize,
    height: usize,
    channels: usize,
    sample: SampleType,
    ksize: u32,
    sigma: f64,
    border: Border,
}

impl Case {
    fn parse(value: &serde_json::Value) -> Case {
        let text = |key: &str| {
            value[key].as_str().unwrap_or_else(|| panic!("manifest case {value}: no text {key}")).to_owned()
        };
        let number = |key: &str| {
            value[key].as_u64().unwrap_or_else(|| panic!("manifest case {value}: no integer {key}")) as usize
        };
        let border = match text("border").as_str() {
            "reflect101" => Border::Reflect101,
            "replicate" => Border::Replicate,
            other => panic!("manifest case {value}: unknown border {other}"),
        };
        // Absent in references made before 16-bit samples: those cases are all 8-bit.
        let sample = match value["sample"].as_str().unwrap_or("u8") {
            "u8" => SampleType::U8,
            "u16" => SampleType::U16,
            other => panic!("manifest case {value}: unknown sample {other}"),
        };
        Case {
            input: text("input"),
            output: text("output"),
            width: number("width"),
            height: number("height"),
            channels: number("channels"),
            sample,
            ksize: number("ksize") as u32,
            sigma: value["sigma"].as_f64().unwrap_or_else(|| panic!("manifest case {value}: no sigma")),
            border,
        }
    }

    fn layout(&self) -> PixelLayout {
        match self.channels {
            1 => PixelLayout::Gray,
            3 => PixelLayout::Rgb,
            4 => PixelLayout::Rgba,
            other => panic!("{}: {other} channels", self.output),
        }
    }

    /// hetmem's kernel for OpenCV's parameters: radius ksize / 2, sigma 0 meaning "derive it
    /// from ksize", ksize 0 "derive it from sigma" (by OpenCV's rule for the sample type).
    fn kernel(&self) -> Gaussian {
        let sigma = (self.sigma != 0.0).then_some(self.sigma);
        if self.ksize == 0 {
            assert!(sigma.is_some(), "{}: neither ksize nor sigma", self.output);
            return Gaussian::for_samples(None, sigma, self.border, self.sample).unwrap();
        }
        assert!(self.ksize % 2 == 1, "{}: even ksize {}", self.output, self.ksize);
        Gaussian::new(Some(self.ksize / 2), sigma, self.border).unwrap()
    }
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

#[test]
fn gaussian_cpu_equals_opencv_on_photographs() {
    compare("gaussian_cpu_equals_opencv_on_photographs", SampleType::U8);
}

/// 16-bit samples (CV_16U): the photographs as 16-bit and as 10-bit values with random low
/// bits, whole and cropped, kernels of 3 to 65 taps, both borders.
#[test]
fn gaussian_cpu_equals_opencv_on_16_bit_photographs() {
    compare("gaussian_cpu_equals_opencv_on_16_bit_photographs", SampleType::U16);
}

/// The manifest's cases of `sample`, each compared sample for sample with OpenCV's output.
fn compare(test: &str, sample: SampleType) {
    let Some(dir) = reference_or_skip(test) else {
        return;
    };
    let manifest: serde_json::Value = serde_json::from_slice(&read(&dir, "manifest.json")).unwrap();
    let cases: Vec<Case> = manifest["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no cases", dir.join("manifest.json").display()))
        .iter()
        .map(Case::parse)
        .filter(|case| case.sample == sample)
        .collect();
    assert!(
        !cases.is_empty(),
        "the manifest lists no case of {sample:?} samples: make the folder again with scripts/opencv-reference.py"
    );
    // Straight to stderr, past the harness's capture: the per-case report shows in CI's log.
    let mut stderr = std::io::stderr();
    writeln!(
        stderr,
        "{test}: {} cases against OpenCV {} (scikit-image {})",
        cases.len(),
        manifest["opencv"].as_str().unwrap_or("?"),
        manifest["scikit_image"].as_str().unwrap_or("?"),
    )
    .unwrap();

    let mut inputs: HashMap<String, Vec<u8>> = HashMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let input = inputs.entry(case.input.clone()).or_insert_with(|| read(&dir, &case.input));
        let expected = read(&dir, &case.output);
        let format = FrameFormat::new(case.width, case.height, case.layout()).unwrap().with_sample(sample);
        assert_eq!(input.len(), format.frame_bytes(), "{}: input size", case.input);
        assert_eq!(expected.len(), format.frame_bytes(), "{}: output size", case.output);
        let kernel = case.kernel();

        let mut output = vec![0xA5u8; expected.len()];
        gaussian_cpu(&format, &kernel, input, &mut output).unwrap();

        // Sample by sample: bytes, or little-endian pairs of them.
        let values = |bytes: &[u8]| -> Vec<u32> {
            match sample {
                SampleType::U8 => bytes.iter().map(|&b| u32::from(b)).collect(),
                SampleType::U16 => bytes
                    .chunks_exact(2)
                    .map(|pair| u32::from(u16::from_le_bytes([pair[0], pair[1]])))
                    .collect(),
            }
        };
        let (output, expected) = (values(&output), values(&expected));
        let mut max_diff = 0u32;
        let mut off_by_one = 0usize;
        let mut worse: Vec<usize> = Vec::new();
        for (i, (&got, &want)) in output.iter().zip(&expected).enumerate() {
            let diff = got.abs_diff(want);
            max_diff = max_diff.max(diff);
            match diff {
                0 => {}
                1 => {
                    off_by_one += 1;
                    worse.push(i);
                }
                _ => worse.push(i),
            }
        }
        writeln!(
            stderr,
            "  {:<40} {}x{}x{} ksize {:>2} sigma {:<4} ({:.3} used) {:<10} max diff {max_diff}, \
             {off_by_one} samples off by 1 ({:.3}%), {} differing in all",
            case.output,
            case.width,
            case.height,
            case.channels,
            case.ksize,
            case.sigma,
            kernel.sigma(),
            format!("{:?}", case.border),
            100.0 * off_by_one as f64 / expected.len() as f64,
            worse.len(),
        )
        .unwrap();
        if let Some(&first) = worse.first() {
            let pixel = first / case.channels;
            failures.push(format!(
                "{}: {} samples differ (max {max_diff}); first at x {} y {} channel {}: \
                 hetmem {} vs OpenCV {}",
                case.output,
                worse.len(),
                pixel % case.width,
                pixel / case.width,
                first % case.channels,
                output[first],
                expected[first],
            ));
        }
    }
    assert!(failures.is_empty(), "hetmem and OpenCV differ:\n{}", failures.join("\n"));
}
