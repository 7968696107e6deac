//! Every memory kind, end to end: the CPU writes fresh random data, the affine kernel (or the
//! CPU path on the CPU backend) transforms it into a poisoned output, the CPU reads it back and
//! compares with the CPU reference. Each test runs on the CPU backend and, where there is one,
//! on the GPU.

use hetmem::memory::{
    DeviceBuf, HostBuf, ManagedBuf, MappedFile, PageBox, PinMethod, PinOptions, PinnedPool, RegisterOptions,
};
use hetmem::ops::{affine_u32, affine_u32_cpu};
use hetmem::{Buffer, Device, Lease, Lent, Queue, WritableBuffer, backend::cuda::MemLocation};

use crate::support::{POISON, first_mismatch, on_every_backend, random_words};

const LEN: usize = (3 << 20) + 7;

fn coefficients() -> (u32, u32) {
    (fastrand::u32(..) | 1, fastrand::u32(..))
}

fn expected(input: &[u32], a: u32, b: u32) -> Vec<u32> {
    let mut out = vec![0; input.len()];
    affine_u32_cpu(input, &mut out, a, b);
    out
}

/// Runs the affine op from `input` into the poisoned `output`, reclaims, and returns the output.
fn transform<I, O>(queue: &Queue, input: &I, output: O, a: u32, b: u32) -> O
where
    I: Lease,
    I::Buf: Buffer<Elem = u32>,
    O: WritableBuffer<Elem = u32>,
{
    let mut output: Lent<O> = queue.lend(output);
    affine_u32(queue, input, &mut output, a, b).unwrap();
    output.reclaim().unwrap()
}

fn pinned(device: &Device, options: PinOptions, data: &[u32]) -> HostBuf<u32> {
    let mut buf = HostBuf::pinned(device, data.len(), options).unwrap();
    buf.as_mut_slice().copy_from_slice(data);
    buf
}

fn poisoned(device: &Device, options: PinOptions, len: usize) -> HostBuf<u32> {
    pinned(device, options, &vec![POISON; len])
}

fn check_pinned(device: &Device, method: PinMethod, write_combined_input: bool) {
    let queue = Queue::new(device).unwrap();
    let data = random_words(LEN);
    let (a, b) = coefficients();
    let input_options = PinOptions { method, write_combined: write_combined_input, ..PinOptions::default() };
    let input = queue.share(pinned(device, input_options, &data));
    let output = transform(
        &queue,
        &input,
        poisoned(device, PinOptions { method, ..PinOptions::default() }, LEN),
        a,
        b,
    );
    assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None, "{method:?}");
    // The shared input stayed readable and unchanged.
    assert_eq!(first_mismatch(input.host(), &data), None);
    let input = input.reclaim().unwrap();
    if device.as_cuda().is_some() {
        assert!(input.is_mapped() && output.is_mapped());
    }
}

#[test]
fn pinned_memory_registered() {
    on_every_backend("pinned_memory_registered", |device| check_pinned(device, PinMethod::Register, false));
}

#[test]
fn pinned_memory_from_the_driver() {
    on_every_backend("pinned_memory_from_the_driver", |device| {
        check_pinned(device, PinMethod::HostAlloc, false)
    });
}

#[test]
fn write_combined_input() {
    on_every_backend("write_combined_input", |device| check_pinned(device, PinMethod::HostAlloc, true));
}

#[test]
fn registered_page_boxes_on_base_and_huge_pages() {
    on_every_backend("registered_page_boxes_on_base_and_huge_pages", |device| {
        let queue = Queue::new(device).unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        let mut base = PageBox::<u32>::zeroed(LEN).unwrap();
        base.copy_from_slice(&data);
        let mut huge = PageBox::<u32>::huge(LEN).unwrap();
        huge.fill(POISON);
        let input = queue.share(HostBuf::register(device, base, RegisterOptions::default()).unwrap());
        let output = HostBuf::register(device, huge, RegisterOptions::default()).unwrap();
        let output = transform(&queue, &input, output, a, b);
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
    });
}

