//! The GPU cells: copies through the driver and the copy engines, kernels reading and writing
//! host memory directly, and managed memory.
//!
//! Buffers are made once at the largest size; each cell uses a prefix. Outputs are poisoned
//! before each cell, so a check can only pass if the cell's own work wrote them. Each read
//! repetition folds its bytes into its own checksum slot, so every repetition is checked.
//!
//! The cells queue copies and kernels on raw streams by address, outside the hand-off's
//! leases, and any of their `?`s may return while that work is queued. So every piece of
//! memory the work touches is held in an [`InFlight`] naming the rig's streams (the buffers,
//! the checksum slots) from before the first work is queued on it: whatever path drops it
//! waits for the streams first, or leaks it. The waits happen at drop, outside timed regions.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use super::{
    BandwidthCell, Direction, LatencyCell, LatencyPath, LinkOptions, LinkPath, bench_word, cpu_cache,
    doorbell_round_trip, fill_random, first_pattern_mismatch, fresh_seed, xor_checksum,
};
use crate::Summary;
use crate::completion::{self, CompletionReport};
use crate::kernels::BENCH;
use hetmem::backend::Device;
use hetmem::backend::cuda::raw::{self, DeviceAlloc};
use hetmem::backend::cuda::{CudaDevice, Event, Kernel, LaunchConfig, MemLocation, Stream};
use hetmem::error::{Error, Result};
use hetmem::handoff::Queue;
use hetmem::kernels;
use hetmem::memory::{
    HostBuf, InFlight, ManagedBuf, MappedFile, PageBox, PinMethod, PinOptions, RegisterOptions, Waiter,
};

/// Checksum slots: one per repetition of a cell.
const SLOTS: usize = super::MAX_RUNS;
/// What outputs hold before a cell writes them.
const POISON: u32 = 0xA5A5_A5A5;
/// Threads per block of the bench kernels.
const BLOCK: u32 = 512;

/// The GPU cells and the completion signals.
pub(super) struct Measured {
    pub(super) bandwidth: Vec<BandwidthCell>,
    pub(super) latency: Vec<LatencyCell>,
    pub(super) completion: Option<CompletionReport>,
}

/// Streams, events, kernels and the checksum slots.
struct Rig {
    /// The cells' stream. Shared by `Arc` with the [`InFlight`]s holding the memory its work
    /// uses, so it outlives their waits whatever order the fields drop in.
    stream: Arc<Stream>,
    /// The downloads of [`LinkPath::PinnedAsyncBoth`].
    second: Arc<Stream>,
    start: Event,
    end: Event,
    second_end: Event,
    read: Kernel,
    write: Kernel,
    copy: Kernel,
    strided: Kernel,
    /// Blocks per launch at most: SMs x 8.
    blocks: u32,
    /// Blocks per read+write launch at most: SMs / 4 (see [`copy_blocks`]).
    copy_blocks: u32,
    ordinal: usize,
    device: CudaDevice,
    /// One word per repetition, that the read kernels fold their checksums into.
    slots: InFlight<DeviceAlloc>,
}

/// The most blocks of a read+write launch: a quarter of the SMs' worth (33 on the H200), so one
/// pass of the grid moves about 256 KiB each way. A grid that covers the buffer in one pass
/// (SMs x 8 blocks cover 4 MiB) issues every read before any write, so the two directions take
/// turns instead of overlapping; a small grid loops, and each wave's reads overlap the last
/// wave's writes, while 256 KiB in flight still covers the link's latency. On the H200 machine
/// (scripts/probes/zero_copy_shape.py, 2026-11-30) this took 4 MiB from 25.9 to 37.4 GB/s each
/// way and 8 MiB from 32.0 to 38.5, with 64 MiB unchanged at 41; more loads in flight per
/// thread did not help.
fn copy_blocks(multiprocessors: u32) -> u32 {
    (multiprocessors / 4).max(1)
}

/// Every buffer the cells use, each at the largest size.
struct Buffers {
    /// Pinned, mapped, random: the source of uploads and zero-copy reads.
    src: HostBuf<u32>,
    /// Pinned, mapped: the destination of downloads and zero-copy writes.
    dst: HostBuf<u32>,
    /// Plain memory, random: the source of pageable uploads.
    pageable: Vec<u32>,
    /// Plain memory: the destination of pageable downloads.
    pageable_out: Vec<u32>,
    /// Device memory: the destination of uploads.
    dev_in: DeviceAlloc,
    /// Device memory holding `bench_word(i, dev_seed)`: the source of downloads.
    dev_out: DeviceAlloc,
    dev_seed: u32,
    /// Memory of the process, registered mapped, random.
    registered: HostBuf<u32>,
    /// A temporary file of random data, mapped read-only and registered read-only.
    file: MappedFile<u32>,
    /// Managed memory, random.
    managed: ManagedBuf<u32>,
}

