//! [`GaussianOverlap`]: the blur of a frame in pinned host memory, with its upload, the kernel
//! and its download overlapped inside the frame.
//!
//! Copied whole, a frame crosses the link in, is blurred, and crosses back: three steps one
//! after the other. Here the frame is cut into segments of bytes. A copy engine uploads them
//! in order and raises a word in device memory after each (`cuStreamWriteValue32`); the
//! kernel, launched at once, blurs each chunk of rows as soon as the segments it reads have
//! arrived, and raises a word when it has written every byte of an output segment; a second
//! copy engine, waiting on those words (`cuStreamWaitValue32`), downloads each segment as soon
//! as it is done. Uploads, blurring and downloads then run at the same time, and a frame takes
//! little more than its upload.
//!
//! Frames of 8-bit and of 16-bit samples alike (`gaussian_u8_overlap`, `gaussian_u16_overlap`):
//! segments count bytes. Still one kernel launch per frame. The segment count follows the frame
//! size (about 1 MiB each, 1 to 16) unless the constructor is given one ([`Segments`]);
//! `Segments::Count(1)` gives the plain copy, blur, copy sequence for comparison.

use std::mem::ManuallyDrop;

use super::GaussianPlan;
use super::cpu::check;
use super::gpu::{Entry, check_aligned};
use crate::backend::Device;
use crate::backend::cuda::{Event, Stream};
use crate::error::{Error, Result};
use crate::handoff::{Lease, LeaseParts, LeaseState, Lent, Queue, Shared};
use crate::memory::{Buffer, DeviceBuf, WritableBuffer};

/// Bytes per segment the default count aims at: a copy long enough to run at the copy
/// engine's full rate, short enough that the first segment arrives early.
const SEGMENT_TARGET: usize = 1 << 20;
/// The most segments by default.
const MAX_DEFAULT_SEGMENTS: usize = 16;
/// The most segments [`Segments::Count`] may ask for.
pub const MAX_SEGMENTS: usize = 64;

/// How many segments [`GaussianOverlap`] cuts a frame into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Segments {
    /// About one per MiB of frame, 1 to 16: a copy long enough to run at the copy engine's
    /// full rate, short enough that the first segment arrives early. This is for one frame at
    /// a time (the filter); a ring, whose frames already overlap each other, takes 1
    /// ([`crate::ops::gaussian::GaussianStage::streamed`]).
    #[default]
    Auto,
    /// About this many, 1 to [`MAX_SEGMENTS`] (fewer when the frame is too small for that many
    /// 16-byte segments); 1 is the plain copy, blur, copy sequence.
    Count(usize),
}

/// The upload, blur and download of one frame format, overlapped; holds its two copy streams
/// and the words the copies and the kernel signal through.
pub struct GaussianOverlap {
    /// ready_in, ready_out and done, one word per segment each; lent to the queue for good.
    /// Dropped first (waiting for the last frame), or leaked (see `abandoned`).
    sync: ManuallyDrop<Lent<DeviceBuf<u32>>>,
    /// The overlap tiling's table; dropped or leaked with `sync`.
    table: ManuallyDrop<Shared<DeviceBuf<u32>>>,
    /// A failed frame's copy streams or kernel could not be waited for, and the leases' fences
    /// do not cover that frame: its work may still use `sync` and `table`, so they are leaked.
    abandoned: bool,
    upload: Stream,
    download: Stream,
    start: Event,
    uploaded: Event,
    downloaded: Event,
    plan: GaussianPlan,
    segments: usize,
    segment_bytes: usize,
    seq: u32,
}

impl std::fmt::Debug for GaussianOverlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GaussianOverlap")
            .field("format", self.plan.format())
            .field("segments", &self.segments)
            .field("segment_bytes", &self.segment_bytes)
            .finish_non_exhaustive()
    }
}

/// The segment size for `frame` bytes cut into about `segments` pieces: a multiple of 16 bytes
/// (so copies stay aligned), under 2 GiB (the kernel counts a segment's bytes in 32 bits).
fn segment_bytes(frame: usize, segments: usize) -> usize {
    frame.div_ceil(segments.max(1)).next_multiple_of(16).clamp(16, 1 << 31)
}

/// The segment count asked for a frame of `frame` bytes: the count given, or about one per
/// [`SEGMENT_TARGET`] bytes.
fn segment_count(frame: usize, segments: Segments) -> Result<usize> {
    match segments {
        Segments::Auto => Ok(frame.div_ceil(SEGMENT_TARGET).clamp(1, MAX_DEFAULT_SEGMENTS)),
        Segments::Count(count) if (1..=MAX_SEGMENTS).contains(&count) => Ok(count),
        Segments::Count(count) => {
            Err(Error::invalid("overlapped blur", format!("{count} segments; give 1 to {MAX_SEGMENTS}")))
        }
    }
}

