//! Sizes a caller gives, checked before a kernel trusts them: every public constructor that
//! takes a size either refuses it with an error that names the cause, or describes exactly the
//! bytes its kernel (here: the CPU path, which indexes checked slices) touches. Property tests
//! over small, limit and arbitrary (wrapping) sizes, and the regression cases that once passed.

use hetmem::backend::cuda::LaunchConfig;
use hetmem::data::{FileRange, FileStream, LoadMethod, StreamOptions};
use hetmem::memory::{Chunked, WindowedFile};
use hetmem::ops::ct::{
    HISTOGRAM_BINS, HuWindow, MaskedGaussianStage, VolumeShape, gaussian_weights, masked_gaussian_cpu,
    mip_height_cpu,
};
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, MAX_SIDE, PixelLayout, SampleType, gaussian_cpu};
use hetmem::ops::{Checksum, affine_u32, affine_u32_cpu, checksum, checksum_cpu};
use hetmem::placement::Where;
use hetmem::stage::{
    FrameLayout, KernelCode, KernelStage, MAX_FRAME_BYTES, MAX_PLANES, Param, PlaneLayout, ScalarType, Stage,
};
use hetmem::{DeviceBuf, FrameFilter, HostBuf, PinOptions, Queue};
use proptest::prelude::*;

use crate::support::{POISON, cpu_device};

/// Sizes as a caller may give them: small ones, ones around `limit`, any at all (whose products
/// wrap), and the one whose product with 2 wraps to 2.
fn size(small: usize, limit: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0..small,
        2 => limit.saturating_sub(2)..=limit.saturating_add(2),
        2 => any::<usize>(),
        1 => Just((1usize << 63) + 1),
    ]
}

/// As [`size`], for file offsets and lengths.
fn file_size(small: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..small,
        2 => any::<u64>(),
        1 => (u64::MAX - 2)..=u64::MAX,
        1 => Just(1u64 << 63),
    ]
}

/// Byte offsets of a file: mostly whole words inside a small file, sometimes anything.
fn word_offset() -> impl Strategy<Value = u64> {
    prop_oneof![4 => (0..3300u64).prop_map(|word| 4 * word), 1 => file_size(13_000)]
}

/// The product of `factors`, exact up to 2^128 (and 2^128 above), for sizes that wrap in usize.
fn product(factors: &[usize]) -> u128 {
    factors.iter().fold(1u128, |product, &factor| product.saturating_mul(factor as u128))
}

fn layout() -> impl Strategy<Value = PixelLayout> {
    prop_oneof![
        Just(PixelLayout::Gray),
        Just(PixelLayout::Rgb),
        Just(PixelLayout::Rgba),
        Just(PixelLayout::Yuv420),
        Just(PixelLayout::Yuv422),
        Just(PixelLayout::Yuv444),
    ]
}

fn element() -> impl Strategy<Value = ScalarType> {
    prop_oneof![
        Just(ScalarType::U8),
        Just(ScalarType::U16),
        Just(ScalarType::I16),
        Just(ScalarType::F16),
        Just(ScalarType::F32),
        Just(ScalarType::U32),
    ]
}

#[test]
fn a_volume_shape_whose_voxels_wrap_is_refused() {
    // 2 x (2^63 + 1) x 1 is 2 mod 2^64: the shape once passed a 2-voxel buffer's length check.
    let error = VolumeShape::new(2, (1 << 63) + 1, 1).unwrap_err().to_string();
    assert!(error.contains("2x9223372036854775809x1"), "{error}");
    assert!(error.contains("more voxels than memory can address"), "{error}");
}

#[test]
fn a_frame_format_past_the_largest_side_is_refused() {
    let error = FrameFormat::new(131_073, 562_945_658_585_088, PixelLayout::Gray).unwrap_err().to_string();
    assert!(error.contains("width 131073") && error.contains(&format!("give 1 to {MAX_SIDE}")), "{error}");
}

#[test]
fn a_volume_layout_too_large_is_refused_before_its_slices_are_listed() {
    // Each slice fits; 2^40 of them would be a list of planes no machine holds.
    let error = FrameLayout::volume(1 << 40, 1, 1, ScalarType::U8).unwrap_err().to_string();
    assert!(error.contains(&format!("at most {MAX_PLANES}")), "{error}");
    let error = FrameLayout::volume(MAX_PLANES, 1 << 14, 1 << 14, ScalarType::F32).unwrap_err().to_string();
    assert!(error.contains("give fewer or smaller slices"), "{error}");
}

#[test]
fn a_checksum_pair_whose_end_wraps_is_refused() {
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let input = queue.share(HostBuf::<u8>::pinned(&device, 64, PinOptions::default()).unwrap());
    let mut sums = queue.lend(HostBuf::<u64>::pinned(&device, 2, PinOptions::default()).unwrap());
    // 2 * pair + 2 wraps to 0, which "fits" any buffer.
    let error = checksum(&queue, &input, 0, 64, 0, &mut sums, usize::MAX / 2).unwrap_err().to_string();
    assert!(error.contains("pair 9223372036854775807 of sums, which hold 1 pairs"), "{error}");
}

