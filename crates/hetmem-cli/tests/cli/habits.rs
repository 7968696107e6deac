//! The habits users of ffmpeg, ripgrep and hyperfine expect, on every command:
//! choices listed and completed, completions and a man page, `-q`/`-v` beside `HETMEM_LOG`,
//! progress only on a terminal, `-y` before an existing file is replaced, a schema in every
//! JSON document, CSV tables. (The filter's own habits are in tests/filter/habits.rs.)

use std::path::Path;
use std::process::{Command, Stdio};

use super::*;

fn binary() -> String {
    std::env::var("HETMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hetmem").to_string())
}

/// hetmem on the CPU backend, run in `dir`.
fn hetmem_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(dir)
        .env("HETMEM_BACKEND", "cpu")
        .env_remove("HETMEM_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run hetmem")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A demo small enough to take a moment on the CPU.
const SMALL_DEMO: [&str; 7] = ["demo", "--frames", "3", "--width", "64", "--height", "48"];

#[test]
fn choices_are_listed_in_help_with_what_each_means() {
    let top = stdout(&hetmem(&["--help"], &[]));
    for listed in
        ["--backend <BACKEND>", "auto:", "cpu:", "cuda:", "[env: HETMEM_BACKEND=]", "[default: auto]"]
    {
        assert!(top.contains(listed), "hetmem --help lacks {listed}: {top}");
    }
    let filter = stdout(&hetmem(&["filter", "--help"], &[]));
    for strategy in ["auto", "cpu", "copy", "pinned-async", "zero-copy", "managed", "hybrid"] {
        assert!(filter.contains(&format!("{strategy}:")), "filter --help lacks {strategy}: {filter}");
    }
    assert!(filter.contains("reflect101") && filter.contains("replicate"), "{filter}");
    let link = stdout(&hetmem(&["bench", "link", "--help"], &[]));
    for path in ["host_memcpy", "zero_copy_read", "managed_prefetch_read"] {
        assert!(link.contains(path), "bench link --help lacks {path}: {link}");
    }
    let pipeline = stdout(&hetmem(&["bench", "pipeline", "--help"], &[]));
    assert!(pipeline.contains("pinned-async") && pipeline.contains("gaussian"), "{pipeline}");
}

