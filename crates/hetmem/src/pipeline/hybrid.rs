//! [`Strategy::Hybrid`] as an instance of placement: a filter or ring declares one slot's
//! frame buffers (each read or written once per frame, in order) and its stage's constant data
//! (read by every block of every frame, [`Stage::constants`]) to a [`Placer`] under a
//! device-memory budget, and each slot places its buffers by the [`Placement`], which the
//! filter or ring keeps with its reasons.
//!
//! By the placer's rule a frame stays mapped (streamed once, device memory would save no link
//! bytes), and a constant buffer goes to device memory when its reads save link bytes and it
//! fits; the other strategies place constant data by their own definition
//! ([`constant_places`]).

use super::Strategy;
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::placement::{AccessPattern, BufferUse, Placement, Placer, ProfileCache, SourcedProfile, Where};
use crate::stage::{ConstantMemory, ConstantUse, FrameLayout, Stage};

/// Where each of the stage's `constants` goes by `strategy`: mapped by zero-copy (which keeps
/// nothing in device memory), where `placement` decided by hybrid, and in device memory by the
/// strategies that put frames there (the CPU strategy ignores the places).
pub(crate) fn constant_places(
    strategy: Strategy,
    constants: &[ConstantUse],
    placement: Option<&Placement>,
) -> Vec<Where> {
    constants
        .iter()
        .map(|constant| match (strategy.traits().map(|traits| traits.constants), placement) {
            (Some(ConstantMemory::Mapped), _) => Where::Mapped,
            (Some(ConstantMemory::Placed), Some(placement)) => {
                placement.place_of(&constant.name).unwrap_or(Where::Mapped)
            }
            _ => Where::Device,
        })
        .collect()
}

/// By the hybrid strategy, the placement of one slot of `stage` on `device`, within `budget`
/// bytes of device memory (`None`: what the device has free now, shared by `slots` slots),
/// from the link profile measured for this GPU ([`ProfileCache::hetmem_default`]), else the
/// built-in one, with the caller's `overrides` ([`Placer::force`]). `None` by the other
/// strategies, which place by definition.
///
/// # Errors
/// A device without a GPU (the hybrid strategy is refused there before), its free memory
/// cannot be read, or an override the hybrid strategy cannot honour ([`check_overrides`]) or
/// the placer refuses (an undeclared name, forced buffers beyond the budget).
pub(crate) fn placement_for<S: Stage>(
    strategy: Strategy,
    device: &Device,
    stage: &S,
    budget: Option<u64>,
    slots: usize,
    overrides: &[(&str, Where)],
) -> Result<Option<Placement>> {
    if strategy.traits().map(|traits| traits.constants) != Some(ConstantMemory::Placed) {
        return Ok(None);
    }
    check_overrides(stage.inputs().len(), stage.outputs().len(), overrides)?;
    let Some(gpu) = device.as_cuda() else {
        return Err(Error::NeedsGpu {
            what: "the hybrid strategy".into(),
            detail: "it places constant data by the GPU's free memory and link profile".into(),
        });
    };
    let budget = match budget {
        Some(bytes) => bytes,
        None => gpu.memory_info()?.0,
    } / slots.max(1) as u64;
    let profile = ProfileCache::hetmem_default().load_for(gpu);
    let declared = placer(stage.inputs(), stage.outputs(), &stage.constants(device), profile, budget);
    forced(declared, overrides).place().map(Some)
}

/// `placer` with each of `overrides` forced, in order.
fn forced(placer: Placer, overrides: &[(&str, Where)]) -> Placer {
    overrides.iter().fold(placer, |placer, &(name, place)| placer.force(name, place))
}

/// Refuses an override that puts a frame in device memory: by the hybrid strategy the frames
/// are mapped host memory the CPU fills and reads (the pinned-async strategy keeps them in
/// device memory and copies them). Constants may go either way; unknown names are the
/// placer's to refuse.
pub(crate) fn check_overrides(inputs: usize, outputs: usize, overrides: &[(&str, Where)]) -> Result<()> {
    let is_frame = |name: &str| {
        let index = |prefix: &str, count: usize| {
            name.strip_prefix(prefix).and_then(|rest| rest.parse::<usize>().ok()).is_some_and(|i| i < count)
        };
        index("input ", inputs) || index("output ", outputs)
    };
    match overrides.iter().find(|&&(name, place)| place == Where::Device && is_frame(name)) {
        Some((name, _)) => Err(Error::invalid(
            "placement override",
            format!(
                "{name:?} into device memory: the hybrid strategy keeps frames mapped; use the \
                 pinned-async strategy to keep them in device memory"
            ),
        )),
        None => Ok(()),
    }
}