#[test]
fn stream_chunks_and_ranges_too_large_to_count_are_refused() {
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let options =
        |chunk_bytes| StreamOptions { method: LoadMethod::Staged, threads: 1, chunk_bytes, ring_depth: 1 };
    // A chunk whose staging buffer (the chunk and one block more) wraps to 0 bytes.
    let error = FileStream::new(&device, &queue, options(usize::MAX - 4095)).unwrap_err().to_string();
    assert!(error.contains("give at most 1073741824"), "{error}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.bin");
    std::fs::write(&path, [7u8; 100]).unwrap();
    let huge = FileRange { path, offset: 0, len: u64::MAX };
    let mut dst = queue.lend(DeviceBuf::<u8>::new(&device, 100).unwrap());
    let mut stream = FileStream::new(&device, &queue, options(4096)).unwrap();
    let error = stream.load_into(&[huge.clone(), huge], &mut dst, 0, &|_| {}).unwrap_err().to_string();
    assert!(error.contains("add up to more than 2^64 bytes"), "{error}");
}

#[test]
fn a_safetensors_header_describing_nearly_2_64_bytes_is_malformed() {
    // Eight tensors of 2^61 - 1 bytes each, valid one by one: 2^64 - 8 bytes after the header.
    let each = (1u64 << 61) - 1;
    let tensors: Vec<String> = (0..8)
        .map(|k| {
            let (start, end) = (k * each, (k + 1) * each);
            format!(r#""t{k}": {{"dtype": "U8", "shape": [{each}], "data_offsets": [{start}, {end}]}}"#)
        })
        .collect();
    let header = format!("{{{}}}", tensors.join(", "));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    std::fs::write(&path, [&(header.len() as u64).to_le_bytes()[..], header.as_bytes()].concat()).unwrap();
    let error = hetmem::data::SafetensorsHeader::read(&path).unwrap_err();
    assert!(matches!(error, hetmem::Error::MalformedFile { .. }), "{error}");
    assert!(error.to_string().contains("describes 18446744073709551608 bytes of tensors"), "{error}");
}

/// A stage whose kernel reads 1 KiB of constant 0; never launched.
fn table_stage() -> KernelStage {
    let block = FrameLayout::samples(256, ScalarType::U8).unwrap();
    let code = KernelCode::CudaC {
        name: "lut".into(),
        source: r#"extern "C" __global__ void lut(const unsigned char* x, unsigned char* y,
                                                  const unsigned char* t) {
            y[threadIdx.x] = t[4 * x[threadIdx.x]];
        }"#
        .into(),
    };
    // SAFETY: lut(const u8* x, u8* y, const u8* t) takes these parameters in order; thread i of
    // the 256 reads x[i] and t[4 * x[i]] (below 1024, the constant's declared bytes) and writes
    // y[i], inside both 256-byte buffers.
    unsafe {
        KernelStage::new(
            code,
            "lut",
            vec![block.clone()],
            vec![block],
            vec![Param::Input(0), Param::Output(0), Param::Constant { index: 0, bytes: 1024 }],
            LaunchConfig { grid: (1, 1, 1), block: (256, 1, 1), shared_bytes: 0 },
        )
    }
    .unwrap()
}

#[test]
fn a_constant_shorter_than_the_kernel_reads_is_refused_by_every_clone() {
    let stage = table_stage();
    let error = stage.clone().with_constants(vec![vec![1]]).unwrap_err().to_string();
    assert!(error.contains("constant 0 holds 1 bytes; its parameter declares 1024"), "{error}");
    let with_table = stage.with_constants(vec![vec![3; 1024]]).unwrap();
    // A clone of a stage with its constants can only be given constants of the same lengths.
    let error = with_table.clone().with_constants(vec![vec![3; 1023]]).unwrap_err().to_string();
    assert!(error.contains("constant 0 holds 1023 bytes"), "{error}");
    let error = with_table.with_constants(vec![]).unwrap_err().to_string();
    assert!(error.contains("0 constants given; the kernel's parameters pass 1"), "{error}");
}

/// A stage's kernel runs with the parameters and constants it was prepared with: what another
/// stage prepared (another kernel, or constants of other lengths) is refused; a clone's is not.
#[test]
fn a_kernel_stage_refuses_what_another_stage_prepared() {
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let table = table_stage().with_constants(vec![vec![3; 1024]]).unwrap();
    let mut prepared = table.prepare(&queue, hetmem::Strategy::Copy, &[Where::Device]).unwrap();
    let input = queue.share(HostBuf::<u8>::pinned(&device, 256, PinOptions::default()).unwrap());
    let mut output = [queue.lend(HostBuf::<u8>::pinned(&device, 256, PinOptions::default()).unwrap())];
    let other = table_stage().with_constants(vec![vec![3; 1024]]).unwrap();
    let error = other.queue(&mut prepared, &queue, std::slice::from_ref(&input), &mut output).unwrap_err();
    assert!(error.to_string().contains("prepared for another KernelStage"), "{error}");
    // A clone is the same kernel with the same declarations: it gets as far as the backend.
    let error =
        table.clone().queue(&mut prepared, &queue, std::slice::from_ref(&input), &mut output).unwrap_err();
    assert!(
        matches!(error, hetmem::Error::NeedsGpu { .. })
            && error.to_string().contains("prepared on a queue of the CPU backend"),
        "{error}"
    );
    // A clone given other constants is another stage: it cannot run with the first's.
    let bare = table_stage();
    let first = bare.clone().with_constants(vec![vec![3; 1024]]).unwrap();
    let second = bare.with_constants(vec![vec![4; 1024]]).unwrap();
    let mut prepared = first.prepare(&queue, hetmem::Strategy::Copy, &[Where::Device]).unwrap();
    let error = second.queue(&mut prepared, &queue, &[input], &mut output).unwrap_err();
    assert!(error.to_string().contains("prepared for another KernelStage"), "{error}");
}

