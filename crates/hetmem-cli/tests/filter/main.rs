//! `hetmem filter` as a user runs it, on the CPU backend: images and Y4M video through the
//! binary, every result compared with hetmem's CPU blur on the same pixels.
//!
//! On the GPU machine the binary lives beside the test executable in the bundle, not where
//! cargo built it: `HETMEM_BIN` points there.
//!
//! Bad input has its own modules: files that are not what they claim or alias the
//! output, and pipes given as paths and Ctrl-C in a pipeline.

mod bad_input;
mod figures;
mod habits;
mod high_bit_depth;
mod pipes;
mod png_crc;
mod raw;
#[cfg(feature = "testing")]
mod retries;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, gaussian_cpu};
use hetmem::{BackendChoice, BackendKind, Device, Strategy};
use hetmem_bench::random::{SplitMix64, fresh_seed};

fn command(args: &[&str]) -> Command {
    command_on("cpu", args)
}

fn command_on(backend: &str, args: &[&str]) -> Command {
    let binary = std::env::var("HETMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hetmem").to_string());
    let mut command = Command::new(binary);
    command.args(args).env("HETMEM_BACKEND", backend);
    command
}

fn hetmem(args: &[&str]) -> Output {
    command(args).stdin(Stdio::null()).output().expect("run hetmem")
}

/// Runs hetmem with `input` on its stdin, written from a thread so that a full stdout pipe
/// cannot deadlock the two.
fn hetmem_with_stdin(args: &[&str], input: Vec<u8>) -> Output {
    hetmem_with_stdin_on("cpu", args, input)
}

fn hetmem_with_stdin_on(backend: &str, args: &[&str], input: Vec<u8>) -> Output {
    let mut child = command_on(backend, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hetmem");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for hetmem");
    writer.join().unwrap();
    output
}

fn spawn(args: &[&str]) -> Child {
    command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hetmem")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "hetmem-filter-{name}-{}-{nanos}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Random bytes, different on every call and every run (never a constant image).
fn random_bytes(len: usize) -> Vec<u8> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let bytes = SplitMix64::part(fresh_seed(), call).bytes(len);
    assert!(bytes.iter().any(|&b| b != bytes[0]), "random bytes came out constant");
    bytes
}

/// What hetmem's CPU path makes of `input`.
fn blurred(format: FrameFormat, kernel: &Gaussian, input: &[u8]) -> Vec<u8> {
    let mut output = vec![0; input.len()];
    gaussian_cpu(&format, kernel, input, &mut output).unwrap();
    output
}

fn default_kernel() -> Gaussian {
    Gaussian::new(None, None, Border::Reflect101).unwrap()
}

/// A Y4M stream: `header` (the line, with its `\n`), then one `FRAME` per frame.
fn y4m(header: &str, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = header.as_bytes().to_vec();
    for frame in frames {
        bytes.extend_from_slice(b"FRAME\n");
        bytes.extend_from_slice(frame);
    }
    bytes
}

/// Checks a Y4M result: the header kept byte for byte, then exactly the blurred frames.
fn assert_y4m_result(
    result: &[u8],
    header: &str,
    format: FrameFormat,
    kernel: &Gaussian,
    frames: &[Vec<u8>],
) {
    assert!(
        result.starts_with(header.as_bytes()),
        "header not kept: {:?}",
        &result[..header.len().min(result.len())]
    );
    let want = y4m(header, &frames.iter().map(|frame| blurred(format, kernel, frame)).collect::<Vec<_>>());
    assert_eq!(result.len(), want.len(), "output length");
    let frame_bytes = format.frame_bytes();
    for (index, (got, want)) in result[header.len()..]
        .chunks(frame_bytes + 6)
        .zip(want[header.len()..].chunks(frame_bytes + 6))
        .enumerate()
    {
        assert_eq!(&got[..6], b"FRAME\n", "frame {index} header");
        if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
            panic!("frame {index}: byte {at} is {}, the CPU path gives {}", got[at], want[at]);
        }
    }
}