pub(super) fn measure(device: &Device, cuda: &CudaDevice, options: &LinkOptions) -> Result<Measured> {
    let mut rig = Rig::new(cuda)?;
    let largest = buffer_bytes(options);
    // Every `?` below may leave work queued on the rig's streams: dropping `buffers` waits for it.
    let mut buffers = Buffers::new(device, &rig, largest)?;
    let mut bandwidth = Vec::new();
    for &bytes in &options.sizes {
        for &path in &LinkPath::ALL {
            let ceiling = matches!(path, LinkPath::PinnedAsyncH2d | LinkPath::PinnedAsyncD2h);
            if path.needs_gpu() && (options.paths.contains(&path) || ceiling) {
                let (gb_s, verified_by) = rig
                    .bandwidth(&mut buffers, path, bytes, options)
                    .map_err(|error| in_cell(error, path.name(), bytes))?;
                bandwidth.push(BandwidthCell {
                    path,
                    direction: path.direction(),
                    bytes,
                    gb_s,
                    ratio_to_ceiling: None,
                    verified_by,
                });
            }
        }
    }
    let mut latency = Vec::new();
    for &bytes in &options.latency_sizes {
        for path in [
            LatencyPath::PageableSyncH2d,
            LatencyPath::PinnedSyncH2d,
            LatencyPath::PinnedSyncD2h,
            LatencyPath::PinnedAsyncH2d,
            LatencyPath::PinnedAsyncD2h,
            LatencyPath::ZeroCopyKernelRead,
            LatencyPath::FileKernelRead,
        ] {
            let us = rig
                .latency(&mut buffers, path, bytes, options.latency_samples)
                .map_err(|error| in_cell(error, path.name(), bytes))?;
            let note = matches!(path, LatencyPath::ZeroCopyKernelRead | LatencyPath::FileKernelRead)
                .then(|| "includes the kernel launch and the stream synchronisation".to_string());
            latency.push(LatencyCell { path, bytes, us: Some(us), note });
        }
    }
    // Waits for the rig's streams (idle by now) before freeing: outside every timed region.
    drop(buffers);
    let completion = if options.latency_sizes.is_empty() || !options.completion {
        None
    } else {
        let queue = Queue::new(device)?;
        let report = completion::measure(&queue, options.latency_samples)?;
        let round_trip = report.rows.first().map(|row| row.go_to_known_us);
        latency.push(LatencyCell {
            path: LatencyPath::MappedFlagRoundTrip,
            bytes: 4,
            us: round_trip,
            note: Some("CPU write seen by a waiting kernel, its answer seen by the CPU".to_string()),
        });
        let doorbell = doorbell_round_trip(device, options.latency_samples)?;
        latency.push(LatencyCell {
            path: LatencyPath::Doorbell,
            bytes: 64,
            note: Some("a 64-byte request served by a persistent kernel, reply read by the CPU".into()),
            us: doorbell,
        });
        Some(report)
    };
    Ok(Measured { bandwidth, latency, completion })
}

/// The size every buffer is made at: enough for the largest bandwidth cell and the largest
/// latency transfer (read by the kernels in whole 16-byte vectors). Latency sizes may exceed
/// every bandwidth size (`--sizes 4KiB --latency-sizes 64KiB`); buffers made at the bandwidth
/// size alone once let those transfers run past them on the GPU.
fn buffer_bytes(options: &LinkOptions) -> usize {
    let bandwidth = options.sizes.iter().copied().max().expect("validated: at least one size");
    let latency = options.latency_sizes.iter().map(|&bytes| bytes.next_multiple_of(super::MIN_SIZE)).max();
    bandwidth.max(latency.unwrap_or(0))
}

fn in_cell(error: Error, path: &'static str, bytes: usize) -> Error {
    Error::BenchCellFailed { path, bytes, source: Box::new(error) }
}

