//! The CUDA backend's errors: a failed driver call ([`CudaError`], with the remedies hetmem
//! knows for each call and result), NVRTC's failures ([`NvrtcError`]), and why the backend
//! cannot run on a machine ([`Unavailable`]). [`crate::backend::BackendError`] wraps them, and `crate::Error` wraps that.

use std::fmt;

/// Why the CUDA backend cannot run on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Unavailable {
    /// No NVIDIA driver library (`libcuda.so`) could be loaded.
    NoDriverLibrary,
    /// The driver is older than the CUDA version hetmem is built against.
    DriverTooOld {
        /// The CUDA version the driver supports, as `major * 1000 + minor * 10`.
        driver_version: i32,
        /// The CUDA version hetmem needs, in the same form.
        required_version: i32,
    },
    /// `cuInit` failed.
    InitFailed {
        /// The driver's error, with its remedy.
        error: String,
    },
    /// The driver works but sees no CUDA device.
    NoDevice,
    /// A device index beyond the devices the driver sees.
    NoSuchDevice {
        /// The index asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
    },
}

impl Unavailable {
    /// What a user can do about it.
    pub fn remedy(&self) -> &'static str {
        match self {
            Unavailable::NoDriverLibrary => {
                "install the NVIDIA driver (libcuda.so.1 must be on the loader path)"
            }
            Unavailable::DriverTooOld { .. } => {
                "update the NVIDIA driver to release 525 or newer (CUDA 12.0)"
            }
            Unavailable::InitFailed { .. } => {
                "check `nvidia-smi`; a driver/kernel-module version mismatch needs a reboot"
            }
            Unavailable::NoDevice => "check `nvidia-smi` and CUDA_VISIBLE_DEVICES",
            Unavailable::NoSuchDevice { .. } => {
                "pick an index below the device count (`hetmem doctor` lists them)"
            }
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoDriverLibrary => write!(f, "no NVIDIA driver library (libcuda.so) found"),
            Unavailable::DriverTooOld { driver_version, required_version } => write!(
                f,
                "the NVIDIA driver supports CUDA {} but hetmem needs CUDA {}",
                cuda_version_string(*driver_version),
                cuda_version_string(*required_version)
            ),
            Unavailable::InitFailed { error } => write!(f, "the CUDA driver failed to start: {error}"),
            Unavailable::NoDevice => write!(f, "the NVIDIA driver sees no CUDA device"),
            Unavailable::NoSuchDevice { index, count } => {
                write!(f, "there is no CUDA device {index} (the driver sees {count})")
            }
        }
    }
}

/// Formats a CUDA version number as the driver reports it (`13000`) as `13.0`.
pub fn cuda_version_string(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// A failed CUDA driver call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The driver function that failed, for example `cuMemHostRegister`.
    pub call: &'static str,
    /// The numeric `CUresult`.
    pub code: u32,
    /// The `CUresult` name, for example `CUDA_ERROR_INVALID_VALUE`.
    pub name: String,
    /// The driver's description of the error.
    pub description: String,
}

impl CudaError {
    /// What a user can do about this failure, where hetmem knows.
    pub fn remedy(&self) -> Option<&'static str> {
        remedy_for(self.call, &self.name)
    }

    /// Whether the error loses the context: a kernel fault after which every call fails
    /// (NVIDIA: "the process must be terminated and relaunched"; on driver 580 even
    /// `cuDevicePrimaryCtxReset` does not bring the context back, bench/results/2026-11-30-h200-probes).
    pub fn is_sticky(&self) -> bool {
        STICKY.contains(&self.name.as_str())
    }

    /// Whether trying again later may succeed: out of device or pinned memory, a busy or not
    /// yet ready device.
    pub fn is_transient(&self) -> bool {
        TRANSIENT.contains(&self.name.as_str())
    }
}

/// Errors that leave a context unusable (CUDA's "sticky" errors).
const STICKY: &[&str] = &[
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
];

