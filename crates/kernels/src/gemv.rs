//! Matrix–vector product, `y = W·x`: `W` bf16 row-major `[rows, cols]`, `x` bf16
//! `[cols]`, `y` f32 `[rows]` — the decode-time projection, bound by the bandwidth of
//! reading `W` once.
//!
//! **Layout**: `cols` a multiple of 8, so each row is a whole number of 16-byte chunks
//! (8 bf16). One warp per row, `warps` rows per block (grid = ⌈rows / warps⌉). Lane `l`
//! takes chunks `l, l + 32, l + 64, ...` of its row, so each warp load reads 512
//! contiguous bytes; the loop is unrolled `unroll` times with all loads of a step issued
//! before any arithmetic, keeping `unroll` 16-byte `ld.global.nc` of `W` in flight per
//! lane.
//!
//! **Arithmetic**: each lane accumulates `fma(w, x, acc)` in f32 over its chunks in
//! order, element by element; the warp then sums its lanes by butterfly
//! ([`crate::lanes::emit_warp_allreduce`]) and lane 0 writes the row. The order is fixed,
//! so the reference matches bit for bit.

use half::bf16;
use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::Launch;

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{
    emit_unpack_bf16x2, emit_warp_allreduce, gptr, warp_allreduce, wide_mul, words, Combine,
};
use crate::par::par_map;

pub const NAME: &str = "gemv_bf16";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvParams {
    pub rows: u32,
    pub cols: u32,
    /// Warps (rows) per block, 1..=32.
    pub warps: u32,
    /// Chunks each lane loads before it computes, 1..=16.
    pub unroll: u32,
}

impl GemvParams {
    fn chunks(&self) -> u32 {
        self.cols / 8
    }

    pub fn launch(&self) -> Launch {
        Launch::linear(self.rows.div_ceil(self.warps), self.warps * 32)
    }
}

/// `gemv_bf16(w, x, y)`.
pub fn build(p: &GemvParams) -> Result<Function, KernelError> {
    if p.cols == 0 || !p.cols.is_multiple_of(8) {
        return Err(KernelError::unsupported(
            NAME,
            format!("cols = {} must be a positive multiple of 8", p.cols),
        ));
    }
    if p.rows == 0 || !(1..=32).contains(&p.warps) || !(1..=16).contains(&p.unroll) {
        return Err(KernelError::unsupported(
            NAME,
            format!(
                "rows = {} must be positive, warps = {} in 1..=32, unroll = {} in 1..=16",
                p.rows, p.warps, p.unroll
            ),
        ));
    }
    let mut k = Builder::new(NAME, p.warps * 32);
    let w = k.param("w", gptr(Scalar::BF16));
    let x = k.param("x", gptr(Scalar::BF16));
    let y = k.param("y", gptr(Scalar::F32));
    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let block = k.ctaid_x();
    let first_row = k.mul_const(block, p.warps);
    let row = k.add(first_row, warp);
    let body = |k: &mut Builder| emit_row(k, p, w, x, y, row, lane);
    if p.rows.is_multiple_of(p.warps) {
        body(&mut k);
    } else {
        let rows = k.const_u32(p.rows);
        let inside = k.lt(row, rows);
        k.if_then(inside, body);
    }
    Ok(k.finish()?)
}

