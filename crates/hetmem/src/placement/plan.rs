//! [`Placer`]: declared buffers and a budget in, a [`Placement`] with reasons out.

use std::fmt;

use super::{LinkProfile, ProfileSource, SourcedProfile};
use crate::error::{Error, Result};
use crate::memory::DeviceBudget;

/// How a computation reads a buffer within a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum AccessPattern {
    /// In order, each byte once: coalesced loads stream over the link at its full rate.
    Sequential,
    /// Scattered small loads: mapped, each load costs a transaction over the link.
    Random,
    /// The same bytes read again and again (a table, a template): coalesced, but every read
    /// of a mapped buffer crosses the link again.
    Reused,
}

/// Where a buffer lives while the computation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Where {
    /// Copied once into device memory, read there by every pass.
    Device,
    /// Left in host memory or a file window, mapped; every pass reads it over the link.
    Mapped,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Where::Device => "device",
            Where::Mapped => "mapped",
        })
    }
}

/// One buffer of a computation, and how the computation reads it.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BufferUse {
    /// The name decisions and overrides use.
    pub name: String,
    /// Its size: the device memory it takes if placed there.
    pub bytes: u64,
    /// Bytes one pass reads (more than `bytes` when a pass reads parts again).
    pub bytes_per_pass: u64,
    /// How many passes read it.
    pub passes: u32,
    /// How a pass reads it.
    pub pattern: AccessPattern,
}

impl BufferUse {
    /// A buffer of `bytes`, of which each of `passes` passes reads `bytes_per_pass` bytes.
    pub fn new(
        name: impl Into<String>,
        bytes: u64,
        bytes_per_pass: u64,
        passes: u32,
        pattern: AccessPattern,
    ) -> BufferUse {
        BufferUse { name: name.into(), bytes, bytes_per_pass, passes, pattern }
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_per_pass.saturating_mul(u64::from(self.passes))
    }

    /// Predicted seconds to read it for the whole computation from device memory, counting
    /// the one copy that puts it there.
    pub fn device_s(&self, profile: &LinkProfile) -> f64 {
        profile.copy_s(self.bytes) + profile.device_read_s(self.bytes_read())
    }

    /// Predicted seconds to read it for the whole computation over the link, mapped.
    pub fn mapped_s(&self, profile: &LinkProfile) -> f64 {
        profile.mapped_read_s(self.bytes_read(), self.pattern == AccessPattern::Random)
    }

    /// Link traffic device memory saves, in bytes of coalesced reads: every pass's reads when
    /// mapped (scattered reads counted at what they cost, by the ratio of the two mapped
    /// rates), less the one copy that puts it in device memory. Zero or less for a buffer
    /// streamed once: copying it in moves as many bytes as reading it mapped.
    pub fn link_bytes_saved(&self, profile: &LinkProfile) -> f64 {
        let cost = match self.pattern {
            AccessPattern::Random => profile.mapped_read_gb_s / profile.mapped_random_read_gb_s,
            AccessPattern::Sequential | AccessPattern::Reused => 1.0,
        };
        self.bytes_read() as f64 * cost - self.bytes as f64
    }
}

/// The decision for one buffer.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Decision {
    /// The buffer's name.
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// Where it goes.
    pub place: Where,
    /// Whether the caller chose (an override) rather than the placer.
    pub overridden: bool,
    /// Predicted seconds where it goes.
    pub predicted_s: f64,
    /// Predicted seconds in device memory (the copy in, then every pass).
    pub device_s: f64,
    /// Predicted seconds mapped (every pass over the link).
    pub mapped_s: f64,
    /// Why, in words.
    pub reason: String,
}

/// What [`Placer::place`] decided, one [`Decision`] per buffer in the order declared.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Placement {
    /// The decisions.
    pub decisions: Vec<Decision>,
    /// The device-memory budget placed within.
    pub budget: u64,
    /// Device memory the placement takes.
    pub device_bytes: u64,
    /// The rates it decided from.
    pub profile: LinkProfile,
    /// Where they came from.
    pub profile_source: ProfileSource,
}

impl Placement {
    /// The decision for the buffer called `name`.
    pub fn decision(&self, name: &str) -> Option<&Decision> {
        self.decisions.iter().find(|decision| decision.name == name)
    }

