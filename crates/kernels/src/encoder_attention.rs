//! `encoder_attention_bf16`: bidirectional attention for encoders (BERT) over a padded
//! batch of texts, every query attending to every real token of its own text.
//!
//! **Layout**: `qkv` `[batch·seq_len, 3·H·d]` f32 row-major, each token's row holding its
//! queries, keys and values (`q` at `h·d`, `k` at `H·d + h·d`, `v` at `2·H·d + h·d`) —
//! the output of one fused q|k|v product with the biases added; `lens` `[batch]` u32, the
//! real tokens of each text (at least 1; rows past a text's length are padding and are
//! never read as keys); `out` `[batch·seq_len, H·d]` bf16, the input of the output
//! projection; `seq_len` a launch argument. Padding queries get an output too (over the
//! real keys), so that no row is left unwritten.
//!
//! **Mapping**: one warp per query, `warps` queries per block; the grid is
//! `[⌈seq_len / warps⌉, H, batch]`. Lane `l` holds elements `l + 32j` of the query (`d` a
//! multiple of 32: 32 and 64 are BERT's), pre-scaled by `log₂e/√d` so that scores are in
//! base 2.
//!
//! **Arithmetic** (f32): per key, the lane's partial dot product (fma in `j` order), a
//! butterfly warp sum, then the online softmax: `m' = max(m, s)`,
//! `α = ex2.approx(m − m')`, `p = ex2.approx(s − m')`, `l' = fma(l, α, p)`,
//! `o' = fma(o, α, p·v)`; at the end `o / l` (IEEE division), rounded to bf16. The check is
//! a bound ([`tolerance`]).

use half::bf16;
use quench_ir::{Builder, Function, Scalar, Special, Type, Value};
use quench_rt::{Arg, Launch};

use crate::approx::{gamma, EX2_REL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_warp_allreduce, gptr, Combine};

pub const NAME: &str = "encoder_attention_bf16";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderAttentionParams {
    /// Elements per head: a multiple of 32, at most 256.
    pub head_dim: u32,
    pub n_heads: u32,
    /// Queries per block (one warp each).
    pub warps: u32,
}

impl EncoderAttentionParams {
    /// Elements of one token's q|k|v row.
    pub fn qkv_stride(&self) -> u32 {
        3 * self.n_heads * self.head_dim
    }

    pub fn launch(&self, batch: u32, seq_len: u32) -> Launch {
        Launch {
            grid: [seq_len.div_ceil(self.warps).max(1), self.n_heads, batch],
            block: [self.warps * 32, 1, 1],
            dynamic_shared_bytes: 0,
        }
    }

    /// `log₂e / √d`: the query scale that puts scores in base 2.
    fn scale(&self) -> f32 {
        std::f32::consts::LOG2_E / (self.head_dim as f32).sqrt()
    }

    fn check(&self) -> Result<(), KernelError> {
        let fail = |reason: String| Err(KernelError::unsupported(NAME, reason));
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(32) || self.head_dim > 256 {
            return fail(format!(
                "head_dim = {}: must be a multiple of 32, at most 256",
                self.head_dim
            ));
        }
        if self.n_heads == 0 || self.warps == 0 || self.warps > 32 {
            return fail(format!(
                "n_heads = {}, warps = {}: need n_heads ≥ 1 and 1 ≤ warps ≤ 32",
                self.n_heads, self.warps
            ));
        }
        Ok(())
    }
}

