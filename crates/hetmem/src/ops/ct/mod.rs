//! The CT computation: a volume of Hounsfield units (i16) and a label template
//! (u8, one organ per voxel), read by
//! - per-organ statistics through the template ([`organ_stats`]): count, mean, standard
//!   deviation and a 256-bin histogram of HU within a window, one pass per organ and window;
//! - a masked, separable 3-D Gaussian smoothing of one organ ([`masked_gaussian`], f32);
//! - a maximum-intensity projection ([`mip_height`]), a picture a person can look at.
//!
//! The masked Gaussian is also a [`crate::stage::Stage`] over volume frames
//! ([`MaskedGaussianStage`], [`crate::stage::FrameLayout::volume`]), so the pipeline's strategies
//! run it.
//!
//! Each has a GPU path and a CPU path (`*_cpu`), the reference the GPU is tested against. The
//! GPU paths take leases of any buffer the device can read: device memory or mapped host
//! memory (zero-copy). Which one each buffer is, is what [`crate::placement`] decides; the
//! organ passes read the template whole and the volume only where the organ is, so the
//! template is the hot buffer.
//!
//! [`LabelledVolume::phantom`] generates a volume and its template (an anatomical phantom, not a
//! real scan);
//! [`read_raw_hu`] and [`read_raw_labels`] read raw files, and with the `nifti` feature
//! `read_nifti_hu` and `read_nifti_labels` read NIfTI-1 files.

mod mip;
mod phantom;
mod smooth;
mod stage;
mod stats;
mod volume;
mod volume_file;

pub use mip::{mip_height, mip_height_cpu, window_to_gray};
pub use phantom::Organ;
pub use smooth::{gaussian_weights, masked_gaussian, masked_gaussian_cpu};
pub use stage::{MaskedGaussianPrepared, MaskedGaussianStage};
pub use stats::{HISTOGRAM_BINS, HuWindow, OrganStats, STATS_WORDS, organ_stats, organ_stats_cpu};
pub use volume::{LabelledVolume, VolumeShape};
#[cfg(feature = "nifti")]
pub use volume_file::{read_nifti_hu, read_nifti_labels};
pub use volume_file::{read_raw_hu, read_raw_labels};

use crate::handoff::Lease;
use crate::memory::Buffer;

/// A lease of a volume of HU values (`i16`) that the CT operations read: device memory, mapped
/// host memory or a file window. The bounds every operation puts on its volume, said once.
pub trait HuLease: Lease<Buf: Buffer<Elem = i16>> {}

impl<T: Lease<Buf: Buffer<Elem = i16>>> HuLease for T {}

/// A lease of a label template (`u8`, a label per voxel) that the CT operations read.
pub trait LabelLease: Lease<Buf: Buffer<Elem = u8>> {}

impl<T: Lease<Buf: Buffer<Elem = u8>>> LabelLease for T {}