#[test]
fn a_png_rgb_image_comes_back_blurred_like_the_cpu_path() {
    let dir = TempDir::new("png-rgb");
    let (width, height) = (37, 23);
    let pixels = random_bytes(width * height * 3);
    let (input, output) = (dir.path("in.png"), dir.path("out.png"));
    image::RgbImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--sigma", "1.5"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(run.stdout.is_empty(), "nothing on stdout");
    let summary = stderr(&run);
    assert!(summary.contains("1 frame") && summary.contains("p50") && summary.contains("cpu"), "{summary}");

    let result = image::open(&output).unwrap();
    assert_eq!(result.color(), image::ColorType::Rgb8, "RGB stays RGB");
    let format = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
    let kernel = Gaussian::new(None, Some(1.5), Border::Reflect101).unwrap();
    assert_eq!(result.as_bytes(), blurred(format, &kernel, &pixels));
}

#[test]
fn a_gray_pgm_image_stays_gray_and_matches_the_cpu_path() {
    let dir = TempDir::new("pgm");
    let (width, height) = (33, 17);
    let pixels = random_bytes(width * height);
    let (input, output) = (dir.path("in.pgm"), dir.path("out.pgm"));
    image::GrayImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--radius", "3", "--border", "replicate"]);
    assert!(run.status.success(), "{}", stderr(&run));

    let result = image::open(&output).unwrap();
    assert_eq!(result.color(), image::ColorType::L8, "gray stays gray");
    let format = FrameFormat::new(width, height, PixelLayout::Gray).unwrap();
    let kernel = Gaussian::new(Some(3), None, Border::Replicate).unwrap();
    assert_eq!(result.as_bytes(), blurred(format, &kernel, &pixels));
}

#[test]
fn an_rgba_png_stays_rgba() {
    let dir = TempDir::new("png-rgba");
    let (width, height) = (19, 12);
    let pixels = random_bytes(width * height * 4);
    let (input, output) = (dir.path("in.png"), dir.path("out.png"));
    image::RgbaImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    let result = image::open(&output).unwrap();
    assert_eq!(result.color(), image::ColorType::Rgba8);
    let format = FrameFormat::new(width, height, PixelLayout::Rgba).unwrap();
    assert_eq!(result.as_bytes(), blurred(format, &default_kernel(), &pixels));
    // JPEG has no alpha: refused before any work, naming the problem.
    let refused = hetmem(&["filter", text(&input), text(&dir.path("out.jpg"))]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("alpha"), "{}", stderr(&refused));
}