    /// Where the buffer called `name` goes, or `None` for a name never declared.
    pub fn place_of(&self, name: &str) -> Option<Where> {
        self.decision(name).map(|decision| decision.place)
    }

    /// Predicted seconds for reading every buffer where it is placed.
    pub fn predicted_s(&self) -> f64 {
        self.decisions.iter().map(|decision| decision.predicted_s).sum()
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "placement: {} of {} bytes of device memory, predicted {}; link profile {}",
            self.device_bytes,
            self.budget,
            Seconds(self.predicted_s()),
            self.profile_source
        )?;
        for decision in &self.decisions {
            writeln!(
                f,
                "  {}: {} ({}): {}",
                decision.name,
                decision.place,
                Seconds(decision.predicted_s),
                decision.reason
            )?;
        }
        Ok(())
    }
}

/// Predicted seconds in words, in the unit that keeps them readable: a 60-byte table's
/// microseconds printed as seconds read "0.000000 s".
struct Seconds(f64);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            s if s >= 1.0 => write!(f, "{s:.3} s"),
            s if s >= 1e-3 => write!(f, "{:.3} ms", s * 1e3),
            s if s >= 1e-6 => write!(f, "{:.3} us", s * 1e6),
            s => write!(f, "{:.1} ns", s * 1e9),
        }
    }
}

/// Places a computation's buffers in device memory or leaves them mapped.
///
/// The rule: a buffer in device memory costs one copy across the link and then every pass
/// reads device memory; mapped, every pass reads it over the link. The buffers that save the
/// most link bytes ([`BufferUse::link_bytes_saved`]) per byte of device memory go first, while
/// they fit in the budget (a buffer that does not fit is skipped and smaller ones are still
/// tried); a buffer that saves nothing stays mapped, since a copy before the kernel cannot
/// overlap it and a mapped read does. The predicted seconds, from the profile's rates, say
/// what each choice costs. Overrides ([`Placer::force`]) are placed as told, forced device
/// buffers before any other.
#[derive(Debug, Clone)]
pub struct Placer {
    profile: LinkProfile,
    source: ProfileSource,
    budget: u64,
    buffers: Vec<BufferUse>,
    overrides: Vec<(String, Where)>,
}

impl Placer {
    /// A placer with `budget` bytes of device memory, deciding from the caller's `profile`.
    pub fn new(profile: LinkProfile, budget: u64) -> Placer {
        Placer::sourced(SourcedProfile { profile, source: ProfileSource::Given }, budget)
    }

    /// A placer with `budget` bytes of device memory, deciding from a profile whose source
    /// the placement names (one from [`super::ProfileCache::load`], say).
    pub fn sourced(profile: SourcedProfile, budget: u64) -> Placer {
        Placer {
            profile: profile.profile,
            source: profile.source,
            budget,
            buffers: Vec::new(),
            overrides: Vec::new(),
        }
    }

    /// A placer with what `budget` has free now.
    pub fn within(profile: LinkProfile, budget: &DeviceBudget) -> Placer {
        Placer::new(profile, budget.limit().saturating_sub(budget.in_use()))
    }

    /// Declares a buffer.
    pub fn buffer(mut self, buffer: BufferUse) -> Placer {
        self.buffers.push(buffer);
        self
    }

    /// Puts the buffer called `name` where the caller says, whatever the profile predicts.
    /// A later override of the same name wins.
    pub fn force(mut self, name: impl Into<String>, place: Where) -> Placer {
        self.overrides.push((name.into(), place));
        self
    }

    fn forced(&self, name: &str) -> Option<Where> {
        self.overrides.iter().rev().find(|(forced, _)| forced == name).map(|(_, place)| *place)
    }

