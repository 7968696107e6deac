//! The `hetmem` binary as a user runs it.
//!
//! On the GPU machine the binary lives beside the test executable in the bundle, not where
//! cargo built it: `HETMEM_BIN` points there.
//!
//! The habits every command shares (choices, completions and the man page, `-q`/`-v`,
//! progress, `-y`, JSON schemas, CSV) have their own module.

mod habits;
mod load;

use std::process::{Command, Output};

use serde_json::Value;

fn hetmem(args: &[&str], env: &[(&str, &str)]) -> Output {
    let binary = std::env::var("HETMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hetmem").to_string());
    let mut command = Command::new(binary);
    command.args(args).env_remove("HETMEM_BACKEND");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run hetmem")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn doctor_json(env: &[(&str, &str)]) -> Value {
    let output = hetmem(&["doctor", "--json"], env);
    assert!(output.status.success(), "doctor failed: {}", stderr(&output));
    serde_json::from_slice(&output.stdout).expect("doctor --json prints valid JSON")
}

const ATTRIBUTES: [&str; 10] = [
    "can_map_host_memory",
    "unified_addressing",
    "pageable_memory_access",
    "pageable_memory_access_uses_host_page_tables",
    "concurrent_managed_access",
    "host_register_supported",
    "read_only_host_register_supported",
    "host_native_atomic_supported",
    "async_engine_count",
    "integrated",
];

#[test]
fn doctor_json_has_the_stable_fields() {
    let report = doctor_json(&[]);
    assert_eq!(report["hetmem_version"], env!("CARGO_PKG_VERSION"));
    assert!(["cpu", "cuda"].contains(&report["backend"]["selected"].as_str().unwrap()));
    assert!(report["driver"]["library_found"].is_boolean());
    let host = &report["host"];
    for field in [
        "memlock_limit_bytes",
        "memlock_unlimited",
        "transparent_hugepages",
        "hugetlb_free_pages",
        "page_size_bytes",
        "numa_nodes",
        "nvrtc",
    ] {
        assert!(host.get(field).is_some(), "host.{field} missing");
    }
    assert!(host["page_size_bytes"].as_u64().unwrap() >= 4096);
    for device in report["devices"].as_array().unwrap() {
        for field in ["name", "compute_capability", "total_memory_bytes", "pci_bus_id", "pcie"] {
            assert!(device.get(field).is_some(), "device.{field} missing");
        }
        for attribute in ATTRIBUTES {
            assert!(device["attributes"].get(attribute).is_some(), "attribute {attribute} missing");
        }
    }
    let gpus = report["devices"].as_array().unwrap().len();
    let pairs = report["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), gpus * gpus.saturating_sub(1) / 2, "one entry per pair of GPUs");
    for pair in pairs {
        for field in ["a", "b", "topology", "peer_access_a_to_b", "peer_access_b_to_a"] {
            assert!(pair.get(field).is_some(), "pair.{field} missing");
        }
    }
    let checks = report["checks"].as_array().unwrap();
    assert!(!checks.is_empty());
    let pair_lines =
        checks.iter().filter(|check| ["gpu_pairs", "peer_access"].contains(&check["name"].as_str().unwrap()));
    assert_eq!(
        pair_lines.count(),
        if gpus == 1 { 1 } else { pairs.len() },
        "a line for one GPU, else per pair"
    );
    for check in checks {
        let status = check["status"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&status), "status {status}");
        if status != "ok" {
            assert!(check["remedy"].as_str().is_some_and(|r| !r.is_empty()), "no remedy: {check}");
        }
    }
}

#[test]
fn strict_fails_exactly_when_a_check_fails() {
    let report = doctor_json(&[]);
    let any_fail = report["checks"].as_array().unwrap().iter().any(|check| check["status"] == "fail");
    assert!(hetmem(&["doctor"], &[]).status.success(), "without --strict doctor exits 0");
    let strict = hetmem(&["doctor", "--strict"], &[]);
    assert_eq!(strict.status.success(), !any_fail);
}

