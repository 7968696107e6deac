//! [`ProfileCache`]: the [`LinkProfile`] `hetmem bench link` measured for a GPU, kept on disk
//! so that placements on that GPU decide from this machine's rates rather than the built-in
//! ones.
//!
//! One small text file per GPU, `link-profile-<key>.txt`, in hetmem's cache folder (the kernel
//! cache's: [`crate::kernels::cache`], which the CLI sets from `HETMEM_CACHE_DIR`). The file
//! names the GPU and the driver it was measured under; a file for another GPU or driver, or one
//! that does not parse, is ignored with a warning and the built-in profile is used, its source
//! saying why. Loading never fails.

use std::fmt;
use std::path::{Path, PathBuf};

use super::LinkProfile;
use crate::backend::cuda::CudaDevice;
use crate::error::{Error, Result};

/// The first line of a profile file: its format and version.
const HEADER: &str = "hetmem link profile 1";

/// What a cached profile is valid for: one GPU under one driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GpuKey {
    /// The product name, for example `NVIDIA H200`.
    pub name: String,
    /// The PCI bus id: which of several GPUs of one name.
    pub pci_bus_id: String,
    /// Its memory in bytes.
    pub total_memory: u64,
    /// The CUDA version of the driver, for example `12.8`: a new driver may move bytes at new
    /// rates.
    pub driver: String,
}

impl GpuKey {
    /// The key of `gpu` under the driver loaded now.
    pub fn of(gpu: &CudaDevice) -> GpuKey {
        let driver = crate::backend::cuda::driver::driver().map_or_else(
            |_| "unknown".to_string(),
            |info| crate::error::cuda_version_string(info.cuda_version),
        );
        GpuKey {
            name: gpu.name().to_string(),
            pci_bus_id: gpu.pci_bus_id().to_string(),
            total_memory: gpu.total_memory(),
            driver,
        }
    }

    /// The file name part: the bus id, with only letters, digits and dashes.
    fn file_stem(&self) -> String {
        let bus: String =
            self.pci_bus_id.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        format!("link-profile-{bus}")
    }
}

impl fmt::Display for GpuKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {} ({} bytes), CUDA driver {}",
            self.name, self.pci_bus_id, self.total_memory, self.driver
        )
    }
}

/// Where the rates a placement decided from came from.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ProfileSource {
    /// Given by the caller.
    Given,
    /// Measured on this GPU by `hetmem bench link`, read from this file.
    Measured {
        /// The cache file.
        path: PathBuf,
    },
    /// [`LinkProfile::built_in`], since no measurement for this GPU could be used.
    BuiltIn {
        /// Why not.
        why: String,
    },
}

impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileSource::Given => f.write_str("given by the caller"),
            ProfileSource::Measured { path } => {
                write!(f, "measured on this GPU by `hetmem bench link` ({})", path.display())
            }
            ProfileSource::BuiltIn { why } => {
                write!(f, "built-in: run `hetmem bench link` to measure this machine ({why})")
            }
        }
    }
}

/// A profile and where it came from.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SourcedProfile {
    /// The rates.
    pub profile: LinkProfile,
    /// Where they came from.
    pub source: ProfileSource,
}

impl SourcedProfile {
    fn built_in(why: String) -> SourcedProfile {
        SourcedProfile { profile: LinkProfile::built_in(), source: ProfileSource::BuiltIn { why } }
    }
}

/// A folder of measured link profiles: one small text file per GPU, `link-profile-<bus id>.txt`,
/// naming the GPU and driver it was measured under. A file for another GPU or driver, or one
/// that does not parse, is ignored with a warning, and the built-in profile is used with the
/// reason ([`ProfileSource::BuiltIn`]); loading never fails.
#[derive(Debug, Clone)]
pub struct ProfileCache {
    dir: Option<PathBuf>,
}

