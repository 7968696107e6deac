//! `hetmem doctor`: what this machine can do for CPU<->GPU memory sharing.
//!
//! [`Report::gather`] never fails: whatever cannot be read becomes a check with a reason. Each
//! [`Check`] is ok, warn or fail, and every warn and fail carries a one-line remedy. The JSON
//! form (`serde`) uses the field names of these types, which are kept stable; the text form is
//! the `hetmem` command's.

mod device;
mod host;
mod pairs;

pub use device::DeviceReport;
pub use host::HostReport;
pub use pairs::PairReport;

use hetmem::backend::cuda::{self, CudaDevice, nvrtc};
use hetmem::backend::nvml::NvmlSession;
use hetmem::backend::{BackendKind, Device};
use hetmem::error::{NvrtcError, cuda_version_string};
use hetmem::kernels::{self, CodeOrigin};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, but something is slower or missing; the remedy says what to do.
    Warn,
    /// Something hetmem needs does not work here.
    Fail,
}

/// One line of the doctor's verdict.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    /// What the check is about: `host`, `driver`, or `device N`.
    pub scope: String,
    /// A stable name, for example `memlock` or `can_map_host_memory`.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a warn or fail.
    pub remedy: Option<String>,
}

impl Check {
    pub(crate) fn ok(scope: &str, name: &'static str, detail: impl Into<String>) -> Check {
        Check::new(scope, name, Status::Ok, detail.into(), None)
    }

    pub(crate) fn warn(scope: &str, name: &'static str, detail: impl Into<String>, remedy: &str) -> Check {
        Check::new(scope, name, Status::Warn, detail.into(), Some(remedy))
    }

    pub(crate) fn fail(scope: &str, name: &'static str, detail: impl Into<String>, remedy: &str) -> Check {
        Check::new(scope, name, Status::Fail, detail.into(), Some(remedy))
    }

    fn new(scope: &str, name: &'static str, status: Status, detail: String, remedy: Option<&str>) -> Check {
        Check { scope: scope.to_string(), name, status, detail, remedy: remedy.map(str::to_string) }
    }
}

/// NVRTC as the doctor found it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NvrtcReport {
    /// `major.minor`, when found.
    pub version: Option<String>,
    /// The library name it was loaded by (`libnvrtc.so.13`, `libnvrtc.so.12`, ...), when found.
    pub library: Option<String>,
    /// Why it is unusable, when it is.
    pub error: Option<String>,
}

/// The backend hetmem would run on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendReport {
    /// `cuda` or `cpu`.
    pub selected: BackendKind,
    /// Why the CPU runs instead of a GPU, when it is a fallback.
    pub fallback_reason: Option<String>,
}

/// The NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DriverReport {
    /// Whether libcuda could be loaded.
    pub library_found: bool,
    /// The CUDA version the driver supports, for example `13.0`.
    pub cuda_version: Option<String>,
    /// The driver's own version (from NVML), for example `580.159.04`.
    pub driver_version: Option<String>,
}

/// Everything the doctor found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// hetmem's version.
    pub hetmem_version: &'static str,
    /// The backend in use.
    pub backend: BackendReport,
    /// The NVIDIA driver.
    pub driver: DriverReport,
    /// Every CUDA device.
    pub devices: Vec<DeviceReport>,
    /// Every pair of CUDA devices: topology and peer access (none with one GPU).
    pub pairs: Vec<PairReport>,
    /// The host.
    pub host: HostReport,
    /// Where hetmem's own kernels take their code from: `NVRTC` (compiled for each GPU and
    /// cached) or `PTX` (the shipped PTX, compiled by the driver when loaded).
    pub kernel_code: String,
    /// Every verdict, host first, then the driver, then each device.
    pub checks: Vec<Check>,
}