/// GPU: a stage cloned before its constants were given is refused where its kernel would be
/// launched, before any upload or compile.
#[test]
fn a_kernel_stage_without_its_constants_is_refused_on_the_gpu() {
    let Some(gpu) =
        hetmem::testing::cuda_device_or_skip("a_kernel_stage_without_its_constants_is_refused_on_the_gpu")
    else {
        return;
    };
    let device = hetmem::Device::Cuda(gpu);
    for strategy in [hetmem::Strategy::Copy, hetmem::Strategy::ZeroCopy] {
        let error = FrameFilter::with_stage(&device, strategy, table_stage()).unwrap_err().to_string();
        assert!(error.contains("0 constants given; the kernel's parameters pass 1"), "{strategy}: {error}");
    }
}

/// A format is refused unless both sides are 1 to MAX_SIDE; then its planes lie one after
/// another to the frame's end, its stage layout is as long, and the CPU blur takes buffers
/// of exactly that length.
fn check_a_frame_format_is_refused_or_its_planes_tile_its_frame(
    width: usize,
    height: usize,
    layout: PixelLayout,
    wide: bool,
) -> Result<(), TestCaseError> {
    let fits = (1..=MAX_SIDE).contains(&width) && (1..=MAX_SIDE).contains(&height);
    let format = match FrameFormat::new(width, height, layout) {
        Err(error) => {
            prop_assert!(!fits, "{width}x{height} refused: {error}");
            prop_assert!(error.to_string().contains(&format!("give 1 to {MAX_SIDE} pixels")), "{error}");
            return Ok(());
        }
        Ok(format) => format,
    };
    prop_assert!(fits, "{width}x{height} accepted");
    let sample = if wide { SampleType::U16 } else { SampleType::U8 };
    let format = format.with_sample(sample);
    prop_assert_eq!(
        (format.width(), format.height(), format.layout(), format.sample()),
        (width, height, layout, sample)
    );
    let mut end = 0u128;
    for plane in format.planes() {
        prop_assert_eq!(plane.offset as u128, end);
        end += plane.width as u128 * plane.height as u128 * plane.channels as u128 * sample.bytes() as u128;
    }
    prop_assert_eq!(end, format.frame_bytes() as u128);
    prop_assert_eq!(FrameLayout::from(&format).bytes(), format.frame_bytes());
    let frame = format.frame_bytes();
    if frame <= 1 << 16 {
        let kernel = Gaussian::new(Some(2), None, Border::default()).unwrap();
        let input: Vec<u8> = (0..frame + 1).map(|_| fastrand::u8(..)).collect();
        let mut output = vec![POISON as u8; frame + 1];
        prop_assert!(gaussian_cpu(&format, &kernel, &input[..frame], &mut output[..frame]).is_ok());
        prop_assert_eq!(output[frame], POISON as u8, "a byte past the frame was written");
        prop_assert!(gaussian_cpu(&format, &kernel, &input, &mut output).is_err());
        prop_assert!(gaussian_cpu(&format, &kernel, &input[..frame - 1], &mut output[..frame - 1]).is_err());
    }
    Ok(())
}

/// A shape is refused unless its sides are at least 1 and four bytes a voxel fit in memory;
/// then it counts its voxels, the CPU paths take exactly that many and the projection
/// covers every column, and the stage's layouts are that many voxels of each element.
fn check_a_volume_shape_is_refused_or_counts_exactly_its_voxels(
    depth: usize,
    height: usize,
    width: usize,
) -> Result<(), TestCaseError> {
    let product = product(&[depth, height, width]);
    let fits = depth > 0 && height > 0 && width > 0 && product.saturating_mul(4) <= usize::MAX as u128;
    let shape = match VolumeShape::new(depth, height, width) {
        Err(error) => {
            prop_assert!(!fits, "{depth}x{height}x{width} refused: {error}");
            return Ok(());
        }
        Ok(shape) => shape,
    };
    prop_assert!(fits, "{depth}x{height}x{width} accepted");
    prop_assert_eq!((shape.depth(), shape.height(), shape.width()), (depth, height, width));
    prop_assert_eq!(shape.voxels() as u128, product);
    let voxels = shape.voxels();
    match MaskedGaussianStage::new(shape, 1, 1.0) {
        Ok(stage) => {
            let bytes: Vec<usize> =
                stage.inputs().iter().chain(stage.outputs()).map(FrameLayout::bytes).collect();
            prop_assert_eq!(bytes, vec![2 * voxels, voxels, 4 * voxels]);
        }
        Err(error) => prop_assert!(
            depth > MAX_PLANES || product.saturating_mul(4) > MAX_FRAME_BYTES as u128,
            "{depth}x{height}x{width} refused by the stage: {error}"
        ),
    }
    if voxels <= 4096 {
        let hu: Vec<i16> = (0..voxels + 1).map(|_| fastrand::i16(..)).collect();
        let projection = mip_height_cpu(shape, &hu[..voxels]).unwrap();
        prop_assert_eq!(projection.len(), depth * width);
        for (at, &brightest) in projection.iter().enumerate() {
            let (z, x) = (at / width, at % width);
            let column = (0..height).map(|y| hu[(z * height + y) * width + x]).max().unwrap();
            prop_assert_eq!(brightest, column, "column z {} x {}", z, x);
        }
        prop_assert!(mip_height_cpu(shape, &hu).is_err());
        let labels = vec![1u8; voxels + 1];
        let weights = gaussian_weights(1.0).unwrap();
        prop_assert_eq!(
            masked_gaussian_cpu(shape, &hu[..voxels], &labels[..voxels], 1, &weights).unwrap().len(),
            voxels
        );
        prop_assert!(masked_gaussian_cpu(shape, &hu[..voxels], &labels, 1, &weights).is_err());
    }
    Ok(())
}

