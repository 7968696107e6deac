//! The CUDA backend: the only module in hetmem that calls cudarc's `sys` and `result` layers.
//!
//! The driver library is loaded at run time, so hetmem builds and runs where no CUDA is
//! installed; [`driver`] checks for it before any call that would make cudarc panic.
//! Everything here is an owning type (device, stream, event, device memory, module) that
//! binds its context before each call and releases its handle on drop. Every `unsafe`
//! block says why it is sound.

mod context;
mod device;
pub mod driver;
mod entry;
pub(crate) mod error;
mod host;
mod interop;
mod managed;
mod memory;
mod module;
pub mod nvrtc;
pub mod raw;
mod split;
mod stream;

pub(crate) use context::ResidentKernel;
pub use device::{ComputeCapability, CudaDevice, DeviceAttributes};
pub use driver::REQUIRED_CUDA_VERSION;
pub(crate) use host::mapped_address;
pub(crate) use host::{HostAllocFlags, PinnedAlloc, RegisterFlags, Registration, RegistrationFailed};
pub use managed::{Advice, Attachment, ManagedAlloc, MemLocation};
pub(crate) use memory::DeviceAlloc;
pub use module::{Kernel, LaunchConfig, Module};
pub use stream::{Event, Stream};

use cudarc::driver::{DriverError, sys};

use crate::backend::cuda::error::CudaError;

/// Turns a cudarc driver error into hetmem's, naming the call that failed.
fn cuda_error(call: &'static str, error: DriverError) -> CudaError {
    let error = describe(call, error);
    context::note_error(&error);
    error
}

fn describe(call: &'static str, error: DriverError) -> CudaError {
    let name = error
        .error_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", error.0 as u32));
    let description = error
        .error_string()
        .map(|text| text.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "no description".to_string());
    CudaError { call, code: error.0 as u32, name, description }
}

/// Names the driver call behind a `Result` from cudarc.
trait Call<T> {
    /// Converts the error, recording that it came from `call`.
    fn call(self, call: &'static str) -> Result<T, CudaError>;
}

impl<T> Call<T> for Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T, CudaError> {
        self.map_err(|error| cuda_error(call, error))
    }
}

impl Call<()> for sys::CUresult {
    fn call(self, call: &'static str) -> Result<(), CudaError> {
        self.result().call(call)
    }
}
