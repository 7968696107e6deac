//! [`Chunked`]: a buffer cut into ranges ([`Chunk`] to write, [`ReadChunk`] to read) that are
//! buffers themselves, so GPU work gets `device_ptr + offset` pieces through the ordinary
//! hand-off while the CPU works on other pieces.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use super::claims::{Access, Claim, Claims};
use super::{Buffer, FileSpan, HostVisible, Region, Sealed, WritableBuffer};
use crate::backend::cpu::memory::page_size;
use crate::error::{Error, Result};

/// A buffer owned by its ranges: [`Chunked::chunk`] gives elements `range` to write,
/// [`Chunked::read`] to read, each a buffer of its own that can be lent or shared with GPU work
/// through a [`crate::Queue`] (a lent chunk's kernels see its first element at the buffer's
/// device address plus the chunk's offset) or used on the CPU while it is held.
///
/// Ranges are checked when made: a chunk overlaps no other range alive, read chunks may
/// overlap read chunks; an overlap is refused with [`Error::RangeInUse`]. A range is held until
/// its chunk drops, and a lease owns its chunk, so a chunk lent to GPU work is released only
/// after the work finished; a chunk forgotten (`mem::forget` of it or of its lease) keeps its
/// range held and the buffer alive for good, which is safe. [`Chunked::into_inner`] gives the
/// whole buffer back once no chunk is alive.
///
/// ```
/// use hetmem::{Device, HostBuf, PinOptions, Queue, memory::Chunked, ops};
/// let device = Device::open_best()?;
/// let queue = Queue::new(&device)?;
/// let mut input = HostBuf::<u32>::pinned(&device, 1 << 16, PinOptions::default())?;
/// input.as_mut_slice().iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
/// let output = Chunked::new(HostBuf::<u32>::pinned(&device, 1 << 16, PinOptions::default())?);
/// let input = Chunked::new(input);
/// let half = 1 << 15;
/// // The GPU writes the first half while the CPU writes the second.
/// let mut first = queue.lend(output.chunk(0..half)?);
/// ops::affine_u32(&queue, &queue.share(input.read(0..half)?), &mut first, 3, 1)?;
/// let mut second = output.chunk(half..2 * half)?;
/// second.as_mut_slice().fill(5);
/// assert!(output.chunk(half - 1..half + 1).is_err()); // overlaps both
/// let first = first.reclaim()?;
/// assert_eq!((first.as_slice()[10], second.as_slice()[0]), (31, 5));
/// drop((first, second));
/// let output = output.into_inner().map_err(|busy| busy.error)?;
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Debug)]
pub struct Chunked<B: Buffer> {
    whole: Arc<Whole<B>>,
}

/// The buffer and the ranges held of it.
#[derive(Debug)]
struct Whole<B> {
    buf: B,
    claims: Arc<Claims>,
}

/// A [`Chunked`] buffer that still has chunks alive, handed back by [`Chunked::into_inner`].
#[derive(Debug)]
pub struct ChunksAlive<B: Buffer> {
    /// Which error this is ([`Error::StillHeld`] naming how many chunks live).
    pub error: Error,
    /// The buffer, still chunked.
    pub chunked: Chunked<B>,
}

impl<B: Buffer> std::fmt::Display for ChunksAlive<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: Buffer + std::fmt::Debug> std::error::Error for ChunksAlive<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B: Buffer> Chunked<B> {
    /// Takes `buf` to hand out its ranges.
    pub fn new(buf: B) -> Chunked<B> {
        Chunked { whole: Arc::new(Whole { buf, claims: Claims::new("buffer range") }) }
    }

    /// The number of elements of the whole buffer.
    pub fn len(&self) -> usize {
        self.whole.buf.len()
    }

    /// Always false: hetmem buffers hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Chunks alive (held on the CPU or in leases).
    pub fn live_chunks(&self) -> usize {
        self.whole.claims.count()
    }

    /// Elements `range` to read, on the CPU or shared with GPU work (`Queue::share`).
    ///
    /// # Errors
    /// An empty range or one past the end; [`Error::RangeInUse`] when it overlaps a
    /// [`Chunk`] alive.
    pub fn read(&self, range: Range<usize>) -> Result<ReadChunk<B>> {
        Ok(ReadChunk { part: self.part(range, Access::Read)? })
    }

