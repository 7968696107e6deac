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
    HuWindow, LabelledVolume, Organ, OrganStats, VolumeShape, gaussian_weights, window_to_gray,
};
use hetmem::placement::{AccessPattern, BufferUse, LinkProfile, Placement, Placer, ProfileSource};

use crate::Summary;
use crate::error::Result;
use crate::link;

mod outputs;
mod reference;
mod rows;

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

/// Runs the computation every way the machine can.
///
/// # Errors
/// Options out of range, memory that cannot be allocated, a GPU failure, or a row whose
/// results differ from the CPU's ([`BenchError::ResultMismatch`](crate::BenchError::ResultMismatch)).
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
    let timer = Timer { repeats: options.repeats, studies: options.studies as f64 };

    let mut expected = None;
    let cpu_seconds = timer.time(&mut || {
        expected = Some(reference::cpu_run(&phantom, &windows, smoothing, &weights)?);
        Ok(())
    })?;
    let expected = expected.ok_or_else(|| Error::invalid("bench ct", "the CPU run produced nothing"))?;
    let organs = expected.organ_rows(windows.len());
    let cpu_row = Row {
        placing: Placing::Cpu,
        volume: "host".into(),
        template: "host".into(),
        seconds_per_study: Some(cpu_seconds),
        speedup_over_all_copy: None,
        not_run_because: None,
        checked: "the reference".into(),
    };

    let (profile, profile_source) = link_profile(device, options)?;
    let placement = declared_buffers(volume, windows.len())
        .into_iter()
        .fold(Placer::new(profile, options.device_budget), Placer::buffer)
        .place()?;

    let mip = window_to_gray(&expected.mip, HuWindow::new(-200, 1200)?);
    let run = rows::Run { volume, windows: &windows, passes, smoothing, expected: &expected, timer: &timer };
    let mut rows = rows::gpu_rows(device, options, &run, &phantom, &weights, &placement)?;
    rows.push(cpu_row);
    speed_ups(&mut rows);
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

/// Times `repeats` runs, in seconds per study.
struct Timer {
    repeats: usize,
    studies: f64,
}

impl Timer {
    fn time(&self, run: &mut dyn FnMut() -> hetmem::Result<()>) -> Result<Summary> {
        let mut seconds = Vec::with_capacity(self.repeats);
        for _ in 0..self.repeats {
            let start = Instant::now();
            run()?;
            seconds.push(start.elapsed().as_secs_f64() / self.studies);
        }
        Summary::of(&seconds).ok_or_else(|| Error::invalid("bench ct", "no timed runs").into())
    }
}

/// The link profile placement decides from, and where it came from.
fn link_profile(device: &Device, options: &CtOptions) -> Result<(LinkProfile, String)> {
    Ok(match (options.profile, device.as_cuda()) {
        (Some(profile), _) => (profile, ProfileSource::Given.to_string()),
        (None, Some(gpu)) => link::cached_or_measured(device, gpu)?,
        (None, None) => {
            (LinkProfile::built_in(), ProfileSource::BuiltIn { why: "no GPU".into() }.to_string())
        }
    })
}

/// Each row's speed-up over the all-copy row, where both ran.
fn speed_ups(rows: &mut [Row]) {
    let all_copy = rows
        .iter()
        .find(|row| row.placing == Placing::AllCopy)
        .and_then(|row| row.seconds_per_study.as_ref().map(|s| s.median));
    for row in rows {
        row.speedup_over_all_copy =
            all_copy.zip(row.seconds_per_study.as_ref()).map(|(copy, seconds)| copy / seconds.median);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::placement::Where;
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