#[test]
fn a_jpeg_goes_in_and_out() {
    let dir = TempDir::new("jpeg");
    let (width, height) = (40, 30);
    let (input, output) = (dir.path("in.jpg"), dir.path("out.jpeg"));
    image::RgbImage::from_raw(width, height, random_bytes((width * height * 3) as usize))
        .unwrap()
        .save(&input)
        .unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--json"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let summary: serde_json::Value =
        serde_json::from_slice(&run.stdout).expect("--json prints JSON on stdout");
    assert_eq!(summary["frames"], 1);
    assert_eq!(summary["strategy"], "cpu");
    let result = image::open(&output).expect("the output decodes");
    assert_eq!((result.width(), result.height()), (width, height));
    assert_eq!(result.color(), image::ColorType::Rgb8);
    // And into PNG: the format follows the output's extension.
    let png = dir.path("out.png");
    let run = hetmem(&["filter", text(&input), text(&png)]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(
        image::ImageReader::open(&png).unwrap().with_guessed_format().unwrap().format(),
        Some(image::ImageFormat::Png)
    );
}

#[test]
fn a_y4m_420_odd_size_stream_goes_stdin_to_stdout_frame_by_frame() {
    let (width, height) = (33, 17);
    let format = FrameFormat::new(width, height, PixelLayout::Yuv420).unwrap();
    assert_eq!(format.frame_bytes(), 33 * 17 + 2 * 17 * 9);
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let header = "YUV4MPEG2 W33 H17 F30000:1001 It A128:117 C420mpeg2 XYSCSS=420MPEG2\n";
    let run = hetmem_with_stdin(&["filter", "-", "-"], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    let summary = stderr(&run);
    assert!(
        summary.contains("3 frames") && summary.contains("p99") && summary.contains("frames/s"),
        "{summary}"
    );

    // An independent reader agrees on the stream.
    let mut decoder = y4m::Decoder::new(&run.stdout[..]).unwrap();
    assert_eq!((decoder.get_width(), decoder.get_height()), (33, 17));
    assert!(matches!(decoder.get_colorspace(), y4m::Colorspace::C420mpeg2));
    let mut count = 0;
    while let Ok(frame) = decoder.read_frame() {
        assert_eq!(frame.get_u_plane().len(), 17 * 9);
        count += 1;
    }
    assert_eq!(count, 3);

    // --json --report: a summary in the report, and still nothing but video on stdout.
    let dir = TempDir::new("y4m-report");
    let report = dir.path("summary.json");
    let run =
        hetmem_with_stdin(&["filter", "-", "-", "--json", "--report", text(&report)], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).expect("JSON in the report");
    assert_eq!(summary["frames"], 3);
    assert_eq!(summary["strategy"], "cpu");
    assert!(summary["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
}

#[test]
fn c444_c422_and_cmono_files_are_filtered_plane_by_plane() {
    let dir = TempDir::new("y4m-spaces");
    for (space, layout) in
        [("C444", PixelLayout::Yuv444), ("C422", PixelLayout::Yuv422), ("Cmono", PixelLayout::Gray)]
    {
        let format = FrameFormat::new(21, 10, layout).unwrap();
        let frames: Vec<Vec<u8>> = (0..2).map(|_| random_bytes(format.frame_bytes())).collect();
        filter_y4m_file_and_check(&dir, space, format, &frames);
    }
}

/// Writes `frames` of `format` as a `space` Y4M file in `dir`, filters it into another file
/// (radius 4, sigma 2) and checks the result against the CPU path.
fn filter_y4m_file_and_check(dir: &TempDir, space: &str, format: FrameFormat, frames: &[Vec<u8>]) {
    let header = format!("YUV4MPEG2 W{} H{} F25:1 Ip A1:1 {space}\n", format.width(), format.height());
    let (input, output) = (dir.path(&format!("{space}.y4m")), dir.path(&format!("{space}-out.y4m")));
    std::fs::write(&input, y4m(&header, frames)).unwrap();
    let kernel = Gaussian::new(Some(4), Some(2.0), Border::Reflect101).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--radius", "4", "--sigma", "2"]);
    assert!(run.status.success(), "{space}: {}", stderr(&run));
    assert!(run.stdout.is_empty());
    assert_y4m_result(&std::fs::read(&output).unwrap(), &header, format, &kernel, frames);
}

#[test]
fn an_unsupported_colour_space_is_refused_by_name() {
    // 4:1:1 (10-bit 4:2:0, once refused, is filtered now: high_bit_depth.rs).
    let dir = TempDir::new("c411");
    let input = dir.path("in.y4m");
    let mut stream = b"YUV4MPEG2 W32 H16 F25:1 C411\nFRAME\n".to_vec();
    stream.extend(random_bytes(32 * 16 * 3 / 2));
    std::fs::write(&input, stream).unwrap();
    let run = hetmem(&["filter", text(&input), text(&dir.path("out.y4m"))]);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("C411") && error.contains("in.y4m") && error.contains("C444"), "{error}");
    assert!(!dir.path("out.y4m").exists(), "no output for a refused input");
}

/// Frames count from 0: cutting inside frame 2 (the third) leaves frames 0 and 1 written.
#[test]
fn a_truncated_y4m_fails_naming_the_frame_after_writing_the_ones_before() {
    let dir = TempDir::new("truncated");
    let format = FrameFormat::new(33, 17, PixelLayout::Yuv420).unwrap();
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let header = "YUV4MPEG2 W33 H17 F25:1 C420\n";
    let mut stream = y4m(header, &frames);
    stream.truncate(stream.len() - format.frame_bytes() / 2);
    let (input, output) = (dir.path("cut.y4m"), dir.path("out.y4m"));
    std::fs::write(&input, &stream).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("cut.y4m") && error.contains("frame 2") && error.contains("truncated"), "{error}");
    assert_y4m_result(&std::fs::read(&output).unwrap(), header, format, &default_kernel(), &frames[..2]);

    // The same through pipes: stdout holds the two complete frames.
    let run = hetmem_with_stdin(&["filter", "-", "-"], stream);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("frame 2"), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames[..2]);

    // A corrupt frame line instead of a short one.
    let mut stream = y4m(header, &frames);
    let second = header.len() + format.frame_bytes() + 6;
    stream[second..second + 5].copy_from_slice(b"JUNK!");
    let run = hetmem_with_stdin(&["filter", "-", "-"], stream);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("frame 1") && error.contains("corrupt"), "{error}");
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames[..1]);
}

