//! The Y4M reader (hetmem-media's, as `hetmem filter` reads a .y4m file): any bytes end in
//! frames or an error.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let _ = hetmem_media::fuzzing::y4m(bytes);
});