impl GaussianOverlap {
    /// Streams, events, the table and signal words for blurring `plan`'s frames on `queue`
    /// (the overlap kernel tiles the frame its own way; `plan` gives the format and kernel),
    /// with the segment count chosen from the frame size ([`Segments::Auto`]).
    ///
    /// # Errors
    /// `queue` is not on a CUDA device of `device`, or the driver's error.
    pub fn new(device: &Device, queue: &Queue, plan: &GaussianPlan) -> Result<GaussianOverlap> {
        GaussianOverlap::with_segments(device, queue, plan, Segments::Auto)
    }

    /// Like [`GaussianOverlap::new`], with the frame cut into `segments`.
    ///
    /// # Errors
    /// A [`Segments::Count`] outside 1 to [`MAX_SEGMENTS`], `queue` not on a CUDA device of
    /// `device`, or the driver's error.
    pub fn with_segments(
        device: &Device,
        queue: &Queue,
        plan: &GaussianPlan,
        segments: Segments,
    ) -> Result<GaussianOverlap> {
        let segments = segment_count(plan.format().frame_bytes(), segments)?;
        let (Some(ordinal), Some(gpu)) = (device.gpu_ordinal(), queue.cuda_device()) else {
            return Err(Error::invalid("overlapped blur", "it needs a queue on a CUDA device"));
        };
        if ordinal != gpu.ordinal() {
            return Err(Error::invalid("overlapped blur", "the queue belongs to another device"));
        }
        let sms = gpu.attributes().multiprocessor_count;
        let plan = GaussianPlan::for_overlap(plan.format(), plan.kernel(), sms)?;
        let mut table = DeviceBuf::<u32>::new(device, plan.table().len())?;
        table.copy_from_slice(plan.table())?;
        let frame = plan.format().frame_bytes();
        let segment_bytes = segment_bytes(frame, segments);
        let segments = frame.div_ceil(segment_bytes);
        let mut sync = DeviceBuf::<u32>::new(device, 3 * segments)?;
        sync.copy_from_slice(&vec![0; 3 * segments])?;
        // Everything that can fail first: once in ManuallyDrop, the leases drop only with `self`.
        let (upload, download) = (Stream::new(gpu)?, Stream::new(gpu)?);
        let (start, uploaded, downloaded) =
            (Event::new(gpu, false)?, Event::new(gpu, false)?, Event::new(gpu, false)?);
        Ok(GaussianOverlap {
            sync: ManuallyDrop::new(queue.lend(sync)),
            table: ManuallyDrop::new(queue.share(table)),
            abandoned: false,
            upload,
            download,
            start,
            uploaded,
            downloaded,
            plan,
            segments,
            segment_bytes,
            seq: 0,
        })
    }

    /// Device memory this holds besides the frames: its table and signal words, in bytes.
    pub fn device_bytes(&self) -> usize {
        4 * (self.plan.table().len() + 3 * self.segments)
    }

    /// Segments per frame.
    pub fn segments(&self) -> usize {
        self.segments
    }

    /// Queues the upload of `host_input` into `device_input`, the blur into `device_output`
    /// and the download into `host_output`, overlapped, on `queue`. Every lease records the
    /// frame's completion.
    ///
    /// # Errors
    /// Buffers of the wrong size, leases of another queue, a 16-bit frame's device buffer at an
    /// odd address, or the driver's error. Work already queued when an error happens is still
    /// waited for by the leases.
    pub fn run<HI, DI, DO, HO>(
        &mut self,
        queue: &Queue,
        host_input: &HI,
        device_input: &mut Lent<DI>,
        device_output: &mut Lent<DO>,
        host_output: &mut Lent<HO>,
    ) -> Result<()>
    where
        HI: Lease,
        HI::Buf: Buffer<Elem = u8>,
        DI: WritableBuffer<Elem = u8>,
        DO: WritableBuffer<Elem = u8>,
        HO: WritableBuffer<Elem = u8>,
    {
        let plan = &self.plan;
        check(plan.format(), plan.kernel(), host_input.len(), host_output.len())?;
        check(plan.format(), plan.kernel(), device_input.len(), device_output.len())?;
        let dev_out = device_address(queue, device_output, "device output")?;
        let frame = Frame {
            host_in: queue.address_of(host_input)?,
            dev_in: device_address(queue, device_input, "device input")?,
            dst: dev_out,
            download: Some((queue.address_of(host_output)?, dev_out)),
        };
        let leases = [host_input.state(), device_input.state(), device_output.state(), host_output.state()];
        self.queue_frame(queue, frame, &leases)
    }

