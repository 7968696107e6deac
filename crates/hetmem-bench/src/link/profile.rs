//! The placement profile a link measurement makes ([`LinkReport::profile`]), kept for the GPU
//! in hetmem's cache ([`save_profile`]) and found again ([`cached_or_measured`]).

use hetmem::backend::Device;
use hetmem::backend::cuda::CudaDevice;
use hetmem::error::Error;
use hetmem::placement::{GpuKey, LinkProfile, ProfileCache, ProfileSource};

use super::{LinkOptions, LinkPath, LinkReport};
use crate::error::Result;

/// The cells a [`LinkProfile`] is made of, in the order of its rates.
pub const PROFILE_PATHS: [LinkPath; 4] =
    [LinkPath::DeviceRead, LinkPath::ZeroCopyRead, LinkPath::ZeroCopyReadStrided, LinkPath::PinnedAsyncH2d];

impl LinkReport {
    /// The rates placement decides from ([`hetmem::placement`]): the median at the largest
    /// size measured of each of [`PROFILE_PATHS`].
    ///
    /// # Errors
    /// A report without those cells (a CPU-only run, or paths left out), naming them.
    pub fn profile(&self) -> hetmem::Result<LinkProfile> {
        let rate = |path: LinkPath| {
            self.bandwidth
                .iter()
                .filter(|cell| cell.path == path)
                .max_by_key(|cell| cell.bytes)
                .map(|cell| cell.gb_s.median)
        };
        match PROFILE_PATHS.map(rate) {
            [Some(device), Some(mapped), Some(scattered), Some(copy)] => {
                LinkProfile::new(device, mapped, scattered, copy)
            }
            _ => {
                let names: Vec<&str> = PROFILE_PATHS.iter().map(|path| path.name()).collect();
                Err(Error::invalid(
                    "link profile",
                    format!(
                        "the link report lacks one of the cells {}: run `hetmem bench link` on a GPU with those paths",
                        names.join(", ")
                    ),
                ))
            }
        }
    }
}

/// Keeps the profile of `report`, measured on `gpu`, in hetmem's cache
/// ([`ProfileCache::hetmem_default`]), where placements on that GPU find it.
///
/// # Errors
/// A report without the profile's cells, no cache folder, or a file that cannot be written.
pub fn save_profile(gpu: &CudaDevice, report: &LinkReport) -> hetmem::Result<std::path::PathBuf> {
    ProfileCache::hetmem_default().save(&GpuKey::of(gpu), &report.profile()?)
}

/// Measures the rates placement needs (256 MiB cells, 3 runs each: a few seconds).
///
/// # Errors
/// As [`super::measure`].
pub fn measure_profile(device: &Device) -> Result<LinkReport> {
    let options = LinkOptions {
        sizes: vec![256 << 20],
        paths: PROFILE_PATHS.to_vec(),
        repeats: 3,
        warm_up: 1,
        latency_sizes: Vec::new(),
        latency_samples: 1,
        completion: false,
        cold_cpu_cache: true,
    };
    super::measure(device, &options)
}

/// The profile `hetmem bench link` saved for `gpu`; else one measured now, and saved for the
/// next run; with where it came from.
///
/// # Errors
/// As [`super::measure`], when measured now.
pub fn cached_or_measured(device: &Device, gpu: &CudaDevice) -> Result<(LinkProfile, String)> {
    let cached = ProfileCache::hetmem_default().load_for(gpu);
    if matches!(cached.source, ProfileSource::Measured { .. }) {
        return Ok((cached.profile, cached.source.to_string()));
    }
    let report = measure_profile(device)?;
    let profile = report.profile()?;
    let saved = match save_profile(gpu, &report) {
        Ok(path) => format!("saved to {}", path.display()),
        Err(error) => format!("not saved: {error}"),
    };
    Ok((profile, format!("measured in this run (bench link cells, 256 MiB; {saved})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Summary;
    use crate::link::BandwidthCell;

    fn report_of(cells: Vec<BandwidthCell>) -> LinkReport {
        LinkReport {
            device: "NVIDIA Test".into(),
            gpu_measured: true,
            gpu_not_measured_because: None,
            repeats: 1,
            cold_cpu_cache: true,
            ceiling: None,
            bandwidth: cells,
            latency: Vec::new(),
            completion: None,
        }
    }

    fn cell(path: LinkPath, bytes: usize, gb_s: f64) -> BandwidthCell {
        BandwidthCell::new(path, bytes, Summary::of(&[gb_s]).unwrap(), "test")
    }

    #[test]
    fn the_profile_takes_each_rate_at_the_largest_size_and_names_missing_cells() {
        let seed = fastrand::u64(..);
        eprintln!("seed {seed:#x}");
        let mut rng = fastrand::Rng::with_seed(seed);
        let largest: Vec<f64> = PROFILE_PATHS.iter().map(|_| 1.0 + rng.f64() * 4000.0).collect();
        let mut cells = Vec::new();
        for (path, &rate) in PROFILE_PATHS.iter().zip(&largest) {
            cells.push(cell(*path, 256 << 20, rate));
            cells.push(cell(*path, 4 << 10, 1.0 + rng.f64() * 4000.0));
        }
        cells.push(cell(LinkPath::ZeroCopyWrite, 1 << 30, 1.0 + rng.f64()));
        rng.shuffle(&mut cells);
        let profile = report_of(cells.clone()).profile().unwrap();
        let got = [
            profile.device_read_gb_s,
            profile.mapped_read_gb_s,
            profile.mapped_random_read_gb_s,
            profile.copy_gb_s,
        ];
        assert_eq!(got.to_vec(), largest);
        let missing = PROFILE_PATHS[rng.usize(..PROFILE_PATHS.len())];
        cells.retain(|cell| cell.path != missing);
        let error = report_of(cells).profile().unwrap_err().to_string();
        assert!(error.contains("device_read") && error.contains("hetmem bench link"), "{error}");
    }
}
