//! An 8K data set larger than a GPU's memory: frames of interleaved 8-bit
//! RGB held whole in one buffer, filtered frame by frame, against a run
//! that copies each frame to the device and back.
//!
//! The data set lives in one portable, mapped, pinned host allocation ([`Backing::Host`]) or in
//! a file mapped and registered with the GPU ([`Backing::File`]). Every frame goes through the
//! same kernel, a 3x3 binomial blur (`kernels/dataset.cu`), two ways:
//! - [`Method::Mapped`]: the kernel reads frame k straight from the data set at
//!   `device_ptr + k x frame bytes` (one launch argument, no buffer per frame) and writes its
//!   result to one mapped pinned host frame: no device memory at all;
//! - [`Method::CopyEach`]: frame k is copied into a device frame, filtered into another, and
//!   copied back to a pinned host frame: two frames of device memory.
//!
//! Each run reports frames/s and the device memory it allocated, and what the driver's free
//! memory says it used. Data is fresh random bytes; a sample of frames (the first, the last,
//! and some between) is then filtered again into a poisoned output and compared byte for byte
//! with the CPU's blur of the same frame. On the CPU backend the same runs go through the CPU
//! blur, so the benchmark (and its test) runs anywhere.
//!
//! Frames are taken at offsets into one whole-data-set buffer because hetmem's leases cover
//! whole buffers today: range leases (a lease over frame k alone) and mapped-file windows
//! (map and register only the frames in flight, for files larger than RAM or the pinning
//! limit) would replace the kernel's offset argument and the whole-file registration.

use std::path::PathBuf;
use std::time::Instant;

use hetmem::backend::cuda::Kernel;
use hetmem::backend::cuda::{CudaDevice, LaunchConfig};
use hetmem::error::{Error, Result};
use hetmem::kernels::{self, KernelSource};
use hetmem::{
    Buffer, Device, DeviceBuf, HostBuf, HostVisible, KernelArgs, Lease, Lent, MappedFile, PinOptions, Queue,
    Shared, WritableBuffer,
};
use rayon::prelude::*;

use crate::random::{SplitMix64, fresh_seed};

/// The blur of the data set's frames.
pub static DATASET: KernelSource = KernelSource {
    name: "dataset",
    source: include_str!("../kernels/dataset.cu"),
    ptx: Some(include_str!("../kernels/ptx/dataset.ptx")),
    entry_points: &["dataset_blur3_rgb"],
    options: &[],
};

/// The default data set: 500 frames of 7680 x 4320 RGB, 49.8 GB.
pub const DEFAULT_FRAMES: usize = 500;
/// The default frame size: 8K.
pub const DEFAULT_SIZE: (usize, usize) = (7680, 4320);
/// Bytes per pixel: interleaved 8-bit R, G, B.
const PIXEL_BYTES: usize = 3;
/// The kernel's block: 32 x 8 pixels (`TILE_W`, `TILE_H` in the source).
const TILE: (u32, u32) = (32, 8);

/// Where the data set lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backing {
    /// One pinned host allocation, mapped into the device's address space and portable (any
    /// GPU of the process can use it).
    Host,
    /// A file of the frames, mapped read-only and registered with the GPU: kernels read the
    /// page cache.
    File,
}

impl Backing {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backing::Host => "host",
            Backing::File => "file",
        }
    }
}

/// How frames reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The kernel reads each frame where the data set is, at its offset, and writes mapped host
    /// memory: no device memory.
    Mapped,
    /// Each frame copied to a device frame, filtered into another, copied back.
    CopyEach,
}

impl Method {
    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Method::Mapped => "mapped",
            Method::CopyEach => "copy-each",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetOptions {
    /// Frames in the data set (at least 1).
    pub frames: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Where the data set lives.
    pub backing: Backing,
    /// Where the file goes, for [`Backing::File`] (removed at the end); the system's temp dir
    /// when `None`.
    pub dir: Option<PathBuf>,
    /// Frames checked against the CPU per method (the first, the last, some between).
    pub verify: usize,
}

impl DatasetOptions {
    /// The default data set in host memory: 500 frames of 8K.
    pub fn eight_k() -> DatasetOptions {
        DatasetOptions {
            frames: DEFAULT_FRAMES,
            width: DEFAULT_SIZE.0,
            height: DEFAULT_SIZE.1,
            backing: Backing::Host,
            dir: None,
            verify: 3,
        }
    }

