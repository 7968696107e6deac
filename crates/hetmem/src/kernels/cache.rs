//! The on-disk cache of compiled kernels.
//!
//! Key: a SHA-256 of the source, the NVRTC options, the architecture and NVRTC's version, so
//! editing a kernel, changing compiler or GPU never loads a stale image. Each file carries the
//! image's SHA-256 and is checked before use; files are written to a temporary name, synced and
//! renamed. A cache that cannot be written is skipped, not an error.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::KernelSource;
use crate::backend::cuda::nvrtc;
use crate::error::Result;

/// Whether an image came from the cache or from NVRTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from disk.
    Hit,
    /// Compiled now (and written to disk where possible).
    Compiled,
}

/// A folder of compiled kernel images.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// The user's cache folder, where the platform keeps caches: `$XDG_CACHE_HOME/hetmem`,
    /// else `~/.cache/hetmem`; none (always compile) when neither variable is set. The cache
    /// kernels use unless [`super::set_cache`] names another.
    pub fn user_default() -> KernelCache {
        // The XDG base directory convention, as every program finds its cache folder; hetmem's
        // own setting is an option (`KernelCache::at`), not a variable read here.
        let var = |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
        let dir = var("XDG_CACHE_HOME")
            .map(|dir| dir.join("hetmem"))
            .or_else(|| var("HOME").map(|home| home.join(".cache").join("hetmem")));
        KernelCache { dir }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: Some(dir.into()) }
    }

    /// The folder, if there is one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The image of `source` for `arch`, from disk when a valid one is there.
    ///
    /// # Errors
    /// NVRTC missing or failing to compile the source.
    pub fn get_or_compile(&self, source: &KernelSource, arch: &str) -> Result<(Vec<u8>, CacheOutcome)> {
        self.get_or_compile_code(&Code::of(source), arch)
    }

    /// As [`KernelCache::get_or_compile`], for a source given at run time (a user's kernel),
    /// which may `#include` any of [`super::USER_HEADERS`].
    ///
    /// # Errors
    /// NVRTC missing or failing to compile the source.
    pub fn get_or_compile_user(
        &self,
        name: &str,
        source: &str,
        arch: &str,
    ) -> Result<(Vec<u8>, CacheOutcome)> {
        self.get_or_compile_code(&Code { name, source, options: &[], headers: super::USER_HEADERS }, arch)
    }

    fn get_or_compile_code(&self, source: &Code<'_>, arch: &str) -> Result<(Vec<u8>, CacheOutcome)> {
        let path = self.path(source, arch)?;
        if let Some(path) = &path {
            match std::fs::read(path) {
                Ok(file) => match verified_image(file) {
                    Some(image) => return Ok((image, CacheOutcome::Hit)),
                    None => tracing::warn!("ignoring a damaged cached kernel at {}", path.display()),
                },
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => tracing::debug!("cannot read cached kernel {}: {error}", path.display()),
            }
        }
        Ok((self.compile_and_store(source, arch, path.as_deref())?, CacheOutcome::Compiled))
    }

    /// Compiles `source` afresh, replacing any cached image.
    ///
    /// # Errors
    /// NVRTC missing or failing to compile the source.
    pub fn recompile(&self, source: &KernelSource, arch: &str) -> Result<Vec<u8>> {
        let code = Code::of(source);
        let path = self.path(&code, arch)?;
        self.compile_and_store(&code, arch, path.as_deref())
    }

    fn compile_and_store(&self, source: &Code<'_>, arch: &str, path: Option<&Path>) -> Result<Vec<u8>> {
        let image = nvrtc::compile_cubin_with_headers(
            source.name,
            source.source,
            arch,
            source.options,
            source.headers,
        )?;
        if let Some(path) = path
            && let Err(error) = write_atomically(path, &[&image[..], &Sha256::digest(&image)[..]].concat())
        {
            tracing::debug!("kernel cache not written ({}): {error}", path.display());
        }
        Ok(image)
    }

    /// Where the image of `source` for `arch` lives; `None` without a cache folder.
    fn path(&self, source: &Code<'_>, arch: &str) -> Result<Option<PathBuf>> {
        let Some(dir) = &self.dir else { return Ok(None) };
        let (major, minor) = nvrtc::version()?;
        let mut hash = Sha256::new();
        for part in [source.source, arch, &format!("nvrtc {major}.{minor}")]
            .into_iter()
            .chain(source.options.iter().copied())
            .chain(source.headers.iter().flat_map(|(name, text)| [*name, *text]))
        {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        let digest: String = hash.finalize()[..8].iter().map(|byte| format!("{byte:02x}")).collect();
        Ok(Some(dir.join(format!("{}-{arch}-{digest}.cubin", source.name))))
    }
}

/// What is compiled: a built-in [`KernelSource`] or a user's source (which may include
/// [`super::USER_HEADERS`]).
struct Code<'a> {
    name: &'a str,
    source: &'a str,
    options: &'a [&'a str],
    headers: &'a [(&'a str, &'a str)],
}

impl<'a> Code<'a> {
    fn of(source: &'a KernelSource) -> Code<'a> {
        Code { name: source.name, source: source.source, options: source.options, headers: &[] }
    }
}

/// The image in a cache file: the CUBIN followed by its SHA-256. A file whose digest does not
/// match (truncated, damaged, edited) is not handed to the driver, which trusts an image's
/// own lengths.
fn verified_image(mut file: Vec<u8>) -> Option<Vec<u8>> {
    let image_len = file.len().checked_sub(32)?;
    let digest = Sha256::digest(&file[..image_len]);
    if file[image_len..] != digest[..] || !file.starts_with(b"\x7fELF") {
        return None;
    }
    file.truncate(image_len);
    Some(file)
}

/// Writes `bytes` under a temporary name, syncs, then renames, so a crash never leaves a
/// partial file under the real name.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}
