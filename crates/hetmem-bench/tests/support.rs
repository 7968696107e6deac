//! Shared test helpers: both backends, child processes.

use hetmem::{BackendChoice, BackendKind, Device};

/// The CPU backend, always available.
pub fn cpu_device() -> Device {
    Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap()
}

/// Runs `check` on the CPU backend, then on the GPU (or prints why the GPU part is skipped).
pub fn on_every_backend(test: &str, check: impl Fn(&Device)) {
    check(&cpu_device());
    if let Some(gpu) = hetmem::testing::cuda_device_or_skip(test) {
        check(&Device::Cuda(gpu));
    }
}

/// The environment variable that tells a re-run test binary which child role to play.
pub const CHILD_ENV: &str = "HETMEM_TEST_CHILD";

/// The role this process plays, when it was started by [`assert_child_passes`].
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Re-runs this test binary for the single test `test`, with `role` in [`CHILD_ENV`], and
/// fails, showing the child's output, unless the child passed.
pub fn assert_child_passes(test: &str, role: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the {role} child of {test} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