/// A volume layout is refused unless it has 1 to MAX_PLANES slices and at most
/// MAX_FRAME_BYTES; then it is its slices packed one after another.
fn check_a_volume_layout_is_refused_or_its_slices_packed(
    depth: usize,
    height: usize,
    width: usize,
    element: ScalarType,
) -> Result<(), TestCaseError> {
    let bytes = product(&[depth, height, width, element.size()]);
    let fits =
        depth > 0 && height > 0 && width > 0 && depth <= MAX_PLANES && bytes <= MAX_FRAME_BYTES as u128;
    match FrameLayout::volume(depth, height, width, element) {
        Err(error) => prop_assert!(!fits, "{depth}x{height}x{width} refused: {error}"),
        Ok(layout) => {
            prop_assert!(fits, "{depth}x{height}x{width} accepted");
            prop_assert_eq!(layout.bytes() as u128, bytes);
            prop_assert_eq!(layout.planes().len(), depth);
            let slice = height * width * element.size();
            for (z, plane) in layout.planes().iter().enumerate() {
                prop_assert_eq!(
                    (plane.offset, plane.pitch, plane.span()),
                    (z * slice, width * element.size(), slice)
                );
            }
        }
    }
    Ok(())
}

/// A layout of any planes is refused unless each is non-empty, aligned, its pitch at least
/// its row, within MAX_FRAME_BYTES and apart from the others; then it is exactly as long as
/// its furthest plane's end (what a kernel within its planes touches).
fn check_a_frame_layout_is_refused_or_as_long_as_its_furthest_plane(
    planes: Vec<PlaneSpec>,
) -> Result<(), TestCaseError> {
    let mut next = 0usize;
    let planes: Vec<PlaneLayout> = planes
        .into_iter()
        .map(|(offset, (width, height, channels), element, (padding, packed, gap))| {
            // Mostly right after the plane before (a gap of whole samples on), sometimes anywhere.
            let offset = offset.unwrap_or(next.saturating_add(gap * element.size()));
            let plane = PlaneLayout::packed(offset, width, height, channels, element);
            // Mostly padded rows of a sensible pitch; sometimes any pitch at all.
            let pitch = if packed {
                plane.pitch.saturating_add(padding.saturating_mul(element.size()))
            } else {
                padding
            };
            let plane = PlaneLayout { pitch, ..plane };
            next =
                plane.offset.saturating_add(plane.span()).checked_next_multiple_of(4).unwrap_or(usize::MAX);
            plane
        })
        .collect();
    let mut extents = Vec::new();
    let mut valid = !planes.is_empty();
    for plane in &planes {
        let size = plane.element.size() as u128;
        let row = product(&[plane.width, plane.channels, plane.element.size()]);
        let nonempty = plane.width > 0 && plane.height > 0 && plane.channels > 0;
        let rows = product(&[plane.height.saturating_sub(1), plane.pitch]);
        let end = (plane.offset as u128).saturating_add(rows).saturating_add(row);
        valid &= nonempty
            && plane.pitch as u128 >= row
            && (plane.offset as u128).is_multiple_of(size)
            && (plane.pitch as u128).is_multiple_of(size)
            && row <= MAX_FRAME_BYTES as u128
            && end <= MAX_FRAME_BYTES as u128;
        extents.push((plane.offset as u128, end));
    }
    for (i, a) in extents.iter().enumerate() {
        for b in &extents[i + 1..] {
            valid &= a.1 <= b.0 || b.1 <= a.0;
        }
    }
    match FrameLayout::new(planes.clone()) {
        Err(error) => prop_assert!(!valid, "{planes:?} refused: {error}"),
        Ok(layout) => {
            prop_assert!(valid, "{planes:?} accepted");
            prop_assert_eq!(layout.bytes() as u128, extents.iter().map(|e| e.1).max().unwrap());
            prop_assert_eq!(layout.planes(), &planes[..]);
        }
    }
    Ok(())
}

