//! The summary's figures against a stopwatch: the wall time it reports covers the command
//! (less the process's own start and exit), its frames/s is the frames over that time, and
//! the rate over the frames alone differs from it by exactly the setup it names.

use std::time::Instant;

use super::*;

/// What a process's start and exit may add to the reported wall time (exec, dynamic loading,
/// freeing its memory), on a busy two-core machine.
const PROCESS_SLACK_S: f64 = 0.5;

/// `name` in the report's setup list: its seconds.
fn setup_seconds(summary: &serde_json::Value, name: &str) -> f64 {
    summary["setup"]
        .as_array()
        .expect("a setup list")
        .iter()
        .find(|phase| phase["name"] == name)
        .unwrap_or_else(|| panic!("no setup phase {name:?} in {summary}"))["seconds"]
        .as_f64()
        .unwrap()
}

#[test]
fn the_reported_wall_time_and_frames_per_s_agree_with_a_stopwatch() {
    let dir = TempDir::new("figures");
    let (width, height) = (640, 360);
    let format = FrameFormat::new(width, height, PixelLayout::Gray).unwrap();
    let header = format!("YUV4MPEG2 W{width} H{height} F25:1 Cmono\n");
    let frames: Vec<Vec<u8>> = (0..24).map(|_| random_bytes(format.frame_bytes())).collect();
    let input = dir.path("in.y4m");
    std::fs::write(&input, y4m(&header, &frames)).unwrap();
    let output = dir.path("out.y4m");
    // An output that exists already is replaced (-y): its truncation and its closing are timed.
    std::fs::write(&output, random_bytes(1 << 20)).unwrap();

    let stopwatch = Instant::now();
    let run = hetmem(&["filter", "-y", text(&input), text(&output), "--json"]);
    let measured = stopwatch.elapsed().as_secs_f64();
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&std::fs::read(&output).unwrap(), &header, format, &default_kernel(), &frames);

    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    let number = |key: &str| summary[key].as_f64().unwrap_or_else(|| panic!("no {key} in {summary}"));
    let (wall, streaming, setup) = (number("wall_s"), number("streaming_s"), number("setup_s"));
    assert_eq!(summary["frames"].as_u64(), Some(frames.len() as u64));
    let count = frames.len() as f64;

    // The command's wall time is inside the stopwatch's, short of it by the process's start
    // and exit alone.
    assert!(wall > 0.0 && wall <= measured, "reported {wall} s, the stopwatch {measured} s");
    assert!(
        measured - wall <= PROCESS_SLACK_S,
        "reported {wall} s, the stopwatch {measured} s: time went unreported"
    );
    // The headline is the frames over that wall time, so frames over the stopwatch's time
    // differs from it by the process's start and exit alone.
    assert!((number("frames_per_s") - count / wall).abs() <= 1e-9 * count / wall, "{summary}");
    assert!(count / measured <= number("frames_per_s"), "{summary}");
    // The rate over the streaming alone differs from the headline by exactly the setup named.
    assert!(
        streaming > 0.0
            && (number("streaming_frames_per_s") - count / streaming).abs() < 1e-6 * count / streaming
    );
    assert!((streaming + setup - wall).abs() < 1e-6, "streaming {streaming} + setup {setup} != wall {wall}");
    let named: f64 =
        summary["setup"].as_array().unwrap().iter().map(|phase| phase["seconds"].as_f64().unwrap()).sum();
    assert!((named - setup).abs() < 1e-9, "{summary}");
    for name in [
        "opening the device",
        "placement",
        "kernel (first load: compile or cache)",
        "frame memory (pinning)",
        "opening the output",
        "closing the output",
        "releasing the frame memory",
    ] {
        assert!(setup_seconds(&summary, name) >= 0.0, "{name}");
    }

    // The text summary gives the same figures, by name.
    let run = hetmem(&["filter", "-y", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    let message = stderr(&run);
    assert!(message.contains("frames/s over the command's"), "{message}");
    assert!(message.contains("frames/s over the") && message.contains("s the frames streamed"), "{message}");
    let setup_line =
        message.lines().find(|line| line.starts_with("setup ")).unwrap_or_else(|| panic!("{message}"));
    assert!(setup_line.contains(" s: ") && setup_line.contains("other (headers, checks)"), "{message}");
}
