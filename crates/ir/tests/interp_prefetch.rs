//! Interpreter: `prefetch.global.L2` is a hint that changes no memory and no register,
//! but an address outside global memory is an error (a kernel prefetching past its
//! buffers has a bug); the verifier takes only global pointers.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device, InterpError};
use quench_ir::{AddrSpace, Builder, Function, Op, Scalar, Type};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);

/// `out[t] = src[t] + 1` with a prefetch of `src[t + ahead]` between the load and the
/// store, over 64 threads.
fn copy_with_prefetch(ahead: u32) -> Function {
    let mut k = Builder::new("prefetch", 64);
    let [src, out] = ["src", "out"].map(|n| k.param(n, PU32));
    let t = k.tid_x();
    let at = k.ptr_add(src, t);
    let v = k.load(Type::U32, at);
    let later = k.add_const(t, ahead);
    let there = k.ptr_add(src, later);
    k.prefetch_l2(there);
    let v = k.add_const(v, 1);
    let at = k.ptr_add(out, t);
    k.store(at, v);
    k.finish().expect("verifies")
}

#[test]
fn a_prefetch_changes_nothing() {
    let mut rng = rng();
    let src: Vec<u32> = (0..128).map(|_| rng.gen()).collect();
    let mut dev = Device::new();
    let s = upload_u32(&mut dev, &src);
    let o = output(&mut dev, 4 * 64);
    launch(&copy_with_prefetch(64), &cfg(1, 64), &[s, o], &mut dev).expect("runs");
    let want: Vec<u32> = src[..64].iter().map(|v| v.wrapping_add(1)).collect();
    assert_eq!(download_u32(&dev, o, 64), want);
    assert_eq!(download_u32(&dev, s, 128), src, "the prefetched memory is unchanged");
}

#[test]
fn a_prefetch_past_the_buffer_is_an_error() {
    let mut dev = Device::new();
    let s = upload_u32(&mut dev, &[7; 64]);
    let o = output(&mut dev, 4 * 64);
    let err = launch(&copy_with_prefetch(1 << 20), &cfg(1, 64), &[s, o], &mut dev).expect_err("out of bounds");
    assert!(matches!(err, InterpError::GlobalOutOfBounds { .. }), "{err}");
}

#[test]
fn only_global_pointers_are_prefetched() {
    let mut k = Builder::new("bad_prefetch", 32);
    let tile = k.shared_array("tile", Scalar::U32, 32, 16);
    k.emit_void(Op::PrefetchL2 { ptr: tile });
    let err = k.finish().expect_err("a shared pointer is rejected");
    assert!(err.to_string().contains("global"), "{err}");
}
