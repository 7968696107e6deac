//! Memory every backend provides, dispatched here once: host memory pinned for the device,
//! registration of memory the process already has, device memory and managed memory. On the
//! CPU backend each is plain page-aligned memory ([`PageBox`]) or the caller's memory kept as
//! is; on a GPU the driver pins, registers or allocates it. The buffers of `crate::memory`
//! hold these and validate what they are asked before they get here.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::Device;
use super::cpu::memory::{HUGE_PAGE_BYTES, PageBox, page_size};
use super::cuda::{
    Advice, CudaDevice, DeviceAlloc, HostAllocFlags, ManagedAlloc, PinnedAlloc, RegisterFlags, Registration,
    RegistrationFailed, Stream,
};
use super::error::{BackendError, Result};

/// Host memory as a backend holds it.
pub(crate) enum HostMemory {
    /// Plain pages (the CPU backend).
    Plain(#[allow(dead_code, reason = "owned only to be freed on drop")] PageBox<u8>),
    /// Allocated and pinned by the driver (`cuMemHostAlloc`).
    Pinned(PinnedAlloc),
    /// Memory of the process, registered: the registration owns the memory it covers
    /// ([`Registration::covering`]), so the memory is freed only once it is unregistered.
    Registered(Registration),
    /// Memory of the process on the CPU backend, where nothing registers it.
    Unregistered(#[allow(dead_code, reason = "owned only to be freed on drop")] Box<dyn Any + Send + Sync>),
}

/// How host memory is pinned: validated options, the method already chosen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostPin {
    /// Map into the device's address space.
    pub mapped: bool,
    /// Usable from every GPU's context.
    pub portable: bool,
    /// Write-combined (only the driver's allocation can be).
    pub write_combined: bool,
    /// Let the driver allocate (`cuMemHostAlloc`) rather than register fresh pages.
    pub driver_alloc: bool,
    /// The largest range one registration call takes.
    pub max_piece_bytes: usize,
}

/// How memory of the process is registered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostRegister {
    /// Map into the device's address space.
    pub mapped: bool,
    /// Usable from every GPU's context.
    pub portable: bool,
    /// Registered to be read only (a read-only file mapping).
    pub read_only: bool,
    /// The largest range one registration call takes.
    pub max_piece_bytes: usize,
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HostMemory::Plain(_) => "Plain",
            HostMemory::Pinned(_) => "Pinned",
            HostMemory::Registered(_) => "Registered",
            HostMemory::Unregistered(_) => "Unregistered",
        })
    }
}

impl HostMemory {
    /// The start, the usable size and the device address, where there is one, of memory made
    /// by [`Device::pin_host`].
    ///
    /// # Panics
    /// On [`HostMemory::Unregistered`], whose extent only its owner knows.
    pub(crate) fn layout(&self) -> (NonNull<u8>, usize, Option<u64>) {
        match self {
            HostMemory::Plain(memory) => {
                let (start, bytes) = memory.pages();
                (start, bytes, None)
            }
            HostMemory::Pinned(alloc) => (
                NonNull::new(alloc.host_ptr()).expect("driver allocations are never null"),
                alloc.len_bytes(),
                alloc.device_ptr(),
            ),
            HostMemory::Registered(registration) => (
                NonNull::new(registration.host_ptr()).expect("registrations are never null"),
                registration.len_bytes(),
                registration.device_ptr(),
            ),
            HostMemory::Unregistered(_) => {
                unreachable!("pinning always makes memory of known extent")
            }
        }
    }

    /// The device address of registered memory's start.
    pub(crate) fn registered_device_ptr(&self) -> Option<u64> {
        match self {
            HostMemory::Registered(registration) => registration.device_ptr(),
            _ => None,
        }
    }

    /// Whether the driver registered the memory.
    pub(crate) fn is_registered(&self) -> bool {
        matches!(self, HostMemory::Registered(_))
    }

    /// Whether the memory was pinned with the portable flag (usable from every context).
    pub(crate) fn is_portable(&self) -> bool {
        match self {
            HostMemory::Plain(_) | HostMemory::Unregistered(_) => false,
            HostMemory::Pinned(alloc) => alloc.is_portable(),
            HostMemory::Registered(registration) => registration.is_portable(),
        }
    }

    /// How many driver registrations hold the memory (0 unless registered).
    pub(crate) fn pieces(&self) -> usize {
        match self {
            HostMemory::Registered(registration) => registration.pieces(),
            _ => 0,
        }
    }
}

