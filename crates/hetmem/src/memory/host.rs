//! [`HostBuf`]: page-aligned host memory, pinned for a GPU (by the driver or by registration)
//! or plain on the CPU backend.

use std::any::Any;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::Element;
use super::pool::PoolReturn;
use super::{Buffer, HostVisible, Region, Sealed, WritableBuffer};
use crate::backend::Device;
use crate::backend::cpu::memory::{PageBox, byte_len, check_pinnable, page_size};
use crate::backend::memory::{HostMemory, HostPin, HostRegister};
use crate::error::{Error, Result};

/// How a pinned buffer is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PinMethod {
    /// hetmem's measured choice: [`PinMethod::Register`], except for write-combined memory,
    /// which only the driver can allocate.
    #[default]
    Auto,
    /// `cuMemHostAlloc`: the driver allocates and pins.
    HostAlloc,
    /// Fault-then-register: anonymous memory (huge pages from 2 MiB up), registered with
    /// `cuMemHostRegister`. Several times faster to set up than `cuMemHostAlloc` on the H200
    /// machine (figures in `bench/results/`).
    Register,
}

/// Options of a pinned [`HostBuf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinOptions {
    /// Map into the device's address space so kernels read and write it directly (zero-copy).
    /// Default: on.
    pub mapped: bool,
    /// Usable from every GPU's context, not only the allocating one
    /// (`CU_MEMHOSTALLOC_PORTABLE` / `CU_MEMHOSTREGISTER_PORTABLE`): the buffer can then be lent
    /// to a queue of any GPU of the process, one queue at a time ([`HostBuf::is_portable`]).
    /// Default: off.
    pub portable: bool,
    /// Write-combined: can be faster for the GPU to read over PCIe, but CPU reads bypass the
    /// cache, which NVIDIA documents as very slow on bare metal. Only for buffers the CPU
    /// writes once and never reads. (On the H200 test VM reads measured no slower: see
    /// bench/results/2026-11-29-h200-handoff.) Default: off.
    pub write_combined: bool,
    /// How the memory is pinned.
    pub method: PinMethod,
}

impl Default for PinOptions {
    fn default() -> Self {
        PinOptions { mapped: true, portable: false, write_combined: false, method: PinMethod::Auto }
    }
}

impl PinOptions {
    /// The method [`PinMethod::Auto`] resolves to.
    pub(crate) fn resolved_method(&self) -> PinMethod {
        match self.method {
            PinMethod::Auto if self.write_combined => PinMethod::HostAlloc,
            PinMethod::Auto => PinMethod::Register,
            method => method,
        }
    }
}

/// Options of a registration of existing memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterOptions {
    /// Map into the device's address space (zero-copy). Default: on.
    pub mapped: bool,
    /// Usable from every GPU's context. Default: off.
    pub portable: bool,
    /// The largest range one driver call registers; larger ranges are registered in pieces
    /// where the device keeps host addresses for registered memory (so they stay contiguous),
    /// and refused elsewhere. Default: 16 GiB. No single-call limit has been observed; the
    /// split keeps each call's pinning time bounded.
    pub max_piece_bytes: usize,
}

impl Default for RegisterOptions {
    fn default() -> Self {
        RegisterOptions { mapped: true, portable: false, max_piece_bytes: 16 << 30 }
    }
}

/// A failed registration, with the memory handed back so no data is lost.
#[derive(Debug)]
pub struct RegisterError<M> {
    /// Why the registration failed.
    pub error: Error,
    /// The memory, unregistered and unchanged. `None` when the registration failed part-way (a
    /// range registered in pieces) and the pieces registered before the failure could not be
    /// unregistered at once: while a resident kernel runs they are unregistered once it ends,
    /// and the memory is kept until then, then freed; in a lost context they never are, and
    /// the memory is leaked. Either way it is not given back while still registered.
    pub memory: Option<M>,
}

impl<M> std::fmt::Display for RegisterError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "registration failed: {}", self.error)
    }
}

impl<M: std::fmt::Debug> std::error::Error for RegisterError<M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<M> From<RegisterError<M>> for Error {
    fn from(failure: RegisterError<M>) -> Error {
        failure.error
    }
}

/// How a [`HostBuf`]'s memory is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// Plain memory: the CPU backend, or nothing pinned it.
    Plain,
    /// Allocated and pinned by the driver (`cuMemHostAlloc`).
    DriverPinned,
    /// Memory of the process, registered with the driver (`cuMemHostRegister`).
    Registered,
}

