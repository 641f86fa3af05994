//! Error bounds of the approximate instructions the kernels use, as the references
//! assume them. Each is twice the bound the PTX ISA documents, so that a small
//! disagreement between documentation and silicon does not fail a check; the measured
//! errors live in `isa/sm90/approx.json`.

/// Unit roundoff of f32 (round to nearest): 2^-24.
pub const F32_U: f64 = 1.0 / 16_777_216.0;

/// `ex2.approx.ftz.f32`: relative error (documented 2 ulp, i.e. 2^-22).
pub const EX2_REL: f64 = 4.0 * 2.0 * F32_U;

/// `div.approx.f32` for divisors in [2^-126, 2^126]: relative error (documented 2 ulp).
pub const DIV_REL: f64 = 4.0 * 2.0 * F32_U;

/// The smallest normal f32: results below it may be flushed to zero by `.ftz` forms.
pub const F32_MIN_NORMAL: f64 = 1.1754943508222875e-38;

/// γ_n = n·u / (1 − n·u): the relative error bound of n roundings in a chain.
pub fn gamma(n: u64) -> f64 {
    let nu = n as f64 * F32_U;
    nu / (1.0 - nu)
}
