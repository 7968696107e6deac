//! The benchmark's test file: a safetensors file with the tensor shapes of a real model
//! (Llama 3 8B: a 128256 x 4096 embedding, then decoder layers of q/k/v/o and gate/up/down
//! projections with their norms, all bf16), repeated until the target size, filled with
//! random bytes (never zeros). Named `hetmem-bench-<size>.safetensors`, so a kept file is found
//! again, by `hetmem bench file` and by the peers' script.

use std::io::Write;
use std::path::{Path, PathBuf};

use hetmem::data::SafetensorsHeader;
use hetmem::error::{Error, Result};
use rayon::prelude::*;

/// Llama 3 8B's hidden size, vocabulary and MLP width.
const HIDDEN: usize = 4096;
const VOCAB: usize = 128_256;
const MLP: usize = 14_336;
const KV: usize = 1024;

/// The file's name for a target size: `hetmem-bench-8GiB.safetensors`.
pub fn file_name(size: usize) -> String {
    format!("hetmem-bench-{}.safetensors", crate::sizes::format(size).replace(' ', ""))
}

/// The tensors (name, shape) of a model of at most `target` bytes of bf16 data: the
/// embedding, then whole decoder layers while they fit, then the final norm. Where even the
/// embedding does not fit (`--quick` sizes), it keeps the rows that do.
pub fn tensors(target: usize) -> Vec<(String, Vec<usize>)> {
    let bytes = |shape: &[usize]| shape.iter().product::<usize>() * 2;
    let rows = VOCAB.min(target.saturating_sub(HIDDEN * 2) / (HIDDEN * 2)).max(1);
    let mut tensors = vec![("model.embed_tokens.weight".to_string(), vec![rows, HIDDEN])];
    let mut total = bytes(&[rows, HIDDEN]);
    let layer = |index: usize| {
        let name = |part: &str| format!("model.layers.{index}.{part}.weight");
        vec![
            (name("input_layernorm"), vec![HIDDEN]),
            (name("self_attn.q_proj"), vec![HIDDEN, HIDDEN]),
            (name("self_attn.k_proj"), vec![KV, HIDDEN]),
            (name("self_attn.v_proj"), vec![KV, HIDDEN]),
            (name("self_attn.o_proj"), vec![HIDDEN, HIDDEN]),
            (name("post_attention_layernorm"), vec![HIDDEN]),
            (name("mlp.gate_proj"), vec![MLP, HIDDEN]),
            (name("mlp.up_proj"), vec![MLP, HIDDEN]),
            (name("mlp.down_proj"), vec![HIDDEN, MLP]),
        ]
    };
    for index in 0.. {
        let next = layer(index);
        let size: usize = next.iter().map(|(_, shape)| bytes(shape)).sum();
        if total + size + bytes(&[HIDDEN]) > target {
            break;
        }
        total += size;
        tensors.extend(next);
    }
    tensors.push(("model.norm.weight".to_string(), vec![HIDDEN]));
    tensors
}

/// The file of `target` bytes' model in `dir`: one kept from an earlier run when its header
/// reads back with the same tensors, else written anew (random bytes, never zeros) and synced
/// to storage. Returns its path and whether it was written.
///
/// # Errors
/// Writing fails (the folder is missing, or the disk is full).
pub fn ensure(dir: &Path, target: usize, seed: u64) -> Result<(PathBuf, bool)> {
    let path = dir.join(file_name(target));
    let tensors = tensors(target);
    if let Ok(header) = SafetensorsHeader::read(&path)
        && header.tensors.len() == tensors.len()
        && tensors
            .iter()
            .all(|(name, shape)| header.tensors.get(name).is_some_and(|entry| &entry.shape == shape))
    {
        return Ok((path, false));
    }
    let io = |source| Error::Io { context: format!("writing {}", path.display()), source };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &tensors {
        let bytes = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({ "dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes] }),
        );
        offset += bytes;
    }
    let mut text = serde_json::Value::Object(header).to_string().into_bytes();
    // The format pads the header with spaces so the data starts on 8 bytes.
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut file = std::fs::File::create(&path).map_err(io)?;
    file.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
    file.write_all(&text).map_err(io)?;
    let block = 64 << 20;
    let mut buffer = vec![0u8; block];
    let mut written = 0usize;
    let mut round = 0u64;
    while written < offset {
        let len = block.min(offset - written);
        fill_random(&mut buffer[..len], seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        file.write_all(&buffer[..len]).map_err(io)?;
        written += len;
        round += 1;
    }
    file.sync_all().map_err(io)?;
    Ok((path, true))
}

/// Random bytes, none zero, from `seed`, filled in parallel (a 32 GiB file would otherwise
/// take longer to fill than to write).
fn fill_random(buffer: &mut [u8], seed: u64) {
    buffer.par_chunks_mut(1 << 20).enumerate().for_each(|(index, chunk)| {
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(index as u64));
        for word in chunk.chunks_mut(8) {
            let bytes = (rng.u64(..) | 0x0101_0101_0101_0101).to_le_bytes();
            word.copy_from_slice(&bytes[..word.len()]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_has_llama_shapes_and_fits_its_target() {
        let tensors = tensors(8 << 30);
        assert_eq!(tensors[0].1, [VOCAB, HIDDEN]);
        let layers = tensors.iter().filter(|(name, _)| name.ends_with("mlp.down_proj.weight")).count();
        let bytes: usize = tensors.iter().map(|(_, shape)| shape.iter().product::<usize>() * 2).sum();
        assert!(bytes <= 8 << 30 && bytes > (8 << 30) - 500_000_000, "{bytes}");
        assert_eq!(layers, 17, "one embedding and 17 layers of 436 MB fill 8 GiB");
        let small = super::tensors(1 << 20);
        assert_eq!(small[0].1, [127, HIDDEN], "the embedding's rows that fit beside the norm");
    }

    #[test]
    fn a_written_file_reads_back_and_a_kept_one_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, written) = ensure(dir.path(), 3 << 20, fastrand::u64(..)).unwrap();
        assert!(written);
        let header = SafetensorsHeader::read(&path).unwrap();
        assert_eq!(header.tensors.len(), tensors(3 << 20).len());
        let data = std::fs::read(&path).unwrap();
        assert!(!data[header.data.offset as usize..].contains(&0), "random, never zeros");
        assert!(!ensure(dir.path(), 3 << 20, 1).unwrap().1, "kept files are reused");
    }
}
