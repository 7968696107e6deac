//! The GPU path of the Gaussian blur: tiling, the table the kernel reads, and the launch.

use std::sync::Arc;

use super::cpu::{check, gaussian_cpu};
use super::{FrameFormat, Gaussian, MAX_SIDE, SampleType};
use crate::backend::cuda::{CudaDevice, Kernel, LaunchConfig};
use crate::error::{Error, Result};
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue, Shared};
use crate::kernels::{self, GAUSSIAN};
use crate::memory::{Buffer, DeviceBuf, HostBuf, PinOptions, WritableBuffer};
use crate::placement::Where;

/// Rows per chunk in the kernel (`CHUNK` in gaussian.cu).
const CHUNK: usize = 16;
/// Rows per chunk in the resident kernel (`RESIDENT_CHUNK` in gaussian.cu).
const RESIDENT_CHUNK: usize = 8;
/// Words per plane descriptor in the table (`PLANE_WORDS` in gaussian.cu).
const PLANE_WORDS: usize = 10;
/// Threads per block (`THREADS` in gaussian.cu).
const THREADS: u32 = 1024;
/// Shared memory a block may use without opting in, static and dynamic together.
const DEFAULT_SHARED: usize = 48 << 10;
/// A bound on gaussian.cu's static shared arrays (2.2 KiB today).
const STATIC_SHARED: usize = 4 << 10;
/// Rows per range in the overlap kernel's tiling: two chunks.
const OVERLAP_RANGE_ROWS: usize = 2 * CHUNK;

/// Dynamic shared memory of one block (the sections of gaussian.cu) with chunks of `chunk`
/// rows: the input rows of a chunk with their halo, the ring of horizontal results (a u16 per
/// 8-bit sample in whole quads, a u32 per 16-bit sample in whole pairs), the staged output rows.
fn shared_for(band_px: usize, channels: usize, radius: usize, sample: SampleType, chunk: usize) -> usize {
    let ring = chunk + 2 * radius;
    let pixel = channels * sample.bytes();
    let in_stride = (15 + (band_px + 2 * radius) * pixel + 16).div_ceil(16) * 16;
    let (mid_stride, mid_word) = match sample {
        SampleType::U8 => ((band_px * channels).div_ceil(4) * 4, 2),
        SampleType::U16 => ((band_px * channels).div_ceil(2) * 2, 4),
    };
    let out_stride = (15 + band_px * pixel + 16).div_ceil(16) * 16;
    ring * in_stride + (ring * mid_stride * mid_word).div_ceil(16) * 16 + chunk * out_stride
}

/// Pixels per band: 256 bytes of a row for one-channel planes, 384 or 512 for RGB and RGBA
/// (a 16-bit band is half as many pixels as an 8-bit one, so its shared memory still fits).
fn band_px(channels: usize, sample: SampleType) -> usize {
    let px = if channels == 1 { 256 } else { 128 };
    px / sample.bytes()
}

/// Shared memory a block of the mapped tiling may use, static included: the least any GPU the
/// shipped PTX runs on (compute 7.0 on) lets a block opt into: Turing's 64 KiB (Volta 96 KiB,
/// consumer Ampere and Ada 99 KiB, the H100 and H200 227 KiB).
const MAPPED_SHARED: usize = 64 << 10;

/// Pixels per band when the input is mapped host memory: twice [`band_px`] where a block's
/// shared memory stays within [`MAPPED_SHARED`], else `band_px`. That is RGB planes (8- or
/// 16-bit) up to radius 2 and one-channel planes (gray, the planes of YUV) up to radius 8;
/// RGBA keeps its band. Halo columns are re-read across the link by both neighbouring tiles,
/// and a wider band re-reads fewer: on the H200 machine a 4K RGB 8-bit frame blurred from and
/// into mapped memory took 722 us with 256-pixel bands against 779 with 128
/// (`scripts/probes/blur_mapped_shape.cu`; the other formats were not measured).
fn mapped_band_px(channels: usize, radius: usize, sample: SampleType, chunk: usize) -> usize {
    let wide = 2 * band_px(channels, sample);
    if shared_for(wide, channels, radius, sample, chunk) + STATIC_SHARED <= MAPPED_SHARED {
        wide
    } else {
        band_px(channels, sample)
    }
}

/// How a plan cuts planes into tiles; the kernel and its result are the same for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tiling {
    /// About one tile per SM, one block per tile.
    Plain,
    /// For input and output in mapped host memory: bands of [`mapped_band_px`] and about one
    /// tile per two SMs, one block per tile. The link, not the SMs, bounds such a frame, and
    /// fewer, longer tiles re-read fewer halo rows and columns: on the H200 machine a 1080p RGB
    /// frame took 202.8 us this way against 213.5 with the plain tiling (which suits device
    /// memory, where the kernel wants every SM).
    Mapped,
    /// Ranges of [`OVERLAP_RANGE_ROWS`] rows taken in order by one block per SM.
    Overlap,
    /// For the resident kernel (mapped input and output, every block running at once): bands
    /// of [`mapped_band_px`], chunks of [`RESIDENT_CHUNK`] rows, and about this many tiles,
    /// one block per tile up to one per SM. On the H200 machine a 1080p RGB frame took 196.6
    /// us this way with 48 tiles, against 207.6 by the mapped tiling (64 tiles, 16-row
    /// chunks) in the same run (`scripts/probes/blur_mapped_shape.cu`).
    Resident(u32),
}

impl Entry {
    /// Rows per chunk of the entry point (shared memory is sized by it).
    fn chunk(self) -> usize {
        match self {
            Entry::Resident => RESIDENT_CHUNK,
            Entry::Plain | Entry::Overlap => CHUNK,
        }
    }
}

impl Tiling {
    /// Rows per chunk of the kernel this tiling is for.
    fn chunk(self) -> usize {
        match self {
            Tiling::Resident(_) => RESIDENT_CHUNK,
            Tiling::Plain | Tiling::Mapped | Tiling::Overlap => CHUNK,
        }
    }
}

/// The entry points of gaussian.cu: one launch per frame, the overlap kernel's, or the
/// resident kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    Plain,
    Overlap,
    Resident,
}

/// `value` as the u32 word of the plan's table that `what` is, or an error: a frame whose
/// tiling the kernel cannot describe.
fn table_word(what: &str, value: usize) -> Result<u32> {
    u32::try_from(value).map_err(|_| table_range(what, value))
}

