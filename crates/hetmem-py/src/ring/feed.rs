//! `FrameFile`: a video file, FIFO or stdin opened for a ring (`FrameRing.feed` and `map_file`
//! in the Python half), its frames read one at a time straight into the ring's input slots by
//! hetmem-media's readers, the ones `hetmem filter` uses: no intermediate buffer, a regular
//! file's large frames by several threads at once, the interpreter let go while a read waits.
//!
//! The file is opened once and read front to back (hetmem-media's `Input`), so a FIFO or `-`
//! works as a file does. Its format is told by its first bytes (Y4M) or given (`raw`: frames of
//! the ring's size back to back; `raw:WxH:pix_fmt`: ffmpeg's raw video, checked). What the file
//! says a frame is (`shapes`, `typestr`) is checked against the ring's by the Python half
//! before any frame is read; `read_into` checks the slot's size again, so a mismatch never
//! reads past a slot whoever calls it.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use hetmem::ops::gaussian::{FrameFormat, PixelLayout, SampleType};
use hetmem_media::frames::read_start;
use hetmem_media::{Container, Endpoint, FrameSource, Input, Interrupt, Named, Packing, Start, raw, y4m};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use super::holds::InputHold;
use crate::HetmemError;
use crate::size::Int;

/// What `format=` takes, for messages.
const FORMATS: &str = "None (told by the first bytes: Y4M), 'y4m', 'raw' (headerless frames of the ring's \
                       size, back to back) or 'raw:WxH:pix_fmt' (ffmpeg's -f rawvideo; pix_fmt one of gray, \
                       rgb24, yuv420p, nv12)";

/// The open input and where its reading stands.
struct Reading {
    frames: FrameSource,
    container: Container,
    packing: Packing,
    frame_bytes: usize,
    /// The next frame's index in the file, counting from 0.
    next: u64,
    /// What comes before a frame (a Y4M `FRAME` line), reused from frame to frame.
    line: Vec<u8>,
    /// nv12's chroma, de-interleaved into the slot as it is read.
    scratch: Vec<u8>,
    /// Whether a frame's reading has begun (its FRAME line or bytes taken).
    started: bool,
}

/// A reading that ends before its first frame (the ring's geometry refused, a ring closed)
/// puts its Y4M header back with the rest, so that stdin's next reader starts at the header.
impl Drop for Reading {
    fn drop(&mut self) {
        if !self.started
            && let Container::Y4m { header } = &self.container
        {
            let header = header.clone();
            self.frames.unread(&header);
        }
    }
}

/// A video input opened for a ring; see the module's documentation.
#[pyclass(frozen, module = "hetmem._native")]
pub struct FrameFile {
    /// `None` once the input ended, failed or was closed: a file is read once.
    reading: Mutex<Option<Reading>>,
    /// Frames read whole so far (kept once the reading ends).
    frames_read: AtomicU64,
    name: String,
    description: String,
    frame_bytes: usize,
    /// The ring shapes a frame of the file fills, the natural one first; `None` for `raw`,
    /// whose frames are the ring's whatever its shape.
    shapes: Option<Vec<Vec<usize>>>,
    /// The NumPy type string of the file's samples; `None` for `raw`.
    typestr: Option<&'static str>,
    /// The exception a signal handler raised while a read of a pipe waited (Ctrl-C), which
    /// ended the read: raised in its place.
    raised: Arc<Mutex<Option<PyErr>>>,
}

/// Asked while a read of a pipe waits for bytes: runs the interpreter's signal handlers, and
/// ends the read when one raises (its exception kept in `raised`). Only the main thread runs
/// them, so a read on another thread still waits for its bytes.
fn signal_check(raised: &Arc<Mutex<Option<PyErr>>>) -> Interrupt {
    let raised = Arc::clone(raised);
    Arc::new(move || match Python::attach(|py| py.check_signals()) {
        Ok(()) => Ok(()),
        Err(error) => {
            *lock(&raised) = Some(error);
            Err(io::Error::other("a signal handler raised while the read waited for bytes"))
        }
    })
}

