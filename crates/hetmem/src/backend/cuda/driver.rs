//! Finding and starting the CUDA driver, once per process.
//!
//! cudarc panics when a symbol or the library is missing, so nothing else in the backend may
//! run before [`driver`] has answered `Ok`: it checks that libcuda loads, that the driver is
//! new enough for the bindings hetmem is built with (CUDA 12.0 by default), and that it sees a
//! device.

use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use super::{Call, cuda_error};
use crate::backend::cuda::error::Unavailable;

/// The oldest CUDA version (`major * 1000 + minor * 10`) of a driver hetmem runs on: 12.0 with
/// its default `cuda-12000` feature (every call it makes exists since, and the newer forms it
/// prefers are looked up at run time). Built with cudarc's bindings of another version instead,
/// it asks for 13.0, the newest it is tested with, since those bindings may name entry points
/// of their own version.
pub const REQUIRED_CUDA_VERSION: i32 = if cfg!(feature = "cuda-12000") { 12000 } else { 13000 };

/// What the loaded driver reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// The CUDA version the driver supports, as `major * 1000 + minor * 10`.
    pub cuda_version: i32,
    /// How many CUDA devices it sees.
    pub device_count: usize,
}

/// The CUDA driver, loaded and initialised, or why it cannot be.
///
/// The answer is computed once and cached for the life of the process.
///
/// # Errors
/// The reason the CUDA backend cannot run here.
pub fn driver() -> Result<DriverInfo, Unavailable> {
    static DRIVER: OnceLock<Result<DriverInfo, Unavailable>> = OnceLock::new();
    DRIVER.get_or_init(load).clone()
}

/// The CUDA version of the driver library, without initialising it or asking for devices.
///
/// # Errors
/// [`Unavailable::NoDriverLibrary`] when libcuda cannot be loaded.
pub fn driver_cuda_version() -> Result<i32, Unavailable> {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names; it touches
    // no CUDA state.
    if !unsafe { sys::is_culib_present() } {
        return Err(Unavailable::NoDriverLibrary);
    }
    let mut version = 0;
    // SAFETY: the library is present (checked above); cuDriverGetVersion may be called before
    // cuInit, exists in every driver, and writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .call("cuDriverGetVersion")
        .map_err(|error| Unavailable::InitFailed { error: error.to_string() })?;
    Ok(version)
}

fn load() -> Result<DriverInfo, Unavailable> {
    let cuda_version = driver_cuda_version()?;
    // Checked before any other symbol is resolved: an entry point missing from an older driver
    // would make cudarc panic.
    if cuda_version < REQUIRED_CUDA_VERSION {
        return Err(Unavailable::DriverTooOld {
            driver_version: cuda_version,
            required_version: REQUIRED_CUDA_VERSION,
        });
    }
    match result::init() {
        Ok(()) => {}
        Err(error) if error.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Err(Unavailable::NoDevice),
        Err(error) => {
            return Err(Unavailable::InitFailed { error: cuda_error("cuInit", error).to_string() });
        }
    }
    let count = result::device::get_count()
        .call("cuDeviceGetCount")
        .map_err(|error| Unavailable::InitFailed { error: error.to_string() })?;
    if count <= 0 {
        return Err(Unavailable::NoDevice);
    }
    Ok(DriverInfo { cuda_version, device_count: count as usize })
}