#[test]
fn a_registration_split_into_pieces_is_one_contiguous_buffer() {
    on_every_backend("a_registration_split_into_pieces_is_one_contiguous_buffer", |device| {
        let queue = Queue::new(device).unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        let options = RegisterOptions { max_piece_bytes: 1 << 20, ..RegisterOptions::default() };
        let mut memory = PageBox::<u32>::zeroed(LEN).unwrap();
        memory.copy_from_slice(&data);
        let input = HostBuf::register(device, memory, options).unwrap();
        if device.as_cuda().is_some() {
            assert_eq!(input.registration_pieces(), (LEN * 4).div_ceil(1 << 20));
        }
        let input = queue.share(input);
        let output = transform(&queue, &input, poisoned(device, PinOptions::default(), LEN), a, b);
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
    });
}

#[test]
fn a_read_only_file_read_by_the_kernel() {
    on_every_backend("a_read_only_file_read_by_the_kernel", |device| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("words.bin");
        let data = random_words(LEN);
        std::fs::write(&path, bytemuck::cast_slice(&data)).unwrap();
        let (a, b) = coefficients();
        let queue = Queue::new(device).unwrap();
        // SAFETY: the test owns the file and does not change it while it is mapped.
        let file = unsafe { MappedFile::<u32>::open(device, &path) }.unwrap();
        assert_eq!(file.is_registered(), device.as_cuda().is_some());
        let file = queue.share(file);
        let output = transform(&queue, &file, poisoned(device, PinOptions::default(), LEN), a, b);
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
        assert_eq!(first_mismatch(file.host(), &data), None);
    });
}

#[test]
fn managed_memory_with_prefetch() {
    on_every_backend("managed_memory_with_prefetch", |device| {
        let queue = Queue::new(device).unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        let mut input = ManagedBuf::<u32>::new(device, LEN).unwrap();
        input.as_mut_slice().copy_from_slice(&data);
        input.advise(hetmem::backend::cuda::Advice::ReadMostly).unwrap();
        let mut output = ManagedBuf::<u32>::new(device, LEN).unwrap();
        output.as_mut_slice().fill(POISON);
        let ordinal = queue.cuda_device().map_or(0, |gpu| gpu.ordinal());
        let mut input = queue.lend(input);
        let mut output = queue.lend(output);
        input.prefetch(MemLocation::Device(ordinal)).unwrap();
        output.prefetch(MemLocation::Device(ordinal)).unwrap();
        affine_u32(&queue, &input, &mut output, a, b).unwrap();
        output.prefetch(MemLocation::Host).unwrap();
        let output = output.reclaim().unwrap();
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
        let input = input.reclaim().unwrap();
        assert_eq!(first_mismatch(input.as_slice(), &data), None, "the input was only read");
    });
}

/// A prefetch of part of a managed allocation moves that part (the contents unchanged), and a
/// range past the end or of no bytes is refused by name, before the driver sees it.
#[test]
fn managed_prefetch_of_a_range_is_checked() {
    let Some(gpu) = hetmem::testing::cuda_device_or_skip("managed_prefetch_of_a_range_is_checked") else {
        return;
    };
    let device = Device::Cuda(gpu.clone());
    let data = random_words(LEN);
    let mut buffer = ManagedBuf::<u32>::new(&device, LEN).unwrap();
    buffer.as_mut_slice().copy_from_slice(&data);
    let stream = hetmem::backend::cuda::Stream::new(&gpu).unwrap();
    let alloc = buffer.managed_alloc().expect("a CUDA managed allocation");
    let bytes = alloc.len_bytes();
    let to_device = MemLocation::Device(gpu.ordinal());
    // SAFETY: `buffer` lives past the stream's synchronisation below.
    unsafe { alloc.prefetch_range(&stream, to_device, bytes / 4, bytes / 2) }.unwrap();
    // SAFETY: as above.
    unsafe { alloc.prefetch_range(&stream, MemLocation::Host, bytes / 4, bytes / 2) }.unwrap();
    stream.synchronize().unwrap();
    for (offset, len) in [(0, bytes + 1), (bytes / 2, bytes / 2 + 4), (4, 0), (usize::MAX, 8)] {
        // SAFETY: refused before anything is queued (and `buffer` outlives the stream anyway).
        let error = unsafe { alloc.prefetch_range(&stream, MemLocation::Host, offset, len) };
        let error = error.unwrap_err().to_string();
        assert!(error.contains("managed prefetch range"), "{offset}+{len}: {error}");
    }
    assert_eq!(first_mismatch(buffer.as_slice(), &data), None, "a prefetch changed the contents");
}

