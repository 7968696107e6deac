//! Checkpoints: sharded ones through their index, tensors chosen by name or prefix, and the
//! shards and indexes that disagree, each refused naming the file, the tensor and a remedy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hetmem::data::{
    Checkpoint, FileStream, LoadMethod, LoadPlan, PLACE_ALIGN, Placement, ReadMode, ShardSpec, SpreadTensors,
    StreamOptions, TensorFilter, load_spread,
};
use hetmem::{Device, DeviceBuf, Error, Queue};

use crate::support::on_every_backend;

/// A safetensors file of fresh random tensors (name, dtype, shape), written by the
/// `safetensors` crate; returns each tensor's bytes.
fn shard(
    dir: &Path,
    file: &str,
    tensors: &[(&str, safetensors::Dtype, &[usize])],
) -> BTreeMap<String, Vec<u8>> {
    use safetensors::tensor::TensorView;
    let bytes: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, dtype, shape)| {
            let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
            (name.to_string(), *dtype, shape.to_vec(), (0..len).map(|_| fastrand::u8(1..)).collect())
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(name, dtype, shape, data)| {
            (name.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
    bytes.into_iter().map(|(name, _, _, data)| (name, data)).collect()
}

/// Two shards of a small model and their index; returns the index and every tensor's bytes.
fn sharded(dir: &Path) -> (PathBuf, BTreeMap<String, Vec<u8>>) {
    use safetensors::Dtype::{BF16, F32, I64, U8};
    let mut all = shard(
        dir,
        "model-00001-of-00002.safetensors",
        &[("embed", BF16, &[37, 16]), ("layers.0.w", F32, &[9, 7]), ("layers.0.empty", U8, &[0, 3])],
    );
    all.extend(shard(
        dir,
        "model-00002-of-00002.safetensors",
        &[("layers.1.w", F32, &[9, 7]), ("layers.1.step", I64, &[]), ("head", BF16, &[16, 5])],
    ));
    let map: BTreeMap<&str, &str> = all
        .keys()
        .map(|name| {
            let first = ["embed", "layers.0.w", "layers.0.empty"].contains(&name.as_str());
            (
                name.as_str(),
                if first { "model-00001-of-00002.safetensors" } else { "model-00002-of-00002.safetensors" },
            )
        })
        .collect();
    let index = dir.join("model.safetensors.index.json");
    let json = format!(
        r#"{{"metadata": {{"total_size": 1}}, "weight_map": {{{}}}}}"#,
        map.iter().map(|(name, file)| format!("{name:?}: {file:?}")).collect::<Vec<_>>().join(", ")
    );
    std::fs::write(&index, json).unwrap();
    (index, all)
}

fn load(
    device: &Device,
    checkpoint: &Checkpoint,
    filter: &TensorFilter,
) -> (Vec<u8>, BTreeMap<String, hetmem::data::TensorEntry>) {
    let plan = checkpoint.plan(filter).unwrap();
    load_plan(device, &plan)
}

/// `plan` loaded into a fresh allocation of `device`: the allocation's bytes and the tensors.
fn load_plan(device: &Device, plan: &LoadPlan) -> (Vec<u8>, BTreeMap<String, hetmem::data::TensorEntry>) {
    let queue = Queue::new(device).unwrap();
    let options = StreamOptions { method: LoadMethod::Staged, threads: 2, chunk_bytes: 4096, ring_depth: 3 };
    let mut stream = FileStream::new(device, &queue, options).unwrap();
    let mut dst = queue.lend(DeviceBuf::<u8>::new(device, plan.total_bytes().max(1)).unwrap());
    // The buffer starts zeroed and no tensor byte is 0: a byte the load missed cannot pass.
    let report = stream.load_plan(plan, &mut dst, &|_| {}).unwrap();
    let bytes: usize = plan.tensors().values().map(|entry| entry.bytes).sum();
    assert_eq!(report.bytes, bytes as u64, "only the chosen tensors' bytes are read");
    (dst.reclaim().unwrap().to_vec().unwrap(), plan.tensors().clone())
}

#[test]
fn a_sharded_checkpoint_loads_through_its_index_all_or_by_name_or_prefix() {
    on_every_backend("a_sharded_checkpoint_loads_through_its_index_all_or_by_name_or_prefix", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (index, expected) = sharded(dir.path());
        let checkpoint = Checkpoint::open(&index).unwrap();
        assert_eq!(checkpoint.headers().len(), 2);
        let names = |list: &[&str]| TensorFilter::Names(list.iter().map(|name| name.to_string()).collect());
        let filters = [
            TensorFilter::All,
            names(&["head", "embed", "layers.1.step"]),
            TensorFilter::Prefixes(vec!["layers.".into()]),
            names(&["layers.0.empty"]),
        ];
        for filter in filters {
            let (all, tensors) = load(device, &checkpoint, &filter);
            let wanted: BTreeSet<&String> = expected
                .keys()
                .filter(|name| match &filter {
                    TensorFilter::All => true,
                    TensorFilter::Names(names) => names.contains(*name),
                    TensorFilter::Prefixes(prefixes) => name.starts_with(&prefixes[0]),
                })
                .collect();
            assert_eq!(tensors.keys().collect::<BTreeSet<_>>(), wanted, "{filter:?}");
            for (name, entry) in &tensors {
                assert!(
                    all[entry.offset..entry.offset + entry.bytes] == expected[name][..],
                    "{name} by {filter:?}"
                );
            }
        }
        let (_, tensors) = load(device, &checkpoint, &TensorFilter::All);
        assert_eq!(tensors["layers.1.step"].shape, Vec::<usize>::new());
        assert_eq!(tensors["layers.0.empty"].bytes, 0);
        let second = tensors.iter().filter(|(name, _)| name.starts_with("layers.1") || *name == "head");
        assert_eq!(second.map(|(_, entry)| entry.offset).min().unwrap() % PLACE_ALIGN, 0);
    });
}

#[test]
fn names_and_prefixes_that_match_nothing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (index, _) = sharded(dir.path());
    let checkpoint = Checkpoint::open(&index).unwrap();
    let text = checkpoint
        .plan(&TensorFilter::Names(["embed".into(), "embbed".into()].into()))
        .unwrap_err()
        .to_string();
    assert!(text.contains("\"embbed\"") && text.contains("check the name"), "{text}");
    let text = checkpoint.plan(&TensorFilter::Prefixes(vec!["decoder.".into()])).unwrap_err().to_string();
    assert!(text.contains("decoder.") && text.contains("check the prefix"), "{text}");
}

