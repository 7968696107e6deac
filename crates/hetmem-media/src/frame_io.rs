//! How a video's frames leave the input and reach the output: straight between the file and
//! the ring's frame memory, split over several threads where the endpoint is a regular file.
//!
//! An 8K 4:2:0 frame is 50 MB; at 60 frames/s that is 3 GB/s in and 3 GB/s out, more than one
//! thread copies between the page cache and memory (the single-threaded
//! reader and writer held 8K file to file at 42 frames/s while the GPU filtered 363). So a
//! regular file is read and written by position (`pread`/`pwrite`): each frame's bytes are
//! split into chunks that threads move at once, straight into (or out of) the ring's slot,
//! with no intermediate buffer. Frames still go one after another, in order: a frame is whole
//! in the output before the next one starts, so an error loses no frame written before it.
//!
//! Pipes, and anything else that cannot be read or written by position, go through a plain
//! sequential reader or writer, whose large requests bypass its buffer too. stdout stays
//! sequential even when it is a regular file: it may be opened for appending (`>>`), where a
//! positional write lands at the end whatever position it names.

use std::fs::File;
use std::io::{self, BufRead, BufWriter, Read, Write};
use std::sync::Arc;

/// Each thread moves at least this many bytes of a frame: smaller frames take fewer threads
/// (a 1080p frame one or two), for which a thread would cost more than it saves.
const BYTES_PER_THREAD: usize = 4 << 20;
/// The most threads one frame is split over unless `--io-threads` says otherwise: enough for
/// the page cache's copy rate to reach several times a single thread's (the H200 machine:
/// 7 GB/s for one `dd` thread), and no more than the machine has cores.
const MAX_THREADS: usize = 8;
/// Writes to a pipe go through a buffer this large; frames bypass it (a request larger than
/// the buffer goes straight to the pipe).
const WRITE_BUFFER_BYTES: usize = 1 << 16;

/// A source of frames: what comes between them is read line by line ([`BufRead`]), a frame's
/// samples by [`FrameRead::read_frame`].
pub trait FrameRead: BufRead {
    /// Fills `frame` unless the stream ends first; returns the bytes read.
    ///
    /// # Errors
    /// A read failing.
    fn read_frame(&mut self, frame: &mut [u8]) -> io::Result<usize> {
        read_full(self, frame)
    }
}

/// A stream in memory reads frames as any stream does.
impl FrameRead for &[u8] {}

/// Where frames go: what comes between them is written as any stream is ([`Write`]), a
/// frame's samples by [`FrameWrite::write_frame`].
pub trait FrameWrite: Write {
    /// Writes all of `frame`.
    ///
    /// # Errors
    /// A write failing.
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        self.write_all(frame)
    }
}

/// A stream in memory writes frames as any stream does.
impl FrameWrite for Vec<u8> {}

/// Fills `buf` unless the stream ends first; returns the bytes read.
pub(crate) fn read_full(reader: &mut (impl Read + ?Sized), buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// The threads a frame of a regular file is split over by default (`hetmem filter`'s
/// `--io-threads`): 8, or the cores if fewer.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.clamp(1, MAX_THREADS)
}

/// How many threads move `bytes` of one frame, at most `max`.
fn threads_for(bytes: usize, max: usize) -> usize {
    bytes.div_ceil(BYTES_PER_THREAD).min(max).max(1)
}

/// A regular file read or written at a position of its own (`pread`/`pwrite`), never its
/// descriptor's offset, so that several threads can move parts of one frame at once.
#[derive(Debug)]
pub(crate) struct PositionedFile {
    file: File,
    /// Where the next byte is read or written.
    position: u64,
    /// The most threads a frame is split over.
    threads: usize,
}

impl PositionedFile {
    /// `file`, read or written from `position` on, each frame by up to `threads` threads.
    pub(crate) fn new(file: File, position: u64, threads: usize) -> PositionedFile {
        PositionedFile { file, position, threads }
    }

