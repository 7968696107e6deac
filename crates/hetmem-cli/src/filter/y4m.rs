//! Y4M (YUV4MPEG2) video: files, or pipes from and to ffmpeg.
//!
//! The stream header is written out byte for byte as it came in (size, frame rate,
//! interlacing, aspect, colour space, comments), and so is each `FRAME` line. 9- to 16-bit
//! colour spaces (`C420p10`, `C422p12`, `C444p16`, `Cmono10`, ...) hold 16-bit little-endian
//! samples: they are filtered as such, never narrowed, and written back as they came. Each frame's
//! planes are read straight into a [`FrameRing`] input slot and written straight from its
//! output slot, then flushed: when the input turns out truncated or corrupt, every frame
//! before the bad one is still filtered and written before the error.
//!
//! Nothing in the stream decides how much is read or allocated unchecked: the header and
//! `FRAME` lines are read up to a bound, and the size the header declares is checked against
//! the budget before the ring's slots are allocated.
//!
//! The `y4m` crate is not used for this: its decoder reads frames into its own buffer (a copy
//! more per frame) and its encoder cannot write interlacing or pass parameters through.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufWriter, Read, Write};
use std::sync::{Mutex, mpsc};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage, PixelLayout, SampleType};
use hetmem::{Device, FrameRing, RingOptions, Strategy};
use indicatif::{ProgressBar, ProgressStyle};

use super::Job;
use super::interrupt::{catch_ctrl_c, interrupted};
use super::recovery::{self, Recovery, Retry};
use super::stats::{Clock, Facts, Report};

/// How a Y4M stream starts.
pub(super) const MAGIC: &[u8] = b"YUV4MPEG2";
/// How each frame starts.
const FRAME: &[u8] = b"FRAME";
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

/// Fills `buf` unless the stream ends first; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

fn progress(frames: Option<u64>) -> ProgressBar {
    match frames {
        Some(frames) => ProgressBar::new(frames).with_style(
            ProgressStyle::with_template("{wide_bar} {pos}/{len} frames, {per_sec}, {eta} left")
                .expect("a valid template"),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} frames, {per_sec}").expect("a valid template"),
        ),
    }
}

/// Filters the Y4M stream `reader` (of `file_bytes` when it is a regular file) into the
/// output `open_output` opens once the stream header has been read and checked.
pub(super) fn filter(
    job: &Job,
    mut reader: impl BufRead,
    file_bytes: Option<u64>,
    open_output: impl FnOnce() -> anyhow::Result<Box<dyn Write + Send>>,
) -> anyhow::Result<Report> {
    let (input, output) = (job.input.to_string(), job.output.to_string());
    let mut line = Vec::with_capacity(256);
    let ended =
        read_line(&mut reader, &mut line, HEADER_LIMIT).with_context(|| format!("cannot read {input}"))?;
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
    let header = parse_header(&line).with_context(|| input.clone())?;
    let (width, height) = (header.width, header.height);
    let format = FrameFormat::new(width, height, header.layout)
        .with_context(|| format!("cannot filter {input} ({width}x{height} {})", header.colour_space_name()))?
        .with_sample(header.sample);
    let kernel = job.kernel_for(header.sample).with_context(|| {
        format!("cannot filter {input} ({width}x{height} {})", header.colour_space_name())
    })?;
    // Frames declare no size of their own: the ring's slots, allocated once, after this check,
    // hold every frame.
    let options = RingOptions::default();
    job.budget.check(
        &input,
        "its Y4M header",
        width as u64,
        height as u64,
        memory(&format, options.slots),
    )?;
    let mut warnings = Vec::new();
    let mut recovery = Recovery::new(job.retries);
    let cpu = recovery::cpu();
    let (mut device, mut strategy) = (job.device, job.strategy);
    let mut ring = build_ring(job, (device, strategy), (format, &kernel), options, &header, &mut warnings)?;
    if let Some(mode @ ('t' | 'b' | 'm')) = header.interlacing {
        warnings.push(format!(
            "{input} is interlaced (I{mode}): each frame is blurred whole, which mixes its two fields"
        ));
    }
    // Assumes no per-frame parameters: only the progress bar depends on it.
    let frames = file_bytes.map(|bytes| {
        bytes.saturating_sub(line.len() as u64) / (format.frame_bytes() + FRAME.len() + 1) as u64
    });

    let mut out = BufWriter::with_capacity(1 << 16, open_output()?);
    out.write_all(&line)
        .and_then(|()| out.flush())
        .with_context(|| format!("writing the Y4M header to {output}"))?;

    let bar = progress(frames);
    let mut clock = Clock::start();
    catch_ctrl_c();
    let kept = Kept::new(recovery.keeps_frames());
    let mut replay = VecDeque::new();
    let mut first = 0;
    let pumped = loop {
        let stream = Stream { ring: &ring, kept: &kept, first, input: &input, output: &output };
        match stream.pump(&mut reader, replay, &mut out, &mut clock, &bar) {
            Err(error) if !interrupted() => {
                let Some(index) = recovery::failed_frame(&error) else { break Err(error) };
                let Some(retry) = recovery.after(device, strategy, index, &error) else { break Err(error) };
                if retry == Retry::Cpu {
                    (device, strategy) = (&cpu, Strategy::Cpu);
                }
                // Every frame read but not written, the failed one first, goes through a new ring.
                replay = kept.take();
                first = index;
                drop(ring);
                ring =
                    build_ring(job, (device, strategy), (format, &kernel), options, &header, &mut warnings)?;
            }
            ended => break ended,
        }
    };
    warnings.extend(recovery.warnings());
    bar.finish_and_clear();
    let end = match pumped {
        // Ctrl-C reaches the process reading our output too, which may close it first.
        Err(error) if interrupted() && crate::is_broken_pipe(&error) => End::OutputClosed,
        ended => ended?,
    };
    let frames = clock.frames();
    match &end {
        End::Input => {}
        End::Interrupted { cut } => {
            let mut notice = format!(
                "interrupted (Ctrl-C): stopped reading {input}; all {frames} whole frames read were filtered \
                 and written"
            );
            if let Some(Cut { index, read, frame_bytes }) = cut {
                notice.push_str(&format!(
                    "; the input then ended inside frame {index} (counting from 0), after {read} of its \
                     {frame_bytes} bytes: not a whole frame, so not written"
                ));
            }
            warnings.push(notice);
        }
        End::OutputClosed => warnings.push(format!(
            "interrupted (Ctrl-C): stopped reading {input}; {output} was closed by its reader after {frames} \
             frames were written"
        )),
    }

    let facts = Facts {
        input,
        output,
        kind: "video",
        format: format!("Y4M {}", header.colour_space_name()),
        width,
        height,
        layout: header.layout,
        sample: header.sample,
        strategy: ring.strategy(),
        warnings,
    };
    let mut report = Report::new(facts, &kernel, &clock);
    report.interrupted = !matches!(end, End::Input);
    report.retried = recovery.retried;
    Ok(report)
}

