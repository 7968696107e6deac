//! The GPU test convention, for hetmem's tests and for code built on it.
//!
//! A test that needs a GPU asks [`cuda_device_or_skip`]. Where there is no usable GPU it
//! prints `skipped: no CUDA device` straight to the terminal (not into the test harness's
//! captured output, so the skip is visible) and the test returns early and passes. With
//! `HETMEM_REQUIRE_GPU=1` set, a missing GPU fails the test instead: that is how the GPU
//! machine's runs prove the GPU paths actually ran. [`nvrtc_or_skip`] does the same for
//! NVRTC, with `HETMEM_REQUIRE_NVRTC=1`.

use std::io::Write;

use crate::backend::cuda::{CudaDevice, nvrtc};

/// Set to `1` to make GPU tests fail, not skip, without a GPU.
pub const REQUIRE_GPU_ENV: &str = "HETMEM_REQUIRE_GPU";
/// Set to `1` to make compile tests fail, not skip, without NVRTC.
pub const REQUIRE_NVRTC_ENV: &str = "HETMEM_REQUIRE_NVRTC";

fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|value| value == "1")
}

fn skip(test: &str, what: &str) {
    // Bypasses the harness's capture, which hides a passing test's output.
    let _ = writeln!(std::io::stderr(), "{test}: skipped: {what}");
}

/// The first CUDA device, or `None` after printing why the test is skipped.
///
/// # Panics
/// When there is no usable GPU and `HETMEM_REQUIRE_GPU=1`.
pub fn cuda_device_or_skip(test: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(device) => Some(device),
        Err(reason) if required(REQUIRE_GPU_ENV) => {
            panic!("{test}: {REQUIRE_GPU_ENV}=1 but no usable CUDA device: {reason}")
        }
        Err(reason) => {
            skip(test, &format!("no CUDA device ({reason})"));
            None
        }
    }
}

/// `Some(())` when NVRTC can be loaded, or `None` after printing why the test is skipped.
///
/// # Panics
/// When NVRTC is missing and `HETMEM_REQUIRE_NVRTC=1`.
pub fn nvrtc_or_skip(test: &str) -> Option<()> {
    if nvrtc::is_available() {
        return Some(());
    }
    if required(REQUIRE_NVRTC_ENV) {
        panic!("{test}: {REQUIRE_NVRTC_ENV}=1 but libnvrtc.so.13 cannot be loaded (set LD_LIBRARY_PATH)");
    }
    skip(test, "NVRTC not found (libnvrtc.so.13)");
    None
}
