//! RoPE and the KV-cache append in one kernel, with qwen3's per-head q/k RMSNorm in front
//! when asked: a decode step's queries are rotated in place, its keys rotated on the way
//! into the paged cache and its values copied there (see [`super`] for the cache).
//!
//! Per token `t` of the batch (sequence `seq[t]`, position `pos[t]`):
//! - with `qk_norm`, each head of q and k becomes `(x · inv) · w` with `inv = 1 /
//!   sqrt(mean(x²) + eps)` of that head and `w` the `[head_dim]` weight of q or k
//!   ([`crate::qgemv::prologue`], reduced over one warp);
//! - each head's pairs turn by `pos · f_i` as [`crate::rope`] turns them (same tables,
//!   same pairs, same rounding), q written back in place;
//! - the rotated keys and the values, rounded to the cache's element type, go to block
//!   `block_table[seq][pos / 16]`, row `pos mod 16`.
//!
//! A position outside the tables (`≥ n_pos`) or past the block table (`≥ max_blocks ·
//! 16`) turns the token's q into NaN, so that the mistake shows downstream, and writes
//! nothing to the cache.
//!
//! **Layout**: `q` `[tokens, n_heads, head_dim]`, `k`, `v` `[tokens, n_kv_heads,
//! head_dim]` f32 (`k` and `v` only read), each token's row
//! [`RopeAppendParams::token_stride`] elements after the last's when that is set (the
//! q, k and v parts of a fused projection's `[tokens, q|k|v]` output); `seq`, `pos` `[tokens]` u32; `block_table`
//! `[n_seqs, max_blocks]` u32; `cos`, `sin` `[n_pos, head_dim / 2]` f32
//! ([`crate::rope::table`]); `q_norm`, `k_norm` `[head_dim]` f32. One block per token;
//! warp `w` of the block takes heads `w, w + warps, ...` of the `n_heads + n_kv_heads`
//! (q's first), its lanes the head's pairs (and, for a key head, its value's groups of
//! four) `lane, lane + 32, ...`.
//!
//! **Arithmetic**: IEEE operations in a fixed order (the warp's reduction of the norm
//! included), so [`reference()`] matches bit for bit; the result is what `rope_*_f32` and
//! `kv_append_*` compute after `rmsnorm_residual_f32` of each head.

use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use super::append::{self, emit_block, emit_row_start, store_group, AppendParams};
use super::{KvElem, PagedCache, BLOCK_TOKENS};
use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::qgemv::prologue::{emit_inv_rms, normalize};
use crate::rope::{emit_rotate, rotate, RopeStyle};
use crate::rows::RowWalk;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeAppendParams {
    pub style: RopeStyle,
    /// The per-head q/k RMSNorm before the rotation (qwen3).
    pub qk_norm: bool,
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    /// Block-table row length.
    pub max_blocks: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
    /// The cache's element type.
    pub kv: KvElem,
    /// Elements from one token's q (and k, and v) row to the next token's; 0 for packed
    /// rows (`n_heads · head_dim` and `n_kv_heads · head_dim` apart).
    pub token_stride: u32,
}

/// Library names by style, q/k norm and cache element type.
pub fn name(style: RopeStyle, qk_norm: bool, kv: KvElem) -> &'static str {
    use KvElem::*;
    use RopeStyle::*;
    match (style, qk_norm, kv) {
        (NeoX, false, BF16) => "rope_append_neox_bf16",
        (NeoX, false, F16) => "rope_append_neox_f16",
        (NeoX, false, F32) => "rope_append_neox_f32",
        (NeoX, true, BF16) => "rope_append_neox_qknorm_bf16",
        (NeoX, true, F16) => "rope_append_neox_qknorm_f16",
        (NeoX, true, F32) => "rope_append_neox_qknorm_f32",
        (GptJ, false, BF16) => "rope_append_gptj_bf16",
        (GptJ, false, F16) => "rope_append_gptj_f16",
        (GptJ, false, F32) => "rope_append_gptj_f32",
        (GptJ, true, BF16) => "rope_append_gptj_qknorm_bf16",
        (GptJ, true, F16) => "rope_append_gptj_qknorm_f16",
        (GptJ, true, F32) => "rope_append_gptj_qknorm_f32",
    }
}

