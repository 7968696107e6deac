//! The data set's contents: fresh random bytes, in memory or in a file of its own.

use std::path::PathBuf;

use hetmem::error::{Error, Result};
use rayon::prelude::*;

use super::DatasetOptions;
use crate::random::SplitMix64;

/// Fills `bytes` with random bytes from `seed`, 1 MiB per task in parallel (a 50 GB data set
/// takes seconds, not minutes); `offset` is where `bytes` starts in the whole, so a data set
/// filled in parts gets the bytes it would whole.
fn fill_random_at(bytes: &mut [u8], seed: u64, offset: u64) {
    const CHUNK: usize = 1 << 20;
    bytes.par_chunks_mut(CHUNK).enumerate().for_each(|(index, chunk)| {
        SplitMix64::part(seed, offset / CHUNK as u64 + index as u64).fill_bytes(chunk);
    });
}

pub(super) fn fill_random(bytes: &mut [u8], seed: u64) {
    fill_random_at(bytes, seed, 0);
}

/// The data set's file: written with random frames, removed when dropped.
pub(super) struct DatasetFile {
    pub(super) path: PathBuf,
}

impl DatasetFile {
    /// Writes `options.frames` random frames to a new file in `options.dir` (or the temp dir).
    pub(super) fn write(options: &DatasetOptions, seed: u64) -> Result<DatasetFile> {
        use std::io::Write as _;
        let dir = options.dir.clone().unwrap_or_else(std::env::temp_dir);
        let path = dir.join(format!("hetmem-dataset-{}-{seed:x}.rgb", std::process::id()));
        let io = |context: String| move |source| Error::Io { context, source };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(format!("creating {}", path.display())))?;
        // Removed from here on, whatever fails.
        let dataset = DatasetFile { path };
        let mut writer = std::io::BufWriter::with_capacity(0, file);
        const PART: usize = 64 << 20;
        let mut part = vec![0u8; PART];
        let total = options.dataset_bytes();
        let mut written = 0u64;
        while written < total {
            let len = PART.min((total - written) as usize);
            fill_random_at(&mut part[..len], seed, written);
            writer.write_all(&part[..len]).map_err(io(format!("writing {}", dataset.path.display())))?;
            written += len as u64;
        }
        writer.flush().map_err(io(format!("writing {}", dataset.path.display())))?;
        Ok(dataset)
    }
}

impl Drop for DatasetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_fills_differ_by_seed_and_agree_in_parts() {
        let mut whole = vec![0; 3 << 20];
        fill_random(&mut whole, 7);
        let mut parts = vec![0; 3 << 20];
        let (first, second) = parts.split_at_mut(1 << 20);
        fill_random_at(first, 7, 0);
        fill_random_at(second, 7, 1 << 20);
        assert!(whole == parts, "a file written in parts holds the bytes of one fill");
        let mut other = vec![0; 3 << 20];
        fill_random(&mut other, 8);
        assert!(whole != other);
        assert!(whole.iter().any(|&byte| byte != whole[0]));
    }
}