/// A window is refused unless it is a non-empty range of whole, aligned words inside the
/// file; then it shows exactly those bytes.
fn check_a_file_window_is_refused_or_shows_exactly_its_range(
    start: u64,
    end: u64,
) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("words.bin");
    let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&path, &bytes).unwrap();
    let device = cpu_device();
    let valid = start < end
        && end <= bytes.len() as u64
        && start.is_multiple_of(4)
        && (end - start).is_multiple_of(4);
    // SAFETY: the file is this test's own; nothing changes it while its windows live.
    let file = unsafe { WindowedFile::open_rw(&device, &path) }.unwrap();
    match file.window::<u32>(start..end) {
        Err(error) => prop_assert!(!valid, "bytes {start}..{end} refused: {error}"),
        Ok(window) => {
            prop_assert!(valid, "bytes {start}..{end} accepted");
            prop_assert_eq!(window.file_range(), start..end);
            prop_assert_eq!(
                bytemuck::cast_slice::<u32, u8>(window.as_slice()),
                &bytes[start as usize..end as usize]
            );
        }
    }
    match file.window_mut::<u32>(start..end) {
        Err(error) => prop_assert!(!valid, "bytes {start}..{end} refused read-write: {error}"),
        Ok(window) => {
            prop_assert!(valid, "bytes {start}..{end} accepted read-write");
            prop_assert_eq!(4 * window.len() as u64, end - start);
            prop_assert_eq!(
                bytemuck::cast_slice::<u32, u8>(window.as_slice()),
                &bytes[start as usize..end as usize]
            );
        }
    }
    Ok(())
}

/// A chunk is refused unless it is a non-empty range inside its buffer; then the work it is
/// lent to writes exactly its elements, and cutting the buffer into chunks of any length
/// covers it in order.
fn check_a_chunk_is_refused_or_its_work_writes_exactly_its_range(
    start: usize,
    end: usize,
    chunk_len: usize,
) -> Result<(), TestCaseError> {
    const LEN: usize = 1021;
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let mut buffer = HostBuf::<u32>::pinned(&device, LEN, PinOptions::default()).unwrap();
    buffer.as_mut_slice().fill(POISON);
    let chunked = Chunked::new(buffer);
    let valid = start < end && end <= LEN;
    match chunked.chunk(start..end) {
        Err(error) => prop_assert!(!valid, "elements {start}..{end} refused: {error}"),
        Ok(chunk) => {
            prop_assert!(valid, "elements {start}..{end} accepted");
            prop_assert_eq!((chunk.range(), chunk.len()), (start..end, end - start));
            let words: Vec<u32> = (0..end - start).map(|_| fastrand::u32(..)).collect();
            let mut input = HostBuf::<u32>::pinned(&device, words.len(), PinOptions::default()).unwrap();
            input.as_mut_slice().copy_from_slice(&words);
            let input = queue.share(input);
            let mut lent = queue.lend(chunk);
            affine_u32(&queue, &input, &mut lent, 3, 7).unwrap();
            drop(lent.reclaim().unwrap());
            let whole = chunked.read(0..LEN).unwrap();
            let mut want = vec![0; words.len()];
            affine_u32_cpu(&words, &mut want, 3, 7);
            prop_assert_eq!(&whole.as_slice()[start..end], &want[..]);
            prop_assert!(
                whole.as_slice()[..start].iter().chain(&whole.as_slice()[end..]).all(|&w| w == POISON)
            );
        }
    }
    match chunked.read_all(chunk_len) {
        Err(error) => prop_assert!(chunk_len == 0, "chunks of {chunk_len} refused: {error}"),
        Ok(chunks) => {
            prop_assert!(chunk_len > 0);
            prop_assert_eq!(chunks.len(), LEN.div_ceil(chunk_len));
            let mut next = 0;
            for chunk in &chunks {
                prop_assert_eq!(chunk.range().start, next);
                prop_assert!(chunk.len() <= chunk_len && !chunk.is_empty());
                next = chunk.range().end;
            }
            prop_assert_eq!(next, LEN);
        }
    }
    Ok(())
}

/// A copy of a range is refused unless it lies inside both buffers; then it copies exactly
/// those elements and writes no other.
fn check_a_range_copy_is_refused_or_copies_exactly_its_elements(
    src_offset: usize,
    dst_offset: usize,
    len: usize,
) -> Result<(), TestCaseError> {
    let (src_len, dst_len) = (700, 500);
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let words: Vec<u32> = (0..src_len).map(|_| fastrand::u32(..)).collect();
    let mut src = HostBuf::<u32>::pinned(&device, src_len, PinOptions::default()).unwrap();
    src.as_mut_slice().copy_from_slice(&words);
    let src = queue.share(src);
    let mut dst = HostBuf::<u32>::pinned(&device, dst_len, PinOptions::default()).unwrap();
    dst.as_mut_slice().fill(POISON);
    let mut dst = queue.lend(dst);
    let inside = |offset: usize, of: usize| offset.checked_add(len).is_some_and(|end| end <= of);
    let valid = inside(src_offset, src_len) && inside(dst_offset, dst_len);
    let result = queue.copy_range(&src, src_offset, &mut dst, dst_offset, len);
    let dst = dst.reclaim().unwrap();
    match result {
        Err(error) => {
            prop_assert!(!valid, "{len} from {src_offset} to {dst_offset} refused: {error}");
            prop_assert!(dst.as_slice().iter().all(|&w| w == POISON));
        }
        Ok(()) => {
            prop_assert!(valid, "{len} from {src_offset} to {dst_offset} accepted");
            let (got, range) = (dst.as_slice(), dst_offset..dst_offset + len);
            prop_assert_eq!(&got[range.clone()], &words[src_offset..src_offset + len]);
            prop_assert!(got[..range.start].iter().chain(&got[range.end..]).all(|&w| w == POISON));
        }
    }
    Ok(())
}

