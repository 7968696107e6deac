//! Inputs that are not what they claim to be, and outputs that are the input under
//! another name. Each is refused with a message naming the cause and the remedy, and leaves
//! nothing half-written behind.

use std::fs::File;
use std::process::Stdio;

use super::png_crc::png_crc;
use super::*;

/// `image`'s encoding of random pixels: (pixels, the encoded file).
fn encoded(format: image::ImageFormat, width: u32, height: u32) -> (Vec<u8>, Vec<u8>) {
    let pixels = random_bytes((width * height * 3) as usize);
    let mut file = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_raw(width, height, pixels.clone()).unwrap().write_to(&mut file, format).unwrap();
    (pixels, file.into_inner())
}

/// Runs `hetmem filter input output extra...` and expects exit status 1 with every one of
/// `wanted` in the message; returns the message.
fn refused(input: &Path, output: &Path, extra: &[&str], wanted: &[&str]) -> String {
    let mut args = vec!["filter", text(input), text(output)];
    args.extend_from_slice(extra);
    let run = hetmem(&args);
    let message = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{args:?}: {message}");
    for want in wanted {
        assert!(message.contains(want), "{args:?}: no {want:?} in: {message}");
    }
    assert!(!message.contains("panicked"), "{message}");
    message
}

#[test]
fn an_output_that_is_the_input_under_another_name_is_refused_and_the_input_survives() {
    let dir = TempDir::new("same-file");
    let input = dir.path("in.png");
    image::RgbImage::from_raw(16, 8, random_bytes(16 * 8 * 3)).unwrap().save(&input).unwrap();
    let original = std::fs::read(&input).unwrap();
    let hard = dir.path("hard.png");
    std::fs::hard_link(&input, &hard).unwrap();
    let symbolic = dir.path("symbolic.png");
    std::os::unix::fs::symlink(&input, &symbolic).unwrap();
    let spelled_otherwise = dir.0.join(".").join("in.png");
    for output in [&input, &hard, &symbolic, &spelled_otherwise] {
        refused(&input, output, &[], &["is the same file as", "in.png", "write the result to another file"]);
        assert!(std::fs::read(&input).unwrap() == original, "{}: the input changed", output.display());
    }
    // The check compares files, not names: another file is written.
    let other = dir.path("other.png");
    let run = hetmem(&["filter", text(&input), text(&other)]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(std::fs::read(&input).unwrap(), original);

    // Video: stdout appended to the input file, and stdin read from the output file.
    let format = FrameFormat::new(16, 8, PixelLayout::Yuv420).unwrap();
    let video = dir.path("in.y4m");
    std::fs::write(&video, y4m("YUV4MPEG2 W16 H8 C420\n", &[random_bytes(format.frame_bytes())])).unwrap();
    let original = std::fs::read(&video).unwrap();
    let appended = File::options().append(true).open(&video).unwrap();
    let run = command(&["filter", text(&video), "-"]).stdin(Stdio::null()).stdout(appended).output().unwrap();
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert!(stderr(&run).contains("stdout is the same file as"), "{}", stderr(&run));
    let run = command(&["filter", "-", text(&video)]).stdin(File::open(&video).unwrap()).output().unwrap();
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    assert!(stderr(&run).contains("is the same file as stdin"), "{}", stderr(&run));
    assert_eq!(std::fs::read(&video).unwrap(), original, "the video survives byte for byte");
}

/// libjpeg warns of a premature end and Pillow refuses a truncated JPEG; the `image` crate's
/// decoder fills the missing data in grey and says nothing.
#[test]
fn truncated_jpegs_are_refused_not_filled_in() {
    let dir = TempDir::new("jpeg-cut");
    let (_, whole) = encoded(image::ImageFormat::Jpeg, 48, 32);
    let scan = whole.windows(2).position(|pair| pair == [0xFF, 0xDA]).expect("a scan");
    let scan_header = usize::from(u16::from_be_bytes([whole[scan + 2], whole[scan + 3]]));
    let output = dir.path("out.jpg");
    for (cut, at) in [
        (scan, "in its headers, before any image data"),
        (scan + 2 + scan_header, "inside its compressed image data"),
        ((scan + whole.len()) / 2, "inside its compressed image data"),
        (whole.len() - 2, "inside its compressed image data"),
    ] {
        let input = dir.path("cut.jpg");
        std::fs::write(&input, &whole[..cut]).unwrap();
        refused(
            &input,
            &output,
            &[],
            &["cut.jpg: truncated JPEG: the file ends", at, "get the whole file again"],
        );
        assert!(!output.exists(), "cut at {cut} of {}: an output was written", whole.len());
    }
    // Whole, and whole with bytes after the end marker (libjpeg ignores them too), it is fine.
    let input = dir.path("whole.jpg");
    for bytes in [whole.clone(), [&whole[..], b"trailing"].concat()] {
        std::fs::write(&input, bytes).unwrap();
        let run = hetmem(&["filter", "-y", text(&input), text(&output)]);
        assert!(run.status.success(), "{}", stderr(&run));
    }
}

#[test]
fn truncated_pngs_and_ppms_say_so() {
    let dir = TempDir::new("png-ppm-cut");
    let (_, whole) = encoded(image::ImageFormat::Png, 40, 30);
    let output = dir.path("out.png");
    // Cut in its pixel data, and with only the end chunk's CRC missing (which the decoder
    // let through).
    for cut in [whole.len() / 2, whole.len() - 4] {
        let input = dir.path("cut.png");
        std::fs::write(&input, &whole[..cut]).unwrap();
        refused(&input, &output, &[], &["cut.png: truncated PNG: the file ends"]);
        assert!(!output.exists());
    }

    let ppm = dir.path("cut.ppm");
    let mut bytes = b"P6\n64 48\n255\n".to_vec();
    bytes.extend(random_bytes(64 * 48 * 3 / 2));
    std::fs::write(&ppm, &bytes).unwrap();
    refused(
        &ppm,
        &dir.path("out.ppm"),
        &[],
        &[
            "cut.ppm: truncated PPM: its header declares 64x48 pixels, so 9216 bytes of pixels are expected",
            "after it, but the file holds 4608: get the whole file again",
        ],
    );
}

/// A header is a few bytes that may claim anything: the size is checked against the cap
/// before anything is allocated, and the message names the size, the bytes it needs and the
/// flag that lifts the cap.
#[test]
fn declared_sizes_beyond_the_pixel_cap_are_refused_before_allocating() {
    let dir = TempDir::new("huge");
    let ppm = dir.path("huge.ppm");
    std::fs::write(&ppm, [&b"P6\n65536 65536\n255\n"[..], &random_bytes(100)].concat()).unwrap();
    refused(
        &ppm,
        &dir.path("out.ppm"),
        &[],
        &[
            "huge.ppm: its PNM header declares 65536x65536 pixels (4294967296 pixels), which needs",
            "--max-pixels 4294967296",
        ],
    );

    // A small PNG that declares a huge image, its header's CRC made right.
    let (_, mut png) = encoded(image::ImageFormat::Png, 4, 4);
    png[16..20].copy_from_slice(&60_000u32.to_be_bytes());
    png[20..24].copy_from_slice(&50_000u32.to_be_bytes());
    let crc = png_crc(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    let small = dir.path("small.png");
    std::fs::write(&small, &png).unwrap();
    assert!(png.len() < 200);
    refused(
        &small,
        &dir.path("out.png"),
        &[],
        &[
            "its PNG header declares 60000x50000 pixels (3000000000 pixels), which needs",
            "--max-pixels 3000000000",
        ],
    );

    // A Y4M stream on stdin, and one with a sane header whose frames never come.
    let run = hetmem_with_stdin(&["filter", "-", "-"], b"YUV4MPEG2 W65536 H65536 C444\nFRAME\n".to_vec());
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("stdin: its Y4M header declares 65536x65536 pixels"), "{}", stderr(&run));
    assert!(stderr(&run).contains("bytes (") && stderr(&run).contains("--max-pixels"), "{}", stderr(&run));
    assert!(run.stdout.is_empty(), "no header written for a refused stream");

    // The flag moves the cap, both ways.
    let (pixels, png) = encoded(image::ImageFormat::Png, 16, 8);
    let input = dir.path("in.png");
    std::fs::write(&input, png).unwrap();
    refused(
        &input,
        &dir.path("out.png"),
        &["--max-pixels", "100"],
        &["16x8 pixels (128 pixels)", "--max-pixels 128"],
    );
    let run = hetmem(&["filter", text(&input), text(&dir.path("out.png")), "--max-pixels", "128"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let format = FrameFormat::new(16, 8, PixelLayout::Rgb).unwrap();
    assert_eq!(
        image::open(dir.path("out.png")).unwrap().as_bytes(),
        blurred(format, &default_kernel(), &pixels)
    );
    // Lifted above a declared 20000 x 20000, what is wrong next is the missing pixels.
    std::fs::write(&ppm, [&b"P6\n20000 20000\n255\n"[..], &random_bytes(100)].concat()).unwrap();
    refused(&ppm, &dir.path("out.ppm"), &["--max-pixels", "400000000"], &["truncated PPM"]);
}

#[test]
fn kernel_options_are_refused_in_terms_of_what_was_given() {
    let dir = TempDir::new("sigma");
    let input = dir.path("in.pgm");
    image::GrayImage::from_raw(8, 8, random_bytes(64)).unwrap().save(&input).unwrap();
    let output = dir.path("out.pgm");
    refused(
        &input,
        &output,
        &["--sigma", "11"],
        &["sigma 11 implies radius 33 (a 67 x 67 kernel), above the maximum radius 32", "below 10.75"],
    );
    let message = refused(&input, &output, &["--sigma", "-1"], &["sigma must be a positive number"]);
    assert!(!message.contains("unexpected argument"), "{message}");
    // clap's own refusal (a usage error: status 2), about the value, not "unexpected argument".
    let run = hetmem(&["filter", text(&input), text(&output), "--radius", "-1"]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        stderr(&run).contains("invalid value '-1' for '--radius <RADIUS>': -1 is not in 0..=32"),
        "{}",
        stderr(&run)
    );
    // A radius of 32 with that sigma is a kernel cut at 65 x 65: fine.
    let run = hetmem(&["filter", text(&input), text(&output), "--sigma", "11", "--radius", "32"]);
    assert!(run.status.success(), "{}", stderr(&run));
}

#[test]
fn corrupt_inputs_name_the_problem_once() {
    let dir = TempDir::new("corrupt");
    // A PNG whose first IDAT chunk is renamed: the decoder's message, printed once.
    let (_, mut png) = encoded(image::ImageFormat::Png, 16, 16);
    let idat = png.windows(4).position(|kind| kind == b"IDAT").unwrap();
    png[idat + 3] ^= 0xFF;
    let input = dir.path("renamed.png");
    std::fs::write(&input, png).unwrap();
    let message = refused(
        &input,
        &dir.path("out.png"),
        &[],
        &["renamed.png as PNG: Format error decoding Png: Unrecognized critical chunk"],
    );
    assert_eq!(message.matches("Unrecognized critical chunk").count(), 1, "said twice: {message}");

    // A FRAME line that never ends: read up to a bound, then refused, the frames before kept.
    let format = FrameFormat::new(16, 8, PixelLayout::Gray).unwrap();
    let frame = random_bytes(format.frame_bytes());
    let mut stream = y4m("YUV4MPEG2 W16 H8 Cmono\n", std::slice::from_ref(&frame));
    stream.extend_from_slice(b"FRAME ");
    stream.extend(std::iter::repeat_n(b'X', 1 << 20));
    let run = hetmem_with_stdin(&["filter", "-", "-"], stream);
    assert_eq!(run.status.code(), Some(1));
    let message = stderr(&run);
    assert!(
        message.contains(
            "frame 1 (counting from 0) is corrupt: its FRAME line has no end in its first 1024 bytes"
        ),
        "{message}"
    );
    assert!(message.contains("frame 0 was written"), "{message}");
    assert_y4m_result(&run.stdout, "YUV4MPEG2 W16 H8 Cmono\n", format, &default_kernel(), &[frame]);

    let empty = dir.path("empty.png");
    std::fs::write(&empty, b"").unwrap();
    refused(&empty, &dir.path("out.png"), &[], &["empty.png is empty"]);
}
