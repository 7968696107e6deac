//! `--retries`: a frame that fails is filtered again with the frames after it, the
//! output is the same as a run without faults byte for byte, each retry is reported; without
//! retries the run ends at the failed frame after writing every frame before it. Faults come
//! from the binary's own test hook (`--inject-fault`, feature `testing`); on the GPU one of
//! them is a kernel that really faults, after which the run goes on on the CPU.

use super::*;

/// `frames` random 4:2:0 frames of an odd size, as Y4M, with the header.
fn video(frames: usize) -> (&'static str, FrameFormat, Vec<Vec<u8>>) {
    let format = FrameFormat::new(67, 45, PixelLayout::Yuv420).unwrap();
    (
        "YUV4MPEG2 W67 H45 F25:1 C420jpeg\n",
        format,
        (0..frames).map(|_| random_bytes(format.frame_bytes())).collect(),
    )
}

/// The summary `--report` wrote to `report`, after `output`.
fn json_of(report: &Path, output: &Output) -> serde_json::Value {
    let text = std::fs::read_to_string(report)
        .unwrap_or_else(|error| panic!("no report: {error}: {}", stderr(output)));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

fn retried_indices(summary: &serde_json::Value) -> Vec<u64> {
    summary["retried"].as_array().unwrap().iter().map(|retry| retry["index"].as_u64().unwrap()).collect()
}

/// On `backend` by `strategy`: faults injected as `rules`, retried, give the fault-free result;
/// the first retried frame is `first_retried` (any, when `None`), and the retries used are
/// within `retries_used`. (Which frames a later fault hits depends on how far the reader had
/// got when a frame failed, so only the first is fixed.)
fn retried_run_equals_the_cpu_path(
    backend: &str,
    strategy: &str,
    rules: &[&str],
    retries: &str,
    first_retried: Option<u64>,
    retries_used: std::ops::RangeInclusive<usize>,
) {
    let (header, format, frames) = video(7);
    let kernel = default_kernel();
    let dir = TempDir::new("retried");
    let report = dir.path("report.json");
    let mut args =
        vec!["filter", "-", "-", "--strategy", strategy, "--retries", retries, "--report", text(&report)];
    for rule in rules {
        args.extend(["--inject-fault", rule]);
    }
    let run = hetmem_with_stdin_on(backend, &args, y4m(header, &frames));
    assert!(run.status.success(), "{backend} {strategy} {rules:?}: {}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &kernel, &frames);
    let summary = json_of(&report, &run);
    let retried = retried_indices(&summary);
    if let Some(first) = first_retried {
        assert_eq!(retried.first().copied(), Some(first), "{}", stderr(&run));
    }
    assert!(retries_used.contains(&retried.len()), "{} retries: {}", retried.len(), stderr(&run));
    assert_eq!(summary["frames"], 7, "every frame written once");
}

#[test]
fn a_failed_frame_is_retried_and_the_output_is_as_without_the_fault() {
    // Frame 2's blur fails: it and the frames after it go through a new ring.
    retried_run_equals_the_cpu_path("cpu", "cpu", &["launch:3:sticky"], "1", Some(2), 1..=1);
    // The first frame.
    retried_run_equals_the_cpu_path("cpu", "cpu", &["launch:1:transient"], "1", Some(0), 1..=1);
    // Frame 1 fails, and later launches fail too (the first ring makes at most five before it is
    // given up, so call 6 falls to a later ring): two retries or more, the output still right.
    let again: Vec<String> = (6..=8).map(|call| format!("launch:{call}:sticky")).collect();
    let rules: Vec<&str> =
        ["launch:2:transient"].into_iter().chain(again.iter().map(String::as_str)).collect();
    retried_run_equals_the_cpu_path("cpu", "cpu", &rules, "8", Some(1), 2..=4);
}

#[test]
fn without_retries_the_run_ends_at_the_failed_frame_after_writing_the_ones_before() {
    let (header, format, frames) = video(7);
    let kernel = default_kernel();
    let args = ["filter", "-", "-", "--strategy", "cpu", "--inject-fault", "launch:4:sticky"];
    let run = hetmem_with_stdin(&args, y4m(header, &frames));
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let message = stderr(&run);
    assert!(
        message.contains("frame 3 (counting from 0) failed") && message.contains("injected fault"),
        "{message}"
    );
    // Frames 0 to 2, and nothing of frame 3 or later.
    assert_y4m_result(&run.stdout, header, format, &kernel, &frames[..3]);
    // Retries run out: every launch fails, one retry is not enough.
    let mut args: Vec<String> =
        ["filter", "-", "-", "--strategy", "cpu", "--retries", "1"].map(String::from).to_vec();
    for call in 1..=20 {
        args.extend(["--inject-fault".to_string(), format!("launch:{call}:sticky")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = hetmem_with_stdin(&args, y4m(header, &frames));
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert!(stderr(&run).contains("failed: injected fault"), "{}", stderr(&run));
    assert_eq!(run.stdout, header.as_bytes(), "no frame came out, the header did");
}

#[test]
fn an_image_is_retried_too() {
    let dir = TempDir::new("retry-image");
    let (width, height) = (53, 41);
    let pixels = random_bytes(width * height * 3);
    let png = dir.path("in.png");
    image::RgbImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&png).unwrap();
    let out = dir.path("out.png");
    let run =
        hetmem(&["filter", text(&png), text(&out), "--strategy", "cpu", "--inject-fault", "launch:1:sticky"]);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert!(!out.exists(), "a failed image writes nothing");
    let run = hetmem(&[
        "filter",
        text(&png),
        text(&out),
        "--strategy",
        "cpu",
        "--retries",
        "1",
        "--inject-fault",
        "launch:1:sticky",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("frame 0 (counting from 0) failed"), "{}", stderr(&run));
    let rgb = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
    assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &default_kernel(), &pixels));
}

/// On the GPU: injected transient and sticky failures at every point of the copy path, each
/// retried on the GPU; and a kernel that really faults, after which the driver cannot rebuild
/// the context, so the run finishes on the CPU, with the same bytes.
#[test]
fn on_the_gpu_failures_are_retried_and_a_lost_context_goes_on_on_the_cpu() {
    if hetmem::testing::cuda_device_or_skip(
        "on_the_gpu_failures_are_retried_and_a_lost_context_goes_on_on_the_cpu",
    )
    .is_none()
    {
        return;
    }
    // The copy strategy: building the ring uploads each slot's table (three copies); then each
    // frame makes one launch, an upload when it is queued and a download when the writer takes
    // it. A sticky fault is taken for a lost context, so its retry runs on the CPU; a transient
    // one stays on the GPU. Launches are made in frame order, so the third fails frame 2;
    // copies and fence waits come from the reader and the writer both, so which frame the
    // eighth or ninth belongs to depends on how far the reader is ahead.
    for (rule, frame) in
        [("launch:3:transient", Some(2)), ("copy:8:sticky", None), ("fence-wait:9:transient", None)]
    {
        retried_run_equals_the_cpu_path("cuda", "copy", &[rule], "2", frame, 1..=1);
    }
    let (header, format, frames) = video(7);
    let dir = TempDir::new("trap");
    let report = dir.path("report.json");
    let args = [
        "filter",
        "-",
        "-",
        "--strategy",
        "zero-copy",
        "--retries",
        "1",
        "--report",
        text(&report),
        "--inject-fault",
        "launch:3:trap",
    ];
    let run = hetmem_with_stdin_on("cuda", &args, y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    let summary = json_of(&report, &run);
    let retried = &summary["retried"][0];
    assert_eq!((retried["index"].as_u64(), retried["backend"].as_str()), (Some(2), Some("cpu")), "{summary}");
    assert_eq!(retried["lost_context"], true);
    assert!(retried["error"].as_str().unwrap().contains("CUDA_ERROR_"), "{summary}");
}