impl std::fmt::Debug for FrameFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameFile").field("name", &self.name).field("description", &self.description).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// An error of reading `name` as Python raises it: an operating system's error as `OSError`
/// of its errno (`FileNotFoundError`, ...), anything else as `otherwise` makes it; the message
/// is the whole chain (which names the file).
fn py_error(error: &anyhow::Error, otherwise: fn(String) -> PyErr) -> PyErr {
    let message = format!("{error:#}");
    match error.chain().find_map(|cause| cause.downcast_ref::<io::Error>()) {
        Some(io) => match io.raw_os_error() {
            Some(code) => PyOSError::new_err((code, message)),
            None => PyOSError::new_err(message),
        },
        None => otherwise(message),
    }
}

fn value_error(message: String) -> PyErr {
    PyValueError::new_err(message)
}

fn hetmem_error(message: String) -> PyErr {
    HetmemError::new_err(message)
}

/// The ring shapes one frame of `format` fills exactly, its planes one after another: the
/// picture's own shape where the planes stack into one (`(H, W)` gray, `(H, W, 3)` RGB,
/// `(3, H, W)` 4:4:4, `(H * 3 / 2, W)` 4:2:0 and `(2 * H, W)` 4:2:2 of even sides, as OpenCV
/// and ffmpeg lay out I420), then the flat frame of samples.
fn ring_shapes(format: &FrameFormat) -> Vec<Vec<usize>> {
    // A `FrameFormat`'s sides are at most 2^16 (checked when it was made), so these products
    // cannot overflow.
    let (width, height) = (format.width(), format.height());
    let samples = format.frame_bytes() / format.sample().bytes();
    let even = width % 2 == 0 && height % 2 == 0;
    let picture = match format.layout() {
        PixelLayout::Gray => Some(vec![height, width]),
        PixelLayout::Rgb => Some(vec![height, width, 3]),
        PixelLayout::Rgba => Some(vec![height, width, 4]),
        PixelLayout::Yuv444 => Some(vec![3, height, width]),
        PixelLayout::Yuv420 if even => Some(vec![height / 2 * 3, width]),
        PixelLayout::Yuv422 if width % 2 == 0 => Some(vec![2 * height, width]),
        PixelLayout::Yuv420 | PixelLayout::Yuv422 => None,
    };
    picture.into_iter().chain([vec![samples]]).collect()
}

fn typestr_of(sample: SampleType) -> &'static str {
    match sample {
        SampleType::U8 => "|u1",
        // Y4M's and ffmpeg's 9- to 16-bit samples are little-endian words.
        SampleType::U16 => "<u2",
    }
}

/// `format=` as given.
enum Format {
    /// Y4M, told by the first bytes or named.
    Y4m { named: bool },
    /// Frames of the ring's size back to back.
    RingSized,
    /// ffmpeg's raw video of a declared size and pixel format.
    Raw(raw::RawSpec),
}

fn parse_format(format: Option<&str>) -> PyResult<Format> {
    let bad = |why: String| {
        let given = format.unwrap_or_default();
        PyValueError::new_err(format!("format='{given}': {why}; give {FORMATS}"))
    };
    Ok(match format.map(str::trim) {
        None | Some("auto") => Format::Y4m { named: false },
        Some(name) if name.eq_ignore_ascii_case("y4m") => Format::Y4m { named: true },
        Some(name) if name.eq_ignore_ascii_case("raw") => Format::RingSized,
        Some(name) => match name.split_once(':') {
            Some((kind, spec)) if kind.eq_ignore_ascii_case("raw") => {
                Format::Raw(raw::parse_spec(spec).map_err(bad)?)
            }
            _ => return Err(bad("not a format hetmem reads".into())),
        },
    })
}

