//! Writing new tokens' keys and values into the paged cache (see [`super`]): token `i`
//! of the batch, of sequence `seq[i]` at position `pos[i]`, goes to block
//! `block_table[seq[i]][pos[i] / 16]`, row `pos[i] mod 16`, rounded to the cache's
//! element type ([`KvElem`]).
//!
//! **Layout**: `k`, `v` `[tokens, n_kv_heads, head_dim]` f32 (keys after RoPE); `seq`,
//! `pos` `[tokens]` u32; `block_table` `[n_seqs, max_blocks]` u32; the caches as in
//! [`super`], updated in place. One block per token; the `n_kv_heads · head_dim / 4`
//! groups of four elements of both k and v are walked by [`crate::rows::RowWalk`]. A
//! position past `max_blocks · 16` writes nothing (the engine refuses such contexts
//! before it gets here). Rounding to the element type is the only operation: exact, bit
//! for bit.

use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::Launch;

use super::{KvElem, PagedCache, BLOCK_TOKENS};
use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::rows::{self, RowWalk};

/// Library names, by cache element type.
pub const NAME: &str = "kv_append_bf16";
pub const NAME_F16: &str = "kv_append_f16";
pub const NAME_F32: &str = "kv_append_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendParams {
    pub head_dim: u32,
    pub n_kv_heads: u32,
    pub max_blocks: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
    /// The cache's element type.
    pub kv: KvElem,
}

/// The library name of the kernel over a cache of `kv`.
pub fn name(kv: KvElem) -> &'static str {
    match kv {
        KvElem::BF16 => NAME,
        KvElem::F16 => NAME_F16,
        KvElem::F32 => NAME_F32,
    }
}

impl AppendParams {
    pub fn name(&self) -> &'static str {
        name(self.kv)
    }

    fn row(&self) -> u32 {
        self.n_kv_heads * self.head_dim
    }

    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.row() / 4,
            threads: self.threads,
        }
    }

    pub fn launch(&self, tokens: u32) -> Launch {
        Launch::linear(tokens, self.threads)
    }
}

/// `kv_append_<bf16|f16|f32>(k, v, seq, pos, block_table, k_cache, v_cache)`, one block per
/// token.
pub fn build(p: &AppendParams) -> Result<Function, KernelError> {
    if p.head_dim == 0 || !p.head_dim.is_multiple_of(4) || p.n_kv_heads == 0 || p.max_blocks == 0 {
        return Err(KernelError::unsupported(
            p.name(),
            format!(
                "head_dim = {} must be a positive multiple of 4; n_kv_heads = {} and max_blocks = {} positive",
                p.head_dim, p.n_kv_heads, p.max_blocks
            ),
        ));
    }
    rows::check(p.name(), p.row(), 4, p.threads)?;
    let mut k = Builder::new(p.name(), p.threads);
    let kin = k.param("k", gptr(Scalar::F32));
    let vin = k.param("v", gptr(Scalar::F32));
    let seqs = k.param("seq", gptr(Scalar::U32));
    let poss = k.param("pos", gptr(Scalar::U32));
    let table = k.param("block_table", gptr(Scalar::U32));
    let kc = k.param("k_cache", gptr(p.kv.scalar()));
    let vc = k.param("v_cache", gptr(p.kv.scalar()));
    let t = k.ctaid_x();
    let tid = k.tid_x();
    let at = k.ptr_add(seqs, t);
    let seq = k.load_with(Type::U32, at, CacheOp::Nc);
    let at = k.ptr_add(poss, t);
    let pos = k.load_with(Type::U32, at, CacheOp::Nc);
    let bi = k.shr_const(pos, 4);
    let mb = k.const_u32(p.max_blocks);
    let inside = k.lt(bi, mb);
    let (hd, kvh, row) = (p.head_dim, p.n_kv_heads, p.row());
    let walk = p.walk();
    k.if_then(inside, |k| {
        let blk = emit_block(k, table, seq, p.max_blocks, bi);
        let src = wide_mul(k, t, row);
        let ks = k.ptr_add(kin, src);
        let vs = k.ptr_add(vin, src);
        walk.emit(k, tid, &[], &|k, g, _| {
            // Group g: elements 4g.. of head h = 4g / head_dim.
            let e = k.shl_const(g, 2);
            let hv = k.const_u32(hd);
            let h = k.div(e, hv);
            let i = k.rem(e, hv);
            let dst = emit_row_start(k, blk, h, pos, kvh, hd);
            let i64 = k.cvt(Scalar::U64, i);
            let dst = k.add(dst, i64);
            for (from, to) in [(ks, kc), (vs, vc)] {
                store_group(k, p.kv, from, e, to, dst);
            }
            vec![]
        });
    });
    Ok(k.finish()?)
}

/// The physical block `block_table[seq][bi]` (`bi` within the row).
pub(super) fn emit_block(
    k: &mut Builder,
    table: Value,
    seq: Value,
    max_blocks: u32,
    bi: Value,
) -> Value {
    let trow = wide_mul(k, seq, max_blocks);
    let trow = k.ptr_add(table, trow);
    let at = k.ptr_add(trow, bi);
    k.load_with(Type::U32, at, CacheOp::Nc)
}

