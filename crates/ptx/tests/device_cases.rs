//! GPU cases: emitted PTX run on the device against plain-Rust references, for the
//! lowerings that ptxas cannot judge (8-bit registers, conversions that take several
//! instructions, bit reinterpretation, loops, negative indices).
//!
//! `QUENCH_DEVICE_CASES=DIR cargo test -p quench-ptx --test device_cases -- --ignored`
//! writes the cases to DIR; `python3 scripts/device/ptx_cases.py DIR` runs them on
//! the GPU (it needs only the driver's libcuda) and compares every element.

mod common;
#[path = "device/reference.rs"]
mod reference;

use std::path::Path;

use common::kernels::global;
use quench_ir::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value as Json};

/// A buffer argument: its input bytes (or poisoned) and its expected bytes (or
/// unchecked), compared as elements of a scalar type.
enum Arg {
    Buf {
        bytes: usize,
        input: Option<Vec<u8>>,
        expect: Option<(Vec<u8>, Scalar)>,
    },
}

struct Case {
    f: Function,
    threads: u32,
    block: u32,
    args: Vec<Arg>,
}

fn elems(s: Scalar, data: &[u64]) -> Vec<u8> {
    let n = s.bytes() as usize;
    data.iter()
        .flat_map(|v| v.to_le_bytes()[..n].to_vec())
        .collect()
}

fn write(dir: &Path, cases: Vec<Case>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut index = Vec::new();
    for c in cases {
        let name = c.f.name.clone();
        let ptx = quench_ptx::emit(&c.f).unwrap_or_else(|e| panic!("{e}"));
        common::assemble(&c.f);
        std::fs::write(dir.join(format!("{name}.ptx")), ptx)?;
        let mut args = Vec::new();
        for (i, a) in c.args.into_iter().enumerate() {
            args.push(match a {
                Arg::Buf {
                    bytes,
                    input,
                    expect,
                } => {
                    let mut o = json!({ "bytes": bytes });
                    if let Some(data) = input {
                        let file = format!("{name}.{i}.in");
                        std::fs::write(dir.join(&file), data)?;
                        o["input"] = Json::from(file);
                    }
                    if let Some((data, elem)) = expect {
                        let file = format!("{name}.{i}.expect");
                        std::fs::write(dir.join(&file), data)?;
                        o["expect"] = Json::from(file);
                        o["elem"] = Json::from(elem.name());
                    }
                    o
                }
            });
        }
        index.push(json!({ "kernel": name, "ptx": format!("{name}.ptx"), "threads": c.threads, "block": c.block, "args": args }));
    }
    std::fs::write(
        dir.join("cases.json"),
        serde_json::to_string_pretty(&index)?,
    )
}

