//! Media I/O for hetmem: Y4M and raw video, PNG, JPEG and PNM images, read straight into the
//! frame memory a [`hetmem::FrameRing`] or [`hetmem::FrameFilter`] hands out, and written
//! straight from it. These are the readers and writers of `hetmem filter`.
//!
//! - An input is opened once ([`Input`]) and its first bytes tell its format, so pipes given as
//!   paths (`/dev/stdin`, `<(...)`, a FIFO) work as files do.
//! - The size a header declares is checked against a [`Budget`] before anything that large is
//!   allocated; a header is a few bytes that may claim anything.
//! - A video is described by its reader ([`y4m::read_header`], [`raw::video`]) as a [`Video`]:
//!   one [`FrameFormat`](hetmem::ops::gaussian::FrameFormat) per frame and the [`Container`]
//!   around the frames. Each frame's samples go straight into the caller's slot
//!   ([`Packing::read`]), by several threads at once from a regular file ([`FrameSource`]),
//!   and out of it ([`Packing::write`], [`FrameSink`]).
//! - 9- to 16-bit video (`C420p10`, ...) and 16-bit images stay 16-bit (little-endian samples
//!   in the frame), never narrowed.
//!
//! Errors are [`anyhow::Error`]s whose messages name the input, what is wrong and the remedy,
//! as `hetmem filter` prints them.
//!
//! # Examples
//!
//! A Y4M stream's frames, each read into a buffer (a ring's input slot in
//! `examples/y4m_ring.rs`):
//!
//! ```
//! use hetmem_media::{Start, frames, y4m};
//!
//! # fn main() -> anyhow::Result<()> {
//! let stream: &[u8] = b"YUV4MPEG2 W4 H2 Cmono\nFRAME\n01234567FRAME\nabcdefgh";
//! let mut reader = stream;
//! let video = y4m::read_header(&mut reader, "the stream")?;
//! let mut frame = vec![0; video.format.frame_bytes()];
//! let (mut line, mut scratch) = (Vec::new(), Vec::new());
//! let packing = video.container.packing();
//! let mut read = Vec::new();
//! for index in 0.. {
//!     match frames::read_start(&video.container, &mut reader, &mut line, index, "the stream", "")? {
//!         Start::Frame => {}
//!         Start::End => break,
//!         Start::Cut(error) => return Err(error),
//!     }
//!     assert_eq!(packing.read(&mut reader, &mut frame, &mut scratch)?, frame.len());
//!     read.extend_from_slice(&frame);
//! }
//! assert_eq!(read, b"01234567abcdefgh");
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod budget;
mod container;
mod endpoint;
mod frame_io;
pub mod frames;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod image;
pub mod raw;
pub mod y4m;

pub use self::budget::{Budget, DEFAULT_MAX_PIXELS};
pub use self::container::{Container, Packing, Start, Video};
pub use self::endpoint::{Endpoint, Input, Named, stdout};
pub use self::frame_io::{FrameRead, FrameSink, FrameSource, FrameWrite, Interrupt, default_threads};
