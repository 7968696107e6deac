//! Y4M (YUV4MPEG2) video: files, or pipes from and to ffmpeg.
//!
//! The stream header is written out byte for byte as it came in (size, frame rate,
//! interlacing, aspect, colour space, comments), and so is each `FRAME` line. 9- to 16-bit
//! colour spaces (`C420p10`, `C422p12`, `C444p16`, `Cmono10`, ...) hold 16-bit little-endian
//! samples: they are filtered as such, never narrowed, and written back as they came. The
//! frames are read and written by [`crate::frames`], as raw video's are.
//!
//! Nothing in the stream decides how much is read or allocated unchecked: the header and
//! `FRAME` lines are read up to a bound, and the size the header declares is checked against
//! the budget before the ring's slots are allocated.
//!
//! The `y4m` crate is not used for this: its decoder reads frames into its own buffer (a copy
//! more per frame) and its encoder cannot write interlacing or pass parameters through.

use std::io::{self, BufRead, Read};

use anyhow::{Context as _, anyhow, bail};
use hetmem::ops::gaussian::{FrameFormat, PixelLayout, SampleType};

use crate::container::{Container, Start, Video};

/// How a Y4M stream starts.
pub const MAGIC: &[u8] = b"YUV4MPEG2";
/// How each frame starts.
pub const FRAME: &[u8] = b"FRAME";
/// The longest stream header accepted (real ones are under 100 bytes).
const HEADER_LIMIT: u64 = 4096;
/// The longest `FRAME` line accepted.
const FRAME_LINE_LIMIT: u64 = 1024;
/// The colour spaces hetmem filters, for messages.
const SUPPORTED: &str = "C420, C420jpeg, C420paldv, C420mpeg2 (4:2:0), C422, C444 and Cmono (8-bit), and \
                         C420pN, C422pN, C444pN and CmonoN for N from 9 to 16 (16-bit samples)";

/// What the stream header says, and the header itself.
#[derive(Debug)]
struct Header {
    width: usize,
    height: usize,
    /// The `C` parameter as written (`420jpeg`), or `None` when absent (4:2:0 then).
    colour_space: Option<String>,
    layout: PixelLayout,
    /// 8-bit samples, or 16-bit little-endian ones for 9 to 16 bits.
    sample: SampleType,
    /// The `I` parameter: `p`, `t`, `b`, `m` or `?`.
    interlacing: Option<char>,
}

impl Header {
    fn colour_space_name(&self) -> String {
        self.colour_space.as_ref().map_or("C420 (implied)".to_string(), |name| format!("C{name}"))
    }
}

/// The pixel layout and sample type of a Y4M colour space (the `C` parameter without its
/// `C`), as ffmpeg writes and reads them: `420p10` is 4:2:0 of 10-bit samples, each in a
/// 16-bit little-endian word, and so for 9 to 16 bits.
fn layout_of(colour_space: &str) -> Option<(PixelLayout, SampleType)> {
    let eight_bit = match colour_space {
        "420" | "420jpeg" | "420paldv" | "420mpeg2" => Some(PixelLayout::Yuv420),
        "422" => Some(PixelLayout::Yuv422),
        "444" => Some(PixelLayout::Yuv444),
        "mono" => Some(PixelLayout::Gray),
        _ => None,
    };
    if let Some(layout) = eight_bit {
        return Some((layout, SampleType::U8));
    }
    let (layout, bits) = [
        ("420p", PixelLayout::Yuv420),
        ("422p", PixelLayout::Yuv422),
        ("444p", PixelLayout::Yuv444),
        ("mono", PixelLayout::Gray),
    ]
    .into_iter()
    .find_map(|(prefix, layout)| Some((layout, colour_space.strip_prefix(prefix)?)))?;
    // Digits only: `parse` would take a sign too.
    let bits: u32 = bits.bytes().all(|b| b.is_ascii_digit()).then(|| bits.parse().ok())??;
    (9..=16).contains(&bits).then_some((layout, SampleType::U16))
}

/// A byte string for a message: printable ASCII as is, the rest escaped, at most 32 bytes.
fn shown(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(32)];
    let more = if bytes.len() > cut.len() { "..." } else { "" };
    format!("\"{}{more}\"", cut.escape_ascii())
}