/// One slot's declarations: each frame buffer once, sequentially, and each constant buffer
/// read as often as the stage says, per frame.
fn placer(
    inputs: &[FrameLayout],
    outputs: &[FrameLayout],
    constants: &[ConstantUse],
    profile: SourcedProfile,
    budget: u64,
) -> Placer {
    let frames = |what: &'static str, layouts: &[FrameLayout]| -> Vec<BufferUse> {
        layouts
            .iter()
            .enumerate()
            .map(|(index, layout)| {
                let bytes = layout.bytes() as u64;
                BufferUse::new(format!("{what} {index}"), bytes, bytes, 1, AccessPattern::Sequential)
            })
            .collect()
    };
    let constants = constants.iter().map(|constant| {
        BufferUse::new(
            &constant.name,
            constant.bytes,
            constant.bytes_read_per_frame,
            1,
            AccessPattern::Reused,
        )
    });
    frames("input", inputs)
        .into_iter()
        .chain(frames("output", outputs))
        .chain(constants)
        .fold(Placer::sourced(profile, budget), Placer::buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{LinkProfile, ProfileSource};
    use crate::stage::ScalarType;

    fn seeded(test: &str) -> fastrand::Rng {
        let seed = fastrand::u64(..);
        eprintln!("{test}: seed {seed:#x}");
        fastrand::Rng::with_seed(seed)
    }

    /// A fake profile in the order real machines have the rates: device memory far faster
    /// than the link.
    fn fake_profile(rng: &mut fastrand::Rng) -> SourcedProfile {
        let link = 10.0 + rng.f64() * 90.0;
        let profile =
            LinkProfile::new(link * (20.0 + rng.f64() * 80.0), link, link / 20.0, link * 1.1).unwrap();
        SourcedProfile { profile, source: ProfileSource::Given }
    }

    fn frames(rng: &mut fastrand::Rng) -> Vec<FrameLayout> {
        (0..rng.usize(1..4))
            .map(|_| FrameLayout::samples(rng.usize(1..1 << 22), ScalarType::U8).unwrap())
            .collect()
    }

    fn constant(rng: &mut fastrand::Rng, name: &str, reads: u64) -> ConstantUse {
        let bytes = rng.u64(4..1 << 16);
        ConstantUse { name: name.into(), bytes, bytes_read_per_frame: bytes * reads }
    }

    #[test]
    fn frames_stay_mapped_and_a_table_every_block_reads_goes_to_the_device() {
        let mut rng = seeded("frames_stay_mapped_and_a_table_every_block_reads_goes_to_the_device");
        for _ in 0..100 {
            let (inputs, outputs) = (frames(&mut rng), frames(&mut rng));
            let reads = rng.u64(2..2000);
            let constants = vec![constant(&mut rng, "table", reads), constant(&mut rng, "once", 1)];
            let placement =
                placer(&inputs, &outputs, &constants, fake_profile(&mut rng), 1 << 30).place().unwrap();
            for (what, count) in [("input", inputs.len()), ("output", outputs.len())] {
                for index in 0..count {
                    let name = format!("{what} {index}");
                    assert_eq!(placement.place_of(&name), Some(Where::Mapped), "{placement}");
                }
            }
            assert_eq!(placement.place_of("table"), Some(Where::Device), "{placement}");
            assert!(placement.decision("table").unwrap().reason.contains("saves"));
            assert_eq!(placement.place_of("once"), Some(Where::Mapped), "{placement}");
            assert_eq!(placement.device_bytes, constants[0].bytes);
            let places = constant_places(Strategy::Hybrid, &constants, Some(&placement));
            assert_eq!(places, [Where::Device, Where::Mapped]);
        }
    }

    #[test]
    fn a_table_larger_than_the_budget_stays_mapped_and_says_so() {
        let mut rng = seeded("a_table_larger_than_the_budget_stays_mapped_and_says_so");
        let (inputs, outputs) = (frames(&mut rng), frames(&mut rng));
        let constants = vec![constant(&mut rng, "table", 64)];
        let budget = rng.u64(0..constants[0].bytes);
        let placement =
            placer(&inputs, &outputs, &constants, fake_profile(&mut rng), budget).place().unwrap();
        let table = placement.decision("table").unwrap();
        assert_eq!(table.place, Where::Mapped);
        assert!(table.reason.contains("do not fit"), "{}", table.reason);
        assert_eq!(constant_places(Strategy::Hybrid, &constants, Some(&placement)), [Where::Mapped]);
    }

    #[test]
    fn overrides_move_a_constant_and_refuse_a_frame_in_device_memory() {
        let mut rng = seeded("overrides_move_a_constant_and_refuse_a_frame_in_device_memory");
        let (inputs, outputs) = (frames(&mut rng), frames(&mut rng));
        let reads = rng.u64(2..2000);
        let constants = vec![constant(&mut rng, "table", reads), constant(&mut rng, "once", 1)];
        let overrides = [("table", Where::Mapped), ("once", Where::Device), ("input 0", Where::Mapped)];
        check_overrides(inputs.len(), outputs.len(), &overrides).unwrap();
        let declared = placer(&inputs, &outputs, &constants, fake_profile(&mut rng), 1 << 30);
        let placement = forced(declared, &overrides).place().unwrap();
        assert_eq!(
            constant_places(Strategy::Hybrid, &constants, Some(&placement)),
            [Where::Mapped, Where::Device]
        );
        assert!(placement.decision("table").unwrap().overridden, "{placement}");
        assert!(!placement.decision("output 0").unwrap().overridden, "{placement}");

        let frame = format!("output {}", rng.usize(..outputs.len()));
        let error =
            check_overrides(inputs.len(), outputs.len(), &[(frame.as_str(), Where::Device)]).unwrap_err();
        assert!(error.to_string().contains("pinned-async"), "{error}");
        // A name past the frames is not a frame: the placer says it is undeclared.
        let past = format!("input {}", inputs.len());
        check_overrides(inputs.len(), outputs.len(), &[(past.as_str(), Where::Device)]).unwrap();
        let error = placer(&inputs, &outputs, &constants, fake_profile(&mut rng), 1 << 30)
            .force(past, Where::Device)
            .place()
            .unwrap_err();
        assert!(error.to_string().contains("not declared"), "{error}");
    }

    #[test]
    fn the_other_strategies_place_constants_by_their_definition() {
        let mut rng = seeded("the_other_strategies_place_constants_by_their_definition");
        let constants = vec![constant(&mut rng, "a", 9), constant(&mut rng, "b", 1)];
        assert_eq!(constant_places(Strategy::ZeroCopy, &constants, None), [Where::Mapped; 2]);
        for strategy in [Strategy::Copy, Strategy::PinnedAsync, Strategy::Managed] {
            assert_eq!(constant_places(strategy, &constants, None), [Where::Device; 2]);
        }
    }
}