impl Device {
    /// The GPU this device is, if it is one: its ordinal among the process's CUDA devices.
    /// `None` on the CPU backend.
    pub fn gpu_ordinal(&self) -> Option<usize> {
        match self {
            Device::Cuda(cuda) => Some(cuda.ordinal()),
            Device::Cpu(_) => None,
        }
    }

    /// `bytes` of zeroed host memory pinned for this device as `pin` says (plain pages on the
    /// CPU backend).
    ///
    /// # Errors
    /// The mapping or the driver failing to allocate or pin.
    pub(crate) fn pin_host(&self, bytes: usize, pin: HostPin) -> Result<HostMemory> {
        match self {
            Device::Cpu(_) => Ok(HostMemory::Plain(PageBox::zeroed(bytes)?)),
            Device::Cuda(cuda) => pin_on_gpu(cuda, bytes, pin),
        }
    }

    /// Registers `[ptr, ptr + bytes)`, whose memory `owner` keeps alive, with this device, and
    /// takes `owner`; on the CPU backend nothing registers it and `owner` is only kept.
    ///
    /// # Safety
    /// As for [`Registration::register`]: the range must be mapped memory of this process
    /// that stays mapped while `owner` lives, and is not registered elsewhere until the
    /// returned memory is dropped.
    ///
    /// # Errors
    /// As for [`Registration::register`], with the owner handed back where it can be.
    #[allow(clippy::result_large_err, reason = "the error hands the caller's memory back, on a cold path")]
    pub(crate) unsafe fn register_host<M: Any + Send + Sync>(
        &self,
        ptr: *mut u8,
        bytes: usize,
        options: HostRegister,
        owner: M,
    ) -> Result<HostMemory, RegistrationFailed<M>> {
        match self {
            Device::Cpu(_) => Ok(HostMemory::Unregistered(Box::new(owner))),
            Device::Cuda(cuda) => {
                let flags = RegisterFlags {
                    portable: options.portable,
                    device_map: options.mapped,
                    read_only: options.read_only,
                };
                // SAFETY: the caller's contract, passed on.
                unsafe { Registration::register(cuda, ptr, bytes, flags, options.max_piece_bytes, owner) }
                    .map(HostMemory::Registered)
            }
        }
    }
}

/// Pins `bytes` for `device` the way `pin` asks.
fn pin_on_gpu(device: &CudaDevice, bytes: usize, pin: HostPin) -> Result<HostMemory> {
    if pin.driver_alloc {
        let flags = HostAllocFlags {
            portable: pin.portable,
            device_map: pin.mapped,
            write_combined: pin.write_combined,
        };
        // Whole pages, so the buffer can be guarded and shares no page with another.
        let alloc = PinnedAlloc::zeroed(device, bytes.div_ceil(page_size()) * page_size(), flags)?;
        return Ok(HostMemory::Pinned(alloc));
    }
    if pin.write_combined {
        return Err(BackendError::invalid(
            "pin options",
            "write-combined memory can only come from the driver: use PinMethod::HostAlloc",
        ));
    }
    let memory =
        if bytes >= HUGE_PAGE_BYTES { PageBox::<u8>::huge(bytes)? } else { PageBox::<u8>::zeroed(bytes)? };
    let (start, map_len) = memory.pages();
    let flags = RegisterFlags { portable: pin.portable, device_map: pin.mapped, read_only: false };
    // SAFETY: `memory` owns [start, start + map_len) and moves into the registration, which
    // frees it only after unregistering the range.
    let registration = unsafe {
        Registration::register(device, start.as_ptr(), map_len, flags, pin.max_piece_bytes, memory)
    }
    .map_err(|failed| failed.error)?;
    Ok(HostMemory::Registered(registration))
}

/// Managed (unified) memory as a backend holds it: one address for the CPU and the GPU.
pub(crate) enum ManagedMemory {
    /// Plain pages (the CPU backend).
    Plain(#[allow(dead_code, reason = "owned only to be freed on drop")] PageBox<u8>),
    /// The driver's managed allocation.
    Cuda(ManagedAlloc),
}

impl ManagedMemory {
    /// The memory's first byte, which the CPU may touch at any time.
    pub(crate) fn host_ptr(&self) -> NonNull<u8> {
        match self {
            ManagedMemory::Plain(memory) => memory.pages().0,
            ManagedMemory::Cuda(alloc) => {
                NonNull::new(alloc.ptr() as *mut u8).expect("managed allocations are never null")
            }
        }
    }

    /// The address kernels use: the same as the CPU's, on a GPU.
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match self {
            ManagedMemory::Plain(_) => None,
            ManagedMemory::Cuda(alloc) => Some(alloc.ptr()),
        }
    }