/// Threads of the warp that norms one head: its reduction never leaves the warp.
const HEAD_THREADS: u32 = 32;

impl RopeAppendParams {
    pub fn name(&self) -> &'static str {
        name(self.style, self.qk_norm, self.kv)
    }

    fn half(&self) -> u32 {
        self.head_dim / 2
    }

    /// One block per token.
    pub fn launch(&self, tokens: u32) -> Launch {
        Launch::linear(tokens, self.threads)
    }

    fn check(&self) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::unsupported(self.name(), m));
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(4) {
            return bad(format!(
                "head_dim = {} must be a positive multiple of 4",
                self.head_dim
            ));
        }
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.max_blocks == 0 {
            return bad(format!(
                "n_heads = {}, n_kv_heads = {} and max_blocks = {} must be positive",
                self.n_heads, self.n_kv_heads, self.max_blocks
            ));
        }
        if !self.threads.is_multiple_of(32) || !(32..=1024).contains(&self.threads) {
            return bad(format!(
                "threads = {} must be a multiple of 32 in 32..=1024",
                self.threads
            ));
        }
        let widest = self.n_heads.max(self.n_kv_heads) * self.head_dim;
        if self.token_stride != 0 && self.token_stride < widest {
            return bad(format!(
                "token_stride = {} is less than a row of {widest}",
                self.token_stride
            ));
        }
        Ok(())
    }

    /// Elements between consecutive tokens' q rows and k (or v) rows.
    fn strides(&self) -> (u32, u32) {
        match self.token_stride {
            0 => (
                self.n_heads * self.head_dim,
                self.n_kv_heads * self.head_dim,
            ),
            s => (s, s),
        }
    }
}

