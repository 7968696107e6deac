//! safetensors files: the header read and checked, every size and offset with checked
//! arithmetic, before any byte of a tensor is trusted.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::method::LoadReport;
use super::source::FileRange;
use crate::error::{Error, Result};
use crate::memory::DeviceBuf;

/// The longest header read (the reference `safetensors` crate's limit): the header is read
/// into memory whole, so its length, which the file claims, is bounded.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The header's key for the file's free-form metadata, which names no tensor.
const METADATA_KEY: &str = "__metadata__";

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TensorEntry {
    /// The element type, as the file names it (`BF16`, `F32`, ...).
    pub dtype: String,
    /// The shape (empty for a scalar).
    pub shape: Vec<usize>,
    /// Where its bytes start: in the file's data section ([`SafetensorsHeader`]), or in the
    /// device allocation ([`LoadedTensors`], [`LoadPlan`](super::LoadPlan)).
    pub offset: usize,
    /// Its size in bytes: the shape's product times the element size, checked.
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

/// A tensor's entry as the header spells it.
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

impl RawEntry {
    /// The entry of tensor `name` from its JSON object.
    fn parse(name: &str, value: &serde_json::Value) -> std::result::Result<RawEntry, String> {
        let field =
            |key: &str| value.get(key).ok_or_else(|| format!("header: tensor {name:?} has no field {key:?}"));
        let numbers = |key: &str| -> std::result::Result<Vec<u64>, String> {
            let wrong = || format!("header: tensor {name:?}: {key:?} is not a list of non-negative integers");
            field(key)?.as_array().ok_or_else(wrong)?.iter().map(|n| n.as_u64().ok_or_else(wrong)).collect()
        };
        let dtype = field("dtype")?
            .as_str()
            .ok_or_else(|| format!("header: tensor {name:?}: \"dtype\" is not a string"))?
            .to_string();
        let shape = numbers("shape")?;
        let data_offsets = match numbers("data_offsets")?[..] {
            [start, stop] => (start, stop),
            _ => return Err(format!("header: tensor {name:?}: \"data_offsets\" is not [start, end]")),
        };
        Ok(RawEntry { dtype, shape, data_offsets })
    }
}

/// The bytes of one element of the safetensors dtype `name`.
///
/// # Errors
/// A name the format does not know, or an element smaller than a byte (`F4`, `F6_*`: their
/// tensors have no byte offsets of their own): the message lists what is known.
pub fn element_bytes(name: &str) -> std::result::Result<usize, String> {
    let dtype: safetensors::Dtype = serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| {
            format!(
                "unknown dtype {name:?} (known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, \
                 U32, F32, C64, F64, I64, U64)"
            )
        })?;
    match dtype.bitsize() {
        bits if bits % 8 == 0 => Ok(bits / 8),
        bits => Err(format!(
            "dtype {name} has {bits}-bit elements, which hetmem does not load (whole-byte dtypes only)"
        )),
    }
}

impl SafetensorsHeader {
    /// Reads and checks the header of the safetensors file at `path`: every tensor's dtype is
    /// known, its byte count is its shape's product times the element size (computed without
    /// overflow), the tensors tile the data section exactly (no gap, no overlap) and the data
    /// section ends where the file does.
    ///
    /// # Errors
    /// The file is missing or unreadable ([`Error::Io`]); the header is truncated, not JSON,
    /// or describes bytes the file does not hold, overlapping or past its end
    /// ([`Error::MalformedFile`], naming the tensor).
    pub fn read(path: impl AsRef<Path>) -> Result<SafetensorsHeader> {
        let path = path.as_ref();
        let malformed = |problem: String| Error::MalformedFile {
            path: path.to_path_buf(),
            format: "safetensors",
            problem,
        };
        let io = |source| Error::Io { context: format!("reading {}", path.display()), source };
        let file = super::source::open_nonblocking(path).map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if !metadata.is_file() {
            return Err(malformed("not a regular file".into()));
        }
        let size = metadata.len();
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
        let entries: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|error| malformed(format!("header: {error}")))?;
        let mut by_offset = Vec::with_capacity(entries.len());
        for (name, value) in entries {
            if name == METADATA_KEY {
                continue;
            }
            let raw = RawEntry::parse(&name, &value).map_err(malformed)?;
            let entry = checked_entry(&name, raw).map_err(malformed)?;
            by_offset.push((name, entry));
        }
        by_offset.sort_by_key(|(_, entry)| (entry.0.offset, entry.1));
        let mut tensors = BTreeMap::new();
        let mut end = 0u64;
        let mut previous: Option<&str> = None;
        for (name, (entry, entry_end)) in &by_offset {
            if entry.offset as u64 != end {
                let problem = match previous {
                    Some(before) if (entry.offset as u64) < end => format!(
                        "tensor {name:?} starts at byte {} of the data, inside tensor {before:?} (which ends at \
                         {end}): the tensors overlap",
                        entry.offset
                    ),
                    _ => format!(
                        "tensor {name:?} starts at byte {} of the data, where {end} is next: a gap the format does \
                         not allow",
                        entry.offset
                    ),
                };
                return Err(malformed(problem));
            }
            end = *entry_end;
            previous = Some(name);
        }
        for (name, (entry, _)) in by_offset {
            tensors.insert(name, entry);
        }
        let data_offset = 8 + header_len;
        // Checked: a header may describe tensors up to 2^64 bytes long, past any file.
        if data_offset.checked_add(end) != Some(size) {
            return Err(malformed(format!(
                "the header describes {end} bytes of tensors, the file holds {} after the header",
                size - data_offset
            )));
        }
        Ok(SafetensorsHeader {
            path: path.to_path_buf(),
            tensors,
            data: FileRange { path: path.to_path_buf(), offset: data_offset, len: end },
        })
    }
}

