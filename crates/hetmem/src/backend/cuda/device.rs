//! A CUDA device: its context, what it is, and what it can do with host memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};

use super::context::Context;
use super::module::Module;
use super::stream::Stream;
use super::{Call, driver};
use crate::backend::cuda::error::{CudaError, Unavailable};

/// A GPU's compute capability, for example 9.0 for Hopper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ComputeCapability {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl ComputeCapability {
    /// The NVRTC architecture name that produces machine code for it, for example `sm_90`.
    pub fn sm_name(self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The device attributes that decide how hetmem moves data. `Default` is a device with none of
/// them (for tests of decisions made from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceAttributes {
    /// Host memory can be mapped into the device's address space (zero-copy).
    pub can_map_host_memory: bool,
    /// Host and device share one virtual address space (UVA).
    pub unified_addressing: bool,
    /// Kernels may read plain pageable host memory (HMM or ATS); without it, a kernel that
    /// dereferences a `malloc` pointer faults.
    pub pageable_memory_access: bool,
    /// Pageable access goes through the host's page tables (ATS, for example Grace Hopper).
    pub pageable_memory_access_uses_host_page_tables: bool,
    /// The CPU and GPU may touch managed memory at the same time.
    pub concurrent_managed_access: bool,
    /// Existing host memory can be registered (`cuMemHostRegister`).
    pub host_register_supported: bool,
    /// Read-only mappings can be registered with the read-only flag.
    pub read_only_host_register_supported: bool,
    /// Atomics on host memory are native over the link.
    pub host_native_atomic_supported: bool,
    /// Copy engines: 2 or more lets uploads and downloads overlap.
    pub async_engine_count: u32,
    /// The GPU shares physical memory with the CPU.
    pub integrated: bool,
    /// Streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// GPUDirect RDMA is supported.
    pub gpu_direct_rdma_supported: bool,
    /// Registered host memory has the same address on the device as on the host.
    pub can_use_host_pointer_for_registered_mem: bool,
}

/// One CUDA device and its primary context. Cheap to clone; clones share the context.
#[derive(Clone)]
pub struct CudaDevice {
    shared: Arc<Shared>,
}

