//! Doorbell round trips against one kernel launch per request, printed as one JSON object.
//!
//! - `round_trip_us`: a 64-byte request (gain over 16 f32) submitted and waited for, one at a
//!   time: the doorbell's latency. Goal on the H200 machine: median <= 3 µs.
//! - `doorbell_requests_per_s`: the same requests with the queue kept full (depth in flight).
//! - `launch_round_trip_us` / `launch_requests_per_s`: one `affine_u32` kernel launch over 16
//!   mapped words per request, waited for on its event: what the doorbell saves.
//!
//! Every reply is checked against the CPU reference (bit-exact). The launches run before the
//! doorbell starts: while its persistent kernel runs, nothing in the process may synchronise
//! the device.
//!
//! Run with `cargo run --release -p hetmem-bench --example doorbell_latency [SAMPLES]` (default
//! 20000 on a GPU, 2000 on the CPU backend).

use std::time::Instant;

use hetmem::resident::{Doorbell, Request};
use hetmem::{Device, HostBuf, PinOptions, Queue, ops};
use hetmem_bench::Summary;

mod support;

use support::{FreshWords, check};

const DEPTH: usize = 16;

fn micros(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e6
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::open_best()?;
    let default_samples = if device.as_cuda().is_some() { 20_000 } else { 2_000 };
    let samples: usize =
        std::env::args().nth(1).map(|text| text.parse()).transpose()?.unwrap_or(default_samples);
    eprintln!("device: {} ({} backend)", device.name(), device.backend());
    let mut rng = FreshWords::from_time();
    let mut random_block =
        || -> Vec<f32> { (0..16).map(|_| (rng.next_u32() >> 8) as f32 / 65536.0 - 128.0).collect() };

    // One kernel launch per request, before the persistent kernel holds the GPU.
    let queue = Queue::new(&device)?;
    let mut input = HostBuf::<u32>::pinned(&device, 16, PinOptions::default())?;
    let mut output = Some(HostBuf::<u32>::pinned(&device, 16, PinOptions::default())?);
    let mut launch_us = Vec::with_capacity(samples);
    for round in 0..samples + samples / 10 {
        let words: Vec<u32> = random_block().iter().map(|value| value.to_bits()).collect();
        input.as_mut_slice().copy_from_slice(&words);
        let start = Instant::now();
        let shared = queue.share(input);
        let mut lent = queue.lend(output.take().expect("returned each round"));
        ops::affine_u32(&queue, &shared, &mut lent, 3, 1)?;
        let done = lent.reclaim()?;
        let elapsed = micros(start);
        input = shared.reclaim()?;
        let mut expected = vec![0u32; 16];
        ops::affine_u32_cpu(&words, &mut expected, 3, 1);
        check(&format!("launch round {round}"), done.as_slice(), &expected)?;
        output = Some(done);
        if round >= samples / 10 {
            launch_us.push(elapsed);
        }
    }
    let launch_total: f64 = launch_us.iter().sum();
    drop((queue, input, output));

    let bell = Doorbell::start(&device, DEPTH)?;
    // Round trips, one at a time; the first tenth warms up.
    let mut round_trip_us = Vec::with_capacity(samples);
    for round in 0..samples + samples / 10 {
        let block = random_block();
        let request = Request::Gain { gain: 0.75, samples: &block };
        let start = Instant::now();
        let reply = bell.call(request)?;
        let elapsed = micros(start);
        if reply.iter().map(|v| v.to_bits()).ne(request.reference().iter().map(|v| v.to_bits())) {
            return Err(format!("doorbell round {round}: reply differs from the CPU").into());
        }
        if round >= samples / 10 {
            round_trip_us.push(elapsed);
        }
    }
    // Throughput: keep DEPTH requests in flight.
    let blocks: Vec<Vec<f32>> = (0..DEPTH).map(|_| random_block()).collect();
    let wanted: Vec<Vec<f32>> =
        blocks.iter().map(|block| Request::Gain { gain: -1.5, samples: block }.reference()).collect();
    let start = Instant::now();
    let mut tickets = std::collections::VecDeque::with_capacity(DEPTH);
    for index in 0..samples {
        if tickets.len() == DEPTH {
            let (ticket, at): (hetmem::resident::Ticket<'_>, usize) = tickets.pop_front().expect("full");
            if ticket.wait()? != wanted[at] {
                return Err(format!("pipelined request {index}: reply differs from the CPU").into());
            }
        }
        let at = index % DEPTH;
        tickets.push_back((bell.submit(Request::Gain { gain: -1.5, samples: &blocks[at] })?, at));
    }
    for (ticket, at) in tickets {
        if ticket.wait()? != wanted[at] {
            return Err("a pipelined reply differs from the CPU".into());
        }
    }
    let pipelined_s = start.elapsed().as_secs_f64();
    bell.shutdown()?;

    let report = serde_json::json!({
        "device": device.name(),
        "backend": device.backend().to_string(),
        "request_bytes": 64,
        "samples": samples,
        "round_trip_us": Summary::of(&round_trip_us),
        "doorbell_requests_per_s": samples as f64 / pipelined_s,
        "doorbell_depth": DEPTH,
        "launch_round_trip_us": Summary::of(&launch_us),
        "launch_requests_per_s": launch_us.len() as f64 / (launch_total * 1e-6),
        "goal_median_us": 2.5,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
