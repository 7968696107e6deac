//! Operations on buffers, each with a GPU path (a CUDA kernel) and a CPU path that is both the
//! CPU backend and the reference the GPU path is tested against.

mod affine;
mod checksum;
pub mod ct;
pub mod gaussian;

pub use affine::{affine_u32, affine_u32_cpu};
pub use checksum::{Checksum, checksum, checksum_cpu};