    /// Fills `frame` from the file at the position, split over threads, unless the file ends
    /// first; returns the bytes read and moves the position past them.
    fn read_frame(&mut self, frame: &mut [u8]) -> io::Result<usize> {
        let chunk = frame.len().div_ceil(threads_for(frame.len(), self.threads)).max(1);
        let position = self.position;
        let file = &self.file;
        let counts: Vec<io::Result<usize>> = std::thread::scope(|scope| {
            let mut chunks = frame.chunks_mut(chunk).enumerate();
            // The first chunk on this thread, the others each on one of their own.
            let first = chunks.next();
            let others: Vec<_> = chunks
                .map(|(index, part)| {
                    let at = position + (index * chunk) as u64;
                    scope.spawn(move || read_at_full(file, part, at))
                })
                .collect();
            let mut counts = vec![first.map_or(Ok(0), |(_, part)| read_at_full(file, part, position))];
            counts.extend(
                others.into_iter().map(|thread| thread.join().expect("a read thread does not panic")),
            );
            counts
        });
        // Bytes up to the first short chunk: where the file ends.
        let mut read = 0;
        for (count, part_len) in counts.into_iter().zip(frame.chunks(chunk).map(<[u8]>::len)) {
            let count = count?;
            read += count;
            if count < part_len {
                break;
            }
        }
        self.position += read as u64;
        Ok(read)
    }

    /// Writes all of `frame` at the position, split over threads; moves the position past it.
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        let chunk = frame.len().div_ceil(threads_for(frame.len(), self.threads)).max(1);
        let position = self.position;
        let file = &self.file;
        std::thread::scope(|scope| {
            let mut chunks = frame.chunks(chunk).enumerate();
            let first = chunks.next();
            let others: Vec<_> = chunks
                .map(|(index, part)| {
                    let at = position + (index * chunk) as u64;
                    scope.spawn(move || write_at_all(file, part, at))
                })
                .collect();
            let mut written = first.map_or(Ok(()), |(_, part)| write_at_all(file, part, position));
            for thread in others {
                let result = thread.join().expect("a write thread does not panic");
                written = written.and(result);
            }
            written
        })?;
        self.position += frame.len() as u64;
        Ok(())
    }
}

impl PositionedFile {
    /// Sets the descriptor's own offset (shared with every descriptor duplicated from it) to
    /// `at`: reads here never move it.
    fn move_descriptor_to(&self, at: u64) -> io::Result<()> {
        use std::io::Seek as _;
        (&self.file).seek(io::SeekFrom::Start(at)).map(|_| ())
    }
}

impl Read for PositionedFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = read_at(&self.file, buf, self.position)?;
        self.position += read as u64;
        Ok(read)
    }
}

impl Write for PositionedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = write_at(&self.file, buf, self.position)?;
        self.position += written as u64;
        Ok(written)
    }

    /// Nothing is buffered: every write went to the file.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, at)
}

#[cfg(unix)]
fn write_at(file: &File, buf: &[u8], at: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::write_at(file, buf, at)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, at)
}

#[cfg(windows)]
fn write_at(file: &File, buf: &[u8], at: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_write(file, buf, at)
}

/// Fills `buf` from `file` at `at` unless the file ends first; returns the bytes read.
fn read_at_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match read_at(file, &mut buf[filled..], at + filled as u64) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Writes all of `buf` to `file` at `at`.
fn write_at_all(file: &File, buf: &[u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match write_at(file, &buf[done..], at + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => done += written,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Where an input's bytes come from after its first ones.
pub(crate) enum Source {
    /// A regular file, read by position: frames by several threads.
    File(PositionedFile),
    /// A pipe, a terminal, anything read front to back.
    Stream(Stream),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::File(file) => file.read(buf),
            Source::Stream(stream) => stream.read(buf),
        }
    }
}

/// Asked about every 50 ms while a read of a pipe waits for bytes ([`FrameSource::set_interrupt`]):
/// an error ends the read with it. (A caller's way to hear Ctrl-C while a writer stalls.)
pub type Interrupt = Arc<dyn Fn() -> io::Result<()> + Send + Sync>;

/// How long a read of a pipe waits between asking its [`Interrupt`].
const INTERRUPT_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// A stream read front to back, and, where it has one, a duplicate of its descriptor to wait
/// on, so that a read can ask its [`Interrupt`] while no bytes come.
pub(crate) struct Stream {
    reader: Box<dyn Read + Send>,
    #[cfg(unix)]
    waits_on: Option<std::os::fd::OwnedFd>,
    interrupt: Option<Interrupt>,
}

impl Stream {
    /// A stream with no descriptor to wait on: its reads block until bytes come.
    #[cfg(any(test, not(unix)))]
    pub(crate) fn plain(reader: Box<dyn Read + Send>) -> Stream {
        Stream {
            reader,
            #[cfg(unix)]
            waits_on: None,
            interrupt: None,
        }
    }

    /// `file` (a pipe, a FIFO, a terminal), whose reads can be interrupted while they wait.
    pub(crate) fn of_file(file: File) -> Stream {
        #[cfg(unix)]
        {
            use std::os::fd::AsFd as _;
            // Without a duplicate the reads still work, only not interruptibly.
            let waits_on = file.as_fd().try_clone_to_owned().ok();
            Stream { reader: Box::new(file), waits_on, interrupt: None }
        }
        #[cfg(not(unix))]
        Stream::plain(Box::new(file))
    }

    /// Waits until the descriptor has bytes (or its end, or an error, which the read then
    /// reports), asking the interrupt between waits.
    #[cfg(unix)]
    fn wait_for_bytes(&self) -> io::Result<()> {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let (Some(fd), Some(interrupt)) = (&self.waits_on, &self.interrupt) else { return Ok(()) };
        let every = Timespec { tv_sec: 0, tv_nsec: INTERRUPT_EVERY.as_nanos() as _ };
        loop {
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            match poll(&mut fds, Some(&every)) {
                Ok(0) | Err(rustix::io::Errno::INTR) => interrupt()?,
                Ok(_) => return Ok(()),
                Err(error) => return Err(error.into()),
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(unix)]
        self.wait_for_bytes()?;
        self.reader.read(buf)
    }
}

/// An input read as video ([`Input::into_frames`](crate::Input::into_frames)): its first bytes
/// (read already, to tell its format), then the rest through a buffer for the lines between
/// frames; frames skip that buffer, and a regular file's go straight from the file into the
/// frame, by several threads at once.
pub struct FrameSource {
    stream: io::Chain<io::Cursor<Vec<u8>>, io::BufReader<Source>>,
    /// Held when this reads stdin, whose unused bytes are handed back when it goes (see Drop).
    stdin: Option<crate::endpoint::StdinClaim>,
}

impl std::fmt::Debug for FrameSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameSource").finish_non_exhaustive()
    }
}

