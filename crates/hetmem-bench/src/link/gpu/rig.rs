//! The rig: streams, events, kernels and the checksum slots, and how the cells queue and time
//! their work on it.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use super::{BLOCK, SLOTS};
use crate::Summary;
use crate::error::{BenchError, Result};
use crate::kernels::BENCH;
use hetmem::backend::cuda::raw::{self, DeviceAlloc};
use hetmem::backend::cuda::{CudaDevice, Event, Kernel, LaunchConfig, Stream};
use hetmem::kernels;
use hetmem::memory::{InFlight, Waiter};

/// Streams, events, kernels and the checksum slots.
pub(super) struct Rig {
    /// The cells' stream. Shared by `Arc` with the [`InFlight`]s holding the memory its work
    /// uses, so it outlives their waits whatever order the fields drop in.
    pub(super) stream: Arc<Stream>,
    /// The downloads of [`LinkPath::PinnedAsyncBoth`](crate::link::LinkPath::PinnedAsyncBoth).
    pub(super) second: Arc<Stream>,
    pub(super) start: Event,
    pub(super) end: Event,
    pub(super) second_end: Event,
    pub(super) read: Kernel,
    pub(super) write: Kernel,
    pub(super) copy: Kernel,
    pub(super) strided: Kernel,
    pub(super) random: Kernel,
    /// Blocks per launch at most: SMs x 8.
    pub(super) blocks: u32,
    /// Blocks per read+write launch at most: SMs / 4 (see [`copy_blocks`]).
    pub(super) copy_blocks: u32,
    pub(super) ordinal: usize,
    pub(super) device: CudaDevice,
    /// One word per repetition, that the read kernels fold their checksums into.
    pub(super) slots: InFlight<DeviceAlloc>,
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
    pub(super) fn new(cuda: &CudaDevice) -> Result<Rig> {
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
            random: kernel("bench_read_random")?,
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
    pub(super) fn hold<T>(&self, value: T) -> InFlight<T> {
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
    pub(super) unsafe fn launch(
        &self,
        kernel: &Kernel,
        items: usize,
        words: &mut [u64],
    ) -> hetmem::Result<()> {
        let max_blocks = if std::ptr::eq(kernel, &self.copy) { self.copy_blocks } else { self.blocks };
        let config = LaunchConfig::linear(items, BLOCK, max_blocks);
        let mut pointers: Vec<*mut c_void> = words.iter_mut().map(|word| (word as *mut u64).cast()).collect();
        // SAFETY: the caller's contract; each pointer points to a live u64 for this call.
        Ok(unsafe { raw::launch(kernel, &self.stream, config, &mut pointers) }?)
    }

    /// The checksum slots, after the stream is idle.
    pub(super) fn slots(&self, count: usize) -> Result<Vec<u32>> {
        let mut words = vec![0u32; count];
        self.slots.download(&self.stream, bytemuck::cast_slice_mut(&mut words))?;
        Ok(words)
    }

    /// Checks that every repetition's checksum slot holds `want`, and clears them.
    pub(super) fn check_slots(&mut self, count: usize, want: u32) -> Result<&'static str> {
        let got = self.slots(count)?;
        self.slots.zero(&self.stream)?;
        match got.iter().position(|&sum| sum != want) {
            None => Ok("kernel XOR checksum equals the CPU's"),
            Some(rep) => Err(BenchError::ResultMismatch {
                what: "the kernel's XOR checksum",
                detail: format!(
                    "repetition {rep}: the kernel read {:#010x}, the CPU computes {want:#010x}",
                    got[rep]
                ),
            }),
        }
    }

    /// The read kernel's checksum of `bytes` at device address `from` into slot `slot`.
    pub(super) fn queue_read(
        &self,
        strided: bool,
        from: u64,
        bytes: usize,
        slot: usize,
    ) -> hetmem::Result<()> {
        if slot >= SLOTS {
            return Err(hetmem::Error::invalid("checksum slot", format!("{slot}: there are {SLOTS}")));
        }
        let out = self.slots.device_ptr() + 4 * slot as u64;
        let (kernel, items) = if strided { (&self.strided, bytes / 4) } else { (&self.read, bytes / 16) };
        // SAFETY: bench_read_u4(const uint4*, u64 n16, u32* out) and bench_read_strided(const
        // u32*, u64 n32, u32* out) read `bytes` at `from` (a mapped or device range of at least
        // that size in the held buffers, per the callers) and XOR into slot `slot` of `slots`
        // (inside it, checked above);
        // both are held until the stream is idle, and callers synchronise it before touching
        // either.
        unsafe { self.launch(kernel, items, &mut [from, items as u64, out]) }
    }

    /// The random-read kernel's checksum of `bytes` at device address `from` into slot `slot`:
    /// `bytes / 16` vectors loaded from places `seed` picks.
    pub(super) fn queue_random_read(
        &self,
        from: u64,
        bytes: usize,
        seed: u32,
        slot: usize,
    ) -> hetmem::Result<()> {
        if slot >= SLOTS {
            return Err(hetmem::Error::invalid("checksum slot", format!("{slot}: there are {SLOTS}")));
        }
        let out = self.slots.device_ptr() + 4 * slot as u64;
        let n16 = (bytes / 16) as u64;
        // SAFETY: bench_read_random(const uint4*, u64 n16, u32 seed, u32* out) loads only
        // vectors below n16 (its index is reduced modulo n16), so it reads inside the `bytes`
        // at `from` (a mapped range of at least that size in the held buffers, per the
        // callers), and XORs into slot `slot` of `slots` (inside it, checked above); both are
        // held until the stream is idle, and callers synchronise it before touching either.
        unsafe { self.launch(&self.random, n16 as usize, &mut [from, n16, seed.into(), out]) }
    }

    /// Times `work(rep)` with device events, after `prepare` (untimed), returning GB/s.
    pub(super) fn timed<E>(
        &self,
        bytes: usize,
        runs: (usize, usize),
        mut prepare: impl FnMut() -> Result<()>,
        mut work: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<Summary>
    where
        BenchError: From<E>,
    {
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
    pub(super) fn timed_cpu<E>(
        bytes: usize,
        runs: (usize, usize),
        mut work: impl FnMut() -> Result<(), E>,
    ) -> Result<Summary>
    where
        BenchError: From<E>,
    {
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

    /// An upload on the first stream and a download on the second at once; GB/s each way.
    pub(super) fn both_ways(
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
}
