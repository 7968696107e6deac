//! `hetmem bench ct`: the CT computation's table, its projection as a PNG, and the volume
//! written for the peer script (bench/peers/ct_stats_torch.py).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use hetmem::ops::ct::{self as ct_op, LabelledVolume, VolumeShape};
use hetmem::placement::LinkProfile;
use hetmem_bench::ct::{CtReport, CtRun, Scan};
use hetmem_bench::link::{LinkPath, PROFILE_PATHS};
use image::ImageEncoder as _;
use image::codecs::png::PngEncoder;

use super::snake_name;
use crate::outputs::Outputs;
use crate::table::Table;

/// The tables' names.
pub const TABLES: [&str; 3] = ["ct", "ct_placement", "ct_organs"];

pub fn tables(report: &CtReport) -> Vec<Table> {
    let study = report.study;
    let mut rows = Table::new(
        TABLES[0],
        format!(
            "CT statistics ({} windows x {} organs = {} passes){} on {}: {} study of {}x{}x{} i16 ({}), x{} stacked, \
             seconds per study",
            report.windows.len(),
            report.passes / report.windows.len().max(1),
            report.passes,
            if report.smoothing { " + masked Gaussian + projection" } else { " + projection" },
            report.device,
            report.volume_kind,
            study.depth(),
            study.height(),
            study.width(),
            "label template u8",
            report.studies
        ),
        &["placement", "volume", "template", "median s", "min s", "vs all-copy", "checked"],
    );
    for row in &report.rows {
        let name = snake_name(&row.placing).unwrap_or_default();
        match (&row.seconds_per_study, &row.not_run_because) {
            (Some(seconds), _) => rows.row(vec![
                name,
                row.volume.clone(),
                row.template.clone(),
                format!("{:.4}", seconds.median),
                format!("{:.4}", seconds.min),
                row.speedup_over_all_copy.map_or("-".into(), |x| format!("{x:.2}x")),
                row.checked.clone(),
            ]),
            (None, why) => rows.row(vec![
                name,
                row.volume.clone(),
                row.template.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("not run: {}", why.as_deref().unwrap_or("")),
            ]),
        }
    }
    rows.note(format!(
        "device budget {} bytes; link profile {}",
        report.device_budget, report.profile_source
    ));
    let mut placement = Table::new(
        TABLES[1],
        format!(
            "placement (mapped {:.1} GB/s, scattered {:.2} GB/s, copy {:.1} GB/s, device {:.0} GB/s)",
            report.profile.mapped_read_gb_s,
            report.profile.mapped_random_read_gb_s,
            report.profile.copy_gb_s,
            report.profile.device_read_gb_s
        ),
        &["buffer", "bytes", "placed", "predicted s", "why"],
    );
    for decision in &report.placement.decisions {
        placement.row(vec![
            decision.name.clone(),
            decision.bytes.to_string(),
            decision.place.to_string(),
            format!("{:.4}", decision.predicted_s),
            decision.reason.clone(),
        ]);
    }
    let mut organs = Table::new(
        TABLES[2],
        "organs of the stack, from the CPU (all their voxels, whatever the window)",
        &["organ", "voxels", "mean HU", "std HU"],
    );
    for organ in &report.organs {
        organs.row(vec![
            organ.organ.name().into(),
            organ.count.to_string(),
            format!("{:.2}", organ.mean),
            format!("{:.2}", organ.std),
        ]);
    }
    vec![rows, placement, organs]
}

/// Writes the projection as a greyscale PNG.
pub fn write_mip(run: &CtRun, path: &Path, outputs: &Outputs) -> anyhow::Result<()> {
    let mut png = Vec::new();
    PngEncoder::new(&mut png).write_image(
        &run.mip,
        run.mip_width as u32,
        run.mip_height as u32,
        image::ExtendedColorType::L8,
    )?;
    outputs.write(path, png)
}