impl Report {
    /// Examines this machine; `selected` is the device hetmem would run on.
    pub fn gather(selected: &Device) -> Report {
        let nvrtc_report = match nvrtc::version() {
            Ok((major, minor)) => NvrtcReport {
                version: Some(format!("{major}.{minor}")),
                library: nvrtc::library().ok().map(str::to_string),
                error: None,
            },
            Err(NvrtcError::NotFound { tried }) => NvrtcReport {
                version: None,
                library: None,
                error: Some(format!("NVRTC 12 or 13 not found ({tried})")),
            },
            Err(error) => NvrtcReport { version: None, library: None, error: Some(error.to_string()) },
        };
        let host = HostReport::gather(nvrtc_report);
        let driver_cuda_version = cuda::driver::driver_cuda_version();
        let nvml = NvmlSession::open();
        let driver = DriverReport {
            library_found: driver_cuda_version.is_ok(),
            cuda_version: driver_cuda_version.as_ref().ok().map(|v| cuda_version_string(*v)),
            driver_version: nvml.as_ref().ok().and_then(|nvml| nvml.driver_version().ok()),
        };

        let mut checks = Vec::new();
        let mut devices = Vec::new();
        let mut opened = Vec::new();
        match cuda::driver::driver() {
            Ok(info) => {
                checks.push(Check::ok(
                    "driver",
                    "cuda_driver",
                    format!(
                        "CUDA {} driver{}, {} device(s); hetmem needs CUDA {} or newer",
                        cuda_version_string(info.cuda_version),
                        driver.driver_version.as_deref().map(|v| format!(" {v}")).unwrap_or_default(),
                        info.device_count,
                        cuda_version_string(cuda::REQUIRED_CUDA_VERSION),
                    ),
                ));
                for index in 0..info.device_count {
                    match CudaDevice::open(index) {
                        Ok(device) => {
                            devices.push(DeviceReport::gather(&device, nvml.as_ref()));
                            opened.push(device);
                        }
                        Err(reason) => checks.push(Check::fail(
                            &format!("device {index}"),
                            "open",
                            reason.to_string(),
                            reason.remedy(),
                        )),
                    }
                }
            }
            Err(reason) => {
                checks.push(Check::fail("driver", "cuda_driver", reason.to_string(), reason.remedy()))
            }
        }
        let pairs = PairReport::gather_all(&opened, nvml.as_ref());
        let gpu_present = !devices.is_empty();
        let kernel_code = kernels::origin();
        let mut all_checks = host.checks();
        all_checks.append(&mut checks);
        if gpu_present {
            all_checks.push(kernel_code_check(kernel_code, &host.nvrtc));
        }
        for device in &devices {
            all_checks.extend(device.checks());
            all_checks.extend(nvrtc_arch_check(device, &host.nvrtc));
        }
        all_checks.extend(pairs::pair_checks(devices.len(), &pairs));
        Report {
            // hetmem-bench is released with hetmem, under the workspace's one version.
            hetmem_version: env!("CARGO_PKG_VERSION"),
            backend: BackendReport {
                selected: selected.backend(),
                fallback_reason: selected.cpu_fallback_reason().map(ToString::to_string),
            },
            driver,
            devices,
            pairs,
            host,
            kernel_code: kernel_code.to_string(),
            checks: all_checks,
        }
    }

    /// The worst status among the checks.
    pub fn worst(&self) -> Status {
        self.checks.iter().map(|check| check.status).max().unwrap_or(Status::Ok)
    }
}

/// Where the built-in kernels come from, on a machine with a GPU.
fn kernel_code_check(origin: CodeOrigin, nvrtc_report: &NvrtcReport) -> Check {
    match origin {
        CodeOrigin::Nvrtc => Check::ok(
            "host",
            "kernel_code",
            format!(
                "hetmem's kernels: compiled by NVRTC {} for each GPU and cached",
                nvrtc_report.version.as_deref().unwrap_or("?")
            ),
        ),
        CodeOrigin::Ptx => Check::ok(
            "host",
            "kernel_code",
            "hetmem's kernels: the shipped PTX (ISA 8.0, compute_70), compiled by the driver when loaded",
        ),
    }
}

/// Whether this NVRTC can build machine code for the device.
fn nvrtc_arch_check(device: &DeviceReport, nvrtc_report: &NvrtcReport) -> Option<Check> {
    nvrtc_report.version.as_ref()?;
    let scope = format!("device {}", device.index);
    let arch: i32 = device.compute_capability.replace('.', "").parse().ok()?;
    Some(match nvrtc::supported_architectures() {
        Ok(archs) if archs.contains(&arch) => {
            Check::ok(&scope, "nvrtc_arch", format!("NVRTC builds sm_{arch}"))
        }
        Ok(_) => Check::fail(
            &scope,
            "nvrtc_arch",
            format!("this NVRTC cannot build sm_{arch}"),
            "install an NVRTC 12 or 13 that supports this GPU (NVRTC 13 builds sm_75 and newer), \
             or take NVRTC off the loader path so that hetmem's shipped PTX runs",
        ),
        Err(error) => Check::warn(&scope, "nvrtc_arch", error.to_string(), "reinstall NVRTC"),
    })
}