#[test]
fn a_missing_shard_a_collision_and_a_disagreeing_index_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (index, _) = sharded(dir.path());
    let first = dir.path().join("model-00001-of-00002.safetensors");
    let second = dir.path().join("model-00002-of-00002.safetensors");
    // A tensor of one name in two files.
    let again = dir.path().join("again.safetensors");
    shard(dir.path(), "again.safetensors", &[("head", safetensors::Dtype::U8, &[4])]);
    let error = Checkpoint::from_files(&[&first, &second, &again]).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::InvalidArgument { .. }), "{text}");
    assert!(
        text.contains("\"head\"") && text.contains("again.safetensors") && text.contains("00002"),
        "{text}"
    );
    // The index says a tensor is in a shard that does not hold it.
    let original = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, original.replace(r#""head": "model-00002"#, r#""head": "model-00001"#)).unwrap();
    let text = Checkpoint::open(&index).unwrap_err().to_string();
    assert!(text.contains("\"head\"") && text.contains("disagree") && text.contains("00001"), "{text}");
    std::fs::write(&index, &original).unwrap();
    // A shard missing.
    std::fs::remove_file(&second).unwrap();
    let error = Checkpoint::open(&index).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::Io { .. }), "{text}");
    assert!(text.contains("model-00002-of-00002.safetensors") && text.contains("download it"), "{text}");
    assert!(text.contains("\"head\"") && text.contains("index.json"), "{text}");
    // Not an index.
    std::fs::write(&index, r#"{"weights": {}}"#).unwrap();
    let text = Checkpoint::open(&index).unwrap_err().to_string();
    assert!(text.contains("weight_map") && text.contains("remedy"), "{text}");
    std::fs::write(&index, r#"{"weight_map": {"x": "../elsewhere.safetensors"}}"#).unwrap();
    let text = Checkpoint::open(&index).unwrap_err().to_string();
    assert!(text.contains("outside the index's folder"), "{text}");
}

/// A file that shrinks between its header's check and the read ends the load with an error,
/// not a signal: reads are `pread`s, which see the end of the file.
#[test]
fn a_file_truncated_before_the_read_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "cut.safetensors", &[("w", safetensors::Dtype::F32, &[4096])]);
    let path = dir.path().join("cut.safetensors");
    let checkpoint = Checkpoint::open(&path).unwrap();
    let plan = checkpoint.plan(&TensorFilter::All).unwrap();
    let length = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(length - 100).unwrap();
    let device = crate::support::cpu_device();
    let queue = Queue::new(&device).unwrap();
    let mut stream = FileStream::new(&device, &queue, StreamOptions::default()).unwrap();
    let mut dst = queue.lend(DeviceBuf::<u8>::new(&device, plan.total_bytes()).unwrap());
    let text = stream.load_plan(&plan, &mut dst, &|_| {}).unwrap_err().to_string();
    assert!(text.contains("cut.safetensors"), "{text}");
}

