//! [`LinkProfile`]: the rates placement predicts seconds from.

use crate::error::{Error, Result};

/// How fast this machine moves bytes to a kernel, in GB/s (10^9 bytes per second).
///
/// The mapped rates and the copy rate are what `hetmem bench link` measures (rows
/// `zero_copy_read`, `zero_copy_read_strided` and `pinned_async_h2d` at their largest size);
/// the device-memory rate is `device_read` (a kernel reading device memory). Measured
/// profiles are kept per GPU by [`super::ProfileCache`]; tests build fake ones.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LinkProfile {
    /// A kernel reading device memory.
    pub device_read_gb_s: f64,
    /// A kernel reading mapped host memory with coalesced loads (zero-copy), over the link.
    pub mapped_read_gb_s: f64,
    /// A kernel reading mapped host memory in scattered small loads (each costs a whole
    /// transaction over the link).
    pub mapped_random_read_gb_s: f64,
    /// A copy from pinned host memory into device memory (the copy engines).
    pub copy_gb_s: f64,
}

impl LinkProfile {
    /// A profile of the four rates, in the order of the fields.
    ///
    /// # Errors
    /// A rate that is not a positive finite number.
    pub fn new(
        device_read_gb_s: f64,
        mapped_read_gb_s: f64,
        mapped_random_read_gb_s: f64,
        copy_gb_s: f64,
    ) -> Result<LinkProfile> {
        let rates = [
            ("device read", device_read_gb_s),
            ("mapped read", mapped_read_gb_s),
            ("mapped random read", mapped_random_read_gb_s),
            ("copy", copy_gb_s),
        ];
        for (name, rate) in rates {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(Error::invalid(
                    "link profile",
                    format!(
                        "the {name} rate is {rate} GB/s: give a positive rate, as measured by `hetmem bench link`"
                    ),
                ));
            }
        }
        Ok(LinkProfile { device_read_gb_s, mapped_read_gb_s, mapped_random_read_gb_s, copy_gb_s })
    }

    /// The rates of the H200 machine this project measures on (`hetmem bench link`,
    /// bench/results/2026-11-30-h200-ct), rounded, with device memory read at an assumed
    /// 3000 GB/s: what placements decide from where no profile was measured for the GPU
    /// ([`super::ProfileCache`]).
    pub fn built_in() -> LinkProfile {
        LinkProfile {
            device_read_gb_s: 3000.0,
            mapped_read_gb_s: 50.0,
            mapped_random_read_gb_s: 2.5,
            copy_gb_s: 55.0,
        }
    }

    /// Seconds to read `bytes` from device memory.
    pub fn device_read_s(&self, bytes: u64) -> f64 {
        seconds(bytes, self.device_read_gb_s)
    }

    /// Seconds for a kernel to read `bytes` of mapped memory over the link, coalesced or not.
    pub fn mapped_read_s(&self, bytes: u64, scattered: bool) -> f64 {
        let rate = if scattered { self.mapped_random_read_gb_s } else { self.mapped_read_gb_s };
        seconds(bytes, rate)
    }

    /// Seconds to copy `bytes` across the link into device memory.
    pub fn copy_s(&self, bytes: u64) -> f64 {
        seconds(bytes, self.copy_gb_s)
    }
}

fn seconds(bytes: u64, gb_s: f64) -> f64 {
    bytes as f64 / (gb_s * 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_that_is_not_positive_is_refused_by_name() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let error = LinkProfile::new(4000.0, 50.0, bad, 55.0).unwrap_err().to_string();
            assert!(error.contains("mapped random read"), "{error}");
        }
    }

    #[test]
    fn seconds_follow_the_rates() {
        let rates: Vec<f64> = (0..4).map(|_| fastrand::f64() * 100.0 + 1.0).collect();
        let profile = LinkProfile::new(rates[0], rates[1], rates[2], rates[3]).unwrap();
        let bytes = fastrand::u64(1..1 << 40);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert!(close(profile.device_read_s(bytes), bytes as f64 / (rates[0] * 1e9)));
        assert!(close(profile.mapped_read_s(bytes, false), bytes as f64 / (rates[1] * 1e9)));
        assert!(close(profile.mapped_read_s(bytes, true), bytes as f64 / (rates[2] * 1e9)));
        assert!(close(profile.copy_s(bytes), bytes as f64 / (rates[3] * 1e9)));
    }
}
