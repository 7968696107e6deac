//! [`FileStream`]: files read by several threads into a ring of pinned staging buffers (or
//! mapped in place), each piece copied to the GPU or handed to a stage as soon as it arrives.
//!
//! The pipeline: reader threads take pieces in order, each waiting for a free staging buffer
//! (or window slot), read into it and pass it on; the calling thread lends each full buffer to
//! the queue and queues its copy (or the stage's kernel) at once; a recycler thread reclaims the
//! buffers in queue order, which waits for each copy's fence, and frees them for the readers
//! (the newest freed first, the likeliest still in the CPU's cache).
//! Reads, copies and kernels overlap; a staging buffer is reused only after the work reading
//! it has finished.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::method::{LoadMethod, LoadReport, Route, StreamOptions, auto_route};
use super::residency::resident_fraction;
use super::source::{DIRECT_ALIGN, FileRange, OpenFile, Piece, ReadMode, open_files, plan, plan_gathered};
use super::windows::map_piece;
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::handoff::{Lease, Lent, Queue, Shared};
use crate::memory::{DeviceBuf, HostBuf, MappedFile, PinOptions, WritableBuffer};

/// The largest piece a stream reads at once: one pinned staging buffer each, and 128 times the
/// default piece.
const MAX_CHUNK_BYTES: usize = 1 << 30;
/// The most reader threads a stream runs (each a thread of the process).
const MAX_THREADS: usize = 1024;
/// The most staging buffers (or windows) a stream keeps in flight (each a pinned chunk).
const MAX_RING_DEPTH: usize = 4096;

/// A piece of the stream where a stage may read it, lent to the stream's queue read-only.
#[derive(Debug)]
pub enum FilePieceData<'a> {
    /// In a pinned, mapped staging buffer, from byte `offset`.
    Staging {
        /// The staging buffer.
        lease: &'a Shared<HostBuf<u8>>,
        /// Where the piece starts in it.
        offset: usize,
    },
    /// In a registered window of the file, from byte `offset`.
    Window {
        /// The window.
        lease: &'a Shared<MappedFile<u8>>,
        /// Where the piece starts in it.
        offset: usize,
    },
}

/// One piece of the stream, handed to a stage by [`FileStream::for_each_chunk`].
#[derive(Debug)]
pub struct FilePiece<'a> {
    /// The index of its range among those streamed.
    pub source: usize,
    /// Where it starts in its range.
    pub source_offset: u64,
    /// Where it starts in the stream (the ranges one after another).
    pub stream_offset: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Where its bytes are.
    pub data: FilePieceData<'a>,
}

/// Files streamed to a GPU: into device memory ([`FileStream::load`],
/// [`FileStream::load_into`]) or through a stage that reads each piece where it lies
/// ([`FileStream::for_each_chunk`]). Keeps its staging ring between runs.
///
/// # Examples
/// ```
/// use hetmem::data::{FileRange, FileStream, StreamOptions};
/// use hetmem::{Device, Queue};
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("weights.bin");
/// # std::fs::write(&path, vec![7u8; 100_000]).unwrap();
/// let device = Device::open_best()?;
/// let queue = Queue::new(&device)?;
/// let mut stream = FileStream::new(&device, &queue, StreamOptions::default())?;
/// let (on_gpu, report) = stream.load(&[FileRange::whole(&path)?], &|_done| {})?;
/// println!("{} bytes at {:.1} GB/s ({}, {})", on_gpu.len(), report.gb_per_s(), report.method, report.read_mode);
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct FileStream {
    device: Device,
    queue: Queue,
    options: StreamOptions,
    windows_allowed: bool,
    ring: Vec<HostBuf<u8>>,
    /// Set by the caller to stop the run in progress ([`FileStream::set_cancel`]).
    cancel: Option<Arc<AtomicBool>>,
}

/// A piece on its way from a reader to the calling thread.
enum Filled {
    Staging(HostBuf<u8>),
    Window(MappedFile<u8>),
}