    /// Chunks of `chunk_len` elements to read, covering the buffer in order (the last may be
    /// shorter).
    ///
    /// # Errors
    /// As for [`Chunked::read`], and a `chunk_len` of 0.
    pub fn read_all(&self, chunk_len: usize) -> Result<Vec<ReadChunk<B>>> {
        self.cut(chunk_len)?.map(|range| self.read(range)).collect()
    }

    /// Gives the buffer back once no chunk is alive.
    ///
    /// # Errors
    /// Chunks still alive (on the CPU, or in leases not yet reclaimed or forgotten): the
    /// buffer comes back, still chunked, in the error.
    pub fn into_inner(self) -> Result<B, ChunksAlive<B>> {
        match Arc::try_unwrap(self.whole) {
            Ok(whole) => Ok(whole.buf),
            Err(whole) => {
                let chunked = Chunked { whole };
                Err(ChunksAlive {
                    error: Error::StillHeld {
                        what: "the chunked buffer",
                        remedy: format!(
                            "{} chunk(s) of it are alive: drop them, or reclaim the leases holding them, \
                             first",
                            chunked.live_chunks()
                        ),
                    },
                    chunked,
                })
            }
        }
    }

    fn cut(&self, chunk_len: usize) -> Result<impl Iterator<Item = Range<usize>>> {
        if chunk_len == 0 {
            return Err(Error::invalid("chunk length", "0 elements"));
        }
        let len = self.len();
        Ok((0..len).step_by(chunk_len).map(move |start| start..start.saturating_add(chunk_len).min(len)))
    }

    fn part(&self, range: Range<usize>, access: Access) -> Result<Part<B>> {
        if range.start >= range.end || range.end > self.len() {
            return Err(Error::invalid(
                "buffer range",
                format!(
                    "elements {range:?} of a buffer of {}: ranges hold at least one element, within the buffer",
                    self.len()
                ),
            ));
        }
        let claim = self.whole.claims.claim(range.start as u64..range.end as u64, access)?;
        Ok(Part { whole: Arc::clone(&self.whole), range, _claim: claim })
    }
}

impl<B: WritableBuffer> Chunked<B> {
    /// Elements `range` to write: on the CPU, or by GPU work it is lent to (`Queue::lend`).
    ///
    /// # Errors
    /// An empty range or one past the end; [`Error::RangeInUse`] when it overlaps any chunk
    /// alive.
    pub fn chunk(&self, range: Range<usize>) -> Result<Chunk<B>> {
        Ok(Chunk { part: self.part(range, Access::Write)? })
    }

    /// Chunks of `chunk_len` elements to write, covering the buffer in order (the last may be
    /// shorter).
    ///
    /// # Errors
    /// As for [`Chunked::chunk`], and a `chunk_len` of 0.
    pub fn chunk_all(&self, chunk_len: usize) -> Result<Vec<Chunk<B>>> {
        self.cut(chunk_len)?.map(|range| self.chunk(range)).collect()
    }
}

/// What both kinds of chunk hold: the whole buffer (kept alive), their elements, their claim.
#[derive(Debug)]
struct Part<B: Buffer> {
    whole: Arc<Whole<B>>,
    range: Range<usize>,
    _claim: Claim,
}

impl<B: Buffer> Part<B> {
    fn len(&self) -> usize {
        self.range.end - self.range.start
    }

    fn region(&self) -> Region {
        let whole = self.whole.buf.region();
        let size = size_of::<B::Elem>();
        let (offset, bytes) = (self.range.start * size, self.len() * size);
        let host = whole.host.map(|host| {
            // SAFETY: `offset` bytes lie within the whole buffer's `bytes`.
            unsafe { host.add(offset) }
        });
        Region {
            host,
            device: whole.device.map(|device| device + offset as u64),
            bytes,
            device_ordinal: whole.device_ordinal,
            pages: whole
                .pages
                .and_then(|pages| own_pages(pages, host?, bytes, whole.bytes - offset == bytes)),
            read_only: whole.read_only,
            portable: whole.portable,
        }
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        let span = self.whole.buf.file_span()?;
        Some(span.advanced(self.range.start * size_of::<B::Elem>()))
    }

    fn host(&self) -> NonNull<B::Elem> {
        self.region().host.expect("host-visible buffers have a host address").cast()
    }
}

