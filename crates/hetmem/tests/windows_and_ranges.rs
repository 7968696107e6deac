//! File windows, buffer ranges and budgets end to end: a kernel (or the CPU path on
//! the CPU backend) reads a window at an offset, writes a read-write window that then reaches
//! the file, processes a buffer chunk by chunk with several chunks lent at once, and streams a
//! working set several times a device budget through it. Each test runs on the CPU backend and,
//! where there is one, on the GPU.

use std::collections::VecDeque;

use hetmem::memory::{Chunk, Chunked, DeviceBudget, PinnedBudget, ReadChunk, WindowCache, WindowedFile};
use hetmem::ops::{affine_u32, affine_u32_cpu};
use hetmem::{Device, DeviceBuf, Error, HostBuf, Lent, PinOptions, Queue, Shared, error::BudgetKind};

use crate::support::{POISON, first_mismatch, on_every_backend, random_words};

const LEN: usize = (1 << 20) + 333;

fn expected(input: &[u32], a: u32, b: u32) -> Vec<u32> {
    let mut out = vec![0; input.len()];
    affine_u32_cpu(input, &mut out, a, b);
    out
}

fn coefficients() -> (u32, u32) {
    (fastrand::u32(..) | 1, fastrand::u32(..))
}

fn host(device: &Device, data: &[u32]) -> HostBuf<u32> {
    let mut buf = HostBuf::pinned(device, data.len(), PinOptions::default()).unwrap();
    buf.as_mut_slice().copy_from_slice(data);
    buf
}

/// A file of `LEN` random words in `dir`: its path and its words.
fn words_file(dir: &tempfile::TempDir, name: &str) -> (std::path::PathBuf, Vec<u32>) {
    let path = dir.path().join(name);
    let data = random_words(LEN);
    std::fs::write(&path, bytemuck::cast_slice(&data)).unwrap();
    (path, data)
}

/// Words `words` of a file, as the window at that range must show them.
fn byte_range(words: std::ops::Range<usize>) -> std::ops::Range<u64> {
    words.start as u64 * 4..words.end as u64 * 4
}

#[test]
fn a_window_at_an_offset_is_read_by_a_kernel_and_a_copy() {
    on_every_backend("a_window_at_an_offset_is_read_by_a_kernel_and_a_copy", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = words_file(&dir, "words.bin");
        let queue = Queue::new(device).unwrap();
        // SAFETY: the test owns the file and does not change it while windows of it live.
        let file = unsafe { WindowedFile::open(device, &path) }.unwrap();
        // Starts mid-page, ends mid-page.
        let words = 1027..LEN - 5;
        let window = file.window::<u32>(byte_range(words.clone())).unwrap();
        assert_eq!(window.is_registered(), device.as_cuda().is_some());
        let window = queue.share(window);
        let (a, b) = coefficients();
        let mut output = queue.lend(host(device, &vec![POISON; words.len()]));
        affine_u32(&queue, &window, &mut output, a, b).unwrap();
        let mut copied = queue.lend(DeviceBuf::<u32>::new(device, words.len()).unwrap());
        queue.copy(&window, &mut copied).unwrap();
        let output = output.reclaim().unwrap();
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data[words.clone()], a, b)), None);
        assert_eq!(first_mismatch(&copied.reclaim().unwrap().to_vec().unwrap(), &data[words.clone()]), None);
        assert_eq!(first_mismatch(window.host(), &data[words]), None);
        drop(window.reclaim().unwrap());
        assert_eq!(file.live_windows(), 0, "a dropped window is unmapped and released");
    });
}

#[test]
fn what_a_kernel_and_a_copy_write_into_a_read_write_window_reaches_the_file() {
    on_every_backend("what_a_kernel_and_a_copy_write_into_a_read_write_window_reaches_the_file", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (path, before) = words_file(&dir, "out.bin");
        let queue = Queue::new(device).unwrap();
        // SAFETY: the test owns the file; it reads it through std::fs only after the flush.
        let file = unsafe { WindowedFile::open_rw(device, &path) }.unwrap();
        let (kernel_words, copy_words) = (9..LEN / 2 + 3, LEN / 2 + 3..LEN - 1);
        let input = random_words(kernel_words.len());
        let (a, b) = coefficients();
        let shared_input = queue.share(host(device, &input));
        let mut kernel_window = queue.lend(file.window_mut::<u32>(byte_range(kernel_words.clone())).unwrap());
        affine_u32(&queue, &shared_input, &mut kernel_window, a, b).unwrap();
        let copied = random_words(copy_words.len());
        let shared_copy = queue.share(host(device, &copied));
        let mut copy_window = queue.lend(file.window_mut::<u32>(byte_range(copy_words.clone())).unwrap());
        queue.copy(&shared_copy, &mut copy_window).unwrap();
        let mut kernel_window = kernel_window.reclaim().unwrap();
        let mut copy_window = copy_window.reclaim().unwrap();
        kernel_window.flush().unwrap();
        copy_window.flush().unwrap();
        drop((kernel_window, copy_window));
        let after: Vec<u32> = std::fs::read(&path)
            .unwrap()
            .chunks_exact(4)
            .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
            .collect();
        assert_eq!(first_mismatch(&after[kernel_words.clone()], &expected(&input, a, b)), None);
        assert_eq!(first_mismatch(&after[copy_words.clone()], &copied), None);
        assert_eq!(&after[..kernel_words.start], &before[..kernel_words.start], "before the windows");
        assert_eq!(&after[copy_words.end..], &before[copy_words.end..], "after the windows");
    });
}

