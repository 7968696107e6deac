//! A model's checkpoint: safetensors files (one, several, or the shards a
//! `model.safetensors.index.json` names), checked against each other, and the plan that puts
//! the tensors chosen from them (whole, or each cut to a tensor-parallel slice: [`ShardSpec`])
//! into one device allocation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::method::LoadReport;
use super::safetensors::{LoadedTensors, SafetensorsHeader, TensorEntry};
use super::source::{FileRange, ReadMode};
use super::stream::FileStream;
use crate::error::{Error, Result};
use crate::handoff::Lent;
use crate::memory::{DeviceBuf, WritableBuffer};

/// Where each run of tensors starts in the device allocation: a multiple of this, so every
/// tensor keeps the alignment its file gave it.
pub const PLACE_ALIGN: usize = 256;

/// The longest index file read: an index lists names and file names, a few MiB for the
/// largest models.
const MAX_INDEX_BYTES: u64 = 256 << 20;
/// A sharded plan reads at most this many ranges whatever its size...
const MIN_RANGE_BUDGET: usize = 1 << 16;
/// ... and beyond it one range per this many bytes of the slices on average: a range costs the
/// plan about a hundred bytes, so a header whose slices are read in pieces of a byte or two
/// (shape `[2^29, 2]` along dim 1) cannot make the plan outweigh the load many times over
/// (nor its `2^29` reads) before anything is read.
const BYTES_PER_RANGE: usize = 64;

/// The safetensors files of one model, their headers read and checked: no tensor name in two
/// files, and, for a sharded checkpoint, every shard present and holding what its index says.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    headers: Vec<SafetensorsHeader>,
}

/// Which tensors of a [`Checkpoint`] to load.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TensorFilter {
    /// Every tensor.
    #[default]
    All,
    /// These names, each of which must exist.
    Names(BTreeSet<String>),
    /// The names that start with one of these; at least one tensor must match.
    Prefixes(Vec<String>),
}

impl TensorFilter {
    fn keeps(&self, name: &str) -> bool {
        match self {
            TensorFilter::All => true,
            TensorFilter::Names(names) => names.contains(name),
            TensorFilter::Prefixes(prefixes) => {
                prefixes.iter().any(|prefix| name.starts_with(prefix.as_str()))
            }
        }
    }
}

/// A tensor-parallel slice: rank `rank` of `world` takes its chunk of every tensor along
/// dimension `dim`, as `torch.chunk(tensor, world, dim)[rank]` would (see [`ShardSpec::span`]).
///
/// A tensor with `dim + 1` dimensions or more is sliced: along dimension 0 its slice is one
/// contiguous byte range of the file; along a later dimension it is one range per index of
/// the dimensions before `dim` (strided), each read on its own and packed in place, so a rank
/// reads only its own slice's bytes. A tensor with fewer dimensions (a scalar, or a 1-D bias
/// when `dim` is 1) is loaded whole by every rank (replicated).
///
/// ```
/// use hetmem::data::ShardSpec;
/// let shard = ShardSpec::new(1, 4, 0).unwrap();
/// // 10 rows in chunks of ceil(10 / 4) = 3: rank 1 takes rows 3..6, rank 3 the last one.
/// assert_eq!(shard.span(10), (3, 6));
/// assert_eq!(ShardSpec::new(3, 4, 0).unwrap().span(10), (9, 10));
/// assert!(ShardSpec::new(4, 4, 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShardSpec {
    rank: usize,
    world: usize,
    dim: usize,
}

