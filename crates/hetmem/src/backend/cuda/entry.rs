//! Driver entry points whose form changed after CUDA 12.0, resolved at run time.
//!
//! hetmem is built against cudarc's CUDA 12.0 bindings so that it runs on every driver from
//! 12.0 on. A few calls it makes gained a new form later: `cuMemPrefetchAsync_v2` and
//! `cuMemAdvise_v2` (CUDA 12.2) take a `CUmemLocation`, so they can name host memory
//! explicitly; CUDA 13's headers offer only those. Neither form can be named through the
//! bindings in a way that compiles for every binding version a user's cudarc may be unified to
//! (12.0 lacks the `_v2` forms, 13.0 the old ones), so both are looked up in the driver library
//! here: the `_v2` form where the driver exports it, else the CUDA 12.0 form.

use std::ffi::c_uint;
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::Call;
use crate::backend::cuda::error::CudaError;

/// `CUmemLocation`'s layout: a location type and an id (a device ordinal, or 0 for the host).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Location {
    kind: u32,
    id: i32,
}

impl Location {
    /// `CU_MEM_LOCATION_TYPE_DEVICE`.
    const DEVICE: u32 = 1;
    /// `CU_MEM_LOCATION_TYPE_HOST` (CUDA 12.2).
    const HOST: u32 = 2;
    /// `CU_DEVICE_CPU`: the host, as the CUDA 12.0 forms name it.
    const CPU_DEVICE: sys::CUdevice = -1;

    pub(super) fn host() -> Location {
        Location { kind: Location::HOST, id: 0 }
    }

    pub(super) fn device(ordinal: usize) -> Location {
        Location { kind: Location::DEVICE, id: ordinal as i32 }
    }

    /// The location as a `CUdevice`, the CUDA 12.0 forms' argument.
    fn as_device(self) -> sys::CUdevice {
        if self.kind == Location::HOST { Location::CPU_DEVICE } else { self.id }
    }
}

type PrefetchV2 =
    unsafe extern "C" fn(sys::CUdeviceptr, usize, Location, c_uint, sys::CUstream) -> sys::CUresult;
type PrefetchV1 =
    unsafe extern "C" fn(sys::CUdeviceptr, usize, sys::CUdevice, sys::CUstream) -> sys::CUresult;
type AdviseV2 = unsafe extern "C" fn(sys::CUdeviceptr, usize, sys::CUmem_advise, Location) -> sys::CUresult;
type AdviseV1 =
    unsafe extern "C" fn(sys::CUdeviceptr, usize, sys::CUmem_advise, sys::CUdevice) -> sys::CUresult;

/// One call in whichever form the driver has.
#[derive(Debug, Clone, Copy)]
enum Form<V2, V1> {
    V2(V2),
    V1(V1),
}

/// Looks `v2` up, else `v1`, in the loaded driver library.
///
/// # Safety
/// `V2` and `V1` must be the C signatures of the symbols named `v2` and `v1`; the driver
/// library must be loaded ([`super::driver::driver`] answered `Ok`).
unsafe fn resolve<V2: Copy, V1: Copy>(
    call: &'static str,
    v2: &[u8],
    v1: &[u8],
) -> Result<Form<V2, V1>, CudaError> {
    // SAFETY: the caller has loaded the driver; `get` only looks a symbol up, and the caller
    // guarantees the types are the symbols' signatures.
    let library = unsafe { sys::culib() };
    // SAFETY: as above.
    if let Ok(symbol) = unsafe { library.get::<V2>(v2) } {
        return Ok(Form::V2(*symbol));
    }
    // SAFETY: as above.
    match unsafe { library.get::<V1>(v1) } {
        Ok(symbol) => Ok(Form::V1(*symbol)),
        Err(error) => Err(CudaError {
            call,
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND as u32,
            name: "CUDA_ERROR_NOT_FOUND".into(),
            description: format!("the driver library exports neither form of {call}: {error}"),
        }),
    }
}

/// `cuMemPrefetchAsync` of `bytes` at `ptr` to `location` on `stream`.
///
/// # Safety
/// The driver is loaded and the range's context is bound; `ptr..ptr + bytes` is managed memory
/// that outlives the queued migration; `stream` is a live stream of that context.
pub(super) unsafe fn mem_prefetch_async(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    location: Location,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    static FORM: OnceLock<Result<Form<PrefetchV2, PrefetchV1>, CudaError>> = OnceLock::new();
    // SAFETY: the types are the CUDA headers' signatures of the two symbols; the caller has
    // loaded the driver.
    let form = FORM.get_or_init(|| unsafe {
        resolve("cuMemPrefetchAsync", b"cuMemPrefetchAsync_v2\0", b"cuMemPrefetchAsync\0")
    });
    match form.clone()? {
        // SAFETY: the caller's contract is the call's; flags must be 0.
        Form::V2(call) => unsafe { call(ptr, bytes, location, 0, stream) },
        // SAFETY: as above; the old form names the host as CU_DEVICE_CPU.
        Form::V1(call) => unsafe { call(ptr, bytes, location.as_device(), stream) },
    }
    .call("cuMemPrefetchAsync")
}

/// `cuMemAdvise` of `advice` for `location` over `bytes` at `ptr`.
///
/// # Safety
/// The driver is loaded and the range's context is bound; `ptr..ptr + bytes` is a live managed
/// allocation.
pub(super) unsafe fn mem_advise(
    ptr: sys::CUdeviceptr,
    bytes: usize,
    advice: sys::CUmem_advise,
    location: Location,
) -> Result<(), CudaError> {
    static FORM: OnceLock<Result<Form<AdviseV2, AdviseV1>, CudaError>> = OnceLock::new();
    // SAFETY: the types are the CUDA headers' signatures of the two symbols; the caller has
    // loaded the driver.
    let form = FORM.get_or_init(|| unsafe { resolve("cuMemAdvise", b"cuMemAdvise_v2\0", b"cuMemAdvise\0") });
    match form.clone()? {
        // SAFETY: the caller's contract is the call's.
        Form::V2(call) => unsafe { call(ptr, bytes, advice, location) },
        // SAFETY: as above; the old form names the host as CU_DEVICE_CPU.
        Form::V1(call) => unsafe { call(ptr, bytes, advice, location.as_device()) },
    }
    .call("cuMemAdvise")
}

#[cfg(test)]
mod tests {
    use super::Location;

    #[test]
    fn locations_translate_to_the_old_forms_device_argument() {
        assert_eq!(Location::host().as_device(), -1);
        assert_eq!(Location::device(3).as_device(), 3);
        assert_eq!(
            std::mem::size_of::<Location>(),
            std::mem::size_of::<cudarc::driver::sys::CUmemLocation>()
        );
    }
}
