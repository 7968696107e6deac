//! The two ends of a filter such as `hetmem filter`: the input, opened once, and the output,
//! checked not to be the input under another name before anything is written to it.
//!
//! An input is opened once and read front to back, never seeked and never opened again: its
//! first bytes tell its format and are then handed on with the rest. So pipes given as paths
//! (`/dev/stdin`, `<(...)`, a named FIFO) work as files do; opening such a path a second time
//! would wait for a writer that never comes, or lose what the first reader took.

use std::fmt;
use std::fs::{File, Metadata};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, anyhow, bail};

use crate::budget::{self, Budget};
use crate::frame_io::{FrameSource, PositionedFile, Source, Stream};

/// An input or output: a file, or `-` (stdin for the input, stdout for the output).
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `-`: stdin or stdout.
    Std,
    /// A path: a regular file, or a FIFO, `/dev/stdin`, a device.
    File(PathBuf),
}

impl Endpoint {
    /// `-` for stdin or stdout, anything else a path.
    pub fn new(path: &Path) -> Endpoint {
        if path.as_os_str() == "-" { Endpoint::Std } else { Endpoint::File(path.to_path_buf()) }
    }
}

/// How endpoints are named in messages: the path, or stdin/stdout for `-`.
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    /// What is named.
    pub endpoint: &'a Endpoint,
    /// The name of `-`: `stdin` or `stdout`.
    pub std_name: &'static str,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.endpoint {
            Endpoint::Std => f.write_str(self.std_name),
            Endpoint::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Enough bytes to tell every format hetmem reads (Y4M's magic is 9 bytes, PNG's 8).
const HEAD_BYTES: u64 = 16;
/// Reads from the input go through a buffer this large.
const BUFFER_BYTES: usize = 1 << 16;

/// Bytes an earlier reader of stdin took from a pipe and did not use (see `FrameSource`'s
/// Drop): the next reader of stdin takes them first.
static STDIN_LEFT: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Whether a reader of stdin is open in this process (an [`Input`] or the `FrameSource` made
/// from it): two at once would take each other's bytes.
static STDIN_BUSY: AtomicBool = AtomicBool::new(false);

/// This process's one open reader of stdin; let go when dropped.
#[derive(Debug)]
pub(crate) struct StdinClaim(());

impl StdinClaim {
    /// The claim, or an error when another reader of stdin is still open.
    pub(crate) fn take() -> io::Result<StdinClaim> {
        if STDIN_BUSY.swap(true, Ordering::AcqRel) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "stdin is being read already (an earlier feed or map_file of \"-\" still open): finish or close \
                 that one first",
            ));
        }
        Ok(StdinClaim(()))
    }
}

impl Drop for StdinClaim {
    fn drop(&mut self) {
        STDIN_BUSY.store(false, Ordering::Release);
    }
}

/// Keeps `bytes`, taken from stdin (a pipe) and not used, for its next reader.
pub(crate) fn keep_stdin_bytes(bytes: Vec<u8>) {
    // Two readers of one stdin at once interleave whatever is done here; one after another,
    // the last reader's leftover is the stream's next bytes.
    *STDIN_LEFT.lock().unwrap_or_else(|poison| poison.into_inner()) = bytes;
}

pub(crate) fn take_stdin_bytes() -> Vec<u8> {
    std::mem::take(&mut *STDIN_LEFT.lock().unwrap_or_else(|poison| poison.into_inner()))
}

/// An input, opened once, with its first bytes already read to tell its format.
pub struct Input {
    /// At least the first 16 bytes (enough to tell every format read here), fewer only when
    /// the input is shorter (more for stdin where an earlier reader left some unused).
    pub head: Vec<u8>,
    rest: BufReader<Source>,
    /// What was opened, as `fstat` sees it; `None` where that cannot be asked.
    metadata: Option<Metadata>,
    /// Held while it reads stdin (`-`).
    stdin: Option<StdinClaim>,
}

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.head[..self.head.len().min(HEAD_BYTES as usize)];
        f.debug_struct("Input").field("head", &shown).field("metadata", &self.metadata).finish()
    }
}

