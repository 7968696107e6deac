//! Placement: which buffers of a computation live in device memory and which stay mapped.
//!
//! A computation declares each buffer it reads ([`BufferUse`]: its size, the bytes one pass
//! reads, how many passes, and the access pattern) and a device-memory budget. From a
//! [`LinkProfile`] (how fast a kernel reads device memory, reads mapped host memory over the
//! link, and how fast a copy crosses the link), [`Placer::place`] predicts each buffer's
//! seconds both ways and puts in device memory the buffers that save the most seconds per byte
//! of device memory, within the budget; the rest stay mapped (host memory or a file window,
//! read by the kernel over the link). Every decision carries its reason and its predicted
//! seconds, and the caller can override any of them. The rates come from the caller, or from
//! the profile `hetmem bench link` measured on this GPU ([`ProfileCache`]), else from the
//! built-in one ([`LinkProfile::built_in`]), and the placement names which.
//!
//! [`crate::Strategy::Hybrid`] is an instance: each slot of a filter or ring declares its frames
//! (read or written once per frame) and its stage's constant data (read by every block of every
//! frame, [`crate::stage::Stage::constants`]) and places them by what the placer decides
//! ([`crate::FrameFilter::placement`]).
//!
//! # Example
//! ```
//! use hetmem::placement::{AccessPattern, BufferUse, LinkProfile, Placer, Where};
//!
//! let profile = LinkProfile::new(4000.0, 50.0, 2.5, 55.0)?;
//! let placement = Placer::new(profile, 1 << 30)
//!     .buffer(BufferUse::new("volume", 150 << 20, 150 << 20, 1, AccessPattern::Sequential))
//!     .buffer(BufferUse::new("labels", 75 << 20, 75 << 20, 40, AccessPattern::Reused))
//!     .place()?;
//! assert_eq!(placement.decision("labels").unwrap().place, Where::Device);
//! assert_eq!(placement.decision("volume").unwrap().place, Where::Mapped);
//! println!("{placement}");
//! # Ok::<(), hetmem::Error>(())
//! ```

mod cache;
mod plan;
mod profile;

pub use cache::{GpuKey, ProfileCache, ProfileSource, SourcedProfile};
pub use plan::{AccessPattern, BufferUse, Decision, Placement, Placer, Where};
pub use profile::LinkProfile;
