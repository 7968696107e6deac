//! Files streamed to a device (`hetmem::data`): every method on both backends, fresh random
//! files of sizes that are no multiple of a chunk or a block, poisoned destinations, the
//! checksum stage reading pieces in place, and safetensors files well and badly formed.

use std::path::{Path, PathBuf};

use hetmem::data::{
    FilePieceData, FileRange, FileStream, LoadMethod, ReadMode, SafetensorsHeader, StreamOptions,
};
use hetmem::ops::{Checksum, checksum, checksum_cpu};
use hetmem::{Device, DeviceBuf, Error, Queue};

use crate::support::{cpu_device, on_every_backend};

const POISON: u8 = 0xA5;
const CHUNK: usize = 64 << 10;

/// A file of `len` fresh random bytes (none zero), its seed printed.
fn random_file(dir: &Path, name: &str, len: usize) -> (PathBuf, Vec<u8>) {
    let seed = fastrand::u64(..);
    eprintln!("{name}: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let bytes: Vec<u8> = (0..len).map(|_| rng.u8(1..)).collect();
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn options(method: LoadMethod) -> StreamOptions {
    StreamOptions { method, threads: 3, chunk_bytes: CHUNK, ring_depth: 4 }
}

fn stream(device: &Device, queue: &Queue, method: LoadMethod) -> FileStream {
    let stream = FileStream::new(device, queue, options(method)).unwrap();
    // SAFETY: the tests' files are written before and not changed while streamed.
    unsafe { stream.allow_windows() }
}

/// Three files (one empty, one not a whole word) land one after another at an offset of a
/// poisoned destination, by every method; nothing outside them is written; the progress
/// reaches the total.
#[test]
fn every_method_lands_every_file_at_its_offset() {
    on_every_backend("every_method_lands_every_file_at_its_offset", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_bytes) = random_file(dir.path(), "a.bin", 3 * CHUNK + 12_345);
        let (b, _) = random_file(dir.path(), "b.bin", 0);
        let (c, c_bytes) = random_file(dir.path(), "c.bin", 4099);
        let ranges = [&a, &b, &c].map(|path| FileRange::whole(path).unwrap());
        let expected = [a_bytes, c_bytes].concat();
        let queue = Queue::new(device).unwrap();
        for method in LoadMethod::ALL {
            let offset = 1000;
            let mut dst = DeviceBuf::<u8>::new(device, expected.len() + offset + 333).unwrap();
            dst.copy_from_slice(&vec![POISON; dst.len()]).unwrap();
            let mut dst = queue.lend(dst);
            let done = std::sync::atomic::AtomicU64::new(0);
            let report = stream(device, &queue, method)
                .load_into(&ranges, &mut dst, offset, &|bytes| {
                    done.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
                })
                .unwrap();
            let got = dst.reclaim().unwrap().to_vec().unwrap();
            assert!(got[..offset].iter().all(|&b| b == POISON), "{method}: written before the offset");
            assert!(
                got[offset + expected.len()..].iter().all(|&b| b == POISON),
                "{method}: written past the end"
            );
            assert!(
                got[offset..offset + expected.len()] == expected[..],
                "{method}: the files differ on the device"
            );
            assert_eq!(report.bytes, expected.len() as u64, "{method}");
            assert_eq!(done.into_inner(), expected.len() as u64, "{method}: progress");
            assert_ne!(report.method, LoadMethod::Auto);
            if method != LoadMethod::Auto {
                assert_eq!(report.method, method);
            }
            match report.method {
                LoadMethod::Windows => assert_eq!(report.read_mode, ReadMode::Mapped),
                LoadMethod::Staged => assert_eq!(report.read_mode, ReadMode::Buffered),
                _ => assert_eq!(
                    report.read_mode == ReadMode::Buffered,
                    report.direct_refused.is_some(),
                    "{report:?}"
                ),
            }
        }
    });
}