fn table_range(what: &str, value: impl std::fmt::Display) -> Error {
    Error::invalid(
        "gaussian plan",
        format!(
            "{what} {value} does not fit the kernel's 32-bit table: give a frame of at most {MAX_SIDE} x \
             {MAX_SIDE} pixels (FrameFormat::new)"
        ),
    )
}

/// How one frame format is cut into tiles for the kernel, and what that costs on the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaussianPlan {
    format: FrameFormat,
    kernel: Gaussian,
    table: Arc<[u32]>,
    tiles: u32,
    blocks: u32,
    /// Rows per chunk of the kernel the plan is for.
    chunk: usize,
    shared_bytes: usize,
    bytes_read: u64,
    table_bytes_read: u64,
}

impl GaussianPlan {
    /// Tiles `format` for a GPU with `multiprocessors` SMs.
    ///
    /// Each plane is cut into bands of 128 pixels (256 for one-channel planes; half as many for
    /// 16-bit samples) and ranges of rows
    /// so that the frame makes at most about one tile per SM: enough bytes in flight to keep the link
    /// busy, with few re-read halo rows.
    ///
    /// # Errors
    /// None for a valid [`FrameFormat`]: any radius fits any frame, since the borders fold.
    pub fn new(format: &FrameFormat, kernel: &Gaussian, multiprocessors: u32) -> Result<GaussianPlan> {
        GaussianPlan::tiled(format, kernel, multiprocessors, Tiling::Plain)
    }

    /// Tiles `format` for a kernel reading and writing mapped host memory (the zero-copy and
    /// hybrid strategies): bands twice as wide where shared memory allows, and about one tile
    /// per two SMs, so fewer halo bytes cross the link twice. The result is the same as
    /// [`GaussianPlan::new`]'s.
    ///
    /// # Errors
    /// As [`GaussianPlan::new`].
    pub fn for_mapped(format: &FrameFormat, kernel: &Gaussian, multiprocessors: u32) -> Result<GaussianPlan> {
        GaussianPlan::tiled(format, kernel, multiprocessors, Tiling::Mapped)
    }

    /// Tiles `format` for the overlap kernel ([`super::GaussianOverlap`]): ranges of
    /// [`OVERLAP_RANGE_ROWS`] rows, taken in order by one block per SM, so that each part of
    /// the frame is blurred by the whole GPU as soon as it arrives. Re-reading the halo rows
    /// of many ranges costs nothing on the link here: the input is in device memory.
    pub(super) fn for_overlap(
        format: &FrameFormat,
        kernel: &Gaussian,
        multiprocessors: u32,
    ) -> Result<GaussianPlan> {
        GaussianPlan::tiled(format, kernel, multiprocessors, Tiling::Overlap)
    }

    /// Tiles `format` for the resident kernel ([`super::ResidentGaussian`]): as
    /// [`GaussianPlan::for_mapped`]'s bands, with chunks of 8 rows and about `tiles` tiles
    /// (`None`: three per eight SMs, 48 on a 132-SM H200 at 1080p; at least a range of rows
    /// across every band), one block per tile but at most one per two SMs, since every block
    /// stays resident. The blurred frame is the same as [`GaussianPlan::new`]'s; the plan is
    /// for the resident kernel only (the others refuse it: their chunks are longer).
    ///
    /// # Errors
    /// As [`GaussianPlan::new`].
    pub(super) fn for_resident(
        format: &FrameFormat,
        kernel: &Gaussian,
        multiprocessors: u32,
        tiles: Option<u32>,
    ) -> Result<GaussianPlan> {
        let tiles = tiles.unwrap_or(multiprocessors.saturating_mul(3) / 8).max(1);
        GaussianPlan::tiled(format, kernel, multiprocessors, Tiling::Resident(tiles))
    }

    fn tiled(
        format: &FrameFormat,
        kernel: &Gaussian,
        multiprocessors: u32,
        tiling: Tiling,
    ) -> Result<GaussianPlan> {
        let frame = format.frame_bytes();
        check(format, kernel, frame, frame)?;
        // A GPU has at least one SM; the overlap tiling launches one block per SM.
        let multiprocessors = multiprocessors.max(1);
        let r = kernel.radius() as usize;
        let mut table: Vec<u32> = kernel.weights_for(format.sample()).to_vec();
        let (mut tiles, mut shared_bytes, mut bytes_read) = (0usize, 0usize, 0u64);
        let planes = format.planes();
        for plane in &planes {
            let band_px = match tiling {
                Tiling::Mapped | Tiling::Resident(_) => {
                    mapped_band_px(plane.channels, r, plane.sample, tiling.chunk())
                }
                Tiling::Plain | Tiling::Overlap => band_px(plane.channels, plane.sample),
            };
            let bands = plane.width.div_ceil(band_px);
            // At most one tile per SM (one block fits an SM, and a second wave of a few tiles
            // would run alone at the end), or per two SMs for mapped memory; ranges of at
            // least 64 rows so the re-read halo rows stay few.
            let tile_sms = match tiling {
                Tiling::Mapped => (multiprocessors as usize / 2).max(1),
                Tiling::Resident(tiles) => tiles as usize,
                Tiling::Plain | Tiling::Overlap => multiprocessors as usize,
            };
            // Saturating: a share past every plane's rows is clamped to them below anyway.
            let share = (tile_sms.saturating_mul(plane.bytes()) / frame).max(1);
            let ranges = (share / bands).clamp(1, plane.height.div_ceil(64).max(1));
            let range_rows = match tiling {
                Tiling::Overlap => OVERLAP_RANGE_ROWS,
                Tiling::Plain | Tiling::Mapped | Tiling::Resident(_) => plane.height.div_ceil(ranges),
            }
            .min(plane.height);
            let ranges = plane.height.div_ceil(range_rows);
            // The kernel reads every count of the table as a u32 (the offset as two): each is
            // re-checked here, so a table never describes a plane other than the format's.
            let offset =
                u64::try_from(plane.offset).map_err(|_| table_range("plane offset", plane.offset))?;
            table.extend_from_slice(&[
                offset as u32,
                (offset >> 32) as u32,
                table_word("plane width", plane.width)?,
                table_word("plane height", plane.height)?,
                table_word("channels", plane.channels)?,
                table_word("band width", band_px)?,
                table_word("bands", bands)?,
                table_word("ranges", ranges)?,
                table_word("rows per range", range_rows)?,
                table_word("first tile", tiles)?,
            ]);
            let plane_tiles = bands
                .checked_mul(ranges)
                .ok_or_else(|| table_range("tiles of a plane", format!("{bands} x {ranges}")))?;
            tiles = tiles
                .checked_add(plane_tiles)
                .ok_or_else(|| table_range("tiles", format!("{tiles} + {plane_tiles}")))?;
            shared_bytes =
                shared_bytes.max(shared_for(band_px, plane.channels, r, plane.sample, tiling.chunk()));
            // Every tile reads its rows plus 2r halo rows, each its columns plus 2r halo columns.
            for band in 0..bands {
                let band_width = band_px.min(plane.width - band * band_px);
                let row_bytes = (band_width + 2 * r) * plane.pixel_bytes();
                let rows: usize =
                    (0..ranges).map(|range| range_rows.min(plane.height - range * range_rows) + 2 * r).sum();
                bytes_read += (rows * row_bytes) as u64;
            }
        }
        // Each block also reads the weights and the plane descriptors.
        let table_bytes_read = (tiles * (kernel.weights().len() + PLANE_WORDS + planes.len()) * 4) as u64;
        bytes_read += table_bytes_read;
        let table_words = kernel.weights().len() + planes.len() * PLANE_WORDS;
        debug_assert_eq!(table.len(), table_words);
        let tiles = table_word("tiles", tiles)?;
        Ok(GaussianPlan {
            format: *format,
            kernel: kernel.clone(),
            table: table.into(),
            tiles,
            blocks: match tiling {
                Tiling::Overlap => tiles.min(multiprocessors),
                // Every block stays on its SM for as long as the kernel runs: half the SMs at
                // most, so that other kernels (another queue's, a doorbell) still find room.
                Tiling::Resident(_) => tiles.min((multiprocessors / 2).max(1)),
                Tiling::Plain | Tiling::Mapped => tiles,
            },
            chunk: tiling.chunk(),
            shared_bytes,
            bytes_read,
            table_bytes_read,
        })
    }

