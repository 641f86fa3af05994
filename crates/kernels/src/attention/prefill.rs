//! Causal attention for a chunk of a prompt on the tensor cores (flash-attention style):
//! `n_q` consecutive query tokens of one sequence, at positions `q_start ..`, attend to
//! the sequence's cache positions up to their own (the chunk's keys and values are
//! appended to the cache first, so earlier chunks and cached prefixes come for free).
//!
//! **Layout**: `q` `[n_q, n_heads, head_dim]` f32, a token's queries `q_stride` elements
//! after the previous token's (packed when 0), rounded to the cache's element type as
//! they are loaded (the tensor cores multiply two of a kind); the cache as in [`super`],
//! bf16 ([`NAME`]), f16 ([`NAME_F16`]) or f32 ([`NAME_F32`]: its keys and values are
//! rounded to f16 as they are copied to shared memory, and the queries to f16 too),
//! `block_table` the sequence's row
//! `[max_blocks]` u32; `out` `[n_q, n_heads, head_dim]` f16 (what the output projection's
//! f16 tensor-core product reads; the values are f16 or rounded to it, so their weighted
//! averages fit). `head_dim` is 64 or 128.
//! Grid `[n_heads, ⌈n_q / 64⌉]`, 128 threads: a block takes 64 query rows of one head
//! (16 per warp) and walks the keys 64 at a time, up to its last row's position.
//!
//! **Schedule**: blocks start in the order of their ids (x fastest), and block `(h, y)`
//! takes query tile `⌈n_q / 64⌉ − 1 − y`: the last tiles, which walk the most keys,
//! start first and the one-tile blocks fill the tail (longest first), while the query
//! heads of one kv head run side by side and share its keys and values in L2. (One block
//! for all of a kv head's query heads would read each key tile once for them only by
//! growing to `group × 64` rows: 16 warps at llama's group of 4, more registers than an
//! SM has at this kernel's 164 a thread.)
//!
//! **Per key tile**: keys and values are copied to shared memory with 16-byte `cp.async`
//! (from an f32 cache: 32 bytes loaded, rounded to f16, 16 stored; the same pipeline)
//! (a row past the cached context copies the context's last row instead: its weight is
//! exactly 0 and its values finite, where the memory past the context may hold a NaN that
//! 0 times would spread); 16-byte chunk `c` of row `r` is stored at `c ^ (r mod 8)`,
//! which keeps the `ldmatrix` loads free of bank conflicts. `S = Q·Kᵀ` by
//! `mma.m16n8k16` (the queries rounded once into shared memory and loaded by `ldmatrix`
//! per tile, which leaves their 32 registers to the pipeline), scaled to
//! base 2 by `fl(scale·log2 e)` and masked above the diagonal (a warp masks only the
//! tiles that cross its rows' part of the diagonal, at most two); the running row maxima,
//! `P = ex2.approx(S − m)` rescaling the earlier sums and outputs by
//! `ex2.approx(m_old − m_new)`, then `O += P·V` with P re-used from the accumulator
//! registers as A fragments of the cache's element type and V loaded by `ldmatrix.trans`.
//! Finally `out = O / l`.
//!
//! **Pipeline**: one key and one value buffer, each loading while the other is read:
//! a tile's values are copied while its scores are computed, and the next tile's keys
//! while its values are multiplied (each half of the tile's tensor-core work covers one
//! copy; a wait and a barrier at each switch). Two whole stages of keys and values would
//! need 64 KiB at `head_dim` 128, past the 48 KiB of static shared memory; this needs
//! 32 KiB, 48 with the queries. The `ldmatrix` addresses are four lane bases per buffer
//! plus constants (the swizzle only moves a chunk within its aligned eight), a tile
//! wholly inside the context takes a copy path without clamping, and tiles below the
//! diagonal skip the mask: about 680 instructions per warp and tile, 128 of them `mma`
//! (was about 910). Registers set the blocks per SM (65536 / (128 · regs)): the kernel
//! takes 164 (three blocks per SM) where keeping the queries in registers took 182 (two).
//!
//! **Accuracy**: besides the approximate exponentials and the tensor cores' summation,
//! P is rounded to the cache's element type for the second product (the sum `l` keeps
//! the f32 weights): f16 holds weights in [0, 1] eight times as finely as bf16, down to
//! 2^-14, below which its steps are 2^-24 apart. Outputs are within a few ulps of the
//! weighted average's scale: see [`kappa`] and [`case_for`].

use half::f16;
use quench_ir::{Builder, CacheOp, FragRole, Function, MmaShape, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use super::merge;
use super::{KvElem, PagedCache, BLOCK_TOKENS};
use crate::approx::{gamma, EX2_REL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_pack_f16x2, gptr, wide_mul};

pub const NAME: &str = "attention_prefill_bf16";
pub const NAME_F16: &str = "attention_prefill_f16";
pub const NAME_F32: &str = "attention_prefill_f32";

/// The head sizes the kernel takes.
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// Query rows per block (16 per warp) and keys per tile.
const BQ: u32 = 64;
const BKV: u32 = 64;
const THREADS: u32 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillParams {
    /// The cache's element type; the tensor cores multiply [`KvElem::tensor_core`].
    pub kv: KvElem,
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub max_blocks: u32,
    /// Elements from one token's queries to the next's (0: packed, `n_heads · head_dim`).
    pub q_stride: u32,
}

/// The library name of the kernel over a cache of `kv`.
pub fn name(kv: KvElem) -> &'static str {
    match kv {
        KvElem::BF16 => NAME,
        KvElem::F16 => NAME_F16,
        KvElem::F32 => NAME_F32,
    }
}

