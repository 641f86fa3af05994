//! Matrix product on the tensor cores, `C = A·B`: `A` bf16 row-major `[m, k]`, `B` bf16
//! given as `Bᵀ`, row-major `[n, k]` (each output column's operands contiguous — the
//! layout of a linear layer's weight, and the `.col` operand `mma.sync` wants), `C` f32
//! row-major `[m, n]`.
//!
//! **Tiling**: a block computes a `bm × bn` tile of `C` (64 or 128 each), stepping along
//! `k` 32 at a time; warps are arranged `bm/64 × bn/32`, each computing 64×32 as 4×4
//! `mma.sync.m16n8k16` accumulators. `m`, `n`, `k` must be multiples of `bm`, `bn`, 32.
//!
//! **Data movement**: each k-step's A and B tiles are copied global → shared with 16-byte
//! `cp.async.cg` into one of two stages, so the copy of step `t + 1` overlaps the math of
//! step `t` (one `cp.async` group per step, `wait_group 1`). A tile row is 32 bf16 = four
//! 16-byte chunks; chunk `c` of row `r` is stored at chunk `c ^ ((r >> 1) & 3)`, which
//! makes both the copies and the `ldmatrix.x4` fragment loads free of bank conflicts.
//! Fragment addresses follow the PTX ISA's `ldmatrix` and `mma.m16n8k16` layouts.
//!
//! **Arithmetic**: products of bf16 are exact in f32; how the tensor core adds them is
//! not IEEE-specified, so the check is a bound: see [`tolerance`].

use half::bf16;
use quench_ir::{Builder, CacheOp, FragRole, Function, MmaShape, Scalar, Type, Value};
use quench_rt::Launch;

use crate::approx::{F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::par::par_map;

pub const NAME: &str = "gemm_bf16";

/// k covered by one pipeline step (one shared-memory stage).
const BK: u32 = 32;
/// Warp tile.
const WARP_M: u32 = 64;
const WARP_N: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Block tile rows (64 or 128).
    pub bm: u32,
    /// Block tile columns (64 or 128).
    pub bn: u32,
}

impl GemmParams {
    fn warps_m(&self) -> u32 {
        self.bm / WARP_M
    }

    fn warps_n(&self) -> u32 {
        self.bn / WARP_N
    }

    pub fn threads(&self) -> u32 {
        self.warps_m() * self.warps_n() * 32
    }

    pub fn launch(&self) -> Launch {
        Launch { grid: [self.n / self.bn, self.m / self.bm, 1], block: [self.threads(), 1, 1], dynamic_shared_bytes: 0 }
    }

    fn check(&self) -> Result<(), KernelError> {
        if ![64, 128].contains(&self.bm) || ![64, 128].contains(&self.bn) {
            return Err(KernelError::unsupported(NAME, format!("bm = {}, bn = {}: each must be 64 or 128", self.bm, self.bn)));
        }
        let fits = |v: u32, t: u32| v > 0 && v.is_multiple_of(t);
        if !fits(self.m, self.bm) || !fits(self.n, self.bn) || !fits(self.k, BK) {
            return Err(KernelError::unsupported(
                NAME,
                format!(
                    "m = {}, n = {}, k = {} must be positive multiples of bm = {}, bn = {} and {BK}",
                    self.m, self.n, self.k, self.bm, self.bn
                ),
            ));
        }
        Ok(())
    }
}

