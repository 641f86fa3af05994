//! Interpreter memory: device allocations, out-of-bounds and misaligned accesses,
//! shared arrays and dynamic shared memory, vectors, `cp.async`, launch checks.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device, InterpError, LaunchConfig};
use quench_ir::{AddrSpace, Builder, CacheOp, Function, Scalar, Type};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);
const PF32: Type = Type::Ptr(AddrSpace::Global, Scalar::F32);

#[test]
fn allocations_are_aligned_separate_and_checked() {
    let mut dev = Device::new();
    let a = dev.mem.alloc(100).expect("alloc");
    let b = dev.mem.alloc(100).expect("alloc");
    assert!(a != 0 && a.is_multiple_of(256) && b.is_multiple_of(256));
    assert!(
        b >= a + 100 + 4096,
        "a gap separates allocations: {a:#x} {b:#x}"
    );
    dev.mem.write(a + 10, &[1, 2, 3]).expect("write inside");
    assert_eq!(
        download(&dev, a + 9, 5),
        [0, 1, 2, 3, 0],
        "fresh memory is zero"
    );
    let mut buf = [0u8; 20];
    match dev.mem.read(a + 90, &mut buf) {
        Err(InterpError::HostOutOfBounds {
            addr,
            bytes: 20,
            detail,
        }) => {
            assert_eq!(addr, a + 90);
            assert!(
                detail.contains("runs 10 bytes past the end of the 100-byte allocation"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(dev.mem.write(a + 100, &[0]).is_err(), "one past the end");
    assert!(dev.mem.read(0, &mut buf).is_err(), "null");
    dev.mem.free(a).expect("free");
    match dev.mem.read(a, &mut buf) {
        Err(InterpError::HostOutOfBounds { detail, .. }) => {
            assert!(detail.contains("freed"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(dev.mem.free(a), Err(InterpError::BadFree { .. })),
        "double free"
    );
    assert!(
        matches!(dev.mem.free(b + 4), Err(InterpError::BadFree { .. })),
        "not the start"
    );
    assert!(matches!(
        dev.mem.alloc(u64::MAX),
        Err(InterpError::OutOfMemory { .. })
    ));
}

/// `out[i] = x[i]` for i in 0..threads, over a buffer that may be too short.
fn copy_kernel() -> Function {
    let mut k = Builder::new("copy", 64);
    let x = k.param("x", PF32);
    let out = k.param("out", PF32);
    let i = k.global_id_x();
    let p = k.ptr_add(x, i);
    let v = k.load(Type::F32, p);
    let q = k.ptr_add(out, i);
    k.store(q, v);
    k.finish().expect("verifies")
}

#[test]
fn out_of_bounds_global_access_names_thread_and_address() {
    let f = copy_kernel();
    let mut dev = Device::new();
    let (x, out) = (output(&mut dev, 4 * 100), output(&mut dev, 4 * 128));
    match launch(&f, &cfg(2, 64), &[x, out], &mut dev) {
        Err(InterpError::GlobalOutOfBounds {
            site,
            addr,
            bytes: 4,
            detail,
        }) => {
            assert_eq!(
                (site.block, site.thread),
                ([1, 0, 0], Some([36, 0, 0])),
                "the first thread past the end"
            );
            assert_eq!(addr, x + 400);
            assert!(site.op.starts_with("ld.global"), "{}", site.op);
            assert!(
                detail.contains("past the end of the 400-byte allocation"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    dev.mem.free(x).expect("free");
    match launch(&f, &cfg(1, 64), &[x, out], &mut dev) {
        Err(InterpError::GlobalOutOfBounds { detail, .. }) => {
            assert!(detail.contains("freed"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn misaligned_and_local_accesses_are_refused() {
    let mut k = Builder::new("misaligned", 32);
    let x = k.param("x", PF32);
    let b = k.ptr_cast(Scalar::U8, x);
    let one = k.const_u32(1);
    let b = k.ptr_add(b, one);
    let p = k.ptr_cast(Scalar::F32, b);
    let v = k.load(Type::F32, p);
    k.store(x, v);
    let f = k.finish().expect("verifies");
    let mut dev = Device::new();
    let buf = output(&mut dev, 64);
    match launch(&f, &cfg(1, 32), &[buf], &mut dev) {
        Err(InterpError::Misaligned {
            addr,
            align: 4,
            space: "global",
            ..
        }) => assert_eq!(addr, buf + 1),
        other => panic!("{other:?}"),
    }

    // Verified kernels cannot take local pointers; unverified ones are refused when
    // they access local memory.
    let mut k = Builder::new("local", 32);
    let x = k.param("x", PF32);
    let v = k.load(Type::F32, x);
    let y = k.add(v, v);
    k.store(x, y);
    let mut f = k.finish().expect("verifies");
    let local = Type::Ptr(AddrSpace::Local, Scalar::F32);
    f.params[0].ty = local;
    f.values[0] = local;
    assert!(matches!(
        launch(&f, &cfg(1, 32), &[16], &mut dev),
        Err(InterpError::LocalMemory { .. })
    ));
}

/// A pointer into one shared array may not reach the next one; the last array reaches
/// on into the dynamic shared memory, up to its end.
#[test]
fn shared_arrays_and_dynamic_shared_memory() {
    let mut k = Builder::new("shared", 128);
    let reach = k.param("reach", Type::U32);
    let tile_reach = k.param("tile_reach", Type::U32);
    let out = k.param("out", PU32);
    let tile = k.shared_array("tile", Scalar::U32, 64, 4);
    let _other = k.shared_array("other", Scalar::U32, 64, 4);
    // 16 static bytes at offset 512; the dynamic part follows them.
    let dynamic = k.shared_array("dyn", Scalar::U32, 4, 16);
    let t = k.tid_x();
    let ten = k.const_u32(10);
    let v = k.add(t, ten);
    let p = k.ptr_add(dynamic, t);
    k.store(p, v);
    k.barrier();
    let (one, n) = (k.const_u32(1), k.const_u32(128));
    let j = k.add(t, one);
    let j = k.rem(j, n);
    let j = k.add(j, reach);
    let q = k.ptr_add(dynamic, j);
    let w = k.load(Type::U32, q);
    let o = k.ptr_add(out, t);
    k.store(o, w);
    // Threads below 64 also touch tile[t + tile_reach].
    let sixty_four = k.const_u32(64);
    let low = k.lt(t, sixty_four);
    k.if_then(low, |k| {
        let i = k.add(t, tile_reach);
        let p = k.ptr_add(tile, i);
        k.store(p, t);
    });
    let f = k.finish().expect("verifies");
    assert_eq!(f.shared_bytes(), 528);

    let mut dev = Device::new();
    let o = output(&mut dev, 4 * 128);
    // dyn[0..128] is exactly the window: 512 + 4·128 = 528 + 496.
    let c = LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        dynamic_shared_bytes: 496,
    };
    launch(&f, &c, &[0, 0, o], &mut dev).expect("runs");
    let got = download_u32(&dev, o, 128);
    assert!(
        got.iter()
            .enumerate()
            .all(|(t, &x)| x == (t as u32 + 1) % 128 + 10),
        "{got:?}"
    );

    match launch(&f, &c, &[1, 0, o], &mut dev) {
        Err(InterpError::SharedOutOfBounds {
            site,
            offset,
            bytes: 4,
            region,
        }) => {
            assert!(region.contains("`dyn`"), "{region}");
            assert_eq!(
                (site.thread, offset),
                (Some([126, 0, 0]), 1024),
                "thread 126 reads dyn[128]"
            );
        }
        other => panic!("{other:?}"),
    }
    match launch(&f, &c, &[0, 1, o], &mut dev) {
        Err(InterpError::SharedOutOfBounds { site, region, .. }) => {
            assert!(region.contains("`tile`"), "{region}");
            assert_eq!(
                site.thread,
                Some([63, 0, 0]),
                "tile[64] lies in `other`, still out of `tile`"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Vector loads and stores, packing and extracting, reinterpreting bits.
#[test]
fn vectors_pack_extract_and_bitcast() {
    let mut rng = rng();
    let mut k = Builder::new("vectors", 64);
    let x = k.param("x", PF32);
    let y = k.param("y", PU32);
    let h = k.param("h", Type::Ptr(AddrSpace::Global, Scalar::F16));
    let out4 = k.param("out4", PF32);
    let out64 = k.param("out64", Type::Ptr(AddrSpace::Global, Scalar::U64));
    let outh = k.param("outh", PU32);
    let i = k.global_id_x();
    let four = k.const_u32(4);
    let i4 = k.mul(i, four);
    let p = k.ptr_add(x, i4);
    let v = k.load(Type::Vec(Scalar::F32, 4), p);
    let parts: Vec<_> = (0..4).rev().map(|j| k.extract(v, j)).collect();
    let r = k.pack(Type::Vec(Scalar::F32, 4), &parts);
    let q = k.ptr_add(out4, i4);
    k.store(q, r);
    let two = k.const_u32(2);
    let i2 = k.mul(i, two);
    let p = k.ptr_add(y, i2);
    let u = k.load(Type::Vec(Scalar::U32, 2), p);
    let b = k.bitcast(Type::U64, u);
    let q = k.ptr_add(out64, i);
    k.store(q, b);
    let p = k.ptr_add(h, i2);
    let pair = k.load(Type::Vec(Scalar::F16, 2), p);
    let (lo, hi) = (k.extract(pair, 0), k.extract(pair, 1));
    let packed = k.pack(Type::Scalar(Scalar::F16x2), &[hi, lo]);
    let bits = k.bitcast(Type::U32, packed);
    let q = k.ptr_add(outh, i);
    k.store(q, bits);
    let f = k.finish().expect("verifies");

    let xs: Vec<u32> = (0..256).map(|_| rng.gen()).collect();
    let ys: Vec<u32> = (0..128).map(|_| rng.gen()).collect();
    let hs: Vec<u16> = (0..128).map(|_| rng.gen()).collect();
    let mut dev = Device::new();
    let (xp, yp, hp) = (
        upload_u32(&mut dev, &xs),
        upload_u32(&mut dev, &ys),
        upload_u16(&mut dev, &hs),
    );
    let (o4, o64, oh) = (
        output(&mut dev, 4 * 256),
        output(&mut dev, 8 * 64),
        output(&mut dev, 4 * 64),
    );
    launch(&f, &cfg(1, 64), &[xp, yp, hp, o4, o64, oh], &mut dev).expect("runs");
    let (g4, g64, gh) = (
        download_u32(&dev, o4, 256),
        download_u64(&dev, o64, 64),
        download_u32(&dev, oh, 64),
    );
    for i in 0..64 {
        let rev: Vec<u32> = xs[4 * i..4 * i + 4].iter().rev().copied().collect();
        assert_eq!(g4[4 * i..4 * i + 4], rev[..], "element {i}");
        assert_eq!(
            g64[i],
            ys[2 * i] as u64 | (ys[2 * i + 1] as u64) << 32,
            "element {i}"
        );
        assert_eq!(
            gh[i],
            hs[2 * i + 1] as u32 | (hs[2 * i] as u32) << 16,
            "element {i}"
        );
    }
}

/// Data of `cp.async` arrives when its group is waited for, not before.
#[test]
fn cp_async_lands_at_wait() {
    let mut rng = rng();
    let mut k = Builder::new("cp_async", 32);
    let src = k.param("src", PU32);
    let out = k.param("out", PU32);
    let s = k.shared_array("s", Scalar::U32, 64, 16);
    let lane = k.lane_id();
    let thirty_two = k.const_u32(32);
    for g in 0..2 {
        let i = if g == 0 {
            lane
        } else {
            k.add(lane, thirty_two)
        };
        let from = k.ptr_add(src, i);
        let to = k.ptr_add(s, i);
        k.cp_async(to, from, 4, CacheOp::Ca);
        k.cp_async_commit();
    }
    let record = |k: &mut Builder, slot: u32, upper: bool| {
        let i = if upper { k.add(lane, thirty_two) } else { lane };
        let p = k.ptr_add(s, i);
        let v = k.load(Type::U32, p);
        let at = k.const_u32(32 * slot);
        let at = k.add(at, lane);
        let q = k.ptr_add(out, at);
        k.store(q, v);
    };
    record(&mut k, 0, false);
    k.cp_async_wait(1);
    record(&mut k, 1, false);
    record(&mut k, 2, true);
    k.cp_async_wait(0);
    record(&mut k, 3, true);
    let f = k.finish().expect("verifies");

    let data: Vec<u32> = (0..64).map(|_| rng.gen()).collect();
    let mut dev = Device::new();
    let (sp, op) = (upload_u32(&mut dev, &data), output(&mut dev, 4 * 128));
    launch(&f, &cfg(1, 32), &[sp, op], &mut dev).expect("runs");
    let got = download_u32(&dev, op, 128);
    assert!(
        got[..32].iter().all(|&x| x == u32::MAX),
        "before any wait: shared memory's initial 0xff bytes"
    );
    assert_eq!(
        got[32..64],
        data[..32],
        "after wait_group 1: the first group"
    );
    assert!(
        got[64..96].iter().all(|&x| x == u32::MAX),
        "the second group is still in flight"
    );
    assert_eq!(got[96..], data[32..], "after wait_group 0: everything");

    // The source is checked when the copy is issued.
    let short = output(&mut dev, 4 * 40);
    match launch(&f, &cfg(1, 32), &[short, op], &mut dev) {
        Err(InterpError::GlobalOutOfBounds { site, .. }) => {
            assert!(
                site.op.starts_with("cp.async") && site.thread == Some([8, 0, 0]),
                "{site}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn launches_are_checked() {
    let f = copy_kernel();
    let mut dev = Device::new();
    let buf = output(&mut dev, 4 * 64);
    let shape = |grid: [u32; 3], block: [u32; 3], dynamic_shared_bytes: u32| LaunchConfig {
        grid,
        block,
        dynamic_shared_bytes,
    };
    let err = |c: LaunchConfig, args: &[u64], dev: &mut Device| {
        launch(&f, &c, args, dev).expect_err("refused")
    };
    let ok = shape([1, 1, 1], [64, 1, 1], 0);
    assert!(matches!(
        err(ok, &[buf], &mut dev),
        InterpError::ArgCount {
            expected: 2,
            got: 1,
            ..
        }
    ));
    for (c, what) in [
        (shape([0, 1, 1], [64, 1, 1], 0), "zero dimension"),
        (shape([1, 1, 1], [65, 1, 1], 0), "at most 64"),
        (shape([1, 1, 1], [1025, 1, 1], 0), "limits"),
        (shape([1, 1, 1], [32, 32, 2], 0), "more than 1024"),
        (shape([1, 1, 1], [64, 1, 1], 300 * 1024), "shared memory"),
        (shape([1, 70000, 1], [64, 1, 1], 0), "limits"),
    ] {
        match err(c, &[buf, buf], &mut dev) {
            InterpError::LaunchShape { problem, .. } => {
                assert!(problem.contains(what), "{problem} / {what}")
            }
            other => panic!("{other:?}"),
        }
    }
    let mut k = Builder::new("narrow", 32);
    k.param("n", Type::U32);
    let f = k.finish().expect("verifies");
    match launch(&f, &cfg(1, 32), &[1 << 40], &mut dev) {
        Err(InterpError::BadArg { index: 0, name, .. }) => assert_eq!(name, "n"),
        other => panic!("{other:?}"),
    }
}
