//! The benchmarks' options from the command line.

use anyhow::{Context as _, bail};
use hetmem::Strategy;
use hetmem::data::StreamOptions;
use hetmem_bench::file::FileOptions;
use hetmem_bench::link::LinkOptions;
use hetmem_bench::sizes;

use super::args::What;
use crate::choices::{LinkPathName, StrategyName};

/// The link options from the command line: the quick or full set, with sizes, paths and
/// repeats replaced where given.
pub(super) fn link_options(
    quick: bool,
    sizes_given: &[String],
    latency_given: &[String],
    paths: &[LinkPathName],
    repeats: Option<u64>,
) -> anyhow::Result<LinkOptions> {
    let mut options = if quick { LinkOptions::quick() } else { LinkOptions::full() };
    for (flag, given, example) in [
        ("--sizes", sizes_given, "4KiB,1MiB,1GiB (4 KiB to 1 GiB)"),
        ("--latency-sizes", latency_given, "4,64KiB (4 B to 64 KiB), or none"),
    ] {
        no_empty_items(flag, given, example)?;
    }
    if !sizes_given.is_empty() {
        options.sizes = sizes_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if latency_given.iter().any(|text| text == "none") {
        options.latency_sizes.clear();
    } else if !latency_given.is_empty() {
        options.latency_sizes =
            latency_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if !paths.is_empty() {
        options.paths = paths.iter().map(|path| path.0).collect();
    }
    if let Some(repeats) = repeats {
        options.repeats = repeats as usize;
    }
    options.validate()?;
    Ok(options)
}

/// The file benchmark's options from the command line.
pub(super) fn file_options(what: &What) -> anyhow::Result<FileOptions> {
    let What::File {
        dir,
        quick,
        sizes: sizes_given,
        methods,
        repeats,
        keep,
        drop_caches,
        threads,
        chunk,
        depth,
        storage_streams,
    } = what
    else {
        unreachable!("called for bench file only")
    };
    no_empty_items("--sizes", sizes_given, "1GiB,8GiB")?;
    let mut options = if *quick { FileOptions::quick(dir) } else { FileOptions::full(dir) };
    if !sizes_given.is_empty() {
        options.sizes = sizes_given.iter().map(|text| sizes::parse(text)).collect::<Result<_, _>>()?;
    }
    if !methods.is_empty() {
        options.methods = methods.iter().map(|method| method.0).collect();
    }
    options.repeats = *repeats as usize;
    options.keep = *keep;
    options.drop_caches = *drop_caches;
    options.storage_streams = *storage_streams as usize;
    no_empty_items("--chunk", chunk, "4MiB,16MiB")?;
    let default = StreamOptions::default();
    let threads: Vec<usize> = if threads.is_empty() {
        vec![default.threads]
    } else {
        threads.iter().map(|&n| n as usize).collect()
    };
    let chunks = if chunk.is_empty() {
        vec![default.chunk_bytes]
    } else {
        chunk.iter().map(|text| sizes::parse(text).context("--chunk")).collect::<anyhow::Result<Vec<_>>>()?
    };
    options.tunings = threads
        .iter()
        .flat_map(|&threads| {
            chunks.iter().map(move |&chunk_bytes| StreamOptions {
                threads,
                chunk_bytes,
                ring_depth: depth.map_or(2 * threads, |depth| depth as usize),
                ..default
            })
        })
        .collect();
    Ok(options)
}

/// `--strategies`, as the library's.
pub(super) fn strategies_of(names: &[StrategyName]) -> Vec<Strategy> {
    names.iter().map(|name| name.0).collect()
}

/// Refuses a list option given empty (`--sizes ""`) or with an empty item (`4KiB,,1MiB`),
/// which would otherwise read as a size or name that is not one.
fn no_empty_items(flag: &str, given: &[String], example: &str) -> anyhow::Result<()> {
    if given.iter().all(|item| item.trim().is_empty()) && !given.is_empty() {
        bail!(
            "{flag} is empty: give a comma-separated list such as {example}, or leave {flag} out for the default"
        );
    }
    if given.iter().any(|item| item.trim().is_empty()) {
        bail!("{flag} {} has an empty item: give a comma-separated list such as {example}", given.join(","));
    }
    Ok(())
}
