//! The outputs of a GPU run: mapped so the CPU reads them straight after, poisoned before each
//! checked run, and compared with the CPU's results.

use hetmem::backend::Device;
use hetmem::ops::ct::{HuWindow, Organ, OrganStats, STATS_WORDS, VolumeShape};
use hetmem::{HostBuf, Lent, PinOptions, Queue};

use super::reference::Expected;
use crate::error::{BenchError, Result};

/// The outputs one run writes, mapped so the CPU reads them straight after.
pub(super) struct Outputs {
    pub(super) stats: Vec<Lent<HostBuf<u64>>>,
    pub(super) smoothed: Option<Lent<HostBuf<f32>>>,
    pub(super) mip: Lent<HostBuf<i16>>,
}

impl Outputs {
    pub(super) fn new(
        device: &Device,
        queue: &Queue,
        passes: usize,
        smoothing: bool,
        volume: VolumeShape,
    ) -> Result<Outputs> {
        let mut stats = Vec::with_capacity(passes);
        for _ in 0..passes {
            stats.push(queue.lend(HostBuf::pinned(device, STATS_WORDS, PinOptions::default())?));
        }
        let smoothed = match smoothing {
            true => Some(queue.lend(HostBuf::pinned(device, volume.voxels(), PinOptions::default())?)),
            false => None,
        };
        let mip =
            queue.lend(HostBuf::pinned(device, volume.depth() * volume.width(), PinOptions::default())?);
        Ok(Outputs { stats, smoothed, mip })
    }

    /// Poisons every output, so a pass that wrote nothing cannot pass the check.
    pub(super) fn poison(self, queue: &Queue) -> Result<Outputs> {
        let relend = |mut buf: HostBuf<u64>| {
            buf.as_mut_slice().fill(0xA5A5_A5A5_A5A5_A5A5);
            queue.lend(buf)
        };
        let stats =
            self.stats.into_iter().map(|lent| lent.reclaim().map(relend)).collect::<hetmem::Result<_>>()?;
        let smoothed = match self.smoothed {
            Some(lent) => {
                let mut buf = lent.reclaim()?;
                buf.as_mut_slice().fill(f32::NAN);
                Some(queue.lend(buf))
            }
            None => None,
        };
        let mut mip = self.mip.reclaim()?;
        mip.as_mut_slice().fill(i16::MIN);
        Ok(Outputs { stats, smoothed, mip: queue.lend(mip) })
    }

    /// Compares with the CPU's results.
    pub(super) fn check(self, queue: &Queue, expected: &Expected, windows: &[HuWindow]) -> Result<Outputs> {
        let mismatch = |what: String| BenchError::ResultMismatch { what: "bench ct", detail: what };
        let mut stats = Vec::with_capacity(self.stats.len());
        for (pass, lent) in self.stats.into_iter().enumerate() {
            let buf = lent.reclaim()?;
            let got = OrganStats::from_words(buf.as_slice())?;
            if got != expected.stats[pass] {
                let organ = Organ::ALL[pass % Organ::ALL.len()];
                let window = windows[pass / Organ::ALL.len()];
                return Err(mismatch(format!(
                    "statistics of {} in {window:?} differ from the CPU's",
                    organ.name()
                )));
            }
            stats.push(queue.lend(buf));
        }
        let smoothed = match (self.smoothed, &expected.smoothed) {
            (Some(lent), Some(want)) => {
                let buf = lent.reclaim()?;
                let bad = buf
                    .as_slice()
                    .iter()
                    .zip(want)
                    .position(|(g, w)| (g - w).abs() > 1e-5 * w.abs().max(1.0) || g.is_nan());
                if let Some(i) = bad {
                    return Err(mismatch(format!(
                        "smoothed voxel {i}: {} vs the CPU's {}",
                        buf.as_slice()[i],
                        want[i]
                    )));
                }
                Some(queue.lend(buf))
            }
            (smoothed, _) => smoothed,
        };
        let mip = self.mip.reclaim()?;
        if mip.as_slice() != &expected.mip[..] {
            return Err(mismatch("the projection differs from the CPU's".into()));
        }
        Ok(Outputs { stats, smoothed, mip: queue.lend(mip) })
    }
}
