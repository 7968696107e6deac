//! [`SharedHostBuf`]: host memory shared between processes (a sealed `memfd`, or a named
//! `/dev/shm` segment), mapped `MAP_SHARED` and registered with the GPU in every process
//! that maps it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};
use rustix::fs::{MemfdFlags, Mode, SealFlags};

use super::fd_passing::{recv_fds, send_fds};
use super::{Buffer, Element, HostBuf, HostVisible, Region, RegisterOptions, Sealed, WritableBuffer};
use crate::backend::Device;
use crate::backend::cpu::memory::{HUGE_PAGE_BYTES, byte_len, page_size};
use crate::error::{Error, Result};

/// `statfs` magic of tmpfs, where `memfd`s and `/dev/shm` segments live.
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `statfs` magic of hugetlbfs, where `MFD_HUGETLB` memfds live.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6_u32 as i64;
/// The longest segment name accepted (Linux allows 255 bytes for a file name).
const MAX_NAME_BYTES: usize = 200;
/// Opens the message that travels with a [`SharedHostBuf`]'s descriptor.
const SEND_MAGIC: u64 = u64::from_le_bytes(*b"HETMSHM1");

/// Options of a new [`SharedHostBuf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedOptions {
    /// How the creating process registers it with the GPU.
    pub register: RegisterOptions,
    /// Back a `memfd` with 2 MiB huge pages (`MFD_HUGETLB`): needs pages reserved in
    /// `/proc/sys/vm/nr_hugepages`, and fails with the kernel's error where there are none.
    /// The segment is then a whole number of huge pages long. Default: off.
    pub huge_pages: bool,
}

/// Whether a received segment may lack the seal against shrinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsealed {
    /// A named `/dev/shm` segment (which cannot be sealed) is taken: the caller's contract says
    /// no process truncates it (the `unsafe` creator and openers of [`SharedHostBuf`]).
    NamedTrusted,
    /// Nothing unsealed is taken: what a safe API maps must not shrink whatever the peer does.
    Refused,
}

/// A shared memory object mapped read-write `MAP_SHARED` into this process: what a
/// [`SharedHostBuf`] and the cross-process ring stand on.
pub(crate) struct SharedSegment {
    fd: OwnedFd,
    map: MmapMut,
    /// The size of the object, from `fstat` (or as made); the mapping covers all of it.
    bytes: usize,
    /// How errors name it: `memfd:LABEL` or `/dev/shm/NAME`.
    description: String,
    /// The `/dev/shm` name this process still has to unlink (the creator's, until the peer has
    /// opened it).
    name_to_unlink: Mutex<Option<String>>,
}

impl std::fmt::Debug for SharedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSegment")
            .field("description", &self.description)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

fn os_error(context: String, errno: rustix::io::Errno) -> Error {
    Error::Io { context, source: errno.into() }
}

/// `bytes` rounded up to a whole number of `page`s, or an error naming `what`.
pub(crate) fn round_up(what: &'static str, bytes: usize, page: usize) -> Result<usize> {
    bytes.checked_next_multiple_of(page).ok_or_else(|| {
        Error::invalid(what, format!("{bytes} bytes overflow when rounded up to {page}-byte pages"))
    })
}

/// `/NAME` for shm_open, after checking the name is one file name of printable characters.
fn shm_path(name: &str) -> Result<String> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    if bare.is_empty()
        || bare.len() > MAX_NAME_BYTES
        || bare.contains('/')
        || bare == "."
        || bare == ".."
        || !bare.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(Error::invalid(
            "shared memory name",
            format!(
                "{name:?}: a /dev/shm segment name is 1 to {MAX_NAME_BYTES} printable ASCII characters \
                 without '/' (an optional leading '/' aside)"
            ),
        ));
    }
    Ok(format!("/{bare}"))
}

