//! Shared test helpers: fresh random data (never zeros), both backends, child processes.

use hetmem::{BackendChoice, BackendKind, Device};

/// Written into outputs before a run, so an unwritten element cannot pass for a right one.
pub const POISON: u32 = 0xA5A5_A5A5;

/// `len` random 32-bit words from a fresh seed; the seed is printed so a failure can be replayed.
pub fn random_words(len: usize) -> Vec<u32> {
    let seed = fastrand::u64(..);
    eprintln!("random_words: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u32(..)).collect()
}

/// The index and values of the first difference between two slices, if any.
pub fn first_mismatch<T: PartialEq + Copy>(got: &[T], expected: &[T]) -> Option<(usize, T, T)> {
    assert_eq!(got.len(), expected.len(), "lengths differ");
    got.iter().zip(expected).position(|(g, e)| g != e).map(|index| (index, got[index], expected[index]))
}

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

/// The role this process plays, when it was started by [`run_child`].
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Re-runs this test binary for the single test `test`, with `role` in [`CHILD_ENV`], and
/// returns how it ended.
pub fn run_child(test: &str, role: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .output()
        .unwrap()
}

/// Re-runs this test binary for the single test `test` as `role` (see [`run_child`]) and fails,
/// showing the child's output, unless the child passed.
pub fn assert_child_passes(test: &str, role: &str) {
    let output = run_child(test, role);
    assert!(
        output.status.success(),
        "the {role} child of {test} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// CUDA device 0, for a child process's GPU part.
pub fn gpu_device() -> Device {
    Device::Cuda(hetmem::backend::cuda::CudaDevice::open(0).unwrap())
}

/// Runs `check` on the CPU here, and on the GPU in a child process playing `role` (skipping
/// without a GPU): a resident kernel refuses module loads and device synchronisation, which
/// would fail the tests running beside it. `path` is the test's path in the binary
/// (`module::test`).
pub fn on_cpu_then_gpu_child(path: &str, role: &str, check: fn(&Device)) {
    if child_role().as_deref() == Some(role) {
        return check(&gpu_device());
    }
    check(&cpu_device());
    let test = path.rsplit("::").next().unwrap_or(path);
    if hetmem::testing::cuda_device_or_skip(test).is_none() {
        return;
    }
    assert_child_passes(path, role);
}