#[test]
fn a_gpu_machine_reports_its_devices() {
    if hetmem::testing::cuda_device_or_skip("a_gpu_machine_reports_its_devices").is_none() {
        return;
    }
    let report = doctor_json(&[]);
    assert_eq!(report["backend"]["selected"], "cuda");
    assert!(!report["devices"].as_array().unwrap().is_empty());
    let text = String::from_utf8(hetmem(&["doctor"], &[]).stdout).unwrap();
    if report["devices"].as_array().unwrap().len() == 1 {
        assert!(text.contains("pairs:   none (one GPU)"), "{text}");
    } else {
        assert!(text.contains("pair 0-1: topology "), "{text}");
    }
}

/// HETMEM_SEGMENTS is read by the CLI, not the library: a bad value fails where the
/// pinned-async filter is set up, with the message the library gave when it read the variable;
/// a good one is reported as not applied while the frame filter takes no segment count.
#[test]
fn hetmem_segments_is_checked_where_the_pinned_async_filter_is_built() {
    const TEST: &str = "hetmem_segments_is_checked_where_the_pinned_async_filter_is_built";
    if hetmem::testing::cuda_device_or_skip(TEST).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("demo.png");
    let args = [
        "demo",
        "--strategies",
        "pinned-async",
        "--frames",
        "2",
        "--width",
        "64",
        "--height",
        "48",
        "--json",
        "--png",
        png.to_str().unwrap(),
    ];
    let bad = hetmem(&args, &[("HETMEM_SEGMENTS", "0")]);
    let message = stderr(&bad);
    assert_eq!(bad.status.code(), Some(1), "{message}");
    assert!(
        message.contains(
            "setting up the pinned-async strategy: invalid HETMEM_SEGMENTS: `0`: give a whole number \
             from 1 to 64, or unset it"
        ),
        "{message}"
    );
    let good = hetmem(&args, &[("HETMEM_SEGMENTS", "4")]);
    assert!(good.status.success(), "{}", stderr(&good));
    assert!(!stderr(&good).contains("not applied"), "{}", stderr(&good));
}

#[test]
fn forcing_cuda_fails_clearly_where_it_cannot_run() {
    let gpu_present = !doctor_json(&[])["devices"].as_array().unwrap().is_empty();
    let output = hetmem(&["doctor", "--json"], &[("HETMEM_BACKEND", "cuda")]);
    if gpu_present {
        assert!(output.status.success(), "{}", stderr(&output));
    } else {
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{message}");
        assert!(message.contains("the cuda backend was requested but cannot run here"), "{message}");
        assert!(message.contains("remedy:"), "{message}");
        assert!(output.stdout.is_empty(), "no report on stdout after the error");
    }
}

/// A backend that is not one, from the flag or from HETMEM_BACKEND, is a usage error (exit 2)
/// listing the backends.
#[test]
fn an_unknown_backend_is_an_error_not_a_panic() {
    for (args, env) in [
        (vec!["doctor"], vec![("HETMEM_BACKEND", "vulkan")]),
        (vec!["--backend", "vulkan", "doctor"], vec![]),
    ] {
        let output = hetmem(&args, &env);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{message}");
        assert!(message.contains("invalid value 'vulkan' for '--backend <BACKEND>'"), "{message}");
        assert!(message.contains("[possible values: auto, cpu, cuda]"), "{message}");
        assert!(!message.contains("panicked"), "{message}");
    }
}

#[test]
fn forcing_the_cpu_is_not_reported_as_a_fallback() {
    let report = doctor_json(&[("HETMEM_BACKEND", "cpu")]);
    assert_eq!(report["backend"]["selected"], "cpu");
    assert!(report["backend"]["fallback_reason"].is_null());
}

fn bench_on_cpu(args: &[&str]) -> Output {
    let mut all = vec!["--backend", "cpu", "bench"];
    all.extend_from_slice(args);
    hetmem(&all, &[])
}

fn positive(value: &Value) -> bool {
    value.as_f64().is_some_and(|v| v.is_finite() && v > 0.0)
}

