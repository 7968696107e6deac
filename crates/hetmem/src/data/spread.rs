//! A checkpoint spread over several devices: each chosen tensor given one device (by name, or
//! in about equal runs of bytes), every device loading its own tensors on a thread of its own
//! through its own [`FileStream`], so the devices' copies overlap and each file byte is read
//! once, by the device that keeps it.
//!
//! Each device has its own pinned staging ring (pinned in its own context): one ring shared
//! by all would need portable memory and one reader pool feeding every device's queue, which
//! buys nothing while the readers, not the rings, bound the rate.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{Checkpoint, FileStream, LoadPlan, LoadedTensors, ShardSpec, StreamOptions, TensorFilter};
use crate::{Device, Error, Queue, Result};

/// Which device each tensor of a spread load goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The tensors in the files' order, cut into one run per device of about equal bytes: a
    /// tensor goes to the device whose share holds its middle byte.
    Balanced,
    /// Each tensor's device, as an index into the devices given; every chosen tensor must
    /// be named.
    ByName(BTreeMap<String, usize>),
}

/// A spread load's result: each device's tensors in one allocation of its own.
#[derive(Debug)]
pub struct SpreadTensors {
    /// `(index into the devices given, its tensors)`, for each device given at least one
    /// tensor, in the devices' order.
    pub parts: Vec<(usize, LoadedTensors)>,
    /// Bytes read over all devices.
    pub bytes: u64,
    /// Wall seconds from the first read to the last copy's end, over all devices.
    pub seconds: f64,
}

impl SpreadTensors {
    /// All devices' bytes over the wall time, GB/s.
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }

    /// The device index a tensor went to and its entry there.
    pub fn find(&self, name: &str) -> Option<(usize, &LoadedTensors)> {
        self.parts.iter().find(|(_, part)| part.tensors.contains_key(name)).map(|(at, part)| (*at, part))
    }
}

/// [`Placement::Balanced`]'s rule, for tensors of `bytes` each in the files' order over
/// `devices` devices (at least 1): each tensor's device index, the device whose share of about
/// equal bytes holds the tensor's middle byte. (The Python package's `device_map="balanced"`
/// asks this too.)
pub fn balanced_devices(bytes: &[usize], devices: usize) -> Vec<usize> {
    let devices = devices.max(1) as u128;
    let total: u128 = bytes.iter().map(|&bytes| bytes as u128).sum();
    let mut start = 0u128;
    bytes
        .iter()
        .map(|&bytes| {
            let middle = 2 * start + bytes as u128;
            start += bytes as u128;
            if total == 0 {
                0
            } else {
                // Below `devices` (middle < 2 * total), so the cast back cannot lose.
                (middle * devices / (2 * total)).min(devices - 1) as usize
            }
        })
        .collect()
}

/// Each chosen tensor's device index: `names_bytes` (name, bytes) in the files' order.
fn assign(names_bytes: &[(String, usize)], devices: usize, placement: &Placement) -> Result<Vec<usize>> {
    match placement {
        Placement::Balanced => {
            let bytes: Vec<usize> = names_bytes.iter().map(|(_, bytes)| *bytes).collect();
            Ok(balanced_devices(&bytes, devices))
        }
        Placement::ByName(map) => names_bytes
            .iter()
            .map(|(name, _)| match map.get(name) {
                Some(&at) if at < devices => Ok(at),
                Some(&at) => Err(Error::invalid(
                    "spread load",
                    format!("tensor {name:?} is placed on device {at}, but {devices} devices were given"),
                )),
                None => Err(Error::invalid(
                    "spread load",
                    format!("tensor {name:?} has no device; place every chosen tensor, or choose fewer"),
                )),
            })
            .collect(),
    }
}

