//! Rotary position embedding, applied in place to the queries and keys of a batch of
//! tokens, each at its own position.
//!
//! Each head's pairs `(a, b)` turn by the angle `pos · f_i`:
//! `a' = a·cos − b·sin`, `b' = a·sin + b·cos`. [`RopeStyle::NeoX`] pairs element `i` with
//! `i + head_dim/2` (llama and qwen in Hugging Face layout); [`RopeStyle::GptJ`] pairs
//! `2i` with `2i + 1` (GGUF llama layout, GPT-J).
//!
//! **Layout**: `q` `[tokens, n_heads, head_dim]` and `k` `[tokens, n_kv_heads, head_dim]`
//! f32, rotated in place; `pos` `[tokens]` u32; `cos`, `sin` `[n_pos, head_dim/2]` f32
//! tables (built on the host by [`table`] from the model's frequencies, Llama 3 scaling
//! included, so the kernel needs no transcendental function); `n_pos` a runtime argument.
//! One block per token (grid = tokens); the `(n_heads + n_kv_heads)·head_dim/2` pairs of
//! a token are walked by [`crate::rows::RowWalk`], consecutive threads taking consecutive
//! pairs.
//!
//! **Bad positions**: a position `≥ n_pos` reads no table entry and turns the token's q
//! and k into NaN, so the mistake shows downstream.
//!
//! **Arithmetic**: `fl(fl(a·c) − fl(b·s))` and `fl(fl(a·s) + fl(b·c))`, each product
//! rounded — the order of an unfused f32 evaluation — so the reference matches bit for
//! bit.

use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::rows::RowWalk;

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `(i, i + head_dim/2)`: the rotate-half form.
    NeoX,
    /// `(2i, 2i + 1)`: adjacent pairs.
    GptJ,
}

impl RopeStyle {
    pub fn kernel_name(self) -> &'static str {
        match self {
            RopeStyle::NeoX => "rope_neox_f32",
            RopeStyle::GptJ => "rope_gptj_f32",
        }
    }

    /// The two element indices of pair `i` of a head of `head_dim`.
    pub fn pair(self, i: u32, head_dim: u32) -> (u32, u32) {
        match self {
            RopeStyle::NeoX => (i, i + head_dim / 2),
            RopeStyle::GptJ => (2 * i, 2 * i + 1),
        }
    }

    /// [`RopeStyle::pair`] of a `u32` pair index in the kernel.
    pub(crate) fn emit_pair(self, k: &mut Builder, i: Value, head_dim: u32) -> (Value, Value) {
        match self {
            RopeStyle::NeoX => (i, k.add_const(i, head_dim / 2)),
            RopeStyle::GptJ => {
                let two_i = k.shl_const(i, 1);
                (two_i, k.add_const(two_i, 1))
            }
        }
    }
}

/// `(a·c − b·s, a·s + b·c)` with every product rounded, as [`rotate`] computes it.
pub(crate) fn emit_rotate(
    k: &mut Builder,
    a: Value,
    b: Value,
    c: Value,
    s: Value,
) -> (Value, Value) {
    let ac = k.mul(a, c);
    let bs = k.mul(b, s);
    let ra = k.sub(ac, bs);
    let as_ = k.mul(a, s);
    let bc = k.mul(b, c);
    (ra, k.add(as_, bc))
}

/// The pair `(a, b)` turned by the angle of cosine `c` and sine `s`, in the kernels' order.
pub fn rotate(a: f32, b: f32, c: f32, s: f32) -> (f32, f32) {
    (a * c - b * s, a * s + b * c)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeParams {
    pub style: RopeStyle,
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl RopeParams {
    fn half(&self) -> u32 {
        self.head_dim / 2
    }

    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: (self.n_heads + self.n_kv_heads) * self.half(),
            threads: self.threads,
        }
    }

    /// One block per token.
    pub fn launch(&self, tokens: u32) -> Launch {
        Launch::linear(tokens, self.threads)
    }

    fn check(&self) -> Result<(), KernelError> {
        let name = self.style.kernel_name();
        if self.head_dim < 2 || !self.head_dim.is_multiple_of(2) {
            return Err(KernelError::unsupported(
                name,
                format!("head_dim = {} must be even", self.head_dim),
            ));
        }
        if self.n_heads == 0 || self.n_kv_heads == 0 {
            return Err(KernelError::unsupported(
                name,
                "n_heads and n_kv_heads must be positive",
            ));
        }
        if !self.threads.is_multiple_of(32) || !(32..=1024).contains(&self.threads) {
            return Err(KernelError::unsupported(
                name,
                format!(
                    "threads = {} must be a multiple of 32 in 32..=1024",
                    self.threads
                ),
            ));
        }
        Ok(())
    }
}

