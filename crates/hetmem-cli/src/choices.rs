//! Library enums as command-line values: `--backend`, `--strategy`, `--strategies` and
//! `--paths` list their names in `--help`, the man page and shell completions (each type is a
//! [`clap::ValueEnum`]), and are parsed by the library's own `FromStr`. The library stays the
//! one place that defines the names and the spellings it accepts besides them (`gpu` for
//! `cuda`, `zero_copy` or `Zero-Copy` for `zero-copy`).

use std::ffi::OsStr;
use std::marker::PhantomData;
use std::str::FromStr;

use clap::ValueEnum;
use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use hetmem::data::LoadMethod;
use hetmem::{BackendChoice, BackendKind, Strategy};
use hetmem_bench::link::{Direction, LinkPath};

/// `--backend`: where the work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend(pub BackendChoice);

/// `--strategy` and `--strategies`: how frames reach the blur.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyName(pub Strategy);

/// `--paths`: a way across the link that `bench link` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkPathName(pub LinkPath);

/// `--method` of `hetmem load` and `--methods` of `bench file`: how a file reaches the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadMethodName(pub LoadMethod);

static LOAD_METHODS: [LoadMethodName; LoadMethod::ALL.len()] = {
    let mut all = [LoadMethodName(LoadMethod::Auto); LoadMethod::ALL.len()];
    let mut at = 0;
    while at < LoadMethod::ALL.len() {
        all[at] = LoadMethodName(LoadMethod::ALL[at]);
        at += 1;
    }
    all
};

static BACKENDS: [Backend; 3] = [
    Backend(BackendChoice::Auto),
    Backend(BackendChoice::Only(BackendKind::Cpu)),
    Backend(BackendChoice::Only(BackendKind::Cuda)),
];

/// `auto` first, then the library's strategies in its order.
static STRATEGIES: [StrategyName; Strategy::ALL.len() + 1] = {
    let mut all = [StrategyName(Strategy::Auto); Strategy::ALL.len() + 1];
    let mut at = 0;
    while at < Strategy::ALL.len() {
        all[at + 1] = StrategyName(Strategy::ALL[at]);
        at += 1;
    }
    all
};

static LINK_PATHS: [LinkPathName; LinkPath::ALL.len()] = {
    let mut all = [LinkPathName(LinkPath::HostMemcpy); LinkPath::ALL.len()];
    let mut at = 0;
    while at < LinkPath::ALL.len() {
        all[at] = LinkPathName(LinkPath::ALL[at]);
        at += 1;
    }
    all
};

impl ValueEnum for Backend {
    fn value_variants<'a>() -> &'a [Self] {
        &BACKENDS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let (name, help) = match self.0 {
            BackendChoice::Auto => ("auto", "the first GPU, else the CPU"),
            BackendChoice::Only(BackendKind::Cpu) => ("cpu", "the CPU, even where a GPU is present"),
            BackendChoice::Only(BackendKind::Cuda) => {
                ("cuda", "an NVIDIA GPU, or an error saying why none can run")
            }
        };
        Some(PossibleValue::new(name).help(help))
    }
}

impl ValueEnum for StrategyName {
    fn value_variants<'a>() -> &'a [Self] {
        &STRATEGIES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        // Written once, in the library's strategy table.
        let help = self.0.summary();
        Some(PossibleValue::new(self.0.name()).help(help))
    }
}

impl ValueEnum for LinkPathName {
    fn value_variants<'a>() -> &'a [Self] {
        &LINK_PATHS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self.0.direction() {
            Direction::H2d => "host to device",
            Direction::D2h => "device to host",
            Direction::Both => "both ways at once",
            Direction::Host => "host to host (no GPU)",
            Direction::Device => "within device memory (no link)",
        };
        Some(PossibleValue::new(self.0.name()).help(help))
    }
}

impl ValueEnum for LoadMethodName {
    fn value_variants<'a>() -> &'a [Self] {
        &LOAD_METHODS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self.0 {
            LoadMethod::Auto => "staged where the page cache holds the files, else staged-direct",
            LoadMethod::Staged => "read through the page cache into pinned staging, copied",
            LoadMethod::StagedDirect => "read with O_DIRECT into pinned staging, copied",
            LoadMethod::Windows => {
                "the page cache's pages registered in place (the driver pins each page), copied; the files must not shrink meanwhile"
            }
        };
        Some(PossibleValue::new(self.0.name()).help(help))
    }
}

