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
//! Then a sparse pass ([`sparse`]): a kernel that touches 5% of the set's bytes, reading them
//! in place against copying the whole set into device memory first, within a device budget
//! ([`DatasetOptions::device_budget`]) that the set may exceed.
//!
//! Frames are taken at offsets into one whole-data-set buffer because hetmem's leases cover
//! whole buffers today: range leases (a lease over frame k alone) and mapped-file windows
//! (map and register only the frames in flight, for files larger than RAM or the pinning
//! limit) would replace the kernel's offset argument and the whole-file registration.

use std::path::PathBuf;
use std::time::Instant;

use hetmem::backend::cuda::CudaDevice;
use hetmem::error::{Error, Result};
use hetmem::kernels::KernelSource;
use hetmem::{Buffer, Device, HostBuf, MappedFile, PinOptions, Queue, memory::HostVisible};

use crate::random::fresh_seed;

mod blur;
mod contents;
mod runner;
pub mod sparse;

pub use blur::blur3_rgb_cpu;
use contents::{DatasetFile, fill_random};
use runner::Runner;

/// The blur of the data set's frames.
pub static DATASET: KernelSource = KernelSource {
    name: "dataset",
    source: include_str!("../../kernels/dataset.cu"),
    ptx: Some(include_str!("../../kernels/ptx/dataset.ptx")),
    entry_points: &["dataset_blur3_rgb", "dataset_sparse_xor"],
    options: &[],
};

/// The default data set: 500 frames of 7680 x 4320 RGB, 49.8 GB.
pub const DEFAULT_FRAMES: usize = 500;
/// The default frame size: 8K.
pub const DEFAULT_SIZE: (usize, usize) = (7680, 4320);
/// Bytes per pixel: interleaved 8-bit R, G, B.
const PIXEL_BYTES: usize = 3;
/// The pixels each of the kernel's blocks blurs: 128 x 32 (`TILE_W`, `TILE_H` in the source).
const TILE: (u32, u32) = (128, 32);
/// The most blocks a CUDA grid has along y.
const GRID_Y_MAX: usize = 65_535;
/// The kernel's threads per block: one per column of the tile, 4 rows of them (each thread
/// blurs every 4th row of its column).
const BLOCK: (u32, u32) = (128, 4);

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
    /// Device memory the copying methods may hold, in bytes; `None`: what the device has
    /// free (on the CPU backend, the data set's size).
    pub device_budget: Option<u64>,
    /// The sparse pass's chunk, a multiple of 16 bytes: one in every
    /// [`sparse::SPARSE_STRIDE_CHUNKS`] chunks of the set is read.
    pub sparse_chunk: usize,
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
            device_budget: None,
            sparse_chunk: sparse::DEFAULT_SPARSE_CHUNK,
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
    /// sizes or whose rows need more tiles than a grid has along y, a data set whose size overflows, or a file backing whose directory is missing.
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
        // One block per tile, and CUDA's grid has at most 65,535 blocks along y.
        if self.height.div_ceil(TILE.1 as usize) > GRID_Y_MAX {
            return Err(Error::invalid(
                "data set frame",
                format!(
                    "{}x{}: at most {} rows (the kernel's grid has {GRID_Y_MAX} tiles of {} rows along y); \
                     give a shorter frame",
                    self.width,
                    self.height,
                    GRID_Y_MAX * TILE.1 as usize,
                    TILE.1
                ),
            ));
        }
        self.width
            .checked_mul(self.height)
            .and_then(|pixels| pixels.checked_mul(PIXEL_BYTES))
            .and_then(|frame| frame.checked_mul(self.frames))
            .ok_or_else(|| Error::invalid("data set", "its size overflows: fewer or smaller frames"))?;
        if self.sparse_chunk == 0 || !self.sparse_chunk.is_multiple_of(sparse::SPARSE_ALIGN) {
            return Err(Error::invalid(
                "sparse chunk",
                format!("{} bytes: give a multiple of 16 above 0", self.sparse_chunk),
            ));
        }
        self.sparse_chunk
            .checked_mul(sparse::SPARSE_STRIDE_CHUNKS)
            .ok_or_else(|| Error::invalid("sparse chunk", "too large: its stride overflows"))?;
        if let Some(budget) = self.device_budget
            && budget < 2 * self.frame_bytes() as u64
        {
            return Err(Error::invalid(
                "device budget",
                format!(
                    "{budget} bytes: copy-each holds two frames, {} bytes; give at least that",
                    2 * self.frame_bytes()
                ),
            ));
        }
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
    /// Device memory the copying methods were allowed, in bytes.
    pub device_budget_bytes: u64,
    /// The sparse pass, mapped and copy-all.
    pub sparse: Vec<sparse::SparseRun>,
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
    let budget = match (options.device_budget, device.as_cuda()) {
        (Some(budget), _) => budget,
        (None, Some(cuda)) => cuda.memory_info().map(|(free, _)| free)?,
        (None, None) => options.dataset_bytes(),
    };
    let started = Instant::now();
    let ((runs, sparse), setup_seconds) = match options.backing {
        Backing::Host => {
            let pinned = PinOptions { mapped: true, portable: true, ..PinOptions::default() };
            let mut data = HostBuf::<u8>::pinned(device, options.dataset_bytes() as usize, pinned)?;
            fill_random(data.as_mut_slice(), seed);
            let setup = started.elapsed().as_secs_f64();
            (run_methods(device, &queue, data, options, budget)?, setup)
        }
        Backing::File => {
            let file = DatasetFile::write(options, seed)?;
            // SAFETY: the file is this run's own (a fresh name, removed when `file` drops, after
            // the mapping): nothing truncates or modifies it while it is mapped.
            let data = unsafe { MappedFile::<u8>::open(device, &file.path) }?;
            let setup = started.elapsed().as_secs_f64();
            let runs = run_methods(device, &queue, data, options, budget)?;
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
        device_budget_bytes: budget,
        sparse,
    })
}

/// Every method over `data`, shared with the GPU for the whole run (only read), then each
/// method's sample checked; then the sparse pass, within `budget` bytes of device memory.
fn run_methods<B>(
    device: &Device,
    queue: &Queue,
    data: B,
    options: &DatasetOptions,
    budget: u64,
) -> Result<(Vec<MethodRun>, Vec<sparse::SparseRun>)>
where
    B: HostVisible + Buffer<Elem = u8>,
{
    let data = queue.share(data);
    let runner = Runner::new(device, queue, options)?;
    let runs = [Method::Mapped, Method::CopyEach]
        .into_iter()
        .map(|method| runner.run(method, &data))
        .collect::<Result<Vec<_>>>()?;
    let sparse = sparse::run(device, queue, &data, options, budget)?;
    data.reclaim()?;
    Ok((runs, sparse))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The grid's y limit: 65,535 tiles of 32 rows.
        let tallest =
            DatasetOptions { frames: 1, width: 1, height: 65_535 * 32, ..DatasetOptions::eight_k() };
        assert!(tallest.validate().is_ok());
        let taller = DatasetOptions { height: 65_535 * 32 + 1, ..tallest };
        let error = taller.validate().unwrap_err().to_string();
        assert!(error.contains("at most 2097120 rows") && error.contains("shorter frame"), "{error}");
    }
}