/// A tensor's entry with its sizes checked: its dtype known, its byte count (the shape's
/// product times the element size) without overflow and equal to its offsets' span. Returns
/// the entry and the data offset where it ends.
fn checked_entry(name: &str, raw: RawEntry) -> std::result::Result<(TensorEntry, u64), String> {
    let element = element_bytes(&raw.dtype).map_err(|problem| format!("tensor {name:?}: {problem}"))?;
    let too_large = || {
        format!(
            "tensor {name:?}: shape {:?} of {} is larger than this machine can address",
            raw.shape, raw.dtype
        )
    };
    let shape = raw
        .shape
        .iter()
        .map(|&extent| usize::try_from(extent).map_err(|_| too_large()))
        .collect::<std::result::Result<Vec<usize>, String>>()?;
    let bytes =
        shape.iter().try_fold(element, |bytes, &extent| bytes.checked_mul(extent)).ok_or_else(too_large)?;
    let (start, stop) = raw.data_offsets;
    let span = stop
        .checked_sub(start)
        .ok_or_else(|| format!("tensor {name:?}: data_offsets [{start}, {stop}] end before they start"))?;
    if span != bytes as u64 {
        return Err(format!(
            "tensor {name:?}: shape {shape:?} of {} is {bytes} bytes, its data_offsets [{start}, {stop}] hold {span}",
            raw.dtype
        ));
    }
    let offset = usize::try_from(start).map_err(|_| too_large())?;
    Ok((TensorEntry { dtype: raw.dtype, shape, offset, bytes }, stop))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_header(dir: &Path, name: &str, header: &str, data: usize) -> PathBuf {
        let path = dir.join(name);
        let data: Vec<u8> = (0..data).map(|_| fastrand::u8(..)).collect();
        std::fs::write(&path, [&(header.len() as u64).to_le_bytes()[..], header.as_bytes(), &data].concat())
            .unwrap();
        path
    }

    fn problem(dir: &Path, name: &str, header: &str, data: usize) -> String {
        let path = file_with_header(dir, name, header, data);
        let error = SafetensorsHeader::read(&path).unwrap_err();
        assert!(matches!(error, Error::MalformedFile { .. }), "{error}");
        let text = error.to_string();
        assert!(text.contains(name) && text.contains("remedy"), "{text}");
        text
    }

    #[test]
    fn scalars_empty_tensors_and_metadata_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let header = r#"{"__metadata__": {"format": "pt"}, "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
            "e": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [8, 8]},
            "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [8, 11]}}"#;
        let path = file_with_header(dir.path(), "ok.safetensors", header, 11);
        let read = SafetensorsHeader::read(&path).unwrap();
        assert_eq!(read.tensors.len(), 3);
        assert_eq!(
            read.tensors["s"],
            TensorEntry { dtype: "F64".into(), shape: vec![], offset: 0, bytes: 8 }
        );
        assert_eq!(read.tensors["e"].bytes, 0);
        assert_eq!(read.tensors["b"].offset, 8);
        assert_eq!(read.data.len, 11);
        assert_eq!(read.data.offset, 8 + header.len() as u64);
    }

    #[test]
    fn sizes_that_lie_overlap_or_overflow_name_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let text = problem(
            dir,
            "overlap.safetensors",
            r#"{"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}"#,
            12,
        );
        assert!(text.contains("\"b\"") && text.contains("overlap"), "{text}");
        let text = problem(
            dir,
            "gap.safetensors",
            r#"{"a": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}"#,
            6,
        );
        assert!(text.contains("\"a\"") && text.contains("gap"), "{text}");
        let text = problem(
            dir,
            "shape-lies.safetensors",
            r#"{"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}"#,
            8,
        );
        assert!(text.contains("\"w\"") && text.contains("12 bytes"), "{text}");
        let text = problem(
            dir,
            "backwards.safetensors",
            r#"{"w": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}}"#,
            8,
        );
        assert!(text.contains("end before they start"), "{text}");
        let huge = u64::MAX / 2;
        let text = problem(
            dir,
            "overflow.safetensors",
            &format!(r#"{{"w": {{"dtype": "F64", "shape": [{huge}, 4], "data_offsets": [0, 8]}}}}"#),
            8,
        );
        assert!(text.contains("larger than this machine can address"), "{text}");
        let text = problem(
            dir,
            "dtype.safetensors",
            r#"{"w": {"dtype": "Q3", "shape": [1], "data_offsets": [0, 1]}}"#,
            1,
        );
        assert!(text.contains("unknown dtype \"Q3\"") && text.contains("BF16"), "{text}");
        let text = problem(
            dir,
            "nibbles.safetensors",
            r#"{"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}"#,
            1,
        );
        assert!(text.contains("4-bit"), "{text}");
        let text = problem(
            dir,
            "past-end.safetensors",
            r#"{"w": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]}}"#,
            10,
        );
        assert!(text.contains("describes 100 bytes"), "{text}");
        let text = problem(dir, "fields.safetensors", r#"{"w": {"dtype": "U8", "shape": [1]}}"#, 1);
        assert!(text.contains("\"w\"") && text.contains("data_offsets"), "{text}");
    }

    #[test]
    fn element_sizes_follow_the_format() {
        assert_eq!(element_bytes("BF16"), Ok(2));
        assert_eq!(element_bytes("F8_E4M3"), Ok(1));
        assert_eq!(element_bytes("C64"), Ok(8));
        assert!(element_bytes("bf16").is_err());
    }
}
