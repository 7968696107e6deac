//! Loaded GPU code: modules (a compiled image) and kernels (an entry point in one).

use std::collections::BTreeMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys};

use super::context::{Context, Release};
use super::{Call, CudaDevice, Stream};
use crate::backend::error::{BackendError, Result};

/// A module loaded from a CUBIN or PTX image; unloaded when the last kernel from it drops.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<Context>,
    /// The dynamic shared memory each of its functions has been allowed, by function handle
    /// (see [`Kernel::allow_dynamic_shared`]).
    shared_allowed: Mutex<BTreeMap<usize, u32>>,
}

// SAFETY: module handles are plain driver handles, usable from any thread with the context
// bound (every method binds it).
unsafe impl Send for Module {}
// SAFETY: as for Send; the module is immutable once loaded.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a CUBIN or PTX image into `device`'s context.
    ///
    /// # Safety
    /// `image` must be a complete CUBIN (ELF) or PTX text from a trusted source: the driver
    /// takes no length and trusts the lengths inside an ELF image, so a truncated or forged one
    /// makes it read past the slice; and the code it holds runs with access to the context's
    /// memory.
    ///
    /// # Errors
    /// An empty image, or the driver's error: an image for another architecture, or PTX
    /// newer than the driver.
    pub unsafe fn load(device: &CudaDevice, image: &[u8]) -> Result<Arc<Module>> {
        if image.is_empty() {
            return Err(BackendError::invalid("module image", "empty"));
        }
        // PTX is text and must end in NUL; a CUBIN (ELF) carries its own length.
        let owned;
        let image = if !image.starts_with(b"\x7fELF") && image.last() != Some(&0) {
            owned = [image, &[0]].concat();
            &owned[..]
        } else {
            image
        };
        // Loading waits for the whole device, so for a resident kernel: refuse rather than hang.
        let no_resident = device.context().check_no_resident("cuModuleLoadData")?;
        device.bind()?;
        // SAFETY: the caller guarantees a complete ELF image, or PTX text, which is
        // NUL-terminated here; it lives for the call and the driver copies what it keeps.
        let raw = unsafe { result::module::load_data(image.as_ptr().cast()) }.call("cuModuleLoadData")?;
        drop(no_resident);
        Ok(Arc::new(Module { raw, ctx: Arc::clone(device.context()), shared_allowed: Mutex::default() }))
    }

    /// The kernel named `name` (an `extern "C"` entry point).
    ///
    /// # Errors
    /// No such entry point in the module.
    pub fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let c_name = CString::new(name)
            .map_err(|_| BackendError::invalid("kernel name", format!("{name:?} contains NUL")))?;
        self.ctx.bind()?;
        // SAFETY: `raw` is a loaded module; the returned handle lives as long as the module,
        // which the Kernel keeps alive through its Arc.
        let raw = unsafe { result::module::get_function(self.raw, c_name) }.call("cuModuleGetFunction")?;
        Ok(Kernel { raw, owner: Owner::Module(Arc::clone(self)), name: name.to_string() })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Unloaded once; no Kernel remains (each holds an Arc to this module), and the driver
        // lets launched work finish before it frees the code.
        self.ctx.release(Release::Module(self.raw as usize));
    }
}

/// The grid, block and shared memory of one kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch of `block` threads per block covering `items` work items, capped at
    /// `max_blocks` blocks (grid-stride kernels loop over the rest).
    pub fn linear(items: usize, block: u32, max_blocks: u32) -> LaunchConfig {
        let blocks = items.div_ceil(block as usize).clamp(1, max_blocks as usize) as u32;
        LaunchConfig { grid: (blocks, 1, 1), block: (block, 1, 1), shared_bytes: 0 }
    }
}

/// An entry point of a loaded module.
#[derive(Debug, Clone)]
pub struct Kernel {
    raw: sys::CUfunction,
    owner: Owner,
    name: String,
}

/// What keeps a kernel's code loaded.
#[derive(Clone)]
enum Owner {
    /// A module hetmem loaded.
    Module(Arc<Module>),
    /// Code loaded by another library (a cudarc function, kept alive here), in `ctx`.
    Foreign { ctx: Arc<Context>, _keep: Arc<dyn std::any::Any + Send + Sync> },
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::Module(_) => "Module",
            Owner::Foreign { .. } => "Foreign",
        })
    }
}