/// `rope_<style>_f32(q, k, pos, cos, sin, n_pos)`, one block per token.
pub fn build(p: &RopeParams) -> Result<Function, KernelError> {
    p.check()?;
    let mut k = Builder::new(p.style.kernel_name(), p.threads);
    let q = k.param("q", gptr(Scalar::F32));
    let kk = k.param("k", gptr(Scalar::F32));
    let pos = k.param("pos", gptr(Scalar::U32));
    let cos = k.param("cos", gptr(Scalar::F32));
    let sin = k.param("sin", gptr(Scalar::F32));
    let n_pos = k.param("n_pos", Type::U32);
    let t = k.ctaid_x();
    let tid = k.tid_x();
    let at = k.ptr_add(pos, t);
    let position = k.load_with(Type::U32, at, CacheOp::Nc);
    let valid = k.lt(position, n_pos);
    let zero = k.const_u32(0);
    let row = k.select(valid, position, zero);
    let tstart = wide_mul(&mut k, row, p.half());
    let crow = k.ptr_add(cos, tstart);
    let srow = k.ptr_add(sin, tstart);
    let qstart = wide_mul(&mut k, t, p.n_heads * p.head_dim);
    let qrow = k.ptr_add(q, qstart);
    let kstart = wide_mul(&mut k, t, p.n_kv_heads * p.head_dim);
    let krow = k.ptr_add(kk, kstart);
    let nan = k.const_f32(f32::NAN);
    let (half, head_dim, q_pairs) = (p.half(), p.head_dim, p.n_heads * p.half());
    let style = p.style;

    p.walk().emit(&mut k, tid, &[], &|k, g, _| {
        // Pair g: of q while g < q_pairs, then of k.
        let limit = k.const_u32(q_pairs);
        let in_q = k.lt(g, limit);
        let kg = k.sub(g, limit);
        let local = k.select(in_q, g, kg);
        let base = k.select(in_q, qrow, krow);
        let hv = k.const_u32(half);
        let head = k.div(local, hv);
        let i = k.rem(local, hv);
        let c_at = k.ptr_add(crow, i);
        let s_at = k.ptr_add(srow, i);
        let c = k.load_with(Type::F32, c_at, CacheOp::Nc);
        let s = k.load_with(Type::F32, s_at, CacheOp::Nc);
        let head_start = k.mul_const(head, head_dim);
        let (ia, ib) = style.emit_pair(k, i, head_dim);
        let ia = k.add(head_start, ia);
        let ib = k.add(head_start, ib);
        let pa = k.ptr_add(base, ia);
        let pb = k.ptr_add(base, ib);
        let a = k.load(Type::F32, pa);
        let b = k.load(Type::F32, pb);
        let (ra, rb) = emit_rotate(k, a, b, c, s);
        let ra = k.select(valid, ra, nan);
        let rb = k.select(valid, rb, nan);
        k.store(pa, ra);
        k.store(pb, rb);
        vec![]
    });
    Ok(k.finish()?)
}