/// The seed's pattern on a file: one read-write window, its chunks lent to kernels at
/// `device_ptr + offset` all at once, the window taken back whole and flushed.
#[test]
fn a_read_write_window_written_chunk_by_chunk_reaches_the_file() {
    on_every_backend("a_read_write_window_written_chunk_by_chunk_reaches_the_file", |device| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let queue = Queue::new(device).unwrap();
        // SAFETY: the test owns the file; it reads it through std::fs only after the flush.
        let file = unsafe { WindowedFile::create(device, &path, (LEN as u64 + 3) * 4) }.unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        let input = Chunked::new(host(device, &data));
        let mut window = file.window_mut::<u32>(byte_range(3..LEN + 3)).unwrap();
        window.as_mut_slice().fill(POISON);
        let output = Chunked::new(window);
        let chunk = LEN / 5;
        let mut leases: Vec<_> =
            output.chunk_all(chunk).unwrap().into_iter().map(|c| queue.lend(c)).collect();
        let reads: Vec<_> = input.read_all(chunk).unwrap().into_iter().map(|c| queue.share(c)).collect();
        for (read, lease) in reads.iter().zip(&mut leases) {
            affine_u32(&queue, read, lease, a, b).unwrap();
        }
        // Dropping the leases waits for their kernels, then releases the chunks.
        drop((leases, reads));
        let mut window = output.into_inner().unwrap();
        window.flush().unwrap();
        drop(window);
        let after: Vec<u32> = std::fs::read(&path)
            .unwrap()
            .chunks_exact(4)
            .map(|word| u32::from_ne_bytes(word.try_into().unwrap()))
            .collect();
        assert_eq!(&after[..3], &[0, 0, 0], "before the window");
        assert_eq!(first_mismatch(&after[3..], &expected(&data, a, b)), None);
    });
}

#[test]
fn cached_windows_are_read_by_kernels_within_the_pinned_budget() {
    on_every_backend("cached_windows_are_read_by_kernels_within_the_pinned_budget", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = words_file(&dir, "words.bin");
        let queue = Queue::new(device).unwrap();
        // SAFETY: the test owns the file and does not change it while windows of it live.
        let file = unsafe { WindowedFile::open(device, &path) }.unwrap();
        let chunk = 1 << 16;
        // Two windows' worth: the file is eight times the budget.
        let cache = WindowCache::<u32>::new(PinnedBudget::new(2 * chunk as u64 * 4));
        let (a, b) = coefficients();
        for start in (0..LEN).step_by(chunk) {
            let words = start..(start + chunk).min(LEN);
            let window = queue.share(cache.get(&file, byte_range(words.clone())).unwrap());
            let mut output = queue.lend(host(device, &vec![POISON; words.len()]));
            affine_u32(&queue, &window, &mut output, a, b).unwrap();
            let output = output.reclaim().unwrap();
            assert_eq!(first_mismatch(output.as_slice(), &expected(&data[words], a, b)), None);
        }
        let stats = cache.stats();
        assert_eq!(stats.misses as usize, LEN.div_ceil(chunk));
        assert!(stats.evictions >= stats.misses - 2, "{stats:?}");
        assert!(cache.budget().peak() <= cache.budget().limit());
    });
}

#[test]
fn a_buffer_processed_chunk_by_chunk_with_all_chunks_lent_at_once_matches_the_cpu() {
    on_every_backend(
        "a_buffer_processed_chunk_by_chunk_with_all_chunks_lent_at_once_matches_the_cpu",
        |device| {
            let queue = Queue::new(device).unwrap();
            let data = random_words(LEN);
            let (a, b) = coefficients();
            let input = Chunked::new(host(device, &data));
            let output = Chunked::new(host(device, &vec![POISON; LEN]));
            let chunk = LEN / 7;
            let mut lent: Vec<Lent<_>> =
                output.chunk_all(chunk).unwrap().into_iter().map(|c| queue.lend(c)).collect();
            let reads: Vec<_> = input.read_all(chunk).unwrap().into_iter().map(|c| queue.share(c)).collect();
            for (read, write) in reads.iter().zip(&mut lent) {
                affine_u32(&queue, read, write, a, b).unwrap();
            }
            // Overlaps of lent chunks are refused while they are in flight.
            let error = output.chunk(chunk - 1..chunk + 1).unwrap_err();
            assert!(matches!(error, Error::RangeInUse { .. }), "{error}");
            assert!(output.read(0..1).is_err());
            let chunks: Vec<_> = lent.into_iter().map(|lease| lease.reclaim().unwrap()).collect();
            assert_eq!(output.live_chunks(), chunks.len());
            drop((chunks, reads));
            let output = output.into_inner().unwrap();
            assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
            assert_eq!(first_mismatch(input.into_inner().unwrap().as_slice(), &data), None);
        },
    );
}

