//! Per-organ statistics through the label template: [`organ_stats`] and its CPU reference.

use rayon::prelude::*;

use super::{HuLease, LabelLease};
use crate::backend::cuda::LaunchConfig;
use crate::error::{Error, Result};
use crate::handoff::{CpuRead, KernelArgs, Lease, Lent, Queue};
use crate::kernels::{self, CT};
use crate::memory::WritableBuffer;

/// Bins of an organ's histogram.
pub const HISTOGRAM_BINS: usize = 256;
/// Words of one organ's statistics as the kernel writes them: count, sum, sum of squares (u64,
/// the sum two's complement), then the histogram.
pub const STATS_WORDS: usize = 3 + HISTOGRAM_BINS;

/// The HU range `[lo, hi]` a histogram spans: value `v` goes to bin
/// `(v - lo) * 256 / (hi - lo + 1)`; values outside are counted in the totals only.
///
/// [`HuWindow::new`] keeps `lo <= hi`, so the fields are private. The kernel would stay inside
/// its bins for any pair (it bins only values within `[lo, hi]`), but an inverted window would
/// silently count nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HuWindow {
    lo: i16,
    hi: i16,
}

impl HuWindow {
    /// The window `[lo, hi]`.
    ///
    /// # Errors
    /// `lo > hi`.
    pub fn new(lo: i16, hi: i16) -> Result<HuWindow> {
        if lo > hi {
            return Err(Error::invalid(
                "HU window",
                format!("[{lo}, {hi}]: the low end must not exceed the high end"),
            ));
        }
        Ok(HuWindow { lo, hi })
    }

    /// Lowest HU counted.
    pub fn lo(&self) -> i16 {
        self.lo
    }

    /// Highest HU counted.
    pub fn hi(&self) -> i16 {
        self.hi
    }

    /// The bin of `value`, or `None` outside the window.
    pub fn bin(&self, value: i16) -> Option<usize> {
        let (v, lo, hi) = (i64::from(value), i64::from(self.lo), i64::from(self.hi));
        (lo..=hi).contains(&v).then(|| ((v - lo) * HISTOGRAM_BINS as i64 / (hi - lo + 1)) as usize)
    }
}

/// One organ's statistics within one window.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OrganStats {
    /// Voxels of the organ.
    pub count: u64,
    /// Sum of their HU.
    pub sum: i64,
    /// Sum of the squares of their HU.
    pub sum_of_squares: u64,
    /// Voxels per bin of the window ([`HuWindow::bin`]).
    pub histogram: Vec<u64>,
}

impl OrganStats {
    /// Statistics as the kernel writes them ([`STATS_WORDS`] words).
    ///
    /// # Errors
    /// A slice of another length.
    pub fn from_words(words: &[u64]) -> Result<OrganStats> {
        if words.len() != STATS_WORDS {
            return Err(Error::invalid(
                "organ statistics",
                format!("{} words, expected {STATS_WORDS}", words.len()),
            ));
        }
        Ok(OrganStats {
            count: words[0],
            sum: words[1] as i64,
            sum_of_squares: words[2],
            histogram: words[3..].to_vec(),
        })
    }

    /// The kernel's layout of these statistics.
    pub fn to_words(&self) -> Vec<u64> {
        let mut words = vec![self.count, self.sum as u64, self.sum_of_squares];
        words.extend_from_slice(&self.histogram);
        words
    }

    /// Mean HU, or NaN for an empty organ.
    pub fn mean(&self) -> f64 {
        self.sum as f64 / self.count as f64
    }

    /// Standard deviation of HU (population), or NaN for an empty organ.
    pub fn std(&self) -> f64 {
        let mean = self.mean();
        (self.sum_of_squares as f64 / self.count as f64 - mean * mean).max(0.0).sqrt()
    }

    fn empty() -> OrganStats {
        OrganStats { count: 0, sum: 0, sum_of_squares: 0, histogram: vec![0; HISTOGRAM_BINS] }
    }

    fn add(&mut self, value: i16, window: HuWindow) {
        let v = i64::from(value);
        self.count += 1;
        self.sum += v;
        self.sum_of_squares += (v * v) as u64;
        if let Some(bin) = window.bin(value) {
            self.histogram[bin] += 1;
        }
    }

    fn merge(mut self, other: OrganStats) -> OrganStats {
        self.count += other.count;
        self.sum += other.sum;
        self.sum_of_squares += other.sum_of_squares;
        for (bin, more) in self.histogram.iter_mut().zip(other.histogram) {
            *bin += more;
        }
        self
    }
}

/// The CPU path: statistics of the voxels labelled `organ`, in parallel.
///
/// # Errors
/// Slices of different lengths.
pub fn organ_stats_cpu(hu: &[i16], labels: &[u8], organ: u8, window: HuWindow) -> Result<OrganStats> {
    if hu.len() != labels.len() {
        return Err(Error::invalid(
            "organ statistics",
            format!("{} HU values, {} labels", hu.len(), labels.len()),
        ));
    }
    const CHUNK: usize = 1 << 16;
    Ok(hu
        .par_chunks(CHUNK)
        .zip(labels.par_chunks(CHUNK))
        .map(|(hu, labels)| {
            let mut stats = OrganStats::empty();
            for (&value, _) in hu.iter().zip(labels).filter(|(_, label)| **label == organ) {
                stats.add(value, window);
            }
            stats
        })
        .reduce(OrganStats::empty, OrganStats::merge))
}