/// The whole pages a chunk of `bytes` at `start` owns alone, within the buffer's `pages`: all
/// the pages it touches, when it starts on a page and ends on one, or at the buffer's end
/// (whose last page no other chunk shares). Only such chunks can be lent guarded.
fn own_pages(
    pages: (NonNull<u8>, usize),
    start: NonNull<u8>,
    bytes: usize,
    last: bool,
) -> Option<(NonNull<u8>, usize)> {
    let page = page_size();
    let offset = start.as_ptr() as usize - pages.0.as_ptr() as usize;
    if !offset.is_multiple_of(page) {
        return None;
    }
    if last {
        Some((start, pages.1 - offset))
    } else if bytes.is_multiple_of(page) {
        Some((start, bytes))
    } else {
        None
    }
}

/// Elements of a [`Chunked`] buffer to write, which no other chunk alive overlaps: on the CPU
/// while held ([`Chunk::as_mut_slice`]), or by GPU work it is lent to. Dropping it releases
/// the range.
#[derive(Debug)]
pub struct Chunk<B: Buffer> {
    part: Part<B>,
}

/// Elements of a [`Chunked`] buffer to read, which no [`Chunk`] alive overlaps: on the CPU
/// ([`ReadChunk::as_slice`]) or by GPU work it is shared with. Dropping it releases the range.
#[derive(Debug)]
pub struct ReadChunk<B: Buffer> {
    part: Part<B>,
}

impl<B: WritableBuffer> Chunk<B> {
    /// The chunk's elements in the whole buffer.
    pub fn range(&self) -> Range<usize> {
        self.part.range.clone()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.part.len()
    }

    /// Always false: chunks hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<B: WritableBuffer + HostVisible> Chunk<B> {
    /// The elements.
    pub fn as_slice(&self) -> &[B::Elem] {
        // SAFETY: `len` initialised elements of the whole buffer, alive while `part` holds it;
        // no other chunk alive overlaps them (the write claim), the buffer itself is reachable
        // only through chunks, and a lease that owns this chunk would have taken it by value,
        // so nothing writes them while `&self` is held.
        unsafe { std::slice::from_raw_parts(self.part.host().as_ptr(), self.len()) }
    }

    /// The elements, for the CPU to write.
    pub fn as_mut_slice(&mut self) -> &mut [B::Elem] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive; the buffer is
        // writable (`WritableBuffer`) and its host address writable memory (a HostBuf's
        // allocation, a read-write window's mapping).
        unsafe { std::slice::from_raw_parts_mut(self.part.host().as_ptr(), self.len()) }
    }
}

impl<B: Buffer> ReadChunk<B> {
    /// The chunk's elements in the whole buffer.
    pub fn range(&self) -> Range<usize> {
        self.part.range.clone()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.part.len()
    }

    /// Always false: chunks hold at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<B: HostVisible> ReadChunk<B> {
    /// The elements.
    pub fn as_slice(&self) -> &[B::Elem] {
        // SAFETY: `len` initialised elements of the whole buffer, alive while `part` holds it;
        // no Chunk (the only writers) overlaps them while this read claim lives.
        unsafe { std::slice::from_raw_parts(self.part.host().as_ptr(), self.len()) }
    }
}

impl<B: WritableBuffer> Sealed for Chunk<B> {
    fn region(&self) -> Region {
        self.part.region()
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.part.file_span()
    }
}

impl<B: WritableBuffer> Buffer for Chunk<B> {
    type Elem = B::Elem;

    fn len(&self) -> usize {
        self.part.len()
    }
}

impl<B: WritableBuffer> WritableBuffer for Chunk<B> {}
impl<B: WritableBuffer + HostVisible> HostVisible for Chunk<B> {}

impl<B: Buffer> Sealed for ReadChunk<B> {
    fn region(&self) -> Region {
        // Read chunks may overlap, so none owns its pages alone: no guard.
        Region { pages: None, ..self.part.region() }
    }

    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.part.file_span()
    }
}

impl<B: Buffer> Buffer for ReadChunk<B> {
    type Elem = B::Elem;

    fn len(&self) -> usize {
        self.part.len()
    }
}

