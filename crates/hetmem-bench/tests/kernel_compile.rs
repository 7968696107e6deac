//! The benchmark's kernels compile with NVRTC; no GPU needed, only libnvrtc (the same check
//! as hetmem's own `kernel_compile`, for this crate's sources).

#[test]
fn every_bench_kernel_compiles_to_machine_code_with_its_entry_points() {
    hetmem::testing::check_kernels_compile(
        "every_bench_kernel_compiles_to_machine_code_with_its_entry_points",
        hetmem_bench::kernels::ALL,
    );
}

#[test]
fn every_bench_kernel_ships_ptx_that_cuda_12_drivers_load() {
    hetmem::testing::check_shipped_ptx(hetmem_bench::kernels::ALL);
}
