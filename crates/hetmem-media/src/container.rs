//! What holds a video's frames, as its reader found it: the stream header (if there is one),
//! what comes before each frame, and how a frame's samples lie in the stream. The readers
//! ([`crate::y4m`], [`crate::raw`]) describe a stream by these types; [`crate::frames`] reads
//! and writes its frames, whatever the container.

use std::io;

use hetmem::ops::gaussian::FrameFormat;

use crate::frame_io::{FrameRead, FrameWrite};

/// A video stream whose header (if it has one) was read and checked: what the frames are,
/// and what holds them.
#[derive(Debug)]
pub struct Video {
    /// One frame as the ring holds it.
    pub format: FrameFormat,
    /// What holds the frames.
    pub container: Container,
    /// The container's name for the pixels (`C420jpeg`, `nv12`), for messages and the report.
    pub pixels: String,
    /// Said before any frame is filtered (an interlaced stream, ...).
    pub warnings: Vec<String>,
}

/// What holds the frames.
#[derive(Debug)]
pub enum Container {
    /// Y4M: the stream header line (written out byte for byte as it came), then a `FRAME` line
    /// before each frame (each written out as it came too). Frames are planar.
    Y4m {
        /// The stream header line, with its `\n`.
        header: Vec<u8>,
    },
    /// Raw video: whole frames back to back, nothing before or between them, packed as
    /// `packing` says (ffmpeg's `-f rawvideo`).
    Raw {
        /// How each frame's samples lie in the stream.
        packing: Packing,
    },
}

/// How the bytes before a frame's samples ended ([`crate::frames::read_start`]).
#[derive(Debug)]
pub enum Start {
    /// A frame follows.
    Frame,
    /// The stream ended cleanly, before a frame.
    End,
    /// The stream ended inside what comes before a frame (a Y4M `FRAME` line): the error to
    /// report, unless Ctrl-C explains it.
    Cut(anyhow::Error),
}

impl Container {
    /// `Y4M` or `raw`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Container::Y4m { .. } => "Y4M",
            Container::Raw { .. } => "raw",
        }
    }

    /// What comes before the frames, to write out before them: the Y4M stream header as it
    /// came, nothing for raw video.
    pub fn header(&self) -> &[u8] {
        match self {
            Container::Y4m { header } => header,
            Container::Raw { .. } => &[],
        }
    }

    /// How each frame's samples lie in the stream.
    pub fn packing(&self) -> Packing {
        match self {
            Container::Y4m { .. } => Packing::Planar,
            Container::Raw { packing } => *packing,
        }
    }
}

/// How a frame's samples lie in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// As the ring holds them: plane after plane (each interleaved, for RGB).
    Planar,
    /// nv12: the luma plane (`luma` bytes), then U and V interleaved in one plane, which the
    /// ring holds as two planes (planar 4:2:0). Built by [`crate::raw::video`] only, which
    /// derives `luma` from the frame's format.
    #[non_exhaustive]
    Nv12 {
        /// The bytes of the luma plane.
        luma: usize,
    },
}

impl Packing {
    /// Bytes of scratch memory a reader or a writer takes per frame of `format`.
    pub fn scratch_bytes(self, format: &FrameFormat) -> usize {
        match self {
            Packing::Planar => 0,
            Packing::Nv12 { luma } => format.frame_bytes() - luma,
        }
    }

    /// Reads one frame from `reader` into `frame` (the ring's layout); returns the stream's
    /// bytes read: fewer than the frame's only where the stream ends inside it.
    pub fn read(
        self,
        reader: &mut impl FrameRead,
        frame: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> io::Result<usize> {
        match self {
            Packing::Planar => reader.read_frame(frame),
            Packing::Nv12 { luma } => {
                let (luma, chroma) = frame.split_at_mut(luma);
                let read = reader.read_frame(luma)?;
                if read < luma.len() {
                    return Ok(read);
                }
                scratch.resize(chroma.len(), 0);
                let read_chroma = reader.read_frame(scratch)?;
                let (u, v) = chroma.split_at_mut(chroma.len() / 2);
                for ((pair, u), v) in scratch.chunks_exact(2).zip(u).zip(v) {
                    (*u, *v) = (pair[0], pair[1]);
                }
                Ok(read + read_chroma)
            }
        }
    }

    /// Writes one frame of the ring's layout to `out` as the stream holds it.
    pub fn write(self, out: &mut impl FrameWrite, frame: &[u8], scratch: &mut Vec<u8>) -> io::Result<()> {
        match self {
            Packing::Planar => out.write_frame(frame),
            Packing::Nv12 { luma } => {
                let (luma, chroma) = frame.split_at(luma);
                let (u, v) = chroma.split_at(chroma.len() / 2);
                scratch.clear();
                scratch.extend(u.iter().zip(v).flat_map(|(&u, &v)| [u, v]));
                out.write_frame(luma)?;
                out.write_frame(scratch)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hetmem::ops::gaussian::PixelLayout;

    use super::*;

    #[test]
    fn nv12_is_planar_4_2_0_interleaved_and_back() {
        // 3x3: a 9-byte luma plane, 2x2 chroma: U and V of 4 bytes each.
        let format = FrameFormat::new(3, 3, PixelLayout::Yuv420).unwrap();
        let packing = Packing::Nv12 { luma: 9 };
        assert_eq!(packing.scratch_bytes(&format), 8);
        let stream: Vec<u8> = (0..17).map(|byte| byte * 7 + 3).collect();
        let mut frame = vec![0; format.frame_bytes()];
        let mut scratch = Vec::new();
        assert_eq!(packing.read(&mut &stream[..], &mut frame, &mut scratch).unwrap(), 17);
        assert_eq!(&frame[..9], &stream[..9]);
        let (u, v): (Vec<u8>, Vec<u8>) = stream[9..].chunks(2).map(|pair| (pair[0], pair[1])).unzip();
        assert_eq!((&frame[9..13], &frame[13..]), (&u[..], &v[..]));
        let mut written = Vec::new();
        packing.write(&mut written, &frame, &mut scratch).unwrap();
        assert_eq!(written, stream);
        // A stream that ends inside the chroma plane says how far it got.
        assert_eq!(packing.read(&mut &stream[..12], &mut frame, &mut scratch).unwrap(), 12);
        assert_eq!(packing.read(&mut &stream[..4], &mut frame, &mut scratch).unwrap(), 4);
    }
}