impl ShardSpec {
    /// Rank `rank` of `world` ranks, slicing along dimension `dim`.
    ///
    /// # Errors
    /// `world` 0, or `rank` not below `world` ([`Error::InvalidArgument`], with the remedy).
    pub fn new(rank: usize, world: usize, dim: usize) -> Result<ShardSpec> {
        if world == 0 {
            return Err(Error::invalid("shard", "world is 0: give the number of ranks, at least 1"));
        }
        if rank >= world {
            return Err(Error::invalid(
                "shard",
                format!("rank {rank} of a world of {world}: ranks count from 0 to {}", world - 1),
            ));
        }
        Ok(ShardSpec { rank, world, dim })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The dimension sliced.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The indices `start..end` this rank takes of a dimension of `len`, as `torch.chunk`
    /// splits: chunks of `ceil(len / world)`, the last ranks' smaller, and empty for ranks past
    /// the end (10 rows over 4 ranks: 3, 3, 3, 1; 5 rows over 4 ranks: 2, 2, 1, 0).
    pub fn span(&self, len: usize) -> (usize, usize) {
        // ceil(len / world) without overflow; rank < world, so rank * chunk <= len + chunk.
        let chunk = len.div_ceil(self.world);
        let start = self.rank.saturating_mul(chunk).min(len);
        (start, start.saturating_add(chunk).min(len))
    }
}

/// The tensors chosen from a [`Checkpoint`], each with its place in one allocation, and the
/// byte ranges of the files that fill it: consecutive chosen tensors of a file are read as one
/// range, each range placed from a multiple of [`PLACE_ALIGN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    tensors: BTreeMap<String, TensorEntry>,
    parts: Vec<(FileRange, usize)>,
    total: usize,
}

impl LoadPlan {
    /// Each chosen tensor by name, its offset counted from the allocation's start.
    pub fn tensors(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }

    /// The file ranges to read and where each goes in the allocation.
    pub fn parts(&self) -> &[(FileRange, usize)] {
        &self.parts
    }

    /// The allocation's size in bytes (0 when every chosen tensor is empty).
    pub fn total_bytes(&self) -> usize {
        self.total
    }
}