impl SharedSegment {
    /// A new sealed `memfd` of at least `bytes` (rounded up to whole pages), labelled `label`
    /// (what `/proc/PID/fd` shows).
    pub(crate) fn memfd(label: &str, bytes: usize, huge_pages: bool) -> Result<SharedSegment> {
        let page = if huge_pages { HUGE_PAGE_BYTES } else { page_size() };
        let size = round_up("shared memory size", bytes, page)?;
        let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        if huge_pages {
            flags |= MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB;
        }
        let description = format!("memfd:{label}");
        let fd = rustix::fs::memfd_create(label, flags).map_err(|errno| {
            let hint =
                if huge_pages { " (huge pages: reserve some in /proc/sys/vm/nr_hugepages)" } else { "" };
            os_error(format!("creating {description} of {size} bytes{hint}"), errno)
        })?;
        rustix::fs::ftruncate(&fd, size as u64)
            .map_err(|errno| os_error(format!("sizing {description} to {size} bytes"), errno))?;
        // Sealed before any peer sees it: nobody can shrink it under a mapping (SIGBUS) or
        // grow it past what the peers checked, and the seals themselves cannot be lifted.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|errno| os_error(format!("sealing {description}"), errno))?;
        Self::map(fd, size, description, None).map_err(|error| match error {
            // The kernel takes huge pages only when they are mapped: say where they come from.
            Error::Io { context, source } if huge_pages => Error::Io {
                context: format!(
                    "{context} with 2 MiB huge pages (remedy: reserve some in /proc/sys/vm/nr_hugepages)"
                ),
                source,
            },
            other => other,
        })
    }

    /// A new `/dev/shm` segment `name` of `bytes` (rounded up to whole pages), which this
    /// process unlinks when it drops the segment, unless [`SharedSegment::unlink`] did before.
    ///
    /// # Errors
    /// A bad name; a segment of that name already there (`EEXIST`, named in the error with
    /// the remedy); the system's error.
    pub(crate) fn create_named(name: &str, bytes: usize) -> Result<SharedSegment> {
        let path = shm_path(name)?;
        let size = round_up("shared memory size", bytes, page_size())?;
        let description = format!("/dev/shm{path}");
        let flags = rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR;
        let fd = match rustix::shm::open(path.as_str(), flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => {
                return Err(Error::invalid(
                    "shared memory name",
                    format!(
                        "{description} already exists: another process uses that name, or one that \
                         crashed left it behind; remedy: choose another name, or, once no process \
                         uses it, remove it with SharedHostBuf::remove_named({name:?})"
                    ),
                ));
            }
            Err(errno) => return Err(os_error(format!("creating {description}"), errno)),
        };
        let unlink_on_failure = |error: Error| {
            let _ = rustix::shm::unlink(path.as_str());
            error
        };
        rustix::fs::ftruncate(&fd, size as u64).map_err(|errno| {
            unlink_on_failure(os_error(format!("sizing {description} to {size} bytes"), errno))
        })?;
        Self::map(fd, size, description, Some(path.clone())).map_err(unlink_on_failure)
    }

    /// Opens the `/dev/shm` segment `name` and unlinks the name at once: both processes hold
    /// the segment now, and no file stays behind whatever happens to either.
    ///
    /// # Errors
    /// A bad name, no such segment, or [`SharedSegment::from_fd`]'s errors.
    pub(crate) fn open_named(name: &str, min_bytes: usize) -> Result<SharedSegment> {
        let path = shm_path(name)?;
        let description = format!("/dev/shm{path}");
        let fd = rustix::shm::open(path.as_str(), rustix::shm::OFlags::RDWR, Mode::empty())
            .map_err(|errno| os_error(format!("opening {description}"), errno))?;
        // Another process may have unlinked it meanwhile: that is its right, and changes nothing.
        let _ = rustix::shm::unlink(path.as_str());
        Self::from_fd_described(fd, min_bytes, description, Unsealed::NamedTrusted)
    }

    /// Maps a shared memory object received from another process, after checking it is one
    /// (tmpfs or hugetlbfs, not a file on disk), at least `min_bytes` long, and sealed against
    /// shrinking (a named `/dev/shm` segment, which cannot be, only where `unsealed` allows).
    ///
    /// # Errors
    /// A descriptor of anything else, a segment smaller than `min_bytes` (named in the error),
    /// a segment that could still shrink under the mapping (and `unsealed` does not allow).
    pub(crate) fn from_fd(fd: OwnedFd, min_bytes: usize, unsealed: Unsealed) -> Result<SharedSegment> {
        let description = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map(|path| path.display().to_string())
            .unwrap_or_else(|_| format!("shared memory descriptor {}", fd.as_raw_fd()));
        Self::from_fd_described(fd, min_bytes, description, unsealed)
    }

