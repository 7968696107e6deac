//! The row kernels of the CPU Gaussian: the horizontal pass (one padded row of samples into
//! sums) and the vertical pass (2r+1 rows of sums into one row of output samples), for 8-bit
//! and 16-bit samples.
//!
//! Each is a plain loop over contiguous samples that the compiler vectorises: a tile of output
//! samples is summed in a fixed-size array (kept in vector registers) tap pair by tap pair,
//! using the kernel's symmetry (`w[r-k] = w[r+k]`) to multiply once per pair. Stable Rust has
//! no portable SIMD, so the same loops are compiled again for AVX2 and AVX-512 and the widest
//! one the CPU has is chosen at run time ([`Isa::detect`]); the arithmetic is integer, so
//! every variant gives the same bits.
//!
//! A row shorter than a tile runs the same sums over a slice instead. A longer row whose
//! length is not a multiple of the tile ends with a tile that overlaps the one before it:
//! it recomputes some outputs from the same inputs, which is cheaper than a scalar tail.

/// The instruction sets the row kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    /// AVX-512 (F and BW: 512-bit vectors of 16-bit lanes).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// What the target was compiled for (SSE2 on a default x86-64 build, NEON on aarch64).
    Portable,
}

impl Isa {
    /// The widest instruction set this CPU runs.
    pub(super) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU runs, for tests that compare them.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                all.push(Isa::Avx2);
            }
            if Isa::detect() == Isa::Avx512 {
                all.push(Isa::Avx512);
            }
        }
        all
    }
}

