//! hetmem's CUDA kernels: their sources, compilation and loading.
//!
//! Sources are `.cu` files in the crate's `kernels/` folder, built into the library with
//! `include_str!`, each with the PTX `scripts/gen-ptx` made of it (NVRTC 12.0, `compute_70`).
//! Where NVRTC is installed, a kernel is compiled on first use to machine code for the
//! device's architecture and cached on disk (see [`KernelCache`]; by default the user's cache
//! folder, else the one given to [`set_cache`]), so later runs start without compiling. Where
//! it is not, the driver compiles the shipped PTX when the kernel is loaded ([`CodeOrigin`]),
//! so hetmem's own kernels need no NVRTC; only users' CUDA C sources do.

mod cache;

pub(crate) use cache::write_atomically;
pub use cache::{CacheOutcome, KernelCache};

use std::sync::{Arc, RwLock};

use crate::backend::cuda::{CudaDevice, Kernel, Module, nvrtc};
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
    /// The source compiled to PTX by `scripts/gen-ptx`, for drivers to load without NVRTC
    /// (compiled without `options`). `None` for a source without: it always needs NVRTC.
    pub ptx: Option<&'static str>,
}

/// Where a built-in kernel's machine code comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeOrigin {
    /// Compiled by NVRTC for the device's architecture, and cached on disk: the default where
    /// NVRTC 12 or 13 is installed.
    Nvrtc,
    /// The PTX shipped with hetmem, compiled by the driver when loaded: the default where no
    /// NVRTC is installed.
    Ptx,
}

impl std::fmt::Display for CodeOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CodeOrigin::Nvrtc => "NVRTC",
            CodeOrigin::Ptx => "PTX",
        })
    }
}

/// The origin set by [`set_origin`]; `None` to choose by whether NVRTC is installed.
static ORIGIN: RwLock<Option<CodeOrigin>> = RwLock::new(None);

/// Makes every later first load of a built-in kernel take its code from `origin` (`None`: from
/// NVRTC where it is installed, else from the shipped PTX). Modules already loaded stay loaded.
pub fn set_origin(origin: Option<CodeOrigin>) {
    *ORIGIN.write().unwrap_or_else(|poison| poison.into_inner()) = origin;
}

/// Where the next first load of a built-in kernel takes its code from: the origin given to
/// [`set_origin`], else NVRTC where it is installed, else the shipped PTX.
pub fn origin() -> CodeOrigin {
    let set = *ORIGIN.read().unwrap_or_else(|poison| poison.into_inner());
    set.unwrap_or_else(|| if nvrtc::is_available() { CodeOrigin::Nvrtc } else { CodeOrigin::Ptx })
}

/// `y = x * a + b` over 32-bit words: the smoke-test and memory-kind test kernel.
pub static AFFINE: KernelSource = KernelSource {
    name: "affine",
    source: include_str!("../../kernels/affine.cu"),
    ptx: Some(include_str!("../../kernels/ptx/affine.ptx")),
    entry_points: &["affine_u32"],
    options: &[],
};

/// A one-thread kernel that waits for a go word in mapped memory, for completion-latency
/// measurements and tests of waiting without blocking.
pub static SIGNAL: KernelSource = KernelSource {
    name: "signal",
    source: include_str!("../../kernels/signal.cu"),
    ptx: Some(include_str!("../../kernels/ptx/signal.ptx")),
    entry_points: &["wait_for_go"],
    options: &[],
};

/// The separable Gaussian blur of 8-bit planes, tiled for reads and writes across PCIe.
pub static GAUSSIAN: KernelSource = KernelSource {
    name: "gaussian",
    source: include_str!("../../kernels/gaussian.cu"),
    ptx: Some(include_str!("../../kernels/ptx/gaussian.ptx")),
    entry_points: &[
        "gaussian_u8",
        "gaussian_u8_overlap",
        "gaussian_u16",
        "gaussian_u16_overlap",
        "gaussian_u8_resident",
        "gaussian_u16_resident",
    ],
    options: &[],
};

/// The doorbell's persistent kernel: serves small requests written into mapped host memory
/// (see [`crate::resident::Doorbell`]).
pub static DOORBELL: KernelSource = KernelSource {
    name: "doorbell",
    source: include_str!("../../kernels/doorbell.cu"),
    ptx: Some(include_str!("../../kernels/ptx/doorbell.ptx")),
    entry_points: &["doorbell"],
    options: &[],
};