/// A load into a new buffer, and twice through one stream (the ring is kept).
#[test]
fn a_stream_loads_twice_with_its_ring_kept() {
    let device = cpu_device();
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = random_file(dir.path(), "twice.bin", 5 * CHUNK + 1);
    let queue = Queue::new(&device).unwrap();
    let mut stream = stream(&device, &queue, LoadMethod::StagedDirect);
    for run in 0..2 {
        let (buffer, report) = stream.load(&[FileRange::whole(&path).unwrap()], &|_| {}).unwrap();
        assert!(buffer.to_vec().unwrap() == bytes, "run {run}");
        assert_eq!(report.setup_seconds == 0.0, run == 1, "the ring is made once: {report:?}");
    }
}

/// A run whose cancel flag is set stops at its next piece with `Error::Stopped` (set
/// mid-run, from the progress, it stops well before the end; set before, at once); once
/// cleared, the same stream loads the whole file again.
#[test]
fn a_cancelled_run_stops_at_its_next_piece_and_the_stream_loads_again() {
    on_every_backend("a_cancelled_run_stops_at_its_next_piece_and_the_stream_loads_again", |device| {
        let dir = tempfile::tempdir().unwrap();
        let pieces = 64;
        let (path, bytes) = random_file(dir.path(), "cancelled.bin", pieces * CHUNK + 7);
        let ranges = [FileRange::whole(&path).unwrap()];
        let queue = Queue::new(device).unwrap();
        let one_reader =
            StreamOptions { method: LoadMethod::Staged, threads: 1, chunk_bytes: CHUNK, ring_depth: 2 };
        let mut stream = FileStream::new(device, &queue, one_reader).unwrap();
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        stream.set_cancel(Some(std::sync::Arc::clone(&cancel)));
        let done = std::sync::atomic::AtomicU64::new(0);
        let stopped = stream.load(&ranges, &|bytes| {
            done.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
            if bytes >= 2 * CHUNK as u64 {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        assert!(matches!(stopped, Err(Error::Stopped { what: "load" })), "{stopped:?}");
        let done = done.into_inner();
        assert!((2 * CHUNK as u64..(8 * CHUNK) as u64).contains(&done), "{done} bytes done after the cancel");
        // Still set: the next run stops before reading anything.
        let again = stream.load(&ranges, &|bytes| panic!("{bytes} bytes read by a cancelled run"));
        assert!(matches!(again, Err(Error::Stopped { .. })), "{again:?}");
        cancel.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut dst = DeviceBuf::<u8>::new(device, bytes.len()).unwrap();
        dst.copy_from_slice(&vec![POISON; bytes.len()]).unwrap();
        let mut dst = queue.lend(dst);
        stream.load_into(&ranges, &mut dst, 0, &|_| {}).unwrap();
        assert!(dst.reclaim().unwrap().to_vec().unwrap() == bytes, "the load after the cancel differs");
    });
}

/// A cancel set and cleared again before the run's lending thread looks at it: the reader saw
/// it and left with pieces unread, so the run must fail with `Error::Stopped`, not take the
/// cleared flag for a finished load. Made deterministic: the progress of pieces 0-3 done
/// waits until the stage of piece 4 runs, then sets the cancel just before the recycler wakes
/// the one reader (which sees it and leaves); the stage waits for the cancel, gives the reader
/// time to leave, and clears it before it returns.
#[test]
fn a_cancel_cleared_before_the_run_looks_still_stops_the_run() {
    on_every_backend("a_cancel_cleared_before_the_run_looks_still_stops_the_run", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = random_file(dir.path(), "cleared.bin", 32 * 4096 + 5);
        let ranges = [FileRange::whole(&path).unwrap()];
        let queue = Queue::new(device).unwrap();
        let one_reader =
            StreamOptions { method: LoadMethod::Staged, threads: 1, chunk_bytes: 4096, ring_depth: 2 };
        let mut stream = FileStream::new(device, &queue, one_reader).unwrap();
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        stream.set_cancel(Some(std::sync::Arc::clone(&cancel)));
        let staged = std::sync::atomic::AtomicUsize::new(0);
        let (fourth_staging, fired) =
            (std::sync::atomic::AtomicBool::new(false), std::sync::atomic::AtomicBool::new(false));
        let wait_for = |flag: &std::sync::atomic::AtomicBool, what: &str| {
            let waited = std::time::Instant::now();
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(waited.elapsed() < std::time::Duration::from_secs(20), "{what} never came");
                std::thread::yield_now();
            }
        };
        let run = stream.for_each_chunk(
            &ranges,
            &|done| {
                if done >= 4 * 4096 && !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    wait_for(&fourth_staging, "the stage of piece 4");
                    cancel.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            },
            |piece| {
                staged.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if piece.stream_offset == 4 * 4096 {
                    fourth_staging.store(true, std::sync::atomic::Ordering::SeqCst);
                    wait_for(&cancel, "the cancel");
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    cancel.store(false, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(())
            },
        );
        let staged = staged.into_inner();
        assert!(matches!(run, Err(Error::Stopped { .. })), "{run:?} after {staged} of 33 pieces staged");
        assert!(staged < 33, "every piece was staged: the reader did not stop for the cancel");
    });
}

/// The checksum stage reads each piece where it lies (staging or window) and sums to the
/// CPU's checksum of each file.
#[test]
fn the_checksum_stage_reads_pieces_in_place() {
    on_every_backend("the_checksum_stage_reads_pieces_in_place", |device| {
        let dir = tempfile::tempdir().unwrap();
        let files = [random_file(dir.path(), "x.bin", 2 * CHUNK + 4097), random_file(dir.path(), "y.bin", 7)];
        let ranges = files.each_ref().map(|(path, _)| FileRange::whole(path).unwrap());
        let queue = Queue::new(device).unwrap();
        for method in [LoadMethod::Staged, LoadMethod::StagedDirect, LoadMethod::Windows] {
            let mut sums = queue.lend(DeviceBuf::<u64>::new(device, 2 * files.len()).unwrap());
            let mut stream = stream(device, &queue, method);
            let queue = stream.queue().clone();
            stream
                .for_each_chunk(&ranges, &|_| {}, |chunk| match chunk.data {
                    FilePieceData::Staging { lease, offset } => checksum(
                        &queue,
                        lease,
                        offset,
                        chunk.len,
                        chunk.source_offset,
                        &mut sums,
                        chunk.source,
                    ),
                    FilePieceData::Window { lease, offset } => checksum(
                        &queue,
                        lease,
                        offset,
                        chunk.len,
                        chunk.source_offset,
                        &mut sums,
                        chunk.source,
                    ),
                })
                .unwrap();
            let got = sums.reclaim().unwrap().to_vec().unwrap();
            for (index, (_, bytes)) in files.iter().enumerate() {
                let expected = checksum_cpu(bytes, 0);
                assert_eq!(
                    Checksum { sum: got[2 * index], weighted: got[2 * index + 1] },
                    expected,
                    "{method}, file {index}"
                );
            }
        }
    });
}

/// Missing files, ranges past a file's end, too small a destination, and windows without the
/// caller's promise are refused by name.
#[test]
fn bad_loads_are_refused_with_the_cause() {
    let device = cpu_device();
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = random_file(dir.path(), "short.bin", 100);
    let missing = FileRange::whole(dir.path().join("missing.bin")).unwrap_err();
    assert!(matches!(missing, Error::Io { .. }) && missing.to_string().contains("missing.bin"), "{missing}");
    let queue = Queue::new(&device).unwrap();
    let past = FileRange { path: path.clone(), offset: 50, len: 51 };
    let error = stream(&device, &queue, LoadMethod::Staged).load(&[past], &|_| {}).unwrap_err().to_string();
    assert!(error.contains("short.bin") && error.contains("100 bytes"), "{error}");
    let mut small = queue.lend(DeviceBuf::<u8>::new(&device, 99).unwrap());
    let error = stream(&device, &queue, LoadMethod::Staged)
        .load_into(&[FileRange::whole(&path).unwrap()], &mut small, 0, &|_| {})
        .unwrap_err()
        .to_string();
    assert!(error.contains("99-byte destination"), "{error}");
    let unmapped = FileStream::new(&device, &queue, options(LoadMethod::Windows)).unwrap();
    let error = { unmapped }.load(&[FileRange::whole(&path).unwrap()], &|_| {}).unwrap_err().to_string();
    assert!(error.contains("allow_windows"), "{error}");
    let error =
        FileStream::new(&device, &queue, StreamOptions { chunk_bytes: 5000, ..options(LoadMethod::Staged) })
            .unwrap_err()
            .to_string();
    assert!(error.contains("multiple of 4096"), "{error}");
}

/// A safetensors file of random tensors in several dtypes, written by the `safetensors` crate.
fn safetensors_file(dir: &Path, name: &str, prefix: &str) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    use safetensors::tensor::TensorView;
    let shapes: [(&str, safetensors::Dtype, Vec<usize>, usize); 3] = [
        ("embed", safetensors::Dtype::BF16, vec![33, 64], 2),
        ("norm", safetensors::Dtype::F32, vec![67], 4),
        ("bias", safetensors::Dtype::U8, vec![3, 5], 1),
    ];
    let tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(tensor, dtype, shape, size)| {
            let bytes = (0..shape.iter().product::<usize>() * size).map(|_| fastrand::u8(1..)).collect();
            (format!("{prefix}.{tensor}"), dtype, shape, bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (name.clone(), TensorView::new(*dtype, shape.clone(), bytes).unwrap())
        })
        .collect();
    let path = dir.join(name);
    safetensors::serialize_to_file(views, None, &path).unwrap();
    (path, tensors.into_iter().map(|(name, _, _, bytes)| (name, bytes)).collect())
}

/// Two safetensors files: each tensor lands at its own offset, with its dtype and shape.
#[test]
fn safetensors_tensors_land_at_their_own_offsets() {
    on_every_backend("safetensors_tensors_land_at_their_own_offsets", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (first, first_tensors) = safetensors_file(dir.path(), "a.safetensors", "layers.0");
        let (second, second_tensors) = safetensors_file(dir.path(), "b.safetensors", "layers.1");
        let queue = Queue::new(device).unwrap();
        let loaded =
            stream(device, &queue, LoadMethod::Auto).load_safetensors(&[&first, &second], &|_| {}).unwrap();
        let all = loaded.buffer.to_vec().unwrap();
        for (name, bytes) in first_tensors.iter().chain(&second_tensors) {
            let entry = &loaded.tensors[name];
            assert!(all[entry.offset..entry.offset + entry.bytes] == bytes[..], "{name}");
        }
        assert_eq!(loaded.tensors["layers.1.embed"].dtype, "BF16");
        assert_eq!(loaded.tensors["layers.1.embed"].shape, [33, 64]);
        let second_start = loaded
            .tensors
            .iter()
            .filter(|(name, _)| name.starts_with("layers.1"))
            .map(|(_, e)| e.offset)
            .min();
        assert_eq!(second_start.unwrap() % 256, 0, "each file starts on 256 bytes");
    });
}

/// Truncated, oversized and garbled headers, and tensors past the end, are malformed files.
#[test]
fn malformed_safetensors_are_refused_with_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = safetensors_file(dir.path(), "good.safetensors", "t");
    let good = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("tiny", good[..5].to_vec(), "shorter than the 8-byte"),
        ("cut-header", good[..8 + header_len / 2].to_vec(), "header in a"),
        ("garbled", [&good[..8], &vec![b'x'; header_len][..], &good[8 + header_len..]].concat(), "header:"),
        ("cut-data", good[..good.len() - 3].to_vec(), "describes"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(format!("{name}.safetensors"));
        std::fs::write(&path, bytes).unwrap();
        let error = SafetensorsHeader::read(&path).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::MalformedFile { .. }), "{name}: {text}");
        assert!(text.contains(expected) && text.contains(name), "{name}: {text}");
    }
    // A header as long as a (sparse) file claims is not read into memory past the format's
    // limit.
    let path = dir.path().join("huge-header.safetensors");
    std::fs::write(&path, 200_000_000u64.to_le_bytes()).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(200_000_008).unwrap();
    let text = SafetensorsHeader::read(&path).unwrap_err().to_string();
    assert!(text.contains("200000000-byte header") && text.contains("100000000 bytes"), "{text}");
}

