//! Building blocks shared by the kernels, each with its host twin so that references
//! reproduce the kernels' operation order: warp and block all-reductions, and the
//! unpacking/packing of bf16 pairs.

use half::bf16;
use quench_ir::{AddrSpace, Builder, Scalar, Type, Value};

/// How partial results combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    Sum,
    Max,
}

impl Combine {
    pub fn identity(self) -> f32 {
        match self {
            Combine::Sum => 0.0,
            Combine::Max => f32::NEG_INFINITY,
        }
    }

    /// The host twin of [`Combine::emit`]: `add.rn.f32` / `max.f32`.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Combine::Sum => a + b,
            Combine::Max => a.max(b),
        }
    }

    pub fn emit(self, k: &mut Builder, a: Value, b: Value) -> Value {
        match self {
            Combine::Sum => k.add(a, b),
            Combine::Max => k.max(a, b),
        }
    }
}

/// Butterfly lane masks of a warp all-reduction, in order.
const BUTTERFLY: [u32; 5] = [16, 8, 4, 2, 1];

/// Warp all-reduction: after the step with mask `m`, lane `l` holds `own ⊕ lane(l ^ m)`.
/// Both operations are commutative, so every lane ends with the same bits.
pub fn emit_warp_allreduce(k: &mut Builder, v: Value, op: Combine) -> Value {
    let mut v = v;
    for m in BUTTERFLY {
        let other = k.shfl_bfly(v, m);
        v = op.emit(k, v, other);
    }
    v
}

/// Host twin of [`emit_warp_allreduce`]: the value every lane ends with.
pub fn warp_allreduce(lanes: &[f32; 32], op: Combine) -> f32 {
    let mut v = *lanes;
    for m in BUTTERFLY {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = op.apply(prev[l], prev[l ^ m as usize]);
        }
    }
    v[0]
}

/// Block all-reduction over `threads` threads (a multiple of 32): each warp reduces its
/// lanes, lane 0 of warp `w` writes slot `w` of a fresh shared array, and after a barrier
/// every warp reduces the slots (lanes past the warp count contribute the identity), so
/// every thread gets the total. `tid` is `%tid.x`. Must be reached by the whole block.
pub fn emit_block_allreduce(
    k: &mut Builder,
    v: Value,
    op: Combine,
    tid: Value,
    threads: u32,
    name: &str,
) -> Value {
    let w = emit_warp_allreduce(k, v, op);
    let warps = threads / 32;
    if warps == 1 {
        return w;
    }
    let slots = k.shared_array(name, Scalar::F32, warps, 16);
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let zero = k.const_u32(0);
    let first = k.eq(lane, zero);
    k.if_then(first, |k| {
        let p = k.ptr_add(slots, warp);
        k.store(p, w);
    });
    k.barrier();
    let nw = k.const_u32(warps);
    let has_slot = k.lt(lane, nw);
    let p = k.if_else(
        has_slot,
        &[Type::F32],
        |k| {
            let p = k.ptr_add(slots, lane);
            vec![k.load(Type::F32, p)]
        },
        |k| vec![k.const_f32(op.identity())],
    );
    emit_warp_allreduce(k, p[0], op)
}

/// [`emit_block_allreduce`] of several values at once, sharing one barrier: value `v`
/// of warp `w` goes to slot `v·warps + w`. Each result has the bits
/// [`block_allreduce`] gives for that value alone.
pub fn emit_block_allreduce_n(
    k: &mut Builder,
    values: &[Value],
    op: Combine,
    tid: Value,
    threads: u32,
    name: &str,
) -> Vec<Value> {
    let ws: Vec<Value> = values
        .iter()
        .map(|&v| emit_warp_allreduce(k, v, op))
        .collect();
    let warps = threads / 32;
    if warps == 1 {
        return ws;
    }
    let slots = k.shared_array(name, Scalar::F32, warps * values.len() as u32, 16);
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let zero = k.const_u32(0);
    let first = k.eq(lane, zero);
    k.if_then(first, |k| {
        for (i, &w) in ws.iter().enumerate() {
            let at = k.add_const(warp, i as u32 * warps);
            let p = k.ptr_add(slots, at);
            k.store(p, w);
        }
    });
    k.barrier();
    let nw = k.const_u32(warps);
    let has_slot = k.lt(lane, nw);
    (0..values.len() as u32)
        .map(|i| {
            let p = k.if_else(
                has_slot,
                &[Type::F32],
                |k| {
                    let at = k.add_const(lane, i * warps);
                    let p = k.ptr_add(slots, at);
                    vec![k.load(Type::F32, p)]
                },
                |k| vec![k.const_f32(op.identity())],
            );
            emit_warp_allreduce(k, p[0], op)
        })
        .collect()
}