/// Parses the stream header line (with its `\n`).
fn parse_header(line: &[u8]) -> anyhow::Result<Header> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let params = match body.strip_prefix(MAGIC) {
        Some(rest) if rest.is_empty() || rest[0] == b' ' => rest,
        _ => bail!("not a Y4M stream: it starts with {} instead of YUV4MPEG2", shown(line)),
    };
    let (mut width, mut height, mut colour_space, mut interlacing) = (None, None, None, None);
    for param in params.split(|&byte| byte == b' ').filter(|param| !param.is_empty()) {
        let value = &param[1..];
        let number = |name: &str| -> anyhow::Result<usize> {
            std::str::from_utf8(value)
                .ok()
                .and_then(|text| text.parse().ok())
                .with_context(|| format!("corrupt Y4M header: the {name} {} is not a number", shown(param)))
        };
        match param[0] {
            b'W' => width = Some(number("width")?),
            b'H' => height = Some(number("height")?),
            b'C' => colour_space = Some(String::from_utf8_lossy(value).into_owned()),
            b'I' => interlacing = value.first().map(|&byte| char::from(byte)),
            // F (frame rate), A (aspect), X (comments) and the rest pass through untouched.
            _ => {}
        }
    }
    let width = width.context("corrupt Y4M header: no width (W)")?;
    let height = height.context("corrupt Y4M header: no height (H)")?;
    let (layout, sample) = match &colour_space {
        None => (PixelLayout::Yuv420, SampleType::U8),
        Some(name) => layout_of(name).with_context(|| {
            format!(
                "unsupported Y4M colour space C{name}: hetmem filters {SUPPORTED} \
                 (convert first, e.g. with ffmpeg's -pix_fmt yuv420p)"
            )
        })?,
    };
    Ok(Header { width, height, colour_space, layout, sample, interlacing })
}

/// How reading a line ended.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// Nothing: the stream ended before it.
    End,
    /// A line with its `\n`.
    Complete,
    /// Bytes, then the end of the stream, no `\n`.
    Truncated,
    /// No `\n` within the limit.
    TooLong,
}

fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>, limit: u64) -> io::Result<Line> {
    line.clear();
    let read = reader.by_ref().take(limit).read_until(b'\n', line)?;
    Ok(if read == 0 {
        Line::End
    } else if line.last() == Some(&b'\n') {
        Line::Complete
    } else if read as u64 == limit {
        Line::TooLong
    } else {
        Line::Truncated
    })
}

/// Reads and checks the stream header of the Y4M stream `reader` (named `input` in
/// messages): what its frames are. The frames come next in `reader`.
///
/// # Errors
/// The stream cannot be read, or its header is missing, corrupt or unsupported.
pub fn read_header(reader: &mut impl BufRead, input: &str) -> anyhow::Result<Video> {
    let mut line = Vec::with_capacity(256);
    let ended = read_line(reader, &mut line, HEADER_LIMIT).with_context(|| format!("cannot read {input}"))?;
    if !line.is_empty() && !line.starts_with(&MAGIC[..line.len().min(MAGIC.len())]) {
        bail!("{input}: not a Y4M stream: it starts with {} instead of YUV4MPEG2", shown(&line));
    }
    match ended {
        Line::End => bail!("{input}: empty: no Y4M header"),
        Line::Truncated => bail!("{input}: truncated Y4M header: the stream ends inside it"),
        Line::TooLong => {
            bail!("{input}: corrupt Y4M header: no end of line in its first {HEADER_LIMIT} bytes")
        }
        Line::Complete => {}
    }
    let header = parse_header(&line).with_context(|| input.to_string())?;
    let (width, height) = (header.width, header.height);
    let pixels = header.colour_space_name();
    let format = FrameFormat::new(width, height, header.layout)
        .with_context(|| format!("cannot filter {input} ({width}x{height} {pixels})"))?
        .with_sample(header.sample);
    let mut warnings = Vec::new();
    if let Some(mode @ ('t' | 'b' | 'm')) = header.interlacing {
        warnings.push(format!(
            "{input} is interlaced (I{mode}): each frame is blurred whole, which mixes its two fields"
        ));
    }
    Ok(Video { format, container: Container::Y4m { header: line }, pixels, warnings })
}

