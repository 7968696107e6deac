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
                }
            }
            None => Capabilities { gpu: false, maps_host_memory: false, concurrent_managed_access: false },
        }
    }
}
