//! What registering shared memory with the GPU costs, per GiB, against anonymous memory of
//! the same page size: one JSON object per case, medians of `--runs` runs.
//!
//! Cases (each over `--gib` GiB of memory whose pages are already touched, as a buffer a
//! process has filled):
//! - `anonymous_4k`: a `PageBox` of base pages, `HostBuf::register`;
//! - `anonymous_thp`: a `PageBox::huge` (transparent huge pages, madvise), `HostBuf::register`;
//! - `shared_memfd_4k_open`: a sealed memfd filled by its creator, then opened (mapped and
//!   registered) as the other process does, `SharedHostBuf::receive` (here over a socket pair
//!   within the process);
//! - `shared_memfd_4k_create`: `SharedHostBuf::create`, fresh pages faulted in by the
//!   registration itself;
//! - `shared_memfd_2m_create`: the same with `MFD_HUGETLB` 2 MiB pages, reported as unavailable
//!   (with the kernel's reason) where no huge pages are reserved (`/proc/sys/vm/nr_hugepages`).
//!
//! `register_ms` is the registration (for `_open`, the mapping too, which is cheap), and
//! `unregister_ms` the drop (unregistration and unmapping), both per GiB. On the CPU backend
//! nothing registers, so the figures there are the mapping's alone.
//!
//! ```text
//! cargo run --release -p hetmem --example shared_registration -- --gib 1 --runs 5
//! ```

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use hetmem::memory::{PageBox, RegisterOptions, SharedHostBuf, SharedOptions};
use hetmem::{Device, HostBuf};

/// Registration and unregistration time of one run.
type Run = (Duration, Duration);

fn median_ms(mut values: Vec<Duration>, gib: f64) -> f64 {
    values.sort();
    values[values.len() / 2].as_secs_f64() * 1e3 / gib
}

/// Touches every page, so registration finds them present (as for memory a program filled).
fn touch(bytes: &mut [u8]) {
    bytes.iter_mut().step_by(4096).enumerate().for_each(|(i, byte)| *byte = i as u8 | 1);
}

fn anonymous(device: &Device, bytes: usize, huge: bool) -> hetmem::Result<Run> {
    let mut memory = if huge { PageBox::<u8>::huge(bytes)? } else { PageBox::<u8>::zeroed(bytes)? };
    touch(&mut memory);
    let start = Instant::now();
    let buf = HostBuf::register(device, memory, RegisterOptions::default())?;
    let registered = start.elapsed();
    let start = Instant::now();
    drop(buf);
    Ok((registered, start.elapsed()))
}

fn shared_open(device: &Device, bytes: usize) -> hetmem::Result<Run> {
    let (here, there) =
        UnixStream::pair().map_err(|source| hetmem::Error::Io { context: "socket pair".into(), source })?;
    let mut creator = SharedHostBuf::<u8>::create(&Device::cpu(), bytes, SharedOptions::default())?;
    touch(creator.as_mut_slice());
    // SAFETY: the creator does not touch the buffer while the opener has it.
    unsafe { creator.send(&here)? };
    let start = Instant::now();
    // SAFETY: the creator does not touch the buffer while the opener has it.
    let opened = unsafe { SharedHostBuf::<u8>::receive(device, &there, RegisterOptions::default())? };
    let registered = start.elapsed();
    let start = Instant::now();
    drop(opened);
    Ok((registered, start.elapsed()))
}

fn shared_create(device: &Device, bytes: usize, huge_pages: bool) -> hetmem::Result<Run> {
    let start = Instant::now();
    let buf = SharedHostBuf::<u8>::create(device, bytes, SharedOptions { huge_pages, ..Default::default() })?;
    let registered = start.elapsed();
    let start = Instant::now();
    drop(buf);
    Ok((registered, start.elapsed()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut gib, mut runs) = (1usize, 5usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a number"));
        match arg.as_str() {
            "--gib" => gib = value()?.parse()?,
            "--runs" => runs = value()?.parse()?,
            other => return Err(format!("unknown argument {other}: give --gib N, --runs N").into()),
        }
    }
    if gib == 0 || runs == 0 {
        return Err("--gib and --runs must be at least 1".into());
    }
    let bytes = gib.checked_mul(1 << 30).ok_or("--gib is too large")?;
    let device = Device::open_best()?;
    let cases: [(&str, &dyn Fn() -> hetmem::Result<Run>); 5] = [
        ("anonymous_4k", &|| anonymous(&device, bytes, false)),
        ("anonymous_thp", &|| anonymous(&device, bytes, true)),
        ("shared_memfd_4k_open", &|| shared_open(&device, bytes)),
        ("shared_memfd_4k_create", &|| shared_create(&device, bytes, false)),
        ("shared_memfd_2m_create", &|| shared_create(&device, bytes, true)),
    ];
    for (case, run) in cases {
        let mut register = Vec::new();
        let mut unregister = Vec::new();
        let mut failure = None;
        for _ in 0..runs {
            match run() {
                Ok((registered, unregistered)) => {
                    register.push(registered);
                    unregister.push(unregistered);
                }
                Err(error) => {
                    failure = Some(error.to_string());
                    break;
                }
            }
        }
        let line = match failure {
            Some(reason) => serde_json::json!({
                "case": case, "device": device.name(), "gib": gib, "unavailable": reason,
            }),
            None => serde_json::json!({
                "case": case,
                "device": device.name(),
                "backend": device.backend().to_string(),
                "gib": gib,
                "runs": runs,
                "register_ms_per_gib": median_ms(register, gib as f64),
                "unregister_ms_per_gib": median_ms(unregister, gib as f64),
            }),
        };
        println!("{line}");
    }
    Ok(())
}
