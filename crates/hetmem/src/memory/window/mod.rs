//! File windows: a [`WindowedFile`] opened once, and ranges of it mapped and registered with
//! the GPU on demand ([`FileWindow`] read-only, [`FileWindowMut`] read-write), unregistered and
//! unmapped when dropped. Only the windows are mapped, lazily, so the file may be far larger
//! than memory; a registered window is page-locked, so windows must fit in what the process
//! may lock (see [`crate::memory::WindowCache`], which keeps them within a budget).

use std::marker::PhantomData;
use std::ops::Range;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memmap2::MmapOptions;

use super::claims::{Access, Claim, Claims};
use super::{Element, FileOrigin, RegisterOptions};
use crate::backend::Device;
use crate::backend::cpu::memory::page_size;
use std::os::unix::fs::FileExt;

use crate::backend::cuda::{CudaDevice, HostAllocFlags, PinnedAlloc};
use crate::backend::memory::HostRegister;
use crate::error::{Error, Result};

mod mapping;
mod views;

use mapping::{Mapping, Staged, WindowMapping};
pub use views::{FileWindow, FileWindowMut};

/// A file opened for windows: [`WindowedFile::window`] maps and registers a byte range of it
/// read-only, [`WindowedFile::window_mut`] read-write (`MAP_SHARED`: what the CPU or a kernel
/// writes reaches the file, durably after [`FileWindowMut::flush`]).
///
/// Windows of one file are checked against each other: a read-write window overlaps no other
/// window of the file (read-only windows may overlap each other), so safe code never holds two
/// views of one byte of which one may write. Windows own their mappings and may outlive the
/// `WindowedFile`.
///
/// # Safety contract
/// As for any file mapping (see `memmap2::Mmap`): while a window of it lives, the file must
/// not be truncated below the window (accesses would fault with SIGBUS) nor modified by other
/// processes or through other handles (the program would see the data change under it, or,
/// for a read-write window, race the other writer).
///
/// What hetmem does when the contract is broken anyway: a window is not made over bytes the
/// file no longer holds, and hetmem's own CPU loops over a window (copies through a
/// [`crate::Queue`], operations' CPU paths, [`FileWindowMut::flush`],
/// [`FileWindow::guard_truncation`]) recover the fault if it shrinks while they run,
/// answering [`Error::FileTruncated`] (or [`Error::FileUnreadable`] for a page the storage
/// failed to read). A slice from `as_slice` read by the caller's own code is not covered: it
/// faults as any mapping does. GPU work reading a registered window reads the pages as they
/// were page-locked when it was registered (stale contents past the new end, not zeros): the
/// truncation is reported only by the CPU loops.
#[derive(Debug)]
pub struct WindowedFile {
    origin: Arc<FileOrigin>,
    bytes: u64,
    writable: bool,
    device: Device,
    claims: Arc<Claims>,
    id: u64,
}

/// Numbers files for [`crate::memory::WindowCache`]'s keys.
static NEXT_FILE_ID: AtomicU64 = AtomicU64::new(0);

impl WindowedFile {
    /// Opens the file at `path` read-only, for windows registered with `device`.
    ///
    /// # Safety
    /// The file must not be truncated or modified by others while a window of it lives (see
    /// the type's contract).
    ///
    /// # Errors
    /// The file cannot be opened, or is empty.
    pub unsafe fn open(device: &Device, path: impl AsRef<Path>) -> Result<WindowedFile> {
        let path = path.as_ref();
        let file =
            std::fs::File::open(path).map_err(|source| io(format!("opening {}", path.display()), source))?;
        WindowedFile::with_file(device, file, path, false)
    }