/// `rope_append_<style>[_qknorm]_<kv>(q, k, v, seq, pos, block_table, cos, sin, n_pos,
/// k_cache, v_cache[, q_norm, k_norm, eps])`, one block per token.
pub fn build(p: &RopeAppendParams) -> Result<Function, KernelError> {
    p.check()?;
    let (hd, half) = (p.head_dim, p.half());
    let mut k = Builder::new(p.name(), p.threads);
    let q = k.param("q", gptr(Scalar::F32));
    let kin = k.param("k", gptr(Scalar::F32));
    let vin = k.param("v", gptr(Scalar::F32));
    let seqs = k.param("seq", gptr(Scalar::U32));
    let poss = k.param("pos", gptr(Scalar::U32));
    let table = k.param("block_table", gptr(Scalar::U32));
    let cos = k.param("cos", gptr(Scalar::F32));
    let sin = k.param("sin", gptr(Scalar::F32));
    let n_pos = k.param("n_pos", Type::U32);
    let kc = k.param("k_cache", gptr(p.kv.scalar()));
    let vc = k.param("v_cache", gptr(p.kv.scalar()));
    let norms = p.qk_norm.then(|| {
        let qn = k.param("q_norm", gptr(Scalar::F32));
        let kn = k.param("k_norm", gptr(Scalar::F32));
        (qn, kn, k.param("eps", Type::F32))
    });

    let t = k.ctaid_x();
    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let at = k.ptr_add(seqs, t);
    let seq = k.load_with(Type::U32, at, CacheOp::Nc);
    let at = k.ptr_add(poss, t);
    let pos = k.load_with(Type::U32, at, CacheOp::Nc);
    let bi = k.shr_const(pos, 4);
    let in_tables = k.lt(pos, n_pos);
    let mb = k.const_u32(p.max_blocks);
    let in_cache = k.lt(bi, mb);
    let valid = k.and(in_tables, in_cache);
    // A bad position reads row 0 of the tables and block 0 of its table row, and keeps
    // nothing of either.
    let zero = k.const_u32(0);
    let row = k.select(valid, pos, zero);
    let bi = k.select(valid, bi, zero);
    let blk = emit_block(&mut k, table, seq, p.max_blocks, bi);
    let tstart = wide_mul(&mut k, row, half);
    let crow = k.ptr_add(cos, tstart);
    let srow = k.ptr_add(sin, tstart);
    let (q_stride, kv_stride) = p.strides();
    let qstart = wide_mul(&mut k, t, q_stride);
    let qrow = k.ptr_add(q, qstart);
    let kvstart = wide_mul(&mut k, t, kv_stride);
    let krow = k.ptr_add(kin, kvstart);
    let vrow = k.ptr_add(vin, kvstart);
    let nan = k.const_f32(f32::NAN);

    let (warps, heads) = (p.threads / 32, p.n_heads + p.n_kv_heads);
    let pairs = RowWalk {
        groups: half,
        threads: HEAD_THREADS,
    };
    let groups = RowWalk {
        groups: hd / 4,
        threads: HEAD_THREADS,
    };
    for round in 0..heads.div_ceil(warps) {
        let head = k.add_const(warp, round * warps);
        let total = k.const_u32(heads);
        let has = k.lt(head, total);
        k.if_then(has, |k| {
            let nq = k.const_u32(p.n_heads);
            let is_q = k.lt(head, nq);
            // The kv head (meaningless for a query head, whose branches never use it).
            let kvh = k.sub(head, nq);
            let local = k.select(is_q, head, kvh);
            let start = k.mul_const(local, hd);
            let base = k.select(is_q, qrow, krow);
            let base = k.ptr_add(base, start);
            let is_k = k.not(is_q);
            let to_cache = k.and(is_k, valid);
            let dst = emit_row_start(k, blk, kvh, pos, p.n_kv_heads, hd);
            // The head's norm factor and weight, when heads are normed.
            let norm = norms.map(|(qn, kn, eps)| {
                let inv = emit_inv_rms(k, base, hd, lane, HEAD_THREADS, eps, "head");
                (inv, k.select(is_q, qn, kn))
            });
            pairs.emit(k, lane, &[], &|k, i, _| {
                let (ia, ib) = p.style.emit_pair(k, i, hd);
                let xs: Vec<Value> = [ia, ib]
                    .iter()
                    .map(|&e| {
                        let at = k.ptr_add(base, e);
                        let x = k.load(Type::F32, at);
                        match norm {
                            Some((inv, w)) => {
                                let at = k.ptr_add(w, e);
                                let w = k.load_with(Type::F32, at, CacheOp::Nc);
                                let n = k.mul(x, inv);
                                k.mul(n, w)
                            }
                            None => x,
                        }
                    })
                    .collect();
                let at = k.ptr_add(crow, i);
                let c = k.load_with(Type::F32, at, CacheOp::Nc);
                let at = k.ptr_add(srow, i);
                let s = k.load_with(Type::F32, at, CacheOp::Nc);
                let (ra, rb) = emit_rotate(k, xs[0], xs[1], c, s);
                let out = [(ia, ra), (ib, rb)];
                k.if_then(is_q, |k| {
                    for (e, r) in out {
                        let r = k.select(valid, r, nan);
                        let at = k.ptr_add(base, e);
                        k.store(at, r);
                    }
                });
                k.if_then(to_cache, |k| {
                    for (e, r) in out {
                        let e = k.cvt(Scalar::U64, e);
                        let e = k.add(dst, e);
                        let at = k.ptr_add(kc, e);
                        let r = match p.kv {
                            KvElem::F32 => r,
                            kv => k.cvt(kv.scalar(), r),
                        };
                        k.store(at, r);
                    }
                });
                vec![]
            });
            k.if_then(to_cache, |k| {
                let vhead = k.ptr_add(vrow, start);
                groups.emit(k, lane, &[], &|k, g, _| {
                    let e = k.shl_const(g, 2);
                    let e64 = k.cvt(Scalar::U64, e);
                    let at = k.add(dst, e64);
                    store_group(k, p.kv, vhead, e, vc, at);
                    vec![]
                });
            });
        });
    }
    Ok(k.finish()?)
}

/// The per-head norm weights and epsilon of a qk-normed case.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadNorms {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub eps: f32,
}

/// The inputs of one launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokens {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub seq: Vec<u32>,
    pub pos: Vec<u32>,
}