/// Frames larger than one I/O thread's share (4 MiB) are read and written
/// by several threads at once, by position, where input and output are regular files. Four
/// such frames come out as the CPU path makes them, byte for byte and in order, from a file
/// and from stdin redirected from a file; and a file cut inside its last frame still gets
/// every frame before it written, whole, before the error.
#[test]
fn large_frames_read_and_written_by_several_threads_match_the_cpu_path() {
    let dir = TempDir::new("threaded-io");
    let format = FrameFormat::new(2400, 2400, PixelLayout::Yuv420).unwrap();
    assert!(format.frame_bytes() > 2 * (4 << 20), "frames large enough to be split");
    let frames: Vec<Vec<u8>> = (0..4).map(|_| random_bytes(format.frame_bytes())).collect();
    let header = "YUV4MPEG2 W2400 H2400 F60:1 Ip A1:1 C420jpeg\n";
    let stream = y4m(header, &frames);
    let (input, output) = (dir.path("in.y4m"), dir.path("out.y4m"));
    std::fs::write(&input, &stream).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("4 frames"), "{}", stderr(&run));
    assert_y4m_result(&std::fs::read(&output).unwrap(), header, format, &default_kernel(), &frames);

    // stdin redirected from the file is read by position too; stdout, a pipe, front to back.
    let run = command(&["filter", "-", "-"])
        .stdin(std::fs::File::open(&input).unwrap())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);

    // An output that is a FIFO (a path, but no regular file) is written front to back.
    let fifo = dir.path("fifo.y4m");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let run = hetmem(&["filter", text(&input), text(&fifo), "-y"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&reader.join().unwrap(), header, format, &default_kernel(), &frames);

    // Cut inside the last frame, past the first thread's share of it.
    let cut = dir.path("cut.y4m");
    std::fs::write(&cut, &stream[..stream.len() - format.frame_bytes() / 3]).unwrap();
    let output = dir.path("cut-out.y4m");
    let run = hetmem(&["filter", text(&cut), text(&output)]);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("frame 3") && error.contains("truncated"), "{error}");
    assert!(
        error.contains(&format!("after {} of its", format.frame_bytes() - format.frame_bytes() / 3)),
        "{error}"
    );
    assert_y4m_result(&std::fs::read(&output).unwrap(), header, format, &default_kernel(), &frames[..3]);
}

#[test]
fn corrupt_and_truncated_pngs_are_refused() {
    let dir = TempDir::new("bad-png");
    let corrupt = dir.path("corrupt.png");
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend(random_bytes(200));
    std::fs::write(&corrupt, bytes).unwrap();
    let run = hetmem(&["filter", text(&corrupt), text(&dir.path("out.png"))]);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("corrupt.png") && error.contains("PNG"), "{error}");

    let good = dir.path("good.png");
    image::RgbImage::from_raw(64, 64, random_bytes(64 * 64 * 3)).unwrap().save(&good).unwrap();
    let whole = std::fs::read(&good).unwrap();
    let cut = dir.path("cut.png");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let run = hetmem(&["filter", text(&cut), text(&dir.path("out.png"))]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("cut.png"), "{}", stderr(&run));

    let empty = dir.path("empty.png");
    std::fs::write(&empty, b"").unwrap();
    let run = hetmem(&["filter", text(&empty), text(&dir.path("out.png"))]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("empty.png"), "{}", stderr(&run));
}

