//! The sparse pass: a kernel that touches a small share of the data set's bytes (one chunk in
//! every stride: 5% by default), reading them where the set lies (mapped) against copying the
//! whole set into device memory first, piece by piece within the device budget (copy-all).
//! This is the seeds' case for mapping: touch only what you need.
//!
//! The pass XORs the 32-bit words of every chunk into one word (`dataset_sparse_xor` in
//! `kernels/dataset.cu`); the result, folded into a poisoned word, is compared with the CPU's
//! XOR of the same bytes.

use std::time::Instant;

use hetmem::backend::cuda::{Kernel, LaunchConfig};
use hetmem::error::{Error, Result};
use hetmem::handoff::KernelArgs;
use hetmem::{Buffer, Device, DeviceBuf, Lease, Queue, Shared, memory::HostVisible};

use super::{DATASET, DatasetOptions};

/// Bytes the chunks' strides are counted in: loads are 16 bytes wide and aligned.
pub const SPARSE_ALIGN: usize = 16;
/// The default chunk: 64 KiB, one in every 20 (5% of the bytes).
pub const DEFAULT_SPARSE_CHUNK: usize = 64 << 10;
/// Chunks per stride: one chunk read in every this many.
pub const SPARSE_STRIDE_CHUNKS: usize = 20;
/// What the result word holds before the kernel folds into it.
const POISON_WORD: u32 = 0xA5A5_A5A5;
/// Threads per block of the sparse kernel.
const BLOCK: u32 = 256;

/// How the sparse pass reached the chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SparseMethod {
    /// The kernel reads the chunks where the data set lies: no device memory.
    Mapped,
    /// The whole set copied into device memory, a piece within the budget at a time, the
    /// kernel reading each piece's chunks there.
    CopyAll,
}

impl SparseMethod {
    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            SparseMethod::Mapped => "sparse mapped",
            SparseMethod::CopyAll => "sparse copy-all",
        }
    }
}

/// One sparse pass over the data set.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SparseRun {
    /// How the chunks were reached.
    pub method: SparseMethod,
    /// Seconds for the pass (copies included for copy-all).
    pub seconds: f64,
    /// The data set's bytes the kernel read, over all of them.
    pub share_touched: f64,
    /// Bytes copied into device memory (0 for mapped).
    pub copied_bytes: u64,
    /// The most device memory the pass held at once, in bytes.
    pub device_bytes: u64,
    /// Whether the kernel's XOR matched the CPU's.
    pub verified: bool,
}

/// Where the chunks lie: `chunk` bytes at every `stride`, over `len` bytes.
#[derive(Debug, Clone, Copy)]
struct Chunks {
    chunk: usize,
    stride: usize,
}

impl Chunks {
    fn of(options: &DatasetOptions) -> Chunks {
        Chunks { chunk: options.sparse_chunk, stride: options.sparse_chunk * SPARSE_STRIDE_CHUNKS }
    }

    /// Bytes of `len` the chunks cover.
    fn touched(self, len: usize) -> usize {
        let whole = len / self.stride;
        whole * self.chunk + (len - whole * self.stride).min(self.chunk)
    }

    /// The CPU's XOR of the chunks of `bytes`, as the kernel computes it: 16-byte vectors as
    /// four little-endian words, a vector cut by the end byte by byte.
    fn xor(self, bytes: &[u8]) -> u32 {
        use rayon::prelude::*;
        bytes
            .par_chunks(self.stride)
            .map(|piece| {
                let chunk = &piece[..self.chunk.min(piece.len())];
                let vectors = chunk.chunks_exact(SPARSE_ALIGN);
                let tail = vectors.remainder().iter().fold(0u32, |acc, &byte| acc ^ u32::from(byte));
                vectors.fold(tail, |acc, vector| {
                    vector
                        .chunks_exact(4)
                        .fold(acc, |acc, word| acc ^ u32::from_le_bytes(word.try_into().expect("4 bytes")))
                })
            })
            .reduce(|| 0, |a, b| a ^ b)
    }
}

