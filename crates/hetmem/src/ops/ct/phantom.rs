//! [`LabelledVolume::phantom`]: a generated CT volume with its organ template, deterministic
//! from a seed, and the [`Organ`]s of its template.

use rayon::prelude::*;

use super::{LabelledVolume, VolumeShape};

/// The organs of a phantom's template ([`LabelledVolume::phantom`]); the discriminant is the label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[repr(u8)]
pub enum Organ {
    /// Air around the body, about -1000 HU.
    Outside = 0,
    /// Fat and muscle, about 40 HU.
    SoftTissue = 1,
    /// Both lungs, about -850 HU.
    Lungs = 2,
    /// About 60 HU.
    Liver = 3,
    /// Both kidneys, about 30 HU.
    Kidneys = 4,
    /// About 45 HU.
    Spleen = 5,
    /// Spine and ribs, 700 (inside) to 1000 HU (cortex).
    Bone = 6,
}

impl Organ {
    /// Every organ, by label.
    pub const ALL: [Organ; 7] = [
        Organ::Outside,
        Organ::SoftTissue,
        Organ::Lungs,
        Organ::Liver,
        Organ::Kidneys,
        Organ::Spleen,
        Organ::Bone,
    ];

    /// Its label in the template.
    pub fn label(self) -> u8 {
        self as u8
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Organ::Outside => "outside",
            Organ::SoftTissue => "soft tissue",
            Organ::Lungs => "lungs",
            Organ::Liver => "liver",
            Organ::Kidneys => "kidneys",
            Organ::Spleen => "spleen",
            Organ::Bone => "bone",
        }
    }

    /// Mean HU and noise (standard deviation, HU) of the organ in a phantom.
    fn hounsfield(self) -> (f32, f32) {
        match self {
            Organ::Outside => (-1000.0, 4.0),
            Organ::SoftTissue => (40.0, 12.0),
            Organ::Lungs => (-850.0, 25.0),
            Organ::Liver => (60.0, 10.0),
            Organ::Kidneys => (30.0, 10.0),
            Organ::Spleen => (45.0, 10.0),
            Organ::Bone => (700.0, 40.0),
        }
    }
}

impl LabelledVolume {
    /// A generated anatomical phantom (not a scan) of `shape`, slices in parallel: a torso
    /// ellipse of soft tissue in air, lungs in the upper slices, liver, spleen and kidneys below
    /// them, the spine through every slice and ribs around the chest, each organ at its typical
    /// Hounsfield units with Gaussian-like noise, and the template labelling each voxel
    /// ([`Organ`]). The same seed gives the same volume.
    pub fn phantom(shape: VolumeShape, seed: u64) -> LabelledVolume {
        let slice = shape.height() * shape.width();
        let mut hu = vec![0i16; shape.voxels()];
        let mut labels = vec![0u8; shape.voxels()];
        hu.par_chunks_mut(slice).zip(labels.par_chunks_mut(slice)).enumerate().for_each(
            |(z, (hu, labels))| {
                let t = (z as f32 + 0.5) / shape.depth() as f32;
                for y in 0..shape.height() {
                    let v = (y as f32 + 0.5) / shape.height() as f32 * 2.0 - 1.0;
                    for x in 0..shape.width() {
                        let u = (x as f32 + 0.5) / shape.width() as f32 * 2.0 - 1.0;
                        let index = y * shape.width() + x;
                        let (organ, cortex) = organ_at(u, v, t);
                        let (mean, sigma) = organ.hounsfield();
                        let mean = if cortex { 1000.0 } else { mean };
                        let voxel = (z * slice + index) as u64;
                        let value = mean + sigma * noise(seed, voxel);
                        hu[index] = value.round().clamp(-1024.0, 3071.0) as i16;
                        labels[index] = organ.label();
                    }
                }
            },
        );
        LabelledVolume::new(shape, hu, labels)
            .expect("the phantom fills its shape, one value and one label a voxel")
    }
}

fn inside(u: f32, v: f32, (cu, cv): (f32, f32), (a, b): (f32, f32)) -> f32 {
    ((u - cu) / a).powi(2) + ((v - cv) / b).powi(2)
}