    fn from_fd_described(
        fd: OwnedFd,
        min_bytes: usize,
        description: String,
        unsealed: Unsealed,
    ) -> Result<SharedSegment> {
        let stat =
            rustix::fs::fstat(&fd).map_err(|errno| os_error(format!("inspecting {description}"), errno))?;
        let statfs =
            rustix::fs::fstatfs(&fd).map_err(|errno| os_error(format!("inspecting {description}"), errno))?;
        let filesystem = statfs.f_type as i64;
        let is_regular =
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
        if !is_regular || (filesystem != TMPFS_MAGIC && filesystem != HUGETLBFS_MAGIC) {
            return Err(Error::invalid(
                "shared memory",
                format!(
                    "{description} is not shared memory (a memfd or a /dev/shm segment): file-backed \
                     MAP_SHARED pages cannot be registered writable with the GPU; remedy: share a \
                     memfd or a /dev/shm segment, and map files with MappedFile or WindowedFile"
                ),
            ));
        }
        // A /dev/shm segment cannot be sealed: taken unsealed only where its peers promised
        // not to truncate it (the `unsafe` openers of SharedHostBuf). Anything else, and every
        // segment a safe API maps, must be a memfd sealed against shrinking.
        let trusted = unsealed == Unsealed::NamedTrusted && description.starts_with("/dev/shm/");
        let sealed = match rustix::fs::fcntl_get_seals(&fd) {
            Ok(seals) => seals.contains(SealFlags::SHRINK),
            // A file that cannot be sealed (older kernels answer so for named segments).
            Err(rustix::io::Errno::INVAL) => false,
            Err(errno) => return Err(os_error(format!("reading the seals of {description}"), errno)),
        };
        if !sealed && !trusted {
            return Err(Error::invalid(
                "shared memory",
                format!(
                    "{description} is not sealed against shrinking: its creator could shrink it under \
                     the mapping (SIGBUS); remedy: share a memfd sealed with F_SEAL_SHRINK (hetmem's \
                     SharedHostBuf::create and RingProducer make one)"
                ),
            ));
        }
        // The size is read after the seals: a peer could shrink the object between an earlier
        // fstat and sealing it, leaving pages of the mapping past its end (SIGBUS).
        let stat =
            rustix::fs::fstat(&fd).map_err(|errno| os_error(format!("inspecting {description}"), errno))?;
        let bytes = usize::try_from(stat.st_size).map_err(|_| {
            Error::invalid("shared memory size", format!("{description} reports {} bytes", stat.st_size))
        })?;
        if bytes < min_bytes || bytes == 0 {
            return Err(Error::invalid(
                "shared memory size",
                format!(
                    "{description} holds {bytes} bytes, but {min_bytes} are expected: the peer made it \
                     smaller than it says (or it was truncated); refused rather than mapped, since \
                     touching the missing pages would crash the process (SIGBUS)"
                ),
            ));
        }
        Self::map(fd, bytes, description, None)
    }

    fn map(fd: OwnedFd, bytes: usize, description: String, name: Option<String>) -> Result<SharedSegment> {
        // SAFETY: memmap2's contract is that nothing truncates or modifies the object while it
        // is mapped. Truncation: a memfd is sealed against it (checked in from_fd_described,
        // done in memfd); a named segment's peers promise not to (the `unsafe` creator and
        // openers of SharedHostBuf; the ring takes sealed memfds only). Modification by the
        // peer is the purpose of the mapping: no reference to the bytes is made here, and
        // those handed out later carry that contract (SharedHostBuf) or the ring's slot
        // protocol, which gives one process at a time access.
        let map = unsafe { MmapOptions::new().len(bytes).map_mut(fd.as_raw_fd()) }
            .map_err(|source| Error::Io { context: format!("mapping {description}"), source })?;
        Ok(SharedSegment { fd, map, bytes, description, name_to_unlink: Mutex::new(name) })
    }

    /// The descriptor, to send to a peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The object's size, whole pages.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// How errors name it.
    pub(crate) fn description(&self) -> &str {
        &self.description
    }

