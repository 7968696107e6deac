//! hetmem's integration tests, one binary with a module per area.
//!
//! GPU tests skip visibly without a GPU and fail with `HETMEM_REQUIRE_GPU=1`
//! (see `hetmem::testing`).

mod checkpoints;
mod ct_volume;
mod cuda_smoke;
mod cudarc_interop;
mod doorbell;
mod faults;
mod file_stream;
mod filter_strategies;
mod fuzz_files;
mod handoff;
mod interprocess;
mod kernel_compile;
mod managed_attach;
mod mapped;
mod memory_kinds;
mod multi_device;
mod opencv;
mod resident_blur;
mod ring;
mod sizes;
mod source_rules;
mod stages;
mod support;
mod truncated_files;
mod windows_and_ranges;
