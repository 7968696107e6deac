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

/// The shipped PTX (scripts/gen-ptx; CI checks it is fresh): ISA 8.0 for `compute_70`, every
/// entry point, as for hetmem's own kernels.
#[test]
fn every_bench_kernel_ships_ptx_that_cuda_12_drivers_load() {
    for source in hetmem_bench::kernels::ALL {
        let ptx = source.ptx.unwrap_or_else(|| panic!("{} ships no PTX", source.name));
        assert!(ptx.contains("\n.version 8.0\n"), "{}: not PTX ISA 8.0", source.name);
        assert!(ptx.contains("\n.target sm_70\n"), "{}: not compute_70", source.name);
        for entry in source.entry_points {
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "{}: entry point {entry} missing",
                source.name
            );
        }
    }
}