impl Checkpoint {
    /// The checkpoint at `path`: a sharded checkpoint's index (a `.json` file), else one
    /// safetensors file.
    ///
    /// # Errors
    /// As for [`Checkpoint::from_index`] or [`Checkpoint::from_files`].
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        if path.extension().is_some_and(|ext| ext == "json") {
            Checkpoint::from_index(path)
        } else {
            Checkpoint::from_files(&[path])
        }
    }

    /// The safetensors files at `paths`, in that order.
    ///
    /// # Errors
    /// As for [`SafetensorsHeader::read`]; a tensor name in two of the files
    /// ([`Error::InvalidArgument`], naming both files and the tensor).
    pub fn from_files(paths: &[impl AsRef<Path>]) -> Result<Checkpoint> {
        let headers = paths.iter().map(SafetensorsHeader::read).collect::<Result<Vec<_>>>()?;
        let mut seen: BTreeMap<&str, &Path> = BTreeMap::new();
        for header in &headers {
            for name in header.tensors.keys() {
                if let Some(first) = seen.insert(name, &header.path) {
                    return Err(Error::invalid(
                        "safetensors files",
                        format!(
                            "tensor {name:?} is in {} and again in {}: a checkpoint names each tensor once; load \
                             the files apart, or drop the file that repeats it",
                            first.display(),
                            header.path.display()
                        ),
                    ));
                }
            }
        }
        Ok(Checkpoint { headers })
    }

    /// A sharded checkpoint: the index at `path` (`weight_map`: tensor name -> shard file,
    /// relative to the index's folder) and its shards, each read once, in the order of their
    /// names. Every shard the index names must exist and hold the tensors the index puts in
    /// it, and no other.
    ///
    /// # Errors
    /// The index unreadable or not the format's JSON ([`Error::MalformedFile`]); a shard
    /// missing ([`Error::Io`], naming the shard, a tensor the index puts there, and the
    /// index); a shard that lacks a tensor the index puts in it, or holds one the index puts
    /// elsewhere or nowhere ([`Error::InvalidArgument`]); as for [`Checkpoint::from_files`].
    pub fn from_index(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let index_path = path.as_ref();
        let malformed = |problem: String| Error::MalformedFile {
            path: index_path.to_path_buf(),
            format: "safetensors index",
            problem,
        };
        let io = |source| Error::Io { context: format!("reading {}", index_path.display()), source };
        let file = super::source::open_nonblocking(index_path).map_err(io)?;
        let metadata = file.metadata().map_err(io)?;
        if !metadata.is_file() {
            return Err(malformed("not a regular file (a pipe or a device): give the index file".into()));
        }
        let size = metadata.len();
        if size > MAX_INDEX_BYTES {
            return Err(malformed(format!(
                "{size} bytes, more than the {MAX_INDEX_BYTES} an index may have"
            )));
        }
        // Bounded as well: a file growing while it is read cannot make this read run on.
        let mut text = Vec::with_capacity(size as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(&file, MAX_INDEX_BYTES + 1), &mut text)
            .map_err(io)?;
        if text.len() as u64 > MAX_INDEX_BYTES {
            return Err(malformed(format!("more than the {MAX_INDEX_BYTES} bytes an index may have")));
        }
        let index: serde_json::Value =
            serde_json::from_slice(&text).map_err(|error| malformed(error.to_string()))?;
        let weight_map = weight_map(&index).map_err(malformed)?;
        let folder = index_path.parent().unwrap_or(Path::new("."));
        let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, shard) in &weight_map {
            let plain = Path::new(shard);
            if plain.is_absolute() || plain.components().any(|part| part == std::path::Component::ParentDir) {
                return Err(malformed(format!(
                    "tensor {name:?} is in {shard:?}, outside the index's folder: shards lie beside their index"
                )));
            }
            by_shard.entry(shard).or_default().push(name);
        }
        let mut paths = Vec::with_capacity(by_shard.len());
        for (shard, names) in &by_shard {
            let shard_path = folder.join(shard);
            if let Err(source) = std::fs::metadata(&shard_path) {
                return Err(Error::Io {
                    context: format!(
                        "shard {} (tensor {:?} and {} more, by {}) is missing: download it, or load the shards \
                         that are here as a list of files",
                        shard_path.display(),
                        names[0],
                        names.len() - 1,
                        index_path.display()
                    ),
                    source,
                });
            }
            paths.push(shard_path);
        }
        let checkpoint = Checkpoint::from_files(&paths)?;
        for (header, (shard, names)) in checkpoint.headers.iter().zip(&by_shard) {
            if let Some(missing) = names.iter().find(|name| !header.tensors.contains_key(**name)) {
                return Err(Error::invalid(
                    "safetensors index",
                    format!(
                        "{} puts tensor {missing:?} in {}, which does not hold it: the index and the shards \
                         disagree; download them again",
                        index_path.display(),
                        header.path.display()
                    ),
                ));
            }
            if let Some(extra) =
                header.tensors.keys().find(|name| weight_map.get(*name).map(String::as_str) != Some(*shard))
            {
                let elsewhere = match weight_map.get(extra) {
                    Some(other) => format!("puts it in {other}"),
                    None => "does not list it".to_string(),
                };
                return Err(Error::invalid(
                    "safetensors index",
                    format!(
                        "{} holds tensor {extra:?}, and {} {elsewhere}: the index and the shards disagree; \
                         download them again",
                        header.path.display(),
                        index_path.display()
                    ),
                ));
            }
        }
        Ok(checkpoint)
    }

    /// The files' headers, in load order.
    pub fn headers(&self) -> &[SafetensorsHeader] {
        &self.headers
    }

    /// The tensors `filter` keeps, placed: each file's chosen tensors in its own order, runs of
    /// consecutive ones read as one range from a multiple of [`PLACE_ALIGN`] bytes. All files
    /// whole make one range per file, as laid out in it.
    ///
    /// # Errors
    /// A name asked for that no file holds, or prefixes no name starts with
    /// ([`Error::InvalidArgument`], with the first few names the files do hold); a plan larger
    /// than the address space.
    pub fn plan(&self, filter: &TensorFilter) -> Result<LoadPlan> {
        self.plan_with(filter, None)
    }

    /// As [`Checkpoint::plan`], each tensor cut to `shard`'s slice (see [`ShardSpec`]): the
    /// plan's entries have the slices' shapes and sizes, and its ranges cover only the
    /// slices' bytes (adjacent ones merged). Each tensor is placed from a multiple of
    /// [`PLACE_ALIGN`] bytes. `None`: as [`Checkpoint::plan`].
    ///
    /// ```no_run
    /// use hetmem::data::{Checkpoint, ShardSpec, TensorFilter};
    /// let checkpoint = Checkpoint::open("model.safetensors.index.json")?;
    /// // Rank 0 of 2, column slices (dimension 1) of every matrix.
    /// let plan = checkpoint.plan_with(&TensorFilter::All, Some(&ShardSpec::new(0, 2, 1)?))?;
    /// let read: u64 = plan.parts().iter().map(|(range, _)| range.len).sum();
    /// println!("{read} bytes to read into {} bytes", plan.total_bytes());
    /// # Ok::<(), hetmem::Error>(())
    /// ```
    ///
    /// # Errors
    /// As for [`Checkpoint::plan`].
    pub fn plan_with(&self, filter: &TensorFilter, shard: Option<&ShardSpec>) -> Result<LoadPlan> {
        match shard {
            None => self.plan_whole(filter),
            Some(shard) => self.plan_sharded(filter, shard),
        }
    }

    /// Each file's chosen tensors cut to `shard`'s slice, one tensor after another.
    fn plan_sharded(&self, filter: &TensorFilter, shard: &ShardSpec) -> Result<LoadPlan> {
        self.check_filter(filter)?;
        let mut tensors = BTreeMap::new();
        let mut parts: Vec<(FileRange, usize)> = Vec::new();
        let mut total = 0usize;
        // The ranges made so far, against MIN_RANGE_BUDGET and BYTES_PER_RANGE.
        let mut ranges_made = 0usize;
        for header in &self.headers {
            let mut by_offset: Vec<(&String, &TensorEntry)> =
                header.tensors.iter().filter(|(name, _)| filter.keeps(name)).collect();
            by_offset.sort_by_key(|(_, entry)| (entry.offset, entry.bytes));
            for (name, entry) in by_offset {
                let place = total.checked_next_multiple_of(PLACE_ALIGN).ok_or_else(too_large)?;
                let (sliced, ranges) = slice_of(name, entry, shard, total, &mut ranges_made)?;
                let mut at = place;
                for (start, len) in ranges {
                    let end = start.checked_add(len).ok_or_else(too_large)?;
                    let range = range_of(header, start, end);
                    // Merged with the range before where both the file's bytes and their
                    // places follow on.
                    match parts.last_mut() {
                        Some((last, last_place))
                            if last.path == range.path
                                && last.offset + last.len == range.offset
                                && usize::try_from(last.len).ok().and_then(|n| last_place.checked_add(n))
                                    == Some(at) =>
                        {
                            last.len += range.len;
                        }
                        _ => parts.push((range, at)),
                    }
                    at = at.checked_add(len).ok_or_else(too_large)?;
                }
                total = place.checked_add(sliced.bytes).ok_or_else(too_large)?;
                debug_assert_eq!(at, total, "a slice's ranges add up to its bytes");
                tensors.insert(name.clone(), TensorEntry { offset: place, ..sliced });
            }
        }
        parts.retain(|(range, _)| range.len > 0);
        Ok(LoadPlan { tensors, parts, total })
    }

    fn plan_whole(&self, filter: &TensorFilter) -> Result<LoadPlan> {
        self.check_filter(filter)?;
        let mut tensors = BTreeMap::new();
        let mut parts = Vec::new();
        let mut total = 0usize;
        for header in &self.headers {
            let mut by_offset: Vec<(&String, &TensorEntry)> = header.tensors.iter().collect();
            by_offset.sort_by_key(|(_, entry)| (entry.offset, entry.bytes));
            // The run being gathered: its start in the file's data, its end, its place.
            let mut run: Option<(usize, usize, usize)> = None;
            for (name, entry) in by_offset {
                if !filter.keeps(name) {
                    // A tensor left out cuts the run, unless it is empty (no bytes to skip).
                    if entry.bytes > 0
                        && let Some((start, end, place)) = run.take()
                    {
                        parts.push((range_of(header, start, end), place));
                    }
                    continue;
                }
                let (start, place) = match run {
                    Some((start, _, place)) => (start, place),
                    None => {
                        (entry.offset, total.checked_next_multiple_of(PLACE_ALIGN).ok_or_else(too_large)?)
                    }
                };
                let end = entry.offset.checked_add(entry.bytes).ok_or_else(too_large)?;
                let at = place.checked_add(entry.offset - start).ok_or_else(too_large)?;
                total = at.checked_add(entry.bytes).ok_or_else(too_large)?;
                run = Some((start, end, place));
                tensors.insert(name.clone(), TensorEntry { offset: at, ..entry.clone() });
            }
            if let Some((start, end, place)) = run {
                parts.push((range_of(header, start, end), place));
            }
        }
        parts.retain(|(range, _)| range.len > 0);
        Ok(LoadPlan { tensors, parts, total })
    }

    fn check_filter(&self, filter: &TensorFilter) -> Result<()> {
        let holds = |name: &str| self.headers.iter().any(|header| header.tensors.contains_key(name));
        let some_names = || {
            let names: Vec<&str> = self
                .headers
                .iter()
                .flat_map(|header| header.tensors.keys())
                .take(5)
                .map(String::as_str)
                .collect();
            format!("the files hold {names:?}, ...")
        };
        match filter {
            TensorFilter::All => Ok(()),
            TensorFilter::Names(names) => match names.iter().find(|name| !holds(name)) {
                Some(missing) => Err(Error::invalid(
                    "tensor names",
                    format!("no file holds tensor {missing:?}: check the name ({})", some_names()),
                )),
                None => Ok(()),
            },
            TensorFilter::Prefixes(prefixes) => {
                let any = self
                    .headers
                    .iter()
                    .flat_map(|header| header.tensors.keys())
                    .any(|name| filter.keeps(name));
                if any {
                    Ok(())
                } else {
                    Err(Error::invalid(
                        "tensor prefix",
                        format!(
                            "no tensor name starts with {prefixes:?}: check the prefix ({})",
                            some_names()
                        ),
                    ))
                }
            }
        }
    }
}