/// The files [`write_volume`] writes into `dir`.
pub fn volume_files(dir: &Path) -> [PathBuf; 3] {
    [dir.join("hu.i16"), dir.join("labels.u8"), dir.join("volume.json")]
}

/// Writes the volume (`hu.i16`, little-endian), the template (`labels.u8`) and `volume.json`
/// (shape, windows, organs, and the CPU's statistics per pass) for the peer script.
pub fn write_volume(run: &CtRun, dir: &Path, outputs: &Outputs) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let [hu, labels, meta] = volume_files(dir);
    let shape = run.phantom.shape();
    let hu_bytes: Vec<u8> = run.phantom.hu().iter().flat_map(|v| v.to_le_bytes()).collect();
    outputs.write(&hu, hu_bytes)?;
    outputs.write(&labels, run.phantom.labels())?;
    let windows: Vec<[i16; 2]> = run.report.windows.iter().map(|w| [w.lo(), w.hi()]).collect();
    let organs: Vec<u8> = hetmem::ops::ct::Organ::ALL.iter().map(|o| o.label()).collect();
    let stats: Vec<Vec<u64>> = run.stats.iter().map(|s| s.to_words()).collect();
    let json = serde_json::json!({
        "depth": shape.depth(), "height": shape.height(), "width": shape.width(), "studies": run.report.studies,
        "windows": windows, "organs": organs, "bins": hetmem::ops::ct::HISTOGRAM_BINS,
        "stats_words": "count, sum (two's complement u64), sum of squares, then the histogram",
        "expected_stats": stats,
    });
    outputs.write(&meta, serde_json::to_vec_pretty(&json)?)
}

/// A profile from `hetmem bench link --json` output: the largest size of each of the
/// profile's cells ([`PROFILE_PATHS`]). Output of a bench link from before it measured
/// `device_read` takes the device rate from `device_read_gb_s`, else the built-in profile's.
pub fn profile_from_json(path: &Path, device_read_gb_s: Option<f64>) -> anyhow::Result<LinkProfile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON from `hetmem bench link --json`", path.display()))?;
    let cells = json["bandwidth"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rate = |path: &LinkPath| {
        cells
            .iter()
            .filter(|cell| cell["path"] == path.name())
            .max_by_key(|cell| cell["bytes"].as_u64().unwrap_or(0))
            .and_then(|cell| cell["gb_s"]["median"].as_f64())
    };
    let [device, Some(mapped), Some(scattered), Some(copy)] = PROFILE_PATHS.each_ref().map(rate) else {
        let names: Vec<&str> = PROFILE_PATHS[1..].iter().map(|path| path.name()).collect();
        bail!(
            "{} has no {} cells: give the JSON of `hetmem bench link --json` run on a GPU",
            path.display(),
            names.join(", ")
        );
    };
    let device = device.or(device_read_gb_s).unwrap_or(LinkProfile::built_in().device_read_gb_s);
    Ok(LinkProfile::new(device, mapped, scattered, copy)?)
}

fn is_nifti(path: &Path) -> bool {
    let name = path.to_string_lossy().to_ascii_lowercase();
    name.ends_with(".nii") || name.ends_with(".nii.gz")
}

/// `--shape DEPTHxHEIGHTxWIDTH`.
fn parse_shape(text: &str) -> anyhow::Result<VolumeShape> {
    let sides: Vec<usize> =
        text.split('x').map(|side| side.trim().parse()).collect::<Result<_, _>>().map_err(|_| {
            anyhow::anyhow!("--shape {text:?}: give DEPTHxHEIGHTxWIDTH in voxels, such as 300x512x512")
        })?;
    let [depth, height, width] = sides[..] else {
        bail!("--shape {text:?}: give three sides, DEPTHxHEIGHTxWIDTH, such as 300x512x512");
    };
    Ok(VolumeShape::new(depth, height, width)?)
}

