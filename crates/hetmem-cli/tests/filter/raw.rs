//! Raw video for ffmpeg users (`--raw WxH:pix_fmt`, ffmpeg's `-f rawvideo`): whole
//! frames back to back, no header, the same format out. Each round trip is compared with the
//! same frames filtered through the Y4M or image path (bit-exact).

use super::*;

/// Odd sides: chroma planes round up, as ffmpeg's do.
const WIDTH: usize = 33;
const HEIGHT: usize = 17;

fn raw_spec(pix_fmt: &str) -> String {
    format!("{WIDTH}x{HEIGHT}:{pix_fmt}")
}

/// The frames of a stream of `frame_bytes` frames.
fn frames_of(stream: &[u8], frame_bytes: usize) -> Vec<Vec<u8>> {
    assert_eq!(stream.len() % frame_bytes, 0, "{} bytes are not whole frames of {frame_bytes}", stream.len());
    stream.chunks(frame_bytes).map(<[u8]>::to_vec).collect()
}

/// What hetmem makes of `frames` as a Y4M stream with `header`: each frame's filtered bytes.
fn through_y4m(header: &str, frames: &[Vec<u8>], frame_bytes: usize) -> Vec<Vec<u8>> {
    let run = hetmem_with_stdin(&["filter", "-", "-"], y4m(header, frames));
    assert!(run.status.success(), "{}", stderr(&run));
    let body = &run.stdout[header.len()..];
    body.chunks(frame_bytes + 6)
        .map(|frame| {
            assert_eq!(&frame[..6], b"FRAME\n");
            frame[6..].to_vec()
        })
        .collect()
}

/// Raw `pix_fmt` frames through `filter --raw - -`: the frames that came out.
fn through_raw(pix_fmt: &str, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let run = hetmem_with_stdin(&["filter", "--raw", &raw_spec(pix_fmt), "-", "-"], frames.concat());
    assert!(run.status.success(), "{pix_fmt}: {}", stderr(&run));
    assert!(
        stderr(&run).contains(&format!("{} frames of {WIDTH}x{HEIGHT} raw {pix_fmt}", frames.len())),
        "{}",
        stderr(&run)
    );
    frames_of(&run.stdout, frames[0].len())
}

fn assert_frames_equal(got: &[Vec<u8>], want: &[Vec<u8>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: frame count");
    for (index, (got, want)) in got.iter().zip(want).enumerate() {
        if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
            panic!("{what}: frame {index}: byte {at} is {}, the other path gives {}", got[at], want[at]);
        }
    }
}

#[test]
fn raw_gray_and_yuv420p_match_the_same_frames_through_y4m() {
    for (pix_fmt, colour_space, layout) in
        [("gray", "Cmono", PixelLayout::Gray), ("yuv420p", "C420", PixelLayout::Yuv420)]
    {
        let format = FrameFormat::new(WIDTH, HEIGHT, layout).unwrap();
        let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
        let header = format!("YUV4MPEG2 W{WIDTH} H{HEIGHT} F25:1 {colour_space}\n");
        let raw = through_raw(pix_fmt, &frames);
        assert_frames_equal(&raw, &through_y4m(&header, &frames, format.frame_bytes()), pix_fmt);
        let cpu: Vec<Vec<u8>> =
            frames.iter().map(|frame| blurred(format, &default_kernel(), frame)).collect();
        assert_frames_equal(&raw, &cpu, pix_fmt);
    }
}

/// nv12's U and V are interleaved in one plane: blurred as the separate planes they are, the
/// result is yuv420p's, interleaved again.
#[test]
fn raw_nv12_matches_its_frames_as_planar_y4m() {
    let format = FrameFormat::new(WIDTH, HEIGHT, PixelLayout::Yuv420).unwrap();
    let luma = WIDTH * HEIGHT;
    let chroma = WIDTH.div_ceil(2) * HEIGHT.div_ceil(2);
    assert_eq!(format.frame_bytes(), luma + 2 * chroma);
    let planar: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let interleave = |frame: &[u8]| -> Vec<u8> {
        let (u, v) = frame[luma..].split_at(chroma);
        frame[..luma].iter().copied().chain(u.iter().zip(v).flat_map(|(&u, &v)| [u, v])).collect()
    };
    let nv12: Vec<Vec<u8>> = planar.iter().map(|frame| interleave(frame)).collect();
    let header = format!("YUV4MPEG2 W{WIDTH} H{HEIGHT} F25:1 C420\n");
    let want: Vec<Vec<u8>> =
        through_y4m(&header, &planar, format.frame_bytes()).iter().map(|frame| interleave(frame)).collect();
    assert_frames_equal(&through_raw("nv12", &nv12), &want, "nv12");
}