#[test]
fn a_choice_that_is_not_one_is_a_usage_error_listing_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    let output = hetmem_in(dir.path(), &["filter", "in.png", "out.png", "--strategy", "teleport"]);
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{message}");
    assert!(message.contains("invalid value 'teleport' for '--strategy <STRATEGY>'"), "{message}");
    assert!(message.contains("[possible values: auto, cpu, copy, pinned-async, zero-copy"), "{message}");
    // The library's other spellings still parse, wherever a choice is taken.
    let mut args = vec!["--backend", "CPU"];
    args.extend(SMALL_DEMO);
    args.extend(["--strategies", "Cpu", "--json"]);
    let output = hetmem_in(dir.path(), &args);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["rows"][0]["strategy"], "cpu");
    let link =
        ["bench", "link", "--quick", "--sizes", "4KiB", "--latency-sizes", "none", "--paths", " host_memcpy"];
    let output = hetmem_in(dir.path(), &[&link[..], &["--json"]].concat());
    assert!(output.status.success(), "{}", stderr(&output));
    let doctor = doctor_json(&[("HETMEM_BACKEND", "Cpu")]);
    assert_eq!(doctor["backend"]["selected"], "cpu");
    let image = dir.path().join("in.pgm");
    std::fs::write(&image, [&b"P5\n4 4\n255\n"[..], &[7; 16]].concat()).unwrap();
    let output = hetmem_in(dir.path(), &["filter", "in.pgm", "out.pgm", "--strategy", "CPU"]);
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn completions_cover_every_subcommand_and_the_choices() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = hetmem(&["completions", shell], &[]);
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = stdout(&output);
        for word in ["doctor", "bench", "demo", "filter", "completions", "man"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
        // The shells that complete values complete the choices.
        if ["bash", "zsh", "fish"].contains(&shell) {
            for choice in ["pinned-async", "zero_copy_read", "reflect101", "cuda"] {
                assert!(script.contains(choice), "{shell} completions lack {choice}");
            }
        }
    }
    assert!(stdout(&hetmem(&["completions", "bash"], &[])).contains("complete -F _hetmem"));
    assert!(stdout(&hetmem(&["completions", "fish"], &[])).contains("complete -c hetmem"));
    let unknown = hetmem(&["completions", "tcsh"], &[]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("[possible values: bash, elvish, fish, powershell, zsh]"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn the_man_page_has_its_sections_and_every_subcommand() {
    let output = hetmem(&["man"], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = stdout(&output);
    assert!(page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH hetmem 1"), "{page}");
    for section in [".TH hetmem 1", ".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS"] {
        assert!(page.contains(section), "no {section}: {page}");
    }
    for subcommand in
        ["hetmem\\-doctor", "hetmem\\-bench", "hetmem\\-demo", "hetmem\\-filter", "hetmem\\-completions"]
    {
        assert!(page.contains(subcommand), "no {subcommand}: {page}");
    }

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let output = hetmem(&["man", "--out", pages.to_str().unwrap()], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    for file in ["hetmem.1", "hetmem-filter.1", "hetmem-bench.1", "hetmem-bench-link.1", "hetmem-doctor.1"] {
        let page =
            std::fs::read_to_string(pages.join(file)).unwrap_or_else(|error| panic!("{file}: {error}"));
        assert!(page.contains(".SH NAME") && page.contains(".SH SYNOPSIS"), "{file}: {page}");
    }
    let filter = std::fs::read_to_string(pages.join("hetmem-filter.1")).unwrap();
    assert!(filter.contains("\\-\\-raw") && filter.contains("pinned\\-async"), "{filter}");
    let again = hetmem(&["man", "--out", pages.to_str().unwrap()], &[]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("exists already: pass -y (--overwrite)"), "{}", stderr(&again));
    let replaced = hetmem(&["-y", "man", "--out", pages.to_str().unwrap()], &[]);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
}

/// -v raises the log, -q lowers it, and HETMEM_LOG wins over both.
#[test]
fn verbose_and_quiet_set_the_log_level_and_hetmem_log_wins() {
    let no_gpu = doctor_json(&[])["devices"].as_array().unwrap().is_empty();
    // On a machine without a GPU, opening `auto` logs why at info level.
    let run = |args: &[&str], env: &[(&str, &str)]| stderr(&hetmem(args, env));
    let plain = run(&["doctor"], &[]);
    assert!(!plain.contains(" INFO "), "{plain}");
    let verbose = run(&["-v", "doctor"], &[]);
    if no_gpu {
        assert!(verbose.contains(" INFO ") && verbose.contains("no usable GPU"), "{verbose}");
    } else {
        eprintln!("skipped in part: a GPU is present, so opening the backend logs no fallback at info");
    }
    assert!(!verbose.contains(" DEBUG "), "{verbose}");
    let quieted = run(&["-v", "doctor"], &[("HETMEM_LOG", "error")]);
    assert!(!quieted.contains(" INFO "), "HETMEM_LOG wins over -v: {quieted}");
    let raised = run(&["-q", "doctor"], &[("HETMEM_LOG", "info")]);
    assert_eq!(raised.contains("no usable GPU"), no_gpu, "HETMEM_LOG wins over -q: {raised}");
    let both = hetmem(&["-q", "-v", "doctor"], &[]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    let bad = run(&["doctor"], &[("HETMEM_LOG", "hetmem=loud")]);
    assert!(bad.contains("HETMEM_LOG=\"hetmem=loud\" is not a log filter"), "{bad}");
}

/// Nothing progress-like reaches a stderr that is not a terminal (a pipe here).
#[test]
fn no_progress_on_a_stderr_that_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let demo = hetmem_in(dir.path(), &SMALL_DEMO);
    assert!(demo.status.success(), "{}", stderr(&demo));
    assert_eq!(stderr(&demo), "", "demo wrote to a piped stderr");
    let link =
        hetmem_in(dir.path(), &["bench", "link", "--quick", "--sizes", "4KiB", "--latency-sizes", "none"]);
    assert!(link.status.success(), "{}", stderr(&link));
    assert_eq!(stderr(&link), "", "bench link wrote to a piped stderr");
    let pipelined =
        hetmem_in(dir.path(), &["bench", "pipeline", "--pipelined", "--slots", "2", "--frames", "4"]);
    assert!(pipelined.status.success(), "{}", stderr(&pipelined));
    assert_eq!(stderr(&pipelined), "", "bench pipeline wrote to a piped stderr");
}

/// Runs `hetmem args` in a pseudo-terminal (util-linux `script`): what the terminal showed.
fn in_a_terminal(dir: &Path, args: &[&str]) -> Option<String> {
    let mut line = format!("'{}'", binary());
    for arg in args {
        line.push_str(&format!(" '{arg}'"));
    }
    let output = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(dir)
        .env("HETMEM_BACKEND", "cpu")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    assert!(output.status.success(), "{line}: {}", stdout(&output));
    Some(stdout(&output))
}

/// On a terminal the demo shows a bar per strategy, and -q hides it.
#[test]
fn progress_shows_on_a_terminal_unless_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["demo", "--frames", "40", "--width", "320", "--height", "180"];
    let Some(shown) = in_a_terminal(dir.path(), &args) else {
        eprintln!("skipped: no `script` command to run hetmem in a pseudo-terminal");
        return;
    };
    assert!(shown.contains("cpu at 320x180") && shown.contains("frames"), "no bar: {shown:?}");
    let quiet: Vec<&str> = ["-q"].into_iter().chain(args).collect();
    let hidden = in_a_terminal(dir.path(), &quiet).unwrap();
    assert!(!hidden.contains("cpu at 320x180"), "a bar under -q: {hidden:?}");
    assert!(hidden.contains("verified"), "the table still prints: {hidden:?}");
}

#[test]
fn the_demo_writes_a_picture_only_when_asked_and_checks_its_name_first() {
    let dir = tempfile::tempdir().unwrap();
    let demo = hetmem_in(dir.path(), &SMALL_DEMO);
    assert!(demo.status.success(), "{}", stderr(&demo));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no file written without --png");

    // Refused before the run: nothing on stdout.
    for (png, said) in [
        ("picture.jpg", "--png picture.jpg: the picture is written as PNG: give a file name ending in .png"),
        ("missing/picture.png", "the folder missing does not exist: create it first"),
    ] {
        let mut args = SMALL_DEMO.to_vec();
        args.extend(["--png", png]);
        let refused = hetmem_in(dir.path(), &args);
        assert_eq!(refused.status.code(), Some(1), "{png}");
        assert!(stderr(&refused).contains(said), "{png}: {}", stderr(&refused));
        assert!(refused.stdout.is_empty(), "{png}: the run went ahead");
    }

    let mut args = SMALL_DEMO.to_vec();
    args.extend(["--png", "before-after.png"]);
    let first = hetmem_in(dir.path(), &args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stdout(&first).contains("before/after: before-after.png"), "{}", stdout(&first));
    let picture = image::open(dir.path().join("before-after.png")).unwrap();
    assert_eq!((picture.width(), picture.height()), (2 * 64, 48), "before and after, side by side");

    let kept = std::fs::read(dir.path().join("before-after.png")).unwrap();
    let again = hetmem_in(dir.path(), &args);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("before-after.png exists already: pass -y (--overwrite) to replace it"),
        "{}",
        stderr(&again)
    );
    assert!(again.stdout.is_empty(), "refused before the run");
    assert_eq!(std::fs::read(dir.path().join("before-after.png")).unwrap(), kept, "untouched");
    let replace: Vec<&str> = ["-y"].into_iter().chain(args.iter().copied()).collect();
    let replaced = hetmem_in(dir.path(), &replace);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    image::open(dir.path().join("before-after.png")).unwrap();
}

/// --save and --svg refuse existing files before anything is measured, and write a CSV per
/// table beside the JSON and Markdown.
#[test]
fn bench_files_are_not_replaced_without_y_and_tables_are_saved_as_csv() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "link", "--quick", "--sizes", "4KiB,64KiB", "--save", "saved", "--svg", "plots"];
    let first = hetmem_in(dir.path(), &args);
    assert!(first.status.success(), "{}", stderr(&first));
    let saved = dir.path().join("saved");
    let csv = std::fs::read_to_string(saved.join("link_bandwidth.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("path,4 KiB,64 KiB"), "{csv}");
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(row[0], "host_memcpy", "{csv}");
    // Each cell: the median, then its samples and spread in brackets (marked `?` when unsure).
    let median = |cell: &str| cell.split(' ').next().and_then(|median| median.parse::<f64>().ok());
    assert!(row[1..].iter().all(|cell| median(cell).is_some_and(|gb_s| gb_s > 0.0)), "{csv}");
    assert!(row[1..].iter().all(|cell| cell.contains(" [") && cell.contains("%]")), "{csv}");
    let latency = std::fs::read_to_string(saved.join("link_latency.csv")).unwrap();
    assert!(latency.starts_with("path,4 B,64 KiB\r\nhost_memcpy,"), "{latency}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(saved.join("link.json")).unwrap()).unwrap();
    assert_eq!(json["schema"], "hetmem.bench.link/1");

    let started = std::time::Instant::now();
    let again = hetmem_in(dir.path(), &args);
    assert_eq!(again.status.code(), Some(1));
    let message = stderr(&again);
    assert!(message.contains("link.json exists already: pass -y (--overwrite)"), "{message}");
    assert!(again.stdout.is_empty(), "refused before measuring");
    assert!(started.elapsed().as_secs_f64() < 5.0, "refused before measuring");
    // The plots alone are checked too.
    std::fs::remove_dir_all(&saved).unwrap();
    let plots = hetmem_in(dir.path(), &args);
    assert_eq!(plots.status.code(), Some(1));
    assert!(stderr(&plots).contains("bandwidth_vs_size.svg exists already"), "{}", stderr(&plots));
    let replaced: Vec<&str> = ["-y"].into_iter().chain(args).collect();
    let replaced = hetmem_in(dir.path(), &replaced);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    assert!(stderr(&replaced).contains("wrote plots/bandwidth_vs_size.svg"), "{}", stderr(&replaced));
    let quiet: Vec<&str> = ["-y", "-q"].into_iter().chain(args).collect();
    let quiet = hetmem_in(dir.path(), &quiet);
    assert!(quiet.status.success() && stderr(&quiet).is_empty(), "{}", stderr(&quiet));
}

#[test]
fn bench_tables_print_as_csv() {
    let output = bench_on_cpu(&["compare", "--quick", "--csv"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let csv = stdout(&output);
    let rows: Vec<Vec<&str>> = csv.lines().map(|line| line.split(',').collect()).collect();
    assert_eq!(rows[0], ["method", "latency us (4 KiB)", "GB/s (256 MiB)", "share of copy engine"], "{csv}");
    let host = rows.iter().find(|row| row[0] == "host_memcpy").expect("a host_memcpy row");
    assert!(host[1].parse::<f64>().is_ok_and(|us| us > 0.0), "{csv}");
    assert!(csv.lines().all(|line| !line.contains("  ")), "no text alignment: {csv}");
    let both = bench_on_cpu(&["compare", "--quick", "--csv", "--json"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
}

/// Every JSON document says what it is.
#[test]
fn every_json_document_names_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = SMALL_DEMO.to_vec();
    demo.push("--json");
    let link = ["bench", "link", "--quick", "--sizes", "4KiB", "--latency-sizes", "none", "--json"];
    for (args, schema) in [
        (vec!["doctor", "--json"], "hetmem.doctor/1"),
        (demo, "hetmem.demo/2"),
        (link.to_vec(), "hetmem.bench.link/1"),
        (vec!["bench", "compare", "--quick", "--json"], "hetmem.bench.compare/1"),
    ] {
        let output = hetmem_in(dir.path(), &args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        let document: Value = serde_json::from_slice(&output.stdout).expect("JSON");
        assert_eq!(document["schema"], schema, "{args:?}");
        assert_eq!(output.stdout.iter().position(|&b| b == b'"'), Some(4), "schema comes first: {args:?}");
    }
}