impl<B: HostVisible> HostVisible for ReadChunk<B> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendChoice, BackendKind, Device};
    use crate::memory::{HostBuf, MappedFile, PageBox, RegisterOptions};

    fn cpu() -> Device {
        Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap()
    }

    fn random_words(len: usize) -> Vec<u32> {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u32(..)).collect()
    }

    fn host(data: &[u32]) -> HostBuf<u32> {
        let mut memory = PageBox::<u32>::zeroed(data.len()).unwrap();
        memory.copy_from_slice(data);
        HostBuf::register(&cpu(), memory, RegisterOptions::default()).unwrap()
    }

    #[test]
    fn chunks_see_their_elements_and_write_only_them() {
        let data = random_words(10_000);
        let chunked = Chunked::new(host(&data));
        let mut left = chunked.chunk(0..4000).unwrap();
        let mut right = chunked.chunk(4000..10_000).unwrap();
        assert_eq!(left.as_slice(), &data[..4000]);
        assert_eq!(right.as_slice(), &data[4000..]);
        let fresh = random_words(6000);
        right.as_mut_slice().copy_from_slice(&fresh);
        left.as_mut_slice()[3999] ^= 1;
        drop((left, right));
        let buf = chunked.into_inner().unwrap();
        assert_eq!(&buf.as_slice()[4000..], &fresh[..]);
        assert_eq!(buf.as_slice()[3999], data[3999] ^ 1);
        assert_eq!(&buf.as_slice()[..3999], &data[..3999]);
    }

    #[test]
    fn overlaps_are_refused_and_reads_overlap_reads() {
        let data = random_words(1000);
        let chunked = Chunked::new(host(&data));
        let reads = [chunked.read(0..600).unwrap(), chunked.read(500..700).unwrap()];
        assert_eq!(reads[1].as_slice(), &data[500..700]);
        let error = chunked.chunk(699..800).unwrap_err();
        assert!(matches!(&error, Error::RangeInUse { asked, .. } if *asked == (699..800)), "{error}");
        let writer = chunked.chunk(700..1000).unwrap();
        assert!(chunked.read(999..1000).is_err());
        for (range, problem) in [(5..5, "at least one"), (990..1001, "of a buffer of 1000")] {
            let error = chunked.read(range.clone()).unwrap_err().to_string();
            assert!(error.contains(problem), "{range:?}: {error}");
        }
        let busy = chunked.into_inner().unwrap_err();
        assert!(busy.to_string().contains("3 chunk(s)"), "{busy}");
        let chunked = busy.chunked;
        drop(reads);
        drop(writer);
        assert_eq!(chunked.into_inner().unwrap().as_slice(), &data[..]);
    }

    #[test]
    fn chunk_regions_are_offsets_and_own_pages_only_when_whole() {
        let words = page_size() / 4;
        let chunked = Chunked::new(host(&random_words(3 * words + 5)));
        let whole = chunked.whole.buf.region();
        let chunks = chunked.chunk_all(words).unwrap();
        assert_eq!(chunks.len(), 4);
        for chunk in &chunks {
            let region = chunk.region();
            let offset = chunk.range().start * 4;
            assert_eq!(
                region.host.unwrap().as_ptr() as usize,
                whole.host.unwrap().as_ptr() as usize + offset
            );
            assert_eq!(region.bytes, chunk.len() * 4);
            assert!(region.pages.is_some(), "page-aligned chunks own their pages");
        }
        assert_eq!(chunks[3].region().pages.unwrap().1, whole.pages.unwrap().1 - 3 * page_size());
        drop(chunks);
        let odd = chunked.chunk(1..words + 1).unwrap();
        assert!(odd.region().pages.is_none());
        let read = chunked.read(words + 1..2 * words + 1).unwrap();
        assert!(read.region().pages.is_none());
    }

    #[test]
    fn read_only_files_are_read_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("words.bin");
        let data = random_words(5000);
        std::fs::write(&path, bytemuck::cast_slice(&data)).unwrap();
        // SAFETY: the test owns the file and does not change it while mapped.
        let file = unsafe { MappedFile::<u32>::open(&cpu(), &path) }.unwrap();
        let chunked = Chunked::new(file);
        let chunks = chunked.read_all(1024).unwrap();
        assert_eq!(chunks.iter().map(ReadChunk::len).collect::<Vec<_>>(), [1024, 1024, 1024, 1024, 904]);
        let joined: Vec<u32> = chunks.iter().flat_map(|chunk| chunk.as_slice().to_vec()).collect();
        assert_eq!(joined, data);
    }
}