    /// Like [`GaussianOverlap::run`], but the kernel writes the result straight into
    /// `host_output`, pinned host memory mapped into the device (zero-copy), as it goes: no
    /// device output and no download, so the frame ends when its last rows are written.
    ///
    /// # Errors
    /// As for [`GaussianOverlap::run`]; also a `host_output` the device cannot address.
    pub fn run_mapped_output<HI, DI, HO>(
        &mut self,
        queue: &Queue,
        host_input: &HI,
        device_input: &mut Lent<DI>,
        host_output: &mut Lent<HO>,
    ) -> Result<()>
    where
        HI: Lease,
        HI::Buf: Buffer<Elem = u8>,
        DI: WritableBuffer<Elem = u8>,
        HO: WritableBuffer<Elem = u8>,
    {
        let plan = &self.plan;
        check(plan.format(), plan.kernel(), host_input.len(), host_output.len())?;
        check(plan.format(), plan.kernel(), device_input.len(), device_input.len())?;
        let frame = Frame {
            host_in: queue.address_of(host_input)?,
            dev_in: device_address(queue, device_input, "device input")?,
            dst: device_address(queue, host_output, "mapped host output (allocate it mapped)")?,
            download: None,
        };
        let leases = [host_input.state(), device_input.state(), host_output.state()];
        self.queue_frame(queue, frame, &leases)
    }

    /// Queues one frame: uploads with their signals on one stream, the kernel on the queue's
    /// stream, the downloads (if any) waiting on the kernel's signals on the other, all joined
    /// back into the queue's stream before the leases record the fence after it.
    fn queue_frame(&mut self, queue: &Queue, frame_at: Frame, leases: &[&LeaseState]) -> Result<()> {
        let plan = &self.plan;
        let frame = plan.format().frame_bytes();
        let device = queue.cuda_device().ok_or_else(|| Error::NeedsGpu {
            what: "the overlapped blur".into(),
            detail: "it was given a queue of the CPU backend".into(),
        })?;
        check_aligned(plan, "device input", frame_at.dev_in)?;
        check_aligned(plan, "output the kernel writes", frame_at.dst)?;
        let kernel = plan.entry_point(device, Entry::Overlap)?;
        let config = plan.launch_config();
        let table_at = device_address(queue, &*self.table, "table")?;
        let sync = device_address(queue, &*self.sync, "signal words")?;
        self.seq = self.seq.checked_add(1).unwrap_or(1);
        let (seq, segments, segment_bytes) = (self.seq, self.segments, self.segment_bytes);
        let ready_in = |s: usize| sync + 4 * s as u64;
        let ready_out = |s: usize| sync + 4 * (segments + s) as u64;
        let piece = |s: usize| {
            let offset = s * segment_bytes;
            (offset as u64, segment_bytes.min(frame - offset))
        };
        let Frame { host_in, dev_in, dst, download: downloads } = frame_at;
        let mut words: [u64; 12] = [
            dev_in,
            dst,
            table_at,
            plan.format().planes().len() as u64,
            u64::from(plan.kernel().radius()),
            u64::from(plan.kernel().border().code()),
            sync,
            segments as u64,
            segment_bytes as u64,
            frame as u64,
            u64::from(seq),
            u64::from(downloads.is_some()),
        ];
        let mut pointers: Vec<*mut std::ffi::c_void> =
            words.iter_mut().map(|word| (word as *mut u64).cast()).collect();
        let (upload, download) = (&self.upload, &self.download);
        let (start, uploaded, downloaded) = (&self.start, &self.uploaded, &self.downloaded);
        let mut failure = None;
        let mut all_leases = vec![self.table.state(), self.sync.state()];
        all_leases.extend_from_slice(leases);
        let joined = queue.submit_joined(&all_leases, |main| {
            start.record(main)?;
            upload.wait_event(start)?;
            download.wait_event(start)?;
            let queued = (|| -> Result<()> {
                for s in 0..segments {
                    let (offset, bytes) = piece(s);
                    // SAFETY: both ranges lie inside one-frame buffers (sizes checked by the
                    // callers) held by leases that record the fence `submit_joined` makes after
                    // this work, which waits for this stream (joined below); the device input
                    // is lent.
                    unsafe { upload.copy_async(dev_in + offset, host_in + offset, bytes) }?;
                    // SAFETY: ready_in(s) is inside the sync buffer, lent to this queue for
                    // the life of `self`.
                    unsafe { upload.write_value32(ready_in(s), seq) }?;
                }
                crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Launch)?;
                // SAFETY: gaussian_u8_overlap and gaussian_u16_overlap (src, dst, table,
                // plane_count, radius, border, sync, segments, segment_bytes, frame_bytes, seq,
                // download) match `words` in order and type (32-bit parameters read the low
                // half of their little-endian word). The table is the plan's and the buffers are one frame (checked), so
                // the kernel stays inside them and inside the 3 * segments words of `sync`;
                // every lease records the fence made after this work.
                unsafe { kernel.launch(main, config, &mut pointers) }?;
                if let Some((host_out, dev_out)) = downloads {
                    for s in 0..segments {
                        let (offset, bytes) = piece(s);
                        // SAFETY: the kernel launched above stores `seq` into every ready_out
                        // word once it has written that segment (it counts them when
                        // `download` is 1), so the wait ends.
                        unsafe { download.wait_value32(ready_out(s), seq) }?;
                        // SAFETY: as for the upload; the host output is lent.
                        unsafe { download.copy_async(host_out + offset, dev_out + offset, bytes) }?;
                    }
                }
                Ok(())
            })();
            failure = queued.err();
            // Join both copy streams back, so the fence recorded after this covers them too.
            uploaded.record(upload)?;
            main.wait_event(uploaded)?;
            downloaded.record(download)?;
            main.wait_event(downloaded)?;
            Ok::<(), Error>(())
        });
        if let Err(error) = joined {
            // The streams could not be joined, and no lease recorded a fence after this frame:
            // wait for them here instead, so no lease is given back while a copy or the kernel
            // may still use its buffer. Should a wait fail, the frame's work may still use the
            // signal words and the table, which are then leaked with `self`.
            for stream in [upload, download] {
                if let Err(sync_error) = stream.synchronize() {
                    tracing::error!("waiting for a copy stream after a failed frame: {sync_error}");
                    self.abandoned = true;
                }
            }
            if let Err(sync_error) = queue.synchronize() {
                tracing::error!("waiting for the queue after a failed frame: {sync_error}");
                self.abandoned = true;
            }
            return Err(error);
        }
        failure.map_or(Ok(()), Err)
    }
}