/// `gemm_bf16(a, b, c)`.
pub fn build(p: &GemmParams) -> Result<Function, KernelError> {
    p.check()?;
    let threads = p.threads();
    let mut kb = Builder::new(NAME, threads);
    let k = &mut kb;
    let a = k.param("a", gptr(Scalar::BF16));
    let b = k.param("b", gptr(Scalar::BF16));
    let c = k.param("c", gptr(Scalar::F32));
    // Two stages of [rows][32] bf16 per operand.
    let a_s = k.shared_array("a_tile", Scalar::BF16, 2 * p.bm * BK, 128);
    let b_s = k.shared_array("b_tile", Scalar::BF16, 2 * p.bn * BK, 128);

    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let col0 = k.ctaid_x();
    let col0 = k.mul_const(col0, p.bn);
    let row0 = k.ctaid_y();
    let row0 = k.mul_const(row0, p.bm);

    let a_copy = TileCopy::emit(k, a, row0, p.k, p.bm, threads);
    let b_copy = TileCopy::emit(k, b, col0, p.k, p.bn, threads);
    let copy_step = |k: &mut Builder, step: Value| {
        let stage = k.and_const(step, 1);
        a_copy.issue(k, a_s, stage, step);
        b_copy.issue(k, b_s, stage, step);
    };

    // ldmatrix.x4 row addresses: lane l gives row l % 8 of 8×8 matrix l / 8.
    let quad = k.shr_const(lane, 3);
    let r8 = k.and_const(lane, 7);
    let swz = k.shr_const(r8, 1);
    let swz = k.and_const(swz, 3);
    // warps_n is 2 or 4.
    let warp_m = k.shr_const(warp, p.warps_n().trailing_zeros());
    let warp_n = k.and_const(warp, p.warps_n() - 1);
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    // are registers a0..a3 of the m16n8k16 A fragment.
    let a_row = {
        let r = k.mul_const(warp_m, WARP_M);
        let q = k.and_const(quad, 1);
        let q = k.mul_const(q, 8);
        let r = k.add(r, q);
        k.add(r, r8)
    };
    let a_khalf = k.shr_const(quad, 1);
    // B (as [n][k]): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
    // are registers b0, b1 of two adjacent n8 fragments.
    let b_row = {
        let r = k.mul_const(warp_n, WARP_N);
        let q = k.shr_const(quad, 1);
        let q = k.mul_const(q, 8);
        let r = k.add(r, q);
        k.add(r, r8)
    };
    let b_khalf = k.and_const(quad, 1);
    // Element offsets within a stage, per 16-wide k slice.
    let offsets = |k: &mut Builder, row: Value, khalf: Value| -> [Value; 2] {
        [0u32, 1].map(|ks| {
            let chunk = k.add_const(khalf, 2 * ks);
            let chunk = k.xor(chunk, swz);
            let chunk = k.mul_const(chunk, 8);
            let r = k.mul_const(row, BK);
            k.add(r, chunk)
        })
    };
    let a_off = offsets(k, a_row, a_khalf);
    let b_off = offsets(k, b_row, b_khalf);

    let frag_a = Builder::frag_type(MmaShape::M16N8K16, FragRole::A, Scalar::BF16);
    let frag_b = Builder::frag_type(MmaShape::M16N8K16, FragRole::B, Scalar::BF16);
    let frag_c = Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32);
    let zero = k.const_f32(0.0);
    let zero_c = k.pack(frag_c, &[zero; 4]);
    let init = vec![zero_c; 16];

    let steps = p.k / BK;
    let zero_u = k.const_u32(0);
    copy_step(k, zero_u);
    k.cp_async_commit();
    let hi = k.const_u32(steps);
    let one = k.const_u32(1);
    let acc = k.for_range(zero_u, hi, one, &init, |k, step, acc| {
        let next = k.add_const(step, 1);
        let steps_v = k.const_u32(steps);
        let has_next = k.lt(next, steps_v);
        k.if_then(has_next, |k| copy_step(k, next));
        // An empty group on the last step keeps `wait_group 1` meaning "this step's copy".
        k.cp_async_commit();
        k.cp_async_wait(1);
        k.barrier();
        let stage = k.and_const(step, 1);
        let a_stage = k.mul_const(stage, p.bm * BK);
        let b_stage = k.mul_const(stage, p.bn * BK);
        let mut acc = acc.to_vec();
        for ks in 0..2 {
            let a_base = k.add(a_stage, a_off[ks]);
            let a_frags: Vec<Value> = (0..4)
                .map(|mi| {
                    let at = k.add_const(a_base, mi * 16 * BK);
                    let at = k.ptr_add(a_s, at);
                    k.ldmatrix(frag_a, 4, false, at)
                })
                .collect();
            let b_base = k.add(b_stage, b_off[ks]);
            let mut b_frags = vec![];
            for nj in 0..2 {
                let at = k.add_const(b_base, nj * 16 * BK);
                let at = k.ptr_add(b_s, at);
                let v = k.ldmatrix(Type::Vec(Scalar::U32, 4), 4, false, at);
                let regs: Vec<Value> = (0..4)
                    .map(|i| {
                        let r = k.extract(v, i);
                        k.bitcast(Type::Scalar(Scalar::BF16x2), r)
                    })
                    .collect();
                b_frags.push(k.pack(frag_b, &regs[0..2]));
                b_frags.push(k.pack(frag_b, &regs[2..4]));
            }
            for (mi, &fa) in a_frags.iter().enumerate() {
                for (ni, &fb) in b_frags.iter().enumerate() {
                    let i = mi * 4 + ni;
                    acc[i] = k.mma(MmaShape::M16N8K16, fa, fb, acc[i]);
                }
            }
        }
        // Everyone is done reading this stage before the next step overwrites it.
        k.barrier();
        acc
    });

    // Accumulator layout: c0, c1 at (row g, cols 2t, 2t+1); c2, c3 at row g + 8.
    let g = k.shr_const(lane, 2);
    let t = k.and_const(lane, 3);
    let out_row = {
        let r = k.mul_const(warp_m, WARP_M);
        let r = k.add(row0, r);
        k.add(r, g)
    };
    let out_col = {
        let cc = k.mul_const(warp_n, WARP_N);
        let cc = k.add(col0, cc);
        let t2 = k.mul_const(t, 2);
        k.add(cc, t2)
    };
    let vec2 = Type::Vec(Scalar::F32, 2);
    for mi in 0..4u32 {
        for ni in 0..4u32 {
            let f = acc[(mi * 4 + ni) as usize];
            let regs: Vec<Value> = (0..4).map(|i| k.extract(f, i)).collect();
            let col = k.add_const(out_col, ni * 8);
            for half in 0..2u32 {
                let row = k.add_const(out_row, mi * 16 + half * 8);
                let at = wide_mul(k, row, p.n);
                let col64 = k.cvt(Scalar::U64, col);
                let at = k.add(at, col64);
                let at = k.ptr_add(c, at);
                let v = k.pack(vec2, &regs[2 * half as usize..2 * half as usize + 2]);
                k.store(at, v);
            }
        }
    }
    Ok(kb.finish()?)
}