/// The element offset (u64) in either cache of the row of position `pos` (its row
/// `pos mod 16` of physical block `blk`) for kv head `head`.
pub(super) fn emit_row_start(
    k: &mut Builder,
    blk: Value,
    head: Value,
    pos: Value,
    n_kv_heads: u32,
    head_dim: u32,
) -> Value {
    let b = k.mul_const(blk, n_kv_heads);
    let b = k.add(b, head);
    let r = k.mul_const(b, BLOCK_TOKENS);
    let within = k.and_const(pos, BLOCK_TOKENS - 1);
    let r = k.add(r, within);
    wide_mul(k, r, head_dim)
}

/// Four f32 at element `e` of `from`, rounded to `kv`, stored at element `dst` of `to`.
pub(super) fn store_group(
    k: &mut Builder,
    kv: KvElem,
    from: Value,
    e: Value,
    to: Value,
    dst: Value,
) {
    let at = k.ptr_add(from, e);
    let v = k.load_with(Type::Vec(Scalar::F32, 4), at, CacheOp::Nc);
    let xs: Vec<Value> = (0..4).map(|i| k.extract(v, i)).collect();
    let packed = kv.emit_pack_words(k, &xs);
    let group = k.pack(Type::Vec(Scalar::U32, packed.len() as u8), &packed);
    let words = k.ptr_cast(Scalar::U32, to);
    let w = word_of(k, kv, dst);
    let at = k.ptr_add(words, w);
    k.store(at, group);
}

/// The 32-bit word of either cache holding element `e` (u64) of type `kv`.
pub(super) fn word_of(k: &mut Builder, kv: KvElem, e: Value) -> Value {
    match kv.size() {
        4 => e,
        _ => k.shr_const(e, 1),
    }
}

/// The caches after the append (`cache.k`, `cache.v` updated).
pub fn reference(
    p: &AppendParams,
    cache: &mut PagedCache,
    k: &[f32],
    v: &[f32],
    seq: &[u32],
    pos: &[u32],
) {
    let (row, hd) = (p.row() as usize, p.head_dim as usize);
    for (t, (&s, &ps)) in seq.iter().zip(pos).enumerate() {
        if ps / BLOCK_TOKENS >= p.max_blocks {
            continue;
        }
        let blk = cache.block_table[(s * p.max_blocks + ps / BLOCK_TOKENS) as usize];
        for h in 0..p.n_kv_heads {
            let r = ((blk * p.n_kv_heads + h) * BLOCK_TOKENS + ps % BLOCK_TOKENS) as usize * hd;
            let src = t * row + h as usize * hd;
            for i in 0..hd {
                cache.k[r + i] = cache.elem.round(k[src + i]);
                cache.v[r + i] = cache.elem.round(v[src + i]);
            }
        }
    }
}

/// A case: a random cache of `n_seqs` sequences and `tokens` new tokens, each of a random
/// sequence at a random position (distinct per sequence), the last of two or more past
/// the cache (writing nothing). Keys and values in ±[2^-6, 4].
pub fn case(
    p: &AppendParams,
    n_seqs: u32,
    tokens: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let mut cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_kv_heads,
        p.n_kv_heads,
        p.max_blocks,
        vec![0; n_seqs as usize],
    );
    let n = (tokens * p.row()) as usize;
    let k = data::signed(&mut rng, n, 0.015625, 4.0);
    let v = data::signed(&mut rng, n, 0.015625, 4.0);
    let cap = p.max_blocks * BLOCK_TOKENS;
    if tokens as u64 > n_seqs as u64 * cap as u64 {
        return Err(KernelError::unsupported(
            p.name(),
            format!("{tokens} tokens do not fit {n_seqs} sequences of {cap}"),
        ));
    }
    let mut taken = std::collections::HashSet::new();
    let (mut seq, mut pos) = (vec![], vec![]);
    while seq.len() < tokens as usize {
        // Distinct (sequence, position) pairs: two tokens never write one row.
        let (s, ps) = (data::below(&mut rng, n_seqs), data::below(&mut rng, cap));
        if taken.insert((s, ps)) {
            seq.push(s);
            pos.push(ps);
        }
    }
    if tokens >= 2 {
        pos[tokens as usize - 1] = cap + data::below(&mut rng, 100);
    }
    let before = cache.clone();
    reference(p, &mut cache, &k, &v, &seq, &pos);
    let u32s = |x: &[u32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!(
            "{tokens} tokens of {}x{} into {n_seqs} sequences of {cap}",
            p.n_kv_heads, p.head_dim
        ),
        kernel,
        launch: p.launch(tokens),
        buffers: vec![
            Buffer::input("k", data::f32_bytes(&k)),
            Buffer::input("v", data::f32_bytes(&v)),
            Buffer::input("seq", u32s(&seq)),
            Buffer::input("pos", u32s(&pos)),
            Buffer::input("block_table", u32s(&before.block_table)),
            Buffer::in_out("k_cache", p.kv.bytes(&before.k)),
            Buffer::in_out("v_cache", p.kv.bytes(&before.v)),
        ],
        args: (0..7).map(CaseArg::Buffer).collect(),
        expected: vec![
            Expected {
                buffer: 5,
                data: p.kv.bytes(&cache.k),
                elem: p.kv.scalar(),
                check: Check::Exact,
            },
            Expected {
                buffer: 6,
                data: p.kv.bytes(&cache.v),
                elem: p.kv.scalar(),
                check: Check::Exact,
            },
        ],
        controls: vec![],
        bytes_moved: tokens as u64 * (p.row() as u64 * 12 + 8),
        flops: 0,
    })
}
