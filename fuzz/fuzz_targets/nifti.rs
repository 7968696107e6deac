//! The NIfTI-1 reader (`hetmem bench ct --volume`), on a file holding the bytes: `.nii`, or
//! `.nii.gz` for bytes that start as gzip does.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

/// One file of each kind per fuzzing process, rewritten for each input.
fn scratch(gzip: bool) -> &'static PathBuf {
    static PLAIN: OnceLock<PathBuf> = OnceLock::new();
    static GZIP: OnceLock<PathBuf> = OnceLock::new();
    let (cell, extension) = if gzip { (&GZIP, "nii.gz") } else { (&PLAIN, "nii") };
    cell.get_or_init(|| std::env::temp_dir().join(format!("hetmem-fuzz-{}.{extension}", std::process::id())))
}

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let path = scratch(bytes.starts_with(&[0x1f, 0x8b]));
    std::fs::write(path, bytes).expect("the scratch file can be written");
    let _ = hetmem::ops::ct::read_nifti_hu(path);
    let _ = hetmem::ops::ct::read_nifti_labels(path);
});