/// A checksum is refused unless its bytes lie inside the input, start on a word, and its
/// pair inside the sums; then it adds exactly those bytes' sums into exactly that pair.
fn check_a_checksum_is_refused_or_sums_exactly_its_range_into_its_pair(
    offset: usize,
    len: usize,
    pair: usize,
    file_word: u64,
) -> Result<(), TestCaseError> {
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let bytes: Vec<u8> = (0..1000).map(|_| fastrand::u8(..)).collect();
    let mut input = HostBuf::<u8>::pinned(&device, bytes.len(), PinOptions::default()).unwrap();
    input.as_mut_slice().copy_from_slice(&bytes);
    let input = queue.share(input);
    let mut sums = HostBuf::<u64>::pinned(&device, 6, PinOptions::default()).unwrap();
    sums.as_mut_slice().fill(u64::from(POISON));
    let mut sums = queue.lend(sums);
    let valid =
        offset.is_multiple_of(4) && offset.checked_add(len).is_some_and(|end| end <= bytes.len()) && pair < 3;
    let result = checksum(&queue, &input, offset, len, 4 * file_word, &mut sums, pair);
    let sums = sums.reclaim().unwrap();
    match result {
        Err(error) => {
            prop_assert!(!valid, "{len} bytes from {offset} into pair {pair} refused: {error}");
            prop_assert!(sums.as_slice().iter().all(|&w| w == u64::from(POISON)));
        }
        Ok(()) => {
            prop_assert!(valid, "{len} bytes from {offset} into pair {pair} accepted");
            let poison = Checksum { sum: u64::from(POISON), weighted: u64::from(POISON) };
            let want = poison.combine(checksum_cpu(&bytes[offset..offset + len], 4 * file_word));
            for (index, &word) in sums.as_slice().iter().enumerate() {
                let expected = match index {
                    i if i == 2 * pair => want.sum,
                    i if i == 2 * pair + 1 => want.weighted,
                    _ => u64::from(POISON),
                };
                prop_assert_eq!(word, expected, "word {}", index);
            }
        }
    }
    Ok(())
}

/// Stream options are refused unless they name 1 to 1024 threads, a ring of 1 to 4096 and a
/// chunk of whole blocks up to 1 GiB; ranges are refused unless they lie inside their files and the destination,
/// and then exactly their bytes land, one range after another.
fn check_a_stream_is_refused_or_lands_exactly_its_ranges(
    threads: usize,
    ring_depth: usize,
    chunk_bytes: usize,
    ranges: Vec<(u64, u64)>,
    dst_offset: usize,
) -> Result<(), TestCaseError> {
    let device = cpu_device();
    let queue = Queue::new(&device).unwrap();
    let options = StreamOptions { method: LoadMethod::Staged, threads, chunk_bytes, ring_depth };
    let valid_options = (1..=1024).contains(&threads)
        && (1..=4096).contains(&ring_depth)
        && chunk_bytes > 0
        && chunk_bytes.is_multiple_of(4096)
        && chunk_bytes <= 1 << 30;
    let mut stream = match FileStream::new(&device, &queue, options) {
        Err(error) => {
            prop_assert!(!valid_options, "{options:?} refused: {error}");
            return Ok(());
        }
        Ok(stream) => stream,
    };
    prop_assert!(valid_options, "{options:?} accepted");
    // Staging buffers are allocated per run: keep the accepted ones small.
    prop_assume!(threads <= 16 && ring_depth <= 16 && chunk_bytes <= 3 * 4096);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..6000).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&path, &bytes).unwrap();
    let ranges: Vec<FileRange> =
        ranges.into_iter().map(|(offset, len)| FileRange { path: path.clone(), offset, len }).collect();
    let dst_len = 10_000;
    let mut dst = DeviceBuf::<u8>::new(&device, dst_len).unwrap();
    dst.copy_from_slice(&vec![POISON as u8; dst_len]).unwrap();
    let mut dst = queue.lend(dst);
    let inside =
        ranges.iter().all(|r| r.offset.checked_add(r.len).is_some_and(|end| end <= bytes.len() as u64));
    let total: u128 = ranges.iter().map(|r| u128::from(r.len)).sum();
    let valid = inside && dst_offset as u128 + total <= dst_len as u128;
    let result = stream.load_into(&ranges, &mut dst, dst_offset, &|_| {});
    let got = dst.reclaim().unwrap().to_vec().unwrap();
    match result {
        Err(error) => prop_assert!(!valid, "{ranges:?} at {dst_offset} refused: {error}"),
        Ok(report) => {
            prop_assert!(valid, "{ranges:?} at {dst_offset} accepted");
            let want: Vec<u8> = ranges
                .iter()
                .flat_map(|r| bytes[r.offset as usize..(r.offset + r.len) as usize].iter().copied())
                .collect();
            prop_assert_eq!(report.bytes, want.len() as u64);
            prop_assert_eq!(&got[dst_offset..dst_offset + want.len()], &want[..]);
            prop_assert!(
                got[..dst_offset].iter().chain(&got[dst_offset + want.len()..]).all(|&b| b == POISON as u8)
            );
        }
    }
    Ok(())
}

