//! The time the GPU was busy with a ring's frames: the union of the frames' (start, end)
//! intervals. Frames of different slots overlap on the GPU, so their lengths summed can exceed
//! the wall time; the union cannot.

/// Intervals in milliseconds after the ring's reference event, merged as they come.
#[derive(Debug, Default)]
pub(super) struct BusyTime {
    /// Disjoint after each merge; intervals added since the last merge may overlap anything.
    intervals: Vec<(f64, f64)>,
    /// Length of `intervals` after the last merge.
    merged: usize,
}

impl BusyTime {
    /// Adds one frame's interval. An empty or reversed interval adds nothing.
    pub(super) fn add(&mut self, start_ms: f64, end_ms: f64) {
        if end_ms > start_ms {
            self.intervals.push((start_ms, end_ms));
        }
        // Merging keeps the list as long as the gaps in the GPU's work, whatever the number of
        // frames; doing it when the list has doubled keeps adding amortised O(log n).
        if self.intervals.len() >= 2 * self.merged.max(512) {
            self.merge();
        }
    }

    /// Seconds covered by at least one interval.
    pub(super) fn seconds(&mut self) -> f64 {
        self.merge();
        self.intervals.iter().map(|(start, end)| end - start).sum::<f64>() * 1e-3
    }

    fn merge(&mut self) {
        self.intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64)> = Vec::with_capacity(self.intervals.len());
        for &(start, end) in &self.intervals {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.merged = merged.len();
        self.intervals = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The union measured on a grid of 1/8 ms cells: the reference the merge is checked against.
    fn covered_cells(intervals: &[(u32, u32)]) -> f64 {
        let end = intervals.iter().map(|i| i.1).max().unwrap_or(0) as usize;
        let mut cells = vec![false; end];
        for &(start, stop) in intervals {
            cells[start as usize..stop as usize].iter_mut().for_each(|cell| *cell = true);
        }
        cells.iter().filter(|&&cell| cell).count() as f64 * 0.125e-3
    }

    #[test]
    fn the_union_matches_a_grid_count_on_random_overlapping_intervals() {
        // A small xorshift: fresh, reproducible intervals, many overlapping, some disjoint.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(bound)) as u32
        };
        for count in [1, 7, 600, 3000] {
            let intervals: Vec<(u32, u32)> = (0..count)
                .map(|_| {
                    let start = next(40 * count);
                    (start, start + next(200))
                })
                .collect();
            let mut busy = BusyTime::default();
            for &(start, end) in &intervals {
                busy.add(f64::from(start) * 0.125, f64::from(end) * 0.125);
            }
            let want = covered_cells(&intervals);
            let got = busy.seconds();
            assert!((got - want).abs() < 1e-9, "{count} intervals: {got} s, want {want} s");
            // Asking again, and adding after asking, keep the answer right.
            assert!((busy.seconds() - want).abs() < 1e-9);
        }
    }

    #[test]
    fn overlapping_frames_count_once_and_gaps_not_at_all() {
        let mut busy = BusyTime::default();
        busy.add(0.0, 2.0);
        busy.add(1.0, 3.0);
        busy.add(5.0, 6.0);
        busy.add(5.5, 5.75);
        busy.add(4.0, 4.0);
        assert!((busy.seconds() - 4e-3).abs() < 1e-12);
    }
}