#[test]
fn bench_link_on_the_cpu_measures_host_cells_and_says_gpu_cells_were_not_measured() {
    let output = bench_on_cpu(&["link", "--quick", "--sizes", "4KiB,64KiB", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).expect("valid JSON");
    assert_eq!(report["gpu_measured"], false);
    assert!(report["gpu_not_measured_because"].as_str().unwrap().contains("GPU cells were not measured"));
    assert_eq!(report["cold_cpu_cache"], true, "cells start from cold caches by default");
    assert!(report["ceiling"].is_null() && report["completion"].is_null());
    let cells = report["bandwidth"].as_array().unwrap();
    let sizes: Vec<u64> = cells.iter().map(|cell| cell["bytes"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4096, 65536]);
    for cell in cells {
        assert_eq!(cell["path"], "host_memcpy");
        assert_eq!(cell["direction"], "host");
        assert!(positive(&cell["gb_s"]["median"]) && positive(&cell["gb_s"]["min"]), "{cell}");
        assert!(cell["ratio_to_ceiling"].is_null());
    }
    let latency = report["latency"].as_array().unwrap();
    let latency_sizes: Vec<u64> = latency.iter().map(|cell| cell["bytes"].as_u64().unwrap()).collect();
    assert_eq!(latency_sizes, [4, 65536]);
    assert!(latency.iter().all(|cell| cell["path"] == "host_memcpy" && positive(&cell["us"]["median"])));

    let warm = bench_on_cpu(&["link", "--quick", "--sizes", "4KiB", "--warm-cpu-cache", "--json"]);
    assert!(warm.status.success(), "{}", stderr(&warm));
    let warm: Value = serde_json::from_slice(&warm.stdout).expect("valid JSON");
    assert_eq!(warm["cold_cpu_cache"], false, "--warm-cpu-cache is recorded in the report");

    let text = bench_on_cpu(&["link", "--quick", "--sizes", "4KiB"]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("GPU cells were not measured"), "{text}");
    assert!(text.contains("host_memcpy"), "{text}");
}

#[test]
fn bench_link_rejects_bad_input_listing_what_is_valid() {
    let unknown = bench_on_cpu(&["link", "--quick", "--paths", "zero_copy_read,warp_drive"]);
    assert!(!unknown.status.success());
    let message = stderr(&unknown);
    assert!(message.contains("warp_drive") && message.contains("managed_prefetch_read"), "{message}");
    for (sizes, expected) in [
        ("2GiB", "4 KiB to 1 GiB"),
        ("1000", "multiples of 4 KiB"),
        ("12parsecs", "KiB"),
        ("", "--sizes is empty: give a comma-separated list such as 4KiB,1MiB"),
        ("4KiB,,1MiB", "--sizes 4KiB,,1MiB has an empty item"),
    ] {
        let output = bench_on_cpu(&["link", "--quick", "--sizes", sizes]);
        assert!(!output.status.success(), "{sizes} accepted");
        assert!(stderr(&output).contains(expected), "{sizes}: {}", stderr(&output));
    }
    let latency = bench_on_cpu(&["link", "--quick", "--sizes", "4KiB", "--latency-sizes", "1MiB"]);
    assert!(!latency.status.success());
    assert!(stderr(&latency).contains("4 B to 64 KiB"), "{}", stderr(&latency));
    let empty = bench_on_cpu(&["pipeline", "--strategies", ""]);
    assert_eq!(empty.status.code(), Some(2), "{}", stderr(&empty));
    assert!(stderr(&empty).contains("--strategies <STRATEGIES>"), "{}", stderr(&empty));
    assert!(stderr(&empty).contains("hybrid"), "the strategies are listed: {}", stderr(&empty));
    let both = bench_on_cpu(&["link", "--quick", "--json", "--markdown"]);
    assert!(!both.status.success(), "--json and --markdown together are refused");
}

#[test]
fn bench_link_writes_markdown_json_and_svg_plots() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("saved");
    let plots = dir.path().join("plots");
    let output = bench_on_cpu(&[
        "link",
        "--quick",
        "--sizes",
        "4KiB,16KiB,64KiB",
        "--markdown",
        "--save",
        saved.to_str().unwrap(),
        "--svg",
        plots.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let markdown = String::from_utf8_lossy(&output.stdout);
    assert!(markdown.contains("### link bandwidth on "), "{markdown}");
    assert!(markdown.contains("| path | 4 KiB | 16 KiB | 64 KiB |\n|---|---:|---:|---:|"), "{markdown}");
    assert!(markdown.contains("| host_memcpy | "), "{markdown}");
    assert!(markdown.contains("- GPU cells were not measured"), "{markdown}");

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("link.json")).unwrap()).unwrap();
    assert_eq!(json["bandwidth"].as_array().unwrap().len(), 3);
    let md = std::fs::read_to_string(saved.join("link.md")).unwrap();
    assert!(md.starts_with("## hetmem bench link\n") && md.contains("| host_memcpy | "), "{md}");

    for (file, series) in [
        ("bandwidth_vs_size.svg", "host_memcpy"),
        ("latency_vs_size.svg", "host_memcpy"),
        ("latency_spread.svg", "host_memcpy"),
    ] {
        let svg = std::fs::read_to_string(plots.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{file}");
        assert!(svg.contains(series), "{file} has no {series} series");
        assert!(
            svg.contains("<polyline") || svg.contains("<path") || svg.contains("<line"),
            "{file}: nothing drawn"
        );
    }
}

/// `bench dataset` run small on the CPU backend: both methods over every frame, a sample of
/// each checked against the CPU's blur, in pinned memory and in a file (removed at the end);
/// the table says what each method allocated.
#[test]
fn bench_dataset_runs_small_on_the_cpu_in_memory_and_in_a_file() {
    let output = bench_on_cpu(&["dataset", "--frames", "5", "--width", "48", "--height", "20", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["schema"], "hetmem.bench.dataset/1");
    assert_eq!((report["frames"].as_u64(), report["frame_bytes"].as_u64()), (Some(5), Some(48 * 20 * 3)));
    assert_eq!(report["backing"], "host");
    let runs = report["runs"].as_array().unwrap();
    let methods: Vec<&str> = runs.iter().map(|run| run["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["mapped", "copy-each"]);
    for run in runs {
        assert!(positive(&run["frames_s"]) && positive(&run["gb_s"]), "{run}");
        assert_eq!(run["verified_frames"], serde_json::json!([0, 2, 4]), "{run}");
    }
    assert_eq!(runs[0]["device_bytes"], 0);
    assert_eq!(runs[1]["device_bytes"], 2 * 48 * 20 * 3);

    let dir = tempfile::tempdir().unwrap();
    let dir_text = dir.path().to_str().unwrap();
    let output = bench_on_cpu(&[
        "dataset",
        "--frames",
        "3",
        "--resolution",
        "1080p",
        "--backing",
        "file",
        "--dir",
        dir_text,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("3 frames of 1920x1080 RGB") && table.contains("in a registered file"), "{table}");
    assert!(table.contains("copy-each") && table.contains("11.9 MiB"), "{table}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the data set's file is removed");

    let refused = bench_on_cpu(&["dataset", "--backing", "file", "--dir", "/no/such/dir"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("/no/such/dir"), "{}", stderr(&refused));
}

/// A data set larger than the device budget: copy-each within it, the sparse pass's copy-all
/// through it a piece at a time, both sparse passes checked against the CPU, and both tables
/// saved; a budget below copy-each's two frames is refused by name.
#[test]
fn bench_dataset_under_a_device_budget_runs_the_sparse_pass_and_saves_both_tables() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("saved");
    let output = bench_on_cpu(&[
        "dataset",
        "--frames",
        "8",
        "--width",
        "640",
        "--height",
        "360",
        "--device-budget",
        "2MiB",
        "--save",
        saved.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("dataset.json")).unwrap()).unwrap();
    let (set, budget) =
        (report["dataset_bytes"].as_u64().unwrap(), report["device_budget_bytes"].as_u64().unwrap());
    assert!(budget == 2 << 20 && set > budget, "{report}");
    let sparse = report["sparse"].as_array().unwrap();
    let methods: Vec<&str> = sparse.iter().map(|run| run["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["mapped", "copy-all"]);
    for run in sparse {
        assert_eq!(run["verified"], true, "{run}");
        assert!(run["device_bytes"].as_u64().unwrap() <= budget, "{run}");
        let share = run["share_touched"].as_f64().unwrap();
        assert!((0.04..0.07).contains(&share), "{run}");
    }
    assert_eq!(sparse[1]["copied_bytes"].as_u64(), Some(set));
    let table = std::fs::read_to_string(saved.join("dataset_sparse.csv")).unwrap();
    assert!(table.contains("sparse mapped") && table.contains("sparse copy-all"), "{table}");

    let refused = bench_on_cpu(&["dataset", "--width", "640", "--height", "360", "--device-budget", "1MiB"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("copy-each holds two frames"), "{}", stderr(&refused));
}

/// User-facing help speaks of what a command does, not of the plan it came from.
#[test]
fn bench_help_says_what_compare_measures() {
    let help = hetmem(&["bench", "--help"], &[]);
    assert!(help.status.success(), "{}", stderr(&help));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("Copy vs zero-copy vs a file mapping"), "{text}");
    assert!(!text.to_lowercase().contains("seed"), "{text}");
}

#[test]
fn bench_compare_and_pipeline_run_on_the_cpu() {
    let output = bench_on_cpu(&["compare", "--quick", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let methods: Vec<&str> = rows.iter().map(|row| row["method"].as_str().unwrap()).collect();
    assert_eq!(methods, ["memcpy_pinned", "memcpy_pageable", "zero_copy", "mmap", "host_memcpy"]);
    for row in rows {
        let host = row["method"] == "host_memcpy";
        assert_eq!(positive(&row["latency_us"]), host, "{row}");
        assert_eq!(positive(&row["bandwidth_gb_s"]), host, "{row}");
    }
    assert!(report["gpu_not_measured_because"].as_str().unwrap().contains("not measured"));

    let output = bench_on_cpu(&["pipeline", "--frames", "1", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["schema"], "hetmem.bench.pipeline/2");
    let reports = &document["reports"];
    let sizes: Vec<(u64, u64)> = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|report| (report["width"].as_u64().unwrap(), report["height"].as_u64().unwrap()))
        .collect();
    assert_eq!(sizes, [(1920, 1080), (3840, 2160)]);
    for report in reports.as_array().unwrap() {
        let row = &report["rows"][0];
        assert_eq!(row["strategy"], "cpu");
        assert_eq!(row["verified_bit_exact"], true);
        assert!(positive(&row["frames_per_s"]));
        // NVML's traffic is named for what it is, and unsampled on the CPU.
        let fields = row.as_object().unwrap();
        assert!(fields["nvml_pcie_traffic"].is_null() && !fields.contains_key("pcie"), "{row}");
        assert!(report["skipped"][0].as_str().unwrap().contains("GPU cells were not measured"));
    }
}

#[test]
fn pipelined_bench_streams_checked_frames_through_a_ring_on_the_cpu() {
    let output = bench_on_cpu(&["pipeline", "--pipelined", "--slots", "2", "--frames", "8", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["schema"], "hetmem.bench.pipelined/2");
    let runs = document["runs"].as_array().unwrap();
    let seen: Vec<(u64, u64, u64)> = runs
        .iter()
        .map(|run| {
            (run["width"].as_u64().unwrap(), run["frames"].as_u64().unwrap(), run["slots"].as_u64().unwrap())
        })
        .collect();
    // 4K runs a quarter as many frames, but at least two rounds of slots.
    assert_eq!(seen, [(1920, 8, 2), (3840, 4, 2)]);
    for run in runs {
        assert_eq!(run["strategy"], "cpu");
        assert!(positive(&run["frames_per_s"]) && positive(&run["wall_s"]), "{run}");
        let share = run["devices"][0].as_object().unwrap();
        assert!(share["nvml_pcie_traffic_mb_s"].is_null() && !share.contains_key("nvml_pcie_mb_s"), "{run}");
    }
    let refused = bench_on_cpu(&["pipeline", "--slots", "2"]);
    assert!(!refused.status.success() && stderr(&refused).contains("--pipelined"), "{}", stderr(&refused));
}

#[test]
fn pipelined_bench_takes_a_device_selection() {
    let output = bench_on_cpu(&[
        "pipeline",
        "--pipelined",
        "--devices",
        "all",
        "--slots",
        "2",
        "--frames",
        "4",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    for run in document["runs"].as_array().unwrap() {
        let devices = run["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1, "{run}");
        assert_eq!((devices[0]["ordinal"].is_null(), &devices[0]["frames"]), (true, &run["frames"]));
    }
    let gpu_numbers = bench_on_cpu(&["pipeline", "--pipelined", "--devices", "0,1", "--frames", "4"]);
    assert!(!gpu_numbers.status.success());
    assert!(
        stderr(&gpu_numbers).contains("GPU 0,1 asked for, but the GPUs present are: none"),
        "{}",
        stderr(&gpu_numbers)
    );
    let twice = bench_on_cpu(&["pipeline", "--pipelined", "--devices", "1,1"]);
    assert!(!twice.status.success() && stderr(&twice).contains("GPU 1 is named twice"), "{}", stderr(&twice));
    let alone = bench_on_cpu(&["pipeline", "--devices", "all"]);
    assert!(!alone.status.success() && stderr(&alone).contains("--pipelined"), "{}", stderr(&alone));
}

#[test]
fn gpu_only_benches_say_gpu_cells_were_not_measured_on_the_cpu() {
    let output = bench_on_cpu(&["completion", "--samples", "1"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("GPU cells were not measured"), "{}", stderr(&output));
}

/// The stacked run larger than the device budget, on the CPU backend: three quick
/// studies (1.97 MB of template, 3.9 MB of volume) under a 4 MiB budget.
#[test]
fn bench_ct_stacked_beyond_the_budget_refuses_all_copy_and_runs_the_mapped_placements() {
    let args =
        ["ct", "--quick", "--studies", "3", "--device-budget", "4MiB", "--windows", "1", "--repeats", "1"];
    let output = bench_on_cpu(&[&args[..], &["--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let row = |placing: &str| rows.iter().find(|row| row["placing"] == placing).unwrap();
    let why = row("all_copy")["not_run_because"].as_str().unwrap();
    assert!(why.contains("does not fit") && why.contains("4194304 byte budget"), "{why}");
    for placing in ["all_mapped", "hybrid", "placed", "cpu"] {
        assert!(positive(&row(placing)["seconds_per_study"]["median"]), "{}", row(placing));
    }
    let table = bench_on_cpu(&args);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.contains("not run: does not fit"), "{text}");
}

#[test]
fn bench_ct_runs_on_the_cpu_writes_its_picture_and_volume_and_reads_the_volume_back() {
    let dir = tempfile::tempdir().unwrap();
    let (png, volume) = (dir.path().join("mip.png"), dir.path().join("volume"));
    let output = bench_on_cpu(&[
        "ct",
        "--quick",
        "--windows",
        "1",
        "--repeats",
        "1",
        "--json",
        "--mip",
        png.to_str().unwrap(),
        "--write-volume",
        volume.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["schema"], "hetmem.bench.ct/1");
    let rows = report["rows"].as_array().unwrap();
    let cpu = rows.iter().find(|row| row["placing"] == "cpu").unwrap();
    assert!(positive(&cpu["seconds_per_study"]["median"]), "{cpu}");
    for row in rows.iter().filter(|row| row["placing"] != "cpu") {
        assert!(positive(&row["seconds_per_study"]["median"]), "{row}");
        assert!(row["checked"].as_str().unwrap().contains("CPU backend"), "{row}");
    }
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
    let meta: Value = serde_json::from_slice(&std::fs::read(volume.join("volume.json")).unwrap()).unwrap();
    let shape = format!("{}x{}x{}", meta["depth"], meta["height"], meta["width"]);

    let again = bench_on_cpu(&[
        "ct",
        "--windows",
        "1",
        "--repeats",
        "1",
        "--json",
        "--volume",
        volume.join("hu.i16").to_str().unwrap(),
        "--labels",
        volume.join("labels.u8").to_str().unwrap(),
        "--shape",
        &shape,
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    let reread: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(reread["organs"], report["organs"]);
    assert!(reread["volume_kind"].as_str().unwrap().contains("hu.i16"));

    let lone = bench_on_cpu(&["ct", "--volume", volume.join("hu.i16").to_str().unwrap()]);
    assert_eq!(lone.status.code(), Some(2), "{}", stderr(&lone));
    let no_shape = bench_on_cpu(&[
        "ct",
        "--volume",
        volume.join("hu.i16").to_str().unwrap(),
        "--labels",
        volume.join("labels.u8").to_str().unwrap(),
    ]);
    assert!(!no_shape.status.success() && stderr(&no_shape).contains("--shape"), "{}", stderr(&no_shape));
}