/// The index's `weight_map`: tensor name -> shard file.
fn weight_map(index: &serde_json::Value) -> std::result::Result<BTreeMap<String, String>, String> {
    let map = index
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or("no \"weight_map\" object (tensor name -> shard file)")?;
    map.iter()
        .map(|(name, shard)| match shard.as_str() {
            Some(shard) => Ok((name.clone(), shard.to_string())),
            None => Err(format!("tensor {name:?}: its shard is not a file name")),
        })
        .collect()
}

fn too_large() -> Error {
    Error::invalid("load", "the tensors add up past the address space")
}

/// `entry` cut to `shard`'s slice (its shape, its bytes; the offset left as the file's), and
/// the slice's byte ranges `(start, len)` in the file's data section, in order (empty ones
/// left out). A tensor with no dimension `shard.dim()` is whole.
///
/// `ranges_made` counts the plan's ranges (this tensor's added), `bytes_before` the plan's
/// bytes before this tensor: a slice whose ranges would pass the plan's budget
/// ([`MIN_RANGE_BUDGET`], or one per [`BYTES_PER_RANGE`] bytes) is refused before any is made.
fn slice_of(
    name: &str,
    entry: &TensorEntry,
    shard: &ShardSpec,
    bytes_before: usize,
    ranges_made: &mut usize,
) -> Result<(TensorEntry, Vec<(usize, usize)>)> {
    let dim = shard.dim();
    if entry.shape.len() <= dim {
        let whole = if entry.bytes > 0 { vec![(entry.offset, entry.bytes)] } else { Vec::new() };
        return Ok((entry.clone(), whole));
    }
    let element = super::safetensors::element_bytes(&entry.dtype)
        .map_err(|problem| Error::invalid("shard", format!("tensor {name:?}: {problem}")))?;
    let product = |dims: &[usize]| dims.iter().try_fold(1usize, |all, &n| all.checked_mul(n));
    let outer = product(&entry.shape[..dim]).ok_or_else(too_large)?;
    // The bytes of one index of `dim`, and of one index of the dimensions before it.
    let inner =
        product(&entry.shape[dim + 1..]).and_then(|n| n.checked_mul(element)).ok_or_else(too_large)?;
    let row = inner.checked_mul(entry.shape[dim]).ok_or_else(too_large)?;
    let (start, end) = shard.span(entry.shape[dim]);
    let len = inner.checked_mul(end - start).ok_or_else(too_large)?;
    let skip = inner.checked_mul(start).ok_or_else(too_large)?;
    let mut shape = entry.shape.clone();
    shape[dim] = end - start;
    let bytes = len.checked_mul(outer).ok_or_else(too_large)?;
    let pieces = if len == 0 {
        0
    } else if len == row {
        1
    } else {
        outer
    };
    let budget = (bytes_before.saturating_add(bytes) / BYTES_PER_RANGE).max(MIN_RANGE_BUDGET);
    *ranges_made = ranges_made.saturating_add(pieces);
    if *ranges_made > budget {
        return Err(Error::invalid(
            "shard",
            format!(
                "tensor {name:?} of shape {:?} sliced along dim {dim} is {pieces} ranges of {len} bytes, \
                 which with the plan's others make {} ranges for {} bytes (at most one per \
                 {BYTES_PER_RANGE} bytes, or {MIN_RANGE_BUDGET}): the plan would outweigh what it reads; \
                 remedy: shard along an earlier dimension, or load this tensor without shard= and slice it after",
                entry.shape,
                *ranges_made,
                bytes_before.saturating_add(bytes)
            ),
        ));
    }
    let mut ranges = Vec::new();
    if len > 0 {
        if len == row {
            // The whole of `dim`: the slices of consecutive outer indices follow on.
            ranges.push((entry.offset, bytes));
        } else {
            ranges.reserve(outer);
            for index in 0..outer {
                let at = index
                    .checked_mul(row)
                    .and_then(|n| n.checked_add(skip))
                    .and_then(|n| n.checked_add(entry.offset))
                    .ok_or_else(too_large)?;
                ranges.push((at, len));
            }
        }
    }
    Ok((TensorEntry { dtype: entry.dtype.clone(), shape, offset: entry.offset, bytes }, ranges))
}

