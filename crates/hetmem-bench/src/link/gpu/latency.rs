//! Small transfers: microseconds per copy or kernel read, each read checked.

use std::time::Instant;

use super::buffers::Buffers;
use super::rig::Rig;
use crate::Summary;
use crate::error::Result;
use crate::link::{LatencyPath, xor_checksum};
use hetmem::backend::cuda::raw;
use hetmem::memory::InFlight;

impl Rig {
    /// Microseconds per small transfer by `path`, `samples` times after as many warm-ups.
    pub(super) fn latency(
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