/// Rank `rank`'s slice along `dim` of a row-major tensor of `shape` whose bytes are `data`,
/// cut element by element (not as the plan does), `torch.chunk`'s way.
fn slice_by_elements(
    data: &[u8],
    shape: &[usize],
    element: usize,
    rank: usize,
    world: usize,
    dim: usize,
) -> Vec<u8> {
    if shape.len() <= dim {
        return data.to_vec();
    }
    let chunk = shape[dim].div_ceil(world);
    let (start, end) = ((rank * chunk).min(shape[dim]), ((rank + 1) * chunk).min(shape[dim]));
    let count: usize = shape.iter().product();
    let mut out = Vec::new();
    for flat in 0..count {
        // The index along `dim` of element `flat`.
        let at = flat / shape[dim + 1..].iter().product::<usize>() % shape[dim];
        if (start..end).contains(&at) {
            out.extend_from_slice(&data[flat * element..(flat + 1) * element]);
        }
    }
    out
}

#[test]
fn every_rank_reads_only_its_slice_and_the_ranks_together_read_every_byte_once() {
    use safetensors::Dtype::{BF16, F32, I64, U8};
    on_every_backend(
        "every_rank_reads_only_its_slice_and_the_ranks_together_read_every_byte_once",
        |device| {
            let dir = tempfile::tempdir().unwrap();
            let tensors: &[(&str, safetensors::Dtype, &[usize])] = &[
                ("a.w", F32, &[10, 6]),
                ("a.bias", BF16, &[7]),
                ("b.w", BF16, &[5, 9, 3]),
                ("b.step", I64, &[]),
                ("c.empty", U8, &[0, 4]),
                ("c.odd", U8, &[3, 5, 2]),
            ];
            let expected = shard(dir.path(), "model.safetensors", tensors);
            let checkpoint = Checkpoint::open(dir.path().join("model.safetensors")).unwrap();
            let data = checkpoint.headers()[0].data.clone();
            for dim in 0..3 {
                for world in 1..=4 {
                    // Every byte of the data section, by how many ranks read it.
                    let mut reads = vec![0usize; data.len as usize];
                    for rank in 0..world {
                        let spec = ShardSpec::new(rank, world, dim).unwrap();
                        let plan = checkpoint.plan_with(&TensorFilter::All, Some(&spec)).unwrap();
                        let (all, placed) = load_plan(device, &plan);
                        for (name, dtype, shape) in tensors {
                            let element = dtype.bitsize() / 8;
                            let want = slice_by_elements(&expected[*name], shape, element, rank, world, dim);
                            let entry = &placed[*name];
                            assert_eq!(entry.bytes, want.len(), "{name} rank {rank}/{world} dim {dim}");
                            assert_eq!(entry.offset % PLACE_ALIGN, 0);
                            assert!(
                                all[entry.offset..entry.offset + entry.bytes] == want[..],
                                "{name} {rank}/{world} {dim}"
                            );
                            if shape.len() > dim {
                                let mut sliced = shape.to_vec();
                                sliced[dim] = want.len()
                                    / element
                                    / shape
                                        .iter()
                                        .enumerate()
                                        .filter(|(d, _)| *d != dim)
                                        .map(|(_, n)| n)
                                        .product::<usize>()
                                        .max(1);
                                if want.is_empty() {
                                    assert_eq!(entry.shape.iter().product::<usize>(), 0);
                                } else {
                                    assert_eq!(entry.shape, sliced, "{name}");
                                }
                            } else {
                                assert_eq!(entry.shape, shape.to_vec(), "{name} is whole");
                            }
                        }
                        // Where each range ends, in the file and in the allocation.
                        let mut ends: Vec<(u64, usize)> = Vec::new();
                        for (range, place) in plan.parts() {
                            assert!(range.len > 0);
                            assert!(
                                !ends.contains(&(range.offset, *place)),
                                "ranges that follow on are merged"
                            );
                            ends.push((range.offset + range.len, place + range.len as usize));
                            for at in range.offset..range.offset + range.len {
                                reads[(at - data.offset) as usize] += 1;
                            }
                        }
                    }
                    // A tensor with the dimension is read once over all ranks, one without it by every rank.
                    for (name, _, shape) in tensors {
                        let entry = &checkpoint.headers()[0].tensors[*name];
                        let times = if shape.len() > dim { 1 } else { world };
                        assert!(
                            reads[entry.offset..entry.offset + entry.bytes].iter().all(|&n| n == times),
                            "{name}: dim {dim}, world {world}: read {:?} times, not {times}",
                            &reads[entry.offset..entry.offset + entry.bytes.min(8)]
                        );
                    }
                }
            }
        },
    );
}

