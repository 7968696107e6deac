//! The benchmark's own CUDA kernels. Their sources are `.cu` files in this crate's `kernels/`
//! folder, compiled and cached like hetmem's own through [`hetmem::kernels::kernel`].

use hetmem::kernels::KernelSource;

/// The link benchmark's zero-copy kernels: coalesced, strided and random reads folded into a
/// checksum, writes of a checkable pattern, and a read+write copy.
pub static BENCH: KernelSource = KernelSource {
    name: "bench",
    source: include_str!("../kernels/bench.cu"),
    ptx: Some(include_str!("../kernels/ptx/bench.ptx")),
    entry_points: &[
        "bench_read_u4",
        "bench_write_u4",
        "bench_copy_u4",
        "bench_read_strided",
        "bench_read_random",
    ],
    options: &[],
};

/// Every kernel source in this crate; the compile check builds each of them.
pub static ALL: &[&KernelSource] = &[&BENCH, &crate::dataset::DATASET];
