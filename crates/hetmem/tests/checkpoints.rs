//! Checkpoints: sharded ones through their index, tensors chosen by name or prefix, and the
//! shards and indexes that disagree, each refused naming the file, the tensor and a remedy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hetmem::data::{Checkpoint, FileStream, LoadMethod, PLACE_ALIGN, StreamOptions, TensorFilter};
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
    let queue = Queue::new(device).unwrap();
    let options = StreamOptions { method: LoadMethod::Staged, threads: 2, chunk_bytes: 4096, ring_depth: 3 };
    let mut stream = FileStream::new(device, &queue, options).unwrap();
    let mut dst = queue.lend(DeviceBuf::<u8>::new(device, plan.total_bytes().max(1)).unwrap());
    // The buffer starts zeroed and no tensor byte is 0: a byte the load missed cannot pass.
    let report = stream.load_plan(&plan, &mut dst, &|_| {}).unwrap();
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