/// The per-thread part of copying one operand's `[rows][32]` tile into a stage: thread
/// `tid` copies chunk `tid & 3` of rows `tid / 4 + i·threads/4`.
struct TileCopy {
    /// Global address of this thread's first chunk at k-step 0.
    src: Value,
    /// Element offset of that chunk within a stage (swizzled).
    dst: Value,
    rows: u32,
    threads: u32,
    k: u32,
}

impl TileCopy {
    fn emit(k: &mut Builder, base: Value, row0: Value, kdim: u32, rows: u32, threads: u32) -> TileCopy {
        let tid = k.tid_x();
        let r = k.shr_const(tid, 2);
        let c = k.and_const(tid, 3);
        let row = k.add(row0, r);
        let at = wide_mul(k, row, kdim);
        let c8 = k.mul_const(c, 8);
        let c8w = k.cvt(Scalar::U64, c8);
        let at = k.add(at, c8w);
        let src = k.ptr_add(base, at);
        // Rows r and r + threads/4 share (r >> 1) & 3, as threads/4 is a multiple of 8.
        let swz = k.shr_const(r, 1);
        let swz = k.and_const(swz, 3);
        let sc = k.xor(c, swz);
        let sc = k.mul_const(sc, 8);
        let dr = k.mul_const(r, BK);
        let dst = k.add(dr, sc);
        TileCopy { src, dst, rows, threads, k: kdim }
    }

    fn issue(&self, k: &mut Builder, smem: Value, stage: Value, step: Value) {
        let stage_off = k.mul_const(stage, self.rows * BK);
        let dst = k.add(stage_off, self.dst);
        let kofs = k.mul_const(step, BK);
        let src = k.ptr_add(self.src, kofs);
        let row_step = self.threads / 4;
        for i in 0..self.rows / row_step {
            let d = k.add_const(dst, i * row_step * BK);
            let d = k.ptr_add(smem, d);
            let s = if i == 0 {
                src
            } else {
                let off = k.const_u64(i as u64 * row_step as u64 * self.k as u64);
                k.ptr_add(src, off)
            };
            k.cp_async(d, s, 16, CacheOp::Cg);
        }
    }
}

/// `Σ_k a[i][k]·b[j][k]` in f64 (exact products, f64 sums), rounded to f32, and
/// `Σ_k |a[i][k]·b[j][k]|` for the bound. `bt` is the `[n, k]` operand.
/// The rounded sums and the sums of magnitudes of each output element.
type Sums = (Vec<f32>, Vec<f64>);