/// Whether `path` names a FIFO, whose open waits for a writer.
fn is_fifo(path: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_fifo())
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// How often a FIFO's open, waiting for its writer, looks for Ctrl-C.
const FIFO_SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Opens a FIFO on a thread of its own while the calling thread hears Ctrl-C: opening a
/// FIFO's read end waits in open(2) for a writer, which a signal does not end. When a signal
/// handler raises, the waiting open is released (this process opens the write end, without
/// waiting, and closes it at once: the opener then reads an empty stream, and its result is
/// dropped) and the handler's exception is raised.
fn open_fifo(
    py: Python<'_>,
    path: &std::path::Path,
    endpoint: Endpoint,
    name: String,
    format: Format,
    ring_frame_bytes: usize,
) -> PyResult<anyhow::Result<FrameFile>> {
    let (send, receive) = mpsc::channel();
    // Behind a lock only to be waited on with the interpreter let go (a receiver is not Sync).
    let receive = Mutex::new(receive);
    let opener = std::thread::Builder::new()
        .name("hetmem-fifo-open".into())
        .spawn(move || {
            let _ = send.send(open(&endpoint, &name, format, ring_frame_bytes, None));
        })
        .map_err(|error| PyOSError::new_err(format!("cannot start a thread to open the FIFO: {error}")))?;
    loop {
        match py.detach(|| lock(&receive).recv_timeout(FIFO_SIGNAL_CHECK)) {
            Ok(opened) => {
                let _ = opener.join();
                return Ok(opened);
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Ok(Err(anyhow!("{}: its open failed (the opening thread ended)", path.display())));
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Err(raised) = py.check_signals() {
            release_fifo_open(path);
            // The opener ends once released; a writer that came meanwhile may hold it up (it
            // then ends with that writer's first bytes), so it is not waited for past a moment.
            let _ = py.detach(|| lock(&receive).recv_timeout(Duration::from_secs(1)));
            return Err(raised);
        }
    }
}

/// Lets an open of `path`'s read end that waits for a writer go on: a writer that opens and
/// closes at once (without waiting: there is a reader). Nothing to do if none waits.
fn release_fifo_open(path: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let nonblocking = rustix::fs::OFlags::NONBLOCK.bits() as i32;
        let _ = std::fs::OpenOptions::new().write(true).custom_flags(nonblocking).open(path);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Which frames went into the ring before frame `index`, for messages.
fn fed_before(index: u64) -> String {
    match index {
        0 => "no frame of it went into the ring".into(),
        1 => "frame 0 went into the ring before, and its result comes out as usual".into(),
        _ => format!(
            "frames 0 to {} went into the ring before, and their results come out as usual",
            index - 1
        ),
    }
}

/// Opens `endpoint` and reads what comes before its frames; its reads of a pipe ask
/// `interrupt` while they wait (the header's too, where it is given now).
fn open(
    endpoint: &Endpoint,
    name: &str,
    format: Format,
    ring_frame_bytes: usize,
    interrupt: Option<(Interrupt, Arc<Mutex<Option<PyErr>>>)>,
) -> anyhow::Result<FrameFile> {
    let (interrupt, raised) = match interrupt {
        Some((interrupt, raised)) => (Some(interrupt), raised),
        None => (None, Arc::new(Mutex::new(None))),
    };
    let input = Input::open(endpoint, name, hetmem_media::default_threads())?;
    let into_frames = |input: Input| {
        let mut frames = input.into_frames();
        if let Some(interrupt) = &interrupt {
            frames.set_interrupt(Arc::clone(interrupt));
        }
        frames
    };
    if input.head.is_empty() {
        bail!("{name} is empty: it holds no frame");
    }
    let is_y4m = input.head.starts_with(y4m::MAGIC);
    let (frames, container, description, shapes, typestr, frame_bytes) = match format {
        Format::Y4m { named } => {
            if !is_y4m {
                let shown = input.head[..input.head.len().min(16)].escape_ascii().to_string();
                let mid_stream = input.head.starts_with(y4m::FRAME);
                // What was read goes back with the rest, for stdin's next reader.
                drop(input.into_frames());
                if mid_stream {
                    bail!(
                        "{name}: starts with a Y4M frame line, not a header: an earlier feed of it read the \
                         header, which a second feed cannot find; feed a Y4M stream on stdin once, whole \
                         (without limit=)"
                    );
                }
                let why =
                    if named { "format='y4m' was given" } else { "its format is told by its first bytes" };
                bail!(
                    "{name}: not a Y4M stream ({why}): it starts with \"{shown}\" instead of YUV4MPEG2; for \
                     headerless raw frames give format='raw' (frames of the ring's size) or \
                     format='raw:WxH:pix_fmt'"
                );
            }
            let mut frames = into_frames(input);
            let video = y4m::read_header(&mut frames, name)?;
            let format = video.format;
            let description = format!(
                "{}x{} {} Y4M ({}-bit samples, {} bytes a frame)",
                format.width(),
                format.height(),
                video.pixels,
                format.sample().bits(),
                format.frame_bytes()
            );
            (
                frames,
                video.container,
                description,
                Some(ring_shapes(&format)),
                Some(typestr_of(format.sample())),
                format.frame_bytes(),
            )
        }
        Format::RingSized | Format::Raw(_) if is_y4m => {
            drop(input.into_frames()); // what was read goes back, for stdin's next reader
            bail!("{name} is a Y4M stream, not raw video: leave format= out (the Y4M header gives the size)")
        }
        Format::RingSized => (
            into_frames(input),
            Container::Raw { packing: Packing::Planar },
            format!("raw frames of the ring's size ({ring_frame_bytes} bytes a frame)"),
            None,
            None,
            ring_frame_bytes,
        ),
        Format::Raw(spec) => {
            let video = raw::video(spec)?;
            let format = video.format;
            let description = format!("raw {spec} ({} bytes a frame in the ring)", format.frame_bytes());
            (
                into_frames(input),
                video.container,
                description,
                Some(ring_shapes(&format)),
                Some(typestr_of(format.sample())),
                format.frame_bytes(),
            )
        }
    };
    let packing = container.packing();
    let reading = Reading {
        frames,
        container,
        packing,
        frame_bytes,
        next: 0,
        line: Vec::with_capacity(64),
        scratch: Vec::new(),
        started: false,
    };
    Ok(FrameFile {
        reading: Mutex::new(Some(reading)),
        frames_read: AtomicU64::new(0),
        name: name.to_string(),
        description,
        frame_bytes,
        shapes,
        typestr,
        raised,
    })
}

impl Reading {
    /// Reads the next frame into `slot`: true when one was read whole, false at the input's
    /// clean end.
    fn read_into(&mut self, slot: &mut [u8], name: &str) -> anyhow::Result<bool> {
        self.started = true;
        let index = self.next;
        let before = fed_before(index);
        match read_start(&self.container, &mut self.frames, &mut self.line, index, name, &before)? {
            Start::Frame => {}
            Start::End => return Ok(false),
            Start::Cut(error) => return Err(error),
        }
        let frame_bytes = self.frame_bytes;
        let read = self
            .packing
            .read(&mut self.frames, slot, &mut self.scratch)
            .with_context(|| format!("cannot read frame {index} (counting from 0) of {name}; {before}"))?;
        if read < frame_bytes {
            let hint = match self.container {
                Container::Y4m { .. } => "",
                Container::Raw { .. } => " (raw video is whole frames of the size format= gives: check it)",
            };
            return Err(anyhow!(
                "{name}: frame {index} (counting from 0) is truncated: the stream ends after {read} of its \
                 {frame_bytes} bytes{hint}; {before}"
            ));
        }
        self.next += 1;
        Ok(true)
    }
}

#[pymethods]
impl FrameFile {
    /// Opens `path` (`-`: stdin) as video of `format` (see `FORMATS`) for a ring whose frames
    /// are `frame_bytes` bytes, waiting (the interpreter let go) for a FIFO's writer and the
    /// stream's header; Ctrl-C ends either wait. Later reads of a pipe that wait for bytes hear
    /// Ctrl-C too (on the main thread).
    #[new]
    #[pyo3(signature = (path, format, frame_bytes))]
    fn new(py: Python<'_>, path: PathBuf, format: Option<&str>, frame_bytes: Int) -> PyResult<FrameFile> {
        let ring_frame_bytes = frame_bytes.size("frame_bytes")?;
        let format = parse_format(format)?;
        let endpoint = Endpoint::new(&path);
        let name = Named { endpoint: &endpoint, std_name: "stdin" }.to_string();
        let raised = Arc::new(Mutex::new(None));
        let opened = if is_fifo(&path) {
            // Its own thread waits for the writer, where signal handlers do not run: the FIFO's
            // reads hear Ctrl-C from when it is open.
            open_fifo(py, &path, endpoint, name, format, ring_frame_bytes)?.map(|mut file| {
                if let Some(reading) = lock(&file.reading).as_mut() {
                    reading.frames.set_interrupt(signal_check(&raised));
                }
                file.raised = Arc::clone(&raised);
                file
            })
        } else {
            let interrupt = (signal_check(&raised), Arc::clone(&raised));
            py.detach(|| open(&endpoint, &name, format, ring_frame_bytes, Some(interrupt)))
        };
        let handled = lock(&raised).take();
        match (opened, handled) {
            (_, Some(raised)) => Err(raised),
            (opened, None) => opened.map_err(|error| py_error(&error, value_error)),
        }
    }

    /// Reads the next frame straight into `hold`'s slot, the interpreter let go: True when a
    /// whole frame was read, False at the input's end (the slot then holds nothing of it).
    /// A truncated or corrupt frame, or a failed read, raises (naming the file and the frame)
    /// and ends the reading; the frames read before it are the caller's, whole. So does Ctrl-C
    /// while a pipe's read waits for bytes (on the main thread), raising KeyboardInterrupt.
    fn read_into(&self, py: Python<'_>, hold: &Bound<'_, InputHold>) -> PyResult<bool> {
        let mut hold = hold.try_borrow_mut()?;
        let slot = hold.bytes()?;
        if slot.len() != self.frame_bytes {
            return Err(PyValueError::new_err(format!(
                "{}: its frames are {} bytes ({}), the ring's slot {} bytes: make the ring for the file's frames",
                self.name,
                self.frame_bytes,
                self.description,
                slot.len()
            )));
        }
        let name = &self.name;
        let read = py.detach(|| {
            let mut reading = lock(&self.reading);
            let Some(state) = reading.as_mut() else { return Ok(false) };
            let read = state.read_into(slot, name);
            if matches!(read, Ok(true)) {
                self.frames_read.store(state.next, Ordering::Release);
            } else {
                // Ended or failed: the input is let go now (a FIFO's writer sees it closed).
                *reading = None;
            }
            read
        });
        // Ctrl-C while the read waited for a pipe's bytes: its exception, the reading ended.
        if let Some(raised) = lock(&self.raised).take() {
            return Err(raised);
        }
        read.map_err(|error| py_error(&error, hetmem_error))
    }

    /// Lets the input go; reading it afterwards finds its end.
    fn close(&self, py: Python<'_>) {
        // Dropping a file may wait (a FIFO, a network file system): the interpreter let go.
        // Taken without the interpreter too: a read on another thread holds the lock meanwhile.
        py.detach(|| drop(lock(&self.reading).take()));
    }

    /// The input's name in messages: its path, or `stdin`.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// What the file says a frame is, for messages.
    #[getter]
    fn description(&self) -> &str {
        &self.description
    }

    /// Bytes a frame takes in the ring.
    #[getter]
    fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// The ring shapes one frame fills, the natural one first; None for `raw` (the ring's).
    #[getter]
    fn shapes(&self) -> Option<Vec<Vec<usize>>> {
        self.shapes.clone()
    }

    /// The NumPy type string of the samples; None for `raw` (the ring's).
    #[getter]
    fn typestr(&self) -> Option<&'static str> {
        self.typestr
    }

    /// Frames read whole so far.
    #[getter]
    fn frames_read(&self) -> u64 {
        self.frames_read.load(Ordering::Acquire)
    }
}
