//! Every buffer the cells use, made once at the largest size, random where it is a source.

use super::POISON;
use super::rig::Rig;
use crate::error::Result;
use crate::link::{LinkPath, cpu_cache, fill_random, xor_checksum};
use crate::random::fresh_seed;
use hetmem::backend::Device;
use hetmem::backend::cuda::raw::DeviceAlloc;
use hetmem::error::Error;
use hetmem::memory::{
    HostBuf, InFlight, ManagedBuf, MappedFile, PageBox, PinMethod, PinOptions, RegisterOptions,
};

/// Every buffer the cells use, each at the largest size.
pub(super) struct Buffers {
    /// Pinned, mapped, random: the source of uploads and zero-copy reads.
    pub(super) src: HostBuf<u32>,
    /// Pinned, mapped: the destination of downloads and zero-copy writes.
    pub(super) dst: HostBuf<u32>,
    /// Plain memory, random: the source of pageable uploads.
    pub(super) pageable: Vec<u32>,
    /// Plain memory: the destination of pageable downloads.
    pub(super) pageable_out: Vec<u32>,
    /// Device memory: the destination of uploads.
    pub(super) dev_in: DeviceAlloc,
    /// Device memory holding `bench_word(i, dev_seed)`: the source of downloads.
    pub(super) dev_out: DeviceAlloc,
    pub(super) dev_seed: u32,
    /// Pinned, mapped, write-combined: a copy of `src`; only when its cell is asked for.
    pub(super) write_combined: Option<HostBuf<u32>>,
    /// Memory of the process on base (4 KiB) pages, registered mapped, random.
    pub(super) registered: HostBuf<u32>,
    /// Memory of the process on transparent huge (2 MiB) pages where the kernel gives them,
    /// registered mapped, random; only when its cell is asked for.
    pub(super) huge: Option<HostBuf<u32>>,
    /// Where the random reads load from.
    pub(super) random_seed: u32,
    /// A temporary file of random data, mapped read-only and registered read-only.
    pub(super) file: MappedFile<u32>,
    /// Managed memory, random.
    pub(super) managed: ManagedBuf<u32>,
}

impl Buffers {
    /// Every buffer the cells of `paths` use, held for the rig's streams before any work is
    /// queued on it.
    pub(super) fn new(
        device: &Device,
        rig: &Rig,
        largest: usize,
        paths: &[LinkPath],
    ) -> Result<InFlight<Buffers>> {
        let cuda = device.as_cuda().expect("GPU cells run on a GPU");
        let words = largest / 4;
        let pinned = PinOptions { mapped: true, method: PinMethod::HostAlloc, ..PinOptions::default() };
        let mut src = HostBuf::<u32>::pinned(device, words, pinned)?;
        fill_random(src.as_mut_slice(), fresh_seed());
        let dst = HostBuf::<u32>::pinned(device, words, pinned)?;
        let write_combined = if paths.contains(&LinkPath::WriteCombinedRead) {
            let mut buffer =
                HostBuf::<u32>::pinned(device, words, PinOptions { write_combined: true, ..pinned })?;
            buffer.as_mut_slice().copy_from_slice(src.as_slice());
            Some(buffer)
        } else {
            None
        };
        let mut pageable = vec![0u32; words];
        fill_random(&mut pageable, fresh_seed());
        let pageable_out = vec![POISON; words];
        let dev_in = DeviceAlloc::new(cuda, largest)?;
        let dev_out = DeviceAlloc::new(cuda, largest)?;
        let dev_seed = fresh_seed() as u32;
        let mut registered =
            HostBuf::register(device, PageBox::<u32>::zeroed(words)?, RegisterOptions::default())?;
        fill_random(registered.as_mut_slice(), fresh_seed());
        let huge = if paths.contains(&LinkPath::RandomReadHugePages) {
            let mut buffer =
                HostBuf::register(device, PageBox::<u32>::huge(words)?, RegisterOptions::default())?;
            fill_random(buffer.as_mut_slice(), fresh_seed());
            Some(buffer)
        } else {
            None
        };
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
            write_combined,
            registered,
            huge,
            random_seed: fresh_seed() as u32,
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

    /// The write-combined buffer, made when its cell was asked for (the only time it is used).
    pub(super) fn write_combined(&self) -> &HostBuf<u32> {
        self.write_combined.as_ref().expect("made for the write_combined_read cell, which is asked for")
    }

    /// The huge-page buffer, made when its cell was asked for (the only time it is used).
    pub(super) fn huge(&self) -> &HostBuf<u32> {
        self.huge.as_ref().expect("made for the random_read_2m_pages cell, which is asked for")
    }

    /// Evicts the first `words` of every host buffer `path` reads or writes from the CPU's
    /// caches (see [`cpu_cache`]). Managed memory is left alone: where its pages are on the GPU
    /// (after a prefetch or a kernel's faults), touching them from the CPU, even to flush
    /// them, would move them back; so the managed cells still see what the previous check left.
    pub(super) fn evict_from_cpu_caches(&self, path: LinkPath, words: usize) {
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
            LinkPath::WriteCombinedRead => &[&self.write_combined().as_slice()[..words]],
            LinkPath::RegisteredVecRead | LinkPath::RandomReadBasePages => {
                &[&self.registered.as_slice()[..words]]
            }
            LinkPath::RandomReadHugePages => &[&self.huge().as_slice()[..words]],
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
