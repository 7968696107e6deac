//! Every kernel compiles with NVRTC; no GPU needed, only libnvrtc.

use hetmem::backend::cuda::nvrtc;
use hetmem::kernels::{self, CacheOutcome, DEFAULT_CHECK_ARCH, KernelCache, KernelSource};
use hetmem::testing::nvrtc_or_skip;
use hetmem::{Error, error::NvrtcError};

#[test]
fn every_kernel_compiles_to_machine_code_with_its_entry_points() {
    hetmem::testing::check_kernels_compile(
        "every_kernel_compiles_to_machine_code_with_its_entry_points",
        kernels::ALL,
    );
}

#[test]
fn every_kernel_ships_ptx_that_cuda_12_drivers_load() {
    hetmem::testing::check_shipped_ptx(kernels::ALL);
}

#[test]
fn nvrtc_supports_the_check_architecture() {
    if nvrtc_or_skip("nvrtc_supports_the_check_architecture").is_none() {
        return;
    }
    let (major, _) = nvrtc::version().unwrap();
    assert!(major >= nvrtc::OLDEST_MAJOR, "NVRTC {major} loaded, but hetmem takes 12 or newer");
    let library = nvrtc::library().unwrap();
    assert!(nvrtc::LIBRARY_NAMES.contains(&library), "{library}");
    // CI runs these tests once with each NVRTC and says which it put on the loader path.
    if let Ok(expected) = std::env::var("HETMEM_EXPECT_NVRTC_MAJOR") {
        assert_eq!(major.to_string(), expected, "{library} loaded");
    }
    assert!(nvrtc::supported_architectures().unwrap().contains(&90));
}

#[test]
fn a_compile_error_carries_nvrtcs_log() {
    if nvrtc_or_skip("a_compile_error_carries_nvrtcs_log").is_none() {
        return;
    }
    let source = "extern \"C\" __global__ void broken(int* out) { *out = not_declared_anywhere; }";
    let error = nvrtc::compile_cubin("broken", source, DEFAULT_CHECK_ARCH, &[]).unwrap_err();
    match &error {
        NvrtcError::Compile { kernel, log, .. } => {
            assert_eq!(kernel, "broken");
            assert!(log.contains("not_declared_anywhere"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(Error::from(error).to_string().contains("broken.cu"));
}

#[test]
fn compiled_kernels_are_cached_reused_and_damage_is_recompiled() {
    if nvrtc_or_skip("compiled_kernels_are_cached_reused_and_damage_is_recompiled").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path().join("nested"));
    let source = &kernels::AFFINE;

    let (first, outcome) = cache.get_or_compile(source, DEFAULT_CHECK_ARCH).unwrap();
    assert_eq!(outcome, CacheOutcome::Compiled);
    let files: Vec<_> =
        std::fs::read_dir(dir.path().join("nested")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(std::fs::read(&files[0]).unwrap().starts_with(&first));

    let (second, outcome) = cache.get_or_compile(source, DEFAULT_CHECK_ARCH).unwrap();
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(second, first);

    let stored = std::fs::read(&files[0]).unwrap();
    // A truncated file (even one that still starts like an ELF image) and a file with one
    // flipped byte are both recompiled, never handed to the driver.
    for damaged in [stored[..stored.len() / 2].to_vec(), {
        let mut flipped = stored.clone();
        flipped[100] ^= 1;
        flipped
    }] {
        std::fs::write(&files[0], &damaged).unwrap();
        let (again, outcome) = cache.get_or_compile(source, DEFAULT_CHECK_ARCH).unwrap();
        assert_eq!(outcome, CacheOutcome::Compiled);
        assert_eq!(again, first);
        assert_eq!(std::fs::read(&files[0]).unwrap(), stored, "the damaged file is replaced");
    }
}

#[test]
fn a_changed_source_or_architecture_gets_its_own_cache_entry() {
    if nvrtc_or_skip("a_changed_source_or_architecture_gets_its_own_cache_entry").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let edited =
        KernelSource { source: "// edited\nextern \"C\" __global__ void affine_u32() {}", ..kernels::AFFINE };
    cache.get_or_compile(&kernels::AFFINE, "sm_90").unwrap();
    assert_eq!(cache.get_or_compile(&edited, "sm_90").unwrap().1, CacheOutcome::Compiled);
    assert_eq!(cache.get_or_compile(&kernels::AFFINE, "sm_80").unwrap().1, CacheOutcome::Compiled);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
}
