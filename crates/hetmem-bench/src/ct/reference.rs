//! The CPU's run of the computation: the reference every GPU row is checked against.

use hetmem::ops::ct::{
    HuWindow, LabelledVolume, Organ, OrganStats, masked_gaussian_cpu, mip_height_cpu, organ_stats_cpu,
};

use super::{OrganRow, SMOOTHED_ORGAN};

/// The CPU's results, the reference every row is checked against.
pub(super) struct Expected {
    pub(super) stats: Vec<OrganStats>,
    pub(super) smoothed: Option<Vec<f32>>,
    pub(super) mip: Vec<i16>,
}

/// Every pass, the smoothing (with `smoothing`) and the projection, on the CPU.
pub(super) fn cpu_run(
    phantom: &LabelledVolume,
    windows: &[HuWindow],
    smoothing: bool,
    weights: &[f32],
) -> hetmem::Result<Expected> {
    let mut stats = Vec::with_capacity(windows.len() * Organ::ALL.len());
    for &window in windows {
        for organ in Organ::ALL {
            stats.push(organ_stats_cpu(phantom.hu(), phantom.labels(), organ.label(), window)?);
        }
    }
    let smoothed = if smoothing {
        Some(masked_gaussian_cpu(
            phantom.shape(),
            phantom.hu(),
            phantom.labels(),
            SMOOTHED_ORGAN.label(),
            weights,
        )?)
    } else {
        None
    };
    Ok(Expected { stats, smoothed, mip: mip_height_cpu(phantom.shape(), phantom.hu())? })
}

impl Expected {
    /// Each organ's statistics in the widest window (the last of the sweep).
    pub(super) fn organ_rows(&self, windows: usize) -> Vec<OrganRow> {
        let widest = windows - 1;
        Organ::ALL
            .iter()
            .enumerate()
            .map(|(i, &organ)| {
                let stats = &self.stats[widest * Organ::ALL.len() + i];
                OrganRow { organ, count: stats.count, mean: stats.mean(), std: stats.std() }
            })
            .collect()
    }
}