/// A piece lent to the queue, on its way to the recycler.
enum LentPiece {
    Staging(Shared<HostBuf<u8>>),
    Window(Shared<MappedFile<u8>>),
}

/// A free staging buffer (`None` by the windows route, or to wake a reader).
type Token = Option<HostBuf<u8>>;

/// The free staging buffers (or window slots), handed out newest first. The buffer whose copy
/// has just finished is the likeliest to be still in the CPU's last-level cache, so the reader
/// that writes it again, and the copy engine that reads it next, find it there; handed out
/// oldest first, every buffer of the ring cycles through the cache. On the H200 machine, the
/// same build run both ways, turn by turn: level within the noise with rings of 64-128 MiB
/// of 4 MiB pieces (12 x 4 MiB x 24: 51.3 GB/s newest first, 50.6 oldest), and 6-11 GB/s
/// faster with the larger rings of 8 MiB pieces (8 threads x 32: 36.3 against 25.2).
struct FreeStack {
    tokens: Mutex<Vec<Token>>,
    pushed: Condvar,
}

impl FreeStack {
    fn new(tokens: Vec<Token>) -> FreeStack {
        FreeStack { tokens: Mutex::new(tokens), pushed: Condvar::new() }
    }

    fn push(&self, token: Token) {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner).push(token);
        self.pushed.notify_one();
    }

    /// The newest free token, waiting for one to be pushed when none is free.
    fn pop(&self) -> Token {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(token) = tokens.pop() {
                return token;
            }
            tokens = self.pushed.wait(tokens).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn into_inner(self) -> Vec<Token> {
        self.tokens.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One run's pipeline: reader threads fill pieces (a staging buffer read from the file, or a
/// window mapped over it), the calling thread lends each to the stage, and a recycler reclaims
/// the leases and hands the buffers back to the readers. A failure anywhere sets `abort`, and
/// every side stops at its next piece; so does the caller's `cancel`, once set.
struct Run<'r> {
    pieces: &'r [Piece],
    ranges: &'r [FileRange],
    files: &'r [OpenFile],
    /// Each range's file in `files` (a piece's `source` is its range).
    file_of: &'r [usize],
    route: Route,
    device: &'r Device,
    refused: &'r Mutex<Option<String>>,
    free: FreeStack,
    /// The next piece a reader takes.
    next: AtomicUsize,
    abort: AtomicBool,
    /// The caller's flag ([`FileStream::set_cancel`]), looked at with `abort`.
    cancel: Option<&'r AtomicBool>,
    direct_failed: AtomicBool,
    /// Bytes read through the page cache on the direct route (gathered pieces, and files
    /// `O_DIRECT` could not open), so the report does not call them direct.
    buffered_on_direct: AtomicU64,
    /// The first lease that could not be reclaimed.
    recycled: Mutex<Option<Error>>,
}

impl Run<'_> {
    /// Whether the caller asked the run to stop.
    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|cancel| cancel.load(Ordering::Relaxed))
    }

    /// Runs the readers, the recycler and `stage` to the end or the first failure, which it
    /// returns (a failed reclaim is kept in `recycled`).
    fn drive(
        &self,
        queue: &Queue,
        threads: usize,
        progress: &(dyn Fn(u64) + Sync),
        stage: impl FnMut(FilePiece<'_>) -> Result<()>,
    ) -> Option<Error> {
        let (filled_tx, filled_rx) = mpsc::channel::<(Piece, Result<(Filled, usize)>)>();
        let (lent_tx, lent_rx) = mpsc::channel::<(LentPiece, usize)>();
        std::thread::scope(|scope| {
            for _ in 0..threads.min(self.pieces.len()) {
                let filled_tx = filled_tx.clone();
                scope.spawn(move || self.read_pieces(&filled_tx));
            }
            drop(filled_tx);
            scope.spawn(move || self.recycle(lent_rx, progress));
            let failure = self.lend_to_stage(queue, &filled_rx, &lent_tx, stage);
            // Readers still waiting for a buffer see the end; buffers held by pieces never
            // consumed (after a failure) are dropped with the channel, so wake them by hand.
            self.abort.store(true, Ordering::Relaxed);
            for _ in 0..threads {
                self.free.push(None);
            }
            drop(lent_tx);
            drop(filled_rx);
            failure
        })
    }

    /// A reader thread: takes a free buffer and the next piece, and fills one with the other.
    fn read_pieces(&self, filled_tx: &mpsc::Sender<(Piece, Result<(Filled, usize)>)>) {
        loop {
            let token = self.free.pop();
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if self.abort.load(Ordering::Relaxed) || self.cancelled() || index >= self.pieces.len() {
                // Back for the next reader, which it wakes to see the end too.
                self.free.push(token);
                return;
            }
            let piece = self.pieces[index];
            let file = &self.files[self.file_of[piece.source]];
            let filled = match (token, self.route) {
                (Some(mut buf), Route::Staged { direct }) if piece.ranges > 1 => {
                    if direct {
                        self.buffered_on_direct.fetch_add(piece.len as u64, Ordering::Relaxed);
                    }
                    self.read_gathered(&piece, buf.as_mut_slice()).map(|()| (Filled::Staging(buf), 0))
                }
                (Some(mut buf), Route::Staged { direct }) => {
                    if direct && !file.is_direct() {
                        self.buffered_on_direct.fetch_add(piece.len as u64, Ordering::Relaxed);
                    }
                    file.read(&piece, buf.as_mut_slice(), &self.direct_failed, self.refused)
                        .map(|skip| (Filled::Staging(buf), skip))
                }
                // SAFETY: `Route::Windows` is chosen only after `allow_windows`, whose
                // caller promised the files do not change while read.
                (None, Route::Windows) => unsafe { map_piece(self.device, file, &piece) }
                    .map(|(window, skip)| (Filled::Window(window), skip)),
                // A wake-up without a buffer: the run was aborted.
                _ => Err(Error::Stopped { what: "load" }),
            };
            if filled.is_err() {
                self.abort.store(true, Ordering::Relaxed);
            }
            if filled_tx.send((piece, filled)).is_err() {
                return;
            }
        }
    }

    /// Reads a gathered piece's ranges, whole and one after another, into `buf`, through the
    /// page cache.
    fn read_gathered(&self, piece: &Piece, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        for source in piece.source..piece.source + piece.ranges {
            let range = &self.ranges[source];
            // In bounds: the plan gathered at most a chunk, the buffer's size less its slack.
            let len = range.len as usize;
            self.files[self.file_of[source]].read_buffered(range.offset, &mut buf[at..at + len])?;
            at += len;
        }
        debug_assert_eq!(at, piece.len);
        Ok(())
    }

    /// The recycler: reclaims each lease once the stage's work on it is done, reports the
    /// progress, and hands the buffer back to the readers.
    fn recycle(&self, lent_rx: mpsc::Receiver<(LentPiece, usize)>, progress: &(dyn Fn(u64) + Sync)) {
        let mut done = 0u64;
        for (lent, len) in lent_rx {
            let back = match lent {
                LentPiece::Staging(lease) => lease.reclaim().map(Some),
                LentPiece::Window(lease) => lease.reclaim().map(|_window| None),
            };
            match back {
                Ok(token) => {
                    done += len as u64;
                    progress(done);
                    self.free.push(token);
                }
                Err(error) => {
                    // Recorded before the abort: readers that stop for it leave the error to be found.
                    self.recycled.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(error);
                    self.abort.store(true, Ordering::Relaxed);
                    // Wakes a reader waiting for a buffer, to see the abort and stop.
                    self.free.push(None);
                }
            }
        }
    }

    /// The calling thread: lends each filled piece to `queue` and runs `stage` on it, until
    /// every piece is done or one fails (returned).
    fn lend_to_stage(
        &self,
        queue: &Queue,
        filled_rx: &mpsc::Receiver<(Piece, Result<(Filled, usize)>)>,
        lent_tx: &mpsc::Sender<(LentPiece, usize)>,
        mut stage: impl FnMut(FilePiece<'_>) -> Result<()>,
    ) -> Option<Error> {
        let stopped = || {
            self.abort.store(true, Ordering::Relaxed);
            Some(Error::Stopped { what: "load" })
        };
        for _ in 0..self.pieces.len() {
            if self.cancelled() {
                return stopped();
            }
            // Every reader gone before the last piece: the recycler failed (its error, recorded
            // before it set `abort`, is the run's), or they stopped for the cancel. Never an Ok
            // with pieces unread, whatever the caller's flag says by now.
            let Ok((piece, filled)) = filled_rx.recv() else {
                let recycler_failed = self.recycled.lock().unwrap_or_else(PoisonError::into_inner).is_some();
                return if recycler_failed { None } else { stopped() };
            };
            let (filled, skip) = match filled {
                Ok(filled) => filled,
                Err(error) => return Some(error),
            };
            let (lent, outcome) = match filled {
                Filled::Staging(buf) => {
                    let lease = queue.share(buf);
                    let data = FilePieceData::Staging { lease: &lease, offset: skip };
                    let outcome = stage(chunk(&piece, data));
                    (LentPiece::Staging(lease), outcome)
                }
                Filled::Window(window) => {
                    let lease = queue.share(window);
                    let data = FilePieceData::Window { lease: &lease, offset: skip };
                    let outcome = stage(chunk(&piece, data));
                    (LentPiece::Window(lease), outcome)
                }
            };
            let _ = lent_tx.send((lent, piece.len));
            if let Err(error) = outcome {
                self.abort.store(true, Ordering::Relaxed);
                return Some(error);
            }
        }
        None
    }
}

impl FileStream {
    /// A stream to `queue` (a queue of `device`) with `options`; the staging ring is made on
    /// the first run that needs it.
    ///
    /// # Errors
    /// No threads, no ring, more than 1024 threads or a ring deeper than 4096, or a chunk that
    /// is not a positive multiple of 4096 bytes up to 1 GiB.
    pub fn new(device: &Device, queue: &Queue, options: StreamOptions) -> Result<FileStream> {
        if options.threads == 0 || options.ring_depth == 0 {
            return Err(Error::invalid("stream options", "threads and ring depth must be at least 1"));
        }
        // Bounded before anything is spawned or pinned: a caller's huge count (hetmem.load's
        // threads=) would otherwise exhaust the process's threads or memory.
        if options.threads > MAX_THREADS || options.ring_depth > MAX_RING_DEPTH {
            return Err(Error::invalid(
                "stream options",
                format!(
                    "{} threads and a ring of {}: give at most {MAX_THREADS} threads and a ring of \
                     {MAX_RING_DEPTH} (a few per CPU are enough)",
                    options.threads, options.ring_depth
                ),
            ));
        }
        if options.chunk_bytes == 0 || !(options.chunk_bytes as u64).is_multiple_of(DIRECT_ALIGN) {
            return Err(Error::invalid(
                "stream options",
                format!(
                    "a chunk of {} bytes: give a positive multiple of 4096 (O_DIRECT reads whole blocks)",
                    options.chunk_bytes
                ),
            ));
        }
        // A staging buffer holds a chunk and the block an unaligned direct read starts in.
        if options.chunk_bytes > MAX_CHUNK_BYTES {
            return Err(Error::invalid(
                "stream options",
                format!(
                    "a chunk of {} bytes: give at most {MAX_CHUNK_BYTES} (each is one pinned staging buffer)",
                    options.chunk_bytes
                ),
            ));
        }
        Ok(FileStream {
            device: device.clone(),
            queue: queue.clone(),
            options,
            windows_allowed: false,
            ring: Vec::new(),
            cancel: None,
        })
    }

    /// Lets the stream map the files it reads ([`LoadMethod::Windows`]).
    ///
    /// A file truncated while a run reads it anyway ends the run with
    /// [`Error::FileTruncated`]: each piece is checked against the file's size before it is
    /// mapped, the CPU backend's copies (and a stage's CPU path) recover the fault of a
    /// truncation while they read, and after the run the files' sizes are checked again (a
    /// GPU's copies read the pinned pages a truncated file dropped, and fail nothing).
    ///
    /// # Safety
    /// Every file the stream reads must not be truncated or modified while a run reads it: a
    /// mapping of a truncated file faults (SIGBUS), as for [`MappedFile`], where a stage's own
    /// code reads a window ([`FilePieceData::Window`]) outside hetmem's loops.
    pub unsafe fn allow_windows(mut self) -> FileStream {
        self.windows_allowed = true;
        self
    }

    /// Makes the stream's runs stop once `cancel` is set (`None`: runs go to their end): a run
    /// in progress, or one started while it is set, stops at its next piece, waits for the work
    /// queued on pieces already read, and fails with [`Error::Stopped`]. The bytes copied until
    /// then are in the destination; a caller that stops a load discards it. The flag is the
    /// caller's to clear (or replace) before the next run: how a binding stops a load on
    /// Ctrl-C, or a program on a deadline of its own.
    pub fn set_cancel(&mut self, cancel: Option<Arc<AtomicBool>>) {
        self.cancel = cancel;
    }

    /// The stream's options.
    pub fn options(&self) -> StreamOptions {
        self.options
    }

    /// Reads `ranges` one after another into a new device buffer of their total length.
    /// `progress` hears the bytes done so far, from another thread.
    ///
    /// # Errors
    /// Nothing to load (the ranges are empty); as for [`FileStream::load_into`].
    pub fn load(
        &mut self,
        ranges: &[FileRange],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(DeviceBuf<u8>, LoadReport)> {
        let total: u64 = ranges.iter().map(|range| range.len).sum();
        if total == 0 {
            return Err(Error::invalid("load", "nothing to load: the files are empty"));
        }
        let bytes = usize::try_from(total)
            .map_err(|_| Error::invalid("load", "larger than this machine's address space"))?;
        let mut dst = self.queue.lend(DeviceBuf::<u8>::new(&self.device, bytes)?);
        let report = self.load_into(ranges, &mut dst, 0, progress)?;
        Ok((dst.reclaim()?, report))
    }

    /// Reads `ranges` one after another into `dst` from byte `dst_offset`, each piece copied
    /// from its staging buffer (or window) on the stream's queue as soon as it arrives; returns
    /// once every copy has finished.
    ///
    /// # Errors
    /// The ranges do not fit in `dst`; `dst` is lent to another queue; a file missing,
    /// unreadable or shorter than its range; [`LoadMethod::Windows`] without
    /// [`FileStream::allow_windows`]; pinning or a copy failing.
    pub fn load_into<D: WritableBuffer<Elem = u8>>(
        &mut self,
        ranges: &[FileRange],
        dst: &mut Lent<D>,
        dst_offset: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadReport> {
        if ranges.iter().try_fold(0u64, |total, range| total.checked_add(range.len)).is_none() {
            return Err(Error::invalid(
                "load",
                "the ranges' lengths add up to more than 2^64 bytes: give real file ranges",
            ));
        }
        let mut parts = Vec::with_capacity(ranges.len());
        let mut at = Some(dst_offset);
        for range in ranges {
            let start = at.ok_or_else(|| {
                Error::invalid(
                    "load",
                    "the ranges' lengths add up past the address space: give real file ranges",
                )
            })?;
            parts.push((range.clone(), start));
            at = usize::try_from(range.len).ok().and_then(|len| start.checked_add(len));
        }
        self.load_placed(&parts, dst, progress)
    }

    /// Reads each range into `dst` at its own byte offset (`(range, offset)`: the places may
    /// have gaps between them, but not overlap), as [`FileStream::load_into`] does.
    ///
    /// # Errors
    /// A range that does not fit in `dst` or overlaps another's place; as for
    /// [`FileStream::load_into`].
    pub fn load_placed<D: WritableBuffer<Elem = u8>>(
        &mut self,
        parts: &[(FileRange, usize)],
        dst: &mut Lent<D>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadReport> {
        let mut places = Vec::with_capacity(parts.len());
        for (range, start) in parts {
            let end = usize::try_from(range.len).ok().and_then(|len| start.checked_add(len));
            match end {
                Some(end) if end <= dst.len() => places.push((*start, end)),
                _ => {
                    return Err(Error::invalid(
                        "load",
                        format!(
                            "{} bytes of {} at byte {start} of a {}-byte destination: allocate more device memory",
                            range.len,
                            range.path.display(),
                            dst.len()
                        ),
                    ));
                }
            }
        }
        places.sort_unstable();
        if places.windows(2).any(|pair| pair[1].0 < pair[0].1) {
            return Err(Error::invalid("load", "two ranges are placed over each other in the destination"));
        }
        let ranges: Vec<FileRange> = parts.iter().map(|(range, _)| range.clone()).collect();
        let queue = self.queue.clone();
        let starts: Vec<usize> = parts.iter().map(|(_, start)| *start).collect();
        self.run(&ranges, Some(&starts), progress, |chunk| {
            // In range: the piece lies inside its range, whose place was checked above (a
            // gathered piece: inside its ranges, each placed where the one before ends).
            let to = parts[chunk.source].1 + chunk.source_offset as usize;
            match chunk.data {
                FilePieceData::Staging { lease, offset } => {
                    queue.copy_range(lease, offset, dst, to, chunk.len)
                }
                FilePieceData::Window { lease, offset } => {
                    queue.copy_range(lease, offset, dst, to, chunk.len)
                }
            }
        })
    }

    /// Streams `ranges` through `stage`: each piece, as it arrives, lent read-only to the
    /// stream's queue, for the stage to queue work that reads it in place (a kernel reading
    /// the mapped staging buffer or window: zero-copy). The piece is reused once the work the
    /// stage queued on the stream's queue has finished; returns once all of it has.
    ///
    /// # Errors
    /// The stage's error; as for [`FileStream::load_into`].
    pub fn for_each_chunk(
        &mut self,
        ranges: &[FileRange],
        progress: &(dyn Fn(u64) + Sync),
        stage: impl FnMut(FilePiece<'_>) -> Result<()>,
    ) -> Result<LoadReport> {
        self.run(ranges, None, progress, stage)
    }

    /// The device the stream reads to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The queue the stream copies on; a stage queues its work here.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    fn route(&self, ranges: &[FileRange]) -> Result<(Route, Option<String>)> {
        match self.options.method {
            LoadMethod::Staged => Ok((Route::Staged { direct: false }, None)),
            LoadMethod::StagedDirect => Ok((Route::Staged { direct: true }, None)),
            LoadMethod::Windows if self.windows_allowed => Ok((Route::Windows, None)),
            LoadMethod::Windows => Err(Error::invalid(
                "load method",
                "windows maps the files: call FileStream::allow_windows (unsafe: the files must not change while read)",
            )),
            LoadMethod::Auto => {
                let resident = resident_fraction(ranges, 64)?;
                let (route, why) = auto_route(resident);
                Ok((route, Some(why)))
            }
        }
    }

    /// Streams `ranges` through `stage`. With `places` (where each range goes in a
    /// destination), small ranges whose places follow on may arrive gathered: one piece whose
    /// `source` is the first of them, `source_offset` 0, and whose bytes are theirs one after
    /// another.
    fn run(
        &mut self,
        ranges: &[FileRange],
        places: Option<&[usize]>,
        progress: &(dyn Fn(u64) + Sync),
        stage: impl FnMut(FilePiece<'_>) -> Result<()>,
    ) -> Result<LoadReport> {
        let (route, auto_reason) = self.route(ranges)?;
        let refused = Mutex::new(None);
        let (files, file_of) = open_files(ranges, route == Route::Staged { direct: true }, &refused)?;
        let pieces = match (places, route) {
            (Some(places), Route::Staged { .. }) => plan_gathered(ranges, places, self.options.chunk_bytes),
            _ => plan(ranges, self.options.chunk_bytes),
        };
        let setup = Instant::now();
        let made_ring = matches!(route, Route::Staged { .. }) && self.ring.len() < self.options.ring_depth;
        let tokens: Vec<Option<HostBuf<u8>>> = match route {
            Route::Staged { .. } => self.take_ring()?.into_iter().map(Some).collect(),
            Route::Windows => (0..self.options.ring_depth).map(|_| None).collect(),
        };
        let setup_seconds = if made_ring { setup.elapsed().as_secs_f64() } else { 0.0 };
        let started = Instant::now();
        let run = Run {
            pieces: &pieces,
            ranges,
            files: &files,
            file_of: &file_of,
            route,
            device: &self.device,
            refused: &refused,
            free: FreeStack::new(tokens),
            next: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            cancel: self.cancel.as_deref(),
            direct_failed: AtomicBool::new(false),
            buffered_on_direct: AtomicU64::new(0),
            recycled: Mutex::new(None),
        };
        let failure = run.drive(&self.queue, self.options.threads, progress, stage);
        self.ring.extend(run.free.into_inner().into_iter().flatten());
        if let Some(error) = failure.or(run.recycled.into_inner().unwrap_or_else(PoisonError::into_inner)) {
            return Err(error);
        }
        if route == Route::Windows {
            // A GPU reads a registered window's pages even after the file dropped them (they
            // stay pinned), so a truncation while it copied shows only here.
            for (&file, range) in file_of.iter().zip(ranges) {
                let file = &files[file];
                file.origin.check_holds(range.offset, range.offset + range.len)?;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let direct_used = files.iter().any(OpenFile::is_direct) && !run.direct_failed.load(Ordering::Relaxed);
        let (method, read_mode) = match route {
            Route::Staged { direct: true }
                if direct_used && run.buffered_on_direct.load(Ordering::Relaxed) > 0 =>
            {
                (LoadMethod::StagedDirect, ReadMode::Mixed)
            }
            Route::Staged { direct: true } if direct_used => (LoadMethod::StagedDirect, ReadMode::Direct),
            Route::Staged { direct: true } => (LoadMethod::StagedDirect, ReadMode::Buffered),
            Route::Staged { direct: false } => (LoadMethod::Staged, ReadMode::Buffered),
            Route::Windows => (LoadMethod::Windows, ReadMode::Mapped),
        };
        Ok(LoadReport {
            method,
            read_mode,
            direct_refused: refused.into_inner().unwrap_or_else(PoisonError::into_inner),
            auto_reason,
            bytes: pieces.iter().map(|piece| piece.len as u64).sum(),
            seconds,
            setup_seconds,
        })
    }

    /// The staging ring, made (pinned and mapped, so stages can read it in place) to the
    /// options' depth where an earlier run did not leave it whole.
    fn take_ring(&mut self) -> Result<Vec<HostBuf<u8>>> {
        let bytes = self.options.chunk_bytes + DIRECT_ALIGN as usize;
        while self.ring.len() < self.options.ring_depth {
            self.ring.push(HostBuf::pinned(&self.device, bytes, PinOptions::default())?);
        }
        Ok(std::mem::take(&mut self.ring))
    }
}

fn chunk<'a>(piece: &Piece, data: FilePieceData<'a>) -> FilePiece<'a> {
    FilePiece {
        source: piece.source,
        source_offset: piece.source_offset,
        stream_offset: piece.stream_offset,
        len: piece.len,
        data,
    }
}