#[test]
fn a_guarded_chunk_leaves_the_chunk_beside_it_to_the_cpu() {
    on_every_backend("a_guarded_chunk_leaves_the_chunk_beside_it_to_the_cpu", |device| {
        let queue = Queue::new(device).unwrap();
        let page_words = hetmem::memory::page_size() / 4;
        let len = 8 * page_words;
        let data = random_words(len);
        let (a, b) = coefficients();
        let output = Chunked::new(host(device, &vec![POISON; len]));
        let mut guarded = queue.lend_guarded(output.chunk(0..4 * page_words).unwrap()).unwrap();
        let mut beside = output.chunk(4 * page_words..len).unwrap();
        // The CPU writes the chunk beside while the guarded one's pages are protected.
        beside.as_mut_slice().copy_from_slice(&data[4 * page_words..]);
        let input = queue.share(host(device, &data[..4 * page_words]));
        affine_u32(&queue, &input, &mut guarded, a, b).unwrap();
        let guarded = guarded.reclaim().unwrap();
        assert_eq!(first_mismatch(guarded.as_slice(), &expected(&data[..4 * page_words], a, b)), None);
        assert_eq!(first_mismatch(beside.as_slice(), &data[4 * page_words..]), None);
        // A chunk that shares a page with another cannot be guarded.
        drop(guarded);
        let odd = output.chunk(1..page_words + 1).unwrap();
        assert!(queue.lend_guarded(odd).is_err());
    });
}

/// One chunk on its way through device memory: its source and target ranges and the device
/// buffers charged to the budget.
struct ChunkInFlight {
    source: Shared<ReadChunk<HostBuf<u32>>>,
    device_in: Lent<DeviceBuf<u32>>,
    device_out: Lent<DeviceBuf<u32>>,
    target: Lent<Chunk<HostBuf<u32>>>,
}

impl ChunkInFlight {
    /// Waits for the chunk's work and frees its device buffers (and their budget).
    fn finish(self) {
        drop(self.target.reclaim().unwrap());
        drop(self.device_out.reclaim().unwrap());
        drop(self.device_in.reclaim().unwrap());
        drop(self.source.reclaim().unwrap());
    }
}

/// The input and output (8 MiB in all) stream through device buffers whose budget is a quarter
/// of that: at most two chunks in flight, each in a device input and output charged to it.
#[test]
fn a_working_set_four_times_the_device_budget_streams_through_it() {
    on_every_backend("a_working_set_four_times_the_device_budget_streams_through_it", |device| {
        let queue = Queue::new(device).unwrap();
        let len = 1 << 20;
        let chunk = len / 8;
        let data = random_words(len);
        let (a, b) = coefficients();
        let budget = DeviceBudget::new(2 * 2 * chunk as u64 * 4);
        assert_eq!(2 * len as u64 * 4, 4 * budget.limit(), "the working set is four budgets");
        let input = Chunked::new(host(device, &data));
        let output = Chunked::new(host(device, &vec![POISON; len]));
        let mut in_flight = VecDeque::<ChunkInFlight>::new();
        for start in (0..len).step_by(chunk) {
            if in_flight.len() == 2 {
                let refused = DeviceBuf::<u32>::with_budget(device, chunk, &budget).unwrap_err();
                assert!(
                    matches!(refused, Error::BudgetExceeded { budget: BudgetKind::DeviceMemory, .. }),
                    "{refused}"
                );
                in_flight.pop_front().expect("two chunks in flight").finish();
            }
            let words = start..start + chunk;
            let source = queue.share(input.read(words.clone()).unwrap());
            let mut device_in = queue.lend(DeviceBuf::<u32>::with_budget(device, chunk, &budget).unwrap());
            let mut device_out = queue.lend(DeviceBuf::<u32>::with_budget(device, chunk, &budget).unwrap());
            let mut target = queue.lend(output.chunk(words).unwrap());
            queue.copy(&source, &mut device_in).unwrap();
            affine_u32(&queue, &device_in, &mut device_out, a, b).unwrap();
            queue.copy(&device_out, &mut target).unwrap();
            in_flight.push_back(ChunkInFlight { source, device_in, device_out, target });
        }
        in_flight.into_iter().for_each(ChunkInFlight::finish);
        assert_eq!((budget.in_use(), budget.peak()), (0, budget.limit()));
        let output = output.into_inner().unwrap();
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
        assert_eq!(first_mismatch(input.into_inner().unwrap().as_slice(), &data), None);
    });
}
