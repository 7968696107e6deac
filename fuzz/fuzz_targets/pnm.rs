//! The PNM reader (PBM, PGM, PPM, PAM, as `hetmem filter` decodes them).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let _ = hetmem_cli::fuzzing::pnm(bytes);
});