/// Every pair of bytes through every integer op, for s8 and u8.
fn bytes_case(s: Scalar) -> Case {
    const N: usize = 65536;
    let ops = BinOp::ALL;
    let uns: &[UnOp] = if s == Scalar::I8 {
        &[UnOp::Neg, UnOp::Abs, UnOp::Not]
    } else {
        &[UnOp::Not]
    };
    let slots = ops.len() + uns.len();
    let mut k = Builder::new(&format!("bytes_{s}"), 256);
    let (pa, pb) = (k.param("a", global(s)), k.param("b", global(s)));
    let (out, wide, less) = (
        k.param("out", global(s)),
        k.param("wide", global(Scalar::I32)),
        k.param("less", global(Scalar::U8)),
    );
    let i = k.global_id_x();
    let (qa, qb) = (k.ptr_add(pa, i), k.ptr_add(pb, i));
    let (a, b) = (k.load(Type::Scalar(s), qa), k.load(Type::Scalar(s), qb));
    let zero = k.const_bits(Type::Scalar(s), 0);
    let one = k.const_bits(Type::Scalar(s), 1);
    let is_zero = k.eq(b, zero);
    let nonzero = k.select(is_zero, one, b);
    let b32 = k.cvt(Scalar::U32, b);
    let fifteen = k.const_u32(15);
    let amount = k.and(b32, fifteen);
    let mut slot = 0;
    let mut put = |k: &mut Builder, v: Value| {
        let base = k.const_u32(slot * N as u32);
        slot += 1;
        let at = k.add(base, i);
        let p = k.ptr_add(out, at);
        k.store(p, v);
    };
    for op in ops {
        let rhs = match op {
            BinOp::Div | BinOp::Rem => nonzero,
            BinOp::Shl | BinOp::Shr => amount,
            _ => b,
        };
        let r = k.bin(op, a, rhs);
        put(&mut k, r);
    }
    for op in uns {
        let r = k.un(*op, a);
        put(&mut k, r);
    }
    let w = k.cvt(Scalar::I32, a);
    let pw = k.ptr_add(wide, i);
    k.store(pw, w);
    let lt = k.lt(a, b);
    let (t, f) = (
        k.const_bits(Type::Scalar(Scalar::U8), 1),
        k.const_bits(Type::Scalar(Scalar::U8), 0),
    );
    let l = k.select(lt, t, f);
    let pl = k.ptr_add(less, i);
    k.store(pl, l);

    let signed = s == Scalar::I8;
    let val = |x: usize| {
        if signed {
            x as u8 as i8 as i64
        } else {
            x as u8 as i64
        }
    };
    let (mut expect, mut widened, mut lesser) =
        (vec![0u8; slots * N], vec![0u8; 4 * N], vec![0u8; N]);
    for idx in 0..N {
        let (x, y) = (val(idx & 255), val(idx >> 8));
        let yz = if y == 0 { 1 } else { y };
        let sh = ((y as u32) & 15) as i64;
        let hi = (x * y) >> 8;
        let results = [
            x + y,
            x - y,
            x * y,
            hi,
            x / yz,
            x % yz,
            x.min(y),
            x.max(y),
            x & y,
            x | y,
            x ^ y,
            if sh >= 8 { 0 } else { x << sh },
            if sh >= 8 {
                if x < 0 {
                    -1
                } else {
                    0
                }
            } else {
                x >> sh
            },
        ];
        for (o, r) in results.iter().enumerate() {
            expect[o * N + idx] = *r as u8;
        }
        let un: Vec<i64> = if signed {
            vec![-x, x.abs(), !x]
        } else {
            vec![!x]
        };
        for (o, r) in un.iter().enumerate() {
            expect[(ops.len() + o) * N + idx] = *r as u8;
        }
        widened[4 * idx..4 * idx + 4].copy_from_slice(&(x as i32).to_le_bytes());
        lesser[idx] = u8::from(x < y);
    }
    let a_in: Vec<u8> = (0..N).map(|i| (i & 255) as u8).collect();
    let b_in: Vec<u8> = (0..N).map(|i| (i >> 8) as u8).collect();
    Case {
        f: k.finish().expect("valid kernel"),
        threads: N as u32,
        block: 256,
        args: vec![
            Arg::Buf {
                bytes: N,
                input: Some(a_in),
                expect: None,
            },
            Arg::Buf {
                bytes: N,
                input: Some(b_in),
                expect: None,
            },
            Arg::Buf {
                bytes: slots * N,
                input: None,
                expect: Some((expect, s)),
            },
            Arg::Buf {
                bytes: 4 * N,
                input: None,
                expect: Some((widened, Scalar::I32)),
            },
            Arg::Buf {
                bytes: N,
                input: None,
                expect: Some((lesser, Scalar::U8)),
            },
        ],
    }
}

/// Inputs for conversions from `s`: edge values, then random bits and moderate values.
fn conversion_inputs(s: Scalar, rng: &mut ChaCha8Rng, n: usize) -> Vec<u64> {
    let float = |x: f64| -> u64 {
        match reference::decode_float(Scalar::F64, x.to_bits()) {
            reference::Num::Finite { neg, mag, exp } => reference::round_float(s, neg, mag, exp),
            _ => reference::cvt(Scalar::F64, s, false, x.to_bits()),
        }
    };
    let mut v: Vec<u64> = if s.is_int() {
        let (lo, hi) = if s.is_signed() {
            (1u64 << (s.bits() - 1), (1u64 << (s.bits() - 1)) - 1)
        } else {
            (0, u64::MAX)
        };
        [
            0,
            1,
            u64::MAX,
            lo,
            hi,
            127,
            128,
            255,
            256,
            65504,
            65520,
            16777217,
        ]
        .into_iter()
        .collect()
    } else {
        [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            0.999,
            1.5,
            -0.25,
            2.5,
            -2.5,
            127.5,
            -128.5,
            255.5,
            65504.0,
            1e30,
            -1e30,
            3e-41,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ]
        .into_iter()
        .map(float)
        .collect()
    };
    let mask = if s.bits() == 64 {
        u64::MAX
    } else {
        (1 << s.bits()) - 1
    };
    while v.len() < n {
        let x = if rng.gen_bool(0.5) {
            rng.gen::<u64>()
        } else if s.is_int() {
            rng.gen_range(0..600u64).wrapping_sub(300)
        } else {
            float(rng.gen_range(-300.0..300.0))
        };
        v.push(x);
    }
    v.into_iter().map(|x| x & mask).collect()
}

