//! Activations rounded to 16-bit integers per 32-element block, the form the integer
//! products of quantized weights take them in (the GPU's `qgemv::integer` kernels and the
//! CPU's one-token products).
//!
//! Per block `j`: `dx_j = max|x| / 32767` and `q_i = rne(x_i · fl(1/dx_j))`, the exact
//! product rounded once to an integer (|q| ≤ 32767), or `dx_j = 0` and `q = 0` where `dx_j`
//! would be below the smallest normal f32 (an all-zero block). Against the unrounded
//! activations each element moves by at most `(½ + 2^-7)·dx_j` (½ for the rounding to an
//! integer, the rest for the rounded `1/dx`): 8-bit activations would move them 258 times
//! further, more than the FP64 check allows.

/// Elements per block.
pub const BLOCK: usize = 32;
/// The largest quantized magnitude.
pub const QMAX: f32 = 32767.0;

/// Activations of one vector quantized to 16 bits, per 32-element block.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantX {
    /// `rne(x_i / dx)`, |q| ≤ 32767.
    pub q: Vec<i32>,
    /// Each block's step (0 for a block quantized to zero).
    pub dx: Vec<f32>,
    /// Each block's `Σ q_i`.
    pub sq: Vec<i32>,
}

/// The quantization of `x` (a whole number of 32-element blocks).
pub fn quantize(x: &[f32]) -> QuantX {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "quantize: {} activations are not a whole number of blocks",
        x.len()
    );
    let mut out = QuantX {
        q: Vec::with_capacity(x.len()),
        dx: Vec::with_capacity(x.len() / BLOCK),
        sq: Vec::with_capacity(x.len() / BLOCK),
    };
    for block in x.chunks_exact(BLOCK) {
        let m = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let dx = m / QMAX;
        let (dx, r) = if dx >= f32::MIN_POSITIVE {
            (dx, 1.0 / dx)
        } else {
            (0.0, 0.0)
        };
        // The product rounded once: exact in f64 (two 24-bit significands), then to an integer.
        let start = out.q.len();
        out.q.extend(
            block
                .iter()
                .map(|&v| (f64::from(v) * f64::from(r)).round_ties_even() as i32),
        );
        out.sq.push(out.q[start..].iter().sum());
        out.dx.push(dx);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block whose largest magnitude is 32767: `dx = 1`, so each quant is its value
    /// rounded to the nearest integer, ties to even; an all-zero block has `dx = 0`.
    #[test]
    fn unit_step_rounds_ties_to_even_and_zero_blocks_stay_zero() {
        let mut x = [0.0f32; 64];
        x[..6].copy_from_slice(&[32767.0, -2.5, 2.5, 3.5, -0.5, -32766.6]);
        let qx = quantize(&x);
        assert_eq!(qx.dx, [1.0, 0.0]);
        assert_eq!(&qx.q[..6], &[32767, -2, 2, 4, 0, -32767]);
        assert!(qx.q[6..].iter().all(|&q| q == 0));
        assert_eq!(qx.sq, [32767 - 2 + 2 + 4 - 32767, 0]);
    }

    /// Every element lands within `(½ + 2^-7)·dx` of its value.
    #[test]
    fn elements_move_by_at_most_half_a_step() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.37 - 180.0)
            .collect();
        let qx = quantize(&x);
        for (i, (&v, &q)) in x.iter().zip(&qx.q).enumerate() {
            let dx = f64::from(qx.dx[i / BLOCK]);
            let moved = (f64::from(q) * dx - f64::from(v)).abs();
            assert!(moved <= (0.5 + 1.0 / 128.0) * dx, "element {i}: {moved}");
        }
    }
}