/// The device budget's pieces for copy-all: the most whole strides that fit `budget`.
///
/// # Errors
/// A budget smaller than one stride.
fn piece_bytes(budget: u64, stride: usize) -> Result<usize> {
    let strides = budget / stride as u64;
    if strides == 0 {
        return Err(Error::invalid(
            "device budget",
            format!("{budget} bytes: copy-all needs at least one stride of the sparse pass, {stride} bytes"),
        ));
    }
    Ok(usize::try_from(strides * stride as u64).unwrap_or(usize::MAX / stride * stride))
}

/// Runs both sparse passes over `data` within `budget` bytes of device memory, each checked.
///
/// # Errors
/// A budget smaller than a stride, a driver error, or a result that differs from the CPU's.
pub(super) fn run<B>(
    device: &Device,
    queue: &Queue,
    data: &Shared<B>,
    options: &DatasetOptions,
    budget: u64,
) -> Result<Vec<SparseRun>>
where
    B: HostVisible + Buffer<Elem = u8>,
{
    let chunks = Chunks::of(options);
    let len = data.len();
    let share_touched = chunks.touched(len) as f64 / len as f64;
    let want = chunks.xor(data.host());
    let kernel = match device.as_cuda() {
        Some(cuda) => Some((kernels_sparse(cuda)?, cuda.attributes().multiprocessor_count.max(1) * 8)),
        None => None,
    };
    let pass = Pass { device, queue, chunks, kernel: kernel.as_ref() };
    // A set within the budget is copied whole; a larger one in whole strides.
    let piece = if budget >= len as u64 { len } else { piece_bytes(budget, chunks.stride)? };

    let started = Instant::now();
    let got = pass.mapped(data)?;
    let mapped = SparseRun {
        method: SparseMethod::Mapped,
        seconds: started.elapsed().as_secs_f64(),
        share_touched,
        copied_bytes: 0,
        device_bytes: 0,
        verified: check(SparseMethod::Mapped, got, want)?,
    };
    let started = Instant::now();
    let got = pass.copy_all(data, piece)?;
    let copy_all = SparseRun {
        method: SparseMethod::CopyAll,
        seconds: started.elapsed().as_secs_f64(),
        share_touched,
        copied_bytes: len as u64,
        device_bytes: piece as u64,
        verified: check(SparseMethod::CopyAll, got, want)?,
    };
    Ok(vec![mapped, copy_all])
}

fn kernels_sparse(cuda: &hetmem::backend::cuda::CudaDevice) -> Result<Kernel> {
    hetmem::kernels::kernel(cuda, &DATASET, "dataset_sparse_xor")
}

/// An error unless the kernel's XOR `got` is the CPU's `want`.
fn check(method: SparseMethod, got: u32, want: u32) -> Result<bool> {
    if got != want {
        return Err(Error::invalid(
            "sparse pass result",
            format!("{}: the kernel's XOR is {got:#010x}, the CPU's {want:#010x}", method.name()),
        ));
    }
    Ok(true)
}

/// What both passes need.
struct Pass<'a> {
    device: &'a Device,
    queue: &'a Queue,
    chunks: Chunks,
    /// The kernel and its most blocks, on a GPU.
    kernel: Option<&'a (Kernel, u32)>,
}