/// Conversions from `from` to every numeric type, plain and saturating.
fn convert_case(from: Scalar, rng: &mut ChaCha8Rng) -> Case {
    const N: usize = 2048;
    let targets = common::numeric();
    let mut k = Builder::new(&format!("cvt_{from}"), 256);
    let inp = k.param("inp", global(from));
    let outs: Vec<Value> = targets
        .iter()
        .map(|t| k.param(&format!("out_{t}"), global(*t)))
        .collect();
    let i = k.global_id_x();
    let n = k.const_u32(N as u32);
    let j = k.add(i, n);
    let p = k.ptr_add(inp, i);
    let x = k.load(Type::Scalar(from), p);
    for (t, out) in targets.iter().zip(&outs) {
        let plain = k.cvt(*t, x);
        let q = k.ptr_add(*out, i);
        k.store(q, plain);
        // `sat` is not defined for int → float; the slot gets the plain result again.
        let sat = if from.is_int() && t.is_float() {
            plain
        } else {
            k.cvt_rnd(*t, builder::default_cvt_round(from, *t), true, x)
        };
        let q = k.ptr_add(*out, j);
        k.store(q, sat);
    }
    let input = conversion_inputs(from, rng, N);
    let mut args = vec![Arg::Buf {
        bytes: N * from.bytes() as usize,
        input: Some(elems(from, &input)),
        expect: None,
    }];
    for t in &targets {
        let sat_defined = !(from.is_int() && t.is_float());
        let mut expect: Vec<u64> = input
            .iter()
            .map(|x| reference::cvt(from, *t, false, *x))
            .collect();
        expect.extend(
            input
                .iter()
                .map(|x| reference::cvt(from, *t, sat_defined, *x)),
        );
        args.push(Arg::Buf {
            bytes: 2 * N * t.bytes() as usize,
            input: None,
            expect: Some((elems(*t, &expect), *t)),
        });
    }
    Case {
        f: k.finish().expect("valid kernel"),
        threads: N as u32,
        block: 256,
        args,
    }
}

/// Load a `from`, reinterpret it as a `to`, store it: the bytes come back unchanged.
fn bitcast_case(n: usize, from: Type, to: Type, rng: &mut ChaCha8Rng) -> Case {
    const N: usize = 1024;
    let lane = |t: Type| match t {
        Type::Scalar(s) => (s, 1),
        Type::Vec(s, n) => (s, n as u32),
        _ => unreachable!(),
    };
    let ((fs, fl), (ts, tl)) = (lane(from), lane(to));
    let mut k = Builder::new(&format!("bitcast_{n}"), 256);
    let (inp, out) = (k.param("inp", global(fs)), k.param("out", global(ts)));
    let i = k.global_id_x();
    let (cf, ct) = (k.const_u32(fl), k.const_u32(tl));
    let (oi, oo) = (k.mul(i, cf), k.mul(i, ct));
    let p = k.ptr_add(inp, oi);
    let x = k.load(from, p);
    let y = k.bitcast(to, x);
    let q = k.ptr_add(out, oo);
    k.store(q, y);
    let bytes = N * from.bytes() as usize;
    let data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
    Case {
        f: k.finish().expect("valid kernel"),
        threads: N as u32,
        block: 128,
        args: vec![
            Arg::Buf {
                bytes,
                input: Some(data.clone()),
                expect: None,
            },
            Arg::Buf {
                bytes,
                input: None,
                expect: Some((data, Scalar::U8)),
            },
        ],
    }
}

fn bitcast_cases(rng: &mut ChaCha8Rng) -> Vec<Case> {
    use Scalar::*;
    let (v, sc) = (|s, n| Type::Vec(s, n), Type::Scalar);
    let pairs = [
        (v(U8, 4), sc(U32)),
        (sc(U32), v(I8, 4)),
        (v(I8, 2), sc(F16)),
        (sc(BF16), v(U8, 2)),
        (v(I8, 2), v(U8, 2)),
        (sc(F64), v(F32, 2)),
        (v(F32, 2), sc(U64)),
        (sc(U64), v(I16, 4)),
        (v(F16, 4), v(U32, 2)),
        (v(U32, 2), v(BF16, 4)),
        (v(F64, 2), v(F32, 4)),
        (v(U32, 4), v(U64, 2)),
        (v(I8, 4), v(F16, 2)),
        (v(U16, 2), v(U8, 4)),
        (sc(F16x2), v(F16, 2)),
        (sc(F32), sc(BF16x2)),
    ];
    pairs
        .into_iter()
        .enumerate()
        .map(|(n, (a, b))| bitcast_case(n, a, b, rng))
        .collect()
}

