//! `hetmem bench ct`: the CT computation (per-organ statistics over a sweep of HU
//! windows, a masked Gaussian of one organ, a maximum-intensity projection) with its buffers
//! placed five ways, seconds per study each:
//! - `all_copy`: each pass copies what it reads into device memory first, as a program without
//!   persistent device buffers does;
//! - `all_mapped`: the kernels read the volume and the template from mapped host memory;
//! - `hybrid`: the template copied once into device memory (hot), the volume mapped (cold);
//! - `placed`: where [`hetmem::placement`] puts each buffer, within the device budget;
//! - `cpu`: the CPU reference.
//!
//! Every GPU row is checked against the CPU's results: the statistics bit for bit, the
//! smoothed organ within 1e-5 relative, the projection exactly. A row whose device buffers do
//! not fit in the budget is not run, and says so.
//!
//! With several studies stacked (`studies > 1`) the volume is one of `studies * depth` slices
//! and only the statistics and the projection run: the smoothing's four f32 scratch volumes
//! are device memory outside the budget.

use std::time::Instant;

use hetmem::backend::Device;
use hetmem::error::Error;
use hetmem::ops::ct::{
    self, HuLease, HuWindow, LabelLease, LabelledVolume, Organ, OrganStats, STATS_WORDS, VolumeShape,
    gaussian_weights, masked_gaussian_cpu, mip_height_cpu, organ_stats_cpu, window_to_gray,
};
use hetmem::placement::{AccessPattern, BufferUse, LinkProfile, Placement, Placer, ProfileSource, Where};
use hetmem::{DeviceBuf, HostBuf, Lent, PinOptions, Queue};

use crate::Summary;
use crate::error::{BenchError, Result};
use crate::link;

/// The organ smoothed.
pub const SMOOTHED_ORGAN: Organ = Organ::Liver;
/// The smoothing's standard deviation, in voxels.
pub const SIGMA: f32 = 1.5;
/// What to run.
#[derive(Debug, Clone)]
pub struct CtOptions {
    /// One study's volume.
    pub shape: VolumeShape,
    /// Studies stacked into one volume.
    pub studies: usize,
    /// HU windows swept; each is a pass per organ.
    pub windows: usize,
    /// Timed runs per row (the first run is also the check).
    pub repeats: usize,
    /// Device memory the placements may take (`all_copy`, `hybrid` and `placed` are held to it).
    pub device_budget: u64,
    /// Seed of the phantom.
    pub seed: u64,
    /// The link profile `placed` decides from; `None`: the one `hetmem bench link` saved for
    /// this GPU, else measured in this run (and saved); the built-in one without a GPU.
    pub profile: Option<LinkProfile>,
    /// A volume read from files, instead of the phantom (its shape replaces `shape`; labels 0 to
    /// 6 are read as [`Organ`]s).
    pub scan: Option<Scan>,
}

/// A volume and template read from files, for [`CtOptions::scan`].
#[derive(Debug, Clone)]
pub struct Scan {
    /// What it is, for the report (the file names).
    pub description: String,
    /// The volume and its template.
    pub volume: LabelledVolume,
}

impl CtOptions {
    /// The seed's case: one 512x512x300 study, 8 windows, 3 runs.
    pub fn full() -> CtOptions {
        CtOptions {
            shape: VolumeShape::new(300, 512, 512).expect("the seed's study is a valid shape"),
            studies: 1,
            windows: 8,
            repeats: 3,
            device_budget: 8 << 30,
            seed: 14,
            profile: None,
            scan: None,
        }
    }

    /// A small study (40x128x128), for a quick look and for machines without a GPU.
    pub fn quick() -> CtOptions {
        CtOptions {
            shape: VolumeShape::new(40, 128, 128).expect("a valid shape"),
            repeats: 2,
            ..CtOptions::full()
        }
    }

    /// The stacked volume.
    ///
    /// # Errors
    /// No studies, or a stack too large to address.
    pub fn volume(&self) -> hetmem::Result<VolumeShape> {
        let study = self.study();
        let depth = study.depth().checked_mul(self.studies).filter(|_| self.studies > 0);
        let depth =
            depth.ok_or_else(|| Error::invalid("studies", format!("{}: give 1 or more", self.studies)))?;
        VolumeShape::new(depth, study.height(), study.width())
    }

    /// One study's shape: the scan's, or the phantom's.
    pub fn study(&self) -> VolumeShape {
        self.scan.as_ref().map_or(self.shape, |scan| scan.volume.shape())
    }
}