/// The owner of a host buffer's memory.
pub(crate) enum HostStorage {
    /// Memory the backend pinned, registered or holds as is.
    Backend(HostMemory),
    Pooled(Box<PoolReturn>),
}

/// Page-aligned host memory holding `len` elements of `T`.
///
/// Held by value, it belongs to the CPU ([`HostBuf::as_slice`], [`HostBuf::as_mut_slice`]);
/// lent to a [`crate::Queue`], it belongs to the GPU work until reclaimed (see the
/// [module docs](crate::memory) for the contract).
///
/// # Examples
/// ```
/// use hetmem::{Device, HostBuf, PinOptions};
/// let device = Device::open_best()?;
/// let mut frame = HostBuf::<u8>::pinned(&device, 1920 * 1080 * 3, PinOptions::default())?;
/// frame.as_mut_slice().fill(128);
/// assert_eq!(frame.as_slice()[0], 128);
/// # Ok::<(), hetmem::Error>(())
/// ```
pub struct HostBuf<T> {
    storage: HostStorage,
    ptr: NonNull<T>,
    len: usize,
    kind: HostKind,
    device_ptr: Option<u64>,
    device_ordinal: Option<usize>,
    pages: Option<(NonNull<u8>, usize)>,
    _elems: PhantomData<T>,
}

// SAFETY: a HostBuf owns its memory exclusively (like a Box<[T]>), and T: Pod is plain data;
// the owners inside (driver allocations, registrations) are Send.
unsafe impl<T: Element> Send for HostBuf<T> {}
// SAFETY: shared references give out only &[T].
unsafe impl<T: Element> Sync for HostBuf<T> {}

impl<T: Element> HostBuf<T> {
    /// `len` zeroed elements of pinned host memory for `device` (plain memory on the CPU
    /// backend).
    ///
    /// # Errors
    /// Zero length, size overflow, or the driver refusing to pin (see the error's remedy).
    pub fn pinned(device: &Device, len: usize, options: PinOptions) -> Result<HostBuf<T>> {
        let bytes = byte_len::<T>("pinned buffer length", len)?;
        let storage = pin_bytes(device, bytes, &options)?;
        Ok(Self::from_storage(storage, len, device.gpu_ordinal()))
    }

    /// Registers a [`PageBox`] with `device` (kept as is on the CPU backend). The box owns whole
    /// pages, so the buffer can also be guarded.
    ///
    /// # Errors
    /// The driver refusing the registration; the box comes back unchanged in the error.
    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    pub fn register(
        device: &Device,
        mut memory: PageBox<T>,
        options: RegisterOptions,
    ) -> Result<HostBuf<T>, RegisterError<PageBox<T>>> {
        // The CPU and the GPU write through this pointer later: it comes from the box's own
        // mapping, not from a shared slice.
        let ptr = NonNull::new(memory.as_mut_ptr()).expect("PageBox is never null");
        let len = memory.len();
        let pages = memory.pages();
        let mut buf = Self::register_memory(device, memory, ptr, len, options)?;
        buf.pages = Some(pages);
        Ok(buf)
    }

    /// Registers a `Vec` with `device`. Its data must start on a page boundary; `Vec`s from
    /// the global allocator rarely do, so prefer [`PageBox`] or [`HostBuf::pinned`].
    ///
    /// # Errors
    /// An empty or misaligned `Vec`, or the driver refusing the registration; the `Vec` comes
    /// back unchanged in the error.
    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    pub fn register_vec(
        device: &Device,
        mut memory: Vec<T>,
        options: RegisterOptions,
    ) -> Result<HostBuf<T>, RegisterError<Vec<T>>> {
        if memory.is_empty() {
            let error = Error::invalid("registration length", "an empty Vec: register at least one element");
            return Err(RegisterError { error, memory: Some(memory) });
        }
        let address = memory.as_ptr() as usize;
        if !address.is_multiple_of(page_size()) {
            let error = Error::invalid(
                "registration alignment",
                format!(
                    "the Vec's data starts at {address:#x}, {} bytes past a page boundary; registered \
                     memory must start on a page ({} bytes): allocate it as a hetmem::memory::PageBox, \
                     or use HostBuf::pinned",
                    address % page_size(),
                    page_size()
                ),
            );
            return Err(RegisterError { error, memory: Some(memory) });
        }
        // Written later by the CPU and the GPU: `as_mut_ptr`, which may be written through,
        // unlike `as_ptr` (the Vec's heap block does not move when the Vec moves into the
        // buffer's storage).
        let ptr = NonNull::new(memory.as_mut_ptr()).expect("a non-empty Vec is never null");
        let len = memory.len();
        Self::register_memory(device, memory, ptr, len, options)
    }