    /// Gives the driver a hint about how the memory will be used; nothing to do on the CPU.
    ///
    /// # Errors
    /// The driver's error.
    pub(crate) fn advise(&self, advice: Advice) -> Result<()> {
        match self {
            ManagedMemory::Cuda(alloc) => alloc.advise(advice),
            ManagedMemory::Plain(_) => Ok(()),
        }
    }

    /// The driver allocation, where there is one.
    pub(crate) fn managed_alloc(&self) -> Option<&ManagedAlloc> {
        match self {
            ManagedMemory::Cuda(alloc) => Some(alloc),
            ManagedMemory::Plain(_) => None,
        }
    }
}

impl Device {
    /// `bytes` of zeroed managed memory (plain pages on the CPU backend).
    ///
    /// # Errors
    /// A GPU that does not let the CPU and the GPU touch managed memory at once (a CPU access
    /// during GPU work would crash), or the allocation failing.
    pub(crate) fn allocate_managed(&self, bytes: usize) -> Result<ManagedMemory> {
        let cuda = match self {
            Device::Cpu(_) => return Ok(ManagedMemory::Plain(PageBox::zeroed(bytes)?)),
            Device::Cuda(cuda) => cuda,
        };
        if !cuda.attributes().concurrent_managed_access {
            return Err(BackendError::invalid(
                "memory kind",
                format!(
                    "{} does not let CPU and GPU touch managed memory at once, so a CPU access \
                     during GPU work would crash: use HostBuf::pinned or DeviceBuf instead",
                    cuda.name()
                ),
            ));
        }
        let memory = ManagedMemory::Cuda(ManagedAlloc::new(cuda, bytes)?);
        // SAFETY: the allocation holds `bytes` bytes at its address, CPU-accessible because the
        // device has concurrent managed access (checked above); zeroing initialises them.
        unsafe { std::ptr::write_bytes(memory.host_ptr().as_ptr(), 0, bytes) };
        Ok(memory)
    }
}

/// 32-bit words the CPU and the device's kernels both poll and write, as a backend holds
/// them: plain memory on the CPU backend, zeroed mapped pinned memory on a GPU.
pub(crate) enum WordMemory {
    /// Plain memory (the CPU backend).
    Cpu(Box<[AtomicU32]>),
    /// Allocated zeroed and mapped (`device_map`), so the slice over it is initialised.
    Cuda {
        /// The allocation.
        alloc: PinnedAlloc,
        /// Its GPU.
        ordinal: usize,
    },
}

impl WordMemory {
    /// The words, as the CPU touches them.
    pub(crate) fn words(&self) -> &[AtomicU32] {
        match self {
            WordMemory::Cpu(words) => words,
            WordMemory::Cuda { alloc, .. } => {
                // SAFETY: the allocation is page-aligned (so 4-byte aligned), len_bytes long (a
                // multiple of 4), zeroed when allocated and owned by `self` for as long as the
                // returned borrow. The CPU touches it only through these atomics; kernels only
                // by 32-bit accesses, which never tear a word the CPU reads.
                unsafe {
                    std::slice::from_raw_parts(alloc.host_ptr().cast::<AtomicU32>(), alloc.len_bytes() / 4)
                }
            }
        }
    }

    /// The address kernels reach the first word at; `None` on the CPU backend.
    pub(crate) fn device_address(&self) -> Option<u64> {
        match self {
            WordMemory::Cpu(_) => None,
            WordMemory::Cuda { alloc, .. } => alloc.device_ptr(),
        }
    }

    /// The GPU whose kernels may use [`WordMemory::device_address`]; `None` on the CPU backend.
    pub(crate) fn gpu_ordinal(&self) -> Option<usize> {
        match self {
            WordMemory::Cpu(_) => None,
            WordMemory::Cuda { ordinal, .. } => Some(*ordinal),
        }
    }
}

impl Device {
    /// `words` zeroed 32-bit words: mapped pinned memory on a GPU, plain memory on the CPU
    /// backend. `words * 4` must not overflow (the caller bounds `words`).
    ///
    /// # Errors
    /// A GPU that cannot map host memory; the driver's error.
    pub(crate) fn allocate_words(&self, words: usize) -> Result<WordMemory> {
        let cuda = match self {
            Device::Cpu(_) => return Ok(WordMemory::Cpu((0..words).map(|_| AtomicU32::new(0)).collect())),
            Device::Cuda(cuda) => cuda,
        };
        if !cuda.attributes().can_map_host_memory {
            return Err(BackendError::invalid(
                "mapped words",
                format!("{} cannot map host memory into its address space: use another GPU", cuda.name()),
            ));
        }
        let flags = HostAllocFlags { device_map: true, ..HostAllocFlags::default() };
        // Zeroed before any word is read as an atomic: the driver leaves its memory unwritten.
        let alloc = PinnedAlloc::zeroed(cuda, words * 4, flags)?;
        Ok(WordMemory::Cuda { alloc, ordinal: cuda.ordinal() })
    }
}

