//! NVRTC, the run-time CUDA C++ compiler. It needs no GPU, only libnvrtc.
//!
//! Kernels are compiled straight to machine code (CUBIN) for the device's architecture, so
//! the driver never JIT-compiles PTX and a PTX version newer than the driver cannot arise.

use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::error::NvrtcError;

/// Whether libnvrtc can be loaded (checked once).
pub fn is_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the candidate library names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn require() -> Result<(), NvrtcError> {
    if is_available() { Ok(()) } else { Err(NvrtcError::NotFound) }
}

fn call_error(call: &'static str, error: result::NvrtcError) -> NvrtcError {
    NvrtcError::Call { call, code: format!("{:?}", error.0) }
}

/// NVRTC's version as (major, minor).
///
/// # Errors
/// [`NvrtcError::NotFound`] when libnvrtc cannot be loaded.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    require()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded (checked); the call writes two ints through valid pointers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|error| call_error("nvrtcVersion", error))?;
    Ok((major, minor))
}

/// Compiles CUDA C++ `source` to a CUBIN for `arch` (for example `sm_90`).
///
/// `name` names the source in NVRTC's log. `options` are extra NVRTC options.
///
/// # Errors
/// [`NvrtcError::NotFound`] without libnvrtc; [`NvrtcError::Compile`] with NVRTC's log when
/// the source does not compile.
pub fn compile_cubin(name: &str, source: &str, arch: &str, options: &[&str]) -> Result<Vec<u8>, NvrtcError> {
    require()?;
    let to_c = |text: &str| {
        CString::new(text).map_err(|_| NvrtcError::Call {
            call: "nvrtcCreateProgram",
            code: "source or name contains a NUL byte".into(),
        })
    };
    let c_source = to_c(source)?;
    let c_name = to_c(&format!("{name}.cu"))?;
    let program =
        result::create_program(&c_source, Some(&c_name)).map_err(|e| call_error("nvrtcCreateProgram", e))?;
    let program = Program(program);

    let mut all_options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    all_options.extend(options.iter().map(|option| option.to_string()));
    // SAFETY: `program` was created above and is destroyed only when `Program` drops.
    let compiled = unsafe { result::compile_program(program.0, &all_options) };
    // SAFETY: as above.
    let log =
        unsafe { result::get_program_log(program.0) }.map(|raw| c_chars_to_string(&raw)).unwrap_or_default();
    if let Err(error) = compiled {
        return Err(NvrtcError::Compile {
            kernel: name.to_string(),
            arch: arch.to_string(),
            code: format!("{:?}", error.0),
            log,
        });
    }
    if !log.trim().is_empty() {
        tracing::debug!("NVRTC log for {name} ({arch}):\n{log}");
    }
    let mut size = 0usize;
    // SAFETY: `program` compiled successfully; the call writes one size_t.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| call_error("nvrtcGetCUBINSize", e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported for this program.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| call_error("nvrtcGetCUBIN", e))?;
    Ok(cubin)
}

/// The architectures this NVRTC can compile for, as compute capability numbers (`90` = 9.0).
///
/// # Errors
/// [`NvrtcError::NotFound`] without libnvrtc.
pub fn supported_architectures() -> Result<Vec<i32>, NvrtcError> {
    require()?;
    let mut count = 0;
    // SAFETY: the call writes one int.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .map_err(|e| call_error("nvrtcGetNumSupportedArchs", e))?;
    let mut archs = vec![0; count.max(0) as usize];
    // SAFETY: `archs` has room for the `count` ints NVRTC reported.
    unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| call_error("nvrtcGetSupportedArchs", e))?;
    Ok(archs)
}

/// Destroys the program on every path out of `compile_cubin`.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        if let Err(error) = unsafe { result::destroy_program(self.0) } {
            tracing::warn!("nvrtcDestroyProgram failed: {error}");
        }
    }
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(text) => text.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}