impl FrameSource {
    /// `head`, then what `rest` holds; `stdin` held when it reads stdin.
    pub(crate) fn new(
        head: Vec<u8>,
        rest: io::BufReader<Source>,
        stdin: Option<crate::endpoint::StdinClaim>,
    ) -> FrameSource {
        FrameSource { stream: io::Cursor::new(head).chain(rest), stdin }
    }

    /// Makes reads of a stream (a pipe, a FIFO, a terminal: not a regular file, which never
    /// waits) ask `interrupt` about every 50 ms while no bytes come; its error ends the read.
    pub fn set_interrupt(&mut self, interrupt: Interrupt) {
        let (_, rest) = self.stream.get_mut();
        if let Source::Stream(stream) = rest.get_mut() {
            stream.interrupt = Some(interrupt);
        }
    }

    /// Puts `bytes` back in front of what is still to be read: a reader that read a stream's
    /// header and then stopped before its first frame hands the header back with the rest
    /// (for stdin, whose next reader then starts at the header again).
    pub fn unread(&mut self, bytes: &[u8]) {
        let (head, _) = self.stream.get_mut();
        let from = usize::try_from(head.position()).unwrap_or(usize::MAX).min(head.get_ref().len());
        let mut front = Vec::with_capacity(bytes.len() + head.get_ref().len() - from);
        front.extend_from_slice(bytes);
        front.extend_from_slice(&head.get_ref()[from..]);
        *head = io::Cursor::new(front);
    }
}

/// A reader of stdin that stops before its end (a frame limit, an error, a closed ring)
/// leaves stdin where its frames stopped, so that the next reader of `-` in this process goes
/// on from there: a regular file's offset is set to the first byte not used (it was read by
/// position, which moves no offset), and the bytes a pipe gave that were not used (the first
/// bytes and the buffer's) are kept for the next reader to take first, since a pipe cannot be
/// un-read. Best effort: a failing seek leaves the offset where it was.
impl Drop for FrameSource {
    fn drop(&mut self) {
        if self.stdin.is_none() {
            return;
        }
        let (head, rest) = self.stream.get_ref();
        let from = usize::try_from(head.position()).unwrap_or(usize::MAX).min(head.get_ref().len());
        let unread_head = &head.get_ref()[from..];
        let buffered = rest.buffer();
        match rest.get_ref() {
            Source::Stream(_) => crate::endpoint::keep_stdin_bytes([unread_head, buffered].concat()),
            Source::File(file) => {
                // Both came through the buffer from the file, so its position is past them.
                let unread = (unread_head.len() + buffered.len()) as u64;
                let _ = file.move_descriptor_to(file.position.saturating_sub(unread));
            }
        }
    }
}

impl Read for FrameSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl BufRead for FrameSource {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.stream.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.stream.consume(amount);
    }
}