/// Random parts placed by `load_placed`: runs of small ranges whose places follow on (gathered
/// into one piece each, across two files, up to a chunk), runs broken by gaps, empty ranges
/// in the middle and at the end, large ranges split into chunks, and the parts' order not the
/// places' order. Every method on both backends: each range's bytes at its place, nothing
/// between the places written.
#[test]
fn placed_parts_land_at_their_places_gathered_or_not() {
    on_every_backend("placed_parts_land_at_their_places_gathered_or_not", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_bytes) = random_file(dir.path(), "a.bin", 3 * CHUNK + 777);
        let (b, b_bytes) = random_file(dir.path(), "b.bin", CHUNK + 5);
        let seed = fastrand::u64(..);
        eprintln!("parts: seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let files = [(&a, &a_bytes), (&b, &b_bytes)];
        let mut parts: Vec<(FileRange, usize)> = Vec::new();
        let mut place = 7usize;
        for _ in 0..400 {
            let (path, bytes) = files[rng.usize(..2)];
            let len = match rng.u8(..20) {
                0 => 0,
                1 => rng.usize(CHUNK / 4..2 * CHUNK),
                2 => CHUNK / 4 - 1,
                _ => rng.usize(1..CHUNK / 16),
            }
            .min(bytes.len());
            let offset = rng.usize(..=bytes.len() - len);
            parts.push((FileRange { path: path.clone(), offset: offset as u64, len: len as u64 }, place));
            place += len + if rng.u8(..8) == 0 { rng.usize(1..100) } else { 0 };
        }
        parts.push((FileRange { path: a.clone(), offset: 9, len: 0 }, place));
        // Runs of parts in reverse order here and there: places that follow on are only those
        // of parts next to each other in the list.
        for run in parts.chunks_mut(37).skip(1).step_by(3) {
            run.reverse();
        }
        let mut expected = vec![POISON; place + 50];
        for (range, at) in &parts {
            let bytes = if range.path == a { &a_bytes } else { &b_bytes };
            let (start, len) = (range.offset as usize, range.len as usize);
            expected[*at..at + len].copy_from_slice(&bytes[start..start + len]);
        }
        let queue = Queue::new(device).unwrap();
        for method in LoadMethod::ALL {
            let mut dst = DeviceBuf::<u8>::new(device, expected.len()).unwrap();
            dst.copy_from_slice(&vec![POISON; dst.len()]).unwrap();
            let mut dst = queue.lend(dst);
            let report = stream(device, &queue, method).load_placed(&parts, &mut dst, &|_| {}).unwrap();
            let total: u64 = parts.iter().map(|(range, _)| range.len).sum();
            assert_eq!(report.bytes, total, "{method}");
            let got = dst.reclaim().unwrap().to_vec().unwrap();
            if let Some(byte) = got.iter().zip(&expected).position(|(got, want)| got != want) {
                panic!("{method}: byte {byte} is {:#x}, {:#x} expected", got[byte], expected[byte]);
            }
        }
    });
}