    /// The words the kernel's table buffer must hold: weights, then plane descriptors.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// The frame format.
    pub fn format(&self) -> &FrameFormat {
        &self.format
    }

    /// The kernel.
    pub fn kernel(&self) -> &Gaussian {
        &self.kernel
    }

    /// Bytes the kernel reads per frame: the input with its re-read halos, and the table.
    /// When the input is mapped host memory, this is what crosses the link inbound.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The part of [`GaussianPlan::bytes_read`] that is the table (each block reads it once).
    pub fn bytes_read_of_table(&self) -> u64 {
        self.table_bytes_read
    }

    /// Tiles the frame is cut into.
    pub fn tiles(&self) -> u32 {
        self.tiles
    }

    /// Blocks the kernel is launched with (one per tile, or fewer for the overlap and resident
    /// kernels, at most one per SM).
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// The `entry` point of gaussian.cu for the plan's samples, loaded, with the plan's shared
    /// memory allowed.
    pub(super) fn entry_point(&self, device: &CudaDevice, entry: Entry) -> Result<Kernel> {
        self.check_entry(entry)?;
        let entry = match (self.format.sample(), entry) {
            (SampleType::U8, Entry::Plain) => "gaussian_u8",
            (SampleType::U8, Entry::Overlap) => "gaussian_u8_overlap",
            (SampleType::U8, Entry::Resident) => "gaussian_u8_resident",
            (SampleType::U16, Entry::Plain) => "gaussian_u16",
            (SampleType::U16, Entry::Overlap) => "gaussian_u16_overlap",
            (SampleType::U16, Entry::Resident) => "gaussian_u16_resident",
        };
        let kernel = kernels::kernel(device, &GAUSSIAN, entry)?;
        if self.shared_bytes + STATIC_SHARED > DEFAULT_SHARED {
            kernel.allow_dynamic_shared(self.shared_bytes as u32)?;
        }
        Ok(kernel)
    }

    /// Refuses a plan made for a kernel of other chunks than `entry`'s: its shared memory is
    /// sized for those chunks (a resident plan's, for 8 rows, is too small for the others' 16).
    pub(super) fn check_entry(&self, entry: Entry) -> Result<()> {
        if self.chunk == entry.chunk() {
            return Ok(());
        }
        Err(Error::invalid(
            "gaussian plan",
            format!(
                "it was made for a kernel of {}-row chunks (the resident blur's plan), not this one's {}: \
                 make the plan with GaussianPlan::new or GaussianPlan::for_mapped",
                self.chunk,
                entry.chunk()
            ),
        ))
    }

    /// One block per tile, or per SM for the overlap kernel's tiling.
    pub(super) fn launch_config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: (self.blocks, 1, 1),
            block: (THREADS, 1, 1),
            shared_bytes: self.shared_bytes as u32,
        }
    }
}

/// The memory of an uploaded table, shared read-only with one queue's work for its lifetime.
enum TableMemory {
    Host(Shared<HostBuf<u32>>),
    Device(Shared<DeviceBuf<u32>>),
    /// A CPU-backend queue: the CPU path reads the plan, not a table.
    Cpu,
}

/// A [`GaussianPlan`]'s table, written by the plan and uploaded for one [`Queue`].
///
/// The kernel takes every tile's offset and size from this table, so a table that said
/// otherwise than its plan would make the GPU read and write outside the frame. Only
/// [`GaussianPlan::upload_table`] makes one, from the plan's own words; nothing can write it
/// afterwards (it is held in a [`Shared`] lease, read-only for the CPU and the GPU, and never
/// given back), and [`gaussian`] refuses a table made by another plan.
pub struct GaussianTable {
    memory: TableMemory,
    words: Arc<[u32]>,
}

impl std::fmt::Debug for GaussianTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let placement = match self.memory {
            TableMemory::Host(_) => "host",
            TableMemory::Device(_) => "device",
            TableMemory::Cpu => "cpu",
        };
        f.debug_struct("GaussianTable")
            .field("placement", &placement)
            .field("words", &self.words.len())
            .finish()
    }
}

impl GaussianTable {
    /// Bytes of pinned host memory the table takes.
    pub fn host_bytes(&self) -> usize {
        if matches!(self.memory, TableMemory::Host(_)) { 4 * self.words.len() } else { 0 }
    }