    /// Bytes of one frame.
    pub fn frame_bytes(&self) -> usize {
        self.width * self.height * PIXEL_BYTES
    }

    /// Bytes of the data set.
    pub fn dataset_bytes(&self) -> u64 {
        self.frame_bytes() as u64 * self.frames as u64
    }

    /// Refuses what cannot be measured.
    ///
    /// # Errors
    /// No frames, an empty frame, a frame whose rows or bytes overflow the kernel's 32-bit
    /// sizes, a data set whose size overflows, or a file backing whose directory is missing.
    pub fn validate(&self) -> Result<()> {
        if self.frames == 0 {
            return Err(Error::invalid("data set frames", "0: give at least 1"));
        }
        if self.width == 0 || self.height == 0 {
            return Err(Error::invalid(
                "data set frame",
                format!("{}x{}: give a size above 0", self.width, self.height),
            ));
        }
        if self.width > u32::MAX as usize / PIXEL_BYTES || self.height > u32::MAX as usize {
            return Err(Error::invalid(
                "data set frame",
                format!("{}x{}: too large", self.width, self.height),
            ));
        }
        self.width
            .checked_mul(self.height)
            .and_then(|pixels| pixels.checked_mul(PIXEL_BYTES))
            .and_then(|frame| frame.checked_mul(self.frames))
            .ok_or_else(|| Error::invalid("data set", "its size overflows: fewer or smaller frames"))?;
        if let Some(dir) = &self.dir
            && !dir.is_dir()
        {
            return Err(Error::invalid(
                "data set directory",
                format!("{} is not a directory: give an existing one for the file", dir.display()),
            ));
        }
        Ok(())
    }
}

/// One method's run over the whole data set.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MethodRun {
    /// How frames reached the kernel.
    pub method: Method,
    /// Frames filtered per second, over the whole data set.
    pub frames_s: f64,
    /// Data-set bytes filtered per second, in GB/s (1e9 bytes).
    pub gb_s: f64,
    /// Seconds for the whole data set.
    pub seconds: f64,
    /// Device memory the method allocated, in bytes.
    pub device_bytes: u64,
    /// What the driver's free device memory fell by while the method ran (allocations,
    /// staging, modules), in bytes; `None` on the CPU backend.
    pub device_used_bytes: Option<u64>,
    /// The frames checked byte for byte against the CPU's blur, into poisoned outputs.
    pub verified_frames: Vec<usize>,
}

/// What `hetmem bench dataset` measures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DatasetReport {
    /// The device, as hetmem names it.
    pub device: String,
    /// Frames in the data set.
    pub frames: usize,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Bytes of one frame.
    pub frame_bytes: u64,
    /// Bytes of the data set.
    pub dataset_bytes: u64,
    /// Where the data set lived.
    pub backing: Backing,
    /// The device's memory in bytes (`None` on the CPU backend), for the data set's size
    /// against it.
    pub device_total_bytes: Option<u64>,
    /// Seconds to allocate (or write the file) and fill the data set with random bytes, and
    /// register it.
    pub setup_seconds: f64,
    /// One run per method.
    pub runs: Vec<MethodRun>,
}

