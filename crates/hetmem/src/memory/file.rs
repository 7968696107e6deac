//! [`MappedFile`]: a file mapped read-only and registered, so kernels read it straight from
//! the page cache.

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use memmap2::Mmap;

use super::Element;
use super::{Buffer, FileOrigin, FileSpan, HostVisible, Region, RegisterError, RegisterOptions, Sealed};
use crate::backend::Device;
use crate::backend::cpu::memory::page_size;
use crate::backend::memory::{HostMemory, HostRegister};
use crate::error::{Error, Result};

/// A read-only file mapping of `T`s, registered read-only with the GPU (plain on the CPU
/// backend). Kernels read it zero-copy; nothing can write it, so it can only be lent to the
/// GPU through a [`crate::Shared`] lease.
///
/// # Safety contract
/// As for any file mapping (see `memmap2::Mmap`), the file must not be truncated or modified
/// while mapped: a truncation makes accesses fault (SIGBUS), a modification changes data the
/// program already read.
///
/// hetmem's own CPU loops over the mapping (copies through a [`crate::Queue`], operations'
/// CPU paths) recover the fault of a truncation while they run, answering
/// [`Error::FileTruncated`] (or [`Error::FileUnreadable`] for a page the storage failed to
/// read); the mapping then reads zeros from the faulting page on, and later loops over it are
/// refused. The caller's own reads of [`MappedFile::as_slice`] are not covered, and GPU work
/// reading a registered mapping reads the pages as they were when registered.
pub struct MappedFile<T> {
    /// Holds a second reference to the mapping, so it is unmapped only after the range is
    /// unregistered (which waits while a resident kernel runs).
    registration: HostMemory,
    map: Arc<Mmap>,
    /// The file and the offset the mapping starts at, where known.
    origin: Option<(Arc<FileOrigin>, u64)>,
    /// Whether a CPU access faulted on a page past the file's end.
    faulted: AtomicBool,
    len: usize,
    device_ptr: Option<u64>,
    device_ordinal: Option<usize>,
    _elems: PhantomData<T>,
}

impl<T: Element> MappedFile<T> {
    /// Maps the file at `path` read-only and registers it with `device`.
    ///
    /// # Safety
    /// The file must not be truncated or modified while the result lives (see the type's
    /// contract).
    ///
    /// # Errors
    /// The file cannot be opened or mapped, is empty, or its size is not a multiple of
    /// `size_of::<T>()`; the driver refuses the registration.
    pub unsafe fn open(device: &Device, path: impl AsRef<Path>) -> Result<MappedFile<T>> {
        let path = path.as_ref();
        let file = std::fs::File::open(path)
            .map_err(|source| Error::Io { context: format!("opening {}", path.display()), source })?;
        // SAFETY: the caller promises the file is not truncated or modified while mapped.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|source| Error::Io { context: format!("mapping {}", path.display()), source })?;
        let origin = Arc::new(FileOrigin::new(file, path));
        Self::of_file(device, map, origin, 0).map_err(|failure| match failure.error {
            Error::InvalidArgument { what, problem } => {
                Error::InvalidArgument { what, problem: format!("{}: {problem}", path.display()) }
            }
            other => other,
        })
    }

    /// As [`MappedFile::from_mmap`], for a mapping of `origin`'s file from byte `offset`, so
    /// hetmem's CPU loops over it check the file's size and name it in errors.
    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    pub(crate) fn of_file(
        device: &Device,
        map: Mmap,
        origin: Arc<FileOrigin>,
        offset: u64,
    ) -> Result<MappedFile<T>, RegisterError<Mmap>> {
        let mut mapped = Self::from_mmap(device, map)?;
        mapped.origin = Some((origin, offset));
        Ok(mapped)
    }