/// The HU windows swept: `count` windows 400 HU wide, centres spread from -900 to 1100.
pub fn window_sweep(count: usize) -> Vec<HuWindow> {
    (0..count)
        .map(|i| {
            let centre = if count == 1 { 40 } else { -900 + (2000 * i / (count - 1)) as i32 };
            HuWindow::new((centre - 200) as i16, (centre + 199) as i16).expect("400 HU wide, low end first")
        })
        .collect()
}

/// How a row places the volume and the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placing {
    /// Copied into device memory before every pass.
    AllCopy,
    /// Both mapped.
    AllMapped,
    /// Template in device memory, volume mapped.
    Hybrid,
    /// As [`hetmem::placement`] decides.
    Placed,
    /// The CPU reference.
    Cpu,
}

/// One row of the table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// How the buffers were placed.
    pub placing: Placing,
    /// Where the volume and the template were (`device`, `mapped`, `copied per pass`, `host`).
    pub volume: String,
    /// Where the template was.
    pub template: String,
    /// Seconds per study, over the timed runs; `None` when not run.
    pub seconds_per_study: Option<Summary>,
    /// Median seconds of `all_copy` over this row's.
    pub speedup_over_all_copy: Option<f64>,
    /// Why the row did not run.
    pub not_run_because: Option<String>,
    /// How its results were checked.
    pub checked: String,
}

/// One organ's statistics in the widest window, for the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OrganRow {
    /// The organ.
    pub organ: Organ,
    /// Voxels.
    pub count: u64,
    /// Mean HU.
    pub mean: f64,
    /// Standard deviation of HU.
    pub std: f64,
}

/// The results of `hetmem bench ct`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CtReport {
    /// The device.
    pub device: String,
    /// What the volume is.
    pub volume_kind: String,
    /// One study.
    pub study: VolumeShape,
    /// Studies stacked.
    pub studies: usize,
    /// Windows swept.
    pub windows: Vec<HuWindow>,
    /// Statistics passes per run (windows x organs).
    pub passes: usize,
    /// Whether the smoothing ran (one study only).
    pub smoothing: bool,
    /// The device budget.
    pub device_budget: u64,
    /// The profile `placed` decided from, and where it came from.
    pub profile: LinkProfile,
    /// Where the profile came from.
    pub profile_source: String,
    /// What placement decided, and why.
    pub placement: Placement,
    /// The rows.
    pub rows: Vec<Row>,
    /// Per-organ statistics of the first study's widest window (from the CPU).
    pub organs: Vec<OrganRow>,
}

/// The report and the projection as grey levels (`depth` rows of `width`, HU -200..1200).
#[derive(Debug, Clone)]
pub struct CtRun {
    /// The report.
    pub report: CtReport,
    /// The maximum-intensity projection of the whole stack, grey levels.
    pub mip: Vec<u8>,
    /// Its width.
    pub mip_width: usize,
    /// Its height.
    pub mip_height: usize,
    /// The volume and template measured, for a peer to read the same bytes.
    pub phantom: LabelledVolume,
    /// The CPU's statistics, pass by pass (window-major, organs in label order).
    pub stats: Vec<OrganStats>,
}

/// The volume and template measured: the scan repeated, or each study a phantom of its own seed.
pub fn volume_stack(options: &CtOptions) -> hetmem::Result<LabelledVolume> {
    let volume = options.volume()?;
    let mut hu = Vec::with_capacity(volume.voxels());
    let mut labels = Vec::with_capacity(volume.voxels());
    for study in 0..options.studies {
        let generated;
        let one = match &options.scan {
            Some(scan) => &scan.volume,
            None => {
                generated = LabelledVolume::phantom(options.shape, options.seed.wrapping_add(study as u64));
                &generated
            }
        };
        hu.extend_from_slice(one.hu());
        labels.extend_from_slice(one.labels());
    }
    LabelledVolume::new(volume, hu, labels)
}

/// The buffers as placement sees them: the template read whole by every pass, the volume read
/// where the pass's organ is (on average a 1/organs share) by every pass.
pub fn declared_buffers(volume: VolumeShape, windows: usize) -> [BufferUse; 2] {
    let voxels = volume.voxels() as u64;
    let passes = (windows * Organ::ALL.len()) as u32;
    [
        BufferUse::new("template", voxels, voxels, passes, AccessPattern::Reused),
        BufferUse::new(
            "volume",
            voxels * 2,
            voxels * 2 / Organ::ALL.len() as u64,
            passes,
            AccessPattern::Sequential,
        ),
    ]
}