/// A kernel stage's constants are refused unless numbered from 0, each declared with one
/// length of at least a byte; `with_constants` then takes exactly constants of those
/// lengths.
fn check_kernel_constants_are_refused_or_exactly_the_declared_lengths(
    declared: Vec<(usize, usize)>,
    given: Vec<usize>,
    use_declared: bool,
) -> Result<(), TestCaseError> {
    let block = FrameLayout::samples(8, ScalarType::U8).unwrap();
    let mut params = vec![Param::Input(0), Param::Output(0)];
    params.extend(declared.iter().map(|&(index, bytes)| Param::Constant { index, bytes }));
    let mut lengths: Vec<Option<usize>> = Vec::new();
    let mut valid = true;
    for &(index, bytes) in &declared {
        valid &= index < params.len() && bytes > 0;
        if !valid {
            break;
        }
        if lengths.len() <= index {
            lengths.resize(index + 1, None);
        }
        valid &= lengths[index].is_none_or(|earlier| earlier == bytes);
        lengths[index] = Some(bytes);
    }
    valid &= lengths.iter().all(Option::is_some);
    let code = KernelCode::CudaC { name: "k".into(), source: "extern \"C\" __global__ void k() {}".into() };
    let config = LaunchConfig::linear(8, 8, 1);
    // SAFETY: never launched: only the constructor's and with_constants' checks run.
    let stage = unsafe { KernelStage::new(code, "k", vec![block.clone()], vec![block], params, config) };
    let stage = match stage {
        Err(error) => {
            prop_assert!(!valid, "{declared:?} refused: {error}");
            return Ok(());
        }
        Ok(stage) => stage,
    };
    prop_assert!(valid, "{declared:?} accepted");
    let lengths: Vec<usize> = lengths.into_iter().map(Option::unwrap).collect();
    let given =
        if use_declared && lengths.iter().all(|&bytes| bytes <= 4096) { lengths.clone() } else { given };
    let matches = given == lengths;
    let constants: Vec<Vec<u8>> = given.iter().map(|&len| vec![0x5A; len]).collect();
    match stage.with_constants(constants) {
        Err(error) => prop_assert!(!matches, "{given:?} for {lengths:?} refused: {error}"),
        Ok(stage) => {
            prop_assert!(matches, "{given:?} for {lengths:?} accepted");
            let uses = stage.constants(&cpu_device());
            prop_assert_eq!(uses.iter().map(|u| u.bytes as usize).collect::<Vec<_>>(), lengths);
        }
    }
    Ok(())
}

/// A window of HU is refused unless its low end is at most its high end; then every value
/// inside it falls in one of the histogram's bins and none outside.
fn check_a_hu_window_is_refused_or_bins_every_value_inside_it(
    lo: i16,
    hi: i16,
    value: i16,
) -> Result<(), TestCaseError> {
    match HuWindow::new(lo, hi) {
        Err(error) => prop_assert!(lo > hi, "[{lo}, {hi}] refused: {error}"),
        Ok(window) => {
            prop_assert!(lo <= hi && (window.lo(), window.hi()) == (lo, hi));
            match window.bin(value) {
                Some(bin) => prop_assert!((lo..=hi).contains(&value) && bin < HISTOGRAM_BINS),
                None => prop_assert!(!(lo..=hi).contains(&value)),
            }
        }
    }
    Ok(())
}

/// One plane of a layout as generated: an offset (`None`: after the plane before), width, height
/// and channels, the element, and a row padding, whether the pitch is a packed row plus it (or
/// the padding alone), and a gap before the plane.
type PlaneSpec = (Option<usize>, (usize, usize, usize), ScalarType, (usize, bool, usize));

/// Mostly small values, sometimes any of `wide`'s: most cases are worth accepting, and the rest
/// still reach the limits and the wrapping products.
fn mostly<T: std::fmt::Debug + 'static>(
    small: impl Strategy<Value = T> + 'static,
    wide: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![3 => small, 1 => wide].boxed()
}