    /// Registers an existing read-only mapping with `device`.
    ///
    /// # Errors
    /// An empty mapping, one whose size is not a multiple of `size_of::<T>()` or that does not
    /// start on a page; the driver refusing the registration. The mapping comes back in the
    /// error.
    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    pub fn from_mmap(device: &Device, map: Mmap) -> Result<MappedFile<T>, RegisterError<Mmap>> {
        let refuse = |problem: String, map| {
            Err(RegisterError { error: Error::invalid("file mapping", problem), memory: Some(map) })
        };
        if map.is_empty() {
            return refuse("the file is empty".into(), map);
        }
        if !map.len().is_multiple_of(size_of::<T>()) {
            return refuse(
                format!("{} bytes is not a whole number of {}-byte elements", map.len(), size_of::<T>()),
                map,
            );
        }
        if !(map.as_ptr() as usize).is_multiple_of(page_size()) {
            return refuse("the mapping does not start on a page boundary".into(), map);
        }
        let map = Arc::new(map);
        let options = HostRegister {
            mapped: true,
            portable: false,
            read_only: true,
            max_piece_bytes: RegisterOptions::default().max_piece_bytes,
        };
        #[allow(
            clippy::as_ptr_cast_mut,
            reason = "registered read-only: the driver's signature wants *mut, nothing writes"
        )]
        let start = map.as_ptr().cast_mut();
        // SAFETY: `map` covers the range, and the registration keeps a reference to it, so it
        // is unmapped only after the range is unregistered.
        let registration = match unsafe { device.register_host(start, map.len(), options, Arc::clone(&map)) }
        {
            Ok(registration) => registration,
            Err(failed) => {
                // The mapping comes back when the registration kept no reference to it.
                drop(failed.owner);
                return Err(RegisterError { error: failed.error.into(), memory: Arc::into_inner(map) });
            }
        };
        Ok(MappedFile {
            device_ptr: registration.registered_device_ptr(),
            registration,
            len: map.len() / size_of::<T>(),
            map,
            origin: None,
            faulted: AtomicBool::new(false),
            device_ordinal: device.gpu_ordinal(),
            _elems: PhantomData,
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's contents as `T`s.
    pub fn as_slice(&self) -> &[T] {
        bytemuck::cast_slice(&self.map[..])
    }

    /// Whether the mapping is registered with a GPU.
    pub fn is_registered(&self) -> bool {
        self.registration.is_registered()
    }

    /// The address kernels read the file at, when registered (as [`crate::HostBuf::device_ptr`]):
    /// on the device it was registered with. The mapping is read-only: a kernel must never
    /// write through it.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }
}

impl<T: Element> Sealed for MappedFile<T> {
    fn region(&self) -> Region {
        #[allow(clippy::as_ptr_cast_mut, reason = "a read-only mapping: the region is never written")]
        let start = std::ptr::NonNull::new(self.map.as_ptr().cast_mut()).expect("mappings are never null");
        Region {
            host: Some(start),
            device: self.device_ptr,
            bytes: self.map.len(),
            device_ordinal: self.device_ordinal,
            pages: Some((start, self.map.len().div_ceil(page_size()) * page_size())),
            read_only: true,
            portable: false,
        }
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        let (origin, offset) = match &self.origin {
            Some((origin, offset)) => (Some(&**origin), *offset),
            None => (None, 0),
        };
        // A MappedFile's mapping is read-only.
        Some(FileSpan { origin, offset, writable: false, faulted: &self.faulted })
    }
}

impl<T: Element> Buffer for MappedFile<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.len
    }
}

impl<T: Element> HostVisible for MappedFile<T> {}

impl<T> std::fmt::Debug for MappedFile<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("len", &self.len)
            .field("registered", &self.registration.is_registered())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind};

    fn cpu() -> Device {
        Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap()
    }

    #[test]
    fn a_file_reads_back_as_its_elements() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("words.bin");
        let words: Vec<u32> = (0..10_000u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        std::fs::write(&path, bytemuck::cast_slice(&words)).unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        let file = unsafe { MappedFile::<u32>::open(&cpu(), &path) }.unwrap();
        assert_eq!(file.as_slice(), &words[..]);
        assert!(!file.is_registered());
    }

    #[test]
    fn empty_and_ragged_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.bin");
        std::fs::write(&empty, b"").unwrap();
        // SAFETY: as above.
        let error = unsafe { MappedFile::<u32>::open(&cpu(), &empty) }.unwrap_err().to_string();
        assert!(error.contains("empty.bin") && error.contains("empty"), "{error}");
        let ragged = dir.path().join("ragged.bin");
        std::fs::write(&ragged, [1u8; 10]).unwrap();
        // SAFETY: as above.
        let error = unsafe { MappedFile::<u32>::open(&cpu(), &ragged) }.unwrap_err().to_string();
        assert!(error.contains("ragged.bin") && error.contains("4-byte elements"), "{error}");
        // SAFETY: as above.
        let missing = unsafe { MappedFile::<u32>::open(&cpu(), dir.path().join("missing")) }.unwrap_err();
        assert!(matches!(missing, Error::Io { .. }) && missing.to_string().contains("missing"));
    }
}
