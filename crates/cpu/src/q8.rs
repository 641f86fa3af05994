//! Activations rounded to 8-bit blocks of 32, as llama.cpp's CPU path rounds a row of f32
//! activations before multiplying it by a quantized weight: ggml's Q8_0 blocks (paired with
//! Q8_0 weights) and Q8_1 blocks (paired with Q4_1 weights, whose offsets need the block sums).
//!
//! Per block: `amax = max |x|`, `d = amax/127`, `q = round(x·(127/amax))` to the nearest
//! integer, ties to even (the vector instruction ggml's x86 build uses); `d` is stored as f16,
//! and Q8_1 also stores `s = d·Σq` as f16 (computed with `d` before its rounding).

use quench_models::dequant::{f16_to_f32, f32_to_f16};

pub(crate) const BLOCK: usize = 32;

/// Which 8-bit block type a weight format pairs its activations with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Q8Kind {
    Q8_0,
    Q8_1,
}

/// One row of activations as 8-bit blocks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Q8Row {
    /// `d` of each block, rounded to f16 (held as the f32 it converts back to).
    pub(crate) scales: Vec<f32>,
    /// `s = d·Σq` of each block, rounded to f16; empty for Q8_0.
    pub(crate) sums: Vec<f32>,
    /// 32 quantized values per block.
    pub(crate) quants: Vec<i8>,
}

/// `x` rounded to f16 and back.
pub(crate) fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Rounds `x` (a whole number of blocks long) to `kind` blocks.
pub(crate) fn quantize_row(x: &[f32], kind: Q8Kind) -> Q8Row {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "quantize_row: width {} is not a whole number of blocks",
        x.len()
    );
    let blocks = x.len() / BLOCK;
    let mut row = Q8Row {
        scales: Vec::with_capacity(blocks),
        sums: Vec::with_capacity(if kind == Q8Kind::Q8_1 { blocks } else { 0 }),
        quants: Vec::with_capacity(x.len()),
    };
    for block in x.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inverse = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for &v in block {
            // |v·inverse| ≤ 127 up to one rounding, which round-to-nearest brings back.
            let q = (v * inverse).round_ties_even() as i8;
            sum += i32::from(q);
            row.quants.push(q);
        }
        row.scales.push(round_f16(d));
        if kind == Q8Kind::Q8_1 {
            row.sums.push(round_f16(d * sum as f32));
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block whose largest magnitude is 127: `d = 1`, so each quant is its value rounded to
    /// the nearest integer, ties to even.
    #[test]
    fn unit_scale_rounds_ties_to_even() {
        let mut x = [0.0f32; 32];
        x[..8].copy_from_slice(&[127.0, -2.5, 2.5, 3.5, -0.5, 0.49, 1.51, -126.6]);
        x[31] = 0.5;
        let row = quantize_row(&x, Q8Kind::Q8_1);
        assert_eq!(row.scales, [1.0]);
        let mut want = [0i8; 32];
        want[..8].copy_from_slice(&[127, -2, 2, 4, 0, 0, 2, -127]);
        assert_eq!(row.quants, want);
        // Σq = 127 − 2 + 2 + 4 + 2 − 127 = 6.
        assert_eq!(row.sums, [6.0]);
    }

    /// `amax = 1`: `d = 1/127` stored as the f16 `2⁻⁷·(1 + 8/1024)` = 0.0078735352, while the
    /// quants use `127/amax = 127` exactly; `s` is `d·Σq` with the unrounded `d`, then rounded.
    #[test]
    fn scales_and_sums_are_stored_as_f16() {
        let mut x = [0.0f32; 64];
        x[0] = 1.0;
        x[1] = 0.5; // 63.5: a tie, to 64
        x[2] = -0.25; // −31.75: to −32
        x[3] = 0.1; // 12.7: to 13
                    // Second block: all zero, so d = 0, inverse 0 and every quant 0.
        let row = quantize_row(&x, Q8Kind::Q8_1);
        let d = 2f32.powi(-7) * (1.0 + 8.0 / 1024.0);
        assert_eq!(row.scales, [d, 0.0]);
        assert_eq!(&row.quants[..5], &[127, 64, -32, 13, 0]);
        assert!(row.quants[32..].iter().all(|&q| q == 0));
        // Σq = 172; (1/127)·172 = 1.35433… → f16 1 + 363/1024.
        assert_eq!(row.sums, [1.0 + 363.0 / 1024.0, 0.0]);

        let q8_0 = quantize_row(&x, Q8Kind::Q8_0);
        assert_eq!(q8_0.scales, row.scales);
        assert_eq!(q8_0.quants, row.quants);
        assert!(q8_0.sums.is_empty());
    }

    #[test]
    fn negative_extreme_sets_the_scale() {
        let mut x = [0.0f32; 32];
        x[5] = -508.0; // amax 508: d = 4, inverse = 0.25
        x[6] = 6.0; // 1.5: tie, to 2
        x[7] = 10.0; // 2.5: tie, to 2
        let row = quantize_row(&x, Q8Kind::Q8_0);
        assert_eq!(row.scales, [4.0]);
        assert_eq!(&row.quants[5..8], &[-127, 2, 2]);
    }
}