/// Builds the data set of `options` on `device`, runs every method over it, and checks a sample
/// of frames of each against the CPU.
///
/// # Errors
/// Options that cannot be measured, memory or a file that cannot be had, a driver error, or a
/// frame that differs from the CPU's blur.
pub fn measure(device: &Device, options: &DatasetOptions) -> Result<DatasetReport> {
    options.validate()?;
    let queue = Queue::new(device)?;
    let seed = fresh_seed();
    let started = Instant::now();
    let (runs, setup_seconds) = match options.backing {
        Backing::Host => {
            let pinned = PinOptions { mapped: true, portable: true, ..PinOptions::default() };
            let mut data = HostBuf::<u8>::pinned(device, options.dataset_bytes() as usize, pinned)?;
            fill_random(data.as_mut_slice(), seed);
            let setup = started.elapsed().as_secs_f64();
            (run_methods(device, &queue, data, options)?, setup)
        }
        Backing::File => {
            let file = DatasetFile::write(options, seed)?;
            // SAFETY: the file is this run's own (a fresh name, removed when `file` drops, after
            // the mapping): nothing truncates or modifies it while it is mapped.
            let data = unsafe { MappedFile::<u8>::open(device, &file.path) }?;
            let setup = started.elapsed().as_secs_f64();
            let runs = run_methods(device, &queue, data, options)?;
            drop(file);
            (runs, setup)
        }
    };
    Ok(DatasetReport {
        device: device.name(),
        frames: options.frames,
        width: options.width,
        height: options.height,
        frame_bytes: options.frame_bytes() as u64,
        dataset_bytes: options.dataset_bytes(),
        backing: options.backing,
        device_total_bytes: device.as_cuda().map(CudaDevice::total_memory),
        setup_seconds,
        runs,
    })
}

/// Every method over `data`, shared with the GPU for the whole run (only read), then each
/// method's sample checked.
fn run_methods<B>(device: &Device, queue: &Queue, data: B, options: &DatasetOptions) -> Result<Vec<MethodRun>>
where
    B: HostVisible + Buffer<Elem = u8>,
{
    let data = queue.share(data);
    let runner = Runner::new(device, queue, options)?;
    let runs = [Method::Mapped, Method::CopyEach]
        .into_iter()
        .map(|method| runner.run(method, &data))
        .collect::<Result<Vec<_>>>()?;
    data.reclaim()?;
    Ok(runs)
}

/// What every method needs.
struct Runner<'a> {
    device: &'a Device,
    queue: &'a Queue,
    options: &'a DatasetOptions,
    /// The blur, on a GPU.
    kernel: Option<Kernel>,
}

impl<'a> Runner<'a> {
    fn new(device: &'a Device, queue: &'a Queue, options: &'a DatasetOptions) -> Result<Runner<'a>> {
        let kernel = match device.as_cuda() {
            Some(cuda) => Some(kernels::kernel(cuda, &DATASET, "dataset_blur3_rgb")?),
            None => None,
        };
        Ok(Runner { device, queue, options, kernel })
    }

    fn config(&self) -> LaunchConfig {
        let (width, height) = (self.options.width as u32, self.options.height as u32);
        LaunchConfig {
            grid: (width.div_ceil(TILE.0), height.div_ceil(TILE.1), 1),
            block: (TILE.0, TILE.1, 1),
            shared_bytes: 0,
        }
    }

    /// Free device memory now, on a GPU.
    fn free_device_memory(&self) -> Result<Option<u64>> {
        self.device
            .as_cuda()
            .map(|cuda| cuda.memory_info().map(|(free, _)| free))
            .transpose()
            .map_err(Error::from)
    }

    /// `method` over every frame of `data`, timed, then its sample checked.
    fn run<B>(&self, method: Method, data: &Shared<B>) -> Result<MethodRun>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        let frame = self.options.frame_bytes();
        let free_before = self.free_device_memory()?;
        let mut buffers = Buffers {
            out: HostBuf::<u8>::pinned(
                self.device,
                frame,
                PinOptions { mapped: true, ..PinOptions::default() },
            )?,
            device: match method {
                Method::Mapped => None,
                Method::CopyEach => Some((
                    DeviceBuf::<u8>::new(self.device, frame)?,
                    DeviceBuf::<u8>::new(self.device, frame)?,
                )),
            },
        };
        let device_bytes = buffers.device.as_ref().map_or(0, |_| 2 * frame as u64);
        let free_during = self.free_device_memory()?;

        let started = Instant::now();
        for index in 0..self.options.frames {
            buffers = self.frame(index, data, buffers)?;
        }
        let seconds = started.elapsed().as_secs_f64();

        let mut verified_frames = Vec::new();
        for index in sample(self.options.frames, self.options.verify) {
            buffers.out.as_mut_slice().fill(POISON);
            buffers = self.frame(index, data, buffers)?;
            let mut want = vec![0; frame];
            blur3_rgb_cpu(
                &data.host()[index * frame..][..frame],
                &mut want,
                self.options.width,
                self.options.height,
            );
            let got = buffers.out.as_slice();
            if let Some(at) = got.iter().zip(&want).position(|(got, want)| got != want) {
                return Err(Error::invalid(
                    "data set result",
                    format!(
                        "{}: frame {index}, byte {at} is {} where the CPU's blur gives {}",
                        method.name(),
                        got[at],
                        want[at]
                    ),
                ));
            }
            verified_frames.push(index);
        }
        Ok(MethodRun {
            method,
            frames_s: self.options.frames as f64 / seconds,
            gb_s: self.options.dataset_bytes() as f64 / seconds / 1e9,
            seconds,
            device_bytes,
            device_used_bytes: free_before
                .zip(free_during)
                .map(|(before, during)| before.saturating_sub(during)),
            verified_frames,
        })
    }