impl FrameRead for FrameSource {
    /// What the first bytes and the buffer hold already, then the rest straight from the
    /// source into `frame`: by several threads from a regular file.
    fn read_frame(&mut self, frame: &mut [u8]) -> io::Result<usize> {
        let (head, rest) = self.stream.get_mut();
        let mut filled = read_full(head, frame)?;
        let buffered = rest.buffer();
        let from_buffer = buffered.len().min(frame.len() - filled);
        frame[filled..filled + from_buffer].copy_from_slice(&buffered[..from_buffer]);
        rest.consume(from_buffer);
        filled += from_buffer;
        if filled == frame.len() {
            return Ok(filled);
        }
        // The buffer is empty now: the source's position is the stream's.
        Ok(filled
            + match rest.get_mut() {
                Source::File(file) => file.read_frame(&mut frame[filled..])?,
                Source::Stream(stream) => read_full(stream, &mut frame[filled..])?,
            })
    }
}

/// Where a video's frames go: a regular file the run created, written by position (frames by
/// several threads), or a stream written front to back (stdout, a pipe).
pub struct FrameSink(Sink);

/// What a [`FrameSink`] writes to.
enum Sink {
    File(PositionedFile),
    Stream(BufWriter<Box<dyn Write + Send>>),
}

impl std::fmt::Debug for FrameSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Sink::File(_) => "FrameSink::File",
            Sink::Stream(_) => "FrameSink::Stream",
        })
    }
}

impl FrameSink {
    /// A file the run opened, new or emptied: a regular file is written from its start, each
    /// frame by up to `threads` threads; anything else (a FIFO, `/dev/null`, a terminal given
    /// by path) as the stream it is.
    pub fn file(file: File, threads: usize) -> FrameSink {
        if file.metadata().is_ok_and(|metadata| metadata.is_file()) {
            FrameSink(Sink::File(PositionedFile::new(file, 0, threads)))
        } else {
            FrameSink::stream(Box::new(file))
        }
    }

    /// A stream written front to back.
    pub fn stream(stream: Box<dyn Write + Send>) -> FrameSink {
        FrameSink(Sink::Stream(BufWriter::with_capacity(WRITE_BUFFER_BYTES, stream)))
    }
}

impl FrameWrite for FrameSink {
    /// By several threads to a file.
    fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            Sink::File(file) => file.write_frame(frame),
            Sink::Stream(stream) => stream.write_all(frame),
        }
    }
}

