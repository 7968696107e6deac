//! The `hetmem` binary as a user runs it.
//!
//! On the GPU machine the binary lives beside the test executable in the bundle, not where
//! cargo built it: `HETMEM_BIN` points there.

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
    let checks = report["checks"].as_array().unwrap();
    assert!(!checks.is_empty());
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

#[test]
fn an_unknown_backend_is_an_error_not_a_panic() {
    for (args, env) in [
        (vec!["doctor"], vec![("HETMEM_BACKEND", "vulkan")]),
        (vec!["--backend", "vulkan", "doctor"], vec![]),
    ] {
        let output = hetmem(&args, &env);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{message}");
        assert!(
            message.contains("unknown backend \"vulkan\": expected one of `auto`, `cpu`, `cuda`"),
            "{message}"
        );
        assert!(!message.contains("panicked"), "{message}");
    }
}

#[test]
fn forcing_the_cpu_is_not_reported_as_a_fallback() {
    let report = doctor_json(&[("HETMEM_BACKEND", "cpu")]);
    assert_eq!(report["backend"]["selected"], "cpu");
    assert!(report["backend"]["fallback_reason"].is_null());
}