/// What the kernel computes: the new q (returned) and the cache after the writes
/// (`cache.k`, `cache.v` updated).
pub fn reference(
    p: &RopeAppendParams,
    cache: &mut PagedCache,
    x: &Tokens,
    cos: &[f32],
    sin: &[f32],
    n_pos: u32,
    norms: Option<&HeadNorms>,
) -> Vec<f32> {
    let (hd, half) = (p.head_dim as usize, p.half() as usize);
    let turn = |head: &[f32], w: Option<&[f32]>, position: u32| -> Vec<f32> {
        let mut h = match (w, norms) {
            (Some(w), Some(n)) => normalize(head, w, HEAD_THREADS, n.eps),
            _ => head.to_vec(),
        };
        for i in 0..half {
            let (ia, ib) = p.style.pair(i as u32, p.head_dim);
            let (ia, ib) = (ia as usize, ib as usize);
            let at = position as usize * half + i;
            (h[ia], h[ib]) = rotate(h[ia], h[ib], cos[at], sin[at]);
        }
        h
    };
    let mut q = x.q.clone();
    // The valid tokens' rotated keys and values, appended as `kv_append` appends.
    let (mut keys, mut values, mut seq, mut pos) = (vec![], vec![], vec![], vec![]);
    let kv_row = (p.n_kv_heads * p.head_dim) as usize;
    for (t, (&s, &position)) in x.seq.iter().zip(&x.pos).enumerate() {
        let valid = position < n_pos && position / BLOCK_TOKENS < p.max_blocks;
        for h in 0..p.n_heads as usize {
            let at = (t * p.n_heads as usize + h) * hd;
            let out = &mut q[at..at + hd];
            if valid {
                out.copy_from_slice(&turn(
                    &x.q[at..at + hd],
                    norms.map(|n| n.q.as_slice()),
                    position,
                ));
            } else {
                out.fill(f32::NAN);
            }
        }
        if valid {
            for head in x.k[t * kv_row..(t + 1) * kv_row].chunks_exact(hd) {
                keys.extend(turn(head, norms.map(|n| n.k.as_slice()), position));
            }
            values.extend_from_slice(&x.v[t * kv_row..(t + 1) * kv_row]);
            seq.push(s);
            pos.push(position);
        }
    }
    let ap = AppendParams {
        head_dim: p.head_dim,
        n_kv_heads: p.n_kv_heads,
        max_blocks: p.max_blocks,
        threads: p.threads,
        kv: p.kv,
    };
    append::reference(&ap, cache, &keys, &values, &seq, &pos);
    q
}

