//! `hetmem filter` on a video: streamed through a [`FrameRing`], whatever holds the frames: Y4M
//! ([`hetmem_media::y4m`]) or raw frames ([`hetmem_media::raw`]). Each reader says what comes
//! before the frames and around each one ([`Container`]) and how a frame's samples lie in the
//! stream ([`Packing`](hetmem_media::Packing)); everything else is here, once.
//!
//! Each frame is read straight into the ring's next input slot while earlier frames are
//! filtered and written, in order, by a writer thread, and flushed (a regular file's frames by
//! several threads at once, by position: [`FrameSource`](hetmem_media::FrameSource),
//! [`FrameSink`]): when the input turns out truncated or corrupt, every frame before the bad
//! one is still filtered and written before the error. The size of a frame is checked against the budget before the ring's slots are
//! allocated. Ctrl-C stops the reading; every whole frame read is still filtered and written.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Mutex, mpsc};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{FrameFormat, Gaussian, GaussianStage};
use hetmem::{Device, FrameRing, RingOptions, Strategy};
use hetmem_media::frames::{frames_in, read_start};
use hetmem_media::{Container, FrameRead, FrameSink, Start, Video};
use indicatif::ProgressBar;

use super::Job;
use super::interrupt::{catch_ctrl_c, interrupted};
use super::recovery::{self, Recovery, Retry};
use super::stats::{Clock, Facts, OPENING_THE_DEVICE, RELEASING, Report};

/// Filters `video`, whose frames `reader` holds next (`file_bytes` in all when it is a
/// regular file), into the output `open_output` opens.
pub(super) fn filter(
    job: &Job,
    video: Video,
    mut reader: impl FrameRead,
    file_bytes: Option<u64>,
    open_output: impl FnOnce() -> anyhow::Result<FrameSink>,
) -> anyhow::Result<Report> {
    let (input, output) = (job.input.to_string(), job.output.to_string());
    let Video { format, container, pixels, mut warnings } = video;
    let (width, height) = (format.width(), format.height());
    let what = || format!("cannot filter {input} ({width}x{height} {pixels})");
    let kernel = job.kernel_for(format.sample()).with_context(what)?;
    let packing = container.packing();
    // Frames declare no size of their own: the ring's slots, allocated once, after this check,
    // hold every frame.
    let options = RingOptions::default();
    let declared_by = match container {
        Container::Y4m { .. } => "its Y4M header",
        Container::Raw { .. } => "--raw",
    };
    job.budget.check(
        &input,
        declared_by,
        width as u64,
        height as u64,
        memory(&format, options.slots) + 2 * packing.scratch_bytes(&format) as u64,
    )?;
    let mut clock = Clock::new(job.started);
    clock.setup(OPENING_THE_DEVICE, job.opening_the_device);
    let mut recovery = Recovery::new(job.retries);
    let cpu = recovery::cpu();
    let (mut device, mut strategy) = (job.device, job.strategy);
    let ring_for =
        |(device, strategy): (&Device, Strategy), warnings: &mut Vec<String>, clock: &mut Clock| {
            clock.build(
                || build_ring(job, (device, strategy), (format, &kernel), options, &pixels, warnings),
                FrameRing::setup_time,
            )
        };
    let mut ring = ring_for((device, strategy), &mut warnings, &mut clock)?;
    let frames = file_bytes.map(|bytes| frames_in(&container, bytes, format.frame_bytes()));

    // Replacing an existing file truncates it here, which frees its pages.
    let mut out = clock.time("opening the output", open_output)?;
    out.write_all(container.header())
        .and_then(|()| out.flush())
        .with_context(|| format!("writing the {} header to {output}", container.name()))?;

    let bar = job.ui.frames(frames);
    clock.start_streaming();
    catch_ctrl_c();
    let kept = Kept::new(recovery.keeps_frames());
    let mut replay = VecDeque::new();
    let mut first = 0;
    let pumped = loop {
        let stream =
            Stream { ring: &ring, kept: &kept, first, input: &input, output: &output, container: &container };
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
                clock.stop_streaming();
                clock.time(RELEASING, || drop(ring));
                ring = ring_for((device, strategy), &mut warnings, &mut clock)?;
                clock.start_streaming();
            }
            ended => break ended,
        }
    };
    clock.stop_streaming();
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

    // A file that replaced an existing one is written back to the disk as it is closed (ext4's
    // auto_da_alloc): seconds for a large output, which a stopwatch sees.
    clock.time("closing the output", || drop(out));
    let facts = Facts {
        input,
        output,
        kind: "video",
        format: format!("{} {pixels}", container.name()),
        width,
        height,
        layout: format.layout(),
        sample: format.sample(),
        strategy: ring.strategy(),
        warnings,
    };
    clock.time(RELEASING, || drop(ring));
    let mut report = Report::new(facts, &kernel, clock);
    report.interrupted = !matches!(end, End::Input);
    report.retried = recovery.retried;
    Ok(report)
}

