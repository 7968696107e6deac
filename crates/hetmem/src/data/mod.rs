//! Files and data sets on their way to a GPU: streamed reads into pinned staging, windows of
//! the page cache registered in place, and safetensors checkpoints (files, or the shards an
//! index names) loaded tensor by tensor, all or a chosen few.
//!
//! | method | bytes come | CPU copies | best where |
//! |---|---|---|---|
//! | [`LoadMethod::StagedDirect`] | from storage by `O_DIRECT` into pinned staging | none | the file is not cached |
//! | [`LoadMethod::Staged`] | from the page cache (or storage) by `pread` into pinned staging | one | the file is cached |
//! | [`LoadMethod::Windows`] | the page cache's pages, registered in place | none | a cached file read many times per registration |
//! | [`LoadMethod::Auto`] | chosen by sampling what the page cache holds ([`resident_fraction`]) | | |
//!
//! [`load_spread`] spreads one checkpoint over several devices, each reading only its own
//! tensors.
//!
//! Every method reads with several threads into a ring of buffers, and the copies to the GPU
//! (or a stage's kernels) run while the next pieces are read. `hetmem bench file` measures each
//! on a machine, against the storage's own rate.

mod checkpoint;
mod method;
mod residency;
mod safetensors;
mod source;
mod spread;
mod stream;
mod windows;

pub use checkpoint::{Checkpoint, LoadPlan, PLACE_ALIGN, ShardSpec, TensorFilter};
pub use method::{LoadMethod, LoadReport, StreamOptions};
pub use residency::resident_fraction;
pub use safetensors::{LoadedTensors, SafetensorsHeader, TensorEntry, element_bytes};
pub use source::{FileRange, ReadMode};
pub use spread::{Placement, SpreadTensors, balanced_devices, load_spread};
pub use stream::{FilePiece, FilePieceData, FileStream};