impl Buffers {
    /// Every buffer, held for the rig's streams before any work is queued on it.
    fn new(device: &Device, rig: &Rig, largest: usize) -> Result<InFlight<Buffers>> {
        let cuda = device.as_cuda().expect("GPU cells run on a GPU");
        let words = largest / 4;
        let pinned = PinOptions { mapped: true, method: PinMethod::HostAlloc, ..PinOptions::default() };
        let mut src = HostBuf::<u32>::pinned(device, words, pinned)?;
        fill_random(src.as_mut_slice(), fresh_seed());
        let dst = HostBuf::<u32>::pinned(device, words, pinned)?;
        let mut pageable = vec![0u32; words];
        fill_random(&mut pageable, fresh_seed());
        let pageable_out = vec![POISON; words];
        let dev_in = DeviceAlloc::new(cuda, largest)?;
        let dev_out = DeviceAlloc::new(cuda, largest)?;
        let dev_seed = fresh_seed() as u32;
        let mut registered =
            HostBuf::register(device, PageBox::<u32>::zeroed(words)?, RegisterOptions::default())?;
        fill_random(registered.as_mut_slice(), fresh_seed());
        let file = random_file(device, words)?;
        let mut managed = ManagedBuf::<u32>::new(device, words)?;
        fill_random(managed.as_mut_slice(), fresh_seed());
        let buffers = rig.hold(Buffers {
            src,
            dst,
            pageable,
            pageable_out,
            dev_in,
            dev_out,
            dev_seed,
            registered,
            file,
            managed,
        });
        // SAFETY: bench_write_u4(uint4* dst, u64 n16, u32 seed); dev_out holds `largest` bytes,
        // n16 * 16 of them, and is held in `buffers`, which waits for the stream before freeing
        // it (also if the synchronisation below fails).
        unsafe {
            rig.launch(
                &rig.write,
                words / 4,
                &mut [buffers.dev_out.device_ptr(), (words / 4) as u64, dev_seed.into()],
            )
        }?;
        rig.stream.synchronize()?;
        Ok(buffers)
    }

    /// Evicts the first `words` of every host buffer `path` reads or writes from the CPU's
    /// caches (see [`cpu_cache`]). Managed memory is left alone: where its pages are on the GPU
    /// (after a prefetch or a kernel's faults), touching them from the CPU, even to flush
    /// them, would move them back; so the managed cells still see what the previous check left.
    fn evict_from_cpu_caches(&self, path: LinkPath, words: usize) {
        let (src, dst) = (&self.src.as_slice()[..words], &self.dst.as_slice()[..words]);
        let used: &[&[u32]] = match path {
            LinkPath::PageableH2d => &[&self.pageable[..words]],
            LinkPath::PageableD2h => &[&self.pageable_out[..words]],
            LinkPath::PinnedSyncH2d
            | LinkPath::PinnedAsyncH2d
            | LinkPath::ZeroCopyRead
            | LinkPath::ZeroCopyReadStrided => &[src],
            LinkPath::PinnedSyncD2h | LinkPath::PinnedAsyncD2h | LinkPath::ZeroCopyWrite => &[dst],
            LinkPath::PinnedAsyncBoth | LinkPath::ZeroCopyReadWrite => &[src, dst],
            LinkPath::RegisteredVecRead => &[&self.registered.as_slice()[..words]],
            LinkPath::RegisteredFileRead => &[&self.file.as_slice()[..words]],
            LinkPath::HostMemcpy
            | LinkPath::ManagedRead
            | LinkPath::ManagedPrefetchRead
            | LinkPath::DeviceRead => &[],
        };
        for buffer in used {
            cpu_cache::flush(bytemuck::cast_slice(buffer));
        }
    }
}

/// `words` random words in a fresh temporary file, mapped and registered read-only; the file is
/// unlinked at once (the mapping keeps its pages), and read once by the CPU so the page cache is
/// hot.
fn random_file(device: &Device, words: usize) -> Result<MappedFile<u32>> {
    let path =
        std::env::temp_dir().join(format!("hetmem-bench-{}-{:x}.bin", std::process::id(), fresh_seed()));
    let mut data = vec![0u32; words];
    fill_random(&mut data, fresh_seed());
    std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&data))
        .map_err(|source| Error::Io { context: format!("writing {}", path.display()), source })?;
    drop(data);
    // SAFETY: the file is this process's own, just written under a unique name and unlinked
    // below, right after mapping: nothing truncates or modifies it while it is mapped.
    let file = unsafe { MappedFile::<u32>::open(device, &path) };
    let _ = std::fs::remove_file(&path);
    let file = file?;
    std::hint::black_box(xor_checksum(file.as_slice()));
    Ok(file)
}