    /// Registers memory that `owner` keeps alive, in place, where it lies: memory of another
    /// allocator or language runtime (a NumPy array, say), which need not start on a page.
    /// The driver pins whole pages, so the pages covering `[ptr, ptr + len)` are registered;
    /// the buffer's host and device addresses are those of `ptr` itself. Such a buffer cannot
    /// be guarded (it need not own its pages alone).
    ///
    /// # Safety
    /// `len` initialised elements live at `ptr` while `owner` lives and nothing else writes
    /// them while the buffer is lent; no other registration covers any of those pages (the
    /// driver refuses a page registered twice).
    ///
    /// # Errors
    /// Zero length, or the driver refusing the registration (a page already registered, say);
    /// the owner comes back in the error.
    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    pub unsafe fn register_in_place<M: Any + Send + Sync>(
        device: &Device,
        owner: M,
        ptr: NonNull<T>,
        len: usize,
        options: RegisterOptions,
    ) -> Result<HostBuf<T>, RegisterError<M>> {
        let bytes = match byte_len::<T>("registration length", len) {
            Ok(bytes) => bytes,
            Err(error) => return Err(RegisterError { error: error.into(), memory: Some(owner) }),
        };
        let address = ptr.as_ptr() as usize;
        let offset = address % page_size();
        let span = (offset + bytes).div_ceil(page_size()) * page_size();
        // The covering pages' start, derived from the caller's writable pointer.
        let start = ptr.as_ptr().cast::<u8>().wrapping_sub(offset);
        // SAFETY: the pages covering the caller's range are mapped while `owner` lives (the
        // function's contract), and `owner` moves into the registration, which unregisters the
        // pages before it lets the owner go.
        let memory = match unsafe { device.register_host(start, span, register_options(&options), owner) } {
            Ok(memory) => memory,
            Err(failed) => return Err(RegisterError { error: failed.error.into(), memory: failed.owner }),
        };
        Ok(Self::registered(memory, ptr, len, offset, device))
    }

    /// A buffer of `len` elements at `ptr`, `offset` bytes into the start of `memory`, which
    /// [`Device::register_host`] made.
    fn registered(
        memory: HostMemory,
        ptr: NonNull<T>,
        len: usize,
        offset: usize,
        device: &Device,
    ) -> HostBuf<T> {
        let device_ptr = memory.registered_device_ptr().map(|base| base + offset as u64);
        let kind = match memory {
            HostMemory::Registered(_) => HostKind::Registered,
            _ => HostKind::Plain,
        };
        let mut buf =
            Self::from_parts(HostStorage::Backend(memory), ptr, len, device_ptr, device.gpu_ordinal());
        buf.kind = kind;
        buf
    }

    #[allow(clippy::result_large_err, reason = "the error hands the caller\'s memory back, on a cold path")]
    fn register_memory<M: Any + Send + Sync>(
        device: &Device,
        memory: M,
        ptr: NonNull<T>,
        len: usize,
        options: RegisterOptions,
    ) -> Result<HostBuf<T>, RegisterError<M>> {
        let bytes = len * size_of::<T>();
        // SAFETY: `memory` owns [ptr, ptr + bytes) and moves into the registration, which
        // frees it only after unregistering the range.
        let memory = match unsafe {
            device.register_host(ptr.as_ptr().cast(), bytes, register_options(&options), memory)
        } {
            Ok(memory) => memory,
            Err(failed) => return Err(RegisterError { error: failed.error.into(), memory: failed.owner }),
        };
        Ok(Self::registered(memory, ptr, len, 0, device))
    }

    /// A buffer over storage made by [`pin_bytes`] (or the pool), which holds at least
    /// `len * size_of::<T>()` bytes at a page-aligned address.
    pub(crate) fn from_storage(
        storage: HostStorage,
        len: usize,
        device_ordinal: Option<usize>,
    ) -> HostBuf<T> {
        let (ptr, bytes, device_ptr, kind) = storage_layout(&storage);
        // Guard mode may only protect pages the buffer owns alone: the driver packs small
        // allocations several to a page, so anything not page-aligned and whole pages long is
        // not guardable.
        let whole_pages =
            (ptr.as_ptr() as usize).is_multiple_of(page_size()) && bytes.is_multiple_of(page_size());
        let pages = whole_pages.then_some((ptr, bytes));
        let mut buf = Self::from_parts(storage, ptr.cast(), len, device_ptr, device_ordinal);
        buf.kind = kind;
        buf.pages = pages;
        buf
    }