impl Write for FrameSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            Sink::File(file) => file.write(buf),
            Sink::Stream(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Sink::File(file) => file.flush(),
            Sink::Stream(stream) => stream.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that differ from run to run (never a constant frame).
    fn random_bytes(len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::new();
        let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        assert!(bytes.iter().any(|&byte| byte != bytes[0]), "random bytes came out constant");
        bytes
    }

    /// Frames larger than one thread's share go through several threads, byte for byte, in
    /// order, and a file that ends inside a frame says how far it got.
    #[test]
    fn frames_split_over_threads_read_and_write_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let frame_bytes = 2 * BYTES_PER_THREAD + 12_345;
        let content = random_bytes(7 + 3 * frame_bytes);
        let input = dir.path().join("in");
        std::fs::write(&input, &content).unwrap();

        let mut source = FrameSource::new(
            content[..4].to_vec(),
            io::BufReader::with_capacity(
                64,
                Source::File(PositionedFile::new(File::open(&input).unwrap(), 4, 3)),
            ),
            None,
        );
        let output = dir.path().join("out");
        let mut sink = FrameSink::file(File::create(&output).unwrap(), 3);
        let mut line = [0; 7];
        source.read_exact(&mut line).unwrap();
        sink.write_all(&line).unwrap();
        let mut frame = vec![0; frame_bytes];
        for _ in 0..3 {
            frame.fill(0xA5);
            assert_eq!(source.read_frame(&mut frame).unwrap(), frame_bytes);
            sink.write_frame(&frame).unwrap();
        }
        assert_eq!(source.read_frame(&mut frame).unwrap(), 0, "the file has ended");
        drop(sink);
        assert!(std::fs::read(&output).unwrap() == content, "the copy differs from the original");

        // Cut inside the second frame: the first whole, then the bytes there are.
        let cut = 7 + frame_bytes + BYTES_PER_THREAD + 99;
        std::fs::write(&input, &content[..cut]).unwrap();
        let mut source = FrameSource::new(
            Vec::new(),
            io::BufReader::new(Source::File(PositionedFile::new(File::open(&input).unwrap(), 7, 2))),
            None,
        );
        assert_eq!(source.read_frame(&mut frame).unwrap(), frame_bytes);
        assert_eq!(source.read_frame(&mut frame).unwrap(), cut - 7 - frame_bytes);
        assert!(frame[..cut - 7 - frame_bytes] == content[7 + frame_bytes..cut]);
    }

    /// A reader of stdin that stops early leaves stdin at its first unused byte: a regular
    /// file's shared offset is set there, a pipe's unused bytes are kept for the next reader.
    #[test]
    fn a_stdin_reader_that_stops_early_leaves_stdin_where_its_frames_stopped() {
        use std::io::Seek as _;
        let dir = tempfile::tempdir().unwrap();
        let content = random_bytes(10_000);
        let path = dir.path().join("stdin");
        std::fs::write(&path, &content).unwrap();
        // `< file`: the reader holds a duplicate of the descriptor, whose offset it shares.
        let mut stdin = File::open(&path).unwrap();
        let mut source = FrameSource::new(
            content[..16].to_vec(),
            io::BufReader::with_capacity(
                1000,
                Source::File(PositionedFile::new(stdin.try_clone().unwrap(), 16, 2)),
            ),
            Some(crate::endpoint::StdinClaim::take().unwrap()),
        );
        let mut frame = vec![0; 300];
        assert_eq!(source.read_frame(&mut frame).unwrap(), 300);
        let mut byte = [0; 1];
        source.read_exact(&mut byte).unwrap(); // fills the buffer: far more read than used
        drop(source);
        assert_eq!(stdin.stream_position().unwrap(), 301, "the offset is the first unused byte");

        // A pipe: what was read and not used is the next reader's first bytes.
        let mut source = FrameSource::new(
            content[..16].to_vec(),
            io::BufReader::with_capacity(
                1000,
                Source::Stream(Stream::plain(Box::new(io::Cursor::new(content[16..].to_vec())))),
            ),
            Some(crate::endpoint::StdinClaim::take().unwrap()),
        );
        assert_eq!(source.read_frame(&mut frame[..10]).unwrap(), 10);
        let mut seven = [0; 7];
        source.read_exact(&mut seven).unwrap(); // the head's last 6, then the buffer filled
        drop(source);
        let kept = crate::endpoint::take_stdin_bytes();
        assert_eq!(kept, content[17..1016], "the unused buffer, in order");
        let mut source = FrameSource::new(
            content[..16].to_vec(),
            io::BufReader::new(Source::Stream(Stream::plain(Box::new(io::Cursor::new(
                content[16..].to_vec(),
            ))))),
            Some(crate::endpoint::StdinClaim::take().unwrap()),
        );
        source.read_exact(&mut seven).unwrap();
        drop(source);
        assert_eq!(crate::endpoint::take_stdin_bytes(), content[7..16], "the unused head");

        // A partly read head and a filled buffer, a header put back: in that order.
        let mut source = FrameSource::new(
            content[..16].to_vec(),
            io::BufReader::with_capacity(
                100,
                Source::Stream(Stream::plain(Box::new(io::Cursor::new(content[16..].to_vec())))),
            ),
            Some(crate::endpoint::StdinClaim::take().unwrap()),
        );
        assert!(crate::endpoint::StdinClaim::take().is_err(), "one reader of stdin at a time");
        source.read_exact(&mut seven).unwrap();
        source.fill_buf().unwrap(); // the head's rest first: the buffer is not filled by this
        let mut two = [0; 2];
        source.read_exact(&mut two).unwrap();
        source.unread(b"HEADER");
        drop(source);
        let mut expected = b"HEADER".to_vec();
        expected.extend_from_slice(&content[9..16]);
        assert_eq!(crate::endpoint::take_stdin_bytes(), expected, "the header, then the head's rest");
        assert!(crate::endpoint::StdinClaim::take().is_ok(), "let go with the reader");

        // Not stdin: nothing kept, no offset moved.
        let mut other = File::open(&path).unwrap();
        let source = FrameSource::new(
            Vec::new(),
            io::BufReader::new(Source::File(PositionedFile::new(other.try_clone().unwrap(), 500, 1))),
            None,
        );
        drop(source);
        assert_eq!(other.stream_position().unwrap(), 0);
        assert!(crate::endpoint::take_stdin_bytes().is_empty());
    }

    #[test]
    fn small_frames_take_one_thread_and_large_ones_several() {
        assert_eq!(threads_for(0, 8), 1);
        assert_eq!(threads_for(BYTES_PER_THREAD, 8), 1);
        assert_eq!(threads_for(BYTES_PER_THREAD + 1, 8), 2);
        assert_eq!(threads_for(50_000_000, 8), 8);
        assert_eq!(threads_for(50_000_000, 16), 12);
        assert_eq!(threads_for(50_000_000, 1), 1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(default_threads(), cores.min(MAX_THREADS));
    }
}
