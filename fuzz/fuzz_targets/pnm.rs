//! The PNM reader (PBM, PGM, PPM, PAM, as hetmem-media decodes them for `hetmem filter`).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let _ = hetmem_media::fuzzing::pnm(bytes);
});