    /// The mapping's first byte, which the CPU (and, once registered, the GPU) may write
    /// through: derived from the mapping itself, never from a shared slice.
    pub(crate) fn start(&self) -> NonNull<u8> {
        #[allow(
            clippy::as_ptr_cast_mut,
            reason = "a MAP_SHARED read-write mapping: written through, by design"
        )]
        NonNull::new(self.map.as_ptr().cast_mut()).expect("mappings are never null")
    }

    /// Removes the `/dev/shm` name now, if this process made it and has not yet: once the peer
    /// has opened the segment, nothing needs the name.
    ///
    /// # Errors
    /// The system's error; a name already gone is no error.
    pub(crate) fn unlink(&self) -> Result<()> {
        let name = self.name_to_unlink.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        match name.map(|name| rustix::shm::unlink(name.as_str())) {
            None | Some(Ok(())) | Some(Err(rustix::io::Errno::NOENT)) => Ok(()),
            Some(Err(errno)) => Err(os_error(format!("unlinking {}", self.description), errno)),
        }
    }
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        if let Err(error) = self.unlink() {
            tracing::warn!("{error}");
        }
    }
}

/// Host memory shared with other processes: a sealed `memfd` or a named `/dev/shm` segment,
/// mapped `MAP_SHARED` and registered (mapped for kernels, portable where asked) with the GPU
/// in each process that opens it; plain shared memory on the CPU backend, which behaves the
/// same.
///
/// In one process it is a buffer like a pinned [`HostBuf`]: held by value the CPU owns it;
/// lent or shared through a [`crate::Queue`] the GPU does, exactly as for pinned memory. The
/// descriptor travels to another process over a Unix socket ([`SharedHostBuf::send`],
/// [`SharedHostBuf::receive`]) or by name ([`SharedHostBuf::create_named`],
/// [`SharedHostBuf::open_named`]), and that process registers the same pages with its own GPU
/// context.
///
/// # Safety contract
/// The hand-off rule holds per process; between processes the program must keep it: while
/// one process holds a slice of the buffer (or has it lent to GPU work that writes it), no
/// other process may write it, and while one process writes it no other may read it.
/// Opening a buffer another process made is `unsafe` for that reason, and so is handing one
/// to another process ([`SharedHostBuf::send`], [`SharedHostBuf::fd`]): the safe slices of a
/// buffer no other process holds are sound, and one that does can write it. hetmem's
/// cross-process ring ([`crate::pipeline::shared_ring`]) keeps this rule for its slots by its
/// protocol, so it needs no `unsafe` from its users.
///
/// A `memfd` is sealed against shrinking and growing before it leaves its creator, and a
/// received one that is not sealed is refused; a named segment cannot be sealed, so the
/// processes sharing one must not truncate it (a truncation makes the mapping's pages fault).
///
/// # Examples
/// ```
/// use hetmem::Device;
/// use hetmem::memory::{SharedHostBuf, SharedOptions};
/// use std::os::unix::net::UnixStream;
///
/// let device = Device::open_best()?;
/// let (here, there) = UnixStream::pair().expect("a socket pair");
/// let mut mine = SharedHostBuf::<u32>::create(&device, 4096, SharedOptions::default())?;
/// mine.as_mut_slice().iter_mut().enumerate().for_each(|(i, x)| *x = i as u32 * 7);
/// // SAFETY: the receiver does not touch the buffer while this side uses it.
/// unsafe { mine.send(&here)? };
/// // In the other process (here the same one): the same pages, registered there too.
/// // SAFETY: the sender does not touch the buffer until the receiver is done with it.
/// let theirs = unsafe { SharedHostBuf::<u32>::receive(&device, &there, Default::default())? };
/// assert_eq!(theirs.as_slice()[100], 700);
/// # Ok::<(), hetmem::Error>(())
/// ```
pub struct SharedHostBuf<T> {
    buf: HostBuf<T>,
    segment: Arc<SharedSegment>,
}

impl<T: Element> SharedHostBuf<T> {
    /// `len` zeroed elements in a new sealed `memfd`, registered with `device`.
    ///
    /// # Errors
    /// Zero length or size overflow, the kernel refusing the memfd (huge pages none reserved),
    /// or the driver refusing the registration.
    pub fn create(device: &Device, len: usize, options: SharedOptions) -> Result<SharedHostBuf<T>> {
        let bytes = byte_len::<T>("shared buffer length", len)?;
        let segment = SharedSegment::memfd("hetmem-shared", bytes, options.huge_pages)?;
        Self::register(device, segment, len, options.register)
    }