impl ProfileCache {
    /// Profiles in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> ProfileCache {
        ProfileCache { dir: Some(dir.into()) }
    }

    /// Profiles in hetmem's cache folder: the kernel cache's ([`crate::kernels::cache`]);
    /// none when there is no such folder.
    pub fn hetmem_default() -> ProfileCache {
        ProfileCache { dir: crate::kernels::cache().dir().map(Path::to_path_buf) }
    }

    /// The file `key`'s profile is kept in; `None` without a folder.
    pub fn path(&self, key: &GpuKey) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(format!("{}.txt", key.file_stem())))
    }

    /// Keeps `profile` as the one measured for `key`, replacing any before it.
    ///
    /// # Errors
    /// No cache folder, or the file cannot be written (the message names it).
    pub fn save(&self, key: &GpuKey, profile: &LinkProfile) -> Result<PathBuf> {
        let path = self.path(key).ok_or_else(|| {
            Error::invalid(
                "link profile cache",
                "no cache folder: set HOME, XDG_CACHE_HOME or HETMEM_CACHE_DIR to keep measured profiles",
            )
        })?;
        let text = format!(
            "{HEADER}\ngpu_name = {}\npci_bus_id = {}\ntotal_memory = {}\ndriver = {}\n\
             device_read_gb_s = {}\nmapped_read_gb_s = {}\nmapped_random_read_gb_s = {}\ncopy_gb_s = {}\n",
            key.name,
            key.pci_bus_id,
            key.total_memory,
            key.driver,
            profile.device_read_gb_s,
            profile.mapped_read_gb_s,
            profile.mapped_random_read_gb_s,
            profile.copy_gb_s
        );
        crate::kernels::write_atomically(&path, text.as_bytes()).map_err(|error| {
            Error::invalid(
                "link profile cache",
                format!("cannot write {}: {error}; check the folder's permissions", path.display()),
            )
        })?;
        Ok(path)
    }

    /// The profile measured for `key`, or the built-in one with the reason. A file that does
    /// not parse, or was measured for another GPU or driver, is logged as a warning.
    pub fn load(&self, key: &GpuKey) -> SourcedProfile {
        let Some(path) = self.path(key) else {
            return SourcedProfile::built_in("no cache folder to keep a measured profile in".into());
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return SourcedProfile::built_in(format!("none measured for {key}"));
            }
            Err(error) => return ignored(&path, format!("it cannot be read: {error}")),
        };
        match parse(&text) {
            Err(problem) => ignored(&path, problem),
            Ok((measured_for, _)) if measured_for != *key => {
                ignored(&path, format!("it was measured for {measured_for}, and this is {key}"))
            }
            Ok((_, profile)) => SourcedProfile { profile, source: ProfileSource::Measured { path } },
        }
    }

    /// The profile measured for `gpu` ([`ProfileCache::load`] with its key).
    pub fn load_for(&self, gpu: &CudaDevice) -> SourcedProfile {
        self.load(&GpuKey::of(gpu))
    }
}

/// The built-in profile, after a warning that the file at `path` was ignored and why.
fn ignored(path: &Path, problem: String) -> SourcedProfile {
    tracing::warn!(
        "ignoring the cached link profile {}: {problem}; using the built-in profile (run `hetmem bench link` \
         to measure this machine again)",
        path.display()
    );
    SourcedProfile::built_in(format!("the cached profile {} was ignored: {problem}", path.display()))
}

