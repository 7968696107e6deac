//! Rules on hetmem's own source that the compiler and clippy do not check.

use std::path::Path;

fn rust_files(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// A pointer the CPU or the GPU writes through must come from the owner (`as_mut_ptr`, the
/// allocation), never from a shared slice: `as_ptr().cast_mut()` once gave registered memory
/// a read-only provenance that later writes violated. clippy's `as_ptr_cast_mut`
/// catches `as *mut` casts but not `.cast_mut()`, hence this scan. A read-only use carries
/// `#[allow(clippy::as_ptr_cast_mut, reason = ...)]` on the line before.
#[test]
fn no_written_pointer_comes_from_a_shared_slice() {
    let mut files = Vec::new();
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // hetmem-bench queues raw copies and kernels too; it sits beside hetmem in the workspace
    // (not in a packaged hetmem, where only hetmem's own files are checked).
    let bench_dir = crate_dir.join("../hetmem-bench");
    for root in [crate_dir, bench_dir.as_path()].into_iter().filter(|root| root.is_dir()) {
        for dir in ["src", "examples", "tests"] {
            rust_files(&root.join(dir), &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let cast_mut = [".as_ptr()", ".cast_mut()"].concat();
            let as_mut = [".as_ptr()", " as *mut"].concat();
            if !(code.contains(&cast_mut) || code.contains(&as_mut)) {
                continue;
            }
            let justified =
                lines[at.saturating_sub(4)..at].iter().any(|l| l.contains("clippy::as_ptr_cast_mut"));
            if !justified {
                offences.push(format!("{}:{}: {}", file.display(), at + 1, line.trim()));
            }
        }
    }
    assert!(offences.is_empty(), "pointers cast to *mut from as_ptr():\n{}", offences.join("\n"));
}

/// The driver leaves pinned memory unwritten, and a reference over bytes never written (an
/// `&AtomicU32` over a flag word, a slice) is undefined behaviour: above the backend, pinned
/// memory is allocated zeroed (`PinnedAlloc::zeroed`), never with the bare `PinnedAlloc::new`.
#[test]
fn pinned_memory_is_zeroed_before_anything_refers_to_it() {
    // The library only: hetmem-bench times the bare driver call, and never reads what it made.
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let bare = ["PinnedAlloc::", "new("].concat();
    let offences: Vec<String> = files
        .iter()
        .filter(|file| !file.ends_with("backend/cuda/host.rs"))
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            text.lines()
                .enumerate()
                .filter(|(_, line)| line.split("//").next().unwrap_or("").contains(&bare))
                .map(|(at, line)| format!("{}:{}: {}", file.display(), at + 1, line.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(offences.is_empty(), "pinned memory allocated without zeroing:\n{}", offences.join("\n"));
}