/// Sides not larger than the radius are blurred as OpenCV does: reflect101 folds the border
/// again and again, replicate repeats the edge (the library's OpenCV test has such crops).
#[test]
fn images_smaller_than_the_kernel_are_blurred_like_opencv() {
    let dir = TempDir::new("tiny");
    for (width, height, radius, border) in [
        (1, 1, "2", "reflect101"),
        (2, 3, "9", "reflect101"),
        (3, 1, "5", "replicate"),
        (33, 17, "17", "reflect101"),
    ] {
        // At least 16 random bytes, so that even 1x1 is not constant by chance.
        let len = (width * height * 3) as usize;
        let pixels = random_bytes(len.max(16))[..len].to_vec();
        let (input, output) = (dir.path("small.ppm"), dir.path("out.ppm"));
        image::RgbImage::from_raw(width, height, pixels.clone()).unwrap().save(&input).unwrap();
        let run =
            hetmem(&["filter", "-y", text(&input), text(&output), "--radius", radius, "--border", border]);
        assert!(run.status.success(), "{width}x{height} radius {radius}: {}", stderr(&run));
        let format = FrameFormat::new(width as usize, height as usize, PixelLayout::Rgb).unwrap();
        let border = if border == "replicate" { Border::Replicate } else { Border::Reflect101 };
        let kernel = Gaussian::new(Some(radius.parse().unwrap()), None, border).unwrap();
        assert_eq!(image::open(&output).unwrap().as_bytes(), blurred(format, &kernel, &pixels));
    }
    // By hand, as cv2.GaussianBlur gives: a 2x1 row [0, 255] folds into 0 255 0 255 0 for x = 0
    // and 255 0 255 0 255 for x = 1, 128/256 of 255 both times.
    let (input, output) = (dir.path("two.pgm"), dir.path("two-out.pgm"));
    image::GrayImage::from_raw(2, 1, vec![0, 255]).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(image::open(&output).unwrap().as_bytes(), [128, 128]);
}

#[test]
fn zero_and_absurd_y4m_sizes_are_refused() {
    for header in ["YUV4MPEG2 W0 H16 C420\n", "YUV4MPEG2 W100000 H16 C420\n", "YUV4MPEG2 H16 C420\n"] {
        let run = hetmem_with_stdin(&["filter", "-", "-"], header.as_bytes().to_vec());
        assert_eq!(run.status.code(), Some(1), "{header}");
        assert!(stderr(&run).contains("stdin"), "{}", stderr(&run));
        assert!(run.stdout.is_empty());
    }
    let run = hetmem_with_stdin(&["filter", "-", "-"], b"not a video at all\n".to_vec());
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("not a Y4M stream"), "{}", stderr(&run));
}

#[test]
fn an_unknown_strategy_is_refused_listing_the_valid_ones() {
    let run = hetmem_with_stdin(&["filter", "-", "-", "--strategy", "teleport"], Vec::new());
    assert_eq!(run.status.code(), Some(2), "a usage error");
    let error = stderr(&run);
    for name in ["teleport", "cpu", "pinned-async", "zero-copy", "managed", "hybrid", "auto"] {
        assert!(error.contains(name), "{name} missing: {error}");
    }
}

