//! `hetmem load` and `hetmem bench file` on the CPU backend: files of fresh random
//! bytes land whole (checked by reading back), safetensors files tensor by tensor, the checksum
//! stage agrees with a checksum computed here, and bad input is refused with its cause.

use std::path::{Path, PathBuf};

use super::*;

/// `hetmem` on the CPU backend, in `dir`.
fn load_in(dir: &Path, args: &[&str]) -> Output {
    let binary = std::env::var("HETMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hetmem").to_string());
    Command::new(binary)
        .args(args)
        .current_dir(dir)
        .env("HETMEM_BACKEND", "cpu")
        .output()
        .expect("run hetmem")
}

fn json_of(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// `len` fresh random bytes, none zero, in `dir/name`.
fn random_file(dir: &Path, name: &str, len: usize) -> Vec<u8> {
    let seed = hetmem_bench::random::fresh_seed();
    eprintln!("{name}: seed {seed:#x}");
    let mut rng = hetmem_bench::random::SplitMix64::new(seed);
    let bytes: Vec<u8> = (0..len).map(|_| ((rng.next_u64() >> 56) as u8).max(1)).collect();
    std::fs::write(dir.join(name), &bytes).unwrap();
    bytes
}

/// The checksum `--stage checksum` computes, computed here: the sum of the file's 32-bit
/// little-endian words and of each word times its position plus one (the last zero-padded).
fn checksum(bytes: &[u8]) -> (u64, u64) {
    bytes.chunks(4).enumerate().fold((0u64, 0u64), |(sum, weighted), (index, chunk)| {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        let word = u64::from(u32::from_le_bytes(word));
        (sum.wrapping_add(word), weighted.wrapping_add(word.wrapping_mul(index as u64 + 1)))
    })
}

/// A safetensors file of two tensors, written by hand (the format: an 8-byte header length,
/// the JSON header padded with spaces to 8 bytes, the data).
fn safetensors_file(dir: &Path, name: &str) -> (PathBuf, Vec<u8>) {
    let data = random_file(dir, "data.tmp", 2 * 3 * 4 + 5 * 2);
    let mut header =
        br#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]}}"#
            .to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let path = dir.join(name);
    std::fs::write(&path, [&(header.len() as u64).to_le_bytes()[..], &header, &data].concat()).unwrap();
    (path, data)
}

#[test]
fn load_lands_files_by_every_method_and_verifies_them() {
    let dir = tempfile::tempdir().unwrap();
    random_file(dir.path(), "a.bin", (3 << 20) + 4099);
    random_file(dir.path(), "b.bin", 7);
    for method in ["auto", "staged", "staged-direct", "windows"] {
        let output = load_in(
            dir.path(),
            &[
                "load",
                "a.bin",
                "b.bin",
                "--method",
                method,
                "--chunk",
                "1MiB",
                "--threads",
                "3",
                "--verify",
                "--json",
            ],
        );
        let report = json_of(&output);
        assert_eq!(report["schema"], "hetmem.load/1");
        assert_eq!(report["bytes"], (3 << 20) + 4099 + 7, "{method}");
        assert_eq!(report["verified"], true, "{method}");
        assert!(report["gb_per_s"].as_f64().unwrap() > 0.0, "{method}");
        assert_ne!(report["method"], "auto");
        if method != "auto" {
            assert_eq!(report["method"], method);
        }
        assert_eq!(report["link_gb_per_s"], Value::Null, "no link on the CPU backend");
    }
    let text =
        String::from_utf8(load_in(dir.path(), &["load", "a.bin", "--storage-rate", "1.5"]).stdout).unwrap();
    assert!(text.contains("GB/s") && text.contains("1.50 GB/s (given)") && text.contains("method"), "{text}");
}

#[test]
fn safetensors_land_tensor_by_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = safetensors_file(dir.path(), "model.safetensors");
    let report = json_of(&load_in(dir.path(), &["load", path.to_str().unwrap(), "--verify", "--json"]));
    assert_eq!(report["bytes"], data.len());
    assert_eq!(report["tensors"]["w"]["dtype"], "F32");
    assert_eq!(report["tensors"]["w"]["shape"], serde_json::json!([2, 3]));
    assert_eq!(report["tensors"]["b"]["offset"], 24);
    assert_eq!(report["tensors"]["b"]["bytes"], 10);
    let text =
        String::from_utf8(load_in(dir.path(), &["load", "model.safetensors", "--tensors"]).stdout).unwrap();
    assert!(text.contains("2 tensors") && text.contains("w  F32 [2, 3] at byte 0"), "{text}");
    let raw = json_of(&load_in(dir.path(), &["load", "model.safetensors", "--raw", "--json"]));
    assert_eq!(raw["bytes"], std::fs::metadata(&path).unwrap().len(), "--raw loads the whole file");
}

#[test]
fn the_checksum_stage_agrees_with_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = random_file(dir.path(), "a.bin", (2 << 20) + 3);
    let b = random_file(dir.path(), "b.bin", 4096);
    for method in ["staged", "staged-direct", "windows"] {
        let report = json_of(&load_in(
            dir.path(),
            &[
                "load", "a.bin", "b.bin", "--stage", "checksum", "--method", method, "--chunk", "512KiB",
                "--json",
            ],
        ));
        for (index, bytes) in [&a, &b].into_iter().enumerate() {
            let (sum, weighted) = checksum(bytes);
            assert_eq!(report["checksums"][index]["stage"]["sum"], sum, "{method}");
            assert_eq!(report["checksums"][index]["stage"]["weighted"], weighted, "{method}");
        }
    }
}