/// Errors that may pass: memory freed meanwhile, a device that stops being busy.
const TRANSIENT: &[&str] = &[
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA_ERROR_DEVICE_UNAVAILABLE",
    "CUDA_ERROR_SYSTEM_NOT_READY",
    "CUDA_ERROR_TIMEOUT",
];

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.description)?;
        if let Some(remedy) = self.remedy() {
            write!(f, "; remedy: {remedy}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CudaError {}

/// The remedy for a driver call that failed with `name`, where one is known.
fn remedy_for(call: &str, name: &str) -> Option<&'static str> {
    let host_memory_call = matches!(call, "cuMemHostAlloc" | "cuMemHostRegister" | "cuMemAllocHost");
    Some(match name {
        "CUDA_ERROR_OUT_OF_MEMORY" if host_memory_call => {
            "pinned host memory is limited by free RAM: pin less, or reuse buffers through the \
             pinned pool (NVIDIA's driver 580 does not count pinned memory against `ulimit -l`; \
             other drivers may, so raising it can help there)"
        }
        "CUDA_ERROR_OUT_OF_MEMORY" => {
            "the GPU is out of memory: free device buffers, use smaller frames or windows, \
             or use mapped host memory instead of device memory"
        }
        "CUDA_ERROR_INVALID_VALUE" if call == "cuMemHostRegister" => {
            "register read-only file mappings (PROT_READ or MAP_SHARED) with the read-only \
             flag, and pass a page-aligned range inside one mapping"
        }
        "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED" => {
            "this range is already registered with CUDA: reuse that registration or unregister it first"
        }
        "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED" => {
            "this range was never registered, or is already unregistered"
        }
        "CUDA_ERROR_NOT_SUPPORTED" if call == "cuMemHostRegister" => {
            "this device or OS cannot register this kind of memory: use a pinned allocation instead"
        }
        "CUDA_ERROR_NO_DEVICE" => {
            "no CUDA device is visible: check `nvidia-smi` and CUDA_VISIBLE_DEVICES; \
             hetmem runs on the CPU backend meanwhile"
        }
        "CUDA_ERROR_INSUFFICIENT_DRIVER" | "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE" => {
            "the NVIDIA driver is too old: update it to release 525 (CUDA 12.0) or newer"
        }
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" | "CUDA_ERROR_JIT_COMPILER_NOT_FOUND" => {
            "the PTX came from a compiler newer than the driver: compile it with an NVRTC no \
             newer than the driver's CUDA version (`hetmem doctor` shows both; CUDA 12 drivers \
             take `pip install nvidia-cuda-nvrtc-cu12`, with its nvidia/cuda_nvrtc/lib on \
             LD_LIBRARY_PATH), or update the driver"
        }
        "CUDA_ERROR_INVALID_IMAGE" | "CUDA_ERROR_NO_BINARY_FOR_GPU" | "CUDA_ERROR_INVALID_PTX" => {
            "the compiled kernel does not fit this GPU: delete hetmem's kernel cache \
             (~/.cache/hetmem, or the folder given to kernels::set_cache or the CLI's \
             HETMEM_CACHE_DIR) and run again"
        }
        "CUDA_ERROR_ILLEGAL_ADDRESS" => {
            "a kernel touched memory the GPU cannot reach (plain pageable memory on a machine \
             without HMM, or a freed buffer); the context is lost: restart the process and \
             run it under compute-sanitizer to find the access"
        }
        "CUDA_ERROR_LAUNCH_FAILED"
        | "CUDA_ERROR_ILLEGAL_INSTRUCTION"
        | "CUDA_ERROR_MISALIGNED_ADDRESS"
        | "CUDA_ERROR_HARDWARE_STACK_ERROR"
        | "CUDA_ERROR_INVALID_PC"
        | "CUDA_ERROR_ASSERT" => {
            "a kernel faulted and the GPU context is lost: restart the process (hetmem's CLI can \
             finish the remaining frames on the CPU with --retries) and run it under \
             compute-sanitizer to find the fault"
        }
        "CUDA_ERROR_LAUNCH_TIMEOUT" => {
            "a kernel ran past the display watchdog: use a GPU without a display attached"
        }
        "CUDA_ERROR_NOT_PERMITTED" | "CUDA_ERROR_NOT_SUPPORTED" => {
            "this operation is not available on this device or driver: `hetmem doctor` lists what is"
        }
        _ => return None,
    })
}

/// A failure of NVRTC, the run-time CUDA compiler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NvrtcError {
    /// No NVRTC 12 or 13 could be loaded.
    NotFound {
        /// Each library name tried, with the loader's answer.
        tried: String,
    },
    /// A kernel failed to compile; `log` is NVRTC's own output.
    Compile {
        /// The kernel source's name.
        kernel: String,
        /// The architecture compiled for, for example `sm_90`.
        arch: String,
        /// The `nvrtcResult` name.
        code: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// Another NVRTC call failed.
    Call {
        /// The NVRTC function that failed.
        call: &'static str,
        /// The `nvrtcResult` name.
        code: String,
    },
}

impl fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvrtcError::NotFound { tried } => write!(
                f,
                "NVRTC 12 or 13 not found ({tried}); hetmem's own kernels run without it (from \
                 their PTX), kernels compiled from CUDA C need it; remedy: {NVRTC_REMEDY}"
            ),
            NvrtcError::Compile { kernel, arch, code, log } => {
                write!(f, "NVRTC could not compile kernel `{kernel}` for {arch}: {code}\n{}", log.trim_end())
            }
            NvrtcError::Call { call, code } => write!(f, "{call} failed: {code}"),
        }
    }
}

impl std::error::Error for NvrtcError {}

/// How to install NVRTC where it is missing.
pub const NVRTC_REMEDY: &str = "install the CUDA toolkit (12.0 or newer), or `pip install --target DIR \
     nvidia-cuda-nvrtc==13.0.88` (CUDA 13; `nvidia-cuda-nvrtc-cu12` for CUDA 12) and add the \
     folder holding libnvrtc.so.* (DIR/nvidia/cu13/lib, or DIR/nvidia/cuda_nvrtc/lib) to \
     LD_LIBRARY_PATH";