    fn from_parts(
        storage: HostStorage,
        ptr: NonNull<T>,
        len: usize,
        device_ptr: Option<u64>,
        device_ordinal: Option<usize>,
    ) -> HostBuf<T> {
        HostBuf {
            storage,
            ptr,
            len,
            kind: HostKind::Plain,
            device_ptr,
            device_ordinal,
            pages: None,
            _elems: PhantomData,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements.
    ///
    /// A known hole outside the hand-off: this slice, handed to another crate's asynchronous
    /// copy (cudarc's `memcpy_htod`, `memcpy_dtoh`), is still being read or written by a copy
    /// engine after the call returns, since the memory is page-locked; hetmem cannot wait for
    /// a copy it does not see (see [the module](crate::memory)). Lend the buffer and use
    /// [`crate::Lent::cudarc_host_mut`] instead.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised elements live at `ptr` while self does (every constructor
        // zeroes fresh memory or takes initialised memory; pooled blocks hold earlier, still
        // initialised, contents), and holding the buffer by value means no GPU work uses it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, mutably. The hole [`HostBuf::as_slice`] names holds here too.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in as_slice; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// How the memory is held.
    pub fn kind(&self) -> HostKind {
        self.kind
    }

    /// Whether kernels can address the memory directly (zero-copy).
    pub fn is_mapped(&self) -> bool {
        self.device_ptr.is_some()
    }

    /// The address kernels use, when mapped: on the device the buffer was made for. A
    /// portable buffer lent to a queue of another device is reached at the address that
    /// device's context gives (the queue asks the driver).
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }

    /// Whether every GPU's context of this process may use the buffer, not only the one it was
    /// made for ([`PinOptions::portable`], [`RegisterOptions::portable`]): such a buffer can be
    /// lent to a queue of any GPU. Always false on the CPU backend.
    pub fn is_portable(&self) -> bool {
        storage_portable(&self.storage)
    }

    /// How many driver registrations hold the memory (0 unless registered).
    pub fn registration_pieces(&self) -> usize {
        match &self.storage {
            HostStorage::Backend(memory) => memory.pieces(),
            HostStorage::Pooled(_) => 0,
        }
    }
}

/// Pins `bytes` for `device` the way `options` asks (plain pages on the CPU backend).
pub(crate) fn pin_bytes(device: &Device, bytes: usize, options: &PinOptions) -> Result<HostStorage> {
    check_pinnable("pinned buffer length", bytes)?;
    let pin = HostPin {
        mapped: options.mapped,
        portable: options.portable,
        write_combined: options.write_combined,
        driver_alloc: matches!(options.resolved_method(), PinMethod::HostAlloc | PinMethod::Auto),
        max_piece_bytes: RegisterOptions::default().max_piece_bytes,
    };
    Ok(HostStorage::Backend(device.pin_host(bytes, pin)?))
}

/// The backend's registration options for `options`.
fn register_options(options: &RegisterOptions) -> HostRegister {
    HostRegister {
        mapped: options.mapped,
        portable: options.portable,
        read_only: false,
        max_piece_bytes: options.max_piece_bytes,
    }
}

/// Whether the storage was pinned with the portable flag (usable from every context).
fn storage_portable(storage: &HostStorage) -> bool {
    match storage {
        HostStorage::Backend(memory) => memory.is_portable(),
        HostStorage::Pooled(block) => storage_portable(block.storage()),
    }
}

/// The start, usable size, device address and kind of storage made by [`pin_bytes`].
pub(crate) fn storage_layout(storage: &HostStorage) -> (NonNull<u8>, usize, Option<u64>, HostKind) {
    match storage {
        HostStorage::Backend(memory) => {
            let (start, bytes, device_ptr) = memory.layout();
            let kind = match memory {
                HostMemory::Pinned(_) => HostKind::DriverPinned,
                HostMemory::Registered(_) => HostKind::Registered,
                HostMemory::Plain(_) | HostMemory::Unregistered(_) => HostKind::Plain,
            };
            (start, bytes, device_ptr, kind)
        }
        HostStorage::Pooled(block) => storage_layout(block.storage()),
    }
}

impl<T: Element> Sealed for HostBuf<T> {
    fn region(&self) -> Region {
        Region {
            host: Some(self.ptr.cast()),
            device: self.device_ptr,
            bytes: self.len * size_of::<T>(),
            device_ordinal: self.device_ordinal,
            pages: self.pages,
            read_only: false,
            portable: storage_portable(&self.storage),
        }
    }
}

impl<T: Element> Buffer for HostBuf<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.len
    }
}

