//! Decode attention over a paged KV cache, flash-decoding style: one query token per
//! sequence, the context cut into splits that blocks work on in parallel
//! ([`decode`]: per split the running max, the sum of weights and the unnormalized
//! output), then the splits merged — by a second kernel ([`merge`]), or by the last split
//! to finish ([`decode`]'s merging form). [`append`] writes new tokens' keys and values
//! into the cache, [`rope_append`] does so after RoPE (and qwen3's q/k norms), rotating
//! the queries too; [`prefill`] attends a chunk of a prompt on the tensor cores.
//!
//! **The paged cache**: `k_cache` and `v_cache` are arrays of 16-token blocks,
//! `[n_blocks][n_kv_heads][16][head_dim]` of [`KvElem`]: bf16; f16, whose finer mantissa
//! keeps attention within f64 bounds where bf16 does not; or f32, which keeps the keys and
//! values as computed at twice the bytes of f16; a sequence's token `t` lives in block
//! `block_table[seq][t / 16]`, row `t mod 16`. `block_table` is `[n_seqs, max_blocks]`
//! u32 and `ctx_len` `[n_seqs]` u32 (tokens in the cache, at least 1; a sequence with none
//! gets zeros). Queries `q` are `[n_seqs, n_heads, head_dim]` f32; query head `h` reads kv
//! head `h / (n_heads / n_kv_heads)` (grouped-query attention).
//!
//! **Scores in base 2**: both kernels work with `s = (q·k) · fl(scale · log2 e)`, so that
//! a weight is `2^(s − m)` (one `ex2.approx`); the split maxima `part_m` are in that
//! unit.

pub mod append;
pub mod decode;
pub mod merge;
pub mod prefill;
pub mod rope_append;

use half::{bf16, f16};
use quench_ir::{Builder, Scalar, Type, Value};

use crate::data;
use crate::lanes::{emit_pack_bf16x2, emit_unpack_bf16x2};

/// The element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvElem {
    BF16,
    F16,
    F32,
}

impl KvElem {
    pub const ALL: [KvElem; 3] = [KvElem::BF16, KvElem::F16, KvElem::F32];

    pub fn scalar(self) -> Scalar {
        match self {
            KvElem::BF16 => Scalar::BF16,
            KvElem::F16 => Scalar::F16,
            KvElem::F32 => Scalar::F32,
        }
    }

    /// Bytes of one element.
    pub fn size(self) -> u32 {
        match self {
            KvElem::BF16 | KvElem::F16 => 2,
            KvElem::F32 => 4,
        }
    }

    /// The 16-bit type the prompt attention's tensor cores take the keys and values in:
    /// the cache's own, or f16 for an f32 cache (rounded as its tiles are loaded).
    pub fn tensor_core(self) -> KvElem {
        match self {
            KvElem::F32 => KvElem::F16,
            e => e,
        }
    }

    /// `x` rounded to the element type (to nearest even), as the append kernel does.
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvElem::BF16 => bf16::from_f32(x).to_f32(),
            KvElem::F16 => f16::from_f32(x).to_f32(),
            KvElem::F32 => x,
        }
    }

    /// Values of the element type (exactly representable) as its bytes.
    pub fn bytes(self, v: &[f32]) -> Vec<u8> {
        match self {
            KvElem::BF16 => data::bf16_bytes(&data::to_bf16(v)),
            KvElem::F16 => data::f16_bytes(v),
            KvElem::F32 => data::f32_bytes(v),
        }
    }

    /// The elements of a 32-bit word (two 16-bit ones, low half first, or one f32),
    /// widened to f32 (exact).
    pub(crate) fn emit_unpack_word(self, k: &mut Builder, word: Value) -> Vec<Value> {
        match self {
            KvElem::BF16 => emit_unpack_bf16x2(k, word).to_vec(),
            KvElem::F16 => crate::lanes::emit_unpack_f16x2(k, word).to_vec(),
            KvElem::F32 => vec![k.bitcast(Type::F32, word)],
        }
    }

    /// `xs` (f32) rounded to the element type and packed into 32-bit words, the first
    /// element lowest.
    pub(crate) fn emit_pack_words(self, k: &mut Builder, xs: &[Value]) -> Vec<Value> {
        match self {
            KvElem::BF16 => xs
                .chunks(2)
                .map(|p| emit_pack_bf16x2(k, p[0], p[1]))
                .collect(),
            KvElem::F16 => xs
                .chunks(2)
                .map(|p| {
                    let l = k.cvt(Scalar::F16, p[0]);
                    let h = k.cvt(Scalar::F16, p[1]);
                    let pair = k.pack(Type::Scalar(Scalar::F16x2), &[l, h]);
                    k.bitcast(Type::U32, pair)
                })
                .collect(),
            KvElem::F32 => xs.iter().map(|&x| k.bitcast(Type::U32, x)).collect(),
        }
    }
}

/// Tokens per cache block.
pub const BLOCK_TOKENS: u32 = 16;

/// A paged cache and its queries on the host: what the cases upload and the references
/// read.
#[derive(Clone, Debug)]
pub struct PagedCache {
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub max_blocks: u32,
    pub q: Vec<f32>,
    /// The element type of `k` and `v`, whose values it represents exactly.
    pub elem: KvElem,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub block_table: Vec<u32>,
    pub ctx_len: Vec<u32>,
}

