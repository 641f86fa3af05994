//! The skeleton of elementwise kernels: `y[i] = f(x0[i], x1[i], ...)` over `n` elements
//! (a runtime argument), all arrays contiguous and 16-byte aligned.
//!
//! Thread `i` of the grid handles 16-byte group `i` (4 f32 or 8 bf16) with one vector
//! load per input and one vector store; the `n mod group` trailing elements go one per
//! thread to the first threads of the grid. `f` computes in f32; bf16 and f16 inputs are
//! widened exactly and the result is rounded to the element type once, to nearest even.

use quench_ir::{Builder, Scalar, Type, Value};
use quench_rt::Launch;

use crate::lanes::{
    emit_pack_bf16x2, emit_pack_f16x2, emit_unpack_bf16x2, emit_unpack_f16x2, words,
};

/// Elements in one 16-byte group of `elem`.
pub fn group(elem: Scalar) -> u32 {
    16 / elem.bytes()
}

/// The launch covering `n` elements with `threads` per block.
pub fn launch(elem: Scalar, n: u32, threads: u32) -> Launch {
    let g = group(elem);
    let per_thread = (n / g).max(n % g);
    Launch::linear(per_thread.div_ceil(threads).max(1), threads)
}

/// Emit the body: `inputs` and `out` are global pointers to `elem` (f32, bf16 or f16), `n` the
/// element count (u32), `f` maps f32 inputs of one element to its f32 result.
pub fn emit_map(
    k: &mut Builder,
    elem: Scalar,
    inputs: &[Value],
    out: Value,
    n: Value,
    f: &dyn Fn(&mut Builder, &[Value]) -> Value,
) {
    let gid = k.global_id_x();
    let shift = group(elem).trailing_zeros();
    let groups = k.shr_const(n, shift);

    let in_range = k.lt(gid, groups);
    k.if_then(in_range, |k| {
        let word = k.mul_const(gid, 4);
        if elem == Scalar::F32 {
            let ty = Type::Vec(Scalar::F32, 4);
            let loaded: Vec<Value> = inputs
                .iter()
                .map(|&p| {
                    let at = k.ptr_add(p, word);
                    k.load(ty, at)
                })
                .collect();
            let results: Vec<Value> = (0..4)
                .map(|i| {
                    let xs: Vec<Value> = loaded.iter().map(|&v| k.extract(v, i)).collect();
                    f(k, &xs)
                })
                .collect();
            let v = k.pack(ty, &results);
            let at = k.ptr_add(out, word);
            k.store(at, v);
        } else {
            let (unpack, pack): (fn(&mut Builder, Value) -> [Value; 2], _) = match elem {
                Scalar::F16 => (emit_unpack_f16x2, emit_pack_f16x2 as fn(&mut _, _, _) -> _),
                _ => (emit_unpack_bf16x2, emit_pack_bf16x2),
            };
            let ty = Type::Vec(Scalar::U32, 4);
            let loaded: Vec<Value> = inputs
                .iter()
                .map(|&p| {
                    let w = words(k, p);
                    let at = k.ptr_add(w, word);
                    k.load(ty, at)
                })
                .collect();
            let packed: Vec<Value> = (0..4)
                .map(|i| {
                    let halves: Vec<[Value; 2]> = loaded
                        .iter()
                        .map(|&v| {
                            let w = k.extract(v, i);
                            unpack(k, w)
                        })
                        .collect();
                    let lo: Vec<Value> = halves.iter().map(|h| h[0]).collect();
                    let hi: Vec<Value> = halves.iter().map(|h| h[1]).collect();
                    let rlo = f(k, &lo);
                    let rhi = f(k, &hi);
                    pack(k, rlo, rhi)
                })
                .collect();
            let v = k.pack(ty, &packed);
            let w = words(k, out);
            let at = k.ptr_add(w, word);
            k.store(at, v);
        }
    });

    let start = k.shl_const(groups, shift);
    let tail = k.sub(n, start);
    let in_tail = k.lt(gid, tail);
    k.if_then(in_tail, |k| {
        let i = k.add(start, gid);
        let ty = Type::Scalar(elem);
        let xs: Vec<Value> = inputs
            .iter()
            .map(|&p| {
                let at = k.ptr_add(p, i);
                let x = k.load(ty, at);
                if elem == Scalar::F32 {
                    x
                } else {
                    k.cvt(Scalar::F32, x)
                }
            })
            .collect();
        let r = f(k, &xs);
        let r = if elem == Scalar::F32 {
            r
        } else {
            k.cvt(elem, r)
        };
        let at = k.ptr_add(out, i);
        k.store(at, r);
    });
}
