//! safetensors files: the header parsed by the `safetensors` crate, the tensors' bytes streamed
//! into one device allocation, each tensor at its own offset.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::method::LoadReport;
use super::source::FileRange;
use super::stream::FileStream;
use crate::error::{Error, Result};
use crate::memory::DeviceBuf;

/// Where each file's tensors start in the device allocation: a multiple of this, so every
/// tensor keeps the alignment its file gave it.
const FILE_ALIGN: usize = 256;

/// The longest header read (the reference `safetensors` crate's limit): the header is read
/// into memory whole, so its length, which the file claims, is bounded.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TensorEntry {
    /// The element type, as the file names it (`BF16`, `F32`, ...).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Where its bytes start: in the file's data section ([`SafetensorsHeader`]), or in the
    /// device allocation ([`LoadedTensors`]).
    pub offset: usize,
    /// Its size in bytes.
    pub bytes: usize,
}

/// The header of a safetensors file: its tensors, and where their bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    /// The file.
    pub path: PathBuf,
    /// The tensors by name, offsets counted from the data section's start.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// The data section: every tensor's bytes, after the header.
    pub data: FileRange,
}

impl SafetensorsHeader {
    /// Reads and checks the header of the safetensors file at `path`: the tensors must tile the
    /// data section exactly, and the data section must end where the file does.
    ///
    /// # Errors
    /// The file is missing or unreadable ([`Error::Io`]); the header is truncated, not JSON,
    /// or describes bytes the file does not hold ([`Error::MalformedFile`]).
    pub fn read(path: impl AsRef<Path>) -> Result<SafetensorsHeader> {
        let path = path.as_ref();
        let malformed = |problem: String| Error::MalformedFile {
            path: path.to_path_buf(),
            format: "safetensors",
            problem,
        };
        let io = |source| Error::Io { context: format!("reading {}", path.display()), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let mut prefix = [0u8; 8];
        if size < 8 {
            return Err(malformed(format!("{size} bytes, shorter than the 8-byte header length")));
        }
        file.read_exact_at(&mut prefix, 0).map_err(io)?;
        let header_len = u64::from_le_bytes(prefix);
        if header_len > size - 8 {
            return Err(malformed(format!("a {header_len}-byte header in a {size}-byte file (truncated?)")));
        }
        if header_len > MAX_HEADER_BYTES {
            return Err(malformed(format!(
                "a {header_len}-byte header, more than the {MAX_HEADER_BYTES} bytes the format allows"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8).map_err(io)?;
        let metadata: safetensors::tensor::Metadata =
            serde_json::from_slice(&header).map_err(|error| malformed(format!("header: {error}")))?;
        let mut tensors = BTreeMap::new();
        let mut end = 0;
        for (name, info) in metadata.tensors() {
            let (start, stop) = info.data_offsets;
            end = end.max(stop);
            tensors.insert(
                name,
                TensorEntry {
                    dtype: info.dtype.to_string(),
                    shape: info.shape.clone(),
                    offset: start,
                    bytes: stop - start,
                },
            );
        }
        let data_offset = 8 + header_len;
        // Checked: a header may describe tensors up to 2^64 bytes long, past any file.
        if data_offset.checked_add(end as u64) != Some(size) {
            return Err(malformed(format!(
                "the header describes {end} bytes of tensors, the file holds {} after the header",
                size - data_offset
            )));
        }
        Ok(SafetensorsHeader {
            path: path.to_path_buf(),
            tensors,
            data: FileRange { path: path.to_path_buf(), offset: data_offset, len: end as u64 },
        })
    }
}

/// Tensors loaded into one device allocation.
#[derive(Debug)]
pub struct LoadedTensors {
    /// The allocation: every file's data section, each from a multiple of 256 bytes.
    pub buffer: DeviceBuf<u8>,
    /// Each tensor by name, its offset counted from the allocation's start.
    pub tensors: BTreeMap<String, TensorEntry>,
    /// How the bytes moved (all files together).
    pub report: LoadReport,
}

impl FileStream {
    /// Loads the tensors of the safetensors files at `paths` (the shards of one model, say)
    /// into one device allocation, each tensor at its own offset (see [`LoadedTensors`]).
    ///
    /// # Errors
    /// As for [`SafetensorsHeader::read`]; two files holding a tensor of one name; no tensor
    /// bytes at all; as for [`FileStream::load_into`] (device memory too small among them).
    pub fn load_safetensors(
        &mut self,
        paths: &[impl AsRef<Path>],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadedTensors> {
        let headers = paths.iter().map(SafetensorsHeader::read).collect::<Result<Vec<_>>>()?;
        let mut tensors = BTreeMap::new();
        let mut starts = Vec::with_capacity(headers.len());
        let mut total = 0usize;
        for header in &headers {
            let start = total.next_multiple_of(FILE_ALIGN);
            starts.push(start);
            total = start + header.data.len as usize;
            for (name, entry) in &header.tensors {
                let placed = TensorEntry { offset: start + entry.offset, ..entry.clone() };
                if tensors.insert(name.clone(), placed).is_some() {
                    return Err(Error::invalid(
                        "safetensors files",
                        format!(
                            "tensor {name} appears twice (again in {}): load the files apart",
                            header.path.display()
                        ),
                    ));
                }
            }
        }
        if total == 0 {
            return Err(Error::invalid("load", "nothing to load: the files hold no tensor bytes"));
        }
        let mut dst = self.queue().lend(DeviceBuf::<u8>::new(self.device(), total)?);
        let mut report: Option<LoadReport> = None;
        let mut done_before = 0u64;
        for (header, &start) in headers.iter().zip(&starts) {
            if header.data.len == 0 {
                continue;
            }
            let shifted = |done: u64| progress(done_before + done);
            let part = self.load_into(std::slice::from_ref(&header.data), &mut dst, start, &shifted)?;
            done_before += part.bytes;
            report = Some(match report {
                None => part,
                Some(sum) => LoadReport {
                    bytes: sum.bytes + part.bytes,
                    seconds: sum.seconds + part.seconds,
                    setup_seconds: sum.setup_seconds + part.setup_seconds,
                    direct_refused: sum.direct_refused.or(part.direct_refused),
                    ..sum
                },
            });
        }
        let report = report.expect("some file holds bytes: total > 0");
        Ok(LoadedTensors { buffer: dst.reclaim()?, tensors, report })
    }
}