/// Reads the `FRAME` line before frame `index` into `line`. `written` says which frames were
/// written, for messages.
///
/// # Errors
/// The stream cannot be read, or holds something else than a `FRAME` line.
pub fn read_frame_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    index: u64,
    input: &str,
    written: &str,
) -> anyhow::Result<Start> {
    let ended = read_line(reader, line, FRAME_LINE_LIMIT)
        .with_context(|| format!("cannot read frame {index} (counting from 0) of {input}"))?;
    let is_frame_line = line.starts_with(FRAME) && matches!(line.get(FRAME.len()), Some(b' ' | b'\n'));
    Ok(match ended {
        Line::End => Start::End,
        Line::Complete if is_frame_line => Start::Frame,
        Line::Truncated if line.starts_with(&FRAME[..line.len().min(FRAME.len())]) => Start::Cut(anyhow!(
            "{input}: frame {index} (counting from 0) is truncated: the stream ends inside its FRAME line; \
             {written}"
        )),
        // Whatever else a stream cut by Ctrl-C ends with is not a whole frame either.
        Line::Truncated => Start::Cut(anyhow!(
            "{input}: frame {index} (counting from 0) is corrupt: it starts with {} instead of FRAME; {written}",
            shown(line)
        )),
        Line::TooLong if line.starts_with(FRAME) => bail!(
            "{input}: frame {index} (counting from 0) is corrupt: its FRAME line has no end in its first \
             {FRAME_LINE_LIMIT} bytes (frame parameters take a few); {written}"
        ),
        _ => bail!(
            "{input}: frame {index} (counting from 0) is corrupt: it starts with {} instead of FRAME; {written}",
            shown(line)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_refuse_what_they_should() {
        let header =
            parse_header(b"YUV4MPEG2 W33 H17 F30000:1001 Ip A1:1 C420jpeg XYSCSS=420JPEG\n").unwrap();
        assert_eq!((header.width, header.height, header.layout), (33, 17, PixelLayout::Yuv420));
        assert_eq!(header.interlacing, Some('p'));
        assert_eq!(parse_header(b"YUV4MPEG2 W2 H2\n").unwrap().layout, PixelLayout::Yuv420);
        assert_eq!(parse_header(b"YUV4MPEG2 W2 H2 Cmono\n").unwrap().layout, PixelLayout::Gray);
        assert_eq!(parse_header(b"YUV4MPEG2 W2 H2 C422\n").unwrap().layout, PixelLayout::Yuv422);
        for (header, layout, sample) in [
            ("YUV4MPEG2 W2 H2 C420\n", PixelLayout::Yuv420, SampleType::U8),
            ("YUV4MPEG2 W2 H2 C420p10 XYSCSS=420P10\n", PixelLayout::Yuv420, SampleType::U16),
            ("YUV4MPEG2 W2 H2 C422p12\n", PixelLayout::Yuv422, SampleType::U16),
            ("YUV4MPEG2 W2 H2 C444p16\n", PixelLayout::Yuv444, SampleType::U16),
            ("YUV4MPEG2 W2 H2 C420p9\n", PixelLayout::Yuv420, SampleType::U16),
            ("YUV4MPEG2 W2 H2 Cmono10\n", PixelLayout::Gray, SampleType::U16),
            ("YUV4MPEG2 W2 H2 Cmono16\n", PixelLayout::Gray, SampleType::U16),
        ] {
            let parsed = parse_header(header.as_bytes()).unwrap();
            assert_eq!((parsed.layout, parsed.sample), (layout, sample), "{header}");
        }
        // 4:1:1, alpha planes, and depths outside 9 to 16 bits are refused by name.
        for space in ["C411", "C444alpha", "C420p8", "C420p17", "C420p", "C420p+10", "Cmono8"] {
            let header = format!("YUV4MPEG2 W2 H2 {space}\n");
            let error = format!("{:#}", parse_header(header.as_bytes()).unwrap_err());
            assert!(error.contains(space) && error.contains("C444") && error.contains("C420pN"), "{error}");
        }
        assert!(parse_header(b"YUV4MPEG2 H2\n").is_err());
        assert!(parse_header(b"YUV4MPEG2 Wx H2\n").is_err());
        assert!(parse_header(b"YUV4MPEG2X W2 H2\n").is_err());
    }

    #[test]
    fn lines_end_in_four_ways() {
        let mut line = Vec::new();
        assert_eq!(read_line(&mut &b""[..], &mut line, 8).unwrap(), Line::End);
        assert_eq!(read_line(&mut &b"FRAME\nxx"[..], &mut line, 8).unwrap(), Line::Complete);
        assert_eq!(read_line(&mut &b"FRA"[..], &mut line, 8).unwrap(), Line::Truncated);
        assert_eq!(read_line(&mut &b"FRAMEFRAMEFRAME"[..], &mut line, 8).unwrap(), Line::TooLong);
    }
}
