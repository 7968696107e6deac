//! The filter's share of the CLI habits: images on stdin told by their first bytes,
//! outputs and reports not replaced without `-y`, the summary as JSON on stdout or in a
//! report, `-q`, and no progress on a stderr that is not a terminal.

use super::*;

/// A random RGB image, encoded in `format`.
fn encoded_image(format: image::ImageFormat, width: usize, height: usize) -> (Vec<u8>, Vec<u8>) {
    let pixels = random_bytes(width * height * 3);
    let mut bytes = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_raw(width as u32, height as u32, pixels.clone())
        .unwrap()
        .write_to(&mut bytes, format)
        .unwrap();
    (pixels, bytes.into_inner())
}

#[test]
fn png_and_pnm_images_on_stdin_are_told_by_their_first_bytes() {
    let dir = TempDir::new("stdin-images");
    let (width, height) = (19, 11);
    let rgb = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
    for (format, name) in [(image::ImageFormat::Png, "png"), (image::ImageFormat::Pnm, "ppm")] {
        let (pixels, bytes) = encoded_image(format, width, height);
        let out = dir.path(&format!("out-{name}.png"));
        let run = hetmem_with_stdin(&["filter", "-", text(&out)], bytes);
        assert!(run.status.success(), "{name} on stdin: {}", stderr(&run));
        assert!(stderr(&run).contains("stdin ->"), "{}", stderr(&run));
        assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &default_kernel(), &pixels), "{name}");
    }
    // A gray PGM on stdin, out as PGM.
    let gray = FrameFormat::new(width, height, PixelLayout::Gray).unwrap();
    let pixels = random_bytes(width * height);
    let mut pgm = format!("P5\n{width} {height}\n255\n").into_bytes();
    pgm.extend_from_slice(&pixels);
    let out = dir.path("out.pgm");
    let run = hetmem_with_stdin(&["filter", "-", text(&out)], pgm);
    assert!(run.status.success(), "PGM on stdin: {}", stderr(&run));
    assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(gray, &default_kernel(), &pixels));
}

#[test]
fn an_existing_output_or_report_is_refused_without_y_and_replaced_with_it() {
    let dir = TempDir::new("overwrite");
    let (_, png) = encoded_image(image::ImageFormat::Png, 12, 9);
    let input = dir.path("in.png");
    std::fs::write(&input, &png).unwrap();
    let output = dir.path("out.png");
    std::fs::write(&output, b"precious").unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert_eq!(run.status.code(), Some(1));
    let message = stderr(&run);
    assert!(
        message.contains(&format!("{} exists already: pass -y (--overwrite)", output.display())),
        "{message}"
    );
    assert_eq!(std::fs::read(&output).unwrap(), b"precious", "untouched");
    let run = hetmem(&["filter", "-y", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    image::open(&output).expect("replaced by the filtered image");

    // Video into a file, and a report: the same.
    let header = "YUV4MPEG2 W8 H6 Cmono\n";
    let video = dir.path("in.y4m");
    std::fs::write(&video, y4m(header, &[random_bytes(48)])).unwrap();
    let out = dir.path("out.y4m");
    std::fs::write(&out, b"precious").unwrap();
    let run = hetmem(&["filter", text(&video), text(&out)]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("out.y4m exists already"), "{}", stderr(&run));
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let report = dir.path("report.json");
    std::fs::write(&report, b"{}").unwrap();
    let fresh = dir.path("fresh.y4m");
    let run = hetmem(&["filter", text(&video), text(&fresh), "--report", text(&report)]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("report.json exists already"), "{}", stderr(&run));
    assert!(!fresh.exists(), "refused before the output was written");
    let run = hetmem(&["filter", "--overwrite", text(&video), text(&out), "--report", text(&report)]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(std::fs::read(&out).unwrap().starts_with(header.as_bytes()));
}

#[test]
fn json_goes_to_stdout_or_a_report_never_to_stderr() {
    let dir = TempDir::new("json");
    let (_, png) = encoded_image(image::ImageFormat::Png, 12, 9);
    let input = dir.path("in.png");
    std::fs::write(&input, &png).unwrap();
    let run = hetmem(&["filter", text(&input), text(&dir.path("a.png")), "--json"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(run.stderr.is_empty(), "{}", stderr(&run));
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    assert_eq!((summary["schema"].as_str(), summary["frames"].as_u64()), (Some("hetmem.filter/2"), Some(1)));

    // Video on stdout: JSON there would corrupt it, so it needs a report.
    let format = FrameFormat::new(8, 6, PixelLayout::Gray).unwrap();
    let header = "YUV4MPEG2 W8 H6 Cmono\n";
    let frames: Vec<Vec<u8>> = (0..2).map(|_| random_bytes(format.frame_bytes())).collect();
    let run = hetmem_with_stdin(&["filter", "-", "-", "--json"], y4m(header, &frames));
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("give --report FILE"), "{}", stderr(&run));
    assert!(run.stdout.is_empty());
    let report = dir.path("report.json");
    let run =
        hetmem_with_stdin(&["filter", "-", "-", "--json", "--report", text(&report)], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(run.stderr.is_empty(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!((summary["schema"].as_str(), summary["frames"].as_u64()), (Some("hetmem.filter/2"), Some(2)));
    // A report alone keeps the text summary on stderr.
    let again = dir.path("again.json");
    let run = hetmem_with_stdin(&["filter", "-", "-", "--report", text(&again)], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("hetmem filter: stdin -> stdout: 2 frames"), "{}", stderr(&run));
    assert!(again.exists());
}

/// A video through a piped stderr: the summary and nothing else, no bar; under -q, nothing.
#[test]
fn quiet_hides_the_summary_and_a_pipe_gets_no_progress() {
    let format = FrameFormat::new(64, 32, PixelLayout::Yuv420).unwrap();
    let header = "YUV4MPEG2 W64 H32 F25:1 C420\n";
    let frames: Vec<Vec<u8>> = (0..20).map(|_| random_bytes(format.frame_bytes())).collect();
    let run = hetmem_with_stdin(&["filter", "-", "-"], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    let errors = stderr(&run);
    assert_eq!(errors.lines().count(), 3, "the summary's three lines only: {errors:?}");
    assert!(!errors.contains('\r') && !errors.contains('\u{1b}'), "terminal control on a pipe: {errors:?}");
    let run = hetmem_with_stdin(&["-q", "filter", "-", "-"], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stderr(&run), "", "-q prints nothing on a clean run");
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    // Warnings stay under -q.
    let interlaced = "YUV4MPEG2 W64 H32 F25:1 It C420\n";
    let run = hetmem_with_stdin(&["filter", "-q", "-", "-"], y4m(interlaced, &frames[..1]));
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("hetmem: warning: stdin is interlaced"), "{}", stderr(&run));
    assert_eq!(stderr(&run).lines().count(), 1, "{}", stderr(&run));
}
