//! What guarding a CPU loop over a file window against truncation costs, printed as JSON lines:
//! for copies of 4 KiB, 64 KiB and 1 MiB out of a warm window, the median time per copy plain
//! (`as_slice`), inside `FileWindow::guard_truncation` (the range armed against SIGBUS), and
//! after `FileWindow::check_file` (an `fstat` of the file: what a size check before every loop
//! would add), each the median of 101 batches in one process, interleaved.
//!
//! Run with `cargo run --release -p hetmem-bench --example guard_cost [BATCH]` (copies per
//! batch, default 2000).

use std::hint::black_box;
use std::time::Instant;

use hetmem::Device;
use hetmem::memory::WindowedFile;
use hetmem_bench::Summary;

mod support;

use support::FreshWords;

const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let batch: usize = std::env::args().nth(1).map(|text| text.parse()).transpose()?.unwrap_or(2000);
    let device = Device::open_best()?;
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let dir = tempfile::tempdir()?;
    let mut rng = FreshWords::from_time();
    for bytes in SIZES {
        let path = dir.path().join(format!("{bytes}.bin"));
        let data: Vec<u8> = (0..bytes).map(|_| rng.next_u32() as u8).collect();
        std::fs::write(&path, &data)?;
        // SAFETY: the file is this program's own and is neither truncated nor changed while
        // mapped.
        let file = unsafe { WindowedFile::open(&device, &path) }?;
        let window = file.window::<u8>(0..bytes as u64)?;
        let mut out = vec![0xA5u8; bytes];
        let mut copy = |how: usize| -> Result<(), hetmem::Error> {
            match how {
                0 => out.copy_from_slice(window.as_slice()),
                1 => window.guard_truncation(|| out.copy_from_slice(window.as_slice()))?,
                _ => {
                    window.check_file()?;
                    out.copy_from_slice(window.as_slice());
                }
            }
            black_box(&mut out);
            Ok(())
        };
        let mut samples = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..101 {
            for how in [round % 3, (round + 1) % 3, (round + 2) % 3] {
                let start = Instant::now();
                for _ in 0..batch {
                    copy(how)?;
                }
                samples[how].push(start.elapsed().as_secs_f64() * 1e9 / batch as f64);
            }
        }
        assert_eq!(out, data, "the copies read the file's bytes");
        let median = |how: usize| Summary::of(&samples[how]).map_or(f64::NAN, |summary| summary.median);
        let (plain, guarded, checked) = (median(0), median(1), median(2));
        println!(
            "{{\"bytes\":{bytes},\"plain_ns\":{plain:.1},\"guarded_ns\":{guarded:.1},\"checked_ns\":{checked:.1},\
             \"guard_overhead_ns\":{:.1},\"check_overhead_ns\":{:.1}}}",
            guarded - plain,
            checked - plain
        );
    }
    Ok(())
}
