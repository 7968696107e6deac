//! CPU-GPU ping-pong on managed memory: each round the GPU computes `b = a + 1` over two
//! managed buffers and the CPU reads all of `b`, checks it, and writes `a = b + 1`, so the
//! pages cross the link both ways every round. Three ways of keeping the memory, each timed in
//! microseconds per round (median and spread) and written as JSON:
//! - `global`: allocated as usual (attached to every stream), pages migrated by faults;
//! - `single`: attached to the queue's stream alone (`Queue::attach`, `cuStreamAttachMemAsync`
//!   with `CU_MEM_ATTACH_SINGLE`), pages migrated by faults;
//! - `prefetch`: attached globally, prefetched to the GPU before each kernel and back to the
//!   host after it.
//!
//! Every round's values are checked, so a mode that loses a write fails instead of reporting a
//! time. On the CPU backend attaching and prefetching do nothing and the three modes should
//! agree.
//!
//! Run with `cargo run --release -p hetmem --example managed_pingpong -- [--rounds N]
//! [--bytes B[,B...]] [--json PATH]` (defaults: 100 rounds of 4 KiB and 1 MiB, JSON on stdout).

mod support;

use std::time::Instant;

use hetmem::backend::cuda::MemLocation;
use hetmem::{Device, ManagedBuf, Queue, ops};
use support::XorShift32;

const MODES: [&str; 3] = ["global", "single", "prefetch"];

struct Options {
    rounds: usize,
    bytes: Vec<usize>,
    json: Option<std::path::PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut options = Options { rounds: 100, bytes: vec![4096, 1 << 20], json: None };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => {
                let text = value()?;
                options.rounds = text.parse().map_err(|_| format!("--rounds {text}: give a number"))?;
            }
            "--bytes" => {
                let text = value()?;
                options.bytes = text
                    .split(',')
                    .map(|size| {
                        size.parse::<usize>().map_err(|_| format!("--bytes {size}: give a byte count"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--json" => options.json = Some(value()?.into()),
            other => {
                return Err(format!("unknown argument `{other}`: --rounds N, --bytes B[,B...], --json PATH"));
            }
        }
    }
    if options.rounds < 2 || options.rounds > 1_000_000 {
        return Err(format!("--rounds {}: give 2 to 1000000", options.rounds));
    }
    if let Some(bad) = options.bytes.iter().find(|&&bytes| bytes < 4 || bytes % 4 != 0 || bytes > 1 << 30) {
        return Err(format!("--bytes {bad}: give multiples of 4 from 4 to 1 GiB"));
    }
    Ok(options)
}

/// The two buffers of one mode, as that mode keeps them.
enum Buffers<'q> {
    Plain { a: Option<ManagedBuf<u32>>, b: Option<ManagedBuf<u32>>, prefetch: bool },
    Attached { a: hetmem::handoff::Attached<'q, u32>, b: hetmem::handoff::Attached<'q, u32> },
}

/// Microseconds of each round after the first (which pays for first touches).
fn run_mode(
    device: &Device,
    queue: &Queue,
    mode: &str,
    words: usize,
    rounds: usize,
    rng: &mut XorShift32,
) -> hetmem::Result<Vec<f64>> {
    let mut a = ManagedBuf::<u32>::new(device, words)?;
    let b = ManagedBuf::<u32>::new(device, words)?;
    a.as_mut_slice().iter_mut().for_each(|x| *x = rng.next_u32());
    let mut expected: Vec<u32> = a.as_slice().iter().map(|x| x.wrapping_add(1)).collect();
    let mut buffers = match mode {
        "single" => Buffers::Attached { a: queue.attach(a)?, b: queue.attach(b)? },
        _ => Buffers::Plain { a: Some(a), b: Some(b), prefetch: mode == "prefetch" },
    };
    let gpu = MemLocation::Device(device.gpu_ordinal().unwrap_or(0));
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let start = Instant::now();
        // The GPU's half: b = a + 1; then the CPU's: check b, a = b + 1.
        let check =
            |b: &[u32], expected: &[u32]| match b.iter().zip(expected).position(|(got, want)| got != want) {
                None => Ok(()),
                Some(i) => Err(hetmem::Error::invalid(
                    "ping-pong",
                    format!("{mode}, round {round}: word {i} is {:#x}, expected {:#x}", b[i], expected[i]),
                )),
            };
        match &mut buffers {
            Buffers::Plain { a, b, prefetch } => {
                let mut input = queue.lend(a.take().expect("returned each round"));
                let mut output = queue.lend(b.take().expect("returned each round"));
                if *prefetch {
                    input.prefetch(gpu)?;
                    output.prefetch(gpu)?;
                }
                ops::affine_u32(queue, &input, &mut output, 1, 1)?;
                if *prefetch {
                    input.prefetch(MemLocation::Host)?;
                    output.prefetch(MemLocation::Host)?;
                }
                let (mut host_a, host_b) = (input.reclaim()?, output.reclaim()?);
                check(host_b.as_slice(), &expected)?;
                host_a
                    .as_mut_slice()
                    .iter_mut()
                    .zip(host_b.as_slice())
                    .for_each(|(x, y)| *x = y.wrapping_add(1));
                *a = Some(host_a);
                *b = Some(host_b);
            }
            Buffers::Attached { a, b } => {
                let input = a.lease()?;
                ops::affine_u32(queue, &*input, b.lease()?, 1, 1)?;
                let host_b = b.host()?;
                check(host_b, &expected)?;
                a.host_mut()?.iter_mut().zip(host_b).for_each(|(x, y)| *x = y.wrapping_add(1));
            }
        }
        expected.iter_mut().for_each(|x| *x = x.wrapping_add(2));
        if round > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    if let Buffers::Attached { a, b } = buffers {
        drop((a.detach()?, b.detach()?));
    }
    Ok(times)
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let device = Device::open_best()?;
    let capabilities = device.capabilities();
    if capabilities.gpu && !capabilities.concurrent_managed_access {
        println!(
            "{}: no concurrent managed access, so hetmem gives no managed buffers; nothing to measure",
            device.name()
        );
        return Ok(());
    }
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let queue = Queue::new(&device)?;
    let mut rng = XorShift32::from_time();
    let mut cells = Vec::new();
    for &bytes in &options.bytes {
        for mode in MODES {
            let mut times = run_mode(&device, &queue, mode, bytes / 4, options.rounds, &mut rng)?;
            times.sort_by(f64::total_cmp);
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            let (p10, median, p90) =
                (percentile(&times, 0.1), percentile(&times, 0.5), percentile(&times, 0.9));
            eprintln!(
                "{bytes:>10} B  {mode:<8}  median {median:>9.1} us/round  (p10 {p10:.1}, p90 {p90:.1})"
            );
            cells.push(serde_json::json!({
                "bytes": bytes, "mode": mode, "rounds": times.len(),
                "us_per_round": { "median": median, "mean": mean, "p10": p10, "p90": p90,
                                  "min": times[0], "max": times[times.len() - 1] },
            }));
        }
    }
    let report = serde_json::json!({
        "benchmark": "managed_pingpong",
        "device": device.name(),
        "backend": device.backend().to_string(),
        "concurrent_managed_access": capabilities.concurrent_managed_access,
        "workload": "per round: GPU b = a + 1 (affine_u32), CPU checks all of b and writes a = b + 1; the first round (first touches) is left out",
        "cells": cells,
    });
    let text = serde_json::to_string_pretty(&report)?;
    match &options.json {
        Some(path) => std::fs::write(path, text + "\n")?,
        None => println!("{text}"),
    }
    Ok(())
}