/// The ring for `format` and `kernel` on `device` by `strategy`. Memory that runs short even
/// after the ring's own retries makes an `auto` run fall back to the CPU strategy, with a
/// warning (the same result); a strategy the user chose fails with the error instead.
fn build_ring(
    job: &Job,
    (device, strategy): (&Device, Strategy),
    (format, kernel): (FrameFormat, &Gaussian),
    options: RingOptions,
    pixels: &str,
    warnings: &mut Vec<String>,
) -> anyhow::Result<FrameRing<GaussianStage>> {
    let (width, height) = (format.width(), format.height());
    let context = |strategy: Strategy| {
        format!("cannot filter {} ({width}x{height} {pixels}) by the {strategy} strategy", job.input)
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

/// The frames read but not yet written, with what came before each (its `FRAME` line), kept
/// while `--retries` may need them again (nothing is kept without it).
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
    container: &'a Container,
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
        reader: &mut impl FrameRead,
        replay: VecDeque<KeptFrame>,
        out: &mut FrameSink,
        clock: &mut Clock,
        bar: &ProgressBar,
    ) -> anyhow::Result<End> {
        let (lines, line_of_frame) = mpsc::channel::<(Vec<u8>, Instant)>();
        let Stream { ring, kept, first, input, output, container } = *self;
        let packing = container.packing();
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || -> anyhow::Result<()> {
                let mut scratch = Vec::new();
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
                    let written = out
                        .write_all(&line)
                        .and_then(|()| packing.write(&mut *out, &frame, &mut scratch))
                        .and_then(|()| out.flush());
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
    /// writer closes the ring. A slot is taken before what comes before each frame is read,
    /// so a ring the writer closed (after a failed frame) never leaves a frame half read.
    ///
    /// After Ctrl-C an input that ends, even inside a frame, is the interruption reaching the
    /// process that writes it (in a terminal, SIGINT goes to the whole pipeline): not an error.
    fn read_frames(
        &self,
        reader: &mut impl FrameRead,
        next: Option<u64>,
        lines: &mpsc::Sender<(Vec<u8>, Instant)>,
    ) -> anyhow::Result<End> {
        let Some(next) = next else { return Ok(End::Input) };
        let Stream { ring, kept, input, output, container, .. } = *self;
        let frame_bytes = ring.frame_bytes();
        let packing = container.packing();
        let mut line = Vec::with_capacity(64);
        let mut scratch = Vec::new();
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
            let cut = Cut { index, read: 0, frame_bytes };
            match read_start(container, reader, &mut line, index, input, &written)? {
                Start::Frame => {}
                Start::End if interrupted() => return Ok(End::Interrupted { cut: None }),
                Start::End => return Ok(End::Input),
                Start::Cut(_) if interrupted() => return Ok(End::Interrupted { cut: Some(cut) }),
                Start::Cut(error) => return Err(error),
            }
            let read = packing
                .read(reader, &mut slot, &mut scratch)
                .with_context(|| format!("cannot read frame {index} (counting from 0) of {input}"))?;
            if read < frame_bytes {
                if interrupted() {
                    return Ok(End::Interrupted { cut: Some(Cut { read, ..cut }) });
                }
                let hint = match container {
                    Container::Y4m { .. } => String::new(),
                    Container::Raw { .. } => {
                        " (raw video is whole frames of the size and pixel format --raw gives: check it)"
                            .into()
                    }
                };
                bail!(
                    "{input}: frame {index} (counting from 0) is truncated: the stream ends after {read} of its \
                     {frame_bytes} bytes{hint}; {written}"
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
