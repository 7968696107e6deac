//! The safetensors and NIfTI fuzz targets' files (`fuzz/` at the workspace root), replayed
//! without the fuzzer: the seeds are read whole, and every input a fuzzer found a crash, hang
//! or allocation with (fuzz/regressions/) ends in an error naming the problem.

#[cfg(feature = "nifti")]
use std::path::Path;
use std::path::PathBuf;

use hetmem::data::SafetensorsHeader;

/// The files of `fuzz/<kind>/<target>/`, sorted.
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz").join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.map(|entry| entry.unwrap().path()).collect();
    files.sort();
    files
}

#[test]
fn the_safetensors_seeds_are_read_and_the_regressions_refused() {
    let seeds = files("seeds", "safetensors");
    assert!(!seeds.is_empty(), "no seeds in fuzz/seeds/safetensors");
    for path in seeds {
        let header =
            SafetensorsHeader::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert!(!header.tensors.is_empty(), "{}", path.display());
    }
    for path in files("regressions", "safetensors") {
        let error = SafetensorsHeader::read(&path).unwrap_err();
        assert!(matches!(error, hetmem::Error::MalformedFile { .. }), "{}: {error}", path.display());
    }
}

/// The NIfTI reader on `path`, as the fuzz target calls it: `.nii.gz` when it is gzip.
#[cfg(feature = "nifti")]
fn read_nifti(path: &Path, dir: &Path) -> hetmem::Result<()> {
    let bytes = std::fs::read(path).unwrap();
    let name = if bytes.starts_with(&[0x1f, 0x8b]) { "volume.nii.gz" } else { "volume.nii" };
    let copy = dir.join(name);
    std::fs::write(&copy, &bytes).unwrap();
    hetmem::ops::ct::read_nifti_hu(&copy)?;
    hetmem::ops::ct::read_nifti_labels(&copy).map(drop)
}

#[cfg(feature = "nifti")]
#[test]
fn the_nifti_seeds_are_read_and_the_regressions_refused() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = files("seeds", "nifti");
    assert!(!seeds.is_empty(), "no seeds in fuzz/seeds/nifti");
    for path in seeds {
        // Labels are u8: the HU seeds hold negative values, which only the HU reader takes.
        let bytes = std::fs::read(&path).unwrap();
        let name = if bytes.starts_with(&[0x1f, 0x8b]) { "volume.nii.gz" } else { "volume.nii" };
        std::fs::write(dir.path().join(name), &bytes).unwrap();
        hetmem::ops::ct::read_nifti_hu(&dir.path().join(name))
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    }
    let regressions = files("regressions", "nifti");
    assert!(!regressions.is_empty(), "fuzz/regressions/nifti holds the header-claims cases");
    for path in regressions {
        let error = read_nifti(&path, dir.path()).unwrap_err().to_string();
        // Refused from the header, before the volume is reserved (the `nifti` crate reserved
        // what the header claimed: 16 GiB for a 400-byte file).
        assert!(
            error.contains("NIfTI file") && error.contains("header claims"),
            "{}: {error}",
            path.display()
        );
    }
}
