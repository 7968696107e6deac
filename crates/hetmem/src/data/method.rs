//! How a [`FileStream`](super::FileStream) moves bytes, its tunables and its report, and how
//! [`LoadMethod::Auto`] chooses.

use super::source::ReadMode;
use crate::error::{Error, Result};

/// How a [`FileStream`](super::FileStream) moves a file's bytes to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "kebab-case"))]
pub enum LoadMethod {
    /// Measure first: how much of the files the page cache holds (see
    /// [`resident_fraction`](super::resident_fraction)), then [`LoadMethod::Staged`] where it holds them, else
    /// [`LoadMethod::StagedDirect`].
    #[default]
    Auto,
    /// Read through the page cache into pinned staging buffers, then copied.
    Staged,
    /// Read with `O_DIRECT` into pinned staging buffers (past the page cache: no second copy on
    /// the CPU, no cache pollution), then copied; through the page cache where the filesystem
    /// refuses `O_DIRECT` (tmpfs), as the report says.
    StagedDirect,
    /// The page cache's pages mapped and registered in place, a window per piece, and copied
    /// (or read by the stage) from there: no copy on the CPU, but each page is pinned by the
    /// driver, which costs more than copying it on the H200 machine (see `auto_route`); never
    /// chosen by [`LoadMethod::Auto`]. Needs [`FileStream::allow_windows`](super::FileStream::allow_windows).
    Windows,
}

impl LoadMethod {
    /// Every method, [`LoadMethod::Auto`] first.
    pub const ALL: [LoadMethod; 4] =
        [LoadMethod::Auto, LoadMethod::Staged, LoadMethod::StagedDirect, LoadMethod::Windows];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            LoadMethod::Auto => "auto",
            LoadMethod::Staged => "staged",
            LoadMethod::StagedDirect => "staged-direct",
            LoadMethod::Windows => "windows",
        }
    }
}

impl std::fmt::Display for LoadMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LoadMethod {
    type Err = Error;

    /// A method by its [`LoadMethod::name`], in any case, `_` for `-`.
    fn from_str(text: &str) -> Result<LoadMethod> {
        let wanted = text.trim().to_ascii_lowercase().replace('_', "-");
        LoadMethod::ALL.into_iter().find(|method| method.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = LoadMethod::ALL.iter().map(|method| method.name()).collect();
            Error::invalid("load method", format!("{text:?}: expected one of {}", names.join(", ")))
        })
    }
}

/// The tunables of a [`FileStream`](super::FileStream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamOptions {
    /// How the bytes move. Default: [`LoadMethod::Auto`].
    pub method: LoadMethod,
    /// Reader threads (each with one read or window in flight). Default: the CPUs, at most 12.
    /// On the H200 machine (16 CPUs, a 54-55 GB/s link), a warm 8 GiB checkpoint loaded best
    /// with 12 threads of 4 MiB pieces and a 96 MiB ring, in two calls of one day: 50.0-50.8
    /// GB/s when KvikIO's best was 43.6, against 31-48 for 8 x 8 MiB; 16 threads ran at 43-51.
    pub threads: usize,
    /// The bytes of one piece: one read, one staging buffer, one copy. A multiple of 4096, at
    /// most 1 GiB. Default: 4 MiB. Smaller pieces keep the ring (depth x chunk) inside the
    /// CPU's last-level cache, where the copy engine reads what a reader has just written; on
    /// the H200 machine's Xeon a ring past about 100 MiB cost a quarter to a third of the rate
    /// (8 threads x 8 MiB: 51 GB/s with 10 buffers, 33-36 with 32), and 2 MiB pieces cost
    /// their per-piece overhead.
    pub chunk_bytes: usize,
    /// Staging buffers (or windows) in the ring: pieces being read, waiting or being copied.
    /// Default: twice the threads (with fewer than about threads + 2, readers wait for
    /// buffers: 8 threads x 8 MiB with 8 buffers ran at 43 GB/s, with 10 at 51).
    pub ring_depth: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = cpus.min(12);
        StreamOptions { method: LoadMethod::Auto, threads, chunk_bytes: 4 << 20, ring_depth: 2 * threads }
    }
}

/// What a load or a stream did.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LoadReport {
    /// The method that ran (never [`LoadMethod::Auto`]).
    pub method: LoadMethod,
    /// How the bytes came off storage.
    pub read_mode: ReadMode,
    /// Why `O_DIRECT` was asked for and not used, when it was not.
    pub direct_refused: Option<String>,
    /// Why [`LoadMethod::Auto`] chose `method`, when it chose.
    pub auto_reason: Option<String>,
    /// The bytes moved.
    pub bytes: u64,
    /// From the first read to the last copy's (or stage's) completion.
    pub seconds: f64,
    /// Making the staging ring (pinning), before `seconds`: 0 when an earlier run made it (or
    /// none was needed).
    pub setup_seconds: f64,
}

impl LoadReport {
    /// Bytes per second over `seconds`, in GB/s (10^9).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-12) / 1e9
    }
}

/// What the method resolves to for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Read into staging, with `O_DIRECT` or through the page cache.
    Staged {
        /// Asks for `O_DIRECT`.
        direct: bool,
    },
    /// Mapped and registered in place.
    Windows,
}

/// The fraction of the files cached above which [`LoadMethod::Auto`] reads them from the
/// page cache rather than past it.
const WARM_FRACTION: f64 = 0.9;

/// [`LoadMethod::Auto`]'s choice from the page cache's share of the files, and why.
///
/// Cached files are read from the cache into staging by several threads, not registered in
/// place: on the H200 machine registering 4 KiB pages ran at 1.9 GB/s per thread (1 GiB in
/// 572 ms, bench/results/2026-11-29-h200-handoff) where one thread copies from the cache at
/// 7.1 GB/s; a window pays off only when it is read many times after one registration.
/// Uncached files are read with `O_DIRECT`: no second copy, and the cache is not filled
/// with bytes read once.
pub(super) fn auto_route(resident: Option<f64>) -> (Route, String) {
    match resident {
        Some(fraction) if fraction >= WARM_FRACTION => (
            Route::Staged { direct: false },
            format!("{:.0}% of the file is in the page cache: read from there", fraction * 100.0),
        ),
        Some(fraction) => (
            Route::Staged { direct: true },
            format!(
                "{:.0}% of the file is in the page cache: read from storage with O_DIRECT",
                fraction * 100.0
            ),
        ),
        None => (
            Route::Staged { direct: true },
            "the kernel cannot say what is cached: read with O_DIRECT".into(),
        ),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_round_trip() {
        for method in LoadMethod::ALL {
            assert_eq!(method.name().parse::<LoadMethod>().unwrap(), method);
        }
        assert_eq!("Staged_Direct".parse::<LoadMethod>().unwrap(), LoadMethod::StagedDirect);
        let error = "teleport".parse::<LoadMethod>().unwrap_err().to_string();
        assert!(error.contains("\"teleport\"") && error.contains("staged-direct"), "{error}");
    }

    #[test]
    fn auto_reads_cached_files_from_the_cache_and_the_others_past_it() {
        assert_eq!(auto_route(Some(1.0)).0, Route::Staged { direct: false });
        assert_eq!(auto_route(Some(0.5)).0, Route::Staged { direct: true });
        assert_eq!(auto_route(None).0, Route::Staged { direct: true });
    }
}