/// Defines `$name(isa, args...)`, which runs the `#[inline(always)]` function `$body` compiled
/// for `isa`, with the tile (output samples summed at once, in registers) that suits its
/// vectors: the body is inlined into one wrapper per instruction set, so its loops are
/// vectorised for each.
macro_rules! dispatched {
    (
        $(#[$doc:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?)
            => $body:ident, tiles: avx512 $avx512:literal, avx2 $avx2:literal, portable $portable:literal
    ) => {
        $(#[$doc])*
        $vis fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw")]
                fn avx512($($arg: $ty),*) {
                    $body::<$avx512>($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $body::<$avx2>($($arg),*)
                }
                match isa {
                    // SAFETY: `Isa::detect` returned Avx512 only after finding AVX-512 F and BW
                    // on this CPU, the features `avx512` is compiled for.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `Isa::detect` returned Avx2 only after finding AVX2 on this CPU.
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    Isa::Portable => {}
                }
            }
            $body::<$portable>($($arg),*)
        }
    };
}

/// Evaluates `$call` with `$half` (a kernel's half weights) cut to a length the compiler knows
/// for the usual radii 1 to 4, so that their tap loops unroll; other radii loop over taps.
macro_rules! by_radius {
    ($half:ident => $call:expr) => {
        match $half.len() {
            2 => {
                let $half = &$half[..2];
                $call
            }
            3 => {
                let $half = &$half[..3];
                $call
            }
            4 => {
                let $half = &$half[..4];
                $call
            }
            5 => {
                let $half = &$half[..5];
                $call
            }
            _ => $call,
        }
    };
}

/// Where the tiles of a row of `n >= TILE` samples start: every `TILE` samples, then one
/// ending at the row's end when `n` is not a multiple of it.
#[inline(always)]
fn tile_starts<const TILE: usize>(n: usize) -> impl Iterator<Item = usize> {
    (0..n / TILE).map(|tile| tile * TILE).chain((!n.is_multiple_of(TILE)).then_some(n - TILE))
}

// Below, the weights are a kernel's half, `half[k]` the weight of the two taps k samples or
// rows from the centre (`half[0]` the centre's). Everything is `#[inline(always)]` functions,
// no closures: a closure is compiled on its own, without the target features of the function
// it is written in, and would not be vectorised for them.

/// The 8-bit horizontal pass: `sums[i] = Σ_t w[t] * padded[i + t * channels]` with OpenCV's Q8
/// weights (summing to 256). Exact in 16 bits: a sum is at most 256 * 255, and a pair of
/// samples times a side weight (at most 128) at most 510 * 128.
#[inline(always)]
fn horizontal_u8_body<const TILE: usize>(half: &[u16], channels: usize, padded: &[u8], sums: &mut [u16]) {
    by_radius!(half => horizontal_u8_row::<TILE>(half, channels, padded, sums))
}

#[inline(always)]
fn horizontal_u8_row<const TILE: usize>(half: &[u16], channels: usize, padded: &[u8], sums: &mut [u16]) {
    if sums.len() < TILE {
        return horizontal_u8_span(half, channels, padded, 0, sums);
    }
    for start in tile_starts::<TILE>(sums.len()) {
        let mut acc = [0u16; TILE];
        horizontal_u8_span(half, channels, padded, start, &mut acc);
        sums[start..start + TILE].copy_from_slice(&acc);
    }
}

/// The 8-bit horizontal sums of `out.len()` samples from `start`.
#[inline(always)]
fn horizontal_u8_span(half: &[u16], channels: usize, padded: &[u8], start: usize, out: &mut [u16]) {
    let (radius, len) = (half.len() - 1, out.len());
    let centre = &padded[start + radius * channels..][..len];
    for (o, &c) in out.iter_mut().zip(centre) {
        *o = half[0] * u16::from(c);
    }
    for (k, &w) in half.iter().enumerate().skip(1) {
        let left = &padded[start + (radius - k) * channels..][..len];
        let right = &padded[start + (radius + k) * channels..][..len];
        for ((o, &a), &b) in out.iter_mut().zip(left).zip(right) {
            *o += w * (u16::from(a) + u16::from(b));
        }
    }
}

/// The 8-bit vertical pass: `out[i] = (Σ_t w[t] * rows[t][i] + 2^15) >> 16`, the Q8 weights
/// times Q8 sums rounded once to 8 bits (at most 256 * 65280 before the shift, and a pair of
/// sums times a side weight at most 2 * 65280 * 128: 32 bits).
#[inline(always)]
fn vertical_u8_body<const TILE: usize>(half: &[u16], rows: &[&[u16]], out: &mut [u8]) {
    by_radius!(half => vertical_u8_row::<TILE>(half, rows, out))
}

#[inline(always)]
fn vertical_u8_row<const TILE: usize>(half: &[u16], rows: &[&[u16]], out: &mut [u8]) {
    let mut acc = [0u32; TILE];
    if out.len() < TILE {
        let len = out.len();
        vertical_u8_span(half, rows, 0, &mut acc[..len]);
        return narrow_u8(out, &acc[..len]);
    }
    for start in tile_starts::<TILE>(out.len()) {
        vertical_u8_span(half, rows, start, &mut acc);
        narrow_u8(&mut out[start..start + TILE], &acc);
    }
}

/// The 8-bit vertical sums of `acc.len()` samples from `start`, rounding term included.
#[inline(always)]
fn vertical_u8_span(half: &[u16], rows: &[&[u16]], start: usize, acc: &mut [u32]) {
    let (radius, len) = (half.len() - 1, acc.len());
    for (a, &c) in acc.iter_mut().zip(&rows[radius][start..][..len]) {
        *a = (1 << 15) + u32::from(half[0]) * u32::from(c);
    }
    for (k, &w) in half.iter().enumerate().skip(1) {
        let (above, below) = (&rows[radius - k][start..][..len], &rows[radius + k][start..][..len]);
        for ((a, &x), &y) in acc.iter_mut().zip(above).zip(below) {
            *a += u32::from(w) * (u32::from(x) + u32::from(y));
        }
    }
}

/// Writes the 8-bit results of vertical sums (their bits 16 to 23).
#[inline(always)]
fn narrow_u8(out: &mut [u8], acc: &[u32]) {
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = (a >> 16) as u8;
    }
}

/// The 16-bit horizontal pass: `sums[i] = Σ_t w[t] * padded[i + t * channels]` with OpenCV's
/// Q16 weights (summing to 65536), exact in 32 bits (a sum is below 65536 * 65535; a pair of
/// samples times a side weight, at most 32768, below 2^32).
#[inline(always)]
fn horizontal_u16_body<const TILE: usize>(half: &[u32], channels: usize, padded: &[u16], sums: &mut [u32]) {
    by_radius!(half => horizontal_u16_row::<TILE>(half, channels, padded, sums))
}

#[inline(always)]
fn horizontal_u16_row<const TILE: usize>(half: &[u32], channels: usize, padded: &[u16], sums: &mut [u32]) {
    if sums.len() < TILE {
        return horizontal_u16_span(half, channels, padded, 0, sums);
    }
    for start in tile_starts::<TILE>(sums.len()) {
        let mut acc = [0u32; TILE];
        horizontal_u16_span(half, channels, padded, start, &mut acc);
        sums[start..start + TILE].copy_from_slice(&acc);
    }
}