impl<T: Element> WritableBuffer for HostBuf<T> {}
impl<T: Element> HostVisible for HostBuf<T> {}

impl<T> std::fmt::Debug for HostBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf")
            .field("len", &self.len)
            .field("kind", &self.kind)
            .field("mapped", &self.device_ptr.is_some())
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
    fn cpu_pinned_buffers_are_zeroed_page_aligned_and_writable() {
        let mut buf = HostBuf::<u32>::pinned(&cpu(), 5000, PinOptions::default()).unwrap();
        assert_eq!(buf.as_slice().as_ptr() as usize % page_size(), 0);
        assert!(buf.as_slice().iter().all(|&word| word == 0));
        buf.as_mut_slice()[4999] = 9;
        assert_eq!(buf.as_slice()[4999], 9);
        assert_eq!(buf.kind(), HostKind::Plain);
        assert!(!buf.is_mapped());
    }

    #[test]
    fn a_misaligned_vec_is_refused_and_returned_intact() {
        // A Vec<u8> of one element is never page-aligned with glibc's allocator's 16-byte header
        // for small blocks; build one that certainly is misaligned by offsetting.
        let mut data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        if (data.as_ptr() as usize).is_multiple_of(page_size()) {
            data.insert(0, 1);
            data.shrink_to_fit();
        }
        let copy = data.clone();
        let failure = HostBuf::register_vec(&cpu(), data, RegisterOptions::default()).unwrap_err();
        assert!(failure.error.to_string().contains("past a page boundary"), "{}", failure.error);
        assert_eq!(failure.memory, Some(copy));
    }

    #[test]
    fn an_empty_vec_is_refused() {
        let failure =
            HostBuf::<u8>::register_vec(&cpu(), Vec::new(), RegisterOptions::default()).unwrap_err();
        assert!(matches!(failure.error, Error::InvalidArgument { what: "registration length", .. }));
    }

    #[test]
    fn a_registered_page_box_keeps_its_data() {
        let mut memory = PageBox::<u16>::huge(3 << 20).unwrap();
        memory.iter_mut().enumerate().for_each(|(i, v)| *v = i as u16);
        let buf = HostBuf::register(&cpu(), memory, RegisterOptions::default()).unwrap();
        assert!(buf.as_slice().iter().enumerate().all(|(i, &v)| v == i as u16));
        assert!(buf.region().pages.is_some());
    }

    #[test]
    fn memory_registered_in_place_is_seen_where_it_lies() {
        let mut rng = fastrand::Rng::new();
        let mut data: Vec<u32> = (0..3000).map(|_| rng.u32(..)).collect();
        let expected = data[7..].to_vec();
        // An address seven elements in: not on a page boundary.
        let ptr = NonNull::new(data[7..].as_mut_ptr()).unwrap();
        // SAFETY: `data` owns the elements and moves into the buffer as its owner.
        let buf = unsafe {
            HostBuf::register_in_place(&cpu(), data, ptr, expected.len(), RegisterOptions::default())
        }
        .unwrap();
        assert_eq!(buf.as_slice(), &expected[..]);
        assert_eq!(buf.as_slice().as_ptr(), ptr.as_ptr().cast_const());
        assert!(buf.region().pages.is_none());
        let mut empty = vec![0u8; 1];
        let ptr = NonNull::new(empty.as_mut_ptr()).unwrap();
        // SAFETY: as above.
        let failure =
            unsafe { HostBuf::register_in_place(&cpu(), empty, ptr, 0, RegisterOptions::default()) }
                .unwrap_err();
        assert!(failure.error.to_string().contains("0 elements"), "{}", failure.error);
    }

    #[test]
    fn zero_and_overflowing_lengths_are_clear_errors() {
        assert!(HostBuf::<u8>::pinned(&cpu(), 0, PinOptions::default()).is_err());
        let error = HostBuf::<u64>::pinned(&cpu(), usize::MAX / 2, PinOptions::default()).unwrap_err();
        assert!(error.to_string().contains("overflow"), "{error}");
    }
}