impl Owner {
    fn ctx(&self) -> &Arc<Context> {
        match self {
            Owner::Module(module) => &module.ctx,
            Owner::Foreign { ctx, .. } => ctx,
        }
    }
}

// SAFETY: function handles are immutable driver handles, valid from any thread while their
// code is loaded (the owner keeps it loaded).
unsafe impl Send for Kernel {}
// SAFETY: as for Send.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// A kernel whose code another library loaded into `ctx` and keeps alive through `keep`.
    ///
    /// # Safety
    /// `raw` must be a function of code loaded into `ctx`, which `keep` keeps loaded.
    pub(crate) unsafe fn foreign(
        raw: sys::CUfunction,
        ctx: Arc<Context>,
        keep: Arc<dyn std::any::Any + Send + Sync>,
        name: &str,
    ) -> Kernel {
        Kernel { raw, owner: Owner::Foreign { ctx, _keep: keep }, name: name.to_string() }
    }

    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Allows launches with up to `bytes` of dynamic shared memory (above the default 48 KiB
    /// needs this opt-in).
    ///
    /// The allowance belongs to the function, which every `Kernel` of one loaded module's entry
    /// point shares, not to a launch. So for hetmem's modules it only grows: a thread allowing
    /// less never undercuts a larger allowance another thread has just set for its own launch
    /// (which the driver would then refuse). For a foreign kernel it is set as asked.
    ///
    /// # Errors
    /// More than the device offers per block.
    pub fn allow_dynamic_shared(&self, bytes: u32) -> Result<()> {
        let set = |bytes: u32| -> Result<()> {
            self.owner.ctx().bind()?;
            // SAFETY: the function handle is live (its code is held); the attribute takes an int.
            unsafe {
                result::function::set_function_attribute(
                    self.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
            }
            .call("cuFuncSetAttribute")?;
            Ok(())
        };
        match &self.owner {
            Owner::Module(module) => {
                // Held across the driver call, so no two threads interleave a read and a set.
                let mut allowed = module.shared_allowed.lock().unwrap_or_else(PoisonError::into_inner);
                let now = allowed.entry(self.raw as usize).or_insert(0);
                if *now < bytes {
                    set(bytes)?;
                    *now = bytes;
                }
                Ok(())
            }
            Owner::Foreign { .. } => set(bytes),
        }
    }

    /// Queues the kernel on `stream`.
    ///
    /// # Safety
    /// - `args` holds one pointer per kernel parameter, in order, each pointing to a value of
    ///   exactly that parameter's type; the values are copied during this call.
    /// - Every device address passed belongs to the kernel's device and stays valid, and is not accessed by the host in a way
    ///   that races the kernel, until the work queued on `stream` has finished.
    ///
    /// # Errors
    /// A launch the driver rejects (too many threads, too much shared memory, a stream of
    /// another device).
    pub(crate) unsafe fn launch(
        &self,
        stream: &Stream,
        config: LaunchConfig,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if !self.owner.ctx().same_as(stream.context()) {
            return Err(BackendError::invalid(
                "kernel launch",
                format!("kernel `{}` and the stream belong to different devices", self.name),
            ));
        }
        stream.bind()?;
        // SAFETY: the function handle is live (its module is held); the caller guarantees the
        // argument list and the lifetime of the memory it refers to.
        unsafe {
            result::launch_kernel(
                self.raw,
                config.grid,
                config.block,
                config.shared_bytes,
                stream.raw(),
                args,
            )
        }
        .call("cuLaunchKernel")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::LaunchConfig;

    #[test]
    fn linear_launch_covers_every_item_within_the_cap() {
        assert_eq!(LaunchConfig::linear(1000, 256, 1024).grid, (4, 1, 1));
        assert_eq!(LaunchConfig::linear(1 << 30, 256, 1024).grid, (1024, 1, 1));
        assert_eq!(LaunchConfig::linear(0, 256, 1024).grid, (1, 1, 1));
    }
}
