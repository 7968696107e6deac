//! What pinning host memory costs, by method and size, what the CPU pays to touch pinned and
//! write-combined memory, and how fast the pinned pool hands out a buffer again.

use std::hint::black_box;
use std::time::Instant;

use super::Summary;
use hetmem::backend::Device;
use hetmem::backend::cuda::raw::{HostAllocFlags, PinnedAlloc};
use hetmem::error::{Error, Result};
use hetmem::memory::{HostBuf, PageBox, PinMethod, PinOptions, PinnedPool, RegisterOptions};

/// A way to get pinned memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// `cuMemHostAlloc` alone (mapped), the memory untouched.
    DriverAlloc,
    /// `HostBuf::pinned` with `PinMethod::HostAlloc`: `cuMemHostAlloc`, then zeroed.
    HostBufHostAlloc,
    /// `HostBuf::pinned` with `PinMethod::Register`: fresh huge-page memory registered
    /// (the registration faults the pages in).
    HostBufRegister,
    /// Huge-page memory written by the CPU first, then registered.
    TouchThenRegisterHuge,
    /// Base-page memory written by the CPU first, then registered.
    TouchThenRegisterBase,
}

const METHODS: [Method; 5] = [
    Method::DriverAlloc,
    Method::HostBufHostAlloc,
    Method::HostBufRegister,
    Method::TouchThenRegisterHuge,
    Method::TouchThenRegisterBase,
];

/// One method at one size: medians over the repeats.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PinningRow {
    /// The method.
    pub method: Method,
    /// Bytes pinned.
    pub bytes: usize,
    /// Milliseconds until the memory is pinned and usable (median).
    pub setup_ms: f64,
    /// Milliseconds to release it (median).
    pub release_ms: f64,
}

/// CPU bandwidth into and out of pinned memory, ordinary and write-combined.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CpuAccessRow {
    /// `cached` or `write_combined`.
    pub memory: &'static str,
    /// GB/s of one thread writing every byte.
    pub write_gb_s: f64,
    /// GB/s of one thread reading every byte.
    pub read_gb_s: f64,
}

/// The pinning report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PinningReport {
    /// The GPU.
    pub device: String,
    /// Repeats per cell.
    pub repeats: usize,
    /// Setup and release times.
    pub rows: Vec<PinningRow>,
    /// CPU access to pinned memory.
    pub cpu_access: Vec<CpuAccessRow>,
    /// Microseconds for one acquire and release of a 1080p RGB frame from a warm pool.
    pub pool_acquire_us: Summary,
}

/// Measures each method at each size, `repeats` times.
///
/// # Errors
/// No GPU, or pinning failing.
pub fn measure(device: &Device, sizes: &[usize], repeats: usize) -> Result<PinningReport> {
    let cuda = device.as_cuda().ok_or_else(|| Error::NeedsGpu {
        what: "the pinning benchmark".into(),
        detail: "the CPU backend pins nothing".into(),
    })?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let mut setup = vec![Vec::new(); METHODS.len()];
        let mut release = vec![Vec::new(); METHODS.len()];
        for _ in 0..repeats {
            for (index, &method) in METHODS.iter().enumerate() {
                let (made, freed) = time_method(device, method, bytes)?;
                setup[index].push(made);
                release[index].push(freed);
            }
        }
        for (index, &method) in METHODS.iter().enumerate() {
            rows.push(PinningRow {
                method,
                bytes,
                setup_ms: Summary::of(&setup[index]).expect("repeats > 0").median,
                release_ms: Summary::of(&release[index]).expect("repeats > 0").median,
            });
        }
    }
    let cpu_access = vec![
        cpu_access(device, "cached", PinOptions { method: PinMethod::HostAlloc, ..PinOptions::default() })?,
        cpu_access(
            device,
            "write_combined",
            PinOptions { write_combined: true, method: PinMethod::HostAlloc, ..PinOptions::default() },
        )?,
    ];
    Ok(PinningReport {
        device: cuda.name().to_string(),
        repeats,
        rows,
        cpu_access,
        pool_acquire_us: pool_acquire(device)?,
    })
}

/// Milliseconds to set up and to release `bytes` pinned by `method`.
fn time_method(device: &Device, method: Method, bytes: usize) -> Result<(f64, f64)> {
    let ms = |start: Instant| start.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    let pinned: Box<dyn std::any::Any> = match method {
        Method::DriverAlloc => {
            let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
            Box::new(PinnedAlloc::new(device.as_cuda().expect("checked"), bytes, flags)?)
        }
        Method::HostBufHostAlloc => Box::new(HostBuf::<u8>::pinned(
            device,
            bytes,
            PinOptions { method: PinMethod::HostAlloc, ..PinOptions::default() },
        )?),
        Method::HostBufRegister => Box::new(HostBuf::<u8>::pinned(
            device,
            bytes,
            PinOptions { method: PinMethod::Register, ..PinOptions::default() },
        )?),
        Method::TouchThenRegisterHuge | Method::TouchThenRegisterBase => {
            let mut memory = if method == Method::TouchThenRegisterHuge {
                PageBox::huge(bytes)?
            } else {
                PageBox::zeroed(bytes)?
            };
            memory.fill(0x5a);
            Box::new(HostBuf::<u8>::register(device, memory, RegisterOptions::default())?)
        }
    };
    let setup = ms(start);
    let start = Instant::now();
    drop(pinned);
    Ok((setup, ms(start)))
}

/// One thread writing then reading 64 MiB of pinned memory made with `options`.
fn cpu_access(device: &Device, memory: &'static str, options: PinOptions) -> Result<CpuAccessRow> {
    const WORDS: usize = 8 << 20;
    let mut buf = HostBuf::<u64>::pinned(device, WORDS, options)?;
    let gb = (WORDS * 8) as f64 / 1e9;
    let start = Instant::now();
    for (i, word) in buf.as_mut_slice().iter_mut().enumerate() {
        *word = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    let write_gb_s = gb / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let sum = buf.as_slice().iter().fold(0u64, |sum, &word| sum.wrapping_add(word));
    black_box(sum);
    let read_gb_s = gb / start.elapsed().as_secs_f64();
    Ok(CpuAccessRow { memory, write_gb_s, read_gb_s })
}

/// Acquire-and-release of a 1080p RGB frame from a warm pool, 10,000 times.
fn pool_acquire(device: &Device) -> Result<Summary> {
    const FRAME: usize = 1920 * 1080 * 3;
    let pool = PinnedPool::new(device, 64 << 20);
    drop(pool.acquire::<u8>(FRAME, PinOptions::default())?);
    let mut samples = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        let start = Instant::now();
        let frame = pool.acquire::<u8>(FRAME, PinOptions::default())?;
        drop(black_box(frame));
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(Summary::of(&samples).expect("10,000 samples"))
}
