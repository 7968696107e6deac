//! A video's frames one after another, whatever holds them ([`Container`]): what comes before
//! each frame (a Y4M `FRAME` line, nothing in raw video), and how many frames a file holds.
//! The samples of each frame are read straight into the caller's frame memory (a ring's input
//! slot) by [`Packing::read`](crate::Packing::read), and written from it by
//! [`Packing::write`](crate::Packing::write).

use std::io::BufRead;

use anyhow::Context as _;

use crate::container::{Container, Start};
use crate::y4m;

/// Frames of `frame_bytes` a regular file of `bytes` holds, for a progress bar (assuming no Y4M
/// frame parameters).
pub fn frames_in(container: &Container, bytes: u64, frame_bytes: usize) -> u64 {
    match container {
        Container::Y4m { header } => {
            bytes.saturating_sub(header.len() as u64) / (frame_bytes + y4m::FRAME.len() + 1) as u64
        }
        Container::Raw { .. } => bytes / frame_bytes as u64,
    }
}

/// Reads what comes before frame `index`'s samples in `container` into `line` (the stream is
/// `input` in messages; `written` says which frames were written, for messages).
///
/// # Errors
/// The stream cannot be read, or holds something else than what comes before a frame.
pub fn read_start(
    container: &Container,
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    index: u64,
    input: &str,
    written: &str,
) -> anyhow::Result<Start> {
    match container {
        Container::Y4m { .. } => y4m::read_frame_line(reader, line, index, input, written),
        Container::Raw { .. } => {
            // Raw video has nothing before a frame; the line stays as it was given.
            let ahead = reader
                .fill_buf()
                .with_context(|| format!("cannot read frame {index} (counting from 0) of {input}"))?;
            Ok(if ahead.is_empty() { Start::End } else { Start::Frame })
        }
    }
}