/// Loads the tensors `filter` chooses (each cut to `shard`'s slice where given) onto
/// `devices`, as `placement` says, each device through its own [`FileStream`] with `options`
/// on a thread of its own. `progress` hears the bytes read so far over all devices, from
/// the loading threads. Nothing is returned unless every device's tensors arrived.
///
/// ```no_run
/// use hetmem::Device;
/// use hetmem::backend::{BackendChoice, DeviceSelection};
/// use hetmem::data::{Checkpoint, Placement, StreamOptions, TensorFilter, load_spread};
/// let devices = Device::open_selection(BackendChoice::Auto, &DeviceSelection::All)?;
/// let checkpoint = Checkpoint::open("model.safetensors.index.json")?;
/// let spread = load_spread(&checkpoint, &TensorFilter::All, None, &devices, &Placement::Balanced,
///     StreamOptions::default(), &|_| {})?;
/// println!("{:.1} GB/s over {} devices", spread.gb_per_s(), spread.parts.len());
/// # Ok::<(), hetmem::Error>(())
/// ```
///
/// # Errors
/// No devices; a tensor placed on no device or on one not given; as for
/// [`Checkpoint::plan_with`]; a device's share larger than its free memory (before anything
/// is read); as for [`FileStream::new`] and [`FileStream::load_plan`] (the first device's
/// error in the devices' order).
pub fn load_spread(
    checkpoint: &Checkpoint,
    filter: &TensorFilter,
    shard: Option<&ShardSpec>,
    devices: &[Device],
    placement: &Placement,
    options: StreamOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SpreadTensors> {
    if devices.is_empty() {
        return Err(Error::invalid("spread load", "no devices given; give at least one"));
    }
    let whole = checkpoint.plan_with(filter, shard)?;
    let mut in_order: Vec<(String, usize, usize)> =
        whole.tensors().iter().map(|(name, entry)| (name.clone(), entry.bytes, entry.offset)).collect();
    in_order.sort_by_key(|(_, _, offset)| *offset);
    let names_bytes: Vec<(String, usize)> =
        in_order.into_iter().map(|(name, bytes, _)| (name, bytes)).collect();
    let places = assign(&names_bytes, devices.len(), placement)?;
    let mut groups: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for ((name, _), at) in names_bytes.into_iter().zip(places) {
        groups.entry(at).or_default().insert(name);
    }
    let plans: Vec<(usize, LoadPlan)> = groups
        .into_iter()
        .map(|(at, names)| Ok((at, checkpoint.plan_with(&TensorFilter::Names(names), shard)?)))
        .collect::<Result<_>>()?;
    for (at, plan) in &plans {
        check_fits(&devices[*at], plan)?;
    }
    let done: Vec<AtomicU64> = plans.iter().map(|_| AtomicU64::new(0)).collect();
    let began = Instant::now();
    let loaded: Vec<Result<LoadedTensors>> = std::thread::scope(|scope| {
        let workers: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(slot, (at, plan))| {
                let (device, done) = (&devices[*at], &done);
                scope.spawn(move || {
                    let record = |bytes: u64| {
                        done[slot].store(bytes, Ordering::Relaxed);
                        progress(done.iter().map(|each| each.load(Ordering::Relaxed)).sum());
                    };
                    load_one(device, plan, options, &record)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::invalid("spread load", "a loading thread panicked")))
            })
            .collect()
    });
    let seconds = began.elapsed().as_secs_f64();
    let mut parts = Vec::with_capacity(plans.len());
    for ((at, _), part) in plans.iter().zip(loaded) {
        parts.push((*at, part?));
    }
    let bytes = parts.iter().map(|(_, part)| part.report.bytes).sum();
    Ok(SpreadTensors { parts, bytes, seconds })
}

/// `plan` into a new allocation of `device`, by a stream of its own.
fn load_one(
    device: &Device,
    plan: &LoadPlan,
    options: StreamOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<LoadedTensors> {
    let queue = Queue::new(device)?;
    FileStream::new(device, &queue, options)?.load_plan_to_device(plan, progress)
}

/// Refuses a device's share larger than its free memory, before anything is allocated.
fn check_fits(device: &Device, plan: &LoadPlan) -> Result<()> {
    let Some(free) = device.free_device_memory()? else { return Ok(()) };
    if plan.total_bytes() as u64 > free {
        return Err(Error::invalid(
            "spread load",
            format!(
                "{} bytes of tensors placed on {} do not fit in its {free} bytes free; place fewer there, or \
                 free device memory",
                plan.total_bytes(),
                device.name()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(list: &[usize]) -> Vec<(String, usize)> {
        list.iter().enumerate().map(|(at, bytes)| (format!("t{at}"), *bytes)).collect()
    }

    #[test]
    fn balanced_cuts_runs_of_about_equal_bytes_in_file_order() {
        assert_eq!(assign(&sizes(&[10, 10, 10, 10]), 2, &Placement::Balanced).unwrap(), [0, 0, 1, 1]);
        // The big one's middle byte lies in the second half.
        assert_eq!(assign(&sizes(&[1, 1, 100, 1]), 2, &Placement::Balanced).unwrap(), [0, 0, 1, 1]);
        assert_eq!(assign(&sizes(&[0, 0]), 3, &Placement::Balanced).unwrap(), [0, 0]);
        assert_eq!(assign(&sizes(&[5; 6]), 3, &Placement::Balanced).unwrap(), [0, 0, 1, 1, 2, 2]);
        // Sizes near the address space's end do not wrap the arithmetic.
        assert_eq!(assign(&sizes(&[usize::MAX, usize::MAX]), 2, &Placement::Balanced).unwrap(), [0, 1]);
    }

    #[test]
    fn by_name_refuses_a_missing_name_or_a_device_not_given() {
        let map = |pairs: &[(&str, usize)]| {
            Placement::ByName(pairs.iter().map(|(name, at)| (name.to_string(), *at)).collect())
        };
        assert_eq!(assign(&sizes(&[1, 2]), 2, &map(&[("t0", 1), ("t1", 0)])).unwrap(), [1, 0]);
        let missing = assign(&sizes(&[1, 2]), 2, &map(&[("t0", 1)])).unwrap_err().to_string();
        assert!(missing.contains("\"t1\" has no device"), "{missing}");
        let beyond = assign(&sizes(&[1]), 2, &map(&[("t0", 2)])).unwrap_err().to_string();
        assert!(beyond.contains("device 2, but 2 devices"), "{beyond}");
    }
}