    /// Frame `index` of `data` blurred into `buffers.out`, finished when this returns: read in
    /// place when `buffers.device` is `None`, else copied through the two device frames.
    fn frame<B>(&self, index: usize, data: &Shared<B>, buffers: Buffers) -> Result<Buffers>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        let (width, height) = (self.options.width, self.options.height);
        let frame = self.options.frame_bytes();
        let source = &data.host()[index * frame..][..frame];
        let Buffers { mut out, device } = buffers;
        let Some(kernel) = &self.kernel else {
            // The CPU backend: the same steps, by the CPU's blur.
            let device = match device {
                None => {
                    blur3_rgb_cpu(source, out.as_mut_slice(), width, height);
                    None
                }
                Some((mut input, mut output)) => {
                    input.copy_from_slice(source)?;
                    let mut blurred = vec![0; frame];
                    blur3_rgb_cpu(&input.to_vec()?, &mut blurred, width, height);
                    output.copy_from_slice(&blurred)?;
                    output.copy_to_slice(out.as_mut_slice())?;
                    Some((input, output))
                }
            };
            return Ok(Buffers { out, device });
        };
        match device {
            None => {
                let mut out = self.queue.lend(out);
                self.launch(kernel, data, index * frame, &mut out)?;
                Ok(Buffers { out: out.reclaim()?, device: None })
            }
            Some((mut input, output)) => {
                input.copy_from_slice(source)?;
                let input = self.queue.share(input);
                let mut output = self.queue.lend(output);
                self.launch(kernel, &input, 0, &mut output)?;
                let (input, output) = (input.reclaim()?, output.reclaim()?);
                output.copy_to_slice(out.as_mut_slice())?;
                Ok(Buffers { out, device: Some((input, output)) })
            }
        }
    }

    /// Queues the blur of the frame at byte `in_offset` of `input` into `output`.
    ///
    /// # Errors
    /// A frame that does not lie inside `input`, an `output` that is not one frame long, or
    /// the launch failing.
    fn launch<I, O>(&self, kernel: &Kernel, input: &I, in_offset: usize, output: &mut Lent<O>) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        let frame = self.options.frame_bytes();
        if in_offset.checked_add(frame).is_none_or(|end| end > input.len()) || output.len() != frame {
            return Err(Error::invalid(
                "data set frame",
                format!(
                    "{frame} bytes at {in_offset} of {} into {}: the frame must lie inside the input and fill the output",
                    input.len(),
                    output.len()
                ),
            ));
        }
        let args = KernelArgs::new()
            .read(input)
            .value(in_offset as u64)
            .write(output)
            .value(0u64)
            .value(self.options.width as u32)
            .value(self.options.height as u32);
        // SAFETY: dataset_blur3_rgb(const u8* frames, u64 in_offset, u8* out, u64 out_offset,
        // u32 width, u32 height) takes these arguments in order and type (sizes checked to fit
        // 32 bits by `DatasetOptions::validate`). It reads frames[in_offset .. in_offset +
        // width x height x 3), clamped to the frame's edges, and writes out[0 .. the same
        // length): checked above to lie inside `input` and to be all of `output`.
        unsafe { self.queue.launch(kernel, self.config(), args) }
    }
}