#[test]
fn a_two_rank_load_reads_about_half_of_the_file_per_rank() {
    use safetensors::Dtype::{BF16, F32};
    let dir = tempfile::tempdir().unwrap();
    let tensors: &[(&str, safetensors::Dtype, &[usize])] =
        &[("q", BF16, &[64, 128]), ("k", BF16, &[64, 128]), ("norm", F32, &[128]), ("up", F32, &[33, 20])];
    shard(dir.path(), "m.safetensors", tensors);
    let checkpoint = Checkpoint::open(dir.path().join("m.safetensors")).unwrap();
    let whole = checkpoint.headers()[0].data.len;
    for dim in [0, 1] {
        for rank in 0..2 {
            let plan = checkpoint
                .plan_with(&TensorFilter::All, Some(&ShardSpec::new(rank, 2, dim).unwrap()))
                .unwrap();
            let read: u64 = plan.parts().iter().map(|(range, _)| range.len).sum();
            assert!(read * 100 <= whole * 55, "rank {rank} dim {dim}: {read} of {whole} bytes");
            assert!(read * 100 >= whole * 40, "rank {rank} dim {dim}: {read} of {whole} bytes");
        }
    }
}

#[test]
fn bad_shard_specs_are_refused_with_the_remedy() {
    let text = ShardSpec::new(2, 2, 0).unwrap_err().to_string();
    assert!(text.contains("rank 2") && text.contains("from 0 to 1"), "{text}");
    let text = ShardSpec::new(0, 0, 0).unwrap_err().to_string();
    assert!(text.contains("at least 1"), "{text}");
    let spec = ShardSpec::new(3, 4, 1).unwrap();
    assert_eq!((spec.rank(), spec.world(), spec.dim()), (3, 4, 1));
    assert_eq!(spec.span(usize::MAX), (3 * usize::MAX.div_ceil(4), usize::MAX));
    assert_eq!(ShardSpec::new(3, 4, 0).unwrap().span(5), (5, 5), "past the end: empty");
    assert_eq!(ShardSpec::new(0, 4, 0).unwrap().span(0), (0, 0));
}