/// Loops over u32, s32, s8 and u8 counters, carried values that swap, a nested loop,
/// and an `if` with results, all driven by a per-thread trip count.
fn control_case(rng: &mut ChaCha8Rng) -> Case {
    const N: usize = 512;
    let mut k = Builder::new("loops", 128);
    let (inp, out) = (
        k.param("inp", global(Scalar::U32)),
        k.param("out", global(Scalar::U32)),
    );
    let i = k.global_id_x();
    let p = k.ptr_add(inp, i);
    let n = k.load(Type::U32, p);
    let (z, one, two) = (k.const_u32(0), k.const_u32(1), k.const_u32(2));
    let swapped = k.for_range(z, n, one, &[one, two], |k, iv, c| {
        vec![k.add(c[1], iv), c[0]]
    });
    let n_i = k.cvt(Scalar::I32, n);
    let (five, m5, step2) = (k.const_i32(5), k.const_i32(-5), k.const_i32(2));
    let hi = k.sub(n_i, five);
    let zi = k.const_i32(0);
    let squares = k.for_range(m5, hi, step2, &[zi], |k, iv, c| {
        let sq = k.mul(iv, iv);
        vec![k.add(c[0], sq)]
    });
    let n8 = k.cvt(Scalar::I8, n);
    let three = k.const_bits(Type::Scalar(Scalar::I8), 3);
    let hi8 = k.mul(n8, three);
    let (lo8, st8) = (
        k.const_bits(Type::Scalar(Scalar::I8), (-100i8) as u8 as u64),
        k.const_bits(Type::Scalar(Scalar::I8), 9),
    );
    let trips8 = k.for_range(lo8, hi8, st8, &[z], |k, _, c| vec![k.add(c[0], one)]);
    let (lou, hiu, stu) = (
        k.const_bits(Type::Scalar(Scalar::U8), 1),
        k.const_bits(Type::Scalar(Scalar::U8), 200),
        k.const_bits(Type::Scalar(Scalar::U8), 7),
    );
    let nu = k.cvt(Scalar::U8, n);
    let lastu = k.for_range(lou, hiu, stu, &[nu], |k, iv, c| vec![k.add(c[0], iv)]);
    let lastu32 = k.cvt(Scalar::U32, lastu[0]);
    let nested = k.for_range(z, n, one, &[z], |k, j, c| {
        let inner = k.for_range(z, j, one, &[c[0]], |k, m, d| vec![k.add(d[0], m)]);
        vec![inner[0]]
    });
    let ten = k.const_u32(10);
    let small = k.lt(n, ten);
    let r = k.if_else(
        small,
        &[Type::U32, Type::F32],
        |k| {
            let three = k.const_u32(3);
            vec![k.mul(n, three), k.const_f32(1.5)]
        },
        |k| vec![k.sub(n, ten), k.const_f32(-2.0)],
    );
    let rf = k.bitcast(Type::U32, r[1]);
    let sq = k.bitcast(Type::U32, squares[0]);
    let results = [
        swapped[0], swapped[1], sq, trips8[0], lastu32, nested[0], r[0], rf,
    ];
    let stride = k.const_u32(N as u32);
    let mut at = i;
    for v in results {
        let q = k.ptr_add(out, at);
        k.store(q, v);
        at = k.add(at, stride);
    }
    let counts: Vec<u32> = (0..N).map(|_| rng.gen_range(0..25)).collect();
    let mut expect = vec![0u32; 8 * N];
    for (t, &n) in counts.iter().enumerate() {
        let (mut a, mut b) = (1u32, 2u32);
        for iv in 0..n {
            (a, b) = (b + iv, a);
        }
        let squares: i32 = (-5..n as i32 - 5).step_by(2).map(|x| x * x).sum();
        let hi8 = (n as u8 as i8).wrapping_mul(3);
        let trips8 = (-100i32..hi8 as i32).step_by(9).count() as u32;
        let lastu = (1u32..200)
            .step_by(7)
            .fold(n as u8, |acc, iv| acc.wrapping_add(iv as u8));
        let nested: u32 = (0..n).map(|j| (0..j).sum::<u32>()).sum();
        let (r0, r1) = if n < 10 {
            (n * 3, 1.5f32)
        } else {
            (n.wrapping_sub(10), -2.0)
        };
        let vals = [
            a,
            b,
            squares as u32,
            trips8,
            lastu as u32,
            nested,
            r0,
            r1.to_bits(),
        ];
        for (o, v) in vals.iter().enumerate() {
            expect[o * N + t] = *v;
        }
    }
    Case {
        f: k.finish().expect("valid kernel"),
        threads: N as u32,
        block: 128,
        args: vec![
            Arg::Buf {
                bytes: 4 * N,
                input: Some(counts.iter().flat_map(|c| c.to_le_bytes()).collect()),
                expect: None,
            },
            Arg::Buf {
                bytes: 32 * N,
                input: None,
                expect: Some((
                    expect.iter().flat_map(|c| c.to_le_bytes()).collect(),
                    Scalar::U32,
                )),
            },
        ],
    }
}