#[test]
fn images_and_video_do_not_mix() {
    let dir = TempDir::new("mix");
    let png = dir.path("in.png");
    image::GrayImage::from_raw(8, 8, random_bytes(64)).unwrap().save(&png).unwrap();
    let run = hetmem(&["filter", text(&png), "-"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stdout.is_empty());
    assert!(stderr(&run).contains("in.png"), "{}", stderr(&run));
    let run = hetmem(&["filter", text(&png), text(&dir.path("out.y4m"))]);
    assert_eq!(run.status.code(), Some(1));
    let video = dir.path("in.y4m");
    std::fs::write(&video, y4m("YUV4MPEG2 W8 H8 Cmono\n", &[random_bytes(64)])).unwrap();
    let run = hetmem(&["filter", text(&video), text(&dir.path("out.png"))]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("in.y4m"), "{}", stderr(&run));
    let run = hetmem(&["filter", text(&png), text(&dir.path("out.gif"))]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains(".png"), "{}", stderr(&run));
}

#[test]
fn a_reader_closing_the_pipe_early_ends_quietly() {
    let format = FrameFormat::new(64, 64, PixelLayout::Yuv420).unwrap();
    let frame = random_bytes(format.frame_bytes());
    let stream = y4m("YUV4MPEG2 W64 H64 F25:1 C420\n", &vec![frame; 200]);
    let mut child = spawn(&["filter", "-", "-"]);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // hetmem stops reading once its stdout is gone: this write may fail, as it should.
        let _ = stdin.write_all(&stream);
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut start = [0u8; 100];
    stdout.read_exact(&mut start).unwrap();
    assert!(start.starts_with(b"YUV4MPEG2 W64 H64"));
    drop(stdout);
    let mut errors = String::new();
    child.stderr.take().unwrap().read_to_string(&mut errors).unwrap();
    let status = child.wait().unwrap();
    writer.join().unwrap();
    assert!(status.success(), "{status}: {errors}");
    assert!(!errors.to_lowercase().contains("error"), "{errors}");
}

/// On a GPU machine, every strategy it can run gives the CPU path's bytes, for video through
/// pipes and for an image; the ones it cannot run are refused by name.
#[test]
fn every_strategy_the_gpu_runs_gives_the_cpu_result() {
    if hetmem::testing::cuda_device_or_skip("every_strategy_the_gpu_runs_gives_the_cpu_result").is_none() {
        return;
    }
    let device = Device::open(BackendChoice::Only(BackendKind::Cuda)).unwrap();
    let dir = TempDir::new("gpu");
    let format = FrameFormat::new(333, 171, PixelLayout::Yuv420).unwrap();
    let frames: Vec<Vec<u8>> = (0..4).map(|_| random_bytes(format.frame_bytes())).collect();
    let header = "YUV4MPEG2 W333 H171 F25:1 C420jpeg\n";
    let (width, height) = (257, 129);
    let pixels = random_bytes(width * height * 3);
    let png = dir.path("in.png");
    image::RgbImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&png).unwrap();
    let kernel = Gaussian::new(Some(7), None, Border::Reflect101).unwrap();
    for strategy in Strategy::ALL.into_iter().chain([Strategy::Auto]) {
        let name = strategy.name();
        let args = ["filter", "-", "-", "--strategy", name, "--radius", "7"];
        let run = hetmem_with_stdin_on("cuda", &args, y4m(header, &frames));
        let out = dir.path(&format!("{name}.png"));
        let image_run =
            command_on("cuda", &["filter", text(&png), text(&out), "--strategy", name, "--radius", "7"])
                .output()
                .unwrap();
        if let Err(why) = strategy.check(&device) {
            for run in [&run, &image_run] {
                assert_eq!(run.status.code(), Some(1), "{name} should be refused: {why}");
                assert!(stderr(run).contains(name), "{}", stderr(run));
            }
            continue;
        }
        assert!(run.status.success(), "{name}: {}", stderr(&run));
        assert!(stderr(&run).contains(strategy.resolve(&device).name()), "{}", stderr(&run));
        assert_y4m_result(&run.stdout, header, format, &kernel, &frames);
        assert!(image_run.status.success(), "{name}: {}", stderr(&image_run));
        let rgb = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
        assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &kernel, &pixels), "{name}: image");
    }
}

/// Ctrl-C stops reading; every frame read is still filtered and written, in order,
/// and hetmem exits with 130 on its own (its stdin still open).
#[test]
fn ctrl_c_ends_a_stream_cleanly_with_every_frame_read_written() {
    let format = FrameFormat::new(48, 32, PixelLayout::Yuv420).unwrap();
    let header = "YUV4MPEG2 W48 H32 F25:1 C420\n";
    let frames: Vec<Vec<u8>> = (0..4).map(|_| random_bytes(format.frame_bytes())).collect();
    let mut child = spawn(&["filter", "-", "-"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let whole = y4m(header, &frames);
    let (first, last) = whole.split_at(whole.len() - format.frame_bytes() - 6);
    stdin.write_all(first).unwrap();
    stdin.flush().unwrap();
    // The three frames sent come back before the interrupt.
    let mut got = vec![0u8; first.len()];
    stdout.read_exact(&mut got).unwrap();
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    // hetmem is most likely waiting inside the next frame's read: it finishes that frame, then
    // stops. (Interrupted before it began that read, it stops at once and this write fails.)
    let _ = stdin.write_all(last).and_then(|()| stdin.flush());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    got.extend_from_slice(&rest);
    let mut errors = String::new();
    child.stderr.take().unwrap().read_to_string(&mut errors).unwrap();
    let status = child.wait().unwrap();
    drop(stdin);
    assert_eq!(status.code(), Some(130), "{errors}");
    assert!(errors.contains("interrupted") && !errors.contains("error"), "{errors}");
    let written = (got.len() - header.len()) / (format.frame_bytes() + 6);
    assert!(written == 3 || written == 4, "{written} frames written");
    assert_y4m_result(&got, header, format, &default_kernel(), &frames[..written]);
}