/// The CPU's results, the reference every row is checked against.
struct Expected {
    stats: Vec<OrganStats>,
    smoothed: Option<Vec<f32>>,
    mip: Vec<i16>,
}

fn cpu_run(
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

fn mapped<T: hetmem::Element>(device: &Device, data: &[T]) -> Result<HostBuf<T>> {
    let mut buf = HostBuf::pinned(device, data.len(), PinOptions::default())?;
    buf.as_mut_slice().copy_from_slice(data);
    Ok(buf)
}

/// The outputs one run writes, mapped so the CPU reads them straight after.
struct Outputs {
    stats: Vec<Lent<HostBuf<u64>>>,
    smoothed: Option<Lent<HostBuf<f32>>>,
    mip: Lent<HostBuf<i16>>,
}

impl Outputs {
    fn new(
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
    fn poison(self, queue: &Queue) -> Result<Outputs> {
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
    fn check(self, queue: &Queue, expected: &Expected, windows: &[HuWindow]) -> Result<Outputs> {
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

/// One GPU run of the computation: every pass, the smoothing, the projection.
fn gpu_run<H: HuLease, L: LabelLease>(
    queue: &Queue,
    volume: VolumeShape,
    hu: &H,
    labels: &L,
    weights: &hetmem::Shared<DeviceBuf<f32>>,
    windows: &[HuWindow],
    outputs: &mut Outputs,
) -> hetmem::Result<()> {
    let mut pass = 0;
    for &window in windows {
        for organ in Organ::ALL {
            ct::organ_stats(queue, hu, labels, organ.label(), window, &mut outputs.stats[pass])?;
            pass += 1;
        }
    }
    if let Some(out) = &mut outputs.smoothed {
        ct::masked_gaussian(queue, volume, hu, labels, SMOOTHED_ORGAN.label(), weights, out)?;
    }
    ct::mip_height(queue, volume, hu, &mut outputs.mip)?;
    queue.synchronize()
}

fn not_run(placing: Placing, volume: &str, template: &str, why: String) -> Row {
    Row {
        placing,
        volume: volume.into(),
        template: template.into(),
        seconds_per_study: None,
        speedup_over_all_copy: None,
        not_run_because: Some(why),
        checked: String::new(),
    }
}

/// Runs the computation every way the machine can.
///
/// # Errors
/// Options out of range, memory that cannot be allocated, a GPU failure, or a row whose
/// results differ from the CPU's ([`BenchError::ResultMismatch`]).
pub fn measure(device: &Device, options: &CtOptions) -> Result<CtRun> {
    if options.windows == 0 || options.repeats == 0 {
        return Err(Error::invalid("bench ct", "give at least one window and one repeat").into());
    }
    let volume = options.volume()?;
    let phantom = volume_stack(options)?;
    let windows = window_sweep(options.windows);
    let smoothing = options.studies == 1;
    let weights = gaussian_weights(SIGMA)?;
    let passes = windows.len() * Organ::ALL.len();
    let studies = options.studies as f64;
    let time = |mut run: Box<dyn FnMut() -> hetmem::Result<()> + '_>| -> Result<Summary> {
        let mut seconds = Vec::with_capacity(options.repeats);
        for _ in 0..options.repeats {
            let start = Instant::now();
            run()?;
            seconds.push(start.elapsed().as_secs_f64() / studies);
        }
        Summary::of(&seconds).ok_or_else(|| Error::invalid("bench ct", "no timed runs").into())
    };

    let mut expected = None;
    let cpu_seconds = time(Box::new(|| {
        expected = Some(cpu_run(&phantom, &windows, smoothing, &weights)?);
        Ok(())
    }))?;
    let expected = expected.ok_or_else(|| Error::invalid("bench ct", "the CPU run produced nothing"))?;
    let widest = windows.len() - 1;
    let organs = Organ::ALL
        .iter()
        .enumerate()
        .map(|(i, &organ)| {
            let stats = &expected.stats[widest * Organ::ALL.len() + i];
            OrganRow { organ, count: stats.count, mean: stats.mean(), std: stats.std() }
        })
        .collect();
    let cpu_row = Row {
        placing: Placing::Cpu,
        volume: "host".into(),
        template: "host".into(),
        seconds_per_study: Some(cpu_seconds),
        speedup_over_all_copy: None,
        not_run_because: None,
        checked: "the reference".into(),
    };

    let (profile, profile_source) = match (options.profile, device.as_cuda()) {
        (Some(profile), _) => (profile, ProfileSource::Given.to_string()),
        (None, Some(gpu)) => link::cached_or_measured(device, gpu)?,
        (None, None) => {
            (LinkProfile::built_in(), ProfileSource::BuiltIn { why: "no GPU".into() }.to_string())
        }
    };
    let placement = declared_buffers(volume, windows.len())
        .into_iter()
        .fold(Placer::new(profile, options.device_budget), Placer::buffer)
        .place()?;

    let mip = window_to_gray(&expected.mip, HuWindow::new(-200, 1200)?);
    let mut rows = Vec::new();
    // On the CPU backend the placements' rows run too, each operation's CPU path on that
    // placement's buffers (plain memory standing in for device memory): the budget's refusals
    // and the results are the GPU run's, the seconds are not.
    let checked = match device.as_cuda() {
        Some(_) => "statistics bit for bit, smoothing within 1e-5, projection exactly, against the CPU",
        None => {
            "CPU backend (the CPU path on this placement's buffers; not GPU seconds): results as the reference"
        }
    };
    let queue = Queue::new(device)?;
    let weights_buf = {
        let mut buf = DeviceBuf::new(device, weights.len())?;
        buf.copy_from_slice(&weights)?;
        queue.share(buf)
    };
    let mut outputs = Some(Outputs::new(device, &queue, passes, smoothing, volume)?);
    let hu_host = queue.share(mapped(device, phantom.hu())?);
    let labels_host = queue.share(mapped(device, phantom.labels())?);
    let budget = hetmem::DeviceBudget::new(options.device_budget);
    let fits = |bytes: u64| {
        (bytes <= options.device_budget).then_some(()).ok_or_else(|| {
            format!(
                "does not fit: needs {bytes} bytes of device memory, more than the {} byte budget \
                 (--device-budget); the placements that leave the volume mapped can run",
                options.device_budget
            )
        })
    };
    let volume_bytes = volume.voxels() as u64 * 2;
    let template_bytes = volume.voxels() as u64;

    let mut run_row = |placing: Placing,
                       volume_at: &str,
                       template_at: &str,
                       needs: u64,
                       body: &mut dyn FnMut(&mut Outputs) -> hetmem::Result<()>|
     -> Result<Row> {
        if let Err(why) = fits(needs) {
            return Ok(not_run(placing, volume_at, template_at, why));
        }
        let taken = outputs.take().ok_or_else(|| Error::invalid("bench ct", "outputs lost"))?;
        let mut out = taken.poison(&queue)?;
        body(&mut out)?;
        let mut out = out.check(&queue, &expected, &windows)?;
        let seconds = time(Box::new(|| body(&mut out)))?;
        outputs = Some(out);
        Ok(Row {
            placing,
            volume: volume_at.into(),
            template: template_at.into(),
            seconds_per_study: Some(seconds),
            speedup_over_all_copy: None,
            not_run_because: None,
            checked: checked.into(),
        })
    };

    // All copy: device buffers of both, refilled from pinned memory before every pass.
    let row = run_row(
        Placing::AllCopy,
        "copied per pass",
        "copied per pass",
        volume_bytes + template_bytes,
        &mut |out| {
            let mut hu_dev = queue.lend(DeviceBuf::<i16>::with_budget(device, volume.voxels(), &budget)?);
            let mut labels_dev = queue.lend(DeviceBuf::<u8>::with_budget(device, volume.voxels(), &budget)?);
            let refill = |hu_dev: &mut Lent<DeviceBuf<i16>>, labels_dev: &mut Lent<DeviceBuf<u8>>| {
                queue.copy(&hu_host, hu_dev)?;
                queue.copy(&labels_host, labels_dev)
            };
            for pass in 0..passes {
                refill(&mut hu_dev, &mut labels_dev)?;
                let (window, organ) = (windows[pass / Organ::ALL.len()], Organ::ALL[pass % Organ::ALL.len()]);
                ct::organ_stats(&queue, &hu_dev, &labels_dev, organ.label(), window, &mut out.stats[pass])?;
            }
            if let Some(smoothed) = &mut out.smoothed {
                refill(&mut hu_dev, &mut labels_dev)?;
                let organ = SMOOTHED_ORGAN.label();
                ct::masked_gaussian(&queue, volume, &hu_dev, &labels_dev, organ, &weights_buf, smoothed)?;
            }
            // The projection reads the volume only.
            queue.copy(&hu_host, &mut hu_dev)?;
            ct::mip_height(&queue, volume, &hu_dev, &mut out.mip)?;
            queue.synchronize()
        },
    )?;
    rows.push(row);

    let row = run_row(Placing::AllMapped, "mapped", "mapped", 0, &mut |out| {
        gpu_run(&queue, volume, &hu_host, &labels_host, &weights_buf, &windows, out)
    })?;
    rows.push(row);

    // The template's one copy into device memory is part of each timed run.
    let row = run_row(Placing::Hybrid, "mapped", "device", template_bytes, &mut |out| {
        let mut labels_dev = queue.lend(DeviceBuf::<u8>::with_budget(device, volume.voxels(), &budget)?);
        queue.copy(&labels_host, &mut labels_dev)?;
        gpu_run(&queue, volume, &hu_host, &labels_dev, &weights_buf, &windows, out)
    })?;
    rows.push(row);

    let volume_place = placement.place_of("volume").unwrap_or(Where::Mapped);
    let template_place = placement.place_of("template").unwrap_or(Where::Mapped);
    let row = run_row(
        Placing::Placed,
        &volume_place.to_string(),
        &template_place.to_string(),
        placement.device_bytes,
        &mut |out| {
            let held_hu = match volume_place {
                Where::Device => {
                    let mut dev =
                        queue.lend(DeviceBuf::<i16>::with_budget(device, volume.voxels(), &budget)?);
                    queue.copy(&hu_host, &mut dev)?;
                    Some(dev)
                }
                Where::Mapped => None,
            };
            let held_labels = match template_place {
                Where::Device => {
                    let mut dev = queue.lend(DeviceBuf::<u8>::with_budget(device, volume.voxels(), &budget)?);
                    queue.copy(&labels_host, &mut dev)?;
                    Some(dev)
                }
                Where::Mapped => None,
            };
            match (&held_hu, &held_labels) {
                (Some(hu), Some(labels)) => gpu_run(&queue, volume, hu, labels, &weights_buf, &windows, out),
                (Some(hu), None) => gpu_run(&queue, volume, hu, &labels_host, &weights_buf, &windows, out),
                (None, Some(labels)) => {
                    gpu_run(&queue, volume, &hu_host, labels, &weights_buf, &windows, out)
                }
                (None, None) => gpu_run(&queue, volume, &hu_host, &labels_host, &weights_buf, &windows, out),
            }
        },
    )?;
    rows.push(row);
    rows.push(cpu_row);
    let all_copy = rows
        .iter()
        .find(|row| row.placing == Placing::AllCopy)
        .and_then(|row| row.seconds_per_study.as_ref().map(|s| s.median));
    for row in &mut rows {
        row.speedup_over_all_copy =
            all_copy.zip(row.seconds_per_study.as_ref()).map(|(copy, seconds)| copy / seconds.median);
    }
    let report = CtReport {
        device: device.name(),
        volume_kind: options
            .scan
            .as_ref()
            .map_or("generated anatomical phantom (not a scan)".into(), |scan| scan.description.clone()),
        study: options.study(),
        studies: options.studies,
        windows,
        passes,
        smoothing,
        device_budget: options.device_budget,
        profile,
        profile_source,
        placement,
        rows,
        organs,
    };
    Ok(CtRun {
        report,
        mip,
        mip_width: volume.width(),
        mip_height: volume.depth(),
        phantom,
        stats: expected.stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::{BackendChoice, BackendKind};

    #[test]
    fn the_sweep_spans_the_hu_range_in_windows_400_wide() {
        let count = fastrand::usize(2..40);
        let windows = window_sweep(count);
        assert_eq!(windows.len(), count);
        assert_eq!((windows[0].lo(), windows[count - 1].hi()), (-1100, 1299));
        assert!(windows.iter().all(|w| i32::from(w.hi()) - i32::from(w.lo()) == 399));
    }

    #[test]
    fn a_budget_for_the_template_only_places_the_template_and_leaves_the_volume_mapped() {
        let volume = VolumeShape::new(fastrand::usize(10..300), 512, 512).unwrap();
        let profile = LinkProfile::new(3000.0, 51.3, 2.4, 55.4).unwrap();
        let budget = volume.voxels() as u64 * 2;
        let placement = declared_buffers(volume, fastrand::usize(2..16))
            .into_iter()
            .fold(Placer::new(profile, budget), Placer::buffer)
            .place()
            .unwrap();
        assert_eq!(placement.place_of("template"), Some(Where::Device), "{placement}");
        assert_eq!(placement.place_of("volume"), Some(Where::Mapped), "{placement}");
    }

    #[test]
    fn on_the_cpu_backend_every_placement_runs_and_matches_the_reference() {
        let cpu = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let options = CtOptions {
            shape: VolumeShape::new(6, 20, 24).unwrap(),
            windows: 2,
            repeats: 1,
            seed: fastrand::u64(..),
            ..CtOptions::quick()
        };
        let run = measure(&cpu, &options).unwrap();
        let report = &run.report;
        assert_eq!(report.passes, 2 * Organ::ALL.len());
        assert_eq!(run.stats.len(), report.passes);
        assert_eq!(report.rows.len(), 5);
        for row in &report.rows {
            assert!(row.seconds_per_study.as_ref().is_some_and(|s| s.median > 0.0), "{row:?}");
            assert!(row.not_run_because.is_none(), "{row:?}");
            if row.placing != Placing::Cpu {
                assert!(row.checked.contains("CPU backend"), "{row:?}");
            }
        }
        assert!(report.profile_source.contains("built-in"), "{}", report.profile_source);
        assert_eq!(run.mip.len(), run.mip_width * run.mip_height);
        assert_eq!(run.mip_width * run.mip_height, 6 * 24);
        let counted: u64 = report.organs.iter().map(|organ| organ.count).sum();
        assert_eq!(counted, options.shape.voxels() as u64);
    }

    /// The stacked run larger than the budget, small: copying everything does not
    /// fit and says so; mapped, hybrid (while the template fits) and placed run, and match the
    /// CPU.
    #[test]
    fn a_stack_larger_than_the_budget_refuses_all_copy_and_runs_mapped_and_hybrid() {
        let cpu = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let options = CtOptions {
            shape: VolumeShape::new(rng.usize(3..6), rng.usize(8..20), rng.usize(8..24)).unwrap(),
            studies: rng.usize(3..6),
            windows: 2,
            repeats: 1,
            seed,
            ..CtOptions::quick()
        };
        let template_bytes = options.volume().unwrap().voxels() as u64;
        let row = |report: &CtReport, placing| {
            report.rows.iter().find(|row| row.placing == placing).cloned().unwrap()
        };
        let ran = |row: &Row| row.seconds_per_study.is_some() && row.not_run_because.is_none();

        // Room for the template, not for the volume beside it.
        let budget = template_bytes + rng.u64(0..2 * template_bytes);
        let run = measure(&cpu, &CtOptions { device_budget: budget, ..options.clone() }).unwrap();
        let report = &run.report;
        assert!(!report.smoothing);
        let all_copy = row(report, Placing::AllCopy);
        let why = all_copy.not_run_because.clone().unwrap_or_default();
        assert!(all_copy.seconds_per_study.is_none(), "{all_copy:?}");
        assert!(why.contains("does not fit") && why.contains(&budget.to_string()), "{why}");
        for placing in [Placing::AllMapped, Placing::Hybrid, Placing::Placed, Placing::Cpu] {
            assert!(ran(&row(report, placing)), "{:?}", row(report, placing));
        }
        assert_eq!(report.placement.place_of("template"), Some(Where::Device), "{}", report.placement);
        assert_eq!(report.placement.place_of("volume"), Some(Where::Mapped), "{}", report.placement);

        // No room for the template either: only the mapped placements run.
        let budget = rng.u64(0..template_bytes);
        let run = measure(&cpu, &CtOptions { device_budget: budget, ..options }).unwrap();
        let report = &run.report;
        for placing in [Placing::AllCopy, Placing::Hybrid] {
            let refused = row(report, placing);
            assert!(
                refused.not_run_because.as_deref().is_some_and(|why| why.contains("does not fit")),
                "{refused:?}"
            );
        }
        for placing in [Placing::AllMapped, Placing::Placed, Placing::Cpu] {
            assert!(ran(&row(report, placing)), "{:?}", row(report, placing));
        }
        assert_eq!(report.placement.device_bytes, 0, "{}", report.placement);
    }
}
