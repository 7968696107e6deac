//! The CPU's blur of a frame: the reference every checked frame is compared with, and the
//! methods' path on the CPU backend.

use rayon::prelude::*;

use super::PIXEL_BYTES;

/// The CPU's blur of one RGB frame, as the kernel computes it: weights 1 2 1 by 1 2 1, /16,
/// rounded half up, edges repeated. Rows in parallel.
pub fn blur3_rgb_cpu(input: &[u8], output: &mut [u8], width: usize, height: usize) {
    let row_bytes = width * PIXEL_BYTES;
    output.par_chunks_mut(row_bytes).enumerate().for_each(|(y, row)| {
        let rows =
            [y.saturating_sub(1), y, (y + 1).min(height - 1)].map(|y| &input[y * row_bytes..][..row_bytes]);
        for x in 0..width {
            let columns = [x.saturating_sub(1), x, (x + 1).min(width - 1)];
            for channel in 0..PIXEL_BYTES {
                let mut sum = 0u32;
                for (row, row_weight) in rows.iter().zip([1, 2, 1]) {
                    for (&column, weight) in columns.iter().zip([1, 2, 1]) {
                        sum += row_weight * weight * u32::from(row[column * PIXEL_BYTES + channel]);
                    }
                }
                row[x * PIXEL_BYTES + channel] = ((sum + 8) >> 4) as u8;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::runner::POISON;
    /// One bright pixel in a random frame's place spreads as 1 2 1 by 1 2 1 over 16, rounded
    /// half up; at an edge the repeated pixel adds its weight to the one beside it.
    #[test]
    fn the_cpu_blur_spreads_an_impulse_by_the_binomial_weights() {
        let value = fastrand::u32(1..=255);
        let (width, height) = (5, 4);
        let mut frame = vec![0; width * height * PIXEL_BYTES];
        let at = |x: usize, y: usize, channel: usize| (y * width + x) * PIXEL_BYTES + channel;
        frame[at(2, 1, 1)] = value as u8;
        let mut out = vec![POISON; frame.len()];
        blur3_rgb_cpu(&frame, &mut out, width, height);
        for y in 0..height {
            for x in 0..width {
                let weight = |d: usize| match d {
                    0 => 2,
                    1 => 1,
                    _ => 0,
                };
                let want = ((weight(x.abs_diff(2)) * weight(y.abs_diff(1)) * value + 8) >> 4) as u8;
                assert_eq!(out[at(x, y, 1)], want, "({x}, {y})");
                assert_eq!((out[at(x, y, 0)], out[at(x, y, 2)]), (0, 0), "other channels untouched");
            }
        }
        // At the top edge the row above is row 0 again: weight 1 + 2 from rows 0 and (-1 = 0).
        let mut edge = vec![0; frame.len()];
        edge[at(2, 0, 0)] = value as u8;
        blur3_rgb_cpu(&edge, &mut out, width, height);
        assert_eq!(u32::from(out[at(2, 0, 0)]), (3 * 2 * value + 8) >> 4);
    }
}
