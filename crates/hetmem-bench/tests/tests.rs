//! hetmem-bench's integration tests, one binary with a module per area.
//!
//! GPU tests skip visibly without a GPU and fail with `HETMEM_REQUIRE_GPU=1`
//! (see `hetmem::testing`).

mod bench_cross_process;
mod bench_dataset;
mod bench_link;
mod kernel_compile;
mod support;