/// A method's buffers besides the data set: the host frame results land in, and for
/// [`Method::CopyEach`] the device frames the input is copied into and filtered into.
struct Buffers {
    out: HostBuf<u8>,
    device: Option<(DeviceBuf<u8>, DeviceBuf<u8>)>,
}

/// What outputs are filled with before a checked run: a byte no unwritten output can pass for
/// the blur of random data everywhere.
const POISON: u8 = 0xA5;

/// Frames to check among `frames`: the first, the last and evenly spaced ones between, `count`
/// in all (fewer when there are fewer frames).
fn sample(frames: usize, count: usize) -> Vec<usize> {
    let count = count.min(frames);
    let mut picked: Vec<usize> = match count {
        0 => Vec::new(),
        1 => vec![0],
        _ => (0..count).map(|i| i * (frames - 1) / (count - 1)).collect(),
    };
    picked.dedup();
    picked
}

/// The CPU's blur of one RGB frame, as the kernel computes it: weights 1 2 1 by 1 2 1, /16,
/// rounded half up, edges repeated. Rows in parallel.
pub fn blur3_rgb_cpu(input: &[u8], output: &mut [u8], width: usize, height: usize) {
    let row_bytes = width * PIXEL_BYTES;
    output.par_chunks_mut(row_bytes).enumerate().for_each(|(y, row)| {
        let rows =
            [y.saturating_sub(1), y, (y + 1).min(height - 1)].map(|y| &input[y * row_bytes..][..row_bytes]);
        for x in 0..width {
            let columns = [x.saturating_sub(1), x, (x + 1).min(width - 1)];
            for channel in 0..PIXEL_BYTES {
                let mut sum = 0u32;
                for (row, row_weight) in rows.iter().zip([1, 2, 1]) {
                    for (&column, weight) in columns.iter().zip([1, 2, 1]) {
                        sum += row_weight * weight * u32::from(row[column * PIXEL_BYTES + channel]);
                    }
                }
                row[x * PIXEL_BYTES + channel] = ((sum + 8) >> 4) as u8;
            }
        }
    });
}

/// Fills `bytes` with random bytes from `seed`, 1 MiB per task in parallel (a 50 GB data set
/// takes seconds, not minutes); `offset` is where `bytes` starts in the whole, so a data set
/// filled in parts gets the bytes it would whole.
fn fill_random_at(bytes: &mut [u8], seed: u64, offset: u64) {
    const CHUNK: usize = 1 << 20;
    bytes.par_chunks_mut(CHUNK).enumerate().for_each(|(index, chunk)| {
        SplitMix64::part(seed, offset / CHUNK as u64 + index as u64).fill_bytes(chunk);
    });
}

fn fill_random(bytes: &mut [u8], seed: u64) {
    fill_random_at(bytes, seed, 0);
}

/// The data set's file: written with random frames, removed when dropped.
struct DatasetFile {
    path: PathBuf,
}

impl DatasetFile {
    /// Writes `options.frames` random frames to a new file in `options.dir` (or the temp dir).
    fn write(options: &DatasetOptions, seed: u64) -> Result<DatasetFile> {
        use std::io::Write as _;
        let dir = options.dir.clone().unwrap_or_else(std::env::temp_dir);
        let path = dir.join(format!("hetmem-dataset-{}-{seed:x}.rgb", std::process::id()));
        let io = |context: String| move |source| Error::Io { context, source };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(format!("creating {}", path.display())))?;
        // Removed from here on, whatever fails.
        let dataset = DatasetFile { path };
        let mut writer = std::io::BufWriter::with_capacity(0, file);
        const PART: usize = 64 << 20;
        let mut part = vec![0u8; PART];
        let total = options.dataset_bytes();
        let mut written = 0u64;
        while written < total {
            let len = PART.min((total - written) as usize);
            fill_random_at(&mut part[..len], seed, written);
            writer.write_all(&part[..len]).map_err(io(format!("writing {}", dataset.path.display())))?;
            written += len as u64;
        }
        writer.flush().map_err(io(format!("writing {}", dataset.path.display())))?;
        Ok(dataset)
    }
}

