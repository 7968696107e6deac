//! Pipes given as paths (a named FIFO, `/dev/stdin`), and Ctrl-C in a terminal
//! pipeline, where SIGINT reaches every process of the group and the upstream writer dies,
//! perhaps mid-frame.

use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitStatus;

use super::*;

/// Writes `source` into the FIFO `fifo` from a shell, which waits in `open` until a reader
/// comes: a child, so that a test whose reader never comes can end it instead of hanging.
fn fifo_writer(source: &Path, fifo: &Path) -> Child {
    Command::new("sh")
        .args(["-c", "cat \"$0\" > \"$1\"", text(source), text(fifo)])
        .spawn()
        .expect("start the FIFO's writer")
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Waits for a FIFO's writer, which should have finished with its reader.
fn finished(mut writer: Child) {
    let status = writer.try_wait().unwrap();
    if status.is_none() {
        writer.kill().unwrap();
    }
    assert!(writer.wait().unwrap().success() && status.is_some(), "the FIFO's writer did not finish");
}

#[test]
fn a_named_fifo_and_dev_stdin_are_read_once_like_files() {
    let dir = TempDir::new("fifo");
    let (width, height) = (21, 13);
    let pixels = random_bytes(width * height * 3);
    let png = dir.path("in.png");
    image::RgbImage::from_raw(width as u32, height as u32, pixels.clone()).unwrap().save(&png).unwrap();
    let rgb = FrameFormat::new(width, height, PixelLayout::Rgb).unwrap();
    let format = FrameFormat::new(20, 10, PixelLayout::Yuv420).unwrap();
    let header = "YUV4MPEG2 W20 H10 F25:1 C420\n";
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let video = dir.path("in.y4m");
    std::fs::write(&video, y4m(header, &frames)).unwrap();

    // A FIFO without an extension: the first bytes tell what it holds, and it is opened once.
    let fifo = dir.path("pipe");
    mkfifo(&fifo);
    let writer = fifo_writer(&png, &fifo);
    let out = dir.path("from-fifo.png");
    let run = hetmem(&["filter", text(&fifo), text(&out)]);
    assert!(run.status.success(), "image through a FIFO: {}", stderr(&run));
    finished(writer);
    assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &default_kernel(), &pixels));

    let writer = fifo_writer(&video, &fifo);
    let out = dir.path("from-fifo.y4m");
    let run = hetmem(&["filter", text(&fifo), text(&out)]);
    assert!(run.status.success(), "video through a FIFO: {}", stderr(&run));
    finished(writer);
    assert_y4m_result(&std::fs::read(&out).unwrap(), header, format, &default_kernel(), &frames);

    // /dev/stdin on a pipe: a path to a stream, for an image and for video; `-` takes an
    // image too.
    let out = dir.path("from-stdin.png");
    let run = hetmem_with_stdin(&["filter", "/dev/stdin", text(&out)], std::fs::read(&png).unwrap());
    assert!(run.status.success(), "image on /dev/stdin: {}", stderr(&run));
    assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &default_kernel(), &pixels));
    let out = dir.path("from-dash.png");
    let run = hetmem_with_stdin(&["filter", "-", text(&out)], std::fs::read(&png).unwrap());
    assert!(run.status.success(), "image on -: {}", stderr(&run));
    assert_eq!(image::open(&out).unwrap().as_bytes(), blurred(rgb, &default_kernel(), &pixels));
    let run = hetmem_with_stdin(&["filter", "/dev/stdin", "-"], y4m(header, &frames));
    assert!(run.status.success(), "video on /dev/stdin: {}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
}

/// What a Ctrl-C test saw: hetmem's exit, its stdout and stderr, and the upstream's exit.
struct Interrupted {
    status: ExitStatus,
    stdout: Vec<u8>,
    errors: String,
    upstream: ExitStatus,
}