    /// `len` zeroed elements in a new `/dev/shm` segment `name` (an optional leading `/`),
    /// registered with `device`. This process removes the name when the buffer is dropped, or
    /// at [`SharedHostBuf::unlink`]; [`SharedHostBuf::open_named`] removes it at once.
    ///
    /// # Safety
    /// A named segment cannot be sealed: any process of this user may open it while it has its
    /// name, and one that truncated it would make this process's reads of the buffer crash
    /// (SIGBUS, in safe code). The caller ensures no process truncates it, and that the
    /// processes sharing it keep the type's safety contract. [`SharedHostBuf::create`] (a
    /// sealed `memfd`) needs no such promise about truncation.
    ///
    /// # Errors
    /// A bad name, a name already taken (a live process's, or one a crashed process left:
    /// [`SharedHostBuf::remove_named`] reclaims it), or as for [`SharedHostBuf::create`].
    pub unsafe fn create_named(
        device: &Device,
        name: &str,
        len: usize,
        options: RegisterOptions,
    ) -> Result<SharedHostBuf<T>> {
        let bytes = byte_len::<T>("shared buffer length", len)?;
        let segment = SharedSegment::create_named(name, bytes)?;
        Self::register(device, segment, len, options)
    }

    /// Opens the `/dev/shm` segment `name` that another process made, unlinks the name (no
    /// file stays behind once both sides have the segment), and registers it with `device`.
    /// Its length is the segment's size in `T`s.
    ///
    /// # Safety
    /// The processes sharing it keep the type's safety contract: none writes it while another
    /// reads it, and none truncates it.
    ///
    /// # Errors
    /// A bad name, no such segment, one whose size is zero or not a whole number of `T`s, or
    /// the driver refusing the registration.
    pub unsafe fn open_named(
        device: &Device,
        name: &str,
        options: RegisterOptions,
    ) -> Result<SharedHostBuf<T>> {
        let segment = SharedSegment::open_named(name, 1)?;
        let len = elements_of::<T>(&segment)?;
        Self::register(device, segment, len, options)
    }

    /// Maps and registers the shared memory `fd` stands for (a `memfd` or `/dev/shm` segment
    /// another process made), `len` elements from its start.
    ///
    /// # Safety
    /// As for [`SharedHostBuf::open_named`].
    ///
    /// # Errors
    /// A descriptor that is not shared memory (a file on disk), one smaller than `len`
    /// elements (named in the error: refused, never a crash on the missing pages), an
    /// unsealed memfd, or the driver refusing the registration.
    pub unsafe fn from_fd(
        device: &Device,
        fd: OwnedFd,
        len: usize,
        options: RegisterOptions,
    ) -> Result<SharedHostBuf<T>> {
        let bytes = byte_len::<T>("shared buffer length", len)?;
        let segment = SharedSegment::from_fd(fd, bytes, Unsealed::NamedTrusted)?;
        Self::register(device, segment, len, options)
    }

    /// Sends the buffer's descriptor and length to the process at the other end of `socket`
    /// (a connected Unix socket), which opens it with [`SharedHostBuf::receive`].
    ///
    /// # Safety
    /// The receiving process keeps the type's safety contract: it writes the buffer only while
    /// this process holds no slice of it (and lends it to no GPU work), and reads it only
    /// while this process does not write it. Once it has the descriptor nothing in this
    /// process can stop it writing, so a peer that breaks the contract (a hostile or buggy
    /// one) turns this process's safe [`SharedHostBuf::as_slice`] into a data race: undefined
    /// behaviour. For a peer that is not trusted so far, use the cross-process ring
    /// ([`crate::pipeline::shared_ring`]), whose safe API copies out of peer-writable memory.
    ///
    /// # Errors
    /// The socket's error (a peer that is gone).
    pub unsafe fn send(&self, socket: &impl AsFd) -> Result<()> {
        let mut message = [0u8; 24];
        message[..8].copy_from_slice(&SEND_MAGIC.to_le_bytes());
        message[8..16].copy_from_slice(&(self.buf.len() as u64).to_le_bytes());
        message[16..].copy_from_slice(&(size_of::<T>() as u64).to_le_bytes());
        send_fds(socket.as_fd(), &message, &[self.segment.fd()])
    }

