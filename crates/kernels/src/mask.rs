//! A grammar's token mask applied to logits on the device: every logit the mask does not
//! allow becomes −∞, in place, so that what reads the logits next (the argmax of greedy
//! decoding, or a read-back for sampling) sees only the allowed tokens.
//!
//! **Layout**: `logits` `[*, cols]` f32 row-major, `cols` a multiple of 4 (fixed in the
//! kernel); `masks` `[n, words]` u32 with `words = ⌈cols / 32⌉`, bit `t mod 32` of word
//! `t / 32` set when token `t` is allowed (llguidance's layout); `rows` `[n]` u32, the
//! logits row that mask `b` applies to. One block per mask (the grid is `n`), so a step
//! masks only its constrained rows. The row's 16-byte groups are walked by
//! [`crate::rows::RowWalk`]; a group whose four bits are all set is not touched.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::Launch;

use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::rows::{self, RowWalk};

pub const NAME: &str = "mask_logits_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl MaskParams {
    /// Mask words per row.
    pub fn words(&self) -> u32 {
        self.cols.div_ceil(32)
    }

    pub fn launch(&self, masks: u32) -> Launch {
        Launch::linear(masks, self.threads)
    }
}

/// `mask_logits_f32(logits, masks, rows)`, one block per mask.
pub fn build(p: &MaskParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 4, p.threads)?;
    let mut k = Builder::new(NAME, p.threads);
    let logits = k.param("logits", gptr(Scalar::F32));
    let masks = k.param("masks", gptr(Scalar::U32));
    let rows = k.param("rows", gptr(Scalar::U32));
    let b = k.ctaid_x();
    let tid = k.tid_x();
    let at = k.ptr_add(rows, b);
    let row = k.load(Type::U32, at);
    let start = wide_mul(&mut k, row, p.cols);
    let lr = k.ptr_add(logits, start);
    let first_word = wide_mul(&mut k, b, p.words());
    let mr = k.ptr_add(masks, first_word);
    let walk = RowWalk {
        groups: p.cols / 4,
        threads: p.threads,
    };
    walk.emit(&mut k, tid, &[], &|k, g, _| {
        // Group g holds tokens 4g..4g+3: bits 4(g mod 8).. of word g / 8.
        let w = k.shr_const(g, 3);
        let at = k.ptr_add(mr, w);
        let word = k.load(Type::U32, at);
        let lane = k.and_const(g, 7);
        let shift = k.shl_const(lane, 2);
        let shifted = k.shr(word, shift);
        let bits = k.and_const(shifted, 0xF);
        let all = k.const_u32(0xF);
        let partial = k.ne(bits, all);
        k.if_then(partial, |k| {
            let first = k.shl_const(g, 2);
            let zero = k.const_u32(0);
            let neg_inf = k.const_f32(f32::NEG_INFINITY);
            for e in 0..4 {
                let bit = k.shr_const(bits, e);
                let bit = k.and_const(bit, 1);
                let banned = k.eq(bit, zero);
                let i = k.add_const(first, e);
                k.if_then(banned, |k| {
                    let at = k.ptr_add(lr, i);
                    k.store(at, neg_inf);
                });
            }
        });
        vec![]
    });
    Ok(k.finish()?)
}

/// The reference: `logits` with mask `b` applied to row `rows[b]`.
pub fn reference(cols: u32, logits: &[f32], masks: &[u32], rows: &[u32]) -> Vec<f32> {
    let (cols, words) = (cols as usize, cols.div_ceil(32) as usize);
    let mut out = logits.to_vec();
    for (b, &row) in rows.iter().enumerate() {
        let mask = &masks[b * words..(b + 1) * words];
        let start = row as usize * cols;
        for (t, v) in out[start..start + cols].iter_mut().enumerate() {
            if mask[t / 32] & (1 << (t % 32)) == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    out
}

/// A case of `rows` rows of logits in ±[2^-4, 16], every row masked but row 1 (the masked
/// rows listed last first), each mask a mix of words that allow everything, nothing, or a
/// random half. The control swaps what a mask allows and bans.
pub fn case(p: &MaskParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let (cols, words) = (p.cols as usize, p.words() as usize);
    let logits = data::signed(&mut rng, rows as usize * cols, 0.0625, 16.0);
    let masked: Vec<u32> = (0..rows).rev().filter(|&r| r != 1 || rows == 1).collect();
    let masks: Vec<u32> = (0..masked.len() * words)
        .map(|_| match data::below(&mut rng, 4) {
            0 => 0,
            1 => u32::MAX,
            _ => data::below(&mut rng, u32::MAX),
        })
        .collect();
    let want = reference(p.cols, &logits, &masks, &masked);
    let swapped: Vec<u32> = masks.iter().map(|w| !w).collect();
    let wrong = reference(p.cols, &logits, &swapped, &masked);
    let exact = |v: &[f32]| Expected {
        buffer: 0,
        data: data::f32_bytes(v),
        elem: Scalar::F32,
        check: Check::Exact,
    };
    let u32_bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{}x{} ({} masked)", rows, p.cols, masked.len()),
        kernel,
        launch: p.launch(masked.len() as u32),
        buffers: vec![
            Buffer::in_out("logits", data::f32_bytes(&logits)),
            Buffer::input("masks", u32_bytes(&masks)),
            Buffer::input("rows", u32_bytes(&masked)),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1), CaseArg::Buffer(2)],
        expected: vec![exact(&want)],
        controls: vec![Control {
            what: "allowed and banned tokens swapped".into(),
            expected: exact(&wrong),
        }],
        bytes_moved: masked.len() as u64 * (cols as u64 * 4 * 2 + words as u64 * 4 + 4),
        flops: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_masks_only_the_listed_rows() {
        let logits = [1.0; 64];
        let masks = [0b101];
        let out = reference(32, &logits, &masks, &[1]);
        assert!(out[..32].iter().all(|&v| v == 1.0));
        assert_eq!(&out[32..35], &[1.0, f32::NEG_INFINITY, 1.0]);
        assert!(out[35..].iter().all(|&v| v == f32::NEG_INFINITY));
    }
}