/// Everything the rig's work is queued on: its two streams, and the legacy default stream of
/// the driver's synchronous copies (a pageable upload may still be writing when it returns).
fn waiters(stream: &Arc<Stream>, second: &Arc<Stream>, cuda: &CudaDevice) -> [Waiter; 3] {
    [
        Waiter::Stream(Arc::clone(stream)),
        Waiter::Stream(Arc::clone(second)),
        Waiter::DefaultStream(cuda.clone()),
    ]
}

impl Rig {
    fn new(cuda: &CudaDevice) -> Result<Rig> {
        let kernel = |entry| kernels::kernel(cuda, &BENCH, entry);
        let stream = Arc::new(Stream::new(cuda)?);
        let second = Arc::new(Stream::new(cuda)?);
        let mut slots = InFlight::new(DeviceAlloc::new(cuda, SLOTS * 4)?, waiters(&stream, &second, cuda));
        slots.zero(&stream)?;
        Ok(Rig {
            second,
            start: Event::new(cuda, true)?,
            end: Event::new(cuda, true)?,
            second_end: Event::new(cuda, true)?,
            read: kernel("bench_read_u4")?,
            write: kernel("bench_write_u4")?,
            copy: kernel("bench_copy_u4")?,
            strided: kernel("bench_read_strided")?,
            blocks: cuda.attributes().multiprocessor_count.max(1) * 8,
            copy_blocks: copy_blocks(cuda.attributes().multiprocessor_count),
            ordinal: cuda.ordinal(),
            device: cuda.clone(),
            slots,
            stream,
        })
    }

    /// `value`, freed only once the work queued on the rig's streams (and the driver's
    /// synchronous copies) has finished: how the rig holds memory its work uses.
    fn hold<T>(&self, value: T) -> InFlight<T> {
        InFlight::new(value, waiters(&self.stream, &self.second, &self.device))
    }

    /// Queues `kernel` on the first stream over `items` work items, with one 64-bit word per
    /// parameter (pointers, counts, and 32-bit values in the low half).
    ///
    /// # Safety
    /// `words` must match the kernel's parameters in number and order; every address in it must
    /// be device-accessible memory, large enough for `items`, held by [`Rig::hold`] (so that no
    /// path frees it before the stream is idle), and not accessed by the CPU until the stream
    /// is synchronised.
    unsafe fn launch(&self, kernel: &Kernel, items: usize, words: &mut [u64]) -> Result<()> {
        let max_blocks = if std::ptr::eq(kernel, &self.copy) { self.copy_blocks } else { self.blocks };
        let config = LaunchConfig::linear(items, BLOCK, max_blocks);
        let mut pointers: Vec<*mut c_void> = words.iter_mut().map(|word| (word as *mut u64).cast()).collect();
        // SAFETY: the caller's contract; each pointer points to a live u64 for this call.
        Ok(unsafe { raw::launch(kernel, &self.stream, config, &mut pointers) }?)
    }

    /// The checksum slots, after the stream is idle.
    fn slots(&self, count: usize) -> Result<Vec<u32>> {
        let mut words = vec![0u32; count];
        self.slots.download(&self.stream, bytemuck::cast_slice_mut(&mut words))?;
        Ok(words)
    }