impl Input {
    /// Opens `endpoint` (named `name` in messages) and reads its first bytes; a regular file's
    /// frames are read by up to `io_threads` threads. A FIFO waits
    /// here for its writer, as any reader of it does.
    ///
    /// # Errors
    /// It cannot be opened or read, or it is a directory.
    pub fn open(endpoint: &Endpoint, name: &str, io_threads: usize) -> anyhow::Result<Input> {
        let claim = match endpoint {
            Endpoint::Std => Some(StdinClaim::take().context("cannot read stdin")?),
            Endpoint::File(_) => None,
        };
        let (reader, metadata) = match endpoint {
            Endpoint::Std => stdin(io_threads).context("cannot read stdin")?,
            Endpoint::File(path) => {
                let file = File::open(path).with_context(|| format!("cannot open {name}"))?;
                let metadata = file.metadata().with_context(|| format!("cannot read {name}"))?;
                if metadata.is_dir() {
                    bail!("{name} is a directory: give an image or video file");
                }
                // A FIFO, /dev/stdin on a pipe or a character device is read as the stream it
                // is: only a regular file can be read by position.
                let source = if metadata.is_file() {
                    Source::File(PositionedFile::new(file, 0, io_threads))
                } else {
                    Source::Stream(Stream::of_file(file))
                };
                (source, Some(metadata))
            }
        };
        let mut rest = BufReader::with_capacity(BUFFER_BYTES, reader);
        // What an earlier reader of stdin left unused comes first.
        let mut head = if claim.is_some() { take_stdin_bytes() } else { Vec::new() };
        let wanted = HEAD_BYTES.saturating_sub(head.len() as u64);
        // `take` + `read_to_end` waits out short reads: a pipe may hand over a byte at a time.
        (&mut rest).take(wanted).read_to_end(&mut head).with_context(|| format!("cannot read {name}"))?;
        Ok(Input { head, rest, metadata, stdin: claim })
    }

    /// The input's length, when it is a regular file (a pipe's is unknown until its end).
    pub fn file_len(&self) -> Option<u64> {
        self.metadata.as_ref().filter(|metadata| metadata.is_file()).map(Metadata::len)
    }

    /// The whole input as one stream of frames: the first bytes, then the rest.
    pub fn into_frames(self) -> FrameSource {
        FrameSource::new(self.head, self.rest, self.stdin)
    }