impl Drop for DatasetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_takes_the_first_the_last_and_evenly_between() {
        assert_eq!(sample(500, 3), [0, 249, 499]);
        assert_eq!(sample(5, 5), [0, 1, 2, 3, 4]);
        assert_eq!(sample(1, 3), [0]);
        assert_eq!(sample(2, 5), [0, 1]);
        assert!(sample(7, 0).is_empty());
    }

    /// One bright pixel in a random frame's place spreads as 1 2 1 by 1 2 1 over 16, rounded
    /// half up; at an edge the repeated pixel adds its weight to the one beside it.
    #[test]
    fn the_cpu_blur_spreads_an_impulse_by_the_binomial_weights() {
        let value = fastrand::u32(1..=255);
        let (width, height) = (5, 4);
        let mut frame = vec![0; width * height * PIXEL_BYTES];
        let at = |x: usize, y: usize, channel: usize| (y * width + x) * PIXEL_BYTES + channel;
        frame[at(2, 1, 1)] = value as u8;
        let mut out = vec![POISON; frame.len()];
        blur3_rgb_cpu(&frame, &mut out, width, height);
        for y in 0..height {
            for x in 0..width {
                let weight = |d: usize| match d {
                    0 => 2,
                    1 => 1,
                    _ => 0,
                };
                let want = ((weight(x.abs_diff(2)) * weight(y.abs_diff(1)) * value + 8) >> 4) as u8;
                assert_eq!(out[at(x, y, 1)], want, "({x}, {y})");
                assert_eq!((out[at(x, y, 0)], out[at(x, y, 2)]), (0, 0), "other channels untouched");
            }
        }
        // At the top edge the row above is row 0 again: weight 1 + 2 from rows 0 and (-1 = 0).
        let mut edge = vec![0; frame.len()];
        edge[at(2, 0, 0)] = value as u8;
        blur3_rgb_cpu(&edge, &mut out, width, height);
        assert_eq!(u32::from(out[at(2, 0, 0)]), (3 * 2 * value + 8) >> 4);
    }

    #[test]
    fn random_fills_differ_by_seed_and_agree_in_parts() {
        let mut whole = vec![0; 3 << 20];
        fill_random(&mut whole, 7);
        let mut parts = vec![0; 3 << 20];
        let (first, second) = parts.split_at_mut(1 << 20);
        fill_random_at(first, 7, 0);
        fill_random_at(second, 7, 1 << 20);
        assert!(whole == parts, "a file written in parts holds the bytes of one fill");
        let mut other = vec![0; 3 << 20];
        fill_random(&mut other, 8);
        assert!(whole != other);
        assert!(whole.iter().any(|&byte| byte != whole[0]));
    }

    #[test]
    fn options_that_cannot_be_measured_are_refused_by_name() {
        let options = DatasetOptions { frames: 0, ..DatasetOptions::eight_k() };
        assert!(options.validate().unwrap_err().to_string().contains("frames"));
        let options = DatasetOptions { width: 0, ..DatasetOptions::eight_k() };
        assert!(options.validate().unwrap_err().to_string().contains("0x4320"));
        let options = DatasetOptions {
            dir: Some("/no/such/dir".into()),
            backing: Backing::File,
            ..DatasetOptions::eight_k()
        };
        assert!(options.validate().unwrap_err().to_string().contains("/no/such/dir"));
        assert_eq!(DatasetOptions::eight_k().dataset_bytes(), 500 * 7680 * 4320 * 3);
    }
}
