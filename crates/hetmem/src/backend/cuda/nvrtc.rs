//! NVRTC, the run-time CUDA C++ compiler. It needs no GPU, only libnvrtc.
//!
//! Kernels are compiled straight to machine code (CUBIN) for the device's architecture, so
//! the driver never JIT-compiles PTX and a PTX version newer than the driver cannot arise.
//!
//! The library is loaded here rather than through cudarc's bindings, whose search names follow
//! the CUDA version hetmem is built for: hetmem takes NVRTC 13 or 12, whichever is installed
//! (the newest first), and says which ([`library`]). NVRTC's C interface is the same in both
//! for every call made here.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::backend::cuda::error::NvrtcError;

/// The library names tried, in order: NVRTC 13, NVRTC 12, then an unversioned link.
pub const LIBRARY_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// The oldest NVRTC hetmem compiles its kernels with.
pub const OLDEST_MAJOR: i32 = 12;

type NvrtcResult = c_int;
type Program = *mut c_void;

/// The entry points hetmem calls, resolved once.
struct Library {
    /// The name it was loaded by (one of [`LIBRARY_NAMES`]).
    name: &'static str,
    version: (i32, i32),
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    get_program_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_program_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    get_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    /// Kept loaded for the life of the process: the function pointers above point into it.
    _library: libloading::Library,
}

// SAFETY: NVRTC's functions may be called from any thread (each program is used by one thread
// at a time here); the struct holds only function pointers and the library handle.
unsafe impl Send for Library {}
// SAFETY: as above; nothing in it is mutated after loading.
unsafe impl Sync for Library {}

impl Library {
    fn load() -> Result<Library, String> {
        let mut unusable = Vec::new();
        for &name in LIBRARY_NAMES {
            // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions.
            let Ok(library) = (unsafe { libloading::Library::new(name) }) else { continue };
            // SAFETY: the library is NVRTC by its name; `resolve` checks every symbol.
            match unsafe { Library::resolve(name, library) } {
                Ok(library) => return Ok(library),
                Err(why) => unusable.push(why),
            }
        }
        let mut tried = format!("none of {} on the loader path", LIBRARY_NAMES.join(", "));
        for why in unusable {
            tried.push_str("; ");
            tried.push_str(&why);
        }
        Err(tried)
    }

    /// # Safety
    /// `library` is an NVRTC library.
    unsafe fn resolve(name: &'static str, library: libloading::Library) -> Result<Library, String> {
        macro_rules! symbol {
            ($symbol:literal) => {
                // SAFETY: the field's type is the NVRTC header's signature of the symbol.
                *unsafe { library.get(concat!($symbol, "\0").as_bytes()) }
                    .map_err(|error| format!("{name} lacks {}: {error}", $symbol))?
            };
        }
        let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult = symbol!("nvrtcVersion");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the call writes two ints through valid pointers.
        let code = unsafe { version(&mut major, &mut minor) };
        if code != 0 {
            return Err(format!("{name}: nvrtcVersion returned {code}"));
        }
        if major < OLDEST_MAJOR {
            return Err(format!("{name} is NVRTC {major}.{minor}; hetmem needs {OLDEST_MAJOR} or newer"));
        }
        Ok(Library {
            name,
            version: (major, minor),
            get_error_string: symbol!("nvrtcGetErrorString"),
            create_program: symbol!("nvrtcCreateProgram"),
            compile_program: symbol!("nvrtcCompileProgram"),
            get_program_log_size: symbol!("nvrtcGetProgramLogSize"),
            get_program_log: symbol!("nvrtcGetProgramLog"),
            get_cubin_size: symbol!("nvrtcGetCUBINSize"),
            get_cubin: symbol!("nvrtcGetCUBIN"),
            destroy_program: symbol!("nvrtcDestroyProgram"),
            get_num_supported_archs: symbol!("nvrtcGetNumSupportedArchs"),
            get_supported_archs: symbol!("nvrtcGetSupportedArchs"),
            _library: library,
        })
    }

    /// `code` as an error of `call`, by NVRTC's name for it.
    fn check(&self, call: &'static str, code: NvrtcResult) -> Result<(), NvrtcError> {
        if code == 0 { Ok(()) } else { Err(NvrtcError::Call { call, code: self.error_name(code) }) }
    }

    fn error_name(&self, code: NvrtcResult) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string for any code (or null).
        let text = unsafe { (self.get_error_string)(code) };
        if text.is_null() {
            return format!("nvrtcResult {code}");
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
}

fn loaded() -> Result<&'static Library, NvrtcError> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    LIBRARY.get_or_init(Library::load).as_ref().map_err(|tried| NvrtcError::NotFound { tried: tried.clone() })
}

/// Whether libnvrtc can be loaded (checked once).
pub fn is_available() -> bool {
    loaded().is_ok()
}

/// The name libnvrtc was loaded by (one of [`LIBRARY_NAMES`]).
///
/// # Errors
/// [`NvrtcError::NotFound`] when no NVRTC 12 or 13 can be loaded.
pub fn library() -> Result<&'static str, NvrtcError> {
    loaded().map(|library| library.name)
}

/// NVRTC's version as (major, minor).
///
/// # Errors
/// [`NvrtcError::NotFound`] when libnvrtc cannot be loaded.
pub fn version() -> Result<(i32, i32), NvrtcError> {
    loaded().map(|library| library.version)
}