/// Device memory as a backend holds it: the GPU's, or plain pages on the CPU backend.
pub(crate) enum DeviceMemory {
    /// Plain pages (the CPU backend).
    Plain(PageBox<u8>),
    /// Memory on a GPU, with the stream its whole-buffer copies run on.
    Cuda {
        /// The allocation.
        alloc: DeviceAlloc,
        /// The device's utility stream, which its copies and its zeroing run on.
        stream: Arc<Stream>,
        /// Its device.
        device: CudaDevice,
    },
}

impl Device {
    /// `bytes` of device memory (plain zeroed pages on the CPU backend). A GPU's memory comes
    /// uninitialised: hold it where it is freed only once [`DeviceMemory::stream`] is idle,
    /// then [`DeviceMemory::zero_fresh`] it.
    ///
    /// # Errors
    /// The allocation failing, or the device's utility stream failing to be made.
    pub(crate) fn allocate_device(&self, bytes: usize) -> Result<DeviceMemory> {
        match self {
            Device::Cpu(_) => Ok(DeviceMemory::Plain(PageBox::zeroed(bytes)?)),
            Device::Cuda(cuda) => {
                let stream = cuda.utility_stream()?;
                Ok(DeviceMemory::Cuda { alloc: DeviceAlloc::new(cuda, bytes)?, stream, device: cuda.clone() })
            }
        }
    }
}

impl DeviceMemory {
    /// The stream GPU work on the memory runs on, which must be idle before it is freed (none
    /// on the CPU backend).
    pub(crate) fn stream(&self) -> Option<&Arc<Stream>> {
        match self {
            DeviceMemory::Plain(_) => None,
            DeviceMemory::Cuda { stream, .. } => Some(stream),
        }
    }

    /// Zeroes memory fresh from [`Device::allocate_device`], queued on its stream: the GPU's
    /// comes uninitialised, the CPU backend's pages are zero already.
    ///
    /// # Errors
    /// The driver's error.
    pub(crate) fn zero_fresh(&mut self) -> Result<()> {
        match self {
            DeviceMemory::Plain(_) => Ok(()),
            DeviceMemory::Cuda { alloc, stream, .. } => alloc.zero(stream),
        }
    }

    /// Copies `src` to the memory's start and waits for the copy.
    ///
    /// # Errors
    /// `src` longer than the memory; a failed copy.
    pub(crate) fn upload(&mut self, src: &[u8]) -> Result<()> {
        match self {
            DeviceMemory::Plain(memory) => {
                crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Copy)?;
                memory[..src.len()].copy_from_slice(src);
                Ok(())
            }
            DeviceMemory::Cuda { alloc, stream, .. } => alloc.upload(stream, src),
        }
    }

    /// Copies the memory's first `dst.len()` bytes into `dst` and waits for the copy.
    ///
    /// # Errors
    /// `dst` longer than the memory; a failed copy.
    pub(crate) fn download(&self, dst: &mut [u8]) -> Result<()> {
        match self {
            DeviceMemory::Plain(memory) => {
                crate::faults::fail::<BackendError>(crate::faults::FaultPoint::Copy)?;
                dst.copy_from_slice(&memory[..dst.len()]);
                Ok(())
            }
            DeviceMemory::Cuda { alloc, stream, .. } => alloc.download(stream, dst),
        }
    }

    /// The memory's first byte for the CPU: on the CPU backend only.
    pub(crate) fn host_ptr(&self) -> Option<NonNull<u8>> {
        match self {
            DeviceMemory::Plain(memory) => Some(memory.pages().0),
            DeviceMemory::Cuda { .. } => None,
        }
    }

    /// The memory's address on its GPU.
    pub(crate) fn device_ptr(&self) -> Option<u64> {
        match self {
            DeviceMemory::Plain(_) => None,
            DeviceMemory::Cuda { alloc, .. } => Some(alloc.device_ptr()),
        }
    }

    /// The ordinal of its GPU.
    pub(crate) fn gpu_ordinal(&self) -> Option<usize> {
        match self {
            DeviceMemory::Plain(_) => None,
            DeviceMemory::Cuda { device, .. } => Some(device.ordinal()),
        }
    }
}