impl Drop for GaussianOverlap {
    fn drop(&mut self) {
        if self.abandoned {
            tracing::error!(
                "an overlapped blur's failed frame could not be waited for: leaking its signal words and table"
            );
            return;
        }
        // SAFETY: drop runs once, and neither field is used afterwards. Each lease waits for
        // its fence, which every joined frame recorded after its copy streams' work.
        unsafe {
            ManuallyDrop::drop(&mut self.sync);
            ManuallyDrop::drop(&mut self.table);
        }
    }
}

/// The addresses of one frame's buffers.
struct Frame {
    host_in: u64,
    dev_in: u64,
    /// Where the kernel writes: the device output, or mapped host output.
    dst: u64,
    /// (host output, device output) when the result is downloaded by a copy engine.
    download: Option<(u64, u64)>,
}

/// The device address of `lease`'s buffer, which the kernel dereferences.
fn device_address<L: Lease>(queue: &Queue, lease: &L, what: &str) -> Result<u64> {
    let address = queue.address_of(lease)?;
    if lease.region().device.is_none() || address == 0 {
        return Err(Error::invalid("overlapped blur", format!("the {what} has no device address")));
    }
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_aligned_and_cover_the_frame() {
        for (frame, count) in [(6_220_800, 6), (63, 4), (20, 4), (1, 1), (5 << 20, 64)] {
            let bytes = segment_bytes(frame, count);
            assert_eq!(bytes % 16, 0, "{frame} bytes in {count}");
            let segments = frame.div_ceil(bytes);
            assert!(segments <= count && segments >= 1, "{frame} bytes in {count}: {segments}");
            assert!((segments - 1) * bytes < frame && segments * bytes >= frame);
        }
    }

    #[test]
    fn a_1080p_rgb_frame_makes_about_one_mebibyte_segments() {
        assert_eq!(segment_count(1920 * 1080 * 3, Segments::Auto).unwrap(), 6);
        assert_eq!(segment_count(100, Segments::Auto).unwrap(), 1);
        assert_eq!(segment_count(1 << 30, Segments::Auto).unwrap(), MAX_DEFAULT_SEGMENTS);
        assert_eq!(Segments::default(), Segments::Auto);
    }

    #[test]
    fn a_count_given_is_used_within_its_range() {
        let frame = 1920 * 1080 * 3;
        assert_eq!(segment_count(frame, Segments::Count(1)).unwrap(), 1);
        assert_eq!(segment_count(frame, Segments::Count(MAX_SEGMENTS)).unwrap(), MAX_SEGMENTS);
        for count in [0, MAX_SEGMENTS + 1] {
            let error = segment_count(frame, Segments::Count(count)).unwrap_err().to_string();
            assert!(error.contains(&format!("{count} segments; give 1 to {MAX_SEGMENTS}")), "{error}");
        }
    }
}