impl PrefillParams {
    pub fn name(&self) -> &'static str {
        name(self.kv)
    }

    /// Elements from one token's queries to the next's.
    fn q_row(&self) -> u32 {
        if self.q_stride == 0 {
            self.n_heads * self.head_dim
        } else {
            self.q_stride
        }
    }

    fn group(&self) -> u32 {
        self.n_heads / self.n_kv_heads
    }

    pub fn launch(&self, n_q: u32) -> Launch {
        Launch {
            grid: [self.n_heads, n_q.div_ceil(BQ), 1],
            block: [THREADS, 1, 1],
            dynamic_shared_bytes: 0,
        }
    }

    fn check(&self) -> Result<(), KernelError> {
        let name = self.name();
        if !HEAD_DIMS.contains(&self.head_dim) {
            return Err(KernelError::unsupported(
                name,
                format!("head_dim = {} must be 64 or 128", self.head_dim),
            ));
        }
        if self.n_kv_heads == 0
            || self.n_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return Err(KernelError::unsupported(
                name,
                format!(
                    "n_heads = {} must be a positive multiple of n_kv_heads = {}",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        if self.max_blocks == 0 {
            return Err(KernelError::unsupported(
                name,
                "max_blocks must be positive",
            ));
        }
        // Queries are loaded two f32 at a time (8-byte aligned).
        if self.q_stride != 0
            && (self.q_stride < self.n_heads * self.head_dim || !self.q_stride.is_multiple_of(4))
        {
            return Err(KernelError::unsupported(
                name,
                format!(
                    "q_stride = {} must be a multiple of 4 and at least a row of {} queries",
                    self.q_stride,
                    self.n_heads * self.head_dim
                ),
            ));
        }
        Ok(())
    }
}

/// The per-lane row and column of the m16n8k16 fragments: `g = lane / 4`, `t = lane mod 4`.
struct FragLane {
    g: Value,
    t: Value,
}

/// One thread's share of copying a tile of keys or values to shared memory: chunk
/// `tid mod chunks` (16 bytes) of tile rows `tid / chunks + i·step`, `step = 128 / chunks`
/// (8 or 16), so that each of the tile's four cache blocks gives it `16 / step` rows.
struct TileCopy {
    table: Value,
    /// Tokens in the cache: rows at or past it copy its last row.
    ctx: Value,
    tid: Value,
    kvh: Value,
    /// Elements in a cache block (every kv head's 16 rows).
    block_elems: u32,
    d: u32,
    /// The cache's element type.
    kv: KvElem,
}

impl TileCopy {
    /// Issue the copies of cache rows `t0 .. t0 + BKV` of `src` into `dst` as one
    /// `cp.async` group. Only a tile reaching past the cache (the chunk's last) clamps
    /// its rows into it; no row branches.
    fn emit(&self, k: &mut Builder, t0: Value, src: Value, dst: Value) {
        let end = k.add_const(t0, BKV);
        let full = k.le(end, self.ctx);
        k.if_else(
            full,
            &[],
            |k| {
                self.rows(k, t0, src, dst, false);
                vec![]
            },
            |k| {
                self.rows(k, t0, src, dst, true);
                vec![]
            },
        );
        k.cp_async_commit();
    }

    /// The copies of one tile; `clamp`: a row past the cache copies its last row.
    fn rows(&self, k: &mut Builder, t0: Value, src: Value, dst: Value, clamp: bool) {
        let d = self.d;
        let chunks = d / 8;
        let step = THREADS / chunks;
        // Recomputed at each copy rather than kept live across the walk: registers are
        // what limits the blocks per SM.
        let chunk = k.and_const(self.tid, chunks - 1);
        let row0 = k.shr_const(self.tid, chunks.trailing_zeros());
        let last = k.const_u32(1);
        let last = k.sub(self.ctx, last);
        let head0 = k.mul_const(self.kvh, BLOCK_TOKENS * d);
        let c8 = k.shl_const(chunk, 3);
        let head0 = k.add(head0, c8);
        let head0 = k.cvt(Scalar::U64, head0);
        let dst0 = swizzled(k, row0, chunk, d);
        let to = k.ptr_add(dst, dst0);
        let tok0 = k.add(t0, row0);
        for j in 0..BKV / BLOCK_TOKENS {
            // A cache block's rows, clamped into the cache, all lie in the block its first
            // row clamps to (whose table entry is then always in the table).
            let first = k.add_const(tok0, BLOCK_TOKENS * j);
            let first = if clamp { k.min(first, last) } else { first };
            let bi = k.shr_const(first, BLOCK_TOKENS.trailing_zeros());
            let at = k.ptr_add(self.table, bi);
            let blk = k.load_with(Type::U32, at, CacheOp::Nc);
            let base = wide_mul(k, blk, self.block_elems);
            let base = k.add(base, head0);
            let from = k.ptr_add(src, base);
            for h in 0..BLOCK_TOKENS / step {
                let row = BLOCK_TOKENS * j + step * h;
                let tok = k.add_const(tok0, row);
                let tok = if clamp { k.min(tok, last) } else { tok };
                let within = k.and_const(tok, BLOCK_TOKENS - 1);
                let within = k.mul_const(within, d);
                let from_h = k.ptr_add(from, within);
                let to_h = k.const_u32(row * d);
                let to_h = k.ptr_add(to, to_h);
                match self.kv {
                    KvElem::F32 => {
                        let xs: Vec<Value> = (0..2)
                            .flat_map(|i| {
                                let o = k.const_u32(4 * i);
                                let at = k.ptr_add(from_h, o);
                                let v = k.load_with(Type::Vec(Scalar::F32, 4), at, CacheOp::Cg);
                                (0..4).map(|e| k.extract(v, e)).collect::<Vec<_>>()
                            })
                            .collect();
                        let words = KvElem::F16.emit_pack_words(k, &xs);
                        let chunk = k.pack(Type::Vec(Scalar::U32, 4), &words);
                        let at = k.ptr_cast(Scalar::U32, to_h);
                        k.store(at, chunk);
                    }
                    _ => k.cp_async(to_h, from_h, 16, CacheOp::Cg),
                }
            }
        }
    }
}

/// Element offset of 16-byte chunk `chunk` of tile row `row`: stored at chunk
/// `chunk ^ (row mod 8)`, which keeps the `ldmatrix` loads free of bank conflicts.
fn swizzled(k: &mut Builder, row: Value, chunk: Value, d: u32) -> Value {
    let r7 = k.and_const(row, 7);
    let sc = k.xor(chunk, r7);
    let sc = k.mul_const(sc, 8);
    let r = k.mul_const(row, d);
    k.add(r, sc)
}

/// The `ldmatrix.x4` addresses into a swizzled tile for one lane, whose row is
/// `row` (`row mod 8` = lane mod 8) and chunk `chunk + 2j` (`chunk` 0 or 1) for pair `j`
/// of chunks: the swizzle only moves a chunk within its aligned 8, so four bases (one per
/// `j mod 4`) plus constant offsets reach every pair, and the walk spends no integer
/// work on addresses.
struct LdmatrixAt {
    bases: Vec<Value>,
    d: u32,
}

impl LdmatrixAt {
    fn new(k: &mut Builder, tile: Value, row: Value, chunk: Value, d: u32) -> LdmatrixAt {
        let bases = (0..(d / 16).min(4))
            .map(|m| {
                let c = k.add_const(chunk, 2 * m);
                let off = swizzled(k, row, c, d);
                k.ptr_add(tile, off)
            })
            .collect();
        LdmatrixAt { bases, d }
    }

    /// The lane's address at `rows` (a multiple of 8) further down, chunk pair `j`.
    fn at(&self, k: &mut Builder, rows: u32, j: u32) -> Value {
        let off = k.const_u32(rows * self.d + 64 * (j / 4));
        k.ptr_add(self.bases[(j % 4) as usize], off)
    }
}

/// Which keys of a score tile lie past a row's position: those at `t0 + col` beyond
/// `qpos` of the lane's rows, `col = 2t + 8·tile + (i mod 2)` for element `i`.
#[derive(Clone, Copy)]
struct Mask {
    t0: Value,
    t2: Value,
    qpos: [Value; 2],
}

/// A tile's scores times `c` (base 2), masked (−∞) past each row's position when
/// `mask` is given, in fragment order, then the lane's maxima of its two rows.
fn scaled_scores(k: &mut Builder, s_tiles: &[Value], c: Value, mask: Option<Mask>) -> Vec<Value> {
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let mut vals = vec![];
    let mut tile_max = [neg_inf, neg_inf];
    for (nt, &st) in s_tiles.iter().enumerate() {
        for i in 0..4u32 {
            let x = k.extract(st, i);
            let x = k.mul(x, c);
            let row = i as usize / 2;
            let v = match mask {
                Some(m) => {
                    let col = k.add_const(m.t2, 8 * nt as u32 + (i & 1));
                    let kpos = k.add(m.t0, col);
                    let future = k.gt(kpos, m.qpos[row]);
                    k.select(future, neg_inf, x)
                }
                None => x,
            };
            tile_max[row] = k.max(tile_max[row], v);
            vals.push(v);
        }
    }
    vals.extend(tile_max);
    vals
}

/// `attention_prefill_{bf16,f16}(q, k_cache, v_cache, block_table, q_start, n_q, scale, out)`.
pub fn build(p: &PrefillParams) -> Result<Function, KernelError> {
    p.check()?;
    let d = p.head_dim;
    let elem = p.kv.tensor_core().scalar();
    let mut kb = Builder::new(p.name(), THREADS);
    let k = &mut kb;
    let q = k.param("q", gptr(Scalar::F32));
    let kc = k.param("k_cache", gptr(p.kv.scalar()));
    let vc = k.param("v_cache", gptr(p.kv.scalar()));
    let table = k.param("block_table", gptr(Scalar::U32));
    let q_start = k.param("q_start", Type::U32);
    let n_q = k.param("n_q", Type::U32);
    let scale = k.param("scale", Type::F32);
    let out = k.param("out", gptr(Scalar::F16));
    let k_s = k.shared_array("k_tile", elem, BKV * d, 128);
    let v_s = k.shared_array("v_tile", elem, BKV * d, 128);
    let q_s = k.shared_array("q_tile", elem, BQ * d, 128);

    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let fl = FragLane {
        g: k.shr_const(lane, 2),
        t: k.and_const(lane, 3),
    };
    // Blocks start in the order of their ids, heads fastest: the last query tiles, which
    // walk the most keys, go first so that the short ones fill the tail.
    let head = k.ctaid_x();
    let tiles_q = k.add_const(n_q, BQ - 1);
    let tiles_q = k.shr_const(tiles_q, BQ.trailing_zeros());
    let tile = k.ctaid_y();
    let tile = k.add_const(tile, 1);
    let tile = k.sub(tiles_q, tile);
    let gv = k.const_u32(p.group());
    let kvh = k.div(head, gv);
    let r0 = k.mul_const(tile, BQ);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let c = k.mul(scale, log2e);

    // This lane's two query rows (g and g + 8 of the warp's 16), their positions, and
    // the rows to load (clamped into the chunk; rows past it are computed, not stored).
    let wrow_local = k.mul_const(warp, 16);
    let wrow = k.add(r0, wrow_local);
    let rows: [Value; 2] = [0, 8].map(|o| {
        let r = k.add(wrow, fl.g);
        k.add_const(r, o)
    });
    let qpos: [Value; 2] = rows.map(|r| k.add(q_start, r));
    let warp_first = k.add(q_start, wrow);
    let last = k.const_u32(1);
    let last = k.sub(n_q, last);
    let load_rows: [Value; 2] = rows.map(|r| k.min(r, last));

    // Queries rounded to the element type into the warp's 16 rows of the query tile
    // (swizzled as the key tiles), each lane its pairs of rows g, g + 8, columns 2t..
    // of every 8; read back per key tile as A fragments by ldmatrix.
    let frag_a = Builder::frag_type(MmaShape::M16N8K16, FragRole::A, elem);
    let frag_b = Builder::frag_type(MmaShape::M16N8K16, FragRole::B, elem);
    let frag_c = Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32);
    let pair_ty = match frag_a {
        Type::Frag(f) => Type::Scalar(f.reg_type()),
        other => other,
    };
    let t2 = k.shl_const(fl.t, 1);
    let head_at = k.mul_const(head, d);
    let head_at = k.cvt(Scalar::U64, head_at);
    let q_rows: [Value; 2] = load_rows.map(|r| {
        let at = wide_mul(k, r, p.q_row());
        let at = k.add(at, head_at);
        k.ptr_add(q, at)
    });
    let q_w = k.ptr_cast(Scalar::U32, q_s);
    for kk in 0..d / 16 {
        for (half, col) in [(0u32, 0u32), (1, 0), (0, 8), (1, 8)] {
            let at = k.add_const(t2, 16 * kk + col);
            let at = k.ptr_add(q_rows[half as usize], at);
            let v = k.load_with(Type::Vec(Scalar::F32, 2), at, CacheOp::Nc);
            let lo = k.extract(v, 0);
            let hi = k.extract(v, 1);
            let lo = k.cvt(elem, lo);
            let hi = k.cvt(elem, hi);
            let pair = k.pack(pair_ty, &[lo, hi]);
            let word = k.bitcast(Type::U32, pair);
            let row = k.add(wrow_local, fl.g);
            let row = k.add_const(row, 8 * half);
            let chunk = k.const_u32(2 * kk + col / 8);
            let off = swizzled(k, row, chunk, d);
            let off = k.add(off, t2);
            let off = k.shr_const(off, 1);
            let at = k.ptr_add(q_w, off);
            k.store(at, word);
        }
    }

    // Key tiles up to the block's last row's position.
    let last_row = k.add_const(r0, BQ - 1);
    let last_row = k.min(last_row, last);
    let last_pos = k.add(q_start, last_row);
    let n_tiles = k.shr_const(last_pos, BKV.trailing_zeros());
    let n_tiles = k.add_const(n_tiles, 1);

    let ctx = k.add(q_start, n_q);
    let copy = TileCopy {
        table,
        ctx,
        tid,
        kvh,
        block_elems: p.n_kv_heads * BLOCK_TOKENS * d,
        d,
        kv: p.kv,
    };

    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let fzero = k.const_f32(0.0);
    let zero_c = k.pack(frag_c, &[fzero; 4]);
    // Carried: the two rows' maxima and partial sums, then the output tiles.
    let mut init = vec![neg_inf, neg_inf, fzero, fzero];
    init.extend(std::iter::repeat_n(zero_c, (d / 8) as usize));
    let lo = k.const_u32(0);
    let one = k.const_u32(1);
    // ldmatrix.x4 lanes: for K (non-transposed), lane 8i + r gives row r of key rows
    // 8·(i / 2).. and chunk i mod 2; for V (transposed), row r of tokens 8·(i mod 2)..
    // and chunk i / 2.
    let quad = k.shr_const(lane, 3);
    let r8 = k.and_const(lane, 7);
    let (half, odd) = (k.shr_const(quad, 1), k.and_const(quad, 1));
    let rows_of = |k: &mut Builder, tile: Value, buffer: Value, chunk: Value| {
        let row = k.mul_const(tile, 8);
        let row = k.add(row, r8);
        LdmatrixAt::new(k, buffer, row, chunk, d)
    };
    let k_at = rows_of(k, half, k_s, odd);
    let v_at = rows_of(k, odd, v_s, half);
    // Queries: lane l gives row l mod 16 of the warp's and chunk l / 16.
    let q_at = {
        let row = k.and_const(lane, 15);
        let row = k.add(wrow_local, row);
        let chunk = k.shr_const(lane, 4);
        LdmatrixAt::new(k, q_s, row, chunk, d)
    };
    // The first key tile is in flight before the walk starts (see the module docs).
    copy.emit(k, lo, kc, k_s);
    let carried = k.for_range(lo, n_tiles, one, &init, |k, kt, cv| {
        let t0 = k.mul_const(kt, BKV);
        // This tile's keys have landed (each thread waits for its own copies, the
        // barrier for everyone's), and everyone is done with the previous values.
        k.cp_async_wait(0);
        k.barrier();
        copy.emit(k, t0, vc, v_s);

        // S = Q·Kᵀ: 8 tiles of 8 keys. ldmatrix.x4 of K rows gives b0, b1 of two tiles.
        let mut s_tiles = vec![zero_c; (BKV / 8) as usize];
        for kk in 0..d / 16 {
            let at = q_at.at(k, 0, kk);
            let qa = k.ldmatrix(frag_a, 4, false, at);
            for np in 0..BKV / 16 {
                let at = k_at.at(k, 16 * np, kk);
                let v = k.ldmatrix(Type::Vec(Scalar::U32, 4), 4, false, at);
                let regs: Vec<Value> = (0..4)
                    .map(|i| {
                        let r = k.extract(v, i);
                        k.bitcast(pair_ty, r)
                    })
                    .collect();
                for half in 0..2 {
                    let fb = k.pack(frag_b, &regs[2 * half..2 * half + 2]);
                    let i = (2 * np) as usize + half;
                    s_tiles[i] = k.mma(MmaShape::M16N8K16, qa, fb, s_tiles[i]);
                }
            }
        }

        // Scale to base 2, mask above the diagonal (only in the tiles that cross the
        // warp's part of it: each row's mask is all clear below); the rows' maxima.
        let t_end = k.add_const(t0, BKV - 1);
        let crosses = k.gt(t_end, warp_first);
        let results = vec![Type::F32; 4 * s_tiles.len() + 2];
        let scaled = k.if_else(
            crosses,
            &results,
            |k| scaled_scores(k, &s_tiles, c, Some(Mask { t0, t2, qpos })),
            |k| scaled_scores(k, &s_tiles, c, None),
        );
        let (s_flat, maxima) = scaled.split_at(4 * s_tiles.len());
        let s_vals: Vec<&[Value]> = s_flat.chunks_exact(4).collect();
        let mut tile_max = [maxima[0], maxima[1]];
        let mut m_new = [fzero; 2];
        let mut alpha = [fzero; 2];
        for row in 0..2 {
            for mask in [1, 2] {
                let o = k.shfl_bfly(tile_max[row], mask);
                tile_max[row] = k.max(tile_max[row], o);
            }
            m_new[row] = k.max(cv[row], tile_max[row]);
            let dm = k.sub(cv[row], m_new[row]);
            alpha[row] = k.ex2_approx(dm);
        }
        // P = 2^(S − m), the rows' partial sums (rescaled), the outputs rescaled.
        let mut sums = [k.mul(cv[2], alpha[0]), k.mul(cv[3], alpha[1])];
        let mut p_frags = vec![];
        for pair in s_vals.chunks(2) {
            let mut regs = vec![];
            for vals in pair {
                let ps: Vec<Value> = (0..4)
                    .map(|i| {
                        let x = k.sub(vals[i], m_new[i / 2]);
                        k.ex2_approx(x)
                    })
                    .collect();
                for (i, &pv) in ps.iter().enumerate() {
                    sums[i / 2] = k.add(sums[i / 2], pv);
                }
                for half in 0..2 {
                    let lo = k.cvt(elem, ps[2 * half]);
                    let hi = k.cvt(elem, ps[2 * half + 1]);
                    regs.push(k.pack(pair_ty, &[lo, hi]));
                }
            }
            // regs: tile 2kk rows g, g+8, then tile 2kk + 1 rows g, g+8 = a0, a1, a2, a3.
            p_frags.push(k.pack(frag_a, &regs));
        }
        let mut o_tiles: Vec<Value> = cv[4..]
            .iter()
            .map(|&o| {
                let parts: Vec<Value> = (0..4)
                    .map(|i| {
                        let x = k.extract(o, i);
                        k.mul(x, alpha[i as usize / 2])
                    })
                    .collect();
                k.pack(frag_c, &parts)
            })
            .collect();

        // The values have landed and everyone is done with the keys: the next tile's
        // keys load while this tile's values are multiplied.
        k.cp_async_wait(0);
        k.barrier();
        let kt1 = k.add_const(kt, 1);
        let more = k.lt(kt1, n_tiles);
        k.if_then(more, |k| {
            let t1 = k.add_const(t0, BKV);
            copy.emit(k, t1, kc, k_s);
        });

        // O += P·V: ldmatrix.trans.x4 of V rows gives b0, b1 of two 8-column tiles.
        for (kk, &pa) in p_frags.iter().enumerate() {
            for dp in 0..d / 16 {
                let at = v_at.at(k, 16 * kk as u32, dp);
                let v = k.ldmatrix(Type::Vec(Scalar::U32, 4), 4, true, at);
                let regs: Vec<Value> = (0..4)
                    .map(|i| {
                        let r = k.extract(v, i);
                        k.bitcast(pair_ty, r)
                    })
                    .collect();
                for half in 0..2 {
                    let fb = k.pack(frag_b, &regs[2 * half..2 * half + 2]);
                    let i = (2 * dp) as usize + half;
                    o_tiles[i] = k.mma(MmaShape::M16N8K16, pa, fb, o_tiles[i]);
                }
            }
        }
        let mut next = vec![m_new[0], m_new[1], sums[0], sums[1]];
        next.extend(o_tiles);
        next
    });

    // The rows' sums over the quad, then out = O / l for rows inside the chunk.
    let mut l = [carried[2], carried[3]];
    for row in &mut l {
        for mask in [1, 2] {
            let o = k.shfl_bfly(*row, mask);
            *row = k.add(*row, o);
        }
    }
    for (half, &row) in rows.iter().enumerate() {
        let inside = k.lt(row, n_q);
        let lv = l[half];
        let tiles = carried[4..].to_vec();
        k.if_then(inside, |k| {
            let tok = k.mul_const(row, p.n_heads);
            let tok = k.add(tok, head);
            let base = wide_mul(k, tok, d);
            let ob = k.ptr_add(out, base);
            let ow = k.ptr_cast(Scalar::U32, ob);
            for (nt, &o) in tiles.iter().enumerate() {
                let x0 = k.extract(o, 2 * half as u32);
                let x1 = k.extract(o, 2 * half as u32 + 1);
                let y0 = k.div(x0, lv);
                let y1 = k.div(x1, lv);
                let pair = emit_pack_f16x2(k, y0, y1);
                // Columns 8nt + 2t, + 1: word 4nt + t.
                let w = k.add_const(fl.t, 4 * nt as u32);
                let at = k.ptr_add(ow, w);
                k.store(at, pair);
            }
        });
    }
    Ok(kb.finish()?)
}

/// How rounding a weight `P ∈ [0, 1]` to the element type moves it: relatively by at
/// most the first (the unit roundoff), or absolutely by at most the second where `P` is
/// below the smallest normal (f16's below 2^-14 are 2^-24 apart; bf16's range is f32's).
fn weight_rounding(kv: KvElem) -> (f64, f64) {
    match kv {
        KvElem::BF16 => (2f64.powi(-8), 0.0),
        KvElem::F16 | KvElem::F32 => (2f64.powi(-11), 2f64.powi(-25)),
    }
}

/// The chunk's queries, keys and values as the kernel multiplies them: rounded to the
/// tensor cores' element type (the keys and values already are, but in an f32 cache).
fn as_multiplied(p: &PrefillParams, cache: &PagedCache) -> PagedCache {
    let tc = p.kv.tensor_core();
    let mut c = cache.clone();
    for x in c.q.iter_mut().chain(c.k.iter_mut()).chain(c.v.iter_mut()) {
        *x = tc.round(*x);
    }
    c
}

/// Exact causal attention of the chunk (queries, keys and values rounded as the kernel
/// rounds them) in
/// f64, `[n_q, n_heads, head_dim]`, and `Σ w|v| / Σ w` per element.
pub fn reference(
    p: &PrefillParams,
    cache: &PagedCache,
    q_start: u32,
    n_q: u32,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let a = attend(p, cache, q_start, n_q, scale, true);
    (a.out, a.weighted_abs)
}

/// Attention of a chunk with what its rounding errors scale with.
struct Attended {
    out: Vec<f64>,
    /// `Σ w|v| / Σ w` per element.
    weighted_abs: Vec<f64>,
    /// `Σ |v| / Σ w` per element: what weights' absolute errors scale with.
    plain_abs: Vec<f64>,
}

/// Attention of the chunk over its causal prefix, or (a deliberately wrong twin) over
/// the whole context.
fn attend(
    p: &PrefillParams,
    cache: &PagedCache,
    q_start: u32,
    n_q: u32,
    scale: f64,
    causal: bool,
) -> Attended {
    let c = as_multiplied(p, cache);
    let d = p.head_dim as usize;
    let mut a = Attended {
        out: vec![],
        weighted_abs: vec![],
        plain_abs: vec![],
    };
    for i in 0..n_q as usize {
        for h in 0..p.n_heads {
            // Query i of the chunk is "sequence" i of the cache copy's query rows.
            let keys = if causal {
                q_start + i as u32 + 1
            } else {
                q_start + n_q
            };
            let s = scores_of(&c, i, h, keys, scale);
            let top = s.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
            let (mut acc, mut mag, mut plain, mut total) =
                (vec![0.0; d], vec![0.0; d], vec![0.0; d], 0.0);
            for (t, &v) in s.iter().enumerate() {
                let w = (v - top).exp2();
                total += w;
                let (_, vr) = c.kv_row(0, h / p.group(), t as u32);
                for j in 0..d {
                    acc[j] += w * vr[j] as f64;
                    mag[j] += w * (vr[j] as f64).abs();
                    plain[j] += (vr[j] as f64).abs();
                }
            }
            a.out.extend(acc.iter().map(|x| x / total));
            a.weighted_abs.extend(mag.iter().map(|x| x / total));
            a.plain_abs.extend(plain.iter().map(|x| x / total));
        }
    }
    a
}

/// Base-2 scores of query `i` (of the chunk), head `h`, over cache tokens `0..n`.
fn scores_of(c: &PagedCache, i: usize, h: u32, n: u32, scale: f64) -> Vec<f64> {
    let d = c.head_dim as usize;
    let qv = &c.q[(i * c.n_heads as usize + h as usize) * d..][..d];
    let cc = scale * std::f64::consts::LOG2_E;
    (0..n)
        .map(|t| {
            let (k, _) = c.kv_row(0, h / (c.n_heads / c.n_kv_heads), t);
            qv.iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * cc
        })
        .collect()
}

/// `κ` of the kernel: the relative error of each weight and of the sums, for
/// [`merge::tolerance`].
///
/// A score's `head_dim` products (exact in f32: both factors have at most 11 significant
/// bits) are added by the tensor cores (up to one ulp per addend per 16:
/// `head_dim·2^-22·Σ|q k|` as for [`crate::gemm`]) and scaled (`2u|s|`): within `E`.
/// A weight `ex2.approx(fl(s − m))` is then within `ρ = 2^(2E + u·Δ)·(1 + EX2) − 1` of
/// exact, each of the at most `tiles` rescalings adds `2^(u·Δ)·(1 + EX2) − 1` to both
/// the output and the sum, rounding P to the element type for `P·V` adds its unit
/// roundoff (2^-8 for bf16, 2^-11 for f16; f16's weights below 2^-14 move absolutely
/// instead, which [`case_for`] bounds apart), and the sums add `γ` over their terms and
/// `n·2^-22` for the tensor cores.
pub fn kappa(p: &PrefillParams, cache: &PagedCache, q_start: u32, n_q: u32, scale: f64) -> f64 {
    let c = as_multiplied(p, cache);
    let cc = (scale * std::f64::consts::LOG2_E).abs();
    let (mut e, mut span) = (0.0f64, 0.0f64);
    for i in 0..n_q as usize {
        for h in 0..p.n_heads {
            let n = q_start + i as u32 + 1;
            let s = scores_of(&c, i, h, n, scale);
            let d = c.head_dim as usize;
            let qv = &c.q[(i * c.n_heads as usize + h as usize) * d..][..d];
            for (t, &v) in s.iter().enumerate() {
                let (k, _) = c.kv_row(0, h / p.group(), t as u32);
                let a: f64 = qv
                    .iter()
                    .zip(k)
                    .map(|(&x, &y)| (x as f64 * y as f64).abs())
                    .sum();
                e = e.max(cc * p.head_dim as f64 * 2f64.powi(-22) * a + 2.01 * F32_U * v.abs());
            }
            let (top, bottom) = s
                .iter()
                .fold((f64::NEG_INFINITY, f64::INFINITY), |(a, b), &v| {
                    (a.max(v), b.min(v))
                });
            span = span.max(top - bottom);
        }
    }
    let e = e * 1.01;
    let rho = (2.0 * e + F32_U * (span + 2.0 * e)).exp2() * (1.0 + EX2_REL) - 1.0;
    let tiles = (q_start + n_q).div_ceil(BKV) as i32;
    let rescale = (F32_U * span).exp2() * (1.0 + EX2_REL) * (1.0 + F32_U) - 1.0;
    let n = (q_start + n_q) as f64;
    let sums = gamma((q_start + n_q) as u64) + n * 2f64.powi(-22);
    let (unit, _) = weight_rounding(p.kv.tensor_core());
    (1.0 + rho) * (1.0 + rescale).powi(2 * tiles) * (1.0 + unit) * (1.0 + sums) - 1.0
}

/// A case over a given cache (its first block-table row is the sequence; its query rows
/// are the chunk's `n_q` queries, packed; the kernel reads them `q_stride` apart).
pub fn case_for(
    p: &PrefillParams,
    cache: &PagedCache,
    q_start: u32,
    n_q: u32,
    scale: f64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let name = p.name();
    if cache.head_dim != p.head_dim
        || cache.n_heads != p.n_heads
        || cache.n_kv_heads != p.n_kv_heads
        || cache.max_blocks != p.max_blocks
        || cache.q.len() != (n_q * p.n_heads * p.head_dim) as usize
        || q_start + n_q > p.max_blocks * BLOCK_TOKENS
        || n_q == 0
        || cache.elem != p.kv
    {
        return Err(KernelError::unsupported(
            name,
            "the cache and chunk do not have the kernel's shape and element type",
        ));
    }
    let exact = attend(p, cache, q_start, n_q, scale, true);
    let want: Vec<f16> = exact.out.iter().map(|&v| f16::from_f64(v)).collect();
    let kappa = kappa(p, cache, q_start, n_q, scale);
    let want64: Vec<f64> = want.iter().map(|w| w.to_f64()).collect();
    // Weights too small for the element type's normal range move by at most `tiny` each,
    // and each is then scaled by at most 1 (2^(m_tile − m)) before the division by `l`.
    let (_, tiny) = weight_rounding(p.kv.tensor_core());
    // The output's rounding to f16: relatively 2^-11, or 2^-25 among its subnormals.
    let tol: Vec<f64> = merge::tolerance(kappa, &exact.weighted_abs, &want64, 2f64.powi(-11))
        .iter()
        .zip(&exact.plain_abs)
        .map(|(t, v)| t + tiny * v * 1.01 + 2f64.powi(-25))
        .collect();
    let elem = p.kv.tensor_core().scalar();
    let small_weights = if tiny > 0.0 {
        " + 2^-25·Σ|v|/Σw"
    } else {
        ""
    };
    let explain = format!(
        "(2κ/(1−κ) + u)·Σw|v|/Σw + 2^-10·|want| + 2^-25{small_weights}: κ = {kappa:.3e} (tensor-core sums, \
         ex2.approx, P rounded to {elem}, rescaling)"
    );
    let check = Check::Bound { tol, explain };
    let wrong = |scale: f64, causal: bool| {
        let w = attend(p, cache, q_start, n_q, scale, causal).out;
        data::f16_values_bytes(&w.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>())
    };
    let n = want.len();
    let u32s = |x: &[u32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    // Queries `q_stride` apart, NaN between them (which a kernel that read there would
    // spread).
    let row = (p.n_heads * p.head_dim) as usize;
    let q_row = p.q_row() as usize;
    let mut q = vec![f32::NAN; n_q as usize * q_row];
    for (i, r) in cache.q.chunks_exact(row).enumerate() {
        q[i * q_row..][..row].copy_from_slice(r);
    }
    Ok(KernelCase {
        name: name.to_string(),
        shape: format!(
            "{n_q} queries at {q_start}.., {}/{} heads of {}, queries {q_row} apart",
            p.n_heads, p.n_kv_heads, p.head_dim
        ),
        kernel,
        launch: p.launch(n_q),
        buffers: vec![
            Buffer::input("q", data::f32_bytes(&q)),
            Buffer::input("k_cache", cache.elem.bytes(&cache.k)),
            Buffer::input("v_cache", cache.elem.bytes(&cache.v)),
            Buffer::input(
                "block_table",
                u32s(&cache.block_table[..p.max_blocks as usize]),
            ),
            Buffer::output("out", n * 2),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Buffer(3),
            CaseArg::Scalar(Arg::U32(q_start)),
            CaseArg::Scalar(Arg::U32(n_q)),
            CaseArg::Scalar(Arg::F32(scale as f32)),
            CaseArg::Buffer(4),
        ],
        expected: vec![Expected {
            buffer: 4,
            data: data::f16_values_bytes(&want),
            elem: Scalar::F16,
            check: check.clone(),
        }],
        controls: vec![
            Control {
                what: "scores without the 1/sqrt(head_dim) scale".into(),
                expected: Expected {
                    buffer: 4,
                    data: wrong(1.0, true),
                    elem: Scalar::F16,
                    check: check.clone(),
                },
            },
            Control {
                what: "every query attending the whole context (no causal mask)".into(),
                expected: Expected {
                    buffer: 4,
                    data: wrong(scale, false),
                    elem: Scalar::F16,
                    check,
                },
            },
        ],
        bytes_moved: (q_start + n_q) as u64
            * p.n_kv_heads as u64
            * p.head_dim as u64
            * 2
            * p.kv.size() as u64
            + n as u64 * 6,
        flops: 2
            * n_q as u64
            * (q_start as u64 + n_q as u64 / 2)
            * p.n_heads as u64
            * p.head_dim as u64
            * 2,
    })
}

/// A case: a chunk of `n_q` queries after a cached prefix of `q_start` tokens, one
/// sequence of random contents; softmax scale `1/sqrt(head_dim)`.
pub fn case(
    p: &PrefillParams,
    q_start: u32,
    n_q: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let mut rng = data::rng(seed);
    let mut cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        vec![q_start + n_q],
    );
    cache.q = data::signed(
        &mut rng,
        (n_q * p.n_heads * p.head_dim) as usize,
        0.0625,
        2.0,
    );
    case_for(p, &cache, q_start, n_q, 1.0 / (p.head_dim as f64).sqrt())
}
