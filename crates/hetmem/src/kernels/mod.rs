//! hetmem's CUDA kernels: their sources, compilation and loading.
//!
//! Sources are `.cu` files in the crate's `kernels/` folder, built into the library with
//! `include_str!`. On first use a kernel is compiled by NVRTC to machine code for the
//! device's architecture, and the result is cached on disk (see [`KernelCache`]; by default
//! the user's cache folder, else the one given to [`set_cache`]), so later runs start without
//! compiling.

mod cache;

pub use cache::{CacheOutcome, KernelCache};

use std::sync::{Arc, RwLock};

use crate::backend::cuda::{CudaDevice, Kernel, Module};
use crate::error::{Error, Result};

/// One `.cu` source and the entry points it defines.
#[derive(Debug)]
pub struct KernelSource {
    /// A short name, used in logs and cache file names.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub source: &'static str,
    /// The `extern "C"` entry points it defines.
    pub entry_points: &'static [&'static str],
    /// Extra NVRTC options.
    pub options: &'static [&'static str],
}

/// `y = x * a + b` over 32-bit words: the smoke-test and memory-kind test kernel.
pub static AFFINE: KernelSource = KernelSource {
    name: "affine",
    source: include_str!("../../kernels/affine.cu"),
    entry_points: &["affine_u32"],
    options: &[],
};

/// A one-thread kernel that waits for a go word in mapped memory, for completion-latency
/// measurements and tests of waiting without blocking.
pub static SIGNAL: KernelSource = KernelSource {
    name: "signal",
    source: include_str!("../../kernels/signal.cu"),
    entry_points: &["wait_for_go"],
    options: &[],
};

/// The separable Gaussian blur of 8-bit planes, tiled for reads and writes across PCIe.
pub static GAUSSIAN: KernelSource = KernelSource {
    name: "gaussian",
    source: include_str!("../../kernels/gaussian.cu"),
    entry_points: &["gaussian_u8", "gaussian_u8_overlap", "gaussian_u16", "gaussian_u16_overlap"],
    options: &[],
};

/// The doorbell's persistent kernel: serves small requests written into mapped host memory
/// (see [`crate::resident::Doorbell`]).
pub static DOORBELL: KernelSource = KernelSource {
    name: "doorbell",
    source: include_str!("../../kernels/doorbell.cu"),
    entry_points: &["doorbell"],
    options: &[],
};

/// A kernel that stores to an illegal address, so that tests can lose a context for real
/// (used only by fault injection, feature `testing`; compiled by the check like the others).
pub static FAULT: KernelSource = KernelSource {
    name: "fault",
    source: include_str!("../../kernels/fault.cu"),
    entry_points: &["illegal_store"],
    options: &[],
};

/// Every kernel source in hetmem; the compile check builds each of them. (The benchmark's
/// kernels are hetmem-bench's.)
pub static ALL: &[&KernelSource] = &[&AFFINE, &SIGNAL, &GAUSSIAN, &DOORBELL, &FAULT];

/// The cache set by [`set_cache`]; `None` for [`KernelCache::user_default`].
static CACHE: RwLock<Option<KernelCache>> = RwLock::new(None);

/// Sets the on-disk cache kernels are compiled into and loaded from, for every device of the
/// process, from the next first load of a kernel on (modules already loaded stay loaded).
/// Without a call, [`KernelCache::user_default`].
///
/// # Examples
/// ```
/// use hetmem::kernels::{self, KernelCache};
/// kernels::set_cache(KernelCache::at(std::env::temp_dir().join("my-app-kernels")));
/// assert!(kernels::cache().dir().unwrap().ends_with("my-app-kernels"));
/// ```
pub fn set_cache(cache: KernelCache) {
    *CACHE.write().unwrap_or_else(|poison| poison.into_inner()) = Some(cache);
}

/// The cache kernels are compiled into: the one given to [`set_cache`], else the user's.
pub fn cache() -> KernelCache {
    let set = CACHE.read().unwrap_or_else(|poison| poison.into_inner()).clone();
    set.unwrap_or_else(KernelCache::user_default)
}

/// The architecture the compile check targets when there is no GPU to ask: the H200's.
pub const DEFAULT_CHECK_ARCH: &str = "sm_90";

/// Entry point `entry` of `source`, compiled for and loaded into `device`.
///
/// Modules are loaded once per device and kept. A cached image the driver rejects (a
/// truncated file, another architecture) is recompiled once before giving up.
///
/// # Errors
/// NVRTC missing or failing (with its log), an unknown entry point, or the driver refusing
/// the image.
pub fn kernel(device: &CudaDevice, source: &KernelSource, entry: &str) -> Result<Kernel> {
    if !source.entry_points.contains(&entry) {
        return Err(Error::invalid(
            "kernel entry point",
            format!("`{entry}` is not one of {}'s: {:?}", source.name, source.entry_points),
        ));
    }
    let arch = device.compute_capability().sm_name();
    let module = device.cached_module(source.name, || load_module(device, source, &arch))?;
    module.kernel(entry)
}

/// A user's CUDA C `source` (its file `name`, for messages and the cache), compiled for and
/// loaded into `device` once, through the kernel cache, keyed by its contents.
///
/// # Errors
/// NVRTC missing or failing (with its log), or the driver refusing the image.
pub fn user_module(device: &CudaDevice, name: &str, source: &str) -> Result<Arc<Module>> {
    let arch = device.compute_capability().sm_name();
    // The whole source is the key: two sources can never share a module.
    let key = format!("user:{name}\n{source}");
    device.cached_module(&key, || {
        let (image, _) = cache().get_or_compile_user(name, source, &arch)?;
        // SAFETY: the image is NVRTC's CUBIN of the caller's source, fresh or from a cache file
        // whose SHA-256 matched; what the code does on the GPU is the caller's contract (see
        // crate::stage::KernelStage::new).
        unsafe { Module::load(device, &image) }
    })
}

fn load_module(device: &CudaDevice, source: &KernelSource, arch: &str) -> Result<Arc<Module>> {
    let cache = cache();
    let (image, outcome) = cache.get_or_compile(source, arch)?;
    // SAFETY: the image is NVRTC's CUBIN, fresh or from a cache file whose SHA-256 matched.
    match unsafe { Module::load(device, &image) } {
        Ok(module) => Ok(module),
        Err(error) if outcome == CacheOutcome::Hit => {
            tracing::warn!("cached kernel {} for {arch} rejected ({error}); recompiling", source.name);
            let image = cache.recompile(source, arch)?;
            // SAFETY: as above, freshly compiled.
            unsafe { Module::load(device, &image) }
        }
        Err(error) => Err(error),
    }
}
