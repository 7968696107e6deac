//! Which GPUs a run uses: `--devices 0,1` or `--devices all`.
//!
//! [`DeviceSelection`] is what a user wrote, parsed but not yet checked against the machine;
//! [`DeviceSelection::resolve`] checks it against the GPUs present (every ordinal exists, none
//! twice) and [`super::Device::open_selection`] opens them.

use std::fmt;
use std::str::FromStr;

use crate::backend::error::{BackendError, Result};

/// The GPUs a user asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    /// Every GPU the driver sees (the CPU where there is none).
    #[default]
    All,
    /// These ordinals, in this order, each once.
    Ordinals(Vec<usize>),
}

impl FromStr for DeviceSelection {
    type Err = BackendError;

    /// `all`, or ordinals separated by commas (`0,1`), each at most once.
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        let mut ordinals = Vec::new();
        for part in text.split(',').map(str::trim) {
            let ordinal: usize = part.parse().map_err(|_| {
                BackendError::invalid(
                    "device selection",
                    format!("{part:?} in {text:?} is not a GPU number: write `all` or numbers like `0,1`"),
                )
            })?;
            if ordinals.contains(&ordinal) {
                return Err(BackendError::invalid(
                    "device selection",
                    format!("GPU {ordinal} is named twice in {text:?}: name each GPU once"),
                ));
            }
            ordinals.push(ordinal);
        }
        Ok(DeviceSelection::Ordinals(ordinals))
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelection::All => f.write_str("all"),
            DeviceSelection::Ordinals(ordinals) => {
                let names: Vec<String> = ordinals.iter().map(usize::to_string).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

impl DeviceSelection {
    /// The ordinals chosen among the GPUs present, `present[i]` being GPU i's name.
    ///
    /// # Errors
    /// [`BackendError::NoSuchDevices`], listing the GPUs present, when an ordinal is out of range or
    /// when `all` finds none.
    pub fn resolve(&self, present: &[String]) -> Result<Vec<usize>> {
        let missing =
            |asked: String| BackendError::NoSuchDevices { asked, present: describe_present(present) };
        match self {
            DeviceSelection::All if present.is_empty() => Err(missing("all".to_string())),
            DeviceSelection::All => Ok((0..present.len()).collect()),
            DeviceSelection::Ordinals(ordinals) => {
                let absent: Vec<String> = ordinals
                    .iter()
                    .filter(|&&ordinal| ordinal >= present.len())
                    .map(usize::to_string)
                    .collect();
                if absent.is_empty() { Ok(ordinals.clone()) } else { Err(missing(absent.join(","))) }
            }
        }
    }
}

/// `0 (NVIDIA H200), 1 (NVIDIA H200)`, or `none`.
pub(crate) fn describe_present(present: &[String]) -> String {
    if present.is_empty() {
        return "none".to_string();
    }
    let listed: Vec<String> =
        present.iter().enumerate().map(|(ordinal, name)| format!("{ordinal} ({name})")).collect();
    listed.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_gpus() -> Vec<String> {
        vec!["NVIDIA H200".to_string(), "NVIDIA H100".to_string()]
    }

    #[test]
    fn all_and_lists_parse() {
        assert_eq!(" ALL ".parse::<DeviceSelection>().unwrap(), DeviceSelection::All);
        assert_eq!("1, 0".parse::<DeviceSelection>().unwrap(), DeviceSelection::Ordinals(vec![1, 0]));
        assert_eq!("3".parse::<DeviceSelection>().unwrap().to_string(), "3");
        assert_eq!("2,1".parse::<DeviceSelection>().unwrap().to_string(), "2,1");
    }

    #[test]
    fn duplicates_and_words_are_refused() {
        let twice = "0,1,0".parse::<DeviceSelection>().unwrap_err().to_string();
        assert!(twice.contains("GPU 0 is named twice"), "{twice}");
        for bad in ["", "0,", "gpu1", "-1", "0;1"] {
            let error = bad.parse::<DeviceSelection>().unwrap_err();
            assert!(
                matches!(error, BackendError::InvalidArgument { what: "device selection", .. }),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn resolving_keeps_the_order_and_all_takes_every_gpu() {
        let present = two_gpus();
        assert_eq!(DeviceSelection::All.resolve(&present).unwrap(), vec![0, 1]);
        assert_eq!(DeviceSelection::Ordinals(vec![1, 0]).resolve(&present).unwrap(), vec![1, 0]);
        assert_eq!(DeviceSelection::Ordinals(vec![1]).resolve(&present).unwrap(), vec![1]);
    }

    #[test]
    fn out_of_range_ordinals_are_refused_listing_the_gpus_present() {
        let error = DeviceSelection::Ordinals(vec![0, 2, 5]).resolve(&two_gpus()).unwrap_err();
        assert!(matches!(&error, BackendError::NoSuchDevices { asked, .. } if asked == "2,5"), "{error}");
        assert_eq!(
            error.to_string(),
            "GPU 2,5 asked for, but the GPUs present are: 0 (NVIDIA H200), 1 (NVIDIA H100)"
        );
        let none = DeviceSelection::All.resolve(&[]).unwrap_err().to_string();
        assert_eq!(none, "GPU all asked for, but the GPUs present are: none");
    }
}