// Each property is a function above, whose comment says what it holds.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_frame_format_is_refused_or_its_planes_tile_its_frame(
        width in size(48, MAX_SIDE),
        height in size(48, MAX_SIDE),
        layout in layout(),
        wide in any::<bool>(),
    ) {
        check_a_frame_format_is_refused_or_its_planes_tile_its_frame(width, height, layout, wide)?;
    }

    #[test]
    fn a_volume_shape_is_refused_or_counts_exactly_its_voxels(
        depth in size(6, MAX_PLANES),
        height in size(9, 1 << 20),
        width in size(9, 1 << 20),
    ) {
        check_a_volume_shape_is_refused_or_counts_exactly_its_voxels(depth, height, width)?;
    }

    #[test]
    fn a_volume_layout_is_refused_or_its_slices_packed(
        depth in size(6, MAX_PLANES),
        height in size(9, 1 << 20),
        width in size(9, 1 << 20),
        element in element(),
    ) {
        check_a_volume_layout_is_refused_or_its_slices_packed(depth, height, width, element)?;
    }

    #[test]
    fn a_frame_layout_is_refused_or_as_long_as_its_furthest_plane(
        planes in proptest::collection::vec(
            (
                mostly(Just(None), size(5000, MAX_FRAME_BYTES).prop_map(Some)),
                (
                    mostly(1..70usize, size(70, 1 << 20)),
                    mostly(1..9usize, size(9, 1 << 20)),
                    mostly(1..5usize, size(5, 1 << 20)),
                ),
                element(),
                (mostly(0..9usize, size(9, 1 << 20)), mostly(Just(true), Just(false)), 0..3usize),
            ),
            0..4,
        ),
    ) {
        check_a_frame_layout_is_refused_or_as_long_as_its_furthest_plane(planes)?;
    }

    #[test]
    fn a_file_window_is_refused_or_shows_exactly_its_range(start in word_offset(), end in word_offset()) {
        check_a_file_window_is_refused_or_shows_exactly_its_range(start, end)?;
    }

    #[test]
    fn a_chunk_is_refused_or_its_work_writes_exactly_its_range(
        start in size(1100, 1021),
        end in size(1100, 1021),
        chunk_len in size(300, 1021),
    ) {
        check_a_chunk_is_refused_or_its_work_writes_exactly_its_range(start, end, chunk_len)?;
    }

    #[test]
    fn a_range_copy_is_refused_or_copies_exactly_its_elements(
        src_offset in mostly(0..700usize, size(700, 700)),
        dst_offset in mostly(0..500usize, size(500, 500)),
        len in mostly(0..400usize, size(400, 700)),
    ) {
        check_a_range_copy_is_refused_or_copies_exactly_its_elements(src_offset, dst_offset, len)?;
    }

    #[test]
    fn a_checksum_is_refused_or_sums_exactly_its_range_into_its_pair(
        offset in mostly((0..250usize).prop_map(|word| 4 * word), size(1100, 1000)),
        len in mostly(0..500usize, size(1100, 1000)),
        pair in mostly(0..4usize, size(5, usize::MAX / 2)),
        file_word in 0u64..1 << 40,
    ) {
        check_a_checksum_is_refused_or_sums_exactly_its_range_into_its_pair(offset, len, pair, file_word)?;
    }

    #[test]
    fn a_stream_is_refused_or_lands_exactly_its_ranges(
        threads in mostly(1..4usize, size(4, 16)),
        ring_depth in mostly(1..4usize, size(4, 16)),
        chunk_bytes in mostly((1..4usize).prop_map(|blocks| 4096 * blocks), size(3 * 4096, 1 << 30)),
        ranges in proptest::collection::vec(
            (mostly(0..6000u64, file_size(7000)), mostly(0..3000u64, file_size(7000))),
            1..3,
        ),
        dst_offset in mostly(0..1000usize, size(100, 20_000)),
    ) {
        check_a_stream_is_refused_or_lands_exactly_its_ranges(
            threads, ring_depth, chunk_bytes, ranges, dst_offset,
        )?;
    }

    #[test]
    fn kernel_constants_are_refused_or_exactly_the_declared_lengths(
        declared in proptest::collection::vec(
            (mostly(0..3usize, size(4, 8)), mostly(1..2048usize, prop_oneof![Just(0usize), any::<usize>()])),
            0..4,
        ),
        given in proptest::collection::vec(0usize..2100, 0..4),
        use_declared in any::<bool>(),
    ) {
        check_kernel_constants_are_refused_or_exactly_the_declared_lengths(declared, given, use_declared)?;
    }

    #[test]
    fn a_hu_window_is_refused_or_bins_every_value_inside_it(
        lo in any::<i16>(),
        hi in any::<i16>(),
        value in any::<i16>(),
    ) {
        check_a_hu_window_is_refused_or_bins_every_value_inside_it(lo, hi, value)?;
    }
}

/// GPU: kernels that read words through a lease's address refuse a chunk that starts off their
/// words' alignment (a misaligned load faults and loses the context), by name.
#[test]
fn a_chunk_off_the_kernels_word_alignment_is_refused_on_the_gpu() {
    let Some(gpu) =
        hetmem::testing::cuda_device_or_skip("a_chunk_off_the_kernels_word_alignment_is_refused_on_the_gpu")
    else {
        return;
    };
    let device = hetmem::Device::Cuda(gpu);
    let queue = Queue::new(&device).unwrap();
    let bytes = Chunked::new(HostBuf::<u8>::pinned(&device, 4096, PinOptions::default()).unwrap());
    let odd = queue.share(bytes.read(1..1025).unwrap());
    let mut sums = queue.lend(HostBuf::<u64>::pinned(&device, 2, PinOptions::default()).unwrap());
    let error = checksum(&queue, &odd, 0, 1024, 0, &mut sums, 0).unwrap_err().to_string();
    assert!(error.contains("not a multiple of 4 bytes"), "{error}");
    drop(sums.reclaim().unwrap());
    drop(odd.reclaim().unwrap());
}

/// More pinned memory than the machine has is refused at once, naming the machine's size: the
/// driver took more than a minute to fail a 256 GiB request on a 128 GiB machine.
#[test]
fn pinning_more_than_the_machine_has_is_refused_at_once() {
    let device = cpu_device();
    // SAFETY: sysconf reads system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let total = u64::try_from(pages).unwrap() * u64::try_from(page).unwrap();
    let too_many = usize::try_from(total).unwrap() + 4096;
    let started = std::time::Instant::now();
    let error = HostBuf::<u8>::pinned(&device, too_many, PinOptions::default()).unwrap_err().to_string();
    assert!(error.contains("more than this machine's") && error.contains(&total.to_string()), "{error}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refused only after {:?}",
        started.elapsed()
    );
    // A size the machine holds is still pinned (and zeroed).
    let small = HostBuf::<u8>::pinned(&device, 1 << 20, PinOptions::default()).unwrap();
    assert!(small.as_slice().iter().all(|&b| b == 0));
}