/// Compiles CUDA C++ `source` to a CUBIN for `arch` (for example `sm_90`).
///
/// `name` names the source in NVRTC's log. `options` are extra NVRTC options.
///
/// # Errors
/// [`NvrtcError::NotFound`] without libnvrtc; [`NvrtcError::Compile`] with NVRTC's log when
/// the source does not compile.
pub fn compile_cubin(name: &str, source: &str, arch: &str, options: &[&str]) -> Result<Vec<u8>, NvrtcError> {
    compile_cubin_with_headers(name, source, arch, options, &[])
}

/// As [`compile_cubin`], with `headers` (each an include name and its text) that the source
/// may `#include <name>` without any file on disk.
///
/// # Errors
/// As for [`compile_cubin`].
pub fn compile_cubin_with_headers(
    name: &str,
    source: &str,
    arch: &str,
    options: &[&str],
    headers: &[(&str, &str)],
) -> Result<Vec<u8>, NvrtcError> {
    let library = loaded()?;
    let to_c = |text: &str| {
        CString::new(text).map_err(|_| NvrtcError::Call {
            call: "nvrtcCreateProgram",
            code: "source, name or option contains a NUL byte".into(),
        })
    };
    let c_source = to_c(source)?;
    let c_name = to_c(&format!("{name}.cu"))?;
    let header_texts = headers.iter().map(|(_, text)| to_c(text)).collect::<Result<Vec<_>, _>>()?;
    let header_names = headers.iter().map(|(name, _)| to_c(name)).collect::<Result<Vec<_>, _>>()?;
    let text_pointers: Vec<*const c_char> = header_texts.iter().map(|text| text.as_ptr()).collect();
    let name_pointers: Vec<*const c_char> = header_names.iter().map(|name| name.as_ptr()).collect();
    let header_count = c_int::try_from(headers.len())
        .map_err(|_| NvrtcError::Call { call: "nvrtcCreateProgram", code: "too many headers".into() })?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: every string is NUL-terminated and outlives the call (NVRTC copies them); the two
    // header arrays each hold `header_count` pointers (null when there are none).
    let code = unsafe {
        (library.create_program)(
            &mut raw,
            c_source.as_ptr(),
            c_name.as_ptr(),
            header_count,
            if headers.is_empty() { std::ptr::null() } else { text_pointers.as_ptr() },
            if headers.is_empty() { std::ptr::null() } else { name_pointers.as_ptr() },
        )
    };
    library.check("nvrtcCreateProgram", code)?;
    let program = ProgramGuard { library, raw };

    let mut all_options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    all_options.extend(options.iter().map(|option| option.to_string()));
    let c_options = all_options.iter().map(|option| to_c(option)).collect::<Result<Vec<_>, _>>()?;
    let option_pointers: Vec<*const c_char> = c_options.iter().map(|option| option.as_ptr()).collect();
    // SAFETY: the program is live; the option pointers are NUL-terminated strings that outlive
    // the call, and their count is passed.
    let compiled =
        unsafe { (library.compile_program)(raw, option_pointers.len() as c_int, option_pointers.as_ptr()) };
    let log = program.log();
    if compiled != 0 {
        return Err(NvrtcError::Compile {
            kernel: name.to_string(),
            arch: arch.to_string(),
            code: library.error_name(compiled),
            log,
        });
    }
    if !log.trim().is_empty() {
        tracing::debug!("NVRTC log for {name} ({arch}):\n{log}");
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; the call writes one size_t.
    library.check("nvrtcGetCUBINSize", unsafe { (library.get_cubin_size)(raw, &mut size) })?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported for this program.
    library.check("nvrtcGetCUBIN", unsafe { (library.get_cubin)(raw, cubin.as_mut_ptr().cast()) })?;
    Ok(cubin)
}

/// The architectures this NVRTC can compile for, as compute capability numbers (`90` = 9.0).
///
/// # Errors
/// [`NvrtcError::NotFound`] without libnvrtc.
pub fn supported_architectures() -> Result<Vec<i32>, NvrtcError> {
    let library = loaded()?;
    let mut count = 0;
    // SAFETY: the call writes one int.
    library.check("nvrtcGetNumSupportedArchs", unsafe { (library.get_num_supported_archs)(&mut count) })?;
    let mut archs = vec![0; count.max(0) as usize];
    // SAFETY: `archs` has room for the `count` ints NVRTC reported.
    library.check("nvrtcGetSupportedArchs", unsafe { (library.get_supported_archs)(archs.as_mut_ptr()) })?;
    Ok(archs)
}

/// Destroys the program on every path out of `compile_cubin`.
struct ProgramGuard {
    library: &'static Library,
    raw: Program,
}

impl ProgramGuard {
    /// NVRTC's log for the program (empty when it cannot be read).
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: the program is live; the call writes one size_t.
        if unsafe { (self.library.get_program_log_size)(self.raw, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut raw = vec![0u8; size];
        // SAFETY: `raw` has the size NVRTC reported, terminating NUL included.
        if unsafe { (self.library.get_program_log)(self.raw, raw.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        match CStr::from_bytes_until_nul(&raw) {
            Ok(text) => text.to_string_lossy().into_owned(),
            Err(_) => String::from_utf8_lossy(&raw).into_owned(),
        }
    }
}

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        let code = unsafe { (self.library.destroy_program)(&mut self.raw) };
        if code != 0 {
            tracing::warn!("nvrtcDestroyProgram failed: {}", self.library.error_name(code));
        }
    }
}