    /// Receives a buffer a peer sent with [`SharedHostBuf::send`] over `socket`, and maps and
    /// registers it with `device`.
    ///
    /// # Safety
    /// As for [`SharedHostBuf::open_named`].
    ///
    /// # Errors
    /// A message that is not a hetmem shared buffer's, of another element size, a descriptor
    /// missing, or as for [`SharedHostBuf::from_fd`].
    pub unsafe fn receive(
        device: &Device,
        socket: &impl AsFd,
        options: RegisterOptions,
    ) -> Result<SharedHostBuf<T>> {
        let mut message = [0u8; 24];
        let mut fds = recv_fds(socket.as_fd(), &mut message)?;
        let word = |at: usize| u64::from_le_bytes(message[at..at + 8].try_into().expect("8 bytes"));
        if word(0) != SEND_MAGIC || fds.len() != 1 {
            return Err(Error::invalid(
                "shared buffer message",
                format!(
                    "{} descriptors and no hetmem header: the peer did not send a SharedHostBuf",
                    fds.len()
                ),
            ));
        }
        if word(16) != size_of::<T>() as u64 {
            return Err(Error::invalid(
                "shared buffer element",
                format!("the peer's elements are {} bytes, this side's {}", word(16), size_of::<T>()),
            ));
        }
        let len = usize::try_from(word(8))
            .map_err(|_| Error::invalid("shared buffer length", format!("{} elements", word(8))))?;
        let fd = fds.pop().expect("checked: one descriptor");
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::from_fd(device, fd, len, options) }
    }

    /// Removes the `/dev/shm` name `name`, as when a crashed process left it behind; true if
    /// there was one. Processes that have it open keep their mapping.
    ///
    /// # Errors
    /// A bad name, or the system's error (permission).
    pub fn remove_named(name: &str) -> Result<bool> {
        let path = shm_path(name)?;
        match rustix::shm::unlink(path.as_str()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(errno) => Err(os_error(format!("removing /dev/shm{path}"), errno)),
        }
    }

    fn register(
        device: &Device,
        segment: SharedSegment,
        len: usize,
        options: RegisterOptions,
    ) -> Result<SharedHostBuf<T>> {
        let segment = Arc::new(segment);
        let start = segment.start();
        // Every constructor checked this already; checked again where the pointer is made.
        if len.checked_mul(size_of::<T>()).is_none_or(|bytes| bytes > segment.bytes()) {
            return Err(Error::invalid(
                "shared buffer length",
                format!("{len} elements of {} bytes do not fit {}", size_of::<T>(), segment.description()),
            ));
        }
        // SAFETY: `len` elements lie inside the mapping (checked just above) at its
        // page-aligned start, which is aligned for any T; shared memory is always initialised
        // (zero-filled pages, or what a peer wrote), and every bit pattern is a valid `T`
        // (Element: Pod). The mapping stays mapped while the owner, the segment, lives, and
        // moves into the registration. No other registration in this process covers these
        // pages: the mapping is fresh. Cross-process writes are the type's safety contract.
        let buf =
            unsafe { HostBuf::register_in_place(device, Arc::clone(&segment), start.cast(), len, options) }
                .map_err(|failure| failure.error)?;
        Ok(SharedHostBuf { buf, segment })
    }

    /// The elements. See the type's safety contract for other processes' writes.
    pub fn as_slice(&self) -> &[T] {
        self.buf.as_slice()
    }

    /// The elements, mutably. See the type's safety contract.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.buf.as_mut_slice()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Whether kernels can address it directly (zero-copy).
    pub fn is_mapped(&self) -> bool {
        self.buf.is_mapped()
    }

    /// How errors name the segment: `memfd:hetmem-shared` or `/dev/shm/NAME`.
    pub fn description(&self) -> &str {
        self.segment.description()
    }

    /// The segment's descriptor (to send by other means than [`SharedHostBuf::send`]).
    ///
    /// # Safety
    /// As [`SharedHostBuf::send`], for every process the descriptor (or a duplicate of it)
    /// reaches, and for any mapping made of it in this process.
    pub unsafe fn fd(&self) -> BorrowedFd<'_> {
        self.segment.fd()
    }

    /// Removes this process's `/dev/shm` name now rather than on drop: call it once the peer
    /// has opened the segment. Nothing for a `memfd`, or a name already removed.
    ///
    /// # Errors
    /// The system's error.
    pub fn unlink(&self) -> Result<()> {
        self.segment.unlink()
    }
}