/// The ring for `format` and `kernel` on `device` by `strategy`. Memory that runs short even after the
/// ring's own retries makes an `auto` run fall back to the CPU strategy, with a warning (the
/// same result); a strategy the user chose fails with the error instead.
fn build_ring(
    job: &Job,
    (device, strategy): (&Device, Strategy),
    (format, kernel): (FrameFormat, &Gaussian),
    options: RingOptions,
    header: &Header,
    warnings: &mut Vec<String>,
) -> anyhow::Result<FrameRing<GaussianStage>> {
    let (width, height) = (header.width, header.height);
    let context = |strategy: Strategy| {
        format!(
            "cannot filter {} ({width}x{height} {}) by the {strategy} strategy",
            job.input,
            header.colour_space_name()
        )
    };
    let stage = GaussianStage::new(format, kernel)?.with_segments(crate::environment::segments()?).streamed();
    match FrameRing::with_stage(device, strategy, stage.clone(), options) {
        Ok(ring) => {
            if ring.slots() < options.slots {
                warnings.push(format!(
                    "memory ran short: the ring runs with {} of its {} slots (the same result, fewer frames in \
                     flight)",
                    ring.slots(),
                    options.slots
                ));
            }
            Ok(ring)
        }
        Err(error) if error.is_transient() && !job.strategy_chosen && strategy != Strategy::Cpu => {
            warnings.push(format!(
                "{}: {error}; filtering by the cpu strategy instead (the same result)",
                context(strategy)
            ));
            FrameRing::with_stage(device, Strategy::Cpu, stage, options)
                .with_context(|| context(Strategy::Cpu))
        }
        Err(error) => Err(error).with_context(|| context(strategy)),
    }
}

/// The frames read but not yet written, with their `FRAME` lines, kept while `--retries` may
/// need them again (nothing is kept without it).
struct Kept {
    frames: Option<Mutex<VecDeque<KeptFrame>>>,
}

/// A frame kept for a retry.
struct KeptFrame {
    index: u64,
    line: Vec<u8>,
    bytes: Vec<u8>,
}

impl Kept {
    fn new(keep: bool) -> Kept {
        Kept { frames: keep.then(|| Mutex::new(VecDeque::new())) }
    }

    fn lock(frames: &Mutex<VecDeque<KeptFrame>>) -> std::sync::MutexGuard<'_, VecDeque<KeptFrame>> {
        frames.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Keeps frame `index`, read now.
    fn read(&self, index: u64, line: &[u8], bytes: &[u8]) {
        if let Some(frames) = &self.frames {
            Kept::lock(frames).push_back(KeptFrame { index, line: line.to_vec(), bytes: bytes.to_vec() });
        }
    }