/// A kernel that stores to an illegal address, so that tests can lose a context for real
/// (used only by fault injection, feature `testing`; compiled by the check like the others).
pub static FAULT: KernelSource = KernelSource {
    name: "fault",
    source: include_str!("../../kernels/fault.cu"),
    ptx: Some(include_str!("../../kernels/ptx/fault.ptx")),
    entry_points: &["illegal_store"],
    options: &[],
};

/// Position-weighted sums of a byte range's 32-bit words: the checksum stage of `hetmem load`.
pub static CHECKSUM: KernelSource = KernelSource {
    name: "checksum",
    source: include_str!("../../kernels/checksum.cu"),
    ptx: Some(include_str!("../../kernels/ptx/checksum.ptx")),
    entry_points: &["checksum_words"],
    options: &[],
};

/// The CT computation ([`crate::ops::ct`]): organ statistics through a label template, the
/// masked separable Gaussian, the maximum-intensity projection.
pub static CT: KernelSource = KernelSource {
    name: "ct",
    source: include_str!("../../kernels/ct.cu"),
    ptx: Some(include_str!("../../kernels/ptx/ct.ptx")),
    entry_points: &[
        "zero_u64",
        "organ_window_stats",
        "mask_organ",
        "smooth_axis",
        "masked_finish",
        "mip_height",
    ],
    options: &[],
};

/// The headers every user's CUDA C source may `#include` (by the first name), without any file
/// on disk: `hetmem/mapped.cuh`, the device side of the mapped flags, counters and mailboxes
/// of `hetmem::resident::mapped`.
pub static USER_HEADERS: &[(&str, &str)] =
    &[("hetmem/mapped.cuh", include_str!("../../kernels/hetmem/mapped.cuh"))];

/// Every kernel source in hetmem; the compile check builds each of them. (The benchmark's
/// kernels are hetmem-bench's.)
pub static ALL: &[&KernelSource] = &[&AFFINE, &SIGNAL, &GAUSSIAN, &DOORBELL, &FAULT, &CHECKSUM, &CT];

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

/// Entry point `entry` of `source`, loaded into `device` with its code from [`origin`].
///
/// Modules are loaded once per device and kept. A cached image the driver rejects (a
/// truncated file, another architecture) is recompiled once before giving up.
///
/// # Errors
/// NVRTC failing (with its log), an unknown entry point, or the driver refusing the image.
pub fn kernel(device: &CudaDevice, source: &KernelSource, entry: &str) -> Result<Kernel> {
    kernel_from(device, source, entry, origin())
}

/// As [`kernel`], with the code from `origin` whatever [`set_origin`] says: to compare the two.
/// A source without PTX is compiled by NVRTC whatever the origin.
///
/// # Errors
/// As [`kernel`]; [`crate::error::NvrtcError::NotFound`] when NVRTC is needed and missing.
pub fn kernel_from(
    device: &CudaDevice,
    source: &KernelSource,
    entry: &str,
    origin: CodeOrigin,
) -> Result<Kernel> {
    if !source.entry_points.contains(&entry) {
        return Err(Error::invalid(
            "kernel entry point",
            format!("`{entry}` is not one of {}'s: {:?}", source.name, source.entry_points),
        ));
    }
    let ptx = source.ptx.filter(|_| origin == CodeOrigin::Ptx);
    let key = format!("{}:{}", source.name, if ptx.is_some() { CodeOrigin::Ptx } else { CodeOrigin::Nvrtc });
    let module = device.cached_module(&key, || match ptx {
        // SAFETY: the PTX was generated from this source by scripts/gen-ptx and built into the
        // program with it; the driver compiles it for the device.
        Some(ptx) => Ok(unsafe { Module::load(device, ptx.as_bytes()) }?),
        None => load_module(device, source, &device.compute_capability().sm_name()),
    })?;
    Ok(module.kernel(entry)?)
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
        Ok(unsafe { Module::load(device, &image) }?)
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
            Ok(unsafe { Module::load(device, &image) }?)
        }
        Err(error) => Err(error.into()),
    }
}