/// The 16-bit horizontal sums of `out.len()` samples from `start`.
#[inline(always)]
fn horizontal_u16_span(half: &[u32], channels: usize, padded: &[u16], start: usize, out: &mut [u32]) {
    let (radius, len) = (half.len() - 1, out.len());
    let centre = &padded[start + radius * channels..][..len];
    for (o, &c) in out.iter_mut().zip(centre) {
        *o = half[0] * u32::from(c);
    }
    for (k, &w) in half.iter().enumerate().skip(1) {
        let left = &padded[start + (radius - k) * channels..][..len];
        let right = &padded[start + (radius + k) * channels..][..len];
        for ((o, &a), &b) in out.iter_mut().zip(left).zip(right) {
            *o += w * (u32::from(a) + u32::from(b));
        }
    }
}

/// The 16-bit vertical pass: `out[i] = (Σ_t w[t] * rows[t][i] + 2^31) >> 32`, Q16 weights
/// times Q16 sums exact in 64 bits, rounded once, half up; written little-endian. Taps are
/// not paired here: a pair of sums needs 33 bits, and the multiply vectors have is
/// 32 x 32 -> 64 bits.
#[inline(always)]
fn vertical_u16_body<const TILE: usize>(half: &[u32], rows: &[&[u32]], out: &mut [u8]) {
    by_radius!(half => vertical_u16_row::<TILE>(half, rows, out))
}

#[inline(always)]
fn vertical_u16_row<const TILE: usize>(half: &[u32], rows: &[&[u32]], out: &mut [u8]) {
    let mut acc = [0u64; TILE];
    let n = out.len() / 2;
    if n < TILE {
        vertical_u16_span(half, rows, 0, &mut acc[..n]);
        return narrow_u16(out, &acc[..n]);
    }
    for start in tile_starts::<TILE>(n) {
        vertical_u16_span(half, rows, start, &mut acc);
        narrow_u16(&mut out[2 * start..2 * (start + TILE)], &acc);
    }
}

/// The 16-bit vertical sums of `acc.len()` samples from `start`, rounding term included.
#[inline(always)]
fn vertical_u16_span(half: &[u32], rows: &[&[u32]], start: usize, acc: &mut [u64]) {
    let (radius, len) = (half.len() - 1, acc.len());
    for (a, &c) in acc.iter_mut().zip(&rows[radius][start..][..len]) {
        *a = (1 << 31) + u64::from(half[0]) * u64::from(c);
    }
    for (k, &w) in half.iter().enumerate().skip(1) {
        let (above, below) = (&rows[radius - k][start..][..len], &rows[radius + k][start..][..len]);
        for ((a, &x), &y) in acc.iter_mut().zip(above).zip(below) {
            *a += u64::from(w) * u64::from(x) + u64::from(w) * u64::from(y);
        }
    }
}

/// Writes the 16-bit results of vertical sums (their top 32 bits), little-endian.
#[inline(always)]
fn narrow_u16(out: &mut [u8], acc: &[u64]) {
    for (pair, &a) in out.chunks_exact_mut(2).zip(acc) {
        pair.copy_from_slice(&((a >> 32) as u16).to_le_bytes());
    }
}

// The tiles: eight vectors of sums (sixteen of the 16-bit vertical pass's 64-bit sums, some of
// which then stay in L1). Tiles of half the size were no faster, and with 32 samples the
// 16-bit vertical pass came out as scalar code, three times slower: the compiler unrolled its
// short loops completely and then failed to vectorise what remained.

dispatched! {
    /// [`horizontal_u8_body`] for `isa`.
    pub(super) fn horizontal_u8(half: &[u16], channels: usize, padded: &[u8], sums: &mut [u16])
        => horizontal_u8_body, tiles: avx512 256, avx2 128, portable 64
}
dispatched! {
    /// [`vertical_u8_body`] for `isa`.
    pub(super) fn vertical_u8(half: &[u16], rows: &[&[u16]], out: &mut [u8])
        => vertical_u8_body, tiles: avx512 128, avx2 64, portable 32
}
dispatched! {
    /// [`horizontal_u16_body`] for `isa`.
    pub(super) fn horizontal_u16(half: &[u32], channels: usize, padded: &[u16], sums: &mut [u32])
        => horizontal_u16_body, tiles: avx512 128, avx2 64, portable 32
}
dispatched! {
    /// [`vertical_u16_body`] for `isa`.
    pub(super) fn vertical_u16(half: &[u32], rows: &[&[u32]], out: &mut [u8])
        => vertical_u16_body, tiles: avx512 128, avx2 64, portable 32
}