    /// Opens the file at `path` for reading and writing, for read-only and read-write windows.
    ///
    /// # Safety
    /// As for [`WindowedFile::open`].
    ///
    /// # Errors
    /// The file cannot be opened for writing, or is empty.
    pub unsafe fn open_rw(device: &Device, path: impl AsRef<Path>) -> Result<WindowedFile> {
        let path = path.as_ref();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| io(format!("opening {} for writing", path.display()), source))?;
        WindowedFile::with_file(device, file, path, true)
    }

    /// Creates the file at `path` (or truncates it) and sets its size to `bytes`, read-write.
    /// The file is sparse where the filesystem allows it: nothing is written until windows are.
    ///
    /// # Safety
    /// As for [`WindowedFile::open`].
    ///
    /// # Errors
    /// The file cannot be created or sized, or `bytes` is 0.
    pub unsafe fn create(device: &Device, path: impl AsRef<Path>, bytes: u64) -> Result<WindowedFile> {
        let path = path.as_ref();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| io(format!("creating {}", path.display()), source))?;
        file.set_len(bytes)
            .map_err(|source| io(format!("sizing {} to {bytes} bytes", path.display()), source))?;
        WindowedFile::with_file(device, file, path, true)
    }

    fn with_file(device: &Device, file: std::fs::File, path: &Path, writable: bool) -> Result<WindowedFile> {
        let bytes = file
            .metadata()
            .map_err(|source| io(format!("reading the size of {}", path.display()), source))?
            .len();
        if bytes == 0 {
            return Err(Error::invalid("windowed file", format!("{} is empty", path.display())));
        }
        Ok(WindowedFile {
            origin: Arc::new(FileOrigin::new(file, path)),
            bytes,
            writable,
            device: device.clone(),
            claims: Claims::new("file window"),
            id: NEXT_FILE_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The file's size in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.bytes
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.origin.path()
    }

    /// Whether it was opened for writing ([`WindowedFile::window_mut`] works).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Windows of the file alive now.
    pub fn live_windows(&self) -> usize {
        self.claims.count()
    }

    /// A number that tells this file apart from every other opened in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Maps the bytes `range` of the file read-only, as `T`s, and registers them read-only
    /// with the device. Only the window's pages are mapped, and only they are page-locked.
    ///
    /// # Errors
    /// An empty range, one past the end of the file, not a whole number of `T`s or not
    /// starting at a multiple of `T`'s alignment; [`Error::RangeInUse`] when it overlaps a
    /// read-write window of the file; mapping or registration failing.
    ///
    /// # Examples
    /// ```
    /// use hetmem::{Device, Queue, memory::WindowedFile};
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("data.bin");
    /// std::fs::write(&path, (0..4096u32).flat_map(u32::to_le_bytes).collect::<Vec<u8>>()).unwrap();
    /// let device = Device::open_best()?;
    /// // SAFETY: nothing else changes the file while its windows live.
    /// let file = unsafe { WindowedFile::open(&device, &path) }?;
    /// let window = file.window::<u32>(400..800)?; // words 100..200
    /// assert_eq!(window.as_slice()[0], 100);
    /// let shared = Queue::new(&device)?.share(window); // kernels read it now
    /// # drop(shared);
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    pub fn window<T: Element>(&self, range: Range<u64>) -> Result<FileWindow<T>> {
        let claim = self.claims.claim(self.check::<T>(&range)?, Access::Read)?;
        let offset = self.map_offset(range.start);
        let span = self.span(&range, offset)?;
        // SAFETY: the caller of `open` promised the file is neither truncated nor modified by
        // others while windows live; windows of this file that write overlap no other (the
        // claim above).
        let map = unsafe { MmapOptions::new().offset(offset).len(span).map(self.origin.file()) }
            .map_err(|source| self.map_error(&range, source))?;
        #[allow(
            clippy::as_ptr_cast_mut,
            reason = "a read-only mapping, registered read-only: nothing writes through it"
        )]
        let start = NonNull::new(map.as_ptr().cast_mut()).expect("mappings are never null");
        let mapping = self.register(Mapping::ReadOnly(map), start, span, range, claim)?;
        Ok(FileWindow { mapping, _elems: PhantomData })
    }

    /// The bytes `range` of the file as `T`s, read-write: kernels may read and write the
    /// window through a [`crate::Lent`] lease, and [`FileWindowMut::flush`] writes what they
    /// wrote to the file. On the CPU backend the range is mapped `MAP_SHARED`; on a GPU it is
    /// read into pinned mapped memory that kernels reach in place and that flushing (or
    /// dropping the window) writes back, because Linux will not page-lock writable shared
    /// file pages for a device (see `staged`). Either way the window pins its bytes while it
    /// lives.
    ///
    /// # Errors
    /// A file opened read-only; [`Error::RangeInUse`] when the range overlaps any window of
    /// the file alive; otherwise as for [`WindowedFile::window`].
    pub fn window_mut<T: Element>(&self, range: Range<u64>) -> Result<FileWindowMut<T>> {
        if !self.writable {
            return Err(Error::invalid(
                "file window",
                format!(
                    "{} was opened read-only: open it with WindowedFile::open_rw (or create) for \
                     read-write windows",
                    self.path().display()
                ),
            ));
        }
        let claim = self.claims.claim(self.check::<T>(&range)?, Access::Write)?;
        if let Device::Cuda(cuda) = &self.device {
            return Ok(FileWindowMut { mapping: self.staged(cuda, range, claim)?, _elems: PhantomData });
        }
        let offset = self.map_offset(range.start);
        let span = self.span(&range, offset)?;
        // SAFETY: as in `window`; this window overlaps no other window of the file (the
        // exclusive claim above).
        let mut map = unsafe { MmapOptions::new().offset(offset).len(span).map_mut(self.origin.file()) }
            .map_err(|source| self.map_error(&range, source))?;
        // Taken from the mutable mapping, since the CPU and the GPU write through it.
        let start = NonNull::new(map.as_mut_ptr()).expect("mappings are never null");
        let mapping = self.register(Mapping::ReadWrite(map), start, span, range, claim)?;
        Ok(FileWindowMut { mapping, _elems: PhantomData })
    }

    /// A read-write window on a GPU: the range read into pinned mapped memory, which kernels
    /// read and write in place and [`FileWindowMut::flush`] (or dropping the window) writes
    /// back. Linux refuses to page-lock writable shared file pages for long (a file system may
    /// not see a device's writes to them), so the driver cannot register a read-write file
    /// mapping: `cuMemHostRegister` answered `CUDA_ERROR_INVALID_VALUE` on the H200 machine.
    fn staged(&self, cuda: &CudaDevice, range: Range<u64>, claim: Claim) -> Result<WindowMapping> {
        let bytes = self.span(&range, range.start)?;
        let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
        let alloc = PinnedAlloc::zeroed(cuda, bytes, flags)?;
        let file = self
            .origin
            .file()
            .try_clone()
            .map_err(|source| io(format!("opening {} again", self.path().display()), source))?;
        // SAFETY: the allocation is `bytes` long, page-aligned, zeroed and owned here; nothing
        // else refers to it yet.
        let buffer = unsafe { std::slice::from_raw_parts_mut(alloc.host_ptr(), bytes) };
        file.read_exact_at(buffer, range.start)
            .map_err(|source| io(format!("reading bytes {range:?} of {}", self.path().display()), source))?;
        let start = NonNull::new(alloc.host_ptr()).expect("pinned allocations are never null");
        let device_ptr = alloc.device_ptr();
        Ok(WindowMapping {
            registration: None,
            map: Arc::new(Mapping::Staged(Staged { alloc, file, offset: range.start })),
            origin: None,
            faulted: AtomicBool::new(false),
            start,
            lead: 0,
            range,
            device_ptr,
            device_ordinal: Some(cuda.ordinal()),
            _claim: claim,
        })
    }

    /// The range, checked against the file and `T`.
    fn check<T: Element>(&self, range: &Range<u64>) -> Result<Range<u64>> {
        let problem = if range.start >= range.end {
            Some("an empty range".to_string())
        } else if range.end > self.bytes {
            Some(format!("it ends past the file's {} bytes", self.bytes))
        } else if !(range.end - range.start).is_multiple_of(size_of::<T>() as u64) {
            Some(format!(
                "{} bytes is not a whole number of {}-byte elements",
                range.end - range.start,
                size_of::<T>()
            ))
        } else if !range.start.is_multiple_of(align_of::<T>() as u64) {
            Some(format!(
                "it starts at a byte that is not a multiple of the element's alignment {}",
                align_of::<T>()
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::invalid(
                "file window",
                format!("bytes {range:?} of {}: {problem}", self.path().display()),
            ));
        }
        // The size when opened may be stale: a mapping past the file's end would fault.
        self.origin.check_holds(range.start, range.end)?;
        Ok(range.clone())
    }

    /// Where the mapping of a window starting at byte `start` begins: the page holding it.
    fn map_offset(&self, start: u64) -> u64 {
        start - start % page_size() as u64
    }

    /// The bytes mapped for `range` from `offset`.
    fn span(&self, range: &Range<u64>, offset: u64) -> Result<usize> {
        usize::try_from(range.end - offset).map_err(|_| {
            Error::invalid(
                "file window",
                format!("bytes {range:?} do not fit in this machine's address space"),
            )
        })
    }

    fn map_error(&self, range: &Range<u64>, source: std::io::Error) -> Error {
        io(format!("mapping bytes {range:?} of {}", self.path().display()), source)
    }

    fn register(
        &self,
        map: Mapping,
        start: NonNull<u8>,
        span: usize,
        range: Range<u64>,
        claim: Claim,
    ) -> Result<WindowMapping> {
        let read_only = matches!(map, Mapping::ReadOnly(_));
        let map = Arc::new(map);
        let options = HostRegister {
            mapped: true,
            portable: false,
            read_only,
            max_piece_bytes: RegisterOptions::default().max_piece_bytes,
        };
        // SAFETY: `map` covers [start, start + span) and the registration keeps a reference to
        // it, so it is unmapped only after the range is unregistered (on a failure part-way
        // too); no other registration covers this mapping, which was made just now.
        let registration =
            unsafe { self.device.register_host(start.as_ptr(), span, options, Arc::clone(&map)) }
                .map_err(|failed| failed.error)?;
        let lead = (range.start % page_size() as u64) as usize;
        Ok(WindowMapping {
            device_ptr: registration.registered_device_ptr().map(|base| base + lead as u64),
            registration: Some(registration),
            map,
            origin: Some(Arc::clone(&self.origin)),
            faulted: AtomicBool::new(false),
            start,
            lead,
            range,
            device_ordinal: self.device.gpu_ordinal(),
            _claim: claim,
        })
    }
}