fn exact(p: &GemmParams, a: &[bf16], bt: impl Fn(usize, usize) -> f32 + Sync) -> Sums {
    let (m, n, kd) = (p.m as usize, p.n as usize, p.k as usize);
    let af: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
    let rows = par_map(m, |i| {
        let ar = &af[i * kd..(i + 1) * kd];
        (0..n)
            .map(|j| {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for (kk, &x) in ar.iter().enumerate() {
                    let prod = x as f64 * bt(j, kk) as f64;
                    s += prod;
                    abs += prod.abs();
                }
                (s as f32, abs)
            })
            .collect::<Vec<_>>()
    });
    rows.into_iter().flatten().unzip()
}

/// The exact product, rounded to f32, and the sums of |products| for [`tolerance`].
pub fn reference(p: &GemmParams, a: &[bf16], b: &[bf16]) -> Sums {
    let kd = p.k as usize;
    let bf: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    exact(p, a, |j, kk| bf[j * kd + kk])
}

/// A deliberately wrong reference: `B`'s buffer read as row-major `[k, n]` instead of
/// `[n, k]` — the transposition mistake.
pub fn reference_b_transposed(p: &GemmParams, a: &[bf16], b: &[bf16]) -> Vec<f32> {
    let n = p.n as usize;
    let bf: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    exact(p, a, |j, kk| bf[kk * n + j]).0
}

/// Per-element tolerance: `k·2^-22·Σ|a·b| + u·|want| + 2^-126`.
///
/// Each `mma.m16n8k16` adds 16 exact products to the accumulator; aligning the 17 terms
/// to the largest with truncation may lose up to one f32 ulp (2^-23 relative) per term,
/// at most `17·2^-23 ≤ 2^-18.9` of the step's `Σ|terms|`, which is at most the row's
/// `Σ|a·b|`. Over `k/16` steps that is `k·2^-22.9·Σ|a·b|`, rounded up to `k·2^-22`.
/// `u·|want|` covers the reference's own rounding.
pub fn tolerance(p: &GemmParams, abs_sums: &[f64], want: &[f32]) -> (Vec<f64>, String) {
    let per_k = p.k as f64 * 2f64.powi(-22);
    let tol = abs_sums
        .iter()
        .zip(want)
        .map(|(s, w)| per_k * s + F32_U * (*w as f64).abs() + F32_MIN_NORMAL)
        .collect();
    let explain = format!(
        "k·2^-22·Σ|a·b| + u·|want| + 2^-126 with k = {}: up to one ulp per addend in each of the k/16 \
         mma.m16n8k16 steps (17 addends aligned by truncation), plus the reference's rounding",
        p.k
    );
    (tol, explain)
}

/// A case with `A` in ±[2^-4, 2] and `B` in ±[2^-6, 0.5].
pub fn case(p: &GemmParams, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let (m, n, kd) = (p.m as usize, p.n as usize, p.k as usize);
    let a = data::to_bf16(&data::signed(&mut rng, m * kd, 0.0625, 2.0));
    let b = data::to_bf16(&data::signed(&mut rng, n * kd, 0.015625, 0.5));
    let (want, abs_sums) = reference(p, &a, &b);
    let (tol, explain) = tolerance(p, &abs_sums, &want);
    let check = Check::Bound { tol, explain };
    let control = Expected {
        buffer: 2,
        data: data::f32_bytes(&reference_b_transposed(p, &a, &b)),
        elem: Scalar::F32,
        check: check.clone(),
    };
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{m}x{n}x{kd}"),
        kernel,
        launch: p.launch(),
        buffers: vec![
            Buffer::input("a", data::bf16_bytes(&a)),
            Buffer::input("b", data::bf16_bytes(&b)),
            Buffer::output("c", m * n * 4),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1), CaseArg::Buffer(2)],
        expected: vec![Expected { buffer: 2, data: data::f32_bytes(&want), elem: Scalar::F32, check }],
        controls: vec![Control { what: "B read as [k, n] instead of [n, k]".to_string(), expected: control }],
        bytes_moved: ((m + n) * kd * 2 + m * n * 4) as u64,
        flops: 2 * (m * n * kd) as u64,
    })
}