/// Queues the statistics of the voxels labelled `organ` into `out` ([`STATS_WORDS`] words;
/// read them with [`OrganStats::from_words`]): the `organ_window_stats` kernel on the GPU,
/// reading `labels` whole and `hu` only where the organ is; the CPU path on the CPU backend.
///
/// `hu` and `labels` may be device memory or mapped host memory.
///
/// # Errors
/// Buffers of different lengths, an output of another length, leases of another queue, a
/// buffer the device cannot address, or a kernel that fails to compile or launch.
pub fn organ_stats<H: HuLease, L: LabelLease, O>(
    queue: &Queue,
    hu: &H,
    labels: &L,
    organ: u8,
    window: HuWindow,
    out: &mut Lent<O>,
) -> Result<()>
where
    O: WritableBuffer<Elem = u64>,
{
    let len = hu.len();
    if labels.len() != len || out.len() != STATS_WORDS {
        return Err(Error::invalid(
            "organ statistics",
            format!(
                "{len} HU values, {} labels, an output of {} words (expected {STATS_WORDS})",
                labels.len(),
                out.len()
            ),
        ));
    }
    let Some(device) = queue.cuda_device() else {
        let stats =
            hu.cpu_read(|hu| labels.cpu_read(|labels| organ_stats_cpu(hu, labels, organ, window)))???;
        return out.cpu_write(|words| words.copy_from_slice(&stats.to_words()));
    };
    // A chunk of a buffer may start anywhere; the kernel's 16-byte loads may not.
    for (what, address) in [("HU volume", hu.region().device), ("label template", labels.region().device)] {
        if let Some(address) = address.filter(|address| address % 16 != 0) {
            return Err(Error::invalid(
                "organ statistics",
                format!(
                    "the {what} starts at device address {address:#x}, not a multiple of 16 bytes as the \
                     kernel's wide loads need: give a whole buffer, or a chunk starting at a multiple of 16 bytes"
                ),
            ));
        }
    }
    let zero = kernels::kernel(device, &CT, "zero_u64")?;
    let stats = kernels::kernel(device, &CT, "organ_window_stats")?;
    let blocks = device.attributes().multiprocessor_count * 8;
    let args = KernelArgs::new().write(out).value(STATS_WORDS as u64);
    // SAFETY: zero_u64(u64* out, u64 n): the arguments match in order and type; it writes
    // out[0..n), and out holds STATS_WORDS words.
    unsafe { queue.launch(&zero, LaunchConfig::linear(STATS_WORDS, 256, 1), args)? };
    let args = KernelArgs::new()
        .read(hu)
        .read(labels)
        .value(len as u64)
        .value(u32::from(organ))
        .value(i32::from(window.lo))
        .value(i32::from(window.hi))
        .write(out);
    // SAFETY: organ_window_stats(const i16* hu, const u8* labels, u64 n, u32 organ, i32 lo,
    // i32 hi, u64* out): the arguments match in order and type. It reads hu[0..n) and
    // labels[0..n), both n long and 16-byte aligned (checked above), writes out[0..STATS_WORDS),
    // and lo <= hi (HuWindow) keeps its bins in range.
    unsafe { queue.launch(&stats, LaunchConfig::linear(len.div_ceil(16), 256, blocks), args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_split_the_window_evenly_and_skip_values_outside() {
        let window = HuWindow::new(-128, 127).unwrap();
        assert_eq!(window.bin(-128), Some(0));
        assert_eq!(window.bin(127), Some(255));
        assert_eq!(window.bin(0), Some(128));
        assert_eq!(window.bin(128), None);
        let wide = HuWindow::new(i16::MIN, i16::MAX).unwrap();
        assert_eq!(wide.bin(i16::MIN), Some(0));
        assert_eq!(wide.bin(i16::MAX), Some(255));
        assert!(HuWindow::new(5, 4).unwrap_err().to_string().contains("[5, 4]"));
    }

    #[test]
    fn the_parallel_reference_equals_a_plain_loop() {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = rng.usize(1..300_000);
        let hu: Vec<i16> = (0..n).map(|_| rng.i16(..)).collect();
        let labels: Vec<u8> = (0..n).map(|_| rng.u8(0..5)).collect();
        let (a, b) = (rng.i16(..), rng.i16(..));
        let window = HuWindow::new(a.min(b), a.max(b)).unwrap();
        let organ = rng.u8(0..5);
        let mut expected = OrganStats::empty();
        for i in (0..n).filter(|&i| labels[i] == organ) {
            expected.add(hu[i], window);
        }
        let got = organ_stats_cpu(&hu, &labels, organ, window).unwrap();
        assert_eq!(got, expected);
        assert_eq!(OrganStats::from_words(&got.to_words()).unwrap(), got);
        let mean =
            hu.iter().zip(&labels).filter(|(_, l)| **l == organ).map(|(v, _)| f64::from(*v)).sum::<f64>()
                / got.count as f64;
        assert!((got.mean() - mean).abs() <= 1e-9 * mean.abs().max(1.0));
    }
}