#[test]
fn device_memory_through_copies() {
    on_every_backend("device_memory_through_copies", |device| {
        let queue = Queue::new(device).unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        // The PinnedAsync path: unmapped pinned staging, copy engines, kernels on device memory.
        let unmapped = PinOptions { mapped: false, ..PinOptions::default() };
        let staging_in = queue.share(pinned(device, unmapped, &data));
        let mut device_in = queue.lend(DeviceBuf::<u32>::new(device, LEN).unwrap());
        let mut device_out = DeviceBuf::<u32>::new(device, LEN).unwrap();
        device_out.copy_from_slice(&vec![POISON; LEN]).unwrap();
        let mut device_out = queue.lend(device_out);
        let mut staging_out = queue.lend(poisoned(device, unmapped, LEN));
        queue.copy(&staging_in, &mut device_in).unwrap();
        affine_u32(&queue, &device_in, &mut device_out, a, b).unwrap();
        queue.copy(&device_out, &mut staging_out).unwrap();
        let staging_out = staging_out.reclaim().unwrap();
        let want = expected(&data, a, b);
        assert_eq!(first_mismatch(staging_out.as_slice(), &want), None);
        // The synchronous conveniences agree.
        let device_out = device_out.reclaim().unwrap();
        assert_eq!(first_mismatch(&device_out.to_vec().unwrap(), &want), None);
    });
}

#[test]
fn pooled_buffers_and_the_pool_accounting() {
    on_every_backend("pooled_buffers_and_the_pool_accounting", |device| {
        let queue = Queue::new(device).unwrap();
        let pool = PinnedPool::new(device, 256 << 20);
        for round in 0..3 {
            let data = random_words(LEN);
            let (a, b) = coefficients();
            let mut input = pool.acquire::<u32>(LEN, PinOptions::default()).unwrap();
            input.as_mut_slice().copy_from_slice(&data);
            let mut output = pool.acquire::<u32>(LEN, PinOptions::default()).unwrap();
            output.as_mut_slice().fill(POISON);
            let input = queue.share(input);
            let output = transform(&queue, &input, output, a, b);
            assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None, "round {round}");
            drop((input, output));
            let stats = pool.stats();
            assert_eq!(stats.bytes_in_use, 0);
            assert_eq!((stats.misses, stats.hits), (2, 2 * round as u64), "round {round}");
        }
        pool.trim();
        let stats = pool.stats();
        assert_eq!((stats.bytes_pinned, stats.bytes_in_use, stats.blocks_cached), (0, 0, 0));
    });
}

#[test]
fn guarded_buffers_are_read_and_written_by_the_gpu() {
    on_every_backend("guarded_buffers_are_read_and_written_by_the_gpu", |device| {
        let queue = Queue::new(device).unwrap();
        let data = random_words(LEN);
        let (a, b) = coefficients();
        let input = queue.lend_guarded(pinned(device, PinOptions::default(), &data)).unwrap();
        let mut output = queue.lend_guarded(poisoned(device, PinOptions::default(), LEN)).unwrap();
        affine_u32(&queue, &input, &mut output, a, b).unwrap();
        let output = output.reclaim().unwrap();
        assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
        let input = input.reclaim().unwrap();
        assert_eq!(first_mismatch(input.as_slice(), &data), None, "reclaim restores access");
    });
}

#[test]
fn the_same_buffers_cycle_through_many_lends() {
    on_every_backend("the_same_buffers_cycle_through_many_lends", |device| {
        let queue = Queue::new(device).unwrap();
        let mut input = HostBuf::<u32>::pinned(device, 4096, PinOptions::default()).unwrap();
        let mut output = HostBuf::<u32>::pinned(device, 4096, PinOptions::default()).unwrap();
        for _ in 0..50 {
            let data = random_words(4096);
            let (a, b) = coefficients();
            input.as_mut_slice().copy_from_slice(&data);
            output.as_mut_slice().fill(POISON);
            let shared = queue.share(input);
            output = transform(&queue, &shared, output, a, b);
            input = shared.reclaim().unwrap();
            assert_eq!(first_mismatch(output.as_slice(), &expected(&data, a, b)), None);
        }
    });
}