    /// Checks that every repetition's checksum slot holds `want`, and clears them.
    fn check_slots(&mut self, count: usize, want: u32) -> Result<&'static str> {
        let got = self.slots(count)?;
        self.slots.zero(&self.stream)?;
        match got.iter().position(|&sum| sum != want) {
            None => Ok("kernel XOR checksum equals the CPU's"),
            Some(rep) => Err(Error::ResultMismatch {
                what: "the kernel's XOR checksum",
                detail: format!(
                    "repetition {rep}: the kernel read {:#010x}, the CPU computes {want:#010x}",
                    got[rep]
                ),
            }),
        }
    }

    /// The read kernel's checksum of `bytes` at device address `from` into slot `slot`.
    fn queue_read(&self, strided: bool, from: u64, bytes: usize, slot: usize) -> Result<()> {
        let out = self.slots.device_ptr() + 4 * slot as u64;
        let (kernel, items) = if strided { (&self.strided, bytes / 4) } else { (&self.read, bytes / 16) };
        // SAFETY: bench_read_u4(const uint4*, u64 n16, u32* out) and bench_read_strided(const
        // u32*, u64 n32, u32* out) read `bytes` at `from` (a mapped or device range of at least
        // that size in the held buffers, per the callers) and XOR into one slot inside `slots`;
        // both are held until the stream is idle, and callers synchronise it before touching
        // either.
        unsafe { self.launch(kernel, items, &mut [from, items as u64, out]) }
    }

    /// Times `work(rep)` with device events, after `prepare` (untimed), returning GB/s.
    fn timed(
        &self,
        bytes: usize,
        runs: (usize, usize),
        mut prepare: impl FnMut() -> Result<()>,
        mut work: impl FnMut(usize) -> Result<()>,
    ) -> Result<Summary> {
        let (warm_up, repeats) = runs;
        let mut rates = Vec::with_capacity(repeats);
        for rep in 0..warm_up + repeats {
            prepare()?;
            self.start.record(&self.stream)?;
            work(rep)?;
            self.end.record(&self.stream)?;
            self.end.synchronize()?;
            let seconds = f64::from(self.end.elapsed_ms_since(&self.start)?) / 1e3;
            if rep >= warm_up {
                rates.push(bytes as f64 / seconds / 1e9);
            }
        }
        Ok(Summary::of(&rates).expect("at least one repeat"))
    }

    /// Times `work()` with the CPU clock (synchronous copies), returning GB/s.
    fn timed_cpu(
        bytes: usize,
        runs: (usize, usize),
        mut work: impl FnMut() -> Result<()>,
    ) -> Result<Summary> {
        let (warm_up, repeats) = runs;
        let mut rates = Vec::with_capacity(repeats);
        for rep in 0..warm_up + repeats {
            let start = Instant::now();
            work()?;
            if rep >= warm_up {
                rates.push(bytes as f64 / start.elapsed().as_secs_f64() / 1e9);
            }
        }
        Ok(Summary::of(&rates).expect("at least one repeat"))
    }

    /// One bandwidth cell. The buffers come held by [`Rig::hold`]: the work queued on them
    /// before any early return is waited for when they drop.
    fn bandwidth(
        &mut self,
        held: &mut InFlight<Buffers>,
        path: LinkPath,
        bytes: usize,
        options: &LinkOptions,
    ) -> Result<(Summary, &'static str)> {
        let b: &mut Buffers = held;
        let words = bytes / 4;
        let runs = (options.warm_up, options.repeats_at(bytes));
        let count = runs.0 + runs.1;
        let src_host = b.src.as_slice().as_ptr() as u64;
        let src_mapped = b.src.device_ptr().expect("mapped");
        let dst_host = b.dst.as_mut_slice().as_mut_ptr() as u64;
        let dst_mapped = b.dst.device_ptr().expect("mapped");
        let (dev_in, dev_out) = (b.dev_in.device_ptr(), b.dev_out.device_ptr());
        if matches!(path.direction(), Direction::D2h | Direction::Both) {
            b.dst.as_mut_slice()[..words].fill(POISON);
        }
        if path == LinkPath::PageableD2h {
            b.pageable_out[..words].fill(POISON);
        }
        if options.cold_cpu_cache {
            b.evict_from_cpu_caches(path, words);
        }
        if matches!(
            path,
            LinkPath::PageableH2d
                | LinkPath::PinnedSyncH2d
                | LinkPath::PinnedAsyncH2d
                | LinkPath::PinnedAsyncBoth
        ) {
            b.dev_in.zero(&self.stream)?;
        }
        let summary = match path {
            LinkPath::HostMemcpy => unreachable!("host cells are measured by the host module"),
            LinkPath::PageableH2d => {
                let (dev, src) = (&mut b.dev_in, &b.pageable[..words]);
                Rig::timed_cpu(bytes, runs, || Ok(dev.upload_sync(bytemuck::cast_slice(src))?))?
            }
            LinkPath::PinnedSyncH2d => {
                let (dev, src) = (&mut b.dev_in, &b.src.as_slice()[..words]);
                Rig::timed_cpu(bytes, runs, || Ok(dev.upload_sync(bytemuck::cast_slice(src))?))?
            }
            LinkPath::PageableD2h => {
                let (dev, dst) = (&b.dev_out, &mut b.pageable_out[..words]);
                Rig::timed_cpu(bytes, runs, || Ok(dev.download_sync(bytemuck::cast_slice_mut(dst))?))?
            }
            LinkPath::PinnedSyncD2h => {
                let (dev, dst) = (&b.dev_out, &mut b.dst.as_mut_slice()[..words]);
                Rig::timed_cpu(bytes, runs, || Ok(dev.download_sync(bytemuck::cast_slice_mut(dst))?))?
            }
            LinkPath::PinnedAsyncH2d => self.timed(
                bytes,
                runs,
                || Ok(()),
                |_| {
                    // SAFETY: `bytes` of pinned `src` into `dev_in`, both at least `largest` long and
                    // held until the stream is idle; the CPU does not touch them before `timed`
                    // synchronises it.
                    Ok(unsafe { raw::copy_async(&self.stream, dev_in, src_host, bytes) }?)
                },
            )?,
            LinkPath::PinnedAsyncD2h => self.timed(
                bytes,
                runs,
                || Ok(()),
                |_| {
                    // SAFETY: as above, `dev_out` into pinned `dst`.
                    Ok(unsafe { raw::copy_async(&self.stream, dst_host, dev_out, bytes) }?)
                },
            )?,
            LinkPath::PinnedAsyncBoth => {
                self.both_ways(bytes, runs, (dev_in, src_host), (dst_host, dev_out))?
            }
            LinkPath::ZeroCopyRead | LinkPath::ZeroCopyReadStrided => {
                let strided = path == LinkPath::ZeroCopyReadStrided;
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(strided, src_mapped, bytes, rep))?
            }
            LinkPath::RegisteredVecRead => {
                let from = b.registered.device_ptr().expect("registered mapped");
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(false, from, bytes, rep))?
            }
            LinkPath::RegisteredFileRead => {
                let from = b.file.device_ptr().expect("registered mapped");
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(false, from, bytes, rep))?
            }
            LinkPath::ManagedRead | LinkPath::ManagedPrefetchRead => {
                let alloc = b.managed.managed_alloc().expect("a GPU allocation");
                let ordinal = self.ordinal;
                let prefetch = path == LinkPath::ManagedPrefetchRead;
                // Only the measured bytes move: the buffer is as large as the largest cell, and
                // prefetching all of it made every smaller cell time a 1 GiB migration.
                let to_host = || {
                    alloc.prefetch_range(&self.stream, MemLocation::Host, 0, bytes)?;
                    Ok(self.stream.synchronize()?)
                };
                self.timed(bytes, runs, to_host, |rep| {
                    if prefetch {
                        alloc.prefetch_range(&self.stream, MemLocation::Device(ordinal), 0, bytes)?;
                    }
                    self.queue_read(false, alloc.ptr(), bytes, rep)
                })?
            }
            LinkPath::DeviceRead => {
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(false, dev_out, bytes, rep))?
            }
            LinkPath::ZeroCopyWrite => {
                let seed = b.dev_seed ^ 0x5A5A_0001;
                let n16 = bytes / 16;
                let summary = self.timed(
                    bytes,
                    runs,
                    || Ok(()),
                    |_| {
                        // SAFETY: bench_write_u4(uint4*, u64 n16, u32 seed) writes n16 * 16 = `bytes`
                        // of mapped `dst`, held until the stream is idle; the CPU does not touch it
                        // before `timed` synchronises it.
                        unsafe { self.launch(&self.write, n16, &mut [dst_mapped, n16 as u64, seed.into()]) }
                    },
                )?;
                self.stream.synchronize()?;
                return Ok((summary, check_pattern(&b.dst.as_slice()[..words], seed)?));
            }
            LinkPath::ZeroCopyReadWrite => {
                let key = fresh_seed() as u32 | 1;
                let n16 = bytes / 16;
                let summary = self.timed(
                    bytes,
                    runs,
                    || Ok(()),
                    |_| {
                        // SAFETY: bench_copy_u4(const uint4*, uint4*, u64 n16, u32 key) reads `bytes`
                        // of mapped `src` and writes `bytes` of mapped `dst` (separate buffers), both
                        // held until the stream is idle and untouched by the CPU before `timed`
                        // synchronises it.
                        unsafe {
                            self.launch(
                                &self.copy,
                                n16,
                                &mut [src_mapped, dst_mapped, n16 as u64, key.into()],
                            )
                        }
                    },
                )?;
                self.stream.synchronize()?;
                let (src, dst) = (&b.src.as_slice()[..words], &b.dst.as_slice()[..words]);
                return match src.iter().zip(dst).position(|(&s, &d)| d != s ^ key) {
                    None => Ok((summary, "every output word equals input ^ key")),
                    Some(at) => Err(Error::ResultMismatch {
                        what: "the zero-copy read+write output",
                        detail: format!("word {at} is wrong"),
                    }),
                };
            }
        };
        // The synchronous copies run on the legacy default stream, which a non-blocking stream
        // does not wait for (and a pageable upload may still be in flight when it returns), so
        // the whole device is idle before the check reads the result.
        self.device.synchronize()?;
        let verified_by = match path {
            LinkPath::PageableH2d | LinkPath::PinnedSyncH2d | LinkPath::PinnedAsyncH2d => {
                let source = if path == LinkPath::PageableH2d {
                    &b.pageable[..words]
                } else {
                    &b.src.as_slice()[..words]
                };
                self.queue_read(false, dev_in, bytes, 0)?;
                self.stream.synchronize()?;
                self.check_slots(1, xor_checksum(source))
                    .map(|_| "the device copy's XOR checksum equals the CPU's")?
            }
            LinkPath::PageableD2h => check_pattern(&b.pageable_out[..words], b.dev_seed)?,
            LinkPath::PinnedSyncD2h | LinkPath::PinnedAsyncD2h => {
                check_pattern(&b.dst.as_slice()[..words], b.dev_seed)?
            }
            LinkPath::PinnedAsyncBoth => {
                check_pattern(&b.dst.as_slice()[..words], b.dev_seed)?;
                self.queue_read(false, dev_in, bytes, 0)?;
                self.stream.synchronize()?;
                self.check_slots(1, xor_checksum(&b.src.as_slice()[..words]))?;
                "both copies checked against the CPU"
            }
            LinkPath::ZeroCopyRead | LinkPath::ZeroCopyReadStrided => {
                self.check_slots(count, xor_checksum(&b.src.as_slice()[..words]))?
            }
            LinkPath::RegisteredVecRead => {
                self.check_slots(count, xor_checksum(&b.registered.as_slice()[..words]))?
            }
            LinkPath::RegisteredFileRead => {
                self.check_slots(count, xor_checksum(&b.file.as_slice()[..words]))?
            }
            LinkPath::ManagedRead | LinkPath::ManagedPrefetchRead => {
                self.check_slots(count, xor_checksum(&b.managed.as_slice()[..words]))?
            }
            LinkPath::DeviceRead => {
                use rayon::prelude::*;
                let seed = b.dev_seed;
                let want =
                    (0..words as u64).into_par_iter().map(|i| bench_word(i, seed)).reduce(|| 0, |a, b| a ^ b);
                self.check_slots(count, want)?
            }
            LinkPath::HostMemcpy | LinkPath::ZeroCopyWrite | LinkPath::ZeroCopyReadWrite => {
                unreachable!("returned above")
            }
        };
        Ok((summary, verified_by))
    }

    /// An upload on the first stream and a download on the second at once; GB/s each way.
    fn both_ways(
        &self,
        bytes: usize,
        runs: (usize, usize),
        upload: (u64, u64),
        download: (u64, u64),
    ) -> Result<Summary> {
        let (warm_up, repeats) = runs;
        let mut rates = Vec::with_capacity(repeats);
        for rep in 0..warm_up + repeats {
            self.start.record(&self.stream)?;
            self.second.wait_event(&self.start)?;
            // SAFETY: `bytes` of pinned `src` into `dev_in` and of `dev_out` into pinned `dst`:
            // four distinct buffers at least `bytes` long, held (by the caller's `Buffers`) until
            // both streams are idle; the CPU does not touch them before both are synchronised
            // below.
            unsafe {
                raw::copy_async(&self.stream, upload.0, upload.1, bytes)?;
                raw::copy_async(&self.second, download.0, download.1, bytes)?;
            }
            self.end.record(&self.stream)?;
            self.second_end.record(&self.second)?;
            self.end.synchronize()?;
            self.second_end.synchronize()?;
            let ms =
                self.end.elapsed_ms_since(&self.start)?.max(self.second_end.elapsed_ms_since(&self.start)?);
            if rep >= warm_up {
                rates.push(bytes as f64 / (f64::from(ms) / 1e3) / 1e9);
            }
        }
        Ok(Summary::of(&rates).expect("at least one repeat"))
    }

    /// Microseconds per small transfer by `path`, `samples` times after as many warm-ups.
    fn latency(
        &mut self,
        held: &mut InFlight<Buffers>,
        path: LatencyPath,
        bytes: usize,
        samples: usize,
    ) -> Result<Summary> {
        let b: &mut Buffers = held;
        let words = bytes.div_ceil(4);
        // The kernels read whole 16-byte vectors; the buffers are at least 4 KiB long.
        let read_bytes = bytes.div_ceil(16) * 16;
        let mut times = Vec::with_capacity(samples);
        for sample in 0..2 * samples {
            let start = Instant::now();
            match path {
                LatencyPath::PageableSyncH2d => {
                    b.dev_in.upload_sync(bytemuck::cast_slice(&b.pageable[..words]))?;
                }
                LatencyPath::PinnedSyncH2d => {
                    b.dev_in.upload_sync(bytemuck::cast_slice(&b.src.as_slice()[..words]))?
                }
                LatencyPath::PinnedSyncD2h => {
                    b.dev_out.download_sync(bytemuck::cast_slice_mut(&mut b.dst.as_mut_slice()[..words]))?;
                }
                LatencyPath::PinnedAsyncH2d => {
                    // SAFETY: `bytes` of pinned `src` into `dev_in`, both held until the stream is
                    // idle and synchronised before the next statement; neither is touched by the
                    // CPU meanwhile.
                    unsafe {
                        raw::copy_async(
                            &self.stream,
                            b.dev_in.device_ptr(),
                            b.src.as_slice().as_ptr() as u64,
                            bytes,
                        )
                    }?;
                    self.stream.synchronize()?;
                }
                LatencyPath::PinnedAsyncD2h => {
                    let dst = b.dst.as_mut_slice().as_mut_ptr() as u64;
                    // SAFETY: as above, `dev_out` into pinned `dst`.
                    unsafe { raw::copy_async(&self.stream, dst, b.dev_out.device_ptr(), bytes) }?;
                    self.stream.synchronize()?;
                }
                LatencyPath::ZeroCopyKernelRead => {
                    self.queue_read(false, b.src.device_ptr().expect("mapped"), read_bytes, 0)?;
                    self.stream.synchronize()?;
                }
                LatencyPath::FileKernelRead => {
                    self.queue_read(false, b.file.device_ptr().expect("registered"), read_bytes, 0)?;
                    self.stream.synchronize()?;
                }
                other => unreachable!("{other:?} is not measured here"),
            }
            let micros = start.elapsed().as_secs_f64() * 1e6;
            if sample >= samples {
                times.push(micros);
            }
            if matches!(path, LatencyPath::ZeroCopyKernelRead | LatencyPath::FileKernelRead) {
                let source =
                    if path == LatencyPath::FileKernelRead { b.file.as_slice() } else { b.src.as_slice() };
                self.check_slots(1, xor_checksum(&source[..read_bytes / 4]))?;
            }
        }
        Ok(Summary::of(&times).expect("at least one sample"))
    }
}