impl PagedCache {
    pub fn n_seqs(&self) -> usize {
        self.ctx_len.len()
    }

    fn group(&self) -> u32 {
        self.n_heads / self.n_kv_heads
    }

    /// Row `t` of kv head `kvh` of sequence `seq`: (keys, values).
    pub fn kv_row(&self, seq: usize, kvh: u32, t: u32) -> (&[f32], &[f32]) {
        let blk = self.block_table[seq * self.max_blocks as usize + (t / BLOCK_TOKENS) as usize];
        let row = ((blk * self.n_kv_heads + kvh) * BLOCK_TOKENS + t % BLOCK_TOKENS) as usize;
        let d = self.head_dim as usize;
        (
            &self.k[row * d..(row + 1) * d],
            &self.v[row * d..(row + 1) * d],
        )
    }

    pub fn q_head(&self, seq: usize, h: u32) -> &[f32] {
        let d = self.head_dim as usize;
        let at = (seq * self.n_heads as usize + h as usize) * d;
        &self.q[at..at + d]
    }

    /// Exact base-2 scores `(q·k)·scale·log2 e` of head `h` over tokens `lo..hi`, and
    /// `Σ |q_i k_i|` of each (for the rounding bound of the dot product).
    pub fn scores(&self, seq: usize, h: u32, lo: u32, hi: u32, scale: f64) -> Vec<(f64, f64)> {
        let q = self.q_head(seq, h);
        let c = scale * std::f64::consts::LOG2_E;
        (lo..hi)
            .map(|t| {
                let (k, _) = self.kv_row(seq, h / self.group(), t);
                let (dot, abs) = q.iter().zip(k).fold((0.0, 0.0), |(d, a), (&qi, &ki)| {
                    let p = qi as f64 * ki as f64;
                    (d + p, a + p.abs())
                });
                (dot * c, abs * c.abs())
            })
            .collect()
    }

    /// Exact attention of every (sequence, head) in f64, `[n_seqs, n_heads, head_dim]`,
    /// and `Σ w|v| / Σ w` per element (the scale of rounding errors), with weights
    /// `w_t = 2^(s_t − max s)`.
    pub fn attend(&self, scale: f64) -> (Vec<f64>, Vec<f64>) {
        let d = self.head_dim as usize;
        let (mut out, mut abs) = (vec![], vec![]);
        for seq in 0..self.n_seqs() {
            for h in 0..self.n_heads {
                let s = self.scores(seq, h, 0, self.ctx_len[seq], scale);
                let top = s.iter().fold(f64::NEG_INFINITY, |a, &(v, _)| a.max(v));
                let (mut acc, mut mag, mut total) = (vec![0.0; d], vec![0.0; d], 0.0);
                for (t, &(v, _)) in s.iter().enumerate() {
                    let w = (v - top).exp2();
                    total += w;
                    let (_, vr) = self.kv_row(seq, h / self.group(), t as u32);
                    for i in 0..d {
                        acc[i] += w * vr[i] as f64;
                        mag[i] += w * (vr[i] as f64).abs();
                    }
                }
                let total = if total > 0.0 { total } else { 1.0 };
                out.extend(acc.iter().map(|a| a / total));
                abs.extend(mag.iter().map(|a| a / total));
            }
        }
        (out, abs)
    }

    /// A cache of random contents: `n_seqs` sequences with the given context lengths
    /// (each at most `max_blocks · 16`), their blocks a random permutation of
    /// `n_seqs · max_blocks + 3` physical blocks (some unused), q in ±[2^-4, 2], keys and
    /// values in ±[2^-6, 1] of element type `elem`.
    pub fn random(
        rng: &mut rand_chacha::ChaCha8Rng,
        elem: KvElem,
        head_dim: u32,
        n_heads: u32,
        n_kv_heads: u32,
        max_blocks: u32,
        ctx_len: Vec<u32>,
    ) -> PagedCache {
        let n_seqs = ctx_len.len() as u32;
        let physical = n_seqs * max_blocks + 3;
        let mut ids: Vec<u32> = (0..physical).collect();
        // Fisher–Yates with the case's generator.
        for i in (1..ids.len()).rev() {
            let j = data::below(rng, i as u32 + 1) as usize;
            ids.swap(i, j);
        }
        let block_table = ids[..(n_seqs * max_blocks) as usize].to_vec();
        let cache = (physical * n_kv_heads * BLOCK_TOKENS * head_dim) as usize;
        let q = data::signed(rng, (n_seqs * n_heads * head_dim) as usize, 0.0625, 2.0);
        let mut kv = || -> Vec<f32> {
            data::signed(rng, cache, 0.015625, 1.0)
                .into_iter()
                .map(|x| elem.round(x))
                .collect()
        };
        let (k, v) = (kv(), kv());
        PagedCache {
            head_dim,
            n_heads,
            n_kv_heads,
            max_blocks,
            q,
            elem,
            k,
            v,
            block_table,
            ctx_len,
        }
    }
}