/// A file truncated part-way through a load ends it with exit 1 and a message naming the file
/// and what happened, by windows (copied or checksummed in place) and by staged reads; by
/// windows it was a SIGBUS. The binary's test hook truncates the file once the first piece is
/// done: with one reader thread and one piece in flight, the next piece is read or mapped only
/// after that, so the load always meets the truncation in its middle.
#[cfg(feature = "testing")]
#[test]
fn a_file_truncated_mid_load_exits_1_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (method, stage, what) in [
        ("windows", "copy", "the file is 1500000 bytes now"),
        ("windows", "checksum", "the file is 1500000 bytes now"),
        ("staged", "copy", "was it truncated while being read?"),
    ] {
        random_file(dir.path(), "shrinks.bin", 4 << 20);
        let output = load_in(
            dir.path(),
            &[
                "load",
                "shrinks.bin",
                "--method",
                method,
                "--stage",
                stage,
                "--threads",
                "1",
                "--depth",
                "1",
                "--chunk",
                "1MiB",
                "--truncate-after",
                "1048576:1500000",
            ],
        );
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{method} {stage}: {:?}\n{error}", output.status);
        assert!(error.contains("shrinks.bin") && error.contains(what), "{method} {stage}: {error}");
        assert!(error.contains(&format!("by method {method}")), "{method} {stage}: {error}");
    }
}

#[test]
fn bad_loads_are_refused_with_cause_and_remedy() {
    let dir = tempfile::tempdir().unwrap();
    random_file(dir.path(), "a.bin", 10_000);
    let (path, _) = safetensors_file(dir.path(), "good.safetensors");
    let good = std::fs::read(&path).unwrap();
    std::fs::write(dir.path().join("cut.safetensors"), &good[..good.len() - 4]).unwrap();
    std::fs::write(dir.path().join("short.safetensors"), &good[..6]).unwrap();
    std::fs::write(dir.path().join("empty.bin"), b"").unwrap();
    for (args, expected) in [
        (vec!["load", "missing.bin"], "missing.bin"),
        (vec!["load", "cut.safetensors"], "not a valid safetensors file"),
        (vec!["load", "short.safetensors"], "shorter than the 8-byte header"),
        (vec!["load", "a.bin", "--max-device-memory", "4KiB"], "do not fit in device memory"),
        (vec!["load", "a.bin", "--chunk", "5000"], "multiple of 4096"),
        (vec!["load", "empty.bin"], "nothing to load"),
        (vec!["load", "a.bin", "good.safetensors"], "--raw"),
    ] {
        let output = load_in(dir.path(), &args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {message}");
        assert!(message.contains(expected), "{args:?}: {message}");
        assert!(!message.contains("panicked"), "{args:?}: {message}");
    }
    let output = load_in(dir.path(), &["load", "a.bin", "--method", "teleport"]);
    assert_eq!(output.status.code(), Some(2), "a usage error");
    assert!(stderr(&output).contains("staged-direct"), "{}", stderr(&output));
}

#[test]
fn bench_file_measures_every_method_cold_and_warm_and_keeps_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let files_arg = files.to_str().unwrap();
    let args = ["bench", "file", "--dir", files_arg, "--sizes", "1MiB,2MiB", "--chunk", "256KiB", "--json"];
    let report = json_of(&load_in(dir.path(), &args));
    assert_eq!(report["schema"], "hetmem.bench.file/1");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 4 * 2, "2 sizes x 4 methods x cold and warm");
    assert!(rows.iter().all(|row| row["chunk_bytes"] == 256 << 10), "{rows:?}");
    let sweep =
        ["bench", "file", "--dir", files_arg, "--sizes", "1MiB", "--methods", "staged", "--threads", "1,2"];
    let sweep =
        json_of(&load_in(dir.path(), &[&sweep[..], &["--chunk", "128KiB,512KiB", "--json"]].concat()));
    let tunings: Vec<(u64, u64)> = sweep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["cache"] == "warm")
        .map(|row| (row["threads"].as_u64().unwrap(), row["chunk_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(tunings, [(1, 128 << 10), (1, 512 << 10), (2, 128 << 10), (2, 512 << 10)], "every pair");
    for row in rows {
        assert!(row["gb_per_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(["cold", "warm"].contains(&row["cache"].as_str().unwrap()), "{row}");
    }
    assert!(!report["storage"].as_array().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), 0, "the files are removed without --keep");
    let kept = load_in(
        dir.path(),
        &["bench", "file", "--dir", files_arg, "--sizes", "1MiB", "--methods", "staged", "--keep"],
    );
    assert!(kept.status.success(), "{}", stderr(&kept));
    assert!(files.join("hetmem-bench-1MiB.safetensors").exists());
    let text = String::from_utf8(kept.stdout).unwrap();
    assert!(text.contains("staged") && text.contains("kept ") && text.contains("buffered"), "{text}");
}
