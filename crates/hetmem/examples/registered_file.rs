//! A file as kernel input: map it read-only, register the mapping, and let a kernel read it
//! straight from the page cache.
//!
//! The example writes a temporary file of `u32` words, opens it as a `MappedFile` (on a GPU the
//! mapping is registered read-only with the driver and mapped into the device's address space),
//! and runs `affine_u32` (`y = x * a + b`) from the file into a pinned host output buffer.
//! Without a GPU the same program runs on hetmem's CPU backend.
//!
//! Run with `cargo run -p hetmem --example registered_file`.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use hetmem::{Device, HostBuf, MappedFile, PinOptions, Queue, ops};

/// Words in the file: a bit over 4 MiB, and not a multiple of the block size.
const LEN: usize = (1 << 20) + 7;

mod support;

use support::{XorShift32, check};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    if let Some(reason) = device.cpu_fallback_reason() {
        println!("  no GPU in use: {reason}");
    }
    let queue = Queue::new(&device)?;

    // 1. Fresh data, written to a file only this process uses. The guard deletes the file when
    //    main returns, on success or error.
    let mut rng = XorShift32::from_time();
    let words: Vec<u32> = (0..LEN).map(|_| rng.next_u32()).collect();
    let (a, b) = (rng.next_u32() | 1, rng.next_u32());
    let temp = TempFile::new("hetmem-registered-file")?;
    // bytemuck (already a hetmem dependency) views the words as native-endian bytes, which is
    // what `MappedFile<u32>` reads back.
    std::fs::write(temp.path(), bytemuck::cast_slice::<u32, u8>(&words))?;
    println!("wrote {} ({} bytes)", temp.path().display(), LEN * size_of::<u32>());

    // 2. Map the file. SAFETY: a file mapping is only sound while the file is neither truncated
    //    nor modified (a truncation makes reads fault with SIGBUS, a modification changes data
    //    already read). This example created the file under a unique name, writes it only
    //    before mapping it, and deletes it only after the mapping is dropped; nothing else knows
    //    the name.
    let file = unsafe { MappedFile::<u32>::open(&device, temp.path()) }?;
    println!("mapped {} words; registered with the GPU: {}", file.as_slice().len(), file.is_registered());
    if file.as_slice() != &words[..] {
        return Err("the mapping does not hold the words just written".into());
    }

    // 3. The output: pinned, mapped host memory (zero-copy on a GPU).
    let output = HostBuf::<u32>::pinned(&device, LEN, PinOptions::default())?;
    println!("output: {:?}, mapped: {}", output.kind(), output.is_mapped());

    // 4. A MappedFile is read-only, so it can only be shared (never lent): kernels read it, and
    //    the CPU may keep reading it meanwhile. The output is lent exclusively to the GPU.
    let file = queue.share(file);
    let mut output = queue.lend(output);
    ops::affine_u32(&queue, &file, &mut output, a, b)?;
    println!("queued affine_u32 (y = x * {a:#x} + {b:#x}) on the {} queue", queue.backend());
    // The CPU may read a shared buffer while the kernel reads it too.
    println!("first word of the file, read by the CPU while shared with the queue: {:#010x}", file.host()[0]);

    // 5. Reclaim (waits for the kernel), then check against the CPU computation.
    let output = output.reclaim()?;
    let file = file.reclaim()?;
    let mut expected = vec![0u32; LEN];
    ops::affine_u32_cpu(&words, &mut expected, a, b);
    check("registered_file", output.as_slice(), &expected)?;
    // Unmap before the guard deletes the file (locals drop in reverse order anyway; this makes
    // the order explicit).
    drop(file);
    println!("ok: {LEN} words match the CPU reference on the {} backend", queue.backend());
    Ok(())
}

/// A file in the system's temporary folder with a unique name, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(prefix: &str) -> std::io::Result<TempFile> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_nanos());
        let path = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}.bin", std::process::id()));
        // Fail rather than reuse a file someone else made.
        std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        Ok(TempFile(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => println!("removed {}", self.0.display()),
            Err(error) => eprintln!("could not remove {}: {error}", self.0.display()),
        }
    }
}
