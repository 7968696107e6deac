//! The safetensors header reader (`hetmem load` of a .safetensors file), on a file holding
//! the bytes.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

/// One file per fuzzing process, rewritten for each input.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("hetmem-fuzz-{}.safetensors", std::process::id())))
}

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    std::fs::write(scratch(), bytes).expect("the scratch file can be written");
    let _ = hetmem::data::SafetensorsHeader::read(scratch());
});
