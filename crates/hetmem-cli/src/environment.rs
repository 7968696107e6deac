//! The environment variables the CLI reads for the library. The library reads none of them:
//! each is turned here into the option it stands for. (`HETMEM_BACKEND` is read by
//! clap, `HETMEM_LOG` by the log setup in main.rs.)

use std::ffi::OsString;

use anyhow::bail;
use hetmem::kernels::KernelCache;
use hetmem::ops::gaussian::{MAX_SEGMENTS, Segments};

/// Where compiled kernels and the link profiles `hetmem bench link` measures are cached
/// (default: the user's cache folder, `~/.cache/hetmem`).
pub const CACHE_DIR_ENV: &str = "HETMEM_CACHE_DIR";
/// How many segments the PinnedAsync strategy cuts a frame into (1 to 64; default about one
/// per MiB, 1 to 16).
pub const SEGMENTS_ENV: &str = "HETMEM_SEGMENTS";

/// The kernel cache `HETMEM_CACHE_DIR` names, else the library's default.
pub fn kernel_cache() -> KernelCache {
    kernel_cache_in(std::env::var_os(CACHE_DIR_ENV))
}

fn kernel_cache_in(dir: Option<OsString>) -> KernelCache {
    match dir.filter(|dir| !dir.is_empty()) {
        Some(dir) => KernelCache::at(dir),
        None => KernelCache::user_default(),
    }
}

/// The segment count `HETMEM_SEGMENTS` asks for; automatic when it is unset.
///
/// # Errors
/// A value that is not a whole number from 1 to 64 (the message the library gave when it read
/// the variable itself).
pub fn segments() -> anyhow::Result<Segments> {
    segments_from(std::env::var(SEGMENTS_ENV).ok().as_deref())
}

fn segments_from(value: Option<&str>) -> anyhow::Result<Segments> {
    let Some(value) = value else { return Ok(Segments::Auto) };
    match value.trim().parse::<usize>() {
        Ok(count) if (1..=MAX_SEGMENTS).contains(&count) => Ok(Segments::Count(count)),
        _ => bail!(
            "invalid {SEGMENTS_ENV}: `{value}`: give a whole number from 1 to {MAX_SEGMENTS}, or unset it"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_unset_are_automatic_and_a_count_is_taken_in_range() {
        assert_eq!(segments_from(None).unwrap(), Segments::Auto);
        assert_eq!(segments_from(Some("1")).unwrap(), Segments::Count(1));
        assert_eq!(segments_from(Some(" 64\n")).unwrap(), Segments::Count(64));
        for bad in ["0", "65", "six", "", "-1"] {
            let message = segments_from(Some(bad)).unwrap_err().to_string();
            assert_eq!(
                message,
                format!("invalid HETMEM_SEGMENTS: `{bad}`: give a whole number from 1 to 64, or unset it")
            );
        }
    }

    #[test]
    fn the_cache_folder_given_wins_and_an_empty_one_is_unset() {
        let given = kernel_cache_in(Some("/tmp/hetmem-kernels".into()));
        assert_eq!(given.dir(), Some(std::path::Path::new("/tmp/hetmem-kernels")));
        let default = KernelCache::user_default();
        assert_eq!(kernel_cache_in(Some("".into())).dir(), default.dir());
        assert_eq!(kernel_cache_in(None).dir(), default.dir());
    }
}
