//! The benchmark's kernels compile with NVRTC; no GPU needed, only libnvrtc (the same check
//! as hetmem's own `kernel_compile`, for this crate's sources).

use hetmem::backend::cuda::nvrtc;
use hetmem::kernels::DEFAULT_CHECK_ARCH;
use hetmem::testing::nvrtc_or_skip;

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}

#[test]
fn every_bench_kernel_compiles_to_machine_code_with_its_entry_points() {
    if nvrtc_or_skip("every_bench_kernel_compiles_to_machine_code_with_its_entry_points").is_none() {
        return;
    }
    for source in hetmem_bench::kernels::ALL {
        let cubin = nvrtc::compile_cubin(source.name, source.source, DEFAULT_CHECK_ARCH, source.options)
            .unwrap_or_else(|error| panic!("{error}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{}: not an ELF image", source.name);
        for entry in source.entry_points {
            assert!(contains(&cubin, entry), "{}: entry point {entry} missing", source.name);
        }
    }
}