/// `encoder_attention_bf16(qkv, lens, out, seq_len)`.
pub fn build(p: &EncoderAttentionParams) -> Result<Function, KernelError> {
    p.check()?;
    let (d, hd) = (p.head_dim, p.n_heads * p.head_dim);
    let per_lane = d / 32;
    let mut k = Builder::new(NAME, p.warps * 32);
    let qkv = k.param("qkv", gptr(Scalar::F32));
    let lens = k.param("lens", gptr(Scalar::U32));
    let out = k.param("out", gptr(Scalar::BF16));
    let seq_len = k.param("seq_len", Type::U32);
    let tid = k.tid_x();
    let warp = k.shr_const(tid, 5);
    let lane = k.and_const(tid, 31);
    let block = k.ctaid_x();
    let first = k.mul_const(block, p.warps);
    let query = k.add(first, warp);
    let head = k.ctaid_y();
    let text = k.special(Special::CtaidZ);
    let inside = k.lt(query, seq_len);
    k.if_then(inside, |k| {
        let len_at = k.ptr_add(lens, text);
        let len = k.load(Type::U32, len_at);
        let row0 = k.mul(text, seq_len);
        // The element offset of (token, column) in a row-major matrix of `stride` columns.
        let at = |k: &mut Builder, token: Value, stride: u32, col: Value| {
            let t64 = k.cvt(Scalar::U64, token);
            let s = k.const_u64(stride as u64);
            let base = k.mul(t64, s);
            let c64 = k.cvt(Scalar::U64, col);
            k.add(base, c64)
        };
        let head_col = k.mul_const(head, d);
        let my_col = k.add(head_col, lane);
        let q_token = k.add(row0, query);
        let q_at = at(k, q_token, p.qkv_stride(), my_col);
        let q_row = k.ptr_add(qkv, q_at);
        let scale = k.const_f32(p.scale());
        let q: Vec<Value> = (0..per_lane)
            .map(|j| {
                let off = k.const_u32(32 * j);
                let ptr = k.ptr_add(q_row, off);
                let v = k.load(Type::F32, ptr);
                k.mul(v, scale)
            })
            .collect();
        let k_col = k.add_const(my_col, hd);
        let v_col = k.add_const(my_col, 2 * hd);
        let zero_u = k.const_u32(0);
        let one_u = k.const_u32(1);
        let neg_inf = k.const_f32(f32::NEG_INFINITY);
        let zero = k.const_f32(0.0);
        let mut init = vec![neg_inf, zero];
        init.extend(std::iter::repeat_n(zero, per_lane as usize));
        let stride = p.qkv_stride();
        let fin = k.for_range(zero_u, len, one_u, &init, |k, key, c| {
            let token = k.add(row0, key);
            let k_at = at(k, token, stride, k_col);
            let k_row = k.ptr_add(qkv, k_at);
            let v_at = at(k, token, stride, v_col);
            let v_row = k.ptr_add(qkv, v_at);
            let mut partial = zero;
            let mut vs = vec![];
            for (j, &qj) in q.iter().enumerate() {
                let off = k.const_u32(32 * j as u32);
                let kp = k.ptr_add(k_row, off);
                let kv = k.load(Type::F32, kp);
                partial = k.fma(qj, kv, partial);
                let vp = k.ptr_add(v_row, off);
                vs.push(k.load(Type::F32, vp));
            }
            let s = emit_warp_allreduce(k, partial, Combine::Sum);
            let m_new = k.max(c[0], s);
            let dm = k.sub(c[0], m_new);
            let alpha = k.ex2_approx(dm);
            let ds = k.sub(s, m_new);
            let pr = k.ex2_approx(ds);
            let l = k.fma(c[1], alpha, pr);
            let mut next = vec![m_new, l];
            for (j, &vj) in vs.iter().enumerate() {
                let pv = k.mul(pr, vj);
                next.push(k.fma(c[2 + j], alpha, pv));
            }
            next
        });
        let out_at = at(k, q_token, hd, my_col);
        let out_row = k.ptr_add(out, out_at);
        for j in 0..per_lane {
            let o = k.div(fin[2 + j as usize], fin[1]);
            let o = k.cvt(Scalar::BF16, o);
            let off = k.const_u32(32 * j);
            let ptr = k.ptr_add(out_row, off);
            k.store(ptr, o);
        }
    });
    Ok(k.finish()?)
}

