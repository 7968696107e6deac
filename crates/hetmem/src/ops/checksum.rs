//! A checksum of bytes as they stream past: two sums over 32-bit little-endian words, the plain
//! sum and the sum of each word times its position plus one (both mod 2^64). Order-free, so
//! chunks of a file may be summed in any order and added; position-weighted, so a chunk that
//! lands at the wrong offset changes the result. The stage of `hetmem load --stage checksum`.

use crate::backend::cuda::LaunchConfig;
use crate::error::{Error, Result};
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue};
use crate::kernels::{self, CHECKSUM};
use crate::memory::{Buffer, Sealed, WritableBuffer};

/// The two sums of [`checksum_cpu`] and the `checksum_words` kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Checksum {
    /// The sum of the words (mod 2^64).
    pub sum: u64,
    /// The sum of each word times its word position in the file plus one (mod 2^64).
    pub weighted: u64,
}

impl Checksum {
    /// The checksum of two disjoint parts of one file together.
    pub fn combine(self, other: Checksum) -> Checksum {
        Checksum {
            sum: self.sum.wrapping_add(other.sum),
            weighted: self.weighted.wrapping_add(other.weighted),
        }
    }
}

/// The checksum of `bytes`, which start `file_offset` bytes into their file (a multiple of 4);
/// a last partial word is zero-padded.
///
/// # Panics
/// When `file_offset` is not a multiple of 4.
pub fn checksum_cpu(bytes: &[u8], file_offset: u64) -> Checksum {
    assert!(file_offset.is_multiple_of(4), "checksum_cpu: offset {file_offset} is not a whole word");
    let first_word = file_offset / 4;
    let mut out = Checksum::default();
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        let word = u64::from(u32::from_le_bytes(word));
        out.sum = out.sum.wrapping_add(word);
        out.weighted = out.weighted.wrapping_add(word.wrapping_mul(first_word + i as u64 + 1));
    }
    out
}

/// Queues the checksum of `len` bytes of `input` from byte `offset` (a multiple of 4; the bytes
/// start `file_offset` bytes into their file, also a multiple of 4), added into the pair of
/// words `sums[2 * pair]`, `sums[2 * pair + 1]`: the `checksum_words` kernel on the GPU, reading
/// `input` where it lies (device memory, or mapped host memory: zero-copy), the CPU path on the
/// CPU backend (which runs before this returns).
///
/// # Errors
/// A range past the end of `input`, unaligned offsets, a pair past the end of `sums`, leases of
/// another queue, a buffer the device cannot address, or a kernel that fails to compile or
/// launch.
pub fn checksum<I, O>(
    queue: &Queue,
    input: &I,
    offset: usize,
    len: usize,
    file_offset: u64,
    sums: &mut Lent<O>,
    pair: usize,
) -> Result<()>
where
    I: Lease,
    I::Buf: Buffer<Elem = u8>,
    O: WritableBuffer<Elem = u64>,
{
    if offset.checked_add(len).is_none_or(|end| end > input.len()) {
        return Err(Error::invalid(
            "checksum",
            format!("{len} bytes from byte {offset} pass the end of a {}-byte buffer", input.len()),
        ));
    }
    if !offset.is_multiple_of(4) || !file_offset.is_multiple_of(4) {
        return Err(Error::invalid(
            "checksum",
            format!("offsets {offset} (buffer) and {file_offset} (file) must be whole 32-bit words"),
        ));
    }
    // Checked whole: `2 * pair + 2` wrapping to 0 would pass a pair far past the end.
    if pair.checked_mul(2).and_then(|first| first.checked_add(2)).is_none_or(|end| end > sums.len()) {
        return Err(Error::invalid(
            "checksum",
            format!("pair {pair} of sums, which hold {} pairs", sums.len() / 2),
        ));
    }
    let Some(device) = queue.cuda_device() else {
        crate::faults::fail::<crate::Error>(crate::faults::FaultPoint::Launch)?;
        let part = input.cpu_read(|bytes| checksum_cpu(&bytes[offset..offset + len], file_offset))?;
        return sums.cpu_write(|words| {
            let total = Checksum { sum: words[2 * pair], weighted: words[2 * pair + 1] }.combine(part);
            words[2 * pair] = total.sum;
            words[2 * pair + 1] = total.weighted;
        });
    };
    // The kernel reads 32-bit words from the input's address plus `offset` (a multiple of 4)
    // and adds into 64-bit sums; a chunk of a buffer may start anywhere.
    let aligned = [("input", input.region().device, 4), ("sums", sums.region().device, 8)];
    if let Some((what, Some(address), align)) =
        aligned.into_iter().find(|(_, address, align)| address.is_some_and(|a| a % align != 0))
    {
        return Err(Error::invalid(
            "checksum",
            format!(
                "the {what} starts at device address {address:#x}, not a multiple of {align} bytes as the \
                 kernel's words need: give a whole buffer, or a chunk starting at a multiple of {align} bytes"
            ),
        ));
    }
    let kernel = kernels::kernel(device, &CHECKSUM, "checksum_words")?;
    let blocks = device.attributes().multiprocessor_count * 8;
    let args = KernelArgs::new()
        .read(input)
        .value(offset as u64)
        .value(len as u64)
        .value(file_offset / 4)
        .write(sums)
        .value(pair as u64);
    // SAFETY: checksum_words(const u8* base, u64 byte_offset, u64 n_bytes, u64 first_word,
    // u64* sums, u64 pair): the arguments match in order and type; the kernel reads
    // base[offset..offset + len), checked to lie inside `input`, and writes sums[2 * pair] and
    // sums[2 * pair + 1], checked to lie inside `sums`.
    unsafe { queue.launch(&kernel, LaunchConfig::linear(len.div_ceil(4).max(1), 256, blocks), args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_a_file_add_up_to_its_checksum_and_moved_words_change_it() {
        let seed = fastrand::u64(..);
        let mut rng = fastrand::Rng::with_seed(seed);
        let bytes: Vec<u8> = (0..10_001).map(|_| rng.u8(..)).collect();
        let whole = checksum_cpu(&bytes, 0);
        let split = checksum_cpu(&bytes[..4096], 0).combine(checksum_cpu(&bytes[4096..], 4096));
        assert_eq!(whole, split, "seed {seed}");
        let moved = checksum_cpu(&bytes[4096..], 0).combine(checksum_cpu(&bytes[..4096], 10_001 - 4096 + 3));
        assert_ne!(whole.weighted, moved.weighted, "seed {seed}");
        let mut padded = bytes.clone();
        padded.extend([0, 0, 0]);
        assert_eq!(checksum_cpu(&padded, 0), whole, "a partial last word is zero-padded (seed {seed})");
    }
}