struct Shared {
    ctx: Arc<Context>,
    ordinal: usize,
    name: String,
    compute_capability: ComputeCapability,
    total_memory: u64,
    pci_bus_id: String,
    attributes: DeviceAttributes,
    modules: Mutex<HashMap<String, Arc<Module>>>,
    utility_stream: Mutex<Option<Arc<Stream>>>,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.shared.ordinal)
            .field("name", &self.shared.name)
            .field("compute_capability", &self.shared.compute_capability)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// How many CUDA devices the driver sees.
    ///
    /// # Errors
    /// Why the CUDA backend cannot run here.
    pub fn count() -> Result<usize, Unavailable> {
        driver::driver().map(|info| info.device_count)
    }

    /// The product name of every device the driver sees, by ordinal; no context is made.
    ///
    /// # Errors
    /// Why the CUDA backend cannot run here, or a failing driver call.
    pub fn names() -> Result<Vec<String>, Unavailable> {
        let info = driver::driver()?;
        (0..info.device_count)
            .map(|ordinal| {
                let device = result::device::get(ordinal as i32).call("cuDeviceGet")?;
                result::device::get_name(device).call("cuDeviceGetName")
            })
            .collect::<Result<_, CudaError>>()
            .map_err(|error| Unavailable::InitFailed { error: error.to_string() })
    }

    /// Whether kernels on this device can address `other`'s memory directly
    /// (`cuDeviceCanAccessPeer`). Always false for the same device.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn can_access_peer(&self, other: &CudaDevice) -> Result<bool, CudaError> {
        if self.ordinal() == other.ordinal() {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: both device handles came from cuDeviceGet on an initialised driver (their
        // contexts are retained while `self` and `other` live); the call writes one int.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.shared.ctx.device(), other.shared.ctx.device()) }
            .call("cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    /// Opens device `ordinal` (0 is the first).
    ///
    /// # Errors
    /// Why that device cannot be used: no driver, a driver too old, no such device, or a
    /// failure to create its context.
    pub fn open(ordinal: usize) -> Result<CudaDevice, Unavailable> {
        let info = driver::driver()?;
        if ordinal >= info.device_count {
            return Err(Unavailable::NoSuchDevice { index: ordinal, count: info.device_count });
        }
        Self::describe(ordinal).map_err(|error| Unavailable::InitFailed { error: error.to_string() })
    }

    fn describe(ordinal: usize) -> Result<CudaDevice, CudaError> {
        let ctx = Arc::new(Context::retain(ordinal)?);
        let device = ctx.device();
        let attribute = |attribute| {
            // SAFETY: `device` came from cuDeviceGet on an initialised driver; the call writes
            // one int.
            unsafe { result::device::get_attribute(device, attribute) }.call("cuDeviceGetAttribute")
        };
        let flag = |attribute_id| attribute(attribute_id).map(|value| value != 0);
        use sys::CUdevice_attribute as A;
        let attributes = DeviceAttributes {
            can_map_host_memory: flag(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?,
            unified_addressing: flag(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?,
            pageable_memory_access: flag(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)?,
            pageable_memory_access_uses_host_page_tables: flag(
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
            )?,
            concurrent_managed_access: flag(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)?,
            host_register_supported: flag(A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)?,
            read_only_host_register_supported: flag(
                A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
            )?,
            host_native_atomic_supported: flag(A::CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED)?,
            async_engine_count: attribute(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as u32,
            integrated: flag(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)?,
            multiprocessor_count: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            gpu_direct_rdma_supported: flag(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)?,
            can_use_host_pointer_for_registered_mem: flag(
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            )?,
        };
        let compute_capability = ComputeCapability {
            major: attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            minor: attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        };
        // SAFETY: as above, `device` is valid; the call writes one size_t.
        let total_memory = unsafe { result::device::total_mem(device) }.call("cuDeviceTotalMem")? as u64;
        let mut bus_id = [0u8; 32];
        // SAFETY: the buffer is 32 bytes and its length is passed; the driver writes a
        // NUL-terminated string of at most that length.
        unsafe { sys::cuDeviceGetPCIBusId(bus_id.as_mut_ptr().cast(), bus_id.len() as i32, device) }
            .call("cuDeviceGetPCIBusId")?;
        let pci_bus_id = std::ffi::CStr::from_bytes_until_nul(&bus_id)
            .map(|id| id.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(CudaDevice {
            shared: Arc::new(Shared {
                ctx,
                ordinal,
                name: result::device::get_name(device).call("cuDeviceGetName")?,
                compute_capability,
                total_memory,
                pci_bus_id,
                attributes,
                modules: Mutex::new(HashMap::new()),
                utility_stream: Mutex::new(None),
            }),
        })
    }

    /// The device's index among the driver's devices.
    pub fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    /// The product name, for example `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The compute capability.
    pub fn compute_capability(&self) -> ComputeCapability {
        self.shared.compute_capability
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> u64 {
        self.shared.total_memory
    }

    /// The PCI bus id, for example `0000:1B:00.0` (used to find the device in NVML).
    pub fn pci_bus_id(&self) -> &str {
        &self.shared.pci_bus_id
    }

    /// The attributes that decide how memory is shared with this device.
    pub fn attributes(&self) -> &DeviceAttributes {
        &self.shared.attributes
    }

    /// Whether registered host memory keeps its host address on the device.
    pub fn uses_host_pointer_for_registered_memory(&self) -> bool {
        self.shared.attributes.can_use_host_pointer_for_registered_mem
    }

    /// Free and total device memory in bytes, as the driver sees them now.
    ///
    /// # Errors
    /// A failing driver call.
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (free, total) = result::mem_get_info().call("cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    /// Waits for all work on the device; surfaces any error recorded while releasing resources.
    ///
    /// # Errors
    /// A failed kernel or copy anywhere on the device, or a deferred release error;
    /// [`BackendError::ResidentKernelRunning`](crate::backend::BackendError::ResidentKernelRunning) while a resident kernel (a doorbell) runs, since
    /// the wait would never end.
    pub fn synchronize(&self) -> crate::backend::error::Result<()> {
        self.synchronize_work()?;
        match self.shared.ctx.take_deferred_error() {
            Some(error) => Err(error.into()),
            None => Ok(()),
        }
    }

    /// Waits for all work on the device, as [`CudaDevice::synchronize`] does, but leaves a
    /// deferred release error where it is, for the next [`CudaDevice::synchronize`] to
    /// report: for a caller that only needs the device idle (before it lets memory go that
    /// GPU work may still use), for which an earlier, unrelated release's failure says nothing.
    ///
    /// # Errors
    /// A failed kernel or copy anywhere on the device (the work may not have finished);
    /// [`BackendError::ResidentKernelRunning`](crate::backend::BackendError::ResidentKernelRunning) while a resident kernel runs, since the wait
    /// would never end.
    pub fn synchronize_work(&self) -> crate::backend::error::Result<()> {
        let no_resident = self.shared.ctx.check_no_resident("cuCtxSynchronize")?;
        self.bind()?;
        result::ctx::synchronize().call("cuCtxSynchronize")?;
        drop(no_resident);
        Ok(())
    }

    /// Waits for the work on the legacy default stream, where the driver's synchronous copies
    /// run ([`crate::backend::cuda::DeviceAlloc::upload_sync`]): one from pageable memory
    /// returns once its source is staged, before its last chunk has reached the device.
    ///
    /// hetmem's own streams are non-blocking, which the legacy stream does not wait for, so
    /// by CUDA's stream semantics this does not wait for a resident kernel (not probed on the
    /// H200 machine, unlike [`CudaDevice::synchronize`], which does).
    ///
    /// # Errors
    /// A failed copy on the default stream.
    pub(crate) fn synchronize_default_stream(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the null handle names the bound context's legacy default stream (cudarc calls
        // the entry points without per-thread default streams), which exists for the life of
        // the context and is never destroyed.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }.call("cuStreamSynchronize")
    }

    /// A stream shared by the device's synchronous conveniences (whole-buffer copies).
    ///
    /// # Errors
    /// Creating the stream failed.
    pub fn utility_stream(&self) -> Result<Arc<Stream>, CudaError> {
        let mut slot = self.shared.utility_stream.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(stream) = slot.as_ref() {
            return Ok(Arc::clone(stream));
        }
        let stream = Arc::new(Stream::new(self)?);
        *slot = Some(Arc::clone(&stream));
        Ok(stream)
    }

    /// The module cached under `key`, loading it with `load` on first use.
    pub(crate) fn cached_module<E>(
        &self,
        key: &str,
        load: impl FnOnce() -> Result<Arc<Module>, E>,
    ) -> Result<Arc<Module>, E> {
        let mut modules = self.shared.modules.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(module) = modules.get(key) {
            return Ok(Arc::clone(module));
        }
        let module = load()?;
        modules.insert(key.to_string(), Arc::clone(&module));
        Ok(module)
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.shared.ctx
    }

    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.shared.ctx.bind()
    }
}