    /// Forgets frame `index`, written now (always the oldest kept).
    fn written(&self, index: u64) {
        if let Some(frames) = &self.frames {
            let forgotten = Kept::lock(frames).pop_front();
            debug_assert_eq!(forgotten.map(|frame| frame.index), Some(index), "frames are written in order");
        }
    }

    /// Every frame kept, oldest first, to go through a new ring.
    fn take(&self) -> VecDeque<KeptFrame> {
        self.frames.as_ref().map(|frames| std::mem::take(&mut *Kept::lock(frames))).unwrap_or_default()
    }
}

/// Memory a stream takes: each slot's input and output frames, and the CPU blur's intermediate
/// of the frame it works on (twice the frame: 16 bits per 8-bit sample, 32 per 16-bit one).
fn memory(format: &FrameFormat, slots: usize) -> u64 {
    let frame = format.frame_bytes() as u64;
    2 * frame * slots as u64 + 2 * frame
}

/// How the reading ended, when not by an error.
#[derive(Debug)]
enum End {
    /// The input ended after a whole frame, or the writer stopped (and says why).
    Input,
    /// Ctrl-C. When the input then ended inside a frame (its writer closed or died), `cut`
    /// says which and how far: that frame is not whole, so it is not written.
    Interrupted { cut: Option<Cut> },
    /// Ctrl-C, and the output's reader closed it before every frame read was written.
    OutputClosed,
}

/// A frame the input ended inside.
#[derive(Debug)]
struct Cut {
    index: u64,
    read: usize,
    frame_bytes: usize,
}

/// Closes a ring when dropped.
struct CloseOnDrop<'a>(&'a FrameRing<GaussianStage>);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// One pass of frames through one ring: its first frame's index, and where the frames not yet
/// written are kept.
struct Stream<'a> {
    ring: &'a FrameRing<GaussianStage>,
    kept: &'a Kept,
    first: u64,
    input: &'a str,
    output: &'a str,
}