    /// Bytes of device memory the table takes.
    pub fn device_bytes(&self) -> usize {
        if matches!(self.memory, TableMemory::Device(_)) { 4 * self.words.len() } else { 0 }
    }
}

impl GaussianPlan {
    /// Uploads the plan's table for kernels on `queue`, into mapped host memory
    /// ([`Where::Mapped`]: every tile reads it across the link) or device memory
    /// ([`Where::Device`]: read once across the link, when uploaded). On a CPU-backend queue
    /// nothing is allocated: the CPU path reads the plan.
    ///
    /// # Errors
    /// The allocation or the upload failing.
    pub fn upload_table(&self, queue: &Queue, place: Where) -> Result<GaussianTable> {
        let words = Arc::clone(&self.table);
        if queue.cuda_device().is_none() {
            return Ok(GaussianTable { memory: TableMemory::Cpu, words });
        }
        let device = queue.device();
        let memory = match place {
            Where::Mapped => {
                let mut table = HostBuf::<u32>::pinned(&device, words.len(), PinOptions::default())?;
                table.as_mut_slice().copy_from_slice(&words);
                TableMemory::Host(queue.share(table))
            }
            Where::Device => {
                let mut table = DeviceBuf::<u32>::new(&device, words.len())?;
                table.copy_from_slice(&words)?;
                TableMemory::Device(queue.share(table))
            }
        };
        Ok(GaussianTable { memory, words })
    }
}

/// Queues the blur of one frame from `input` to `output` on `queue`, with `table` uploaded
/// by `plan` for `queue`: one kernel launch on the GPU (`gaussian_u8` or `gaussian_u16`, by
/// the plan's sample type), the CPU path on the CPU backend. Buffers are bytes whatever the
/// samples: a 16-bit frame is twice as many, little-endian.
///
/// # Errors
/// Buffers of the wrong size, a table uploaded by another plan or for another queue, memory
/// the device cannot address, a 16-bit frame's buffer at an odd address, or a failed launch.
pub fn gaussian<I, O>(
    queue: &Queue,
    plan: &GaussianPlan,
    table: &GaussianTable,
    input: &I,
    output: &mut Lent<O>,
) -> Result<()>
where
    I: Lease,
    I::Buf: Buffer<Elem = u8>,
    O: WritableBuffer<Elem = u8>,
{
    check(&plan.format, &plan.kernel, input.len(), output.len())?;
    plan.check_entry(Entry::Plain)?;
    if table.words[..] != plan.table[..] {
        return Err(Error::invalid(
            "gaussian table",
            "it was uploaded by another plan (another format or kernel): upload this plan's table",
        ));
    }
    let Some(device) = queue.cuda_device() else {
        crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Launch)?;
        return input
            .cpu_read(|src| output.cpu_write(|dst| gaussian_cpu(&plan.format, &plan.kernel, src, dst)))??;
    };
    check_sample_alignment(queue, plan, input, output)?;
    let kernel = plan.entry_point(device, Entry::Plain)?;
    let config = plan.launch_config();
    let args = KernelArgs::new().read(input).write(output);
    let args = match &table.memory {
        TableMemory::Host(words) => args.read(words),
        TableMemory::Device(words) => args.read(words),
        TableMemory::Cpu => {
            return Err(Error::invalid(
                "gaussian table",
                "it was uploaded for a CPU-backend queue: upload it for this queue",
            ));
        }
    };
    let args = args
        .value(plan.format.planes().len() as u32)
        .value(plan.kernel.radius())
        .value(plan.kernel.border().code());
    // SAFETY: gaussian_u8 and gaussian_u16 (const u8* src, u8* dst, const u32* table,
    // u32 plane_count, u32 radius, u32 border) match the arguments in order and type, and the
    // entry point is the one for the plan's samples, whose table it reads. The table holds the
    // plan's own words (compared above; only `upload_table` writes one, and a Shared lease
    // lets no one write it after), so every tile it describes lies inside one frame of the
    // plan's format (its byte size counts the sample size), and input and output are one
    // frame long (checked): the kernel stays inside all three buffers. A 16-bit frame's
    // buffers start on even addresses (checked), so its two-byte accesses are aligned. A table
    // lent to another queue is refused when its address is resolved.
    unsafe { queue.launch(&kernel, config, args) }
}

/// A 16-bit frame's samples are read and written as aligned two-byte words: its buffers must
/// start on even addresses (every buffer hetmem allocates does; a lease over part of one may
/// not). Nothing to check for 8-bit frames.
fn check_sample_alignment<I: Lease, O: Lease>(
    queue: &Queue,
    plan: &GaussianPlan,
    input: &I,
    output: &O,
) -> Result<()> {
    if plan.format.sample() == SampleType::U8 {
        return Ok(());
    }
    check_aligned(plan, "input", queue.address_of(input)?)?;
    check_aligned(plan, "output", queue.address_of(output)?)
}