/// Indices of every integer type, negative ones included, from the middle of a global
/// and of a shared array.
fn index_case(rng: &mut ChaCha8Rng) -> Case {
    const T: usize = 256;
    const LEN: usize = 1024;
    let types: Vec<Scalar> = Scalar::ALL.into_iter().filter(|s| s.is_int()).collect();
    let mut k = Builder::new("indices", T as u32);
    let (buf, out) = (
        k.param("buf", global(Scalar::F32)),
        k.param("out", global(Scalar::F32)),
    );
    let tile = k.shared_array("tile", Scalar::F32, LEN as u32, 16);
    let t = k.tid_x();
    let four = k.const_u32(4);
    let t4 = k.mul(t, four);
    let (src, dst) = (k.ptr_add(buf, t4), k.ptr_add(tile, t4));
    let v = k.load(Type::Vec(Scalar::F32, 4), src);
    k.store(dst, v);
    k.barrier();
    let mid = k.const_u32(LEN as u32 / 2);
    let (gmid, smid) = (k.ptr_add(buf, mid), k.ptr_add(tile, mid));
    let ti = k.cvt(Scalar::I32, t);
    let half = k.const_i32(T as i32 / 2);
    let signed = k.sub(ti, half); // -128..127
    let mut slot = 0u32;
    let mut expect = vec![0f32; 2 * types.len() * T];
    let data: Vec<f32> = (0..LEN).map(|_| rng.gen_range(-1.0..1.0)).collect();
    for s in types {
        let idx = if s.is_signed() {
            k.cvt(s, signed)
        } else {
            k.cvt(s, t)
        };
        for base in [gmid, smid] {
            let p = k.ptr_add(base, idx);
            let x = k.load(Type::F32, p);
            let at = k.const_u32(slot * T as u32);
            let at = k.add(at, t);
            let q = k.ptr_add(out, at);
            k.store(q, x);
            for th in 0..T {
                let off = if s.is_signed() {
                    th as i64 - T as i64 / 2
                } else {
                    th as i64
                };
                expect[slot as usize * T + th] = data[(LEN as i64 / 2 + off) as usize];
            }
            slot += 1;
        }
    }
    Case {
        f: k.finish().expect("valid kernel"),
        threads: T as u32,
        block: T as u32,
        args: vec![
            Arg::Buf {
                bytes: 4 * LEN,
                input: Some(data.iter().flat_map(|x| x.to_le_bytes()).collect()),
                expect: None,
            },
            Arg::Buf {
                bytes: 4 * expect.len(),
                input: None,
                expect: Some((
                    expect.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    Scalar::F32,
                )),
            },
        ],
    }
}

#[test]
#[ignore = "writes GPU cases; run with QUENCH_DEVICE_CASES=DIR"]
fn write_device_cases() {
    let dir = std::env::var("QUENCH_DEVICE_CASES")
        .expect("QUENCH_DEVICE_CASES names the output directory");
    let seed = quench_testkit::seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cases = vec![
        bytes_case(Scalar::I8),
        bytes_case(Scalar::U8),
        control_case(&mut rng),
        index_case(&mut rng),
    ];
    for from in common::numeric() {
        cases.push(convert_case(from, &mut rng));
    }
    cases.extend(bitcast_cases(&mut rng));
    write(Path::new(&dir), cases).expect("writing the cases");
}