/// The bytes `start..end` of `header`'s data section, as a range of its file.
fn range_of(header: &SafetensorsHeader, start: usize, end: usize) -> FileRange {
    FileRange {
        path: header.path.clone(),
        offset: header.data.offset + start as u64,
        len: (end - start) as u64,
    }
}

impl FileStream {
    /// Reads the ranges of `plan` into `dst` (at least [`LoadPlan::total_bytes`] long), each at
    /// its place; returns once every copy has finished. A plan of empty tensors reads nothing.
    ///
    /// # Errors
    /// As for [`FileStream::load_placed`].
    pub fn load_plan<D: WritableBuffer<Elem = u8>>(
        &mut self,
        plan: &LoadPlan,
        dst: &mut Lent<D>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadReport> {
        if plan.parts.is_empty() {
            let method = self.options().method;
            return Ok(LoadReport {
                method: if method == super::LoadMethod::Auto { super::LoadMethod::Staged } else { method },
                read_mode: ReadMode::Buffered,
                direct_refused: None,
                auto_reason: Some("nothing to read: every tensor chosen is empty".into()),
                bytes: 0,
                seconds: 0.0,
                setup_seconds: 0.0,
            });
        }
        self.load_placed(&plan.parts, dst, progress)
    }

    /// Loads the tensors of the safetensors files at `paths` (the shards of one model, say)
    /// into one device allocation, each tensor at its own offset (see [`LoadedTensors`]).
    ///
    /// # Errors
    /// As for [`Checkpoint::from_files`]; no tensor bytes at all; as for
    /// [`FileStream::load_into`] (device memory too small among them).
    pub fn load_safetensors(
        &mut self,
        paths: &[impl AsRef<Path>],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadedTensors> {
        let plan = Checkpoint::from_files(paths)?.plan(&TensorFilter::All)?;
        if plan.total == 0 {
            return Err(Error::invalid("load", "nothing to load: the files hold no tensor bytes"));
        }
        self.load_plan_to_device(&plan, progress)
    }

    /// `plan`'s tensors into one new allocation on the stream's device (of at least a byte: a
    /// plan of empty tensors needs none).
    pub(crate) fn load_plan_to_device(
        &mut self,
        plan: &LoadPlan,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<LoadedTensors> {
        let mut dst = self.queue().lend(DeviceBuf::<u8>::new(self.device(), plan.total.max(1))?);
        let report = self.load_plan(plan, &mut dst, progress)?;
        Ok(LoadedTensors { buffer: dst.reclaim()?, tensors: plan.tensors.clone(), report })
    }
}
