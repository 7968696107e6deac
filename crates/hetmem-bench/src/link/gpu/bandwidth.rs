//! One bandwidth cell: its buffers prepared (outputs poisoned, caches cold), its path timed,
//! and its result checked against the CPU.

use super::buffers::Buffers;
use super::rig::Rig;
use super::{POISON, check_pattern};
use crate::Summary;
use crate::error::{BenchError, Result};
use crate::link::{Direction, LinkOptions, LinkPath, bench_word, random_read_checksum, xor_checksum};
use crate::random::fresh_seed;
use hetmem::backend::cuda::{MemLocation, raw};
use hetmem::memory::InFlight;

impl Rig {
    /// One bandwidth cell. The buffers come held by [`Rig::hold`]: the work queued on them
    /// before any early return is waited for when they drop.
    pub(super) fn bandwidth(
        &mut self,
        held: &mut InFlight<Buffers>,
        path: LinkPath,
        bytes: usize,
        options: &LinkOptions,
    ) -> Result<(Summary, &'static str)> {
        let b: &mut Buffers = held;
        let words = bytes / 4;
        let runs = (options.warm_up_at(bytes), options.repeats_at(bytes));
        let count = runs.0 + runs.1;
        self.prepare_cell(b, path, words, options.cold_cpu_cache)?;
        let summary = match path {
            LinkPath::ZeroCopyWrite => return self.zero_copy_write(b, bytes, runs),
            LinkPath::ZeroCopyReadWrite => return self.zero_copy_read_write(b, bytes, runs),
            _ => self.time_cell(b, path, bytes, runs)?,
        };
        let verified_by = self.verify_cell(b, path, bytes, count)?;
        Ok((summary, verified_by))
    }

    /// Poisons the outputs `path` writes, evicts its host buffers from the CPU's caches with
    /// `cold_cpu_cache`, and zeroes the device destination of uploads.
    fn prepare_cell(
        &self,
        b: &mut Buffers,
        path: LinkPath,
        words: usize,
        cold_cpu_cache: bool,
    ) -> Result<()> {
        if matches!(path.direction(), Direction::D2h | Direction::Both) {
            b.dst.as_mut_slice()[..words].fill(POISON);
        }
        if path == LinkPath::PageableD2h {
            b.pageable_out[..words].fill(POISON);
        }
        if cold_cpu_cache {
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
        Ok(())
    }

    /// Times `path` (every path but the zero-copy writes, which check their own output).
    fn time_cell(
        &self,
        b: &mut Buffers,
        path: LinkPath,
        bytes: usize,
        runs: (usize, usize),
    ) -> Result<Summary> {
        let words = bytes / 4;
        let src_host = b.src.as_slice().as_ptr() as u64;
        let src_mapped = b.src.device_ptr().expect("mapped");
        let dst_host = b.dst.as_mut_slice().as_mut_ptr() as u64;
        let (dev_in, dev_out) = (b.dev_in.device_ptr(), b.dev_out.device_ptr());
        let summary = match path {
            LinkPath::HostMemcpy => unreachable!("host cells are measured by the host module"),
            LinkPath::PageableH2d => {
                let (dev, src) = (&mut b.dev_in, &b.pageable[..words]);
                Rig::timed_cpu(bytes, runs, || dev.upload_sync(bytemuck::cast_slice(src)))?
            }
            LinkPath::PinnedSyncH2d => {
                let (dev, src) = (&mut b.dev_in, &b.src.as_slice()[..words]);
                Rig::timed_cpu(bytes, runs, || dev.upload_sync(bytemuck::cast_slice(src)))?
            }
            LinkPath::PageableD2h => {
                let (dev, dst) = (&b.dev_out, &mut b.pageable_out[..words]);
                Rig::timed_cpu(bytes, runs, || dev.download_sync(bytemuck::cast_slice_mut(dst)))?
            }
            LinkPath::PinnedSyncD2h => {
                let (dev, dst) = (&b.dev_out, &mut b.dst.as_mut_slice()[..words]);
                Rig::timed_cpu(bytes, runs, || dev.download_sync(bytemuck::cast_slice_mut(dst)))?
            }
            LinkPath::PinnedAsyncH2d => self.timed(
                bytes,
                runs,
                || Ok(()),
                |_| {
                    // SAFETY: `bytes` of pinned `src` into `dev_in`, both at least `largest` long and
                    // held until the stream is idle; the CPU does not touch them before `timed`
                    // synchronises it.
                    unsafe { raw::copy_async(&self.stream, dev_in, src_host, bytes) }
                },
            )?,
            LinkPath::PinnedAsyncD2h => self.timed(
                bytes,
                runs,
                || Ok(()),
                |_| {
                    // SAFETY: as above, `dev_out` into pinned `dst`.
                    unsafe { raw::copy_async(&self.stream, dst_host, dev_out, bytes) }
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
            LinkPath::WriteCombinedRead => {
                let from = b.write_combined().device_ptr().expect("mapped");
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(false, from, bytes, rep))?
            }
            LinkPath::RandomReadBasePages | LinkPath::RandomReadHugePages => {
                let buffer = if path == LinkPath::RandomReadBasePages { &b.registered } else { b.huge() };
                let from = buffer.device_ptr().expect("registered mapped");
                let seed = b.random_seed;
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_random_read(from, bytes, seed, rep))?
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
                    // SAFETY: the managed buffer is held (`Rig::hold`) until the stream is idle,
                    // and the stream is synchronised next.
                    unsafe { alloc.prefetch_range(&self.stream, MemLocation::Host, 0, bytes) }?;
                    Ok(self.stream.synchronize()?)
                };
                self.timed(bytes, runs, to_host, |rep| {
                    if prefetch {
                        // SAFETY: the managed buffer is held (`Rig::hold`) until the stream is
                        // idle, which `timed` waits for before returning.
                        unsafe {
                            alloc.prefetch_range(&self.stream, MemLocation::Device(ordinal), 0, bytes)
                        }?;
                    }
                    self.queue_read(false, alloc.ptr(), bytes, rep)
                })?
            }
            LinkPath::DeviceRead => {
                self.timed(bytes, runs, || Ok(()), |rep| self.queue_read(false, dev_out, bytes, rep))?
            }
            LinkPath::ZeroCopyWrite | LinkPath::ZeroCopyReadWrite => {
                unreachable!("measured and checked by their own functions")
            }
        };
        Ok(summary)
    }