/// rgb24 frames are RGB images: each matches the frame filtered as a PPM, from a file into a
/// file this time.
#[test]
fn raw_rgb24_matches_each_frame_filtered_as_an_image() {
    let dir = TempDir::new("raw-rgb24");
    let format = FrameFormat::new(WIDTH, HEIGHT, PixelLayout::Rgb).unwrap();
    let frames: Vec<Vec<u8>> = (0..2).map(|_| random_bytes(format.frame_bytes())).collect();
    let (input, output) = (dir.path("in.rgb"), dir.path("out.rgb"));
    std::fs::write(&input, frames.concat()).unwrap();
    let run = hetmem(&["filter", "--raw", &raw_spec("rgb24"), text(&input), text(&output), "--radius", "3"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let raw = frames_of(&std::fs::read(&output).unwrap(), format.frame_bytes());
    let as_images: Vec<Vec<u8>> = frames
        .iter()
        .enumerate()
        .map(|(index, frame)| {
            let (ppm, out) = (dir.path(&format!("{index}.ppm")), dir.path(&format!("{index}-out.ppm")));
            image::RgbImage::from_raw(WIDTH as u32, HEIGHT as u32, frame.clone())
                .unwrap()
                .save(&ppm)
                .unwrap();
            let run = hetmem(&["filter", text(&ppm), text(&out), "--radius", "3"]);
            assert!(run.status.success(), "{}", stderr(&run));
            image::open(&out).unwrap().into_bytes()
        })
        .collect();
    assert_frames_equal(&raw, &as_images, "rgb24");
}

/// A stream that ends inside a frame: every whole frame is written, then the error names the
/// bytes the last one holds.
#[test]
fn a_truncated_raw_stream_writes_every_whole_frame_then_names_the_bytes() {
    let format = FrameFormat::new(WIDTH, HEIGHT, PixelLayout::Yuv420).unwrap();
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let cut = format.frame_bytes() / 3;
    for pix_fmt in ["yuv420p", "nv12"] {
        let mut stream = frames.concat();
        stream.truncate(2 * format.frame_bytes() + cut);
        let run = hetmem_with_stdin(&["filter", "--raw", &raw_spec(pix_fmt), "-", "-"], stream);
        let message = stderr(&run);
        assert_eq!(run.status.code(), Some(1), "{pix_fmt}: {message}");
        assert!(
            message.contains(&format!(
                "stdin: frame 2 (counting from 0) is truncated: the stream ends after {cut} of its {} bytes",
                format.frame_bytes()
            )),
            "{pix_fmt}: {message}"
        );
        assert!(message.contains("check it") && message.contains("frames 0 to 1 were written"), "{message}");
        assert_eq!(run.stdout.len(), 2 * format.frame_bytes(), "{pix_fmt}: the two whole frames");
        if pix_fmt == "yuv420p" {
            let cpu: Vec<Vec<u8>> =
                frames[..2].iter().map(|f| blurred(format, &default_kernel(), f)).collect();
            assert_frames_equal(&frames_of(&run.stdout, format.frame_bytes()), &cpu, pix_fmt);
        }
    }
}

#[test]
fn bad_raw_specs_and_mismatched_files_are_refused() {
    for (spec, said) in [
        ("1920x1080", "no pixel format: give WxH:pix_fmt, e.g. 1920x1080:yuv420p"),
        ("1920x1080:yuv444p", "unknown pixel format `yuv444p`"),
        ("axb:gray", "no width in `axb`"),
        ("0x10:gray", "width 0"),
    ] {
        let run = hetmem_with_stdin(&["filter", "--raw", spec, "-", "-"], random_bytes(64));
        let message = stderr(&run);
        assert_eq!(run.status.code(), Some(2), "{spec}: {message}");
        assert!(message.contains(&format!("invalid value '{spec}' for '--raw <WxH:PIX_FMT>'")), "{message}");
        assert!(message.contains(said), "{spec}: {message}");
        assert!(run.stdout.is_empty());
    }
    let dir = TempDir::new("raw-refused");
    let run = hetmem_with_stdin(
        &["filter", "--raw", "4x4:gray", "-", text(&dir.path("out.png"))],
        random_bytes(32),
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("--raw 4x4:gray writes raw frames"), "{}", stderr(&run));
    let header = "YUV4MPEG2 W4 H4 Cmono\n";
    let run = hetmem_with_stdin(&["filter", "--raw", "4x4:gray", "-", "-"], y4m(header, &[random_bytes(16)]));
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("stdin is a Y4M stream, not raw video: leave out --raw"),
        "{}",
        stderr(&run)
    );
    assert!(run.stdout.is_empty());
}