/// A header whose slice is read in pieces of a byte or two (a tall, narrow tensor sliced along
/// its last dimension) is refused by name before its ranges are made: one range per piece
/// would make the plan outweigh the load a hundred times over. Pieces of 64 bytes or more, as
/// a column-parallel slice of a real weight, are planned, each piece once.
#[test]
fn a_slice_of_tiny_strided_pieces_is_refused_before_its_ranges_are_made() {
    use safetensors::Dtype::U8;
    let dir = tempfile::tempdir().unwrap();
    let rows = 70_000 + fastrand::usize(..1000);
    shard(dir.path(), "narrow.safetensors", &[("narrow", U8, &[rows, 2])]);
    let checkpoint = Checkpoint::open(dir.path().join("narrow.safetensors")).unwrap();
    let spec = ShardSpec::new(1, 2, 1).unwrap();
    let text = checkpoint.plan_with(&TensorFilter::All, Some(&spec)).unwrap_err().to_string();
    assert!(
        text.contains("\"narrow\"")
            && text.contains(&format!("{rows} ranges of 1 bytes"))
            && text.contains("remedy"),
        "{text}"
    );
    // Along dim 0 the same tensor is one range.
    let plan = checkpoint.plan_with(&TensorFilter::All, Some(&ShardSpec::new(1, 2, 0).unwrap())).unwrap();
    assert_eq!(plan.parts().len(), 1);
    // 130 columns over two ranks: pieces of 65 bytes, planned one range each.
    let dir = tempfile::tempdir().unwrap();
    let expected = shard(dir.path(), "wide.safetensors", &[("wide", U8, &[rows, 130])]);
    let checkpoint = Checkpoint::open(dir.path().join("wide.safetensors")).unwrap();
    let plan = checkpoint.plan_with(&TensorFilter::All, Some(&spec)).unwrap();
    assert_eq!(plan.parts().len(), rows);
    assert_eq!(plan.total_bytes(), rows * 65);
    let data = checkpoint.headers()[0].data.offset;
    for (row, (range, place)) in plan.parts().iter().enumerate() {
        assert_eq!((range.offset - data, range.len, *place), ((row * 130 + 65) as u64, 65, row * 65));
    }
    assert_eq!(expected["wide"].len(), rows * 130);
}

/// Every tensor of `spread` holds the file's bytes and lies on exactly one device; returns
/// each tensor's device index.
fn check_spread(spread: &SpreadTensors, expected: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, usize> {
    let mut placed = BTreeMap::new();
    for (at, part) in &spread.parts {
        let bytes = part.buffer.to_vec().unwrap();
        for (name, entry) in &part.tensors {
            assert!(bytes[entry.offset..entry.offset + entry.bytes] == expected[name][..], "{name} on {at}");
            assert!(placed.insert(name.clone(), *at).is_none(), "{name} on two devices");
        }
    }
    let read: usize = placed.keys().map(|name| expected[name].len()).sum();
    assert_eq!(spread.bytes, read as u64, "each chosen byte read once, by the device that keeps it");
    placed
}

#[test]
fn a_checkpoint_spread_over_two_devices_puts_each_tensor_on_one_of_them_once() {
    on_every_backend("a_checkpoint_spread_over_two_devices_puts_each_tensor_on_one_of_them_once", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (index, expected) = sharded(dir.path());
        let checkpoint = Checkpoint::open(&index).unwrap();
        // Two opens of one device: each its own stream, queue and allocation.
        let devices = [device.clone(), device.clone()];
        let options =
            StreamOptions { method: LoadMethod::Staged, threads: 2, chunk_bytes: 4096, ring_depth: 3 };
        let heard = std::sync::atomic::AtomicU64::new(0);
        let progress = |bytes: u64| {
            heard.fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
        };
        let spread = load_spread(
            &checkpoint,
            &TensorFilter::All,
            None,
            &devices,
            &Placement::Balanced,
            options,
            &progress,
        )
        .unwrap();
        let placed = check_spread(&spread, &expected);
        assert_eq!(placed.len(), expected.len());
        assert_eq!(spread.parts.iter().map(|(at, _)| *at).collect::<Vec<_>>(), [0, 1], "both devices used");
        assert_eq!(heard.into_inner(), spread.bytes, "progress summed over the devices");
        // The first shard's tensors come first in the files' order, so they go to device 0.
        assert_eq!(placed["embed"], 0);
        assert_eq!(placed["head"], 1);

        // By name, with a prefix filter and a shard of each tensor.
        let by_name = Placement::ByName(
            [("layers.0.w", 1), ("layers.0.empty", 1), ("layers.1.w", 0), ("layers.1.step", 1)]
                .map(|(name, at)| (name.to_string(), at))
                .into(),
        );
        let filter = TensorFilter::Prefixes(vec!["layers.".into()]);
        let shard = ShardSpec::new(1, 2, 0).unwrap();
        let sliced =
            load_spread(&checkpoint, &filter, Some(&shard), &devices, &by_name, options, &|_| {}).unwrap();
        let (at, part) = sliced.find("layers.1.w").unwrap();
        assert_eq!(at, 0);
        // Rank 1 of 2 along dimension 0 of a 9x7 F32 tensor: rows 5..9.
        let entry = &part.tensors["layers.1.w"];
        assert_eq!(entry.shape, [4, 7]);
        let bytes = part.buffer.to_vec().unwrap();
        assert!(bytes[entry.offset..entry.offset + entry.bytes] == expected["layers.1.w"][5 * 7 * 4..]);
        assert_eq!(sliced.find("layers.0.w").unwrap().0, 1);
        assert!(sliced.find("embed").is_none(), "the filter holds");

        let unplaced = Placement::ByName([("layers.0.w".to_string(), 0)].into());
        let error =
            load_spread(&checkpoint, &filter, None, &devices, &unplaced, options, &|_| {}).unwrap_err();
        assert!(error.to_string().contains("has no device"), "{error}");
        let error =
            load_spread(&checkpoint, &filter, None, &[], &Placement::Balanced, options, &|_| {}).unwrap_err();
        assert!(error.to_string().contains("no devices given"), "{error}");
    });
}