/// The problem a reference solves: `qkv` as the kernel reads it, the texts' lengths.
pub struct Problem<'a> {
    pub p: &'a EncoderAttentionParams,
    pub qkv: &'a [f32],
    pub lens: &'a [u32],
    pub seq_len: usize,
}

impl Problem<'_> {
    fn get(&self, token: usize, col: usize) -> f64 {
        self.qkv[token * self.p.qkv_stride() as usize + col] as f64
    }

    /// Exact attention in f64 (scores scaled by `scale_by`·1/√d over the first `keys(len)`
    /// keys of each text), `[batch·seq_len, H·d]`.
    fn attend(&self, scale_by: f64, keys: &dyn Fn(usize) -> usize) -> Vec<f64> {
        let (d, h) = (self.p.head_dim as usize, self.p.n_heads as usize);
        let hd = h * d;
        let mut out = vec![0.0; self.lens.len() * self.seq_len * hd];
        for (b, &len) in self.lens.iter().enumerate() {
            let n_keys = keys(len as usize);
            for qi in 0..self.seq_len {
                let tq = b * self.seq_len + qi;
                for head in 0..h {
                    let scores: Vec<f64> = (0..n_keys)
                        .map(|j| {
                            let tk = b * self.seq_len + j;
                            let dot: f64 = (0..d)
                                .map(|i| {
                                    self.get(tq, head * d + i) * self.get(tk, hd + head * d + i)
                                })
                                .sum();
                            dot * scale_by / (d as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for i in 0..d {
                        let acc: f64 = (0..n_keys)
                            .map(|j| {
                                weights[j] * self.get(b * self.seq_len + j, 2 * hd + head * d + i)
                            })
                            .sum();
                        out[tq * hd + head * d + i] = acc / total;
                    }
                }
            }
        }
        out
    }

    /// The exact attention over each text's real keys.
    pub fn reference(&self) -> Vec<f64> {
        self.attend(1.0, &|len| len)
    }
}

/// Per-element tolerance against [`Problem::reference`] (rounded to bf16), and how it
/// follows.
///
/// With `S` the largest `Σ|q'ᵢkᵢ|` of the query over the text's keys (in base-2 units),
/// each score is within `δ = γ_{d+6}·S` (the scaled query, the fma chain, the butterfly),
/// and `s − m'` within `2δ + 2u·S`; `ex2.approx` of it then has relative error
/// `ε₁ = ln2·(2δ + 2u·S) + EX2`. Each rescaling factor `α` errs by `EX2` too and applies to
/// every earlier key alike, so the weights' ratios err by at most
/// `ε = ε₁ + len·EX2 + γ_{2·len+2}` (the fma chains of `l` and `o`). A weighted average of
/// values with weights off by a factor in `[1 − ε, 1 + ε]` moves by at most `2.1ε·V`, `V`
/// the largest `|v|` of that element over the keys; the division adds `u·V`. The roundings
/// to bf16 add one bf16 ulp, `2^-7·|want|`.
pub fn tolerance(pr: &Problem, want: &[bf16]) -> (Vec<f64>, String) {
    let (d, h) = (pr.p.head_dim as usize, pr.p.n_heads as usize);
    let hd = h * d;
    let scale = pr.p.scale() as f64;
    let mut tol = vec![0.0; want.len()];
    for (b, &len) in pr.lens.iter().enumerate() {
        let len = len as usize;
        let keys = b * pr.seq_len..b * pr.seq_len + len;
        for qi in 0..pr.seq_len {
            let tq = b * pr.seq_len + qi;
            for head in 0..h {
                let s_max = keys
                    .clone()
                    .map(|tk| {
                        (0..d)
                            .map(|i| {
                                (pr.get(tq, head * d + i) * scale * pr.get(tk, hd + head * d + i))
                                    .abs()
                            })
                            .sum::<f64>()
                    })
                    .fold(0.0, f64::max);
                let delta = gamma(d as u64 + 6) * s_max;
                let eps1 = std::f64::consts::LN_2 * (2.0 * delta + 2.0 * F32_U * s_max) + EX2_REL;
                let eps = eps1 + len as f64 * EX2_REL + gamma(2 * len as u64 + 2);
                for i in 0..d {
                    let v_max = keys
                        .clone()
                        .map(|tk| pr.get(tk, 2 * hd + head * d + i).abs())
                        .fold(0.0, f64::max);
                    let eta = 2.1 * eps * v_max + F32_U * v_max;
                    let e = tq * hd + head * d + i;
                    tol[e] = eta * 1.01 + 2f64.powi(-7) * (want[e].to_f64().abs() + eta) * 1.01;
                }
            }
        }
    }
    let explain = format!(
        "2.1ε·max|v| + u·max|v| + one bf16 ulp, ε = ln2·(2γ_(d+6)·S + 2u·S) + (len + 1)·ex2.approx ({EX2_REL:.2e}) \
         + γ_(2len+2), S the query's largest Σ|q'k| in base-2 units"
    );
    (tol, explain)
}

/// A case of `batch` texts padded to `seq_len` tokens: the first text fills the length,
/// the last is one token, those between are 1–3 tokens short of the length; q, k, v and the padding rows in ±[2^-6, 1/2]
/// (scores of a few units at most: a softmax that is not one-hot, so that the scale matters).
pub fn case(
    p: &EncoderAttentionParams,
    batch: u32,
    seq_len: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let tokens = (batch * seq_len) as usize;
    let qkv = data::signed(&mut rng, tokens * p.qkv_stride() as usize, 1.0 / 64.0, 0.5);
    let lens: Vec<u32> = (0..batch)
        .map(|b| match b {
            0 => seq_len,
            b if b + 1 == batch => 1,
            // A few padding rows: most rows are real queries, so that a wrong answer
            // shows on most elements (padding rows and one-token texts read the same
            // whatever the scores' scale).
            _ => (seq_len - 1 - data::below(&mut rng, 3)).max(1),
        })
        .collect();
    let problem = Problem {
        p,
        qkv: &qkv,
        lens: &lens,
        seq_len: seq_len as usize,
    };
    let to_bf16 = |v: Vec<f64>| v.into_iter().map(bf16::from_f64).collect::<Vec<_>>();
    let want = to_bf16(problem.reference());
    let (tol, explain) = tolerance(&problem, &want);
    let check = Check::Bound { tol, explain };
    let sl = seq_len as usize;
    let controls = [
        (
            "padding keys attended to (no mask)",
            to_bf16(problem.attend(1.0, &|_| sl)),
        ),
        (
            "scores not scaled by 1/√d",
            to_bf16(problem.attend((p.head_dim as f64).sqrt(), &|len| len)),
        ),
    ]
    .into_iter()
    .map(|(what, wrong)| Control {
        what: what.to_string(),
        expected: Expected {
            buffer: 2,
            data: data::bf16_bytes(&wrong),
            elem: Scalar::BF16,
            check: check.clone(),
        },
    })
    .collect();
    let out_bytes = tokens * (p.n_heads * p.head_dim) as usize * 2;
    let hd = (p.n_heads * p.head_dim) as u64;
    let real: u64 = lens.iter().map(|&l| l as u64).sum();
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{batch}x{seq_len}x{}x{}", p.n_heads, p.head_dim),
        kernel,
        launch: p.launch(batch, seq_len),
        buffers: vec![
            Buffer::input("qkv", data::f32_bytes(&qkv)),
            Buffer::input("lens", lens.iter().flat_map(|l| l.to_le_bytes()).collect()),
            Buffer::output("out", out_bytes),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(seq_len)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: data::bf16_bytes(&want),
            elem: Scalar::BF16,
            check,
        }],
        controls,
        bytes_moved: (tokens as u64 * 3 * hd * 4) + out_bytes as u64,
        flops: 4 * seq_len as u64 * real * hd,
    })
}