/// One warp's row: the unrolled main loop, the remaining chunks, the butterfly, the store.
fn emit_row(
    k: &mut Builder,
    p: &GemvParams,
    w: Value,
    x: Value,
    y: Value,
    row: Value,
    lane: Value,
) {
    let vec4 = Type::Vec(Scalar::U32, 4);
    let start = wide_mul(k, row, p.cols / 2);
    let ww = words(k, w);
    let wr = k.ptr_add(ww, start);
    let xw = words(k, x);
    // Word offset of this lane's first chunk.
    let lane_word = k.mul_const(lane, 4);
    let wr = k.ptr_add(wr, lane_word);
    let xl = k.ptr_add(xw, lane_word);

    // acc += w·x over one chunk (4 words of 2 bf16), in element order.
    let fma_chunk = |k: &mut Builder, vw: Value, vx: Value, mut acc: Value| {
        for i in 0..4 {
            let a = k.extract(vw, i);
            let b = k.extract(vx, i);
            let [w0, w1] = emit_unpack_bf16x2(k, a);
            let [x0, x1] = emit_unpack_bf16x2(k, b);
            acc = k.fma(w0, x0, acc);
            acc = k.fma(w1, x1, acc);
        }
        acc
    };

    let step_chunks = 32 * p.unroll;
    let main = p.chunks() / step_chunks;
    let mut acc = k.const_f32(0.0);
    if main > 0 {
        let lo = k.const_u32(0);
        let hi = k.const_u32(main);
        let one = k.const_u32(1);
        acc = k.for_range(lo, hi, one, &[acc], |k, s, c| {
            let base = k.mul_const(s, step_chunks * 4);
            let loads: Vec<(Value, Value)> = (0..p.unroll)
                .map(|u| {
                    let off = k.add_const(base, 32 * 4 * u);
                    let pw = k.ptr_add(wr, off);
                    let px = k.ptr_add(xl, off);
                    (
                        k.load_with(vec4, pw, CacheOp::Nc),
                        k.load_with(vec4, px, CacheOp::Nc),
                    )
                })
                .collect();
            let mut acc = c[0];
            for (vw, vx) in loads {
                acc = fma_chunk(k, vw, vx, acc);
            }
            vec![acc]
        })[0];
    }
    // Remaining chunks, 32 per step; the last step may leave lanes without a chunk.
    let mut done = main * step_chunks;
    while done < p.chunks() {
        let off = k.const_u32(done * 4);
        let load_and_fma = |k: &mut Builder, acc: Value| {
            let pw = k.ptr_add(wr, off);
            let px = k.ptr_add(xl, off);
            let vw = k.load_with(vec4, pw, CacheOp::Nc);
            let vx = k.load_with(vec4, px, CacheOp::Nc);
            fma_chunk(k, vw, vx, acc)
        };
        if done + 32 <= p.chunks() {
            acc = load_and_fma(k, acc);
        } else {
            let left = k.const_u32(p.chunks() - done);
            let has = k.lt(lane, left);
            let before = acc;
            acc = k.if_else(
                has,
                &[Type::F32],
                |k| vec![load_and_fma(k, before)],
                |_| vec![before],
            )[0];
        }
        done += 32;
    }
    let total = emit_warp_allreduce(k, acc, Combine::Sum);
    let zero = k.const_u32(0);
    let first = k.eq(lane, zero);
    k.if_then(first, |k| {
        let at = k.ptr_add(y, row);
        k.store(at, total);
    });
}

/// The kernel's arithmetic, in its order.
pub fn reference(p: &GemvParams, w: &[bf16], x: &[bf16]) -> Vec<f32> {
    let cols = p.cols as usize;
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    par_map(p.rows as usize, |r| {
        let row = &w[r * cols..(r + 1) * cols];
        let mut lanes = [0.0f32; 32];
        for (l, acc) in lanes.iter_mut().enumerate() {
            for c in (l..cols / 8).step_by(32) {
                for e in c * 8..c * 8 + 8 {
                    *acc = row[e].to_f32().mul_add(xf[e], *acc);
                }
            }
        }
        warp_allreduce(&lanes, Combine::Sum)
    })
}

/// A case with weights in ±[2^-10, 2^-3] and activations in ±[2^-6, 4].
pub fn case(p: &GemvParams, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let n = p.rows as usize * p.cols as usize;
    let w = data::to_bf16(&data::signed(&mut rng, n, 0.0009765625, 0.125));
    let x = data::to_bf16(&data::signed(&mut rng, p.cols as usize, 0.015625, 4.0));
    let want = reference(p, &w, &x);
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{}x{}", p.rows, p.cols),
        kernel,
        launch: p.launch(),
        buffers: vec![
            Buffer::input("w", data::bf16_bytes(&w)),
            Buffer::input("x", data::bf16_bytes(&x)),
            Buffer::output("y", p.rows as usize * 4),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1), CaseArg::Buffer(2)],
        expected: vec![Expected {
            buffer: 2,
            data: data::f32_bytes(&want),
            elem: Scalar::F32,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: (n as u64 + p.cols as u64) * 2 + p.rows as u64 * 4,
        flops: 2 * n as u64,
    })
}