impl Pass<'_> {
    /// The chunks read where the set lies.
    fn mapped<B>(&self, data: &Shared<B>) -> Result<u32>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        match self.kernel {
            None => Ok(self.chunks.xor(data.host())),
            Some(kernel) => self.launch(kernel, data),
        }
    }

    /// The set copied into device memory `piece` bytes at a time (whole strides), each piece's
    /// chunks read there; the last, shorter piece into a buffer of its own, after the first
    /// is freed, so no more than `piece` bytes are held.
    fn copy_all<B>(&self, data: &Shared<B>, piece: usize) -> Result<u32>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        let host = data.host();
        let mut xor = 0;
        let (whole, rest) = (host.len() / piece, host.len() % piece);
        let mut pieces = host.chunks(piece);
        if whole > 0 {
            let mut buffer = DeviceBuf::<u8>::new(self.device, piece)?;
            for part in pieces.by_ref().take(whole) {
                (buffer, xor) = self.piece(buffer, part, xor)?;
            }
        }
        if rest > 0 {
            let buffer = DeviceBuf::<u8>::new(self.device, rest)?;
            let part = pieces.next().expect("the shorter last piece");
            (_, xor) = self.piece(buffer, part, xor)?;
        }
        Ok(xor)
    }

    /// `part` copied into `buffer` (as long as it) and its chunks XORed into `xor`.
    fn piece(&self, mut buffer: DeviceBuf<u8>, part: &[u8], xor: u32) -> Result<(DeviceBuf<u8>, u32)> {
        buffer.copy_from_slice(part)?;
        let Some(kernel) = self.kernel else {
            // The CPU backend: the same steps, the chunks read back from the copy.
            let copied = buffer.to_vec()?;
            return Ok((buffer, xor ^ self.chunks.xor(&copied)));
        };
        let buffer = self.queue.share(buffer);
        let got = self.launch(kernel, &buffer)?;
        Ok((buffer.reclaim()?, xor ^ got))
    }

    /// The kernel over every chunk of `input`, into a poisoned word; the XOR it folded in.
    fn launch<I>(&self, (kernel, max_blocks): &(Kernel, u32), input: &I) -> Result<u32>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
    {
        let len = input.len();
        let Chunks { chunk, stride } = self.chunks;
        let mut out = DeviceBuf::<u32>::new(self.device, 1)?;
        out.copy_from_slice(&[POISON_WORD])?;
        let mut out = self.queue.lend(out);
        let items = len.div_ceil(stride) * (chunk / SPARSE_ALIGN);
        let config = LaunchConfig::linear(items, BLOCK, *max_blocks);
        let args = KernelArgs::new()
            .read(input)
            .value(len as u64)
            .value(chunk as u64)
            .value(stride as u64)
            .write(&mut out);
        // SAFETY: dataset_sparse_xor(const u8* base, u64 len, u64 chunk_bytes, u64 stride, u32*
        // out) takes these arguments in order and type. It reads bytes below `len`, the
        // input's own length, at 16-byte aligned offsets from the input's start (chunk and
        // stride are multiples of 16, checked by DatasetOptions::validate, and hetmem's host
        // and device buffers start page or 256-byte aligned), and XORs into the one word of
        // `out`.
        unsafe { self.queue.launch(kernel, config, args) }?;
        let out = out.reclaim()?;
        let mut word = [0u32];
        out.copy_to_slice(&mut word)?;
        Ok(word[0] ^ POISON_WORD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_touch_one_in_twenty_and_their_xor_sees_each_touched_word_only() {
        let chunks = Chunks { chunk: 64, stride: 64 * SPARSE_STRIDE_CHUNKS };
        assert_eq!(chunks.touched(10 * chunks.stride), 10 * 64);
        assert_eq!(chunks.touched(2 * chunks.stride + 30), 2 * 64 + 30);
        let mut bytes = vec![0u8; 3 * chunks.stride + 40];
        fastrand::fill(&mut bytes);
        let sum = chunks.xor(&bytes);
        // A byte outside every chunk changes nothing; one inside changes its word.
        bytes[chunks.stride + 100] ^= 0xFF;
        assert_eq!(chunks.xor(&bytes), sum);
        bytes[2 * chunks.stride + 5] ^= 0x10;
        assert_eq!(chunks.xor(&bytes), sum ^ (0x10 << 8));
        // The cut last vector, byte by byte.
        let at = 3 * chunks.stride + 33;
        bytes[at] ^= 0x04;
        assert_eq!(chunks.xor(&bytes), sum ^ (0x10 << 8) ^ 0x04);
    }

    #[test]
    fn pieces_are_whole_strides_within_the_budget() {
        assert_eq!(piece_bytes(10_000, 1280).unwrap(), 7 * 1280);
        assert!(piece_bytes(1000, 1280).unwrap_err().to_string().contains("at least one stride"));
    }
}