/// `--volume` and `--labels`: NIfTI-1 files, or raw files of `--shape`.
pub fn read_scan(volume: &Path, labels: &Path, shape: Option<&str>) -> anyhow::Result<Scan> {
    let raw_shape = || -> anyhow::Result<VolumeShape> {
        let Some(text) = shape else {
            bail!(
                "{} is not a NIfTI file (.nii, .nii.gz): give --shape DEPTHxHEIGHTxWIDTH to read it raw",
                volume.display()
            );
        };
        parse_shape(text)
    };
    let (hu_shape, hu) = if is_nifti(volume) {
        ct_op::read_nifti_hu(volume)?
    } else {
        let shape = raw_shape()?;
        (shape, ct_op::read_raw_hu(volume, shape)?)
    };
    let (labels_shape, template) = if is_nifti(labels) {
        ct_op::read_nifti_labels(labels)?
    } else {
        let shape = raw_shape()?;
        (shape, ct_op::read_raw_labels(labels, shape)?)
    };
    if hu_shape != labels_shape {
        bail!(
            "{} is {}x{}x{} but its labels {} are {}x{}x{}: give the template made for this volume",
            volume.display(),
            hu_shape.depth(),
            hu_shape.height(),
            hu_shape.width(),
            labels.display(),
            labels_shape.depth(),
            labels_shape.height(),
            labels_shape.width()
        );
    }
    Ok(Scan {
        description: format!("{} with labels {}", volume.display(), labels.display()),
        volume: LabelledVolume::new(hu_shape, hu, template)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(path: &str, bytes: u64, median: f64) -> serde_json::Value {
        serde_json::json!({ "path": path, "bytes": bytes, "gb_s": { "median": median } })
    }

    #[test]
    fn a_link_json_gives_its_largest_cells_and_an_old_one_the_device_rate_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("link.json");
        let rates: Vec<f64> = PROFILE_PATHS.iter().map(|_| 1.0 + fastrand::f64() * 4000.0).collect();
        let mut cells: Vec<_> = PROFILE_PATHS
            .iter()
            .zip(&rates)
            .flat_map(|(link_path, &rate)| {
                [cell(link_path.name(), 1 << 28, rate), cell(link_path.name(), 1 << 12, rate / 7.0)]
            })
            .collect();
        std::fs::write(&path, serde_json::json!({ "bandwidth": cells }).to_string()).unwrap();
        let profile = profile_from_json(&path, None).unwrap();
        let got = [
            profile.device_read_gb_s,
            profile.mapped_read_gb_s,
            profile.mapped_random_read_gb_s,
            profile.copy_gb_s,
        ];
        // serde_json parses floats fast rather than correctly rounded (without its
        // `float_roundtrip` feature): a rate may come back one unit in the last place off.
        for (got, rate) in got.iter().zip(&rates) {
            assert!((got - rate).abs() <= rate * 1e-15, "{got} read back for {rate}");
        }

        // From a bench link before device_read: the rate given, else the built-in profile's.
        cells.retain(|cell| cell["path"] != "device_read");
        std::fs::write(&path, serde_json::json!({ "bandwidth": cells }).to_string()).unwrap();
        let given = 1.0 + fastrand::f64() * 4000.0;
        assert_eq!(profile_from_json(&path, Some(given)).unwrap().device_read_gb_s, given);
        let built_in = LinkProfile::built_in().device_read_gb_s;
        assert_eq!(profile_from_json(&path, None).unwrap().device_read_gb_s, built_in);

        cells.retain(|cell| cell["path"] != "zero_copy_read_strided");
        std::fs::write(&path, serde_json::json!({ "bandwidth": cells }).to_string()).unwrap();
        let error = format!("{:#}", profile_from_json(&path, None).unwrap_err());
        assert!(
            error.contains("zero_copy_read_strided") && error.contains("hetmem bench link --json"),
            "{error}"
        );
    }
}