/// A case: a random cache of `n_seqs` sequences and `tokens` new tokens at distinct
/// (sequence, position) pairs inside both the tables and the cache, the last of two or
/// more at a position past the tables (its q NaN, nothing written); q, k, v in ±[2^-6,
/// 4]; tables of random angles (every element changes, so a missed write shows); norm
/// weights in [0.5, 1.5], eps 1e-6.
pub fn case(
    p: &RopeAppendParams,
    n_seqs: u32,
    tokens: u32,
    n_pos: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let reach = n_pos.min(p.max_blocks * BLOCK_TOKENS);
    let placed = if tokens >= 2 { tokens - 1 } else { tokens };
    if n_seqs == 0 || placed as u64 > n_seqs as u64 * reach as u64 {
        return Err(KernelError::unsupported(
            p.name(),
            format!("{placed} tokens do not fit {n_seqs} sequences of {reach} positions"),
        ));
    }
    let mut cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_kv_heads,
        p.n_kv_heads,
        p.max_blocks,
        vec![0; n_seqs as usize],
    );
    let nq = (tokens * p.n_heads * p.head_dim) as usize;
    let nk = (tokens * p.n_kv_heads * p.head_dim) as usize;
    let (q, k, v) = (
        data::signed(&mut rng, nq, 0.015625, 4.0),
        data::signed(&mut rng, nk, 0.015625, 4.0),
        data::signed(&mut rng, nk, 0.015625, 4.0),
    );
    let mut taken = std::collections::HashSet::new();
    let (mut seq, mut pos) = (vec![], vec![]);
    while seq.len() < placed as usize {
        // Distinct (sequence, position) pairs: two tokens never write one row.
        let (s, ps) = (data::below(&mut rng, n_seqs), data::below(&mut rng, reach));
        if taken.insert((s, ps)) {
            seq.push(s);
            pos.push(ps);
        }
    }
    if tokens >= 2 {
        seq.push(data::below(&mut rng, n_seqs));
        pos.push(n_pos + data::below(&mut rng, 16));
    }
    let angles = data::uniform(
        &mut rng,
        (n_pos * p.half()) as usize,
        0.0,
        std::f32::consts::TAU,
    );
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let norms = p.qk_norm.then(|| HeadNorms {
        q: data::uniform(&mut rng, p.head_dim as usize, 0.5, 1.5),
        k: data::uniform(&mut rng, p.head_dim as usize, 0.5, 1.5),
        eps: 1e-6,
    });
    let x = Tokens { q, k, v, seq, pos };
    let before = cache.clone();
    let want_q = reference(p, &mut cache, &x, &cos, &sin, n_pos, norms.as_ref());
    let u32s = |x: &[u32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    // Rows `stride` apart, NaN between them (which a kernel that read there would spread).
    let (q_stride, kv_stride) = p.strides();
    let spread = |packed: &[f32], row: u32, stride: u32| -> Vec<u8> {
        let mut out = vec![f32::NAN; (tokens * stride) as usize];
        for (t, r) in packed.chunks_exact(row as usize).enumerate() {
            out[t * stride as usize..][..row as usize].copy_from_slice(r);
        }
        data::f32_bytes(&out)
    };
    let (q_row, kv_row) = (p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim);
    let mut buffers = vec![
        Buffer::in_out("q", spread(&x.q, q_row, q_stride)),
        Buffer::input("k", spread(&x.k, kv_row, kv_stride)),
        Buffer::input("v", spread(&x.v, kv_row, kv_stride)),
        Buffer::input("seq", u32s(&x.seq)),
        Buffer::input("pos", u32s(&x.pos)),
        Buffer::input("block_table", u32s(&before.block_table)),
        Buffer::input("cos", data::f32_bytes(&cos)),
        Buffer::input("sin", data::f32_bytes(&sin)),
        Buffer::in_out("k_cache", p.kv.bytes(&before.k)),
        Buffer::in_out("v_cache", p.kv.bytes(&before.v)),
    ];
    let mut args: Vec<CaseArg> = (0..8).map(CaseArg::Buffer).collect();
    args.extend([
        CaseArg::Scalar(Arg::U32(n_pos)),
        CaseArg::Buffer(8),
        CaseArg::Buffer(9),
    ]);
    if let Some(n) = &norms {
        buffers.push(Buffer::input("q_norm", data::f32_bytes(&n.q)));
        buffers.push(Buffer::input("k_norm", data::f32_bytes(&n.k)));
        args.extend([
            CaseArg::Buffer(10),
            CaseArg::Buffer(11),
            CaseArg::Scalar(Arg::F32(n.eps)),
        ]);
    }
    let exact = |buffer: usize, data: Vec<u8>, elem: Scalar| Expected {
        buffer,
        data,
        elem,
        check: Check::Exact,
    };
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!(
            "{tokens} tokens, {}+{} heads of {} into {n_seqs} sequences of {}",
            p.n_heads,
            p.n_kv_heads,
            p.head_dim,
            p.max_blocks * BLOCK_TOKENS
        ),
        kernel,
        launch: p.launch(tokens),
        buffers,
        args,
        expected: vec![
            exact(0, spread(&want_q, q_row, q_stride), Scalar::F32),
            exact(8, p.kv.bytes(&cache.k), p.kv.scalar()),
            exact(9, p.kv.bytes(&cache.v), p.kv.scalar()),
        ],
        controls: vec![],
        bytes_moved: 4 * (2 * nq + 2 * nk) as u64
            + 2 * nk as u64 * 2
            + tokens as u64 * (12 + 4 * p.head_dim as u64),
        flops: 3 * (nq + nk) as u64,
    })
}