impl Stream<'_> {
    /// Frames through the ring until the input ends (or Ctrl-C): this thread puts `replay`
    /// (frames read before, from a failed ring) into the ring first, then reads each frame
    /// straight into the ring's next input slot, while a writer thread writes the filtered
    /// frames out in order, so reading, filtering and writing overlap. Returns how the reading
    /// ended.
    ///
    /// Whatever stops the stream (the input's end or corruption, Ctrl-C, a failed frame, an
    /// output error), every frame filtered before it is written first.
    fn pump(
        &self,
        reader: &mut impl BufRead,
        replay: VecDeque<KeptFrame>,
        out: &mut (impl Write + Send),
        clock: &mut Clock,
        bar: &ProgressBar,
    ) -> anyhow::Result<End> {
        let (lines, line_of_frame) = mpsc::channel::<(Vec<u8>, Instant)>();
        let Stream { ring, kept, first, input, output } = *self;
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || -> anyhow::Result<()> {
                for index in first.. {
                    let frame = match ring.next_output() {
                        Ok(frame) => frame,
                        Err(hetmem::Error::RingClosed) => return Ok(()),
                        Err(error) => {
                            ring.close();
                            // A ring counts its frames from 0; the stream's count goes on.
                            let error = match error {
                                hetmem::Error::FrameFailed { index, source } => {
                                    hetmem::Error::FrameFailed { index: first + index, source }
                                }
                                other => other,
                            };
                            return Err(error).with_context(|| {
                                format!("filtering {input} by the {} strategy", ring.strategy())
                            });
                        }
                    };
                    let (line, submitted) =
                        line_of_frame.recv().expect("the reader sends each frame's line first");
                    let latency = submitted.elapsed();
                    let written =
                        out.write_all(&line).and_then(|()| out.write_all(&frame)).and_then(|()| out.flush());
                    drop(frame);
                    if let Err(error) = written {
                        ring.close();
                        return Err(error).with_context(|| format!("writing frame {index} to {output}"));
                    }
                    kept.written(index);
                    // Counted once written: the count is what the output holds.
                    clock.frame(latency);
                    bar.inc(1);
                }
                Ok(())
            });
            // Closed however the reading ends, a panic included: the writer then stops too.
            let _closing = CloseOnDrop(ring);
            let read = self.replay(replay, &lines).and_then(|next| self.read_frames(reader, next, &lines));
            ring.close();
            let written = writer.join().expect("the writer thread does not panic");
            // A failed frame or a closed output stopped the reading: that is the error to report.
            written?;
            read
        })
    }

    /// Puts frames read before into the ring, in order; returns the index of the next frame to
    /// read from the input, or `None` when the ring was closed meanwhile (a frame failed
    /// again): the frames not put in are kept as they were, for the next retry.
    fn replay(
        &self,
        replay: VecDeque<KeptFrame>,
        lines: &mpsc::Sender<(Vec<u8>, Instant)>,
    ) -> anyhow::Result<Option<u64>> {
        let mut next = self.first;
        let mut frames = replay.into_iter();
        while let Some(frame) = frames.next() {
            debug_assert_eq!(frame.index, next, "kept frames run on without gaps");
            // Kept before it goes in: until it is written, it may be needed again.
            self.kept.read(frame.index, &frame.line, &frame.bytes);
            let slot = match self.ring.next_input() {
                Ok(slot) => Some(slot),
                Err(hetmem::Error::RingClosed) => None,
                Err(error) => {
                    return Err(error).with_context(|| format!("filtering frame {next} of {}", self.input));
                }
            };
            let Some(mut slot) = slot.filter(|_| lines.send((frame.line.clone(), Instant::now())).is_ok())
            else {
                frames.for_each(|rest| self.kept.read(rest.index, &rest.line, &rest.bytes));
                return Ok(None);
            };
            slot.copy_from_slice(&frame.bytes);
            slot.submit();
            next += 1;
        }
        Ok(Some(next))
    }

    /// Reads frames into the ring, numbered from `next`, until the input ends, Ctrl-C, or the
    /// writer closes the ring. A slot is taken before each `FRAME` line is read, so a ring the
    /// writer closed (after a failed frame) never leaves a frame half read.
    ///
    /// After Ctrl-C an input that ends, even inside a frame, is the interruption reaching the
    /// process that writes it (in a terminal, SIGINT goes to the whole pipeline): not an error.
    fn read_frames(
        &self,
        reader: &mut impl BufRead,
        next: Option<u64>,
        lines: &mpsc::Sender<(Vec<u8>, Instant)>,
    ) -> anyhow::Result<End> {
        let Some(next) = next else { return Ok(End::Input) };
        let Stream { ring, kept, input, output, .. } = *self;
        let frame_bytes = ring.frame_bytes();
        let mut line = Vec::with_capacity(64);
        for index in next.. {
            if interrupted() {
                return Ok(End::Interrupted { cut: None });
            }
            let written = match index {
                0 => format!("no frame was written to {output}"),
                1 => format!("frame 0 was written to {output}"),
                _ => format!("frames 0 to {} were written to {output}", index - 1),
            };
            let mut slot = match ring.next_input() {
                Ok(slot) => slot,
                // The writer stopped (and says why).
                Err(hetmem::Error::RingClosed) => return Ok(End::Input),
                Err(error) => {
                    return Err(error).with_context(|| format!("filtering frame {index} of {input}"));
                }
            };
            let ended = read_line(reader, &mut line, FRAME_LINE_LIMIT)
                .with_context(|| format!("cannot read frame {index} (counting from 0) of {input}"))?;
            let is_frame_line =
                line.starts_with(FRAME) && matches!(line.get(FRAME.len()), Some(b' ' | b'\n'));
            let cut = Cut { index, read: 0, frame_bytes };
            match ended {
                Line::End if interrupted() => return Ok(End::Interrupted { cut: None }),
                Line::End => return Ok(End::Input),
                Line::Complete if is_frame_line => {}
                Line::Truncated if interrupted() => return Ok(End::Interrupted { cut: Some(cut) }),
                Line::Truncated if line.starts_with(&FRAME[..line.len().min(FRAME.len())]) => bail!(
                    "{input}: frame {index} (counting from 0) is truncated: the stream ends inside its FRAME \
                     line; {written}"
                ),
                Line::TooLong if line.starts_with(FRAME) => bail!(
                    "{input}: frame {index} (counting from 0) is corrupt: its FRAME line has no end in its first \
                     {FRAME_LINE_LIMIT} bytes (frame parameters take a few); {written}"
                ),
                _ => bail!(
                    "{input}: frame {index} (counting from 0) is corrupt: it starts with {} instead of FRAME; \
                     {written}",
                    shown(&line)
                ),
            }
            let read = read_full(reader, &mut slot)
                .with_context(|| format!("cannot read frame {index} (counting from 0) of {input}"))?;
            if read < frame_bytes {
                if interrupted() {
                    return Ok(End::Interrupted { cut: Some(Cut { read, ..cut }) });
                }
                bail!(
                    "{input}: frame {index} (counting from 0) is truncated: the stream ends after {read} of its \
                     {frame_bytes} bytes; {written}"
                );
            }
            kept.read(index, &line, &slot);
            if lines.send((line.clone(), Instant::now())).is_err() {
                // The writer has gone, after closing the ring; it reports why.
                return Ok(End::Input);
            }
            slot.submit();
        }
        Ok(End::Input)
    }
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
