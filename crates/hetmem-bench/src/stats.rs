//! Order statistics of repeated timings.

/// The median and spread of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// How many samples.
    pub samples: usize,
    /// The smallest.
    pub min: f64,
    /// The median.
    pub median: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// Summarises `samples` (in any unit). `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |quantile: f64| sorted[((sorted.len() - 1) as f64 * quantile).round() as usize];
        Some(Summary { samples: sorted.len(), min: sorted[0], median: at(0.5), p90: at(0.9), p99: at(0.99) })
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn quantiles_of_a_known_set() {
        let samples: Vec<f64> = (1..=101).rev().map(f64::from).collect();
        let summary = Summary::of(&samples).unwrap();
        assert_eq!((summary.min, summary.median, summary.p90, summary.p99), (1.0, 51.0, 91.0, 100.0));
        assert_eq!(summary.samples, 101);
        assert!(Summary::of(&[]).is_none());
    }
}