impl FromStr for LoadMethodName {
    type Err = hetmem::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(LoadMethodName)
    }
}

impl FromStr for Backend {
    type Err = hetmem::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Backend(text.parse()?))
    }
}

impl FromStr for StrategyName {
    type Err = hetmem::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(StrategyName)
    }
}

impl FromStr for LinkPathName {
    type Err = hetmem::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse().map(LinkPathName)
    }
}

/// Parses a value with the library's `FromStr` and lists the [`ValueEnum`]'s names: clap's
/// own enum parser would match the listed names only. Given to each argument as its
/// `value_parser` (clap infers its own enum parser for a `ValueEnum`).
#[derive(Debug)]
pub struct ByLibrary<E>(PhantomData<fn() -> E>);

/// The parser of `E` values by the library's names.
pub fn by_library<E>() -> ByLibrary<E> {
    ByLibrary(PhantomData)
}

impl<E> Clone for ByLibrary<E> {
    fn clone(&self) -> Self {
        ByLibrary(PhantomData)
    }
}

impl<E> TypedValueParser for ByLibrary<E>
where
    E: ValueEnum + FromStr + Send + Sync + 'static,
{
    type Value = E;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<E, clap::Error> {
        if let Some(parsed) = value.to_str().and_then(|text| text.parse().ok()) {
            return Ok(parsed);
        }
        // clap's own wording for a value that is not one of the choices, with the choices.
        let mut error = clap::Error::new(ErrorKind::InvalidValue).with_cmd(cmd);
        let arg = arg.map_or_else(|| "...".to_string(), ToString::to_string);
        let names = E::value_variants()
            .iter()
            .filter_map(ValueEnum::to_possible_value)
            .map(|value| value.get_name().to_string())
            .collect();
        error.insert(ContextKind::InvalidArg, ContextValue::String(arg));
        error.insert(ContextKind::InvalidValue, ContextValue::String(value.to_string_lossy().into_owned()));
        error.insert(ContextKind::ValidValue, ContextValue::Strings(names));
        Err(error)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(E::value_variants().iter().filter_map(ValueEnum::to_possible_value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each listed name is one the library parses, to the value it is listed for: the list
    /// cannot drift from the library's names.
    fn names_parse_back<E: ValueEnum + FromStr + PartialEq + std::fmt::Debug>() -> Vec<String> {
        E::value_variants()
            .iter()
            .map(|value| {
                let name = value.to_possible_value().expect("every value is listed").get_name().to_string();
                let parsed = name.parse::<E>().ok();
                assert_eq!(parsed.as_ref(), Some(value), "{name}");
                name
            })
            .collect()
    }

    #[test]
    fn every_listed_name_parses_back_through_the_library() {
        assert_eq!(names_parse_back::<Backend>(), ["auto", "cpu", "cuda"]);
        let strategies = names_parse_back::<StrategyName>();
        assert_eq!(strategies.len(), Strategy::ALL.len() + 1);
        assert_eq!(strategies[0], "auto");
        assert!(strategies.contains(&"pinned-async".to_string()), "{strategies:?}");
        let paths = names_parse_back::<LinkPathName>();
        assert_eq!(paths.len(), LinkPath::ALL.len());
        assert!(paths.contains(&"zero_copy_read".to_string()), "{paths:?}");
        assert_eq!(names_parse_back::<LoadMethodName>(), ["auto", "staged", "staged-direct", "windows"]);
    }

    #[test]
    fn the_library_s_other_spellings_are_taken() {
        let parser = by_library::<StrategyName>();
        let cmd = clap::Command::new("test");
        for (given, want) in [("Zero_Copy", Strategy::ZeroCopy), ("PINNED-ASYNC", Strategy::PinnedAsync)] {
            assert_eq!(parser.parse_ref(&cmd, None, OsStr::new(given)).unwrap(), StrategyName(want));
        }
        let backend = by_library::<Backend>();
        assert_eq!(
            backend.parse_ref(&cmd, None, OsStr::new("gpu")).unwrap(),
            Backend(BackendChoice::Only(BackendKind::Cuda))
        );
        let error = parser.parse_ref(&cmd, None, OsStr::new("teleport")).unwrap_err().to_string();
        assert!(error.contains("invalid value 'teleport'") && error.contains("zero-copy"), "{error}");
    }
}