/// How wide an organ is at height `t` of its range `[start, end]`: 0 outside, rising to 1.
fn taper(t: f32, start: f32, end: f32) -> f32 {
    if t <= start || t >= end {
        return 0.0;
    }
    let edge = ((t - start).min(end - t) / ((end - start) * 0.2)).min(1.0);
    edge.sqrt()
}

/// The organ at (u, v) in [-1, 1]^2 of slice height t in [0, 1], and whether it is cortical bone.
fn organ_at(u: f32, v: f32, t: f32) -> (Organ, bool) {
    let body = inside(u, v, (0.0, 0.0), (0.85, 0.62));
    if body > 1.0 {
        return (Organ::Outside, false);
    }
    let spine = (u * u + (v - 0.4).powi(2)).sqrt();
    if spine < 0.1 {
        return (Organ::Bone, spine > 0.075);
    }
    let chest = taper(t, 0.0, 0.5);
    let shell = inside(u, v, (0.0, 0.0), (0.8, 0.57));
    if chest > 0.0 && (0.88..1.0).contains(&shell) && (t * 24.0).fract() < 0.35 && v < 0.35 {
        return (Organ::Bone, true);
    }
    let lungs = taper(t, 0.03, 0.47);
    if lungs > 0.0 {
        let size = (0.3 * lungs, 0.42 * lungs);
        if inside(u, v, (-0.38, -0.02), size) <= 1.0 || inside(u, v, (0.38, -0.02), size) <= 1.0 {
            return (Organ::Lungs, false);
        }
    }
    let liver = taper(t, 0.38, 0.72);
    if liver > 0.0 && inside(u, v, (-0.33, 0.0), (0.42 * liver, 0.38 * liver)) <= 1.0 {
        return (Organ::Liver, false);
    }
    let spleen = taper(t, 0.4, 0.6);
    if spleen > 0.0 && inside(u, v, (0.5, 0.15), (0.16 * spleen, 0.2 * spleen)) <= 1.0 {
        return (Organ::Spleen, false);
    }
    let kidneys = taper(t, 0.55, 0.8);
    if kidneys > 0.0 {
        let size = (0.12 * kidneys, 0.16 * kidneys);
        if inside(u, v, (-0.3, 0.3), size) <= 1.0 || inside(u, v, (0.3, 0.3), size) <= 1.0 {
            return (Organ::Kidneys, false);
        }
    }
    (Organ::SoftTissue, false)
}

/// About normal noise (mean 0, standard deviation 1) for voxel `index`: a sum of four uniform
/// draws from a hash of the seed and the index, so each voxel's noise is the same whichever
/// thread draws it.
fn noise(seed: u64, index: u64) -> f32 {
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut sum = 0.0f32;
    for _ in 0..4 {
        state = splitmix64(state);
        sum += (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    }
    sum * 3.0f32.sqrt()
}

fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_phantom_and_another_seed_other_noise() {
        let shape = VolumeShape::new(24, 40, 48).unwrap();
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let a = LabelledVolume::phantom(shape, seed);
        let b = LabelledVolume::phantom(shape, seed);
        let c = LabelledVolume::phantom(shape, seed ^ 1);
        assert_eq!(a.hu(), b.hu());
        assert_eq!(a.labels(), c.labels());
        assert_ne!(a.hu(), c.hu());
    }

    #[test]
    fn every_organ_is_present_with_its_hounsfield_range() {
        let shape = VolumeShape::new(60, 96, 128).unwrap();
        let phantom = LabelledVolume::phantom(shape, fastrand::u64(..));
        for organ in Organ::ALL {
            let values: Vec<f64> = phantom
                .labels()
                .iter()
                .zip(phantom.hu())
                .filter(|(label, _)| **label == organ.label())
                .map(|(_, hu)| f64::from(*hu))
                .collect();
            assert!(values.len() > 20, "{}: {} voxels", organ.name(), values.len());
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            let (expected, _) = organ.hounsfield();
            let tolerance = if organ == Organ::Bone { 320.0 } else { 10.0 };
            assert!((mean - f64::from(expected)).abs() < tolerance, "{}: mean {mean}", organ.name());
        }
    }
}
