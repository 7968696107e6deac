//! The GPU test convention, for hetmem's tests and for code built on it.
//!
//! A test that needs a GPU asks [`cuda_device_or_skip`]. Where there is no usable GPU it
//! prints `skipped: no CUDA device` straight to the terminal (not into the test harness's
//! captured output, so the skip is visible) and the test returns early and passes. With
//! `HETMEM_REQUIRE_GPU=1` set, a missing GPU fails the test instead: that is how the GPU
//! machine's runs prove the GPU paths actually ran. [`nvrtc_or_skip`] does the same for
//! NVRTC, with `HETMEM_REQUIRE_NVRTC=1`.
//!
//! This module, [`faults`] and the doorbell's stalling requests exist only with the `testing`
//! feature: they are hooks for tests, not part of the library's contract.

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
        panic!("{test}: {REQUIRE_NVRTC_ENV}=1 but no NVRTC 12 or 13 can be loaded (set LD_LIBRARY_PATH)");
    }
    skip(test, "NVRTC 12 or 13 not found");
    None
}

/// Checks that NVRTC compiles every source of `sources` to machine code for
/// [`DEFAULT_CHECK_ARCH`](crate::kernels::DEFAULT_CHECK_ARCH) holding each of its entry points
/// (a crate's kernel compile check), or skips as [`nvrtc_or_skip`] does.
///
/// # Panics
/// A source that does not compile (with NVRTC's log) or lacks an entry point.
pub fn check_kernels_compile(test: &str, sources: &[&crate::kernels::KernelSource]) {
    if nvrtc_or_skip(test).is_none() {
        return;
    }
    for source in sources {
        let cubin = nvrtc::compile_cubin(
            source.name,
            source.source,
            crate::kernels::DEFAULT_CHECK_ARCH,
            source.options,
        )
        .unwrap_or_else(|error| panic!("{error}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{}: not an ELF image", source.name);
        for entry in source.entry_points {
            let found = cubin.windows(entry.len()).any(|window| window == entry.as_bytes());
            assert!(found, "{}: entry point {entry} missing", source.name);
        }
    }
}

/// Checks that every source of `sources` ships the PTX `scripts/gen-ptx` makes (CI checks it
/// is fresh), which drivers from CUDA 12.0 on compile: NVRTC 12.0.76's, ISA 8.0 for
/// `compute_70`, with every entry point of its source, compiled without options.
///
/// # Panics
/// A source without PTX, or PTX of another kind.
pub fn check_shipped_ptx(sources: &[&crate::kernels::KernelSource]) {
    for source in sources {
        let ptx = source.ptx.unwrap_or_else(|| panic!("{} ships no PTX", source.name));
        assert!(ptx.contains("\n.version 8.0\n"), "{}: not PTX ISA 8.0", source.name);
        assert!(ptx.contains("\n.target sm_70\n"), "{}: not compute_70", source.name);
        assert!(ptx.contains("release 12.0, V12.0.76"), "{}: not made by NVRTC 12.0.76", source.name);
        for entry in source.entry_points {
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "{}: entry point {entry} missing",
                source.name
            );
        }
        assert!(source.options.is_empty(), "{}: the PTX is compiled without options", source.name);
    }
}

/// Fault injection: make the Nth allocation, registration, launch, copy or fence wait fail.
///
/// Rules are process-wide: arm them only in a process of their own (a test that re-runs its
/// binary as a child, or a CLI run), never beside other tests.
///
/// ```
/// use hetmem::testing::faults::{self, FaultKind, FaultPoint};
/// faults::arm(FaultPoint::Allocation, 1, FaultKind::Transient);
/// let cpu = hetmem::Device::open(hetmem::BackendChoice::Only(hetmem::BackendKind::Cpu))?;
/// let error = hetmem::HostBuf::<u8>::pinned(&cpu, 64, Default::default()).unwrap_err();
/// assert!(error.is_transient());
/// assert_eq!(faults::fired().len(), 1);
/// faults::clear();
/// # Ok::<(), hetmem::Error>(())
/// ```
pub mod faults {
    pub use crate::faults::{FaultKind, FaultPoint, Fired};
    pub use crate::faults::{arm, calls, clear, fired};
}
