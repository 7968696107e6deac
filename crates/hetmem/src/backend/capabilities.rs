//! [`Capabilities`]: what a device offers the layers above, whatever its backend.

use super::Device;

/// What a device can do, as the strategies and placement ask it: the questions they used to
/// answer by looking at which backend a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Work runs on a GPU (false on the CPU backend).
    pub gpu: bool,
    /// The GPU can map host memory into its address space (zero-copy).
    pub maps_host_memory: bool,
    /// The CPU and the GPU may access managed memory at once.
    pub concurrent_managed_access: bool,
    /// Units that run blocks at once: the GPU's multiprocessors (1 on the CPU backend, whose
    /// emulation of a kernel plans as for one).
    pub multiprocessors: u32,
    /// The GPU shares the host's memory (an integrated GPU): mapped memory is its own memory.
    pub integrated: bool,
    /// The GPU reads host memory through the CPU's page tables (a coherent link such as
    /// NVLink-C2C) rather than across PCIe.
    pub host_memory_through_page_tables: bool,
    /// The link to the host performs atomic read-modify-writes natively
    /// (`CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED`), so a GPU atomic on host memory is
    /// atomic with the CPU's. False over PCIe (the H200's case) and on the CPU backend, which
    /// has no GPU to race: there a read-modify-write of a mapped word is atomic only among the
    /// threads of one side.
    pub host_native_atomics: bool,
}

impl Device {
    /// What this device offers.
    pub fn capabilities(&self) -> Capabilities {
        match self.as_cuda() {
            Some(gpu) => {
                let attributes = gpu.attributes();
                Capabilities {
                    gpu: true,
                    maps_host_memory: attributes.can_map_host_memory,
                    concurrent_managed_access: attributes.concurrent_managed_access,
                    multiprocessors: attributes.multiprocessor_count,
                    integrated: attributes.integrated,
                    host_memory_through_page_tables: attributes.pageable_memory_access_uses_host_page_tables,
                    host_native_atomics: attributes.host_native_atomic_supported,
                }
            }
            None => Capabilities {
                gpu: false,
                maps_host_memory: false,
                concurrent_managed_access: false,
                multiprocessors: 1,
                integrated: false,
                host_memory_through_page_tables: false,
                host_native_atomics: false,
            },
        }
    }
}