/// Checks that `words` hold `bench_word(i, seed)`.
fn check_pattern(words: &[u32], seed: u32) -> Result<&'static str> {
    match first_pattern_mismatch(words, seed) {
        None => Ok("every word equals the pattern the CPU computes"),
        Some(at) => Err(Error::ResultMismatch {
            what: "the written data",
            detail: format!(
                "word {at} is {:#010x}, expected {:#010x}",
                words[at],
                bench_word(at as u64, seed)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_word_voids_the_measurement_by_variant() {
        let seed = 0x5EED;
        let mut words: Vec<u32> = (0..1024).map(|i| bench_word(i, seed)).collect();
        assert!(check_pattern(&words, seed).is_ok());
        words[700] ^= 1;
        match check_pattern(&words, seed) {
            Err(Error::ResultMismatch { what: "the written data", detail }) => {
                assert!(detail.starts_with("word 700 is"), "{detail}")
            }
            other => panic!("expected Error::ResultMismatch, got {other:?}"),
        }
    }

    #[test]
    fn a_failed_cell_keeps_its_cause() {
        let short = hetmem::error::CudaError {
            call: "cuMemAlloc",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        };
        let error = in_cell(short.into(), "pinned_async_h2d", 1 << 30);
        assert!(
            matches!(&error, Error::BenchCellFailed { path: "pinned_async_h2d", bytes, .. } if *bytes == 1 << 30),
            "{error:?}"
        );
        assert!(error.is_transient(), "a shortage in a cell may pass, as it would alone");
        assert!(error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"), "{error}");
    }

    #[test]
    fn buffers_hold_the_largest_transfer_of_either_kind() {
        let mut options = LinkOptions::quick();
        options.sizes = vec![4 << 10];
        options.latency_sizes = vec![4, 64 << 10];
        assert_eq!(buffer_bytes(&options), 64 << 10);
        options.latency_sizes = vec![4];
        assert_eq!(buffer_bytes(&options), 4 << 10);
        options.latency_sizes = vec![];
        options.sizes = vec![4 << 10, 1 << 20];
        assert_eq!(buffer_bytes(&options), 1 << 20);
    }
}