/// The segment's size in whole `T`s.
fn elements_of<T>(segment: &SharedSegment) -> Result<usize> {
    let bytes = segment.bytes();
    if bytes == 0 || !bytes.is_multiple_of(size_of::<T>()) {
        return Err(Error::invalid(
            "shared memory size",
            format!(
                "{} holds {bytes} bytes: not a whole number of {}-byte elements",
                segment.description(),
                size_of::<T>()
            ),
        ));
    }
    Ok(bytes / size_of::<T>())
}

impl<T: Element> Sealed for SharedHostBuf<T> {
    fn region(&self) -> Region {
        self.buf.region()
    }
}

impl<T: Element> Buffer for SharedHostBuf<T> {
    type Elem = T;

    fn len(&self) -> usize {
        self.buf.len()
    }
}

impl<T: Element> WritableBuffer for SharedHostBuf<T> {}
impl<T: Element> HostVisible for SharedHostBuf<T> {}

impl<T> std::fmt::Debug for SharedHostBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedHostBuf").field("segment", &self.segment).field("buf", &self.buf).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn unique_name(tag: &str) -> String {
        format!("hetmem-test-{tag}-{}-{:016x}", std::process::id(), fastrand::u64(..))
    }

    #[test]
    fn a_sent_buffer_maps_the_same_pages() {
        let device = Device::cpu();
        let (here, there) = UnixStream::pair().unwrap();
        let mut mine = SharedHostBuf::<u64>::create(&device, 1000, SharedOptions::default()).unwrap();
        let data: Vec<u64> = (0..1000).map(|_| fastrand::u64(..)).collect();
        mine.as_mut_slice().copy_from_slice(&data);
        // SAFETY: one thread, taking turns.
        unsafe { mine.send(&here) }.unwrap();
        // SAFETY: one thread, taking turns.
        let mut theirs =
            unsafe { SharedHostBuf::<u64>::receive(&device, &there, Default::default()) }.unwrap();
        assert_eq!(theirs.as_slice(), &data[..]);
        theirs.as_mut_slice()[999] = !data[999];
        assert_eq!(mine.as_slice()[999], !data[999], "a write through one mapping shows in the other");
        assert!(theirs.description().starts_with("/memfd:hetmem-shared"), "{}", theirs.description());
    }

    #[test]
    fn a_memfd_too_small_for_the_claimed_length_is_refused_by_name() {
        let device = Device::cpu();
        let small = SharedHostBuf::<u8>::create(&device, 4096, SharedOptions::default()).unwrap();
        // SAFETY: the other mapping is refused before it is made.
        let fd = unsafe { small.fd() }.try_clone_to_owned().unwrap();
        // SAFETY: refused before anything is mapped.
        let error =
            unsafe { SharedHostBuf::<u8>::from_fd(&device, fd, 4097, Default::default()) }.unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("memfd:hetmem-shared")
                && text.contains("holds 4096 bytes")
                && text.contains("4097"),
            "{text}"
        );
    }

    #[test]
    fn an_unsealed_memfd_and_a_file_on_disk_are_refused() {
        let device = Device::cpu();
        let fd =
            rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        // SAFETY: refused before anything is mapped.
        let error =
            unsafe { SharedHostBuf::<u8>::from_fd(&device, fd, 8192, Default::default()) }.unwrap_err();
        assert!(error.to_string().contains("not sealed against shrinking"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap().into();
        // SAFETY: as above.
        let error =
            unsafe { SharedHostBuf::<u8>::from_fd(&device, fd, 8192, Default::default()) }.unwrap_err();
        // A tempdir may itself be on tmpfs: then the file is shared memory as far as the kernel
        // can tell, and accepted; anywhere else it is refused by name.
        let on_tmpfs = rustix::fs::statfs(dir.path()).unwrap().f_type as i64 == TMPFS_MAGIC;
        if !on_tmpfs {
            assert!(error.to_string().contains("is not shared memory"), "{error}");
        }
    }

    #[test]
    fn a_named_segment_is_unlinked_once_opened_and_a_taken_name_is_refused() {
        let device = Device::cpu();
        let name = unique_name("named");
        let path = std::path::PathBuf::from(format!("/dev/shm/{name}"));
        // SAFETY: nothing truncates the segment; one thread, taking turns.
        let mut mine =
            unsafe { SharedHostBuf::<u32>::create_named(&device, &name, 3000, Default::default()) }.unwrap();
        assert!(path.exists());
        // SAFETY: refused: the name is taken.
        let error = unsafe { SharedHostBuf::<u32>::create_named(&device, &name, 10, Default::default()) }
            .unwrap_err();
        assert!(error.to_string().contains(&format!("/dev/shm/{name} already exists")), "{error}");
        let data: Vec<u32> = (0..3000).map(|_| fastrand::u32(..)).collect();
        mine.as_mut_slice().copy_from_slice(&data);
        // SAFETY: one thread, taking turns.
        let theirs = unsafe { SharedHostBuf::<u32>::open_named(&device, &name, Default::default()) }.unwrap();
        assert!(!path.exists(), "opening removes the name");
        // Whole pages: 12000 bytes round up to 12288 on 4 KiB pages.
        assert_eq!(theirs.len() * 4, 12000usize.next_multiple_of(page_size()));
        assert_eq!(&theirs.as_slice()[..3000], &data[..]);
        drop(mine);
        assert!(!SharedHostBuf::<u8>::remove_named(&name).unwrap(), "nothing was left behind");
    }

    #[test]
    fn the_creator_removes_an_unopened_name_on_drop() {
        let name = unique_name("drop");
        // SAFETY: nothing else opens the segment.
        let buf =
            unsafe { SharedHostBuf::<u8>::create_named(&Device::cpu(), &name, 100, Default::default()) }
                .unwrap();
        assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists());
        drop(buf);
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    }

    /// Opens a `bytes`-byte memfd claiming `claimed` elements of `T`: Ok with the length,
    /// or the error's text.
    fn open_claiming<T: Element>(bytes: usize, claimed: usize) -> std::result::Result<usize, String> {
        let device = Device::cpu();
        let made = SharedHostBuf::<u8>::create(&device, bytes, SharedOptions::default()).unwrap();
        // SAFETY: nothing writes the buffer; both mappings only live in this test.
        let fd = unsafe { made.fd() }.try_clone_to_owned().unwrap();
        // SAFETY: nothing writes the buffer; both mappings only live in this test.
        unsafe { SharedHostBuf::<T>::from_fd(&device, fd, claimed, Default::default()) }
            .map(|buf| buf.len())
            .map_err(|error| error.to_string())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// A claimed length is taken exactly when the segment holds that many elements, and
        /// refused by name otherwise: zero, an overflowing byte count, or too few bytes.
        #[test]
        fn a_claimed_length_is_taken_exactly_when_the_segment_holds_it(
            pages in 1usize..6,
            claimed in proptest::prop_oneof![0usize..30_000, (usize::MAX - 8)..=usize::MAX],
            wide in proptest::bool::ANY,
        ) {
            let bytes = pages * page_size();
            let element = if wide { 8 } else { 1 };
            let result = if wide { open_claiming::<u64>(bytes, claimed) } else { open_claiming::<u8>(bytes, claimed) };
            // No slice may span more than isize::MAX bytes.
            match claimed.checked_mul(element).filter(|&need| need <= isize::MAX as usize) {
                _ if claimed == 0 => proptest::prop_assert!(result.unwrap_err().contains("0 elements")),
                None => proptest::prop_assert!(result.unwrap_err().contains("overflow")),
                Some(need) if need <= bytes => proptest::prop_assert_eq!(result, Ok(claimed)),
                Some(need) => {
                    let text = result.unwrap_err();
                    proptest::prop_assert!(
                        text.contains(&format!("holds {bytes} bytes, but {need} are expected")),
                        "{}", text
                    );
                }
            }
        }
    }

    #[test]
    fn bad_names_and_sizes_are_clear_errors() {
        for name in ["", "/", "a/b", "..", "white space", &"x".repeat(MAX_NAME_BYTES + 1)] {
            let error = SharedHostBuf::<u8>::remove_named(name).unwrap_err();
            assert!(error.to_string().contains("segment name"), "{name:?}: {error}");
        }
        let device = Device::cpu();
        assert!(SharedHostBuf::<u8>::create(&device, 0, SharedOptions::default()).is_err());
        let error =
            SharedHostBuf::<u64>::create(&device, usize::MAX / 4, SharedOptions::default()).unwrap_err();
        assert!(error.to_string().contains("overflow"), "{error}");
        assert!(round_up("size", usize::MAX - 1, 4096).is_err());
        assert_eq!(round_up("size", 4097, 4096).unwrap(), 8192);
    }
}