/// Host twin of [`emit_block_allreduce`]: `values[t]` is thread `t`'s input.
pub fn block_allreduce(values: &[f32], op: Combine) -> f32 {
    let warp_total = |w: &[f32]| {
        let mut lanes = [op.identity(); 32];
        lanes[..w.len()].copy_from_slice(w);
        warp_allreduce(&lanes, op)
    };
    if values.len() <= 32 {
        return warp_total(values);
    }
    let partials: Vec<f32> = values.chunks(32).map(warp_total).collect();
    warp_total(&partials)
}

/// The two bf16 halves of a 32-bit word (low half first), widened to f32. Exact: a bf16
/// is the upper half of the f32 with the same value.
pub fn emit_unpack_bf16x2(k: &mut Builder, word: Value) -> [Value; 2] {
    let lo = k.shl_const(word, 16);
    let hi = k.and_const(word, 0xffff_0000);
    [k.bitcast(Type::F32, lo), k.bitcast(Type::F32, hi)]
}

/// Round two f32 to bf16 (to nearest even) and pack them, `lo` in the low half.
pub fn emit_pack_bf16x2(k: &mut Builder, lo: Value, hi: Value) -> Value {
    let l = k.cvt(Scalar::BF16, lo);
    let h = k.cvt(Scalar::BF16, hi);
    let pair = k.pack(Type::Scalar(Scalar::BF16x2), &[l, h]);
    k.bitcast(Type::U32, pair)
}

/// The two f16 halves of a 32-bit word (low half first), widened to f32 (exact).
pub fn emit_unpack_f16x2(k: &mut Builder, word: Value) -> [Value; 2] {
    let pair = k.bitcast(Type::Scalar(Scalar::F16x2), word);
    [0, 1].map(|i| {
        let h = k.extract(pair, i);
        k.cvt(Scalar::F32, h)
    })
}

/// Round two f32 to f16 (to nearest even; past ±65504 to infinity) and pack them, `lo`
/// in the low half.
pub fn emit_pack_f16x2(k: &mut Builder, lo: Value, hi: Value) -> Value {
    let l = k.cvt(Scalar::F16, lo);
    let h = k.cvt(Scalar::F16, hi);
    let pair = k.pack(Type::Scalar(Scalar::F16x2), &[l, h]);
    k.bitcast(Type::U32, pair)
}

/// Host twin of the kernels' f32 → bf16 rounding (`cvt.rn.bf16.f32`).
pub fn round_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// Pointer to `base` viewed as 32-bit words (for 16-byte `vec4<u32>` accesses).
pub fn words(k: &mut Builder, base: Value) -> Value {
    k.ptr_cast(Scalar::U32, base)
}

/// `ptr<global, elem>` type shorthand.
pub fn gptr(elem: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, elem)
}

/// A 64-bit element offset `a * b` from 32-bit factors, so that large tensors address
/// correctly.
pub fn wide_mul(k: &mut Builder, a: Value, b: u32) -> Value {
    let a64 = k.cvt(Scalar::U64, a);
    let b64 = k.const_u64(b as u64);
    k.mul(a64, b64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warp_allreduce_is_the_butterfly_tree() {
        // Values whose f32 sum depends on the order: the butterfly pairs lanes 0 and 16
        // first, so the large terms cancel before any small one is absorbed (30 small
        // terms survive); summing in index order loses the 15 that follow lane 0.
        let mut lanes = [1e-8f32; 32];
        lanes[0] = 1e8;
        lanes[16] = -1e8;
        let tree = warp_allreduce(&lanes, Combine::Sum);
        let sequential: f32 = lanes.iter().sum();
        assert!((tree - 30e-8).abs() < 1e-13, "{tree}");
        assert!((sequential - 15e-8).abs() < 1e-13, "{sequential}");
        assert_eq!(warp_allreduce(&lanes, Combine::Max), 1e8);
    }

    #[test]
    fn block_allreduce_pads_missing_warps_with_the_identity() {
        let v: Vec<f32> = (0..96).map(|i| i as f32).collect();
        assert_eq!(
            block_allreduce(&v, Combine::Sum),
            (0..96).sum::<i32>() as f32
        );
        assert_eq!(block_allreduce(&v, Combine::Max), 95.0);
        let neg: Vec<f32> = (0..64).map(|i| -(i as f32) - 1.0).collect();
        assert_eq!(block_allreduce(&neg, Combine::Max), -1.0);
    }
}