    /// Reads the whole input into memory, where images are decoded from: at most what an
    /// image within the budget's pixel cap can take, each allocation checked.
    ///
    /// # Errors
    /// A read failing, an input larger than that, or no memory for it.
    pub fn read_all(self, budget: &Budget, name: &str) -> anyhow::Result<Vec<u8>> {
        let limit = budget.max_encoded_bytes();
        let too_large = |at_least: u64| {
            anyhow!(
                "{name} holds {at_least} bytes or more, more than an image within --max-pixels {} can take \
                 ({limit} bytes): pass a larger --max-pixels if the image is genuine",
                budget.max_pixels()
            )
        };
        let what = format!("reading {name}");
        let file_len = self.file_len();
        let Input { head: mut bytes, mut rest, .. } = self;
        if let Some(len) = file_len {
            if len > limit {
                return Err(too_large(len));
            }
            // The whole file, and a byte more so that its end is seen without growing.
            let more = (len as usize + 1).saturating_sub(bytes.len());
            budget::reserve(&mut bytes, more, &what)?;
        }
        loop {
            if bytes.len() == bytes.capacity() {
                budget::reserve(&mut bytes, BUFFER_BYTES, &what)?;
            }
            let start = bytes.len();
            bytes.resize(bytes.capacity(), 0);
            let read = rest.read(&mut bytes[start..]);
            bytes.truncate(start + read.as_ref().map_or(0, |&read| read));
            match read {
                Ok(0) => return Ok(bytes),
                Ok(_) if bytes.len() as u64 > limit => return Err(too_large(bytes.len() as u64)),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error).with_context(|| format!("cannot read {name}")),
            }
        }
    }

    /// Refuses an `output` that is this input under another name: the same path, a hard or
    /// symbolic link to it, or stdout redirected into it. Writing it would destroy the input
    /// before it is read, so this is asked before the output is opened, by device and inode
    /// (paths can alias in too many ways to compare).
    ///
    /// # Errors
    /// The output is the input.
    pub fn refuse_as_output(
        &self,
        output: &Endpoint,
        input_name: &str,
        output_name: &str,
    ) -> anyhow::Result<()> {
        let Some(input) = &self.metadata else {
            return Ok(());
        };
        let output_metadata = match output {
            // Not there yet: a new file, not the input.
            Endpoint::File(path) => std::fs::metadata(path).ok(),
            Endpoint::Std => stdout_metadata(),
        };
        if output_metadata.is_some_and(|output| same_file(input, &output)) {
            bail!(
                "{output_name} is the same file as {input_name} (under another name, or through a link): \
                 writing it would overwrite the input while it is read; write the result to another file"
            );
        }
        Ok(())
    }
}

/// Whether two regular files are one: the same device and inode.
#[cfg(unix)]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // Regular files only: one terminal, or /dev/null, may well be both stdin and stdout.
    a.is_file() && b.is_file() && a.dev() == b.dev() && a.ino() == b.ino()
}

/// A descriptor of stdin or stdout as a file of its own: read or written through our buffer
/// alone (std's stdin adds a buffer, its stdout flushes at every `\n` byte, which would split
/// frames), and open to `fstat`.
#[cfg(unix)]
fn duplicate(fd: impl std::os::fd::AsFd) -> io::Result<File> {
    Ok(File::from(fd.as_fd().try_clone_to_owned()?))
}

/// stdin: by position from where it stands when it is a regular file (`< in.y4m`), front to
/// back otherwise.
#[cfg(unix)]
fn stdin(io_threads: usize) -> io::Result<(Source, Option<Metadata>)> {
    use std::io::Seek as _;
    let mut file = duplicate(io::stdin())?;
    let metadata = file.metadata()?;
    let source = if metadata.is_file() {
        let position = file.stream_position()?;
        Source::File(PositionedFile::new(file, position, io_threads))
    } else {
        Source::Stream(Stream::of_file(file))
    };
    Ok((source, Some(metadata)))
}

#[cfg(unix)]
fn stdout_metadata() -> Option<Metadata> {
    duplicate(io::stdout()).and_then(|file| file.metadata()).ok()
}

/// stdout, for a video: written through the caller's buffer alone (std's stdout flushes at
/// every `\n` byte, which would split frames).
///
/// # Errors
/// stdout cannot be duplicated.
#[cfg(unix)]
pub fn stdout() -> io::Result<Box<dyn Write + Send>> {
    Ok(Box::new(duplicate(io::stdout())?))
}

// Elsewhere std's handles, and no file identity to compare.
#[cfg(not(unix))]
fn same_file(_: &Metadata, _: &Metadata) -> bool {
    false
}

#[cfg(not(unix))]
fn stdin(_io_threads: usize) -> io::Result<(Source, Option<Metadata>)> {
    Ok((Source::Stream(Stream::plain(Box::new(io::stdin()))), None))
}

#[cfg(not(unix))]
fn stdout_metadata() -> Option<Metadata> {
    None
}

/// stdout, for a video.
///
/// # Errors
/// None here; the signature is the Unix one's.
#[cfg(not(unix))]
pub fn stdout() -> io::Result<Box<dyn Write + Send>> {
    Ok(Box::new(io::stdout()))
}