pub(super) fn io(context: String, source: std::io::Error) -> Error {
    Error::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind};
    use crate::memory::Sealed;

    fn cpu() -> Device {
        Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap()
    }

    fn random_bytes(len: usize) -> Vec<u8> {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    #[test]
    fn a_window_shows_exactly_its_range_at_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.bin");
        let data = random_bytes(5 * page_size() + 123);
        std::fs::write(&path, &data).unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        let file = unsafe { WindowedFile::open(&cpu(), &path) }.unwrap();
        for start in [0, 4, page_size() as u64 - 4, page_size() as u64, 3 * page_size() as u64 + 8] {
            let end = data.len() as u64 - fastrand::u64(0..16) * 4 - 3;
            let end = end - (end - start) % 4;
            let window = file.window::<u32>(start..end).unwrap();
            let expected: Vec<u32> = data[start as usize..end as usize]
                .chunks_exact(4)
                .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
                .collect();
            assert_eq!(window.as_slice(), &expected[..], "bytes {start}..{end}");
            assert_eq!(
                window.region().host.unwrap().as_ptr() as usize % page_size(),
                start as usize % page_size()
            );
            assert!(!window.is_registered());
            assert_eq!(window.locked_bytes() % page_size(), 0);
        }
        assert_eq!(file.live_windows(), 0);
    }

    #[test]
    fn bad_ranges_and_writes_to_read_only_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.bin");
        std::fs::write(&path, random_bytes(4096)).unwrap();
        // SAFETY: as above.
        let file = unsafe { WindowedFile::open(&cpu(), &path) }.unwrap();
        for (range, problem) in [
            (8..8, "empty"),
            (0..4100, "past the file's 4096 bytes"),
            (0..10, "whole number of 4-byte"),
            (2..10, "alignment 4"),
        ] {
            let error = file.window::<u32>(range.clone()).unwrap_err().to_string();
            assert!(error.contains(problem) && error.contains("data.bin"), "{range:?}: {error}");
        }
        let error = file.window_mut::<u8>(0..8).unwrap_err().to_string();
        assert!(error.contains("opened read-only") && error.contains("open_rw"), "{error}");
        // SAFETY: as above.
        let empty = dir.path().join("empty.bin");
        std::fs::write(&empty, b"").unwrap();
        // SAFETY: as above.
        let error = unsafe { WindowedFile::open(&cpu(), &empty) }.unwrap_err().to_string();
        assert!(error.contains("empty"), "{error}");
    }

    #[test]
    fn read_write_windows_overlap_nothing_and_read_windows_overlap_reads() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: the test owns the file.
        let file = unsafe { WindowedFile::create(&cpu(), dir.path().join("out.bin"), 1 << 16) }.unwrap();
        let read_a = file.window::<u8>(0..4096).unwrap();
        let read_b = file.window::<u8>(100..5000).unwrap();
        let error = file.window_mut::<u8>(4000..4200).unwrap_err();
        assert!(matches!(error, Error::RangeInUse { held_exclusively: false, .. }), "{error}");
        // Sharing a page but not a byte is fine: each window maps the page itself.
        let mut write = file.window_mut::<u8>(5000..9000).unwrap();
        write.as_mut_slice().fill(7);
        let error = file.window::<u8>(8999..9001).unwrap_err();
        assert!(matches!(error, Error::RangeInUse { held_exclusively: true, .. }), "{error}");
        assert_eq!(file.live_windows(), 3);
        drop((read_a, read_b, write));
        assert_eq!(file.live_windows(), 0);
        assert_eq!(file.window::<u8>(4999..5001).unwrap().as_slice(), &[0, 7]);
    }

    #[test]
    fn what_a_read_write_window_holds_reaches_the_file_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let before = random_bytes(3 * page_size());
        std::fs::write(&path, &before).unwrap();
        // SAFETY: the test owns the file; it reads it only through std::fs after the flush.
        let file = unsafe { WindowedFile::open_rw(&cpu(), &path) }.unwrap();
        let (start, end) = (page_size() as u64 - 64, 2 * page_size() as u64 + 64);
        let mut window = file.window_mut::<u64>(start..end).unwrap();
        let written = random_bytes((end - start) as usize);
        bytemuck::cast_slice_mut::<u64, u8>(window.as_mut_slice()).copy_from_slice(&written);
        window.flush().unwrap();
        let error = window.flush_range(0..window.len() + 1).unwrap_err().to_string();
        assert!(error.contains("flush range"), "{error}");
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[start as usize..end as usize], &written[..]);
        assert_eq!(&after[..start as usize], &before[..start as usize], "bytes before the window");
        assert_eq!(&after[end as usize..], &before[end as usize..], "bytes after the window");
    }

    #[test]
    fn windows_of_a_file_larger_than_memory_map_only_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let memory = crate::memory::budget::total_memory().expect("/proc/meminfo has MemTotal");
        // Sparse: twice the machine's memory, of which only the windows are ever touched.
        let bytes = (2 * memory).next_multiple_of(page_size() as u64);
        // SAFETY: the test owns the file.
        let file = match unsafe { WindowedFile::create(&cpu(), dir.path().join("huge.bin"), bytes) } {
            Ok(file) => file,
            Err(error) => {
                eprintln!("skipped: the filesystem refuses a sparse file of {bytes} bytes: {error}");
                return;
            }
        };
        let data = random_bytes(1 << 20);
        for start in [bytes - (1 << 20), bytes / 2 + 12, 4096] {
            let mut window = file.window_mut::<u8>(start..start + (1 << 20)).unwrap();
            window.as_mut_slice().copy_from_slice(&data);
            window.flush().unwrap();
            drop(window);
            assert_eq!(file.window::<u8>(start..start + (1 << 20)).unwrap().as_slice(), &data[..]);
        }
    }
}