    /// [`LinkPath::ZeroCopyWrite`]: the write kernel into mapped `dst`, timed, then checked.
    fn zero_copy_write(
        &self,
        b: &Buffers,
        bytes: usize,
        runs: (usize, usize),
    ) -> Result<(Summary, &'static str)> {
        let words = bytes / 4;
        let dst_mapped = b.dst.device_ptr().expect("mapped");
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
        Ok((summary, check_pattern(&b.dst.as_slice()[..words], seed)?))
    }

    /// [`LinkPath::ZeroCopyReadWrite`]: the copy kernel from mapped `src` into mapped `dst`,
    /// timed, then checked.
    fn zero_copy_read_write(
        &self,
        b: &Buffers,
        bytes: usize,
        runs: (usize, usize),
    ) -> Result<(Summary, &'static str)> {
        let words = bytes / 4;
        let src_mapped = b.src.device_ptr().expect("mapped");
        let dst_mapped = b.dst.device_ptr().expect("mapped");
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
                unsafe { self.launch(&self.copy, n16, &mut [src_mapped, dst_mapped, n16 as u64, key.into()]) }
            },
        )?;
        self.stream.synchronize()?;
        let (src, dst) = (&b.src.as_slice()[..words], &b.dst.as_slice()[..words]);
        match src.iter().zip(dst).position(|(&s, &d)| d != s ^ key) {
            None => Ok((summary, "every output word equals input ^ key")),
            Some(at) => Err(BenchError::ResultMismatch {
                what: "the zero-copy read+write output",
                detail: format!("word {at} is wrong"),
            }),
        }
    }

    /// Checks the result of a timed cell against the CPU: what it names as its check.
    fn verify_cell(
        &mut self,
        b: &Buffers,
        path: LinkPath,
        bytes: usize,
        count: usize,
    ) -> Result<&'static str> {
        let words = bytes / 4;
        let dev_in = b.dev_in.device_ptr();
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
            // A copy of `src`: its checksum is `src`'s, read from cached memory (the CPU's reads
            // of write-combined memory are uncached and slow).
            LinkPath::WriteCombinedRead => {
                self.check_slots(count, xor_checksum(&b.src.as_slice()[..words]))?
            }
            LinkPath::RandomReadBasePages => self
                .check_slots(count, random_read_checksum(&b.registered.as_slice()[..words], b.random_seed))?,
            LinkPath::RandomReadHugePages => {
                self.check_slots(count, random_read_checksum(&b.huge().as_slice()[..words], b.random_seed))?
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
        Ok(verified_by)
    }
}