/// Refuses the `name` buffer of `plan`'s frames at an `address` its samples cannot be read
/// from whole.
pub(super) fn check_aligned(plan: &GaussianPlan, name: &str, address: u64) -> Result<()> {
    let align = plan.format.sample().bytes() as u64;
    if !address.is_multiple_of(align) {
        return Err(Error::invalid(
            "frame buffer",
            format!(
                "the {name} starts at an odd address ({address:#x}); a {} frame's samples must be \
                 {align}-byte aligned: lend a whole buffer, or a range starting on an even byte",
                plan.format.describe()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ops::gaussian::{Border, PixelLayout};

    /// gaussian.cu, phase for phase, one thread at a time, with the frame at address 0
    /// (buffers are page-aligned): catches tiling, ring and alignment mistakes without a GPU.
    ///
    /// Also emulates the overlap entry point's bookkeeping with segments of `segment_bytes`:
    /// checks that every byte a chunk reads lies in a segment it waited for, and returns the
    /// bytes counted into each output segment.
    fn emulate_kernel(plan: &GaussianPlan, src: &[u8], segment_bytes: usize) -> (Vec<u8>, Vec<usize>) {
        let mut dst = vec![0xA5u8; src.len()];
        let mut counted = vec![0usize; src.len().div_ceil(segment_bytes)];
        let taps = plan.kernel.weights().len();
        let r = plan.kernel.radius() as i64;
        // The weights as the kernel reads them, from the plan's table.
        let weights = &plan.table[..taps];
        let border = plan.kernel.border();
        let wide = plan.format.sample() == SampleType::U16;
        let sample_bytes = plan.format.sample().bytes() as i64;
        let planes = &plan.table[taps..];
        let plane_count = planes.len() / PLANE_WORDS;
        let chunk = plan.chunk as i64;
        let align_down = |g: i64| (g & !15) - g;
        for block in 0..plan.tiles {
            let mut plane = 0;
            for p in 1..plane_count {
                if block >= planes[p * PLANE_WORDS + 9] {
                    plane = p;
                }
            }
            let w = &planes[plane * PLANE_WORDS..(plane + 1) * PLANE_WORDS];
            let offset = w[0] as i64 | ((w[1] as i64) << 32);
            let (width, height, samples) = (w[2] as i64, w[3] as i64, w[4] as i64);
            // Bytes per pixel: everything but the two passes works on bytes.
            let channels = samples * sample_bytes;
            let (band_px, bands, range_rows) = (w[5] as i64, w[6] as i64, w[8] as i64);
            let tile = block as i64 - w[9] as i64;
            let x0 = (tile % bands) * band_px;
            let band_width = band_px.min(width - x0);
            let y0 = (tile / bands) * range_rows;
            let y1 = (y0 + range_rows).min(height);
            if band_width <= 0 || y0 >= y1 {
                continue;
            }
            let row_bytes = width * channels;
            let seg_lo = x0 - r;
            let seg_hi = x0 + band_width + r;
            let (a_px, b_px) = (seg_lo.max(0), seg_hi.min(width));
            let lead = (a_px - seg_lo) * channels;
            let load_bytes = (b_px - a_px) * channels;
            let seg_bytes = (seg_hi - seg_lo) * channels;
            let out_bytes = band_width * channels;
            let halo_bytes = ((seg_hi - seg_lo) - (b_px - a_px)) * channels;
            let in_stride = ((15 + seg_bytes + 16) + 15) & !15;
            let out_stride = ((15 + out_bytes + 16) + 15) & !15;
            let ring = chunk + 2 * r;
            // Samples per thread in the two passes: four bytes, or two 16-bit samples.
            let per = if wide { 2 } else { 4 };
            let out_samples = out_bytes / sample_bytes;
            let mid_stride = (out_samples + per - 1) / per * per;
            let mut in_rows = vec![0u8; (ring * in_stride) as usize];
            let mut mid = vec![0u32; (ring * mid_stride) as usize];
            let mut out_rows = vec![0u8; (chunk * out_stride) as usize];
            let (mut row_offset, mut row_base) = (vec![0i64; ring as usize], vec![0i64; ring as usize]);
            let resolve = |i: i64, len: i64| border.resolve(i, len);
            let locate = |first: i64, count: i64, row_offset: &mut Vec<i64>, row_base: &mut Vec<i64>| {
                for row in 0..count {
                    let y = resolve(first + row, height);
                    let at = y * row_bytes + a_px * channels;
                    row_offset[row as usize] = at;
                    row_base[row as usize] = (offset + at - lead) & 15;
                }
            };
            // wait_for_rows: the segment of the last byte of the row holding the last row offset.
            let waited_end = |count: i64, row_offset: &[i64]| {
                let last = row_offset[..count as usize].iter().copied().max().unwrap();
                let row_end = (last / row_bytes + 1) * row_bytes;
                ((offset + row_end - 1) as usize / segment_bytes + 1) * segment_bytes
            };
            let load = |count: i64, row_offset: &[i64], row_base: &[i64], in_rows: &mut Vec<u8>| {
                let readable = waited_end(count, row_offset) as i64;
                let read = |at: i64| {
                    assert!(at < readable, "byte {at} read before its segment (up to {readable}) arrived");
                    src[at as usize]
                };
                let max_units = load_bytes / 16 + 2;
                for item in 0..count * max_units {
                    let (row, unit) = (item / max_units, item % max_units);
                    let g = offset + row_offset[row as usize];
                    let s = row * in_stride + row_base[row as usize] + lead;
                    let start = align_down(g) + 16 * unit;
                    if start >= load_bytes {
                        continue;
                    }
                    if start >= 0 && start + 16 <= load_bytes {
                        assert_eq!((s + start) % 16, 0, "unaligned shared vector store");
                        assert_eq!((g + start) % 16, 0, "unaligned global vector load");
                    }
                    for i in start.max(0)..(start + 16).min(load_bytes) {
                        in_rows[(s + i) as usize] = read(g + i);
                    }
                }
                let left = a_px - seg_lo;
                for item in 0..count * halo_bytes {
                    let (row, k) = (item / halo_bytes, item % halo_bytes);
                    let (px_index, ch) = (k / channels, k % channels);
                    let x = if px_index < left { seg_lo + px_index } else { b_px + (px_index - left) };
                    let xr = resolve(x, width);
                    let row_start = row_offset[row as usize] - a_px * channels;
                    in_rows[(row * in_stride + row_base[row as usize] + (x - seg_lo) * channels + ch)
                        as usize] = read(offset + row_start + xr * channels + ch);
                }
            };
            let mut next_virtual = y0 - r;
            let mut n_load = chunk.min(y1 - y0) + 2 * r;
            locate(next_virtual, n_load, &mut row_offset, &mut row_base);
            load(n_load, &row_offset, &row_base, &mut in_rows);
            let mut yo = y0;
            while yo < y1 {
                let n_out = chunk.min(y1 - yo);
                let items = mid_stride / per;
                let first_slot_loaded = next_virtual - (y0 - r);
                // Sample `i` of a row loaded at `s`, as the kernel reads it from shared memory.
                let sample = |s: i64, i: i64| -> u32 {
                    if wide {
                        let at = (s + 2 * i) as usize;
                        assert_eq!(at % 2, 0, "unaligned 16-bit sample in shared memory");
                        u32::from(u16::from_le_bytes([in_rows[at], in_rows[at + 1]]))
                    } else {
                        u32::from(in_rows[(s + i) as usize])
                    }
                };
                for item in 0..n_load * items {
                    let (row, j0) = (item / items, (item % items) * per);
                    let s = row * in_stride + row_base[row as usize] + j0 * sample_bytes;
                    let slot = (first_slot_loaded + row) % ring;
                    for i in 0..per {
                        let sum: u32 =
                            (0..taps as i64).map(|k| weights[k as usize] * sample(s, k * samples + i)).sum();
                        // 8-bit: rounded to Q8; 16-bit: kept exact.
                        mid[(slot * mid_stride + j0 + i) as usize] =
                            if wide { sum } else { (sum + 128) >> 8 };
                    }
                }
                next_virtual += n_load;
                let next_out = chunk.min(y1 - (yo + chunk));
                for item in 0..n_out * items {
                    let (row, j0) = (item / items, (item % items) * per);
                    let y = yo + row;
                    let g = offset + y * row_bytes + x0 * channels;
                    let o = row * out_stride + (g & 15) + j0 * sample_bytes;
                    for i in 0..(out_samples - j0).min(per) {
                        let mut sum: u64 = if wide { 1 << 31 } else { 1 << 23 };
                        let mut slot = (y - y0) % ring;
                        for &weight in weights {
                            sum += u64::from(weight) * u64::from(mid[(slot * mid_stride + j0 + i) as usize]);
                            slot = if slot + 1 == ring { 0 } else { slot + 1 };
                        }
                        if wide {
                            let at = (o + 2 * i) as usize;
                            assert_eq!(at % 2, 0, "unaligned 16-bit sample in the staged rows");
                            out_rows[at..at + 2].copy_from_slice(&((sum >> 32) as u16).to_le_bytes());
                        } else {
                            assert!(sum < 1 << 32, "an 8-bit vertical sum overflows 32 bits");
                            out_rows[(o + i) as usize] = (sum >> 24) as u8;
                        }
                    }
                }
                let out_units = out_bytes / 16 + 2;
                for item in 0..n_out * out_units {
                    let (row, unit) = (item / out_units, item % out_units);
                    let g = offset + (yo + row) * row_bytes + x0 * channels;
                    let o = row * out_stride + (g & 15);
                    let start = align_down(g) + 16 * unit;
                    if start >= out_bytes {
                        continue;
                    }
                    if start >= 0 && start + 16 <= out_bytes {
                        assert_eq!((o + start) % 16, 0, "unaligned staged vector");
                    }
                    for i in start.max(0)..(start + 16).min(out_bytes) {
                        dst[(g + i) as usize] = out_rows[(o + i) as usize];
                    }
                }
                if next_out > 0 {
                    n_load = next_out;
                    locate(next_virtual, n_load, &mut row_offset, &mut row_base);
                    load(n_load, &row_offset, &row_base, &mut in_rows);
                }
                // count_written
                for row in 0..n_out {
                    let mut lo = (offset + (yo + row) * row_bytes + x0 * channels) as usize;
                    let hi = lo + out_bytes as usize;
                    while lo < hi {
                        let segment = lo / segment_bytes;
                        let end = hi.min((segment + 1) * segment_bytes);
                        counted[segment] += end - lo;
                        lo = end;
                    }
                }
                yo += chunk;
            }
        }
        (dst, counted)
    }

    #[test]
    fn the_kernels_algorithm_matches_the_cpu_path_bit_for_bit() {
        for (w, h, layout, radius, sigma, border, sms) in [
            (1920, 1080, PixelLayout::Rgb, None, None, Border::Reflect101, 132),
            (1919, 1081, PixelLayout::Rgb, Some(3), None, Border::Replicate, 132),
            (7, 3, PixelLayout::Rgb, Some(2), None, Border::Reflect101, 132),
            (7, 3, PixelLayout::Rgba, Some(1), None, Border::Replicate, 4),
            (641, 97, PixelLayout::Gray, Some(9), Some(3.0), Border::Reflect101, 8),
            (259, 130, PixelLayout::Yuv420, Some(2), None, Border::Reflect101, 132),
            (258, 35, PixelLayout::Yuv422, Some(4), None, Border::Replicate, 16),
            (130, 67, PixelLayout::Yuv444, Some(32), Some(20.0), Border::Reflect101, 16),
            // Sides not larger than the radius: every halo pixel folds back into the image.
            (1, 1, PixelLayout::Gray, Some(2), None, Border::Reflect101, 132),
            (1, 1, PixelLayout::Rgb, Some(9), None, Border::Replicate, 4),
            (2, 3, PixelLayout::Rgb, Some(2), None, Border::Reflect101, 132),
            (2, 3, PixelLayout::Rgba, Some(9), Some(3.0), Border::Reflect101, 8),
            (3, 1, PixelLayout::Gray, Some(5), None, Border::Reflect101, 132),
            // Several bands of the mapped tiling's widest one-channel band (512 px at radius 8).
            (1100, 40, PixelLayout::Gray, Some(8), None, Border::Reflect101, 132),
            (3, 1, PixelLayout::Rgb, Some(7), None, Border::Replicate, 16),
            (5, 4, PixelLayout::Yuv420, Some(6), None, Border::Reflect101, 132),
            (3, 2, PixelLayout::Yuv422, Some(3), None, Border::Replicate, 16),
            (2, 2, PixelLayout::Yuv444, Some(8), None, Border::Reflect101, 4),
        ] {
            for sample in [SampleType::U8, SampleType::U16] {
                check_the_kernels_algorithm((w, h, layout, radius, sigma, border, sms), sample);
            }
        }
    }

    /// A frame and a kernel: width, height, layout, radius, sigma, border, and the SMs to tile for.
    type Case = (usize, usize, PixelLayout, Option<u32>, Option<f64>, Border, u32);

    /// One case of [`the_kernels_algorithm_matches_the_cpu_path_bit_for_bit`], with samples of
    /// type `sample`.
    fn check_the_kernels_algorithm((w, h, layout, radius, sigma, border, sms): Case, sample: SampleType) {
        let format = FrameFormat::new(w, h, layout).unwrap().with_sample(sample);
        let kernel = Gaussian::new(radius, sigma, border).unwrap();
        let input: Vec<u8> = (0..format.frame_bytes()).map(|_| fastrand::u8(..)).collect();
        let mut want = vec![0u8; input.len()];
        gaussian_cpu(&format, &kernel, &input, &mut want).unwrap();
        let frame = input.len();
        let plain = GaussianPlan::new(&format, &kernel, sms).unwrap();
        let mapped = GaussianPlan::for_mapped(&format, &kernel, sms).unwrap();
        let overlap = GaussianPlan::for_overlap(&format, &kernel, sms).unwrap();
        let resident = GaussianPlan::for_resident(&format, &kernel, sms, None).unwrap();
        assert!(overlap.blocks <= sms && plain.blocks == plain.tiles && mapped.blocks == mapped.tiles);
        assert!(resident.blocks <= sms.min(resident.tiles) && resident.chunk == RESIDENT_CHUNK);
        for (plan, segment_bytes) in [
            (&plain, frame),
            (&mapped, frame),
            (&resident, frame),
            (&overlap, frame.div_ceil(6).next_multiple_of(16)),
            (&overlap, 16),
            (&overlap, frame.next_multiple_of(16)),
        ] {
            let (got, counted) = emulate_kernel(plan, &input, segment_bytes);
            let first = got.iter().zip(&want).position(|(g, e)| g != e);
            assert_eq!(first, None, "{w}x{h} {layout:?} {sample:?} r={radius:?}: first difference");
            // Every output segment is counted complete exactly when all its bytes are written.
            for (segment, &bytes) in counted.iter().enumerate() {
                let total = segment_bytes.min(frame - segment * segment_bytes);
                assert_eq!(
                    bytes, total,
                    "{w}x{h} {layout:?} {sample:?}: segment {segment} of {segment_bytes} bytes"
                );
            }
        }
    }

    #[test]
    fn a_1080p_rgb_frame_makes_about_one_tile_per_sm_and_reads_little_twice() {
        let format = FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap();
        let plan =
            GaussianPlan::new(&format, &Gaussian::new(None, None, Border::default()).unwrap(), 132).unwrap();
        assert!((100..=132).contains(&plan.tiles), "{} tiles", plan.tiles);
        let overhead = plan.bytes_read() as f64 / format.frame_bytes() as f64 - 1.0;
        assert!(overhead < 0.10, "halo overhead {overhead:.3}");
        // The largest kernel must still fit the H100/H200's 227 KiB of shared memory per block.
        for sample in [SampleType::U8, SampleType::U16] {
            for channels in 1..=4 {
                let bytes = shared_for(band_px(channels, sample), channels, 32, sample, CHUNK);
                assert!(bytes <= 227 << 10, "{sample:?} x {channels}: {bytes}");
            }
        }
        assert!(plan.shared_bytes > 0);
    }

    /// The resident tiling: the probe's best 1080p shape on a 132-SM H200 (48 tiles of 256
    /// pixels, 8-row chunks), at most one block per SM whatever is asked, and the shared memory
    /// of the shorter chunks.
    #[test]
    fn the_resident_plan_takes_the_best_mapped_shape_and_a_block_per_sm_at_most() {
        let default = Gaussian::new(None, None, Border::default()).unwrap();
        let format = FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap();
        let plan = GaussianPlan::for_resident(&format, &default, 132, None).unwrap();
        assert_eq!((plan.tiles, plan.blocks, plan.chunk), (48, 48, RESIDENT_CHUNK));
        assert_eq!(plan.table()[default.weights().len() + 5], 256, "band width");
        assert_eq!(plan.shared_bytes, shared_for(256, 3, 2, SampleType::U8, RESIDENT_CHUNK));
        assert!(plan.shared_bytes < shared_for(256, 3, 2, SampleType::U8, CHUNK));
        let many = GaussianPlan::for_resident(&format, &default, 132, Some(500)).unwrap();
        assert!(many.tiles > 132 && many.blocks == 66, "{} tiles, {} blocks", many.tiles, many.blocks);
        // Its shared memory is for 8-row chunks: the one-launch kernel refuses it.
        match plan.check_entry(Entry::Plain) {
            Err(Error::InvalidArgument { problem, .. }) => assert!(problem.contains("resident"), "{problem}"),
            other => panic!("expected the resident plan refused by the plain kernel, got {other:?}"),
        }
        assert!(plan.check_entry(Entry::Resident).is_ok());
        let queue = crate::Queue::new(&crate::Device::cpu()).unwrap();
        let table = plan.upload_table(&queue, Where::Mapped).unwrap();
        let bytes = format.frame_bytes();
        let input =
            queue.share(HostBuf::<u8>::pinned(&crate::Device::cpu(), bytes, PinOptions::default()).unwrap());
        let mut output =
            queue.lend(HostBuf::<u8>::pinned(&crate::Device::cpu(), bytes, PinOptions::default()).unwrap());
        assert!(matches!(
            gaussian(&queue, &plan, &table, &input, &mut output),
            Err(Error::InvalidArgument { .. })
        ));
        let one = GaussianPlan::for_resident(&format, &default, 132, Some(0)).unwrap();
        assert_eq!((one.tiles, one.blocks), (8, 8), "one range of the eight bands");
    }

    #[test]
    fn mapped_frames_get_wider_bands_and_half_the_tiles_where_shared_memory_allows() {
        let default = Gaussian::new(None, None, Border::default()).unwrap();
        for (width, height, tiles, band) in [(1920, 1080, 64, 256), (3840, 2160, 60, 256)] {
            let format = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
            let plain = GaussianPlan::new(&format, &default, 132).unwrap();
            let mapped = GaussianPlan::for_mapped(&format, &default, 132).unwrap();
            assert_eq!((mapped.tiles, mapped.table()[5 + 5]), (tiles, band), "{width}x{height}");
            assert!(mapped.bytes_read() < plain.bytes_read(), "{width}x{height}: fewer halo bytes");
            assert!(mapped.shared_bytes + STATIC_SHARED <= MAPPED_SHARED);
        }
        // Where the wider band would not fit, the band stays as it was: radius 3 on RGB, every
        // radius on RGBA; the tiles still halve (15 bands of 128 RGBA pixels: 4 ranges, not 8).
        let format = FrameFormat::new(1920, 1080, PixelLayout::Rgba).unwrap();
        let mapped = GaussianPlan::for_mapped(&format, &default, 132).unwrap();
        assert_eq!(mapped.table()[5 + 5] as usize, band_px(4, SampleType::U8));
        assert_eq!((mapped.tiles, GaussianPlan::new(&format, &default, 132).unwrap().tiles), (60, 120));
        let format = FrameFormat::new(1920, 1080, PixelLayout::Rgb).unwrap();
        let wide = Gaussian::new(Some(3), None, Border::default()).unwrap();
        let mapped = GaussianPlan::for_mapped(&format, &wide, 132).unwrap();
        assert_eq!(mapped.table()[7 + 5] as usize, band_px(3, SampleType::U8));
        assert_eq!((mapped.tiles, GaussianPlan::new(&format, &wide, 132).unwrap().tiles), (60, 120));
        // One-channel planes widen up to radius 8, where the block takes just under 64 KiB.
        let gray = FrameFormat::new(1920, 1080, PixelLayout::Gray).unwrap();
        for (radius, band) in [(8, 512), (9, 256)] {
            let kernel = Gaussian::new(Some(radius), None, Border::default()).unwrap();
            let mapped = GaussianPlan::for_mapped(&gray, &kernel, 132).unwrap();
            assert_eq!(mapped.table()[(2 * radius + 1) as usize + 5], band, "radius {radius}");
            assert!(mapped.shared_bytes + STATIC_SHARED <= MAPPED_SHARED);
        }
    }

    #[test]
    fn a_10_bit_1080p_frame_reads_little_twice_too() {
        let format = FrameFormat::new(1920, 1080, PixelLayout::Yuv420).unwrap().with_sample(SampleType::U16);
        let kernel = Gaussian::new(None, None, Border::default()).unwrap();
        let plan = GaussianPlan::new(&format, &kernel, 132).unwrap();
        assert!((100..=140).contains(&plan.tiles), "{} tiles", plan.tiles);
        let overhead = plan.bytes_read() as f64 / format.frame_bytes() as f64 - 1.0;
        assert!(overhead < 0.10, "halo overhead {overhead:.3}");
        // The 16-bit kernel reads the 16-bit weights.
        assert_eq!(&plan.table()[..5], kernel.weights_u16());
    }

    #[test]
    fn planar_frames_list_every_plane_with_its_first_tile() {
        let format = FrameFormat::new(1919, 1081, PixelLayout::Yuv420).unwrap();
        let plan = GaussianPlan::new(&format, &Gaussian::new(Some(3), None, Border::Replicate).unwrap(), 132)
            .unwrap();
        let table = plan.table();
        let planes = &table[7..];
        assert_eq!(planes.len(), 3 * PLANE_WORDS);
        let (u_plane, v_plane) = (&planes[PLANE_WORDS..], &planes[2 * PLANE_WORDS..]);
        assert_eq!(u_plane[0] as usize, 1919 * 1081);
        assert_eq!((u_plane[2], u_plane[3]), (960, 541));
        assert_eq!(v_plane[9], u_plane[9] + u_plane[6] * u_plane[7]);
        assert_eq!(plan.tiles, v_plane[9] + v_plane[6] * v_plane[7]);
    }

    #[test]
    fn a_count_beyond_the_tables_32_bits_is_refused() {
        assert_eq!(table_word("bands", u32::MAX as usize).unwrap(), u32::MAX);
        let error = table_word("plane height", 1 << 32).unwrap_err().to_string();
        assert!(error.contains("plane height 4294967296 does not fit the kernel's 32-bit table"), "{error}");
        assert!(error.contains("FrameFormat::new"), "{error}");
    }

    /// The table as the kernel reads it describes exactly `format`'s planes: each plane's
    /// offset and size, bands and ranges that cover it once and no more, and tiles numbered one
    /// plane after another up to the plan's count.
    fn check_the_table_describes_the_frame(
        plan: &GaussianPlan,
        format: &FrameFormat,
    ) -> Result<(), TestCaseError> {
        let weights = plan.kernel.weights().len();
        let planes = format.planes();
        prop_assert_eq!(plan.table().len(), weights + planes.len() * PLANE_WORDS);
        let mut first_tile = 0u64;
        for (plane, words) in planes.iter().zip(plan.table()[weights..].chunks(PLANE_WORDS)) {
            let word = |i: usize| u64::from(words[i]);
            prop_assert_eq!(word(0) | word(1) << 32, plane.offset as u64);
            prop_assert_eq!(
                (word(2), word(3), word(4)),
                (plane.width as u64, plane.height as u64, plane.channels as u64)
            );
            let (band_px, bands, ranges, range_rows) = (word(5), word(6), word(7), word(8));
            prop_assert!(bands * band_px >= word(2) && (bands - 1) * band_px < word(2));
            prop_assert!(ranges * range_rows >= word(3) && (ranges - 1) * range_rows < word(3));
            prop_assert_eq!(word(9), first_tile);
            first_tile += bands * ranges;
            let end = word(0) + word(2) * word(3) * word(4) * format.sample().bytes() as u64;
            prop_assert!(end <= format.frame_bytes() as u64);
        }
        prop_assert_eq!(first_tile, u64::from(plan.tiles));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Every tiling of every format up to MAX_SIDE describes exactly its frame; where the
        /// frame is small enough to emulate, the kernel, phase for phase, stays inside its
        /// buffers (the emulation indexes checked slices) and writes the CPU path's frame.
        #[test]
        fn every_plan_describes_exactly_its_frame(
            width in prop_oneof![3 => 1..40usize, 1 => 1..=MAX_SIDE],
            height in prop_oneof![3 => 1..40usize, 1 => 1..=MAX_SIDE],
            layout in prop::sample::select(vec![
                PixelLayout::Gray,
                PixelLayout::Rgb,
                PixelLayout::Rgba,
                PixelLayout::Yuv420,
                PixelLayout::Yuv422,
                PixelLayout::Yuv444,
            ]),
            wide in any::<bool>(),
            radius in 0..=8u32,
            sms in prop_oneof![3 => 1..=264u32, 1 => any::<u32>()],
        ) {
            let sample = if wide { SampleType::U16 } else { SampleType::U8 };
            let format = FrameFormat::new(width, height, layout).unwrap().with_sample(sample);
            let kernel = Gaussian::new(Some(radius), None, Border::Reflect101).unwrap();
            for tiling in [Tiling::Plain, Tiling::Mapped, Tiling::Overlap, Tiling::Resident(sms / 3 + 1)] {
                let plan = GaussianPlan::tiled(&format, &kernel, sms, tiling).unwrap();
                check_the_table_describes_the_frame(&plan, &format)?;
            }
            if format.frame_bytes() <= 8 << 10 && sms > 0 {
                let case = (width, height, layout, Some(radius), None, Border::Reflect101, sms);
                check_the_kernels_algorithm(case, sample);
            }
        }
    }
}
