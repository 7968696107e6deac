//! A safetensors checkpoint spread over every GPU present: each GPU reads and keeps its own
//! run of tensors, all at once, and every file byte is read once.
//!
//! The example writes a checkpoint of fresh random tensors in two shards with their index,
//! spreads it with [`load_spread`] (`Placement::Balanced`) over the devices
//! `Device::open_selection` gives (every GPU, or the CPU backend where there is none; with one
//! device it spreads over two opens of it, so the path of several devices still runs), and
//! checks each tensor's bytes on its device against the file's.
//!
//! Run with `cargo run -p hetmem --example spread_load`.

use std::collections::BTreeMap;
use std::path::Path;

use hetmem::Device;
use hetmem::backend::{BackendChoice, DeviceSelection};
use hetmem::data::{Checkpoint, LoadMethod, Placement, StreamOptions, TensorFilter, load_spread};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

mod support;

use support::XorShift32;

/// (name, shape) of each shard's bf16 tensors: a small Llama-like stack.
const SHARDS: [&[(&str, [usize; 2])]; 2] = [
    &[("embed", [512, 256]), ("layers.0.attn", [256, 768]), ("layers.0.mlp", [256, 1024])],
    &[("layers.1.attn", [256, 768]), ("layers.1.mlp", [256, 1024]), ("head", [256, 512])],
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut devices = Device::open_selection(BackendChoice::from_env()?, &DeviceSelection::All)?;
    if devices.len() == 1 {
        println!("one device: spreading over two opens of it");
        devices.push(devices[0].clone());
    }
    for (index, device) in devices.iter().enumerate() {
        println!("device {index}: {} ({} backend)", device.name(), device.backend());
    }

    let dir = tempfile::tempdir()?;
    let mut rng = XorShift32::from_time();
    let expected = write_checkpoint(dir.path(), &mut rng)?;
    let checkpoint = Checkpoint::open(dir.path().join("model.safetensors.index.json"))?;
    let options =
        StreamOptions { method: LoadMethod::Staged, threads: 4, chunk_bytes: 1 << 20, ring_depth: 8 };
    let spread =
        load_spread(&checkpoint, &TensorFilter::All, None, &devices, &Placement::Balanced, options, &|_| {})?;

    let mut seen = 0;
    for (index, part) in &spread.parts {
        let bytes = part.buffer.to_vec()?;
        for (name, entry) in &part.tensors {
            if bytes[entry.offset..entry.offset + entry.bytes] != expected[name][..] {
                return Err(format!("{name} on device {index} differs from the file").into());
            }
            seen += 1;
        }
        println!(
            "device {index}: {} tensors, {} bytes ({})",
            part.tensors.len(),
            part.report.bytes,
            part.report.method
        );
    }
    if seen != expected.len() {
        return Err(format!("{seen} tensors loaded, the files hold {}", expected.len()).into());
    }
    println!(
        "{} tensors over {} devices, each checked: {} bytes in {:.3} s ({:.2} GB/s)",
        seen,
        spread.parts.len(),
        spread.bytes,
        spread.seconds,
        spread.gb_per_s()
    );
    Ok(())
}

/// Writes the two shards (random, non-zero bf16 bits) and their index; returns each tensor's bytes.
fn write_checkpoint(
    dir: &Path,
    rng: &mut XorShift32,
) -> Result<BTreeMap<String, Vec<u8>>, Box<dyn std::error::Error>> {
    let mut all = BTreeMap::new();
    let mut weight_map = Vec::new();
    for (shard, tensors) in SHARDS.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, SHARDS.len());
        let data: Vec<(&str, [usize; 2], Vec<u8>)> = tensors
            .iter()
            .map(|(name, shape)| {
                let bytes = (0..shape[0] * shape[1] * 2).map(|_| rng.next_u32() as u8 | 1).collect();
                (*name, *shape, bytes)
            })
            .collect();
        let views = data
            .iter()
            .map(|(name, shape, bytes)| {
                Ok((name.to_string(), TensorView::new(Dtype::BF16, shape.to_vec(), bytes)?))
            })
            .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
        safetensors::serialize_to_file(views, None, &dir.join(&file))?;
        for (name, _, bytes) in data {
            weight_map.push(format!("{name:?}: {file:?}"));
            all.insert(name.to_string(), bytes);
        }
    }
    let index = format!(r#"{{"metadata": {{}}, "weight_map": {{{}}}}}"#, weight_map.join(", "));
    std::fs::write(dir.join("model.safetensors.index.json"), index)?;
    Ok(all)
}