/// The cosine and sine tables `[positions, freqs.len()]` of the angles `p · f`, computed
/// in f64 and rounded to f32. `freqs` are a head's rotation frequencies (`θ^(−2i/d)`,
/// after any Llama 3 scaling).
pub fn table(freqs: &[f64], positions: u32) -> (Vec<f32>, Vec<f32>) {
    let n = positions as usize * freqs.len();
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in 0..positions {
        for f in freqs {
            let angle = p as f64 * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotate `x` (`[tokens, heads, head_dim]`) as the kernel does; NaN for bad positions.
pub fn reference(
    p: &RopeParams,
    x: &[f32],
    heads: u32,
    pos: &[u32],
    cos: &[f32],
    sin: &[f32],
    n_pos: u32,
) -> Vec<f32> {
    let (half, hd) = (p.half() as usize, p.head_dim as usize);
    let mut out = x.to_vec();
    for (t, &position) in pos.iter().enumerate() {
        for h in 0..heads as usize {
            let head = &mut out[(t * heads as usize + h) * hd..][..hd];
            for i in 0..half {
                let (ia, ib) = p.style.pair(i as u32, p.head_dim);
                let (ia, ib) = (ia as usize, ib as usize);
                if position >= n_pos {
                    head[ia] = f32::NAN;
                    head[ib] = f32::NAN;
                    continue;
                }
                let (c, s) = (
                    cos[position as usize * half + i],
                    sin[position as usize * half + i],
                );
                (head[ia], head[ib]) = rotate(head[ia], head[ib], c, s);
            }
        }
    }
    out
}

/// A case of `tokens` tokens at random positions in `1..n_pos` (the last of two or more at
/// `n_pos`, out of range), q and k in ±[2^-6, 4], and tables of random angles (any
/// table is valid input; random angles change every element, so a missed write shows).
pub fn case(p: &RopeParams, tokens: u32, n_pos: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    if n_pos < 2 {
        return Err(KernelError::unsupported(
            p.style.kernel_name(),
            "a case needs n_pos >= 2",
        ));
    }
    let mut rng = data::rng(seed);
    let nq = (tokens * p.n_heads * p.head_dim) as usize;
    let nk = (tokens * p.n_kv_heads * p.head_dim) as usize;
    let q = data::signed(&mut rng, nq, 0.015625, 4.0);
    let kx = data::signed(&mut rng, nk, 0.015625, 4.0);
    let mut pos: Vec<u32> = (0..tokens)
        .map(|_| 1 + data::below(&mut rng, n_pos - 1))
        .collect();
    if tokens >= 2 {
        pos[tokens as usize - 1] = n_pos;
    }
    let angles = data::uniform(
        &mut rng,
        (n_pos * p.half()) as usize,
        0.0,
        std::f32::consts::TAU,
    );
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let want_q = reference(p, &q, p.n_heads, &pos, &cos, &sin, n_pos);
    let want_k = reference(p, &kx, p.n_kv_heads, &pos, &cos, &sin, n_pos);
    Ok(KernelCase {
        name: p.style.kernel_name().to_string(),
        shape: format!(
            "{tokens} tokens, {}+{} heads of {}",
            p.n_heads, p.n_kv_heads, p.head_dim
        ),
        kernel,
        launch: p.launch(tokens),
        buffers: vec![
            Buffer::in_out("q", data::f32_bytes(&q)),
            Buffer::in_out("k", data::f32_bytes(&kx)),
            Buffer::input("pos", pos.iter().flat_map(|v| v.to_le_bytes()).collect()),
            Buffer::input("cos", data::f32_bytes(&cos)),
            Buffer::input("sin", data::f32_bytes(&sin)),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Buffer(3),
            CaseArg::Buffer(4),
            CaseArg::Scalar(Arg::U32(n_pos)),
        ],
        expected: vec![
            Expected {
                buffer: 0,
                data: data::f32_bytes(&want_q),
                elem: Scalar::F32,
                check: Check::Exact,
            },
            Expected {
                buffer: 1,
                data: data::f32_bytes(&want_k),
                elem: Scalar::F32,
                check: Check::Exact,
            },
        ],
        controls: vec![],
        bytes_moved: 2 * 4 * (nq + nk) as u64 + tokens as u64 * (4 + 4 * p.head_dim as u64),
        flops: 3 * (nq + nk) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_are_positions() {
        let freqs = [1.0, 0.25, 1e-4];
        let (cos, sin) = table(&freqs, 5);
        assert_eq!(cos.len(), 15);
        assert_eq!((cos[0], sin[0]), (1.0, 0.0));
        for p in 0..5 {
            for (i, f) in freqs.iter().enumerate() {
                let a = p as f64 * f;
                assert_eq!(cos[p * 3 + i], a.cos() as f32);
                assert_eq!(sin[p * 3 + i], a.sin() as f32);
            }
        }
    }

    #[test]
    fn pairs() {
        assert_eq!(RopeStyle::NeoX.pair(3, 64), (3, 35));
        assert_eq!(RopeStyle::GptJ.pair(3, 64), (6, 7));
    }
}