/// Small ranges gathered into one staging chunk (a column slice's rows) are read whole through
/// the page cache, so a staged-direct load of them does not report itself as all O_DIRECT, and
/// lands the bytes a buffered load does.
#[test]
fn gathered_small_ranges_on_the_direct_route_are_not_reported_as_direct() {
    on_every_backend("gathered_small_ranges_on_the_direct_route_are_not_reported_as_direct", |device| {
        let dir = tempfile::tempdir().unwrap();
        let (index, _) = sharded(dir.path());
        let shard = ShardSpec::new(0, 2, 1).unwrap();
        let plan = Checkpoint::open(&index).unwrap().plan_with(&TensorFilter::All, Some(&shard)).unwrap();
        let queue = Queue::new(device).unwrap();
        let load = |method| {
            let options = StreamOptions { method, threads: 2, chunk_bytes: 1 << 16, ring_depth: 3 };
            let mut stream = FileStream::new(device, &queue, options).unwrap();
            let mut dst = queue.lend(DeviceBuf::<u8>::new(device, plan.total_bytes()).unwrap());
            let report = stream.load_plan(&plan, &mut dst, &|_| {}).unwrap();
            (dst.reclaim().unwrap().to_vec().unwrap(), report)
        };
        let (buffered, _) = load(LoadMethod::Staged);
        let (direct, report) = load(LoadMethod::StagedDirect);
        assert!(direct == buffered, "the direct route lands the bytes the buffered one does");
        assert!(buffered.iter().any(|&byte| byte != 0));
        assert_eq!(report.method, LoadMethod::StagedDirect);
        match report.direct_refused {
            // A filesystem without O_DIRECT (tmpfs): every byte through the page cache.
            Some(_) => assert_eq!(report.read_mode, ReadMode::Buffered, "{report:?}"),
            None => assert_eq!(report.read_mode, ReadMode::Mixed, "{report:?}"),
        }
    });
}

/// A FIFO (whose open would wait for a writer) or a device (`/dev/zero`, with no end) named as
/// a shard or an index is refused at once as not a regular file, without hanging or reading
/// without end.
#[test]
fn a_fifo_or_a_device_as_a_shard_or_an_index_is_refused_at_once() {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    let name = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    // Should an open wait for a writer anyway, this one comes after 10 s, so the test fails
    // rather than hangs (not joined: when all is well it finds the folder gone).
    {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(10));
            drop(std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo));
        });
    }
    let started = std::time::Instant::now();
    let error = Checkpoint::from_files(&[&fifo]).unwrap_err().to_string();
    assert!(error.contains("not a regular file"), "{error}");
    let index = dir.path().join("model.safetensors.index.json");
    std::os::unix::fs::symlink(&fifo, &index).unwrap();
    let error = Checkpoint::from_index(&index).unwrap_err().to_string();
    assert!(error.contains("not a regular file"), "{error}");
    let zero = dir.path().join("zero.safetensors.index.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let error = Checkpoint::from_index(&zero).unwrap_err().to_string();
    assert!(error.contains("not a regular file"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused at once, not after a wait");
}