    fn check(&self) -> Result<()> {
        for (index, buffer) in self.buffers.iter().enumerate() {
            if buffer.bytes == 0 {
                return Err(Error::invalid(
                    "placement",
                    format!("buffer {:?} has 0 bytes: declare its real size", buffer.name),
                ));
            }
            if self.buffers[..index].iter().any(|earlier| earlier.name == buffer.name) {
                return Err(Error::invalid(
                    "placement",
                    format!("buffer {:?} is declared twice: give each buffer its own name", buffer.name),
                ));
            }
        }
        for (name, _) in &self.overrides {
            if !self.buffers.iter().any(|buffer| &buffer.name == name) {
                let names: Vec<&str> = self.buffers.iter().map(|buffer| buffer.name.as_str()).collect();
                return Err(Error::invalid(
                    "placement",
                    format!(
                        "an override names {name:?}, which is not declared; the buffers are: {}",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Decides every buffer.
    ///
    /// # Errors
    /// A buffer of 0 bytes, a name declared twice, an override of an undeclared name, or
    /// buffers forced into device memory that together exceed the budget.
    pub fn place(&self) -> Result<Placement> {
        self.check()?;
        let profile = &self.profile;
        let mut places: Vec<Option<(Where, String)>> = vec![None; self.buffers.len()];
        let mut used = 0u64;

        let forced_device: Vec<usize> = (0..self.buffers.len())
            .filter(|&i| self.forced(&self.buffers[i].name) == Some(Where::Device))
            .collect();
        let forced_bytes: u64 = forced_device.iter().map(|&i| self.buffers[i].bytes).sum();
        if forced_bytes > self.budget {
            let names: Vec<String> = forced_device
                .iter()
                .map(|&i| format!("{} ({} bytes)", self.buffers[i].name, self.buffers[i].bytes))
                .collect();
            return Err(Error::invalid(
                "placement",
                format!(
                    "the buffers forced into device memory, {}, take {forced_bytes} bytes, more than the \
                     {} byte budget: raise the budget or leave some of them mapped",
                    names.join(", "),
                    self.budget
                ),
            ));
        }
        for (index, buffer) in self.buffers.iter().enumerate() {
            if let Some(place) = self.forced(&buffer.name) {
                if place == Where::Device {
                    used += buffer.bytes;
                }
                places[index] = Some((place, format!("forced {place} by the caller")));
            }
        }

        // Link bytes saved per byte of device memory, best first.
        let mut candidates: Vec<(usize, f64)> = (0..self.buffers.len())
            .filter(|&i| places[i].is_none())
            .map(|i| (i, self.buffers[i].link_bytes_saved(profile) / self.buffers[i].bytes as f64))
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (index, saved_per_byte) in candidates {
            let buffer = &self.buffers[index];
            let (device_s, mapped_s) = (buffer.device_s(profile), buffer.mapped_s(profile));
            let decision = if saved_per_byte <= 0.0 {
                (
                    Where::Mapped,
                    format!(
                        "read {} time(s) ({:?}): copying it in would move as many bytes over the link as \
                         reading it mapped ({}), and take device memory",
                        buffer.passes,
                        buffer.pattern,
                        Seconds(mapped_s)
                    ),
                )
            } else if used + buffer.bytes <= self.budget {
                used += buffer.bytes;
                (
                    Where::Device,
                    format!(
                        "read {} time(s) ({:?}): device memory saves {:.0} bytes of link reads ({} instead \
                         of {} mapped), and it fits ({used} of {} bytes)",
                        buffer.passes,
                        buffer.pattern,
                        buffer.link_bytes_saved(profile),
                        Seconds(device_s),
                        Seconds(mapped_s),
                        self.budget
                    ),
                )
            } else {
                (
                    Where::Mapped,
                    format!(
                        "device memory would save {:.0} bytes of link reads ({} instead of {}), but its {} \
                         bytes do not fit beside {used} bytes placed before it (budget {} bytes)",
                        buffer.link_bytes_saved(profile),
                        Seconds(device_s),
                        Seconds(mapped_s),
                        buffer.bytes,
                        self.budget
                    ),
                )
            };
            places[index] = Some(decision);
        }

        let decisions = self
            .buffers
            .iter()
            .zip(places)
            .map(|(buffer, place)| {
                let (place, reason) = place.expect("every buffer is decided above");
                let (device_s, mapped_s) = (buffer.device_s(profile), buffer.mapped_s(profile));
                Decision {
                    name: buffer.name.clone(),
                    bytes: buffer.bytes,
                    place,
                    overridden: self.forced(&buffer.name).is_some(),
                    predicted_s: if place == Where::Device { device_s } else { mapped_s },
                    device_s,
                    mapped_s,
                    reason,
                }
            })
            .collect();
        Ok(Placement {
            decisions,
            budget: self.budget,
            device_bytes: used,
            profile: *profile,
            profile_source: self.source.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicted_seconds_print_in_a_unit_that_keeps_their_digits() {
        let printed: Vec<String> =
            [2.5, 0.0201, 7.62e-6, 3e-9].iter().map(|&s| Seconds(s).to_string()).collect();
        assert_eq!(printed, ["2.500 s", "20.100 ms", "7.620 us", "3.0 ns"]);
    }

    /// A fake profile of random rates in the order real machines have them: device memory far
    /// faster than the link, scattered mapped reads far slower than coalesced ones.
    fn fake_profile(rng: &mut fastrand::Rng) -> LinkProfile {
        let link = 10.0 + rng.f64() * 90.0;
        LinkProfile::new(link * (20.0 + rng.f64() * 80.0), link, link / (5.0 + rng.f64() * 30.0), link * 1.1)
            .unwrap()
    }

    fn seeded(test: &str) -> fastrand::Rng {
        let seed = fastrand::u64(..);
        eprintln!("{test}: seed {seed:#x}");
        fastrand::Rng::with_seed(seed)
    }

    fn random_buffers(rng: &mut fastrand::Rng, count: usize) -> Vec<BufferUse> {
        let patterns = [AccessPattern::Sequential, AccessPattern::Random, AccessPattern::Reused];
        (0..count)
            .map(|i| {
                let bytes = rng.u64(1..1 << 32);
                BufferUse::new(
                    format!("b{i}"),
                    bytes,
                    rng.u64(1..=bytes * 2),
                    rng.u32(1..200),
                    patterns[rng.usize(..3)],
                )
            })
            .collect()
    }

    #[test]
    fn the_budget_is_respected_and_no_skipped_buffer_would_have_fitted() {
        let mut rng = seeded("the_budget_is_respected_and_no_skipped_buffer_would_have_fitted");
        for _ in 0..200 {
            let profile = fake_profile(&mut rng);
            let count = rng.usize(1..12);
            let buffers = random_buffers(&mut rng, count);
            let budget = rng.u64(0..1 << 34);
            let placer = buffers.iter().cloned().fold(Placer::new(profile, budget), Placer::buffer);
            let placement = placer.place().unwrap();
            let on_device: u64 =
                placement.decisions.iter().filter(|d| d.place == Where::Device).map(|d| d.bytes).sum();
            assert_eq!(on_device, placement.device_bytes);
            assert!(on_device <= budget, "{on_device} > {budget}");
            for (buffer, decision) in buffers.iter().zip(&placement.decisions) {
                assert_eq!(buffer.name, decision.name);
                let saves = buffer.link_bytes_saved(&profile) > 0.0;
                if decision.place == Where::Mapped && saves {
                    assert!(
                        on_device + buffer.bytes > budget,
                        "{} saves time and fits: {placement}",
                        buffer.name
                    );
                }
                if decision.place == Where::Device {
                    assert!(saves, "{} is placed on the device but saves nothing", buffer.name);
                }
            }
        }
    }

    #[test]
    fn a_small_hot_template_goes_to_the_device_and_a_volume_read_once_stays_mapped() {
        let mut rng = seeded("a_small_hot_template_goes_to_the_device_and_a_volume_read_once_stays_mapped");
        let profile = fake_profile(&mut rng);
        let volume_bytes = rng.u64(100 << 20..1 << 30);
        let template_bytes = volume_bytes / 2;
        let passes = rng.u32(8..64);
        let placement = Placer::new(profile, volume_bytes + template_bytes)
            .buffer(BufferUse::new("volume", volume_bytes, volume_bytes, 1, AccessPattern::Sequential))
            .buffer(BufferUse::new("labels", template_bytes, template_bytes, passes, AccessPattern::Reused))
            .place()
            .unwrap();
        let labels = placement.decision("labels").unwrap();
        assert_eq!(labels.place, Where::Device, "{placement}");
        assert!(labels.reason.contains("saves") && !labels.overridden, "{}", labels.reason);
        assert!(labels.predicted_s < labels.mapped_s);
        let volume = placement.decision("volume").unwrap();
        assert_eq!(volume.place, Where::Mapped, "{placement}");
        assert!((volume.predicted_s - volume.mapped_s).abs() <= 0.0);
        assert_eq!(placement.device_bytes, template_bytes);
    }

    #[test]
    fn the_buffer_saving_most_per_byte_wins_a_budget_too_small_for_both() {
        let mut rng = seeded("the_buffer_saving_most_per_byte_wins_a_budget_too_small_for_both");
        let profile = fake_profile(&mut rng);
        let bytes = rng.u64(1 << 20..1 << 30);
        let placement = Placer::new(profile, bytes + bytes / 2)
            .buffer(BufferUse::new("warm", bytes, bytes, 4, AccessPattern::Sequential))
            .buffer(BufferUse::new("hot", bytes, bytes, 40, AccessPattern::Sequential))
            .place()
            .unwrap();
        assert_eq!(placement.place_of("hot"), Some(Where::Device), "{placement}");
        assert_eq!(placement.place_of("warm"), Some(Where::Mapped), "{placement}");
        assert!(placement.decision("warm").unwrap().reason.contains("do not fit"));
    }

    #[test]
    fn overrides_win_both_ways() {
        let mut rng = seeded("overrides_win_both_ways");
        let profile = fake_profile(&mut rng);
        let bytes = rng.u64(1 << 20..1 << 30);
        let placer = Placer::new(profile, 4 * bytes)
            .buffer(BufferUse::new("volume", bytes, bytes, 1, AccessPattern::Sequential))
            .buffer(BufferUse::new("labels", bytes, bytes, 50, AccessPattern::Reused));
        let chosen = placer.place().unwrap();
        assert_eq!(chosen.place_of("labels"), Some(Where::Device));
        assert_eq!(chosen.place_of("volume"), Some(Where::Mapped));
        let forced = placer
            .force("labels", Where::Device)
            .force("labels", Where::Mapped)
            .force("volume", Where::Device);
        let placement = forced.place().unwrap();
        for (name, place) in [("labels", Where::Mapped), ("volume", Where::Device)] {
            let decision = placement.decision(name).unwrap();
            assert_eq!(decision.place, place, "{placement}");
            assert!(decision.overridden && decision.reason.contains("forced"), "{}", decision.reason);
        }
        assert!(placement.predicted_s() > chosen.predicted_s());
    }

    #[test]
    fn a_budget_too_small_for_the_forced_buffers_is_an_error_naming_them() {
        let mut rng = seeded("a_budget_too_small_for_the_forced_buffers_is_an_error_naming_them");
        let bytes = rng.u64(1 << 20..1 << 30);
        let error = Placer::new(fake_profile(&mut rng), bytes - 1)
            .buffer(BufferUse::new("labels", bytes, bytes, 9, AccessPattern::Reused))
            .force("labels", Where::Device)
            .place()
            .unwrap_err()
            .to_string();
        assert!(error.contains("labels") && error.contains("raise the budget"), "{error}");
    }

    #[test]
    fn bad_declarations_are_clear_errors() {
        let profile = fake_profile(&mut seeded("bad_declarations_are_clear_errors"));
        let one = || BufferUse::new("labels", 64, 64, 2, AccessPattern::Reused);
        let twice =
            Placer::new(profile, 1 << 20).buffer(one()).buffer(one()).place().unwrap_err().to_string();
        assert!(twice.contains("declared twice"), "{twice}");
        let empty = Placer::new(profile, 1 << 20)
            .buffer(BufferUse::new("volume", 0, 0, 1, AccessPattern::Sequential))
            .place()
            .unwrap_err()
            .to_string();
        assert!(empty.contains("0 bytes"), "{empty}");
        let unknown =
            Placer::new(profile, 1 << 20).buffer(one()).force("lables", Where::Device).place().unwrap_err();
        let unknown = unknown.to_string();
        assert!(unknown.contains("\"lables\"") && unknown.contains("labels"), "{unknown}");
    }
}