/// A terminal pipeline, `upstream | hetmem filter - -`, in a process group of its own:
/// upstream writes `stream` and then waits (as a live encoder would). Once `whole` frames of
/// `frame_bytes` have come out of hetmem, Ctrl-C: SIGINT to the whole group, as a terminal
/// sends it, so the upstream dies where it stands.
fn ctrl_c_in_a_pipeline(
    name: &str,
    stream: &[u8],
    header: &str,
    whole: usize,
    frame_bytes: usize,
) -> Interrupted {
    let dir = TempDir::new(name);
    let file = dir.path("stream.y4m");
    std::fs::write(&file, stream).unwrap();
    let mut upstream = Command::new("sh");
    upstream
        .args(["-c", "cat \"$0\"; exec sleep 60", text(&file)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0);
    // A test run started in the background of a script (`cmd &`) ignores SIGINT, and so would
    // the upstream, which a shell cannot undo: it would sleep its minute out instead of dying.
    // SAFETY: between fork and exec the closure only calls sigaction, which is async-signal-safe,
    // and allocates nothing.
    unsafe {
        upstream.pre_exec(|| {
            nix::sys::signal::signal(nix::sys::signal::Signal::SIGINT, nix::sys::signal::SigHandler::SigDfl)
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let mut upstream = upstream.spawn().expect("start the upstream");
    let group = upstream.id();
    let mut child = command(&["filter", "-", "-"])
        .stdin(upstream.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(group as i32)
        .spawn()
        .expect("start hetmem");
    let mut stdout = child.stdout.take().unwrap();
    let mut got = vec![0u8; header.len() + whole * (frame_bytes + 6)];
    stdout.read_exact(&mut got).unwrap();
    // Ctrl-C only once the upstream is the waiting encoder (`sleep`, by `exec` under the same
    // pid): a SIGINT while `sh` is still between `cat` and `exec` can end it by an exit code
    // rather than the signal, on a loaded machine.
    let comm = format!("/proc/{group}/comm");
    let waited = std::time::Instant::now();
    while !std::fs::read_to_string(&comm).is_ok_and(|name| name.trim() == "sleep") {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(20),
            "the upstream never reached its sleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let kill = Command::new("kill").args(["-INT", "--", &format!("-{group}")]).status().unwrap();
    assert!(kill.success());
    stdout.read_to_end(&mut got).unwrap();
    let mut errors = String::new();
    child.stderr.take().unwrap().read_to_string(&mut errors).unwrap();
    Interrupted { status: child.wait().unwrap(), stdout: got, errors, upstream: upstream.wait().unwrap() }
}

/// Ctrl-C while the upstream is inside a frame: it dies mid-frame, hetmem ends with 130 and
/// the notice, every whole frame written, and the cut one named (not a whole frame: not
/// written, and no error either).
#[test]
fn ctrl_c_in_a_pipeline_whose_writer_dies_mid_frame_ends_with_130_and_every_whole_frame() {
    let format = FrameFormat::new(64, 32, PixelLayout::Yuv420).unwrap();
    let header = "YUV4MPEG2 W64 H32 F25:1 C420\n";
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let mut stream = y4m(header, &frames);
    let half = format.frame_bytes() / 2;
    stream.truncate(stream.len() - format.frame_bytes() + half);
    let seen = ctrl_c_in_a_pipeline("ctrl-c-cut", &stream, header, 2, format.frame_bytes());
    assert_eq!(seen.upstream.signal(), Some(2), "the upstream died of SIGINT");
    assert_eq!(seen.status.code(), Some(130), "{}", seen.errors);
    assert!(seen.errors.contains("interrupted (Ctrl-C)"), "{}", seen.errors);
    assert!(seen.errors.contains("all 2 whole frames read were filtered and written"), "{}", seen.errors);
    let cut = format!("inside frame 2 (counting from 0), after {half} of its {} bytes", format.frame_bytes());
    assert!(seen.errors.contains(&cut) && seen.errors.contains("not written"), "{}", seen.errors);
    assert!(!seen.errors.contains("error"), "{}", seen.errors);
    assert_y4m_result(&seen.stdout, header, format, &default_kernel(), &frames[..2]);
}

/// Ctrl-C while the upstream waits between frames: it closes the pipe at a frame's end.
#[test]
fn ctrl_c_in_a_pipeline_whose_writer_stops_between_frames_ends_with_130() {
    let format = FrameFormat::new(48, 16, PixelLayout::Gray).unwrap();
    let header = "YUV4MPEG2 W48 H16 F25:1 Cmono\n";
    let frames: Vec<Vec<u8>> = (0..2).map(|_| random_bytes(format.frame_bytes())).collect();
    let seen = ctrl_c_in_a_pipeline("ctrl-c-whole", &y4m(header, &frames), header, 2, format.frame_bytes());
    assert_eq!(seen.status.code(), Some(130), "{}", seen.errors);
    assert!(seen.errors.contains("all 2 whole frames read were filtered and written"), "{}", seen.errors);
    assert!(!seen.errors.contains("inside frame") && !seen.errors.contains("error"), "{}", seen.errors);
    assert_y4m_result(&seen.stdout, header, format, &default_kernel(), &frames);
}

/// Ctrl-C reaches hetmem alone; its writer then closes the pipe mid-frame (a writer that
/// finishes what it has and leaves) rather than dying: the same ending. And when the reader
/// of hetmem's output has gone too, hetmem still says it was interrupted, and exits 130.
#[test]
fn ctrl_c_then_a_closed_input_or_output_still_ends_with_130_and_the_notice() {
    let format = FrameFormat::new(32, 16, PixelLayout::Yuv444).unwrap();
    let header = "YUV4MPEG2 W32 H16 F25:1 C444\n";
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(format.frame_bytes())).collect();
    let whole = y4m(header, &frames);
    let (first, last) = whole.split_at(whole.len() - format.frame_bytes() / 3);
    let sent_back = header.len() + 2 * (format.frame_bytes() + 6);
    for close_output in [false, true] {
        let mut child = spawn(&["filter", "-", "-"]);
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        stdin.write_all(first).unwrap();
        stdin.flush().unwrap();
        let mut got = vec![0u8; sent_back];
        stdout.read_exact(&mut got).unwrap();
        // The reader of hetmem's output goes away, or stays to the end.
        child.stdout = (!close_output).then_some(stdout);
        let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        if close_output {
            // Frame 2 completed after Ctrl-C: hetmem writes it into the closed pipe.
            stdin.write_all(last).unwrap();
            drop(stdin);
        } else {
            drop(stdin);
        }
        let run = child.wait_with_output().unwrap();
        let errors = stderr(&run);
        assert_eq!(run.status.code(), Some(130), "close output {close_output}: {errors}");
        assert!(!errors.contains("error"), "{errors}");
        if close_output {
            assert!(
                errors.contains("stdout was closed by its reader after 2 frames were written"),
                "{errors}"
            );
        } else {
            let cut =
                format!("inside frame 2 (counting from 0), after {} of its", format.frame_bytes() * 2 / 3);
            assert!(errors.contains("all 2 whole frames read") && errors.contains(&cut), "{errors}");
            got.extend_from_slice(&run.stdout);
            assert_y4m_result(&got, header, format, &default_kernel(), &frames[..2]);
        }
    }
}