/// The key and the profile a file holds, or what is wrong with it.
fn parse(text: &str) -> std::result::Result<(GpuKey, LinkProfile), String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!("it does not start with {HEADER:?}"));
    }
    let fields: Vec<(&str, &str)> = lines
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split_once('=').map(|(k, v)| (k.trim(), v.trim())).ok_or(line))
        .collect::<std::result::Result<_, _>>()
        .map_err(|line| format!("the line {line:?} is not `name = value`"))?;
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
            .ok_or(format!("it has no {name}"))
    };
    let number = |name: &str| -> std::result::Result<f64, String> {
        let value = field(name)?;
        value.parse().map_err(|_| format!("its {name} {value:?} is not a number"))
    };
    let key = GpuKey {
        name: field("gpu_name")?.to_string(),
        pci_bus_id: field("pci_bus_id")?.to_string(),
        total_memory: field("total_memory")?
            .parse()
            .map_err(|_| "its total_memory is not a whole number".to_string())?,
        driver: field("driver")?.to_string(),
    };
    let profile = LinkProfile::new(
        number("device_read_gb_s")?,
        number("mapped_read_gb_s")?,
        number("mapped_random_read_gb_s")?,
        number("copy_gb_s")?,
    )
    .map_err(|error| error.to_string())?;
    Ok((key, profile))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_key(rng: &mut fastrand::Rng) -> GpuKey {
        GpuKey {
            name: format!("NVIDIA Test {}", rng.u32(..)),
            pci_bus_id: format!("0000:{:02X}:00.0", rng.u8(..)),
            total_memory: rng.u64(1 << 30..1 << 40),
            driver: format!("{}.{}", rng.u32(12..14), rng.u32(0..10)),
        }
    }

    fn random_profile(rng: &mut fastrand::Rng) -> LinkProfile {
        let rate = |rng: &mut fastrand::Rng| 0.5 + rng.f64() * 5000.0;
        LinkProfile::new(rate(rng), rate(rng), rate(rng), rate(rng)).unwrap()
    }

    fn seeded(test: &str) -> fastrand::Rng {
        let seed = fastrand::u64(..);
        eprintln!("{test}: seed {seed:#x}");
        fastrand::Rng::with_seed(seed)
    }

    #[test]
    fn a_saved_profile_loads_back_exactly_for_its_gpu() {
        let mut rng = seeded("a_saved_profile_loads_back_exactly_for_its_gpu");
        let dir = tempfile::tempdir().unwrap();
        let cache = ProfileCache::at(dir.path().join("nested"));
        let (key, profile) = (random_key(&mut rng), random_profile(&mut rng));
        let path = cache.save(&key, &profile).unwrap();
        let loaded = cache.load(&key);
        assert_eq!(loaded.profile, profile);
        assert_eq!(loaded.source, ProfileSource::Measured { path });
        let replaced = random_profile(&mut rng);
        cache.save(&key, &replaced).unwrap();
        assert_eq!(cache.load(&key).profile, replaced);
    }

    #[test]
    fn no_file_gives_the_built_in_profile_saying_how_to_measure() {
        let key = random_key(&mut seeded("no_file_gives_the_built_in_profile_saying_how_to_measure"));
        let dir = tempfile::tempdir().unwrap();
        for cache in [ProfileCache::at(dir.path()), ProfileCache { dir: None }] {
            let loaded = cache.load(&key);
            assert_eq!(loaded.profile, LinkProfile::built_in());
            let source = loaded.source.to_string();
            assert!(source.starts_with("built-in: run `hetmem bench link`"), "{source}");
        }
    }

    #[test]
    fn a_profile_of_another_gpu_or_driver_is_ignored_with_the_reason() {
        let mut rng = seeded("a_profile_of_another_gpu_or_driver_is_ignored_with_the_reason");
        let dir = tempfile::tempdir().unwrap();
        let cache = ProfileCache::at(dir.path());
        let key = random_key(&mut rng);
        cache.save(&key, &random_profile(&mut rng)).unwrap();
        let renamed = GpuKey { name: format!("{} Ti", key.name), ..key.clone() };
        let updated = GpuKey { driver: format!("{}9", key.driver), ..key.clone() };
        for other in [renamed, updated] {
            let loaded = cache.load(&other);
            assert_eq!(loaded.profile, LinkProfile::built_in());
            let source = loaded.source.to_string();
            assert!(source.contains("was measured for") && source.contains(&key.driver), "{source}");
        }
    }

    #[test]
    fn a_corrupt_file_is_ignored_with_the_reason_never_a_panic() {
        let mut rng = seeded("a_corrupt_file_is_ignored_with_the_reason_never_a_panic");
        let dir = tempfile::tempdir().unwrap();
        let cache = ProfileCache::at(dir.path());
        let key = random_key(&mut rng);
        let path = cache.save(&key, &random_profile(&mut rng)).unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        let corruptions = [
            ("not a profile\n".to_string(), "does not start with"),
            (good.replace("copy_gb_s", "copy"), "no copy_gb_s"),
            (good.replace("device_read_gb_s = ", "device_read_gb_s = x"), "not a number"),
            (good.replace("mapped_read_gb_s = ", "mapped_read_gb_s = -"), "mapped read rate"),
            (format!("{good}garbage\n"), "not `name = value`"),
            (good[..rng.usize(1..good.len() / 2)].to_string(), ""),
        ];
        for (text, says) in corruptions {
            std::fs::write(&path, &text).unwrap();
            let loaded = cache.load(&key);
            assert_eq!(loaded.profile, LinkProfile::built_in(), "{text}");
            let source = loaded.source.to_string();
            assert!(source.contains("was ignored") && source.contains(says), "{source}");
        }
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(cache.load(&key).source.to_string().contains("cannot be read"));
    }
}
