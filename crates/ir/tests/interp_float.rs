//! Interpreter arithmetic: correctly rounded float operations in every direction
//! (checked against an exact reference), conversions, PTX min/max, integer
//! semantics, and the approximate operations.
//!
//! The reference never rounds twice: an exact result is carried as its nearest f64 `r`
//! plus the sign of the remainder (from error-free transformations), and the expected
//! result is found by comparing candidates of the target format with that pair.

mod interp_support;

use std::cmp::Ordering as Ord;

use interp_support::*;
use quench_ir::interp::{launch, Device};
use quench_ir::{AddrSpace, BinOp, Builder, Function, Op, Round, Scalar, Type, UnOp, Value};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

const MODES: [Round; 4] = Round::ALL;

/// An exact real number: `r` is its nearest f64, `tail` the sign of what remains.
#[derive(Clone, Copy, Debug)]
struct Exact {
    r: f64,
    tail: i8,
}

fn sgn(x: f64) -> i8 {
    (x > 0.0) as i8 - (x < 0.0) as i8
}

fn exact(r: f64) -> Exact {
    Exact { r, tail: 0 }
}

/// a + b exactly (TwoSum).
fn sum(a: f64, b: f64) -> Exact {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    Exact { r: s, tail: sgn(e) }
}

/// Compare an f64 with an exact value.
fn cmp(t: f64, x: Exact) -> Ord {
    if t != x.r {
        t.partial_cmp(&x.r).unwrap_or(Ord::Equal)
    } else {
        0.cmp(&x.tail)
    }
}

fn is_zero(x: Exact) -> bool {
    x.r == 0.0 && x.tail == 0
}

/// The correctly rounded value of `x` given its neighbours in the target format:
/// `lo` ≤ x ≤ `hi` (infinite past the largest finite value), `even_lo` whether `lo`
/// has an even significand, `overflow_mid` the midpoint between the largest finite
/// value and the next power of two.
fn pick(x: Exact, mode: Round, lo: f64, hi: f64, even_lo: bool, overflow_mid: f64) -> f64 {
    if cmp(lo, x) == Ord::Equal {
        return lo;
    }
    let positive = cmp(0.0, x) == Ord::Less;
    match mode {
        Round::Rm => lo,
        Round::Rp => hi,
        Round::Rz => {
            if positive {
                lo
            } else {
                hi
            }
        }
        Round::Rn => {
            let mid = if hi.is_infinite() {
                overflow_mid
            } else if lo.is_infinite() {
                -overflow_mid
            } else {
                (lo + hi) / 2.0
            };
            match cmp(mid, x) {
                Ord::Greater => lo,
                Ord::Less => hi,
                // Ties go to the even neighbour; infinity counts as even.
                Ord::Equal if lo.is_infinite() => lo,
                Ord::Equal if hi.is_infinite() => hi,
                Ord::Equal => {
                    if even_lo {
                        lo
                    } else {
                        hi
                    }
                }
            }
        }
    }
}

/// A zero result carries the sign of the (nonzero) exact value.
fn signed_zero(v: f64, x: Exact) -> f64 {
    if v == 0.0 {
        if cmp(0.0, x) == Ord::Greater {
            -0.0
        } else {
            0.0
        }
    } else {
        v
    }
}

fn round_f32(x: Exact, mode: Round) -> f32 {
    let mut lo = x.r as f32;
    if lo.is_infinite() {
        lo = f32::MAX.copysign(lo);
    }
    while cmp(lo as f64, x) == Ord::Greater {
        lo = lo.next_down();
    }
    while lo != f32::INFINITY && cmp(lo.next_up() as f64, x) != Ord::Greater {
        lo = lo.next_up();
    }
    let hi = if cmp(lo as f64, x) == Ord::Equal {
        lo
    } else {
        lo.next_up()
    };
    let mid = f32::MAX as f64 + 2f64.powi(103);
    signed_zero(
        pick(x, mode, lo as f64, hi as f64, lo.to_bits() & 1 == 0, mid),
        x,
    ) as f32
}

fn round_f64(x: Exact, mode: Round) -> f64 {
    if mode == Round::Rn {
        // `r` is the nearest f64 by construction (and the midpoint of two f64
        // neighbours is not an f64, so `pick` could not find it).
        return x.r;
    }
    let lo = if x.tail < 0 { x.r.next_down() } else { x.r };
    let hi = if x.tail > 0 { x.r.next_up() } else { x.r };
    let mid = f64::MAX + 2f64.powi(970);
    signed_zero(pick(x, mode, lo, hi, lo.to_bits() & 1 == 0, mid), x)
}

/// A 16-bit format by its finite values, sorted (zero once, as +0).
struct Table {
    vals: Vec<(f64, u16)>,
    overflow_mid: f64,
    is_f16: bool,
}

impl Table {
    fn new(is_f16: bool) -> Table {
        let dec = |b: u16| {
            if is_f16 {
                half::f16::from_bits(b).to_f64()
            } else {
                half::bf16::from_bits(b).to_f64()
            }
        };
        let mut vals: Vec<(f64, u16)> = (0..=u16::MAX)
            .filter(|&b| b != 0x8000)
            .map(|b| (dec(b), b))
            .filter(|v| v.0.is_finite())
            .collect();
        vals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let max = vals[vals.len() - 1].0;
        let ulp = max - vals[vals.len() - 2].0;
        Table {
            vals,
            overflow_mid: max + ulp / 2.0,
            is_f16,
        }
    }

    fn round(&self, x: Exact, mode: Round) -> u16 {
        let i = self.vals.partition_point(|v| cmp(v.0, x) != Ord::Greater);
        let (lo, lo_bits) = if i == 0 {
            (f64::NEG_INFINITY, 0)
        } else {
            self.vals[i - 1]
        };
        let hi = match self.vals.get(i) {
            _ if cmp(lo, x) == Ord::Equal => lo,
            Some(v) => v.0,
            None => f64::INFINITY,
        };
        let v = signed_zero(
            pick(x, mode, lo, hi, lo_bits & 1 == 0, self.overflow_mid),
            x,
        );
        if self.is_f16 {
            half::f16::from_f64(v).to_bits()
        } else {
            half::bf16::from_f64(v).to_bits()
        }
    }
}

/// A random f32 with exponent in [-emax, emax], occasionally a small integer or a
/// value whose sum or product ties.
fn rand_f32(rng: &mut ChaCha8Rng, emax: i32) -> f32 {
    let sign = if rng.gen() { -1.0 } else { 1.0 };
    match rng.gen_range(0..10) {
        0 => sign * rng.gen_range(0..64) as f32,
        1 => sign * (1.0 + rng.gen_range(0..8) as f32 * 2f32.powi(-23)),
        _ => {
            let m = 1.0 + rng.gen::<f32>();
            sign * m * 2f32.powi(rng.gen_range(-emax..=emax))
        }
    }
}

fn fptr(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

/// A kernel computing, for element `i`, every listed operation in every rounding
/// direction from `a[i]`, `b[i]`, `c[i]` into `out[(i * ops + op) * 4 + mode]`.
fn rounding_kernel(s: Scalar, ops: &[&str]) -> Function {
    let ty = Type::Scalar(s);
    let mut k = Builder::new("rounding", 64);
    let (pa, pb, pc) = (
        k.param("a", fptr(s)),
        k.param("b", fptr(s)),
        k.param("c", fptr(s)),
    );
    let out = k.param("out", fptr(s));
    let i = k.global_id_x();
    let load = |k: &mut Builder, p: Value| {
        let q = k.ptr_add(p, i);
        k.load(ty, q)
    };
    let (a, b, c) = (load(&mut k, pa), load(&mut k, pb), load(&mut k, pc));
    let n = k.const_u32(4 * ops.len() as u32);
    let base = k.mul(i, n);
    for (oi, op) in ops.iter().enumerate() {
        for (mi, rnd) in MODES.into_iter().enumerate() {
            let v = match *op {
                "add" => k.bin_rnd(BinOp::Add, Some(rnd), a, b),
                "sub" => k.bin_rnd(BinOp::Sub, Some(rnd), a, b),
                "mul" => k.bin_rnd(BinOp::Mul, Some(rnd), a, b),
                "div" => k.bin_rnd(BinOp::Div, Some(rnd), a, b),
                "fma" => k.emit(ty, Op::Fma { rnd, a, b, c }),
                "sqrt" => {
                    let m = k.abs(a);
                    k.un(UnOp::Sqrt(rnd), m)
                }
                "rcp" => k.un(UnOp::Rcp(rnd), a),
                _ => unreachable!("unknown op {op}"),
            };
            let off = k.const_u32((oi * 4 + mi) as u32);
            let at = k.add(base, off);
            let q = k.ptr_add(out, at);
            k.store(q, v);
        }
    }
    k.finish().expect("verifies")
}

/// Run a rounding kernel over inputs given as raw bits of `bytes` each.
fn run_rounding(
    f: &Function,
    bytes: usize,
    a: &[u64],
    b: &[u64],
    c: &[u64],
    ops: usize,
) -> Vec<u64> {
    let n = a.len();
    let mut dev = Device::new();
    let up = |dev: &mut Device, v: &[u64]| {
        upload(
            dev,
            &v.iter()
                .flat_map(|x| x.to_le_bytes()[..bytes].to_vec())
                .collect::<Vec<_>>(),
        )
    };
    let (pa, pb, pc) = (up(&mut dev, a), up(&mut dev, b), up(&mut dev, c));
    let out = output(&mut dev, n * ops * 4 * bytes);
    let stats = launch(f, &cfg(n as u32 / 64, 64), &[pa, pb, pc, out], &mut dev).expect("runs");
    assert!(stats.all_exact());
    download(&dev, out, n * ops * 4 * bytes)
        .chunks(bytes)
        .map(|ch| {
            let mut w = [0u8; 8];
            w[..bytes].copy_from_slice(ch);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// The exact result of `op` (one of the rounding kernel's: add, sub, mul, div, fma, sqrt
/// of |x|, else rcp) on f64 operands, as its f64 rounding to nearest and the sign of
/// what that dropped. `x·y` must be exact in f64 for fma (it is for f32 operands and
/// for 26-bit significands).
fn exact_result(op: &str, x: f64, y: f64, z: f64) -> Exact {
    match op {
        "add" => sum(x, y),
        "sub" => sum(x, -y),
        "mul" => {
            let p = x * y;
            Exact {
                r: p,
                tail: sgn(x.mul_add(y, -p)),
            }
        }
        "div" => {
            let q = x / y;
            Exact {
                r: q,
                tail: sgn((-q).mul_add(y, x)) * sgn(y),
            }
        }
        "fma" => sum(x * y, z),
        "sqrt" => {
            let s = x.abs().sqrt();
            Exact {
                r: s,
                tail: sgn((-s).mul_add(s, x.abs())),
            }
        }
        _ => {
            let q = 1.0 / x;
            Exact {
                r: q,
                tail: sgn((-q).mul_add(x, 1.0)) * sgn(x),
            }
        }
    }
}

#[test]
fn f32_arithmetic_rounds_correctly_in_every_direction() {
    let mut rng = rng();
    let ops = ["add", "sub", "mul", "div", "fma", "sqrt", "rcp"];
    let f = rounding_kernel(Scalar::F32, &ops);
    let n = 512;
    let gen = |rng: &mut ChaCha8Rng| (0..n).map(|_| rand_f32(rng, 90)).collect::<Vec<f32>>();
    let (a, b, c) = (gen(&mut rng), gen(&mut rng), gen(&mut rng));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>();
    let out = run_rounding(&f, 4, &bits(&a), &bits(&b), &bits(&c), ops.len());
    for i in 0..n {
        let (x, y, z) = (a[i] as f64, b[i] as f64, c[i] as f64);
        for (oi, op) in ops.iter().enumerate() {
            let e = exact_result(op, x, y, z);
            if is_zero(e) {
                continue;
            }
            for (mi, mode) in MODES.into_iter().enumerate() {
                let got = f32::from_bits(out[(i * ops.len() + oi) * 4 + mi] as u32);
                let want = round_f32(e, mode);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{op}.{} {} {} {}: got {got:e}, want {want:e}",
                    mode.name(),
                    a[i],
                    b[i],
                    c[i]
                );
            }
        }
    }
}

#[test]
fn f64_arithmetic_rounds_correctly_in_every_direction() {
    let mut rng = rng();
    let ops = ["add", "sub", "mul", "div", "fma", "sqrt", "rcp"];
    let f = rounding_kernel(Scalar::F64, &ops);
    let n = 256;
    // a and b have 26-bit significands so that a·b is exact in f64 (the fma reference).
    let gen = |rng: &mut ChaCha8Rng, short: bool| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let m = 1.0 + rng.gen::<f64>();
                let m = if short {
                    (m * 2f64.powi(25)).floor() / 2f64.powi(25)
                } else {
                    m
                };
                let s = if rng.gen() { -1.0 } else { 1.0 };
                s * m * 2f64.powi(rng.gen_range(-200..=200))
            })
            .collect()
    };
    let (a, b, c) = (
        gen(&mut rng, true),
        gen(&mut rng, true),
        gen(&mut rng, false),
    );
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let out = run_rounding(&f, 8, &bits(&a), &bits(&b), &bits(&c), ops.len());
    for i in 0..n {
        let (x, y, z) = (a[i], b[i], c[i]);
        for (oi, op) in ops.iter().enumerate() {
            let e = exact_result(op, x, y, z);
            for (mi, mode) in MODES.into_iter().enumerate() {
                let got = f64::from_bits(out[(i * ops.len() + oi) * 4 + mi]);
                let want = round_f64(e, mode);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{op}.{} {x:e} {y:e} {z:e}",
                    mode.name()
                );
            }
        }
    }
}

/// f16 and bf16 add/sub/mul/fma, scalar and packed, against the exact value rounded
/// by a table of every value of the format.
#[test]
fn half_precision_arithmetic_rounds_correctly() {
    let mut rng = rng();
    let ops = ["add", "sub", "mul", "fma"];
    for (scalar, packed, is_f16) in [
        (Scalar::F16, Scalar::F16x2, true),
        (Scalar::BF16, Scalar::BF16x2, false),
    ] {
        let table = Table::new(is_f16);
        let dec = |b: u64| {
            if is_f16 {
                half::f16::from_bits(b as u16).to_f64()
            } else {
                half::bf16::from_bits(b as u16).to_f64()
            }
        };
        // Finite random values of the format over its whole range.
        let gen = |rng: &mut ChaCha8Rng| -> Vec<u64> {
            (0..128)
                .map(|_| loop {
                    let b: u16 = rng.gen();
                    if dec(b as u64).is_finite() {
                        break b as u64;
                    }
                })
                .collect()
        };
        let (a, b, c) = (gen(&mut rng), gen(&mut rng), gen(&mut rng));
        let check = |out: &[u64], what: &str, lane: usize| {
            for i in 0..64 {
                let (x, y, z) = (
                    dec(a[2 * i + lane]),
                    dec(b[2 * i + lane]),
                    dec(c[2 * i + lane]),
                );
                for (oi, op) in ops.iter().enumerate() {
                    let e = match *op {
                        "add" => sum(x, y),
                        "sub" => sum(x, -y),
                        "mul" => exact(x * y),
                        _ => sum(x * y, z),
                    };
                    if is_zero(e) {
                        continue;
                    }
                    for (mi, mode) in MODES.into_iter().enumerate() {
                        let got = out[(i * ops.len() + oi) * 4 + mi];
                        let got = if what == "packed" {
                            got >> (16 * lane) & 0xffff
                        } else {
                            got
                        };
                        let want = table.round(e, mode) as u64;
                        assert_eq!(
                            got,
                            want,
                            "{what} {scalar}: {op}.{} {x:e} {y:e} {z:e}",
                            mode.name()
                        );
                    }
                }
            }
        };
        let f = rounding_kernel(scalar, &ops);
        for lane in 0..2 {
            let pick = |v: &[u64]| v.iter().skip(lane).step_by(2).copied().collect::<Vec<_>>();
            let out = run_rounding(&f, 2, &pick(&a), &pick(&b), &pick(&c), ops.len());
            // Scalar results for element i come from inputs 2i + lane.
            check(&out, "scalar", lane);
        }
        let f = rounding_kernel(packed, &ops);
        let pack = |v: &[u64]| v.chunks(2).map(|p| p[0] | p[1] << 16).collect::<Vec<_>>();
        let out = run_rounding(&f, 4, &pack(&a), &pack(&b), &pack(&c), ops.len());
        for lane in 0..2 {
            check(&out, "packed", lane);
        }
    }
}

/// `out[i] = cvt.rnd.to.from(in[i])` for each rounding direction.
fn cvt_kernel(from: Scalar, to: Scalar, sat: bool, rounds: bool) -> Function {
    let mut k = Builder::new("cvt", 64);
    let inp = k.param("in", fptr(from));
    let out = k.param("out", fptr(to));
    let i = k.global_id_x();
    let p = k.ptr_add(inp, i);
    let x = k.load(Type::Scalar(from), p);
    let four = k.const_u32(4);
    let base = k.mul(i, four);
    for (mi, rnd) in MODES.into_iter().enumerate() {
        let y = k.cvt_rnd(to, rounds.then_some(rnd), sat, x);
        let off = k.const_u32(mi as u32);
        let at = k.add(base, off);
        let q = k.ptr_add(out, at);
        k.store(q, y);
    }
    k.finish().expect("verifies")
}

fn run_cvt(f: &Function, in_bytes: usize, out_bytes: usize, input: &[u64]) -> Vec<u64> {
    let n = input.len();
    let mut dev = Device::new();
    let ip = upload(
        &mut dev,
        &input
            .iter()
            .flat_map(|x| x.to_le_bytes()[..in_bytes].to_vec())
            .collect::<Vec<_>>(),
    );
    let op = output(&mut dev, n * 4 * out_bytes);
    launch(f, &cfg(n as u32 / 64, 64), &[ip, op], &mut dev).expect("runs");
    download(&dev, op, n * 4 * out_bytes)
        .chunks(out_bytes)
        .map(|ch| {
            let mut w = [0u8; 8];
            w[..out_bytes].copy_from_slice(ch);
            u64::from_le_bytes(w)
        })
        .collect()
}

#[test]
fn float_narrowing_conversions_round_in_every_direction() {
    let mut rng = rng();
    // f32 → f16 / bf16, over ranges that overflow and underflow the target.
    for (to, is_f16, emax) in [(Scalar::F16, true, 30), (Scalar::BF16, false, 127)] {
        let table = Table::new(is_f16);
        let input: Vec<f32> = (0..256).map(|_| rand_f32(&mut rng, emax)).collect();
        let f = cvt_kernel(Scalar::F32, to, false, true);
        let out = run_cvt(
            &f,
            4,
            2,
            &input.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>(),
        );
        for (i, x) in input.iter().enumerate() {
            if *x == 0.0 {
                continue;
            }
            for (mi, mode) in MODES.into_iter().enumerate() {
                assert_eq!(
                    out[i * 4 + mi],
                    table.round(exact(*x as f64), mode) as u64,
                    "cvt.{}.{to}.f32 {x:e}",
                    mode.name()
                );
            }
        }
    }
    // f64 → f32.
    let input: Vec<f64> = (0..256)
        .map(|_| {
            (1.0 + rng.gen::<f64>())
                * 2f64.powi(rng.gen_range(-160..=130))
                * if rng.gen() { 1.0 } else { -1.0 }
        })
        .collect();
    let f = cvt_kernel(Scalar::F64, Scalar::F32, false, true);
    let out = run_cvt(
        &f,
        8,
        4,
        &input.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
    );
    for (i, x) in input.iter().enumerate() {
        for (mi, mode) in MODES.into_iter().enumerate() {
            assert_eq!(
                out[i * 4 + mi] as u32,
                round_f32(exact(*x), mode).to_bits(),
                "cvt.{}.f32.f64 {x:e}",
                mode.name()
            );
        }
    }
}

#[test]
fn integer_to_float_conversions_round_in_every_direction() {
    let mut rng = rng();
    let input: Vec<i64> = (0..256)
        .map(|_| rng.gen::<i64>() >> rng.gen_range(0..63))
        .collect();
    let f = cvt_kernel(Scalar::I64, Scalar::F32, false, true);
    let out = run_cvt(
        &f,
        8,
        4,
        &input.iter().map(|&x| x as u64).collect::<Vec<_>>(),
    );
    for (i, &x) in input.iter().enumerate() {
        let r = x as f64;
        let e = Exact {
            r,
            tail: (x as i128 - r as i128).signum() as i8,
        };
        for (mi, mode) in MODES.into_iter().enumerate() {
            assert_eq!(
                out[i * 4 + mi] as u32,
                round_f32(e, mode).to_bits(),
                "cvt.{}.f32.s64 {x}",
                mode.name()
            );
        }
    }
    let table = Table::new(true);
    let input: Vec<u32> = (0..256)
        .map(|_| rng.gen::<u32>() >> rng.gen_range(0..32))
        .collect();
    let f = cvt_kernel(Scalar::U32, Scalar::F16, false, true);
    let out = run_cvt(
        &f,
        4,
        2,
        &input.iter().map(|&x| x as u64).collect::<Vec<_>>(),
    );
    for (i, &x) in input.iter().enumerate() {
        for (mi, mode) in MODES.into_iter().enumerate() {
            let want = if x == 0 {
                0
            } else {
                table.round(exact(x as f64), mode)
            };
            assert_eq!(
                out[i * 4 + mi],
                want as u64,
                "cvt.{}.f16.u32 {x}",
                mode.name()
            );
        }
    }
}

/// Float → int rounds in the given direction and saturates; NaN gives 0 (top bit only
/// for 64-bit destinations).
#[test]
fn float_to_integer_conversions_saturate() {
    let mut rng = rng();
    let mut input: Vec<f32> = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.5,
        0.5,
        1.5,
        2.5,
        -2.5,
        3e9,
        -3e9,
        4.3e9,
        1e20,
    ];
    while input.len() < 128 {
        input.push(rand_f32(&mut rng, 40));
    }
    let bits: Vec<u64> = input.iter().map(|x| x.to_bits() as u64).collect();
    let spot: [(f32, [i64; 4]); 4] = [
        (2.5, [2, 2, 2, 3]),
        (-2.5, [-2, -2, -3, -2]),
        (-0.5, [0, 0, -1, 0]),
        (1.5, [2, 1, 1, 2]),
    ];
    for (to, lo, hi) in [
        (Scalar::I32, i32::MIN as i64, i32::MAX as i64),
        (Scalar::U32, 0, u32::MAX as i64),
        (Scalar::I8, -128, 127),
        (Scalar::U64, 0, i64::MAX),
    ] {
        let f = cvt_kernel(Scalar::F32, to, false, true);
        let out = run_cvt(&f, 4, to.bytes() as usize, &bits);
        for (i, x) in input.iter().enumerate() {
            for (mi, mode) in MODES.into_iter().enumerate() {
                let d = *x as f64;
                let r = match mode {
                    Round::Rn => d.round_ties_even(),
                    Round::Rz => d.trunc(),
                    Round::Rm => d.floor(),
                    Round::Rp => d.ceil(),
                };
                let want = if x.is_nan() {
                    // PTX: 0, but the top bit alone for 64-bit destinations.
                    if to.bits() == 64 {
                        1u64 << 63
                    } else {
                        0
                    }
                } else if to == Scalar::U64 && r >= 2f64.powi(64) {
                    u64::MAX
                } else if to == Scalar::U64 && r > 0.0 {
                    r as u64
                } else {
                    (r.clamp(lo as f64, hi as f64) as i64) as u64
                        & ((1u128 << to.bits()) - 1) as u64
                };
                assert_eq!(out[i * 4 + mi], want, "cvt.{}i.{to}.f32 {x:e}", mode.name());
            }
        }
        if to == Scalar::I32 {
            for (x, want) in spot {
                let i = input
                    .iter()
                    .position(|y| *y == x)
                    .expect("spot value present");
                let got: Vec<i64> = (0..4)
                    .map(|m| out[i * 4 + m] as u32 as i32 as i64)
                    .collect();
                assert_eq!(got, want, "{x} in rn, rz, rm, rp");
            }
        }
    }
}

/// Integer conversions truncate or extend by the source's signedness, or clamp with
/// `.sat`; `.sat` on floats clamps to [0, 1] with NaN giving +0; widening is exact.
#[test]
fn saturating_and_exact_conversions() {
    let run = |from: Scalar, to: Scalar, sat: bool, rounds: bool, x: u64| -> Vec<u64> {
        let f = cvt_kernel(from, to, sat, rounds);
        let mut v = vec![x; 64];
        v[1] = 0;
        run_cvt(&f, from.bytes() as usize, to.bytes() as usize, &v)[..4].to_vec()
    };
    let one = |v: Vec<u64>| {
        assert!(
            v.iter().all(|x| *x == v[0]),
            "exact conversions do not depend on the direction: {v:?}"
        );
        v[0]
    };
    assert_eq!(
        one(run(
            Scalar::I32,
            Scalar::I8,
            true,
            false,
            -300i32 as u32 as u64
        )),
        0x80
    );
    assert_eq!(
        one(run(
            Scalar::I32,
            Scalar::I8,
            false,
            false,
            -300i32 as u32 as u64
        )),
        (-300i32 as u32 & 0xff) as u64
    );
    assert_eq!(
        one(run(
            Scalar::I32,
            Scalar::U16,
            true,
            false,
            -5i32 as u32 as u64
        )),
        0
    );
    assert_eq!(
        one(run(Scalar::U32, Scalar::I16, true, false, 70000)),
        0x7fff
    );
    assert_eq!(
        one(run(Scalar::I8, Scalar::I32, false, false, 0xfb)),
        0xffff_fffb
    );
    assert_eq!(one(run(Scalar::U8, Scalar::I32, false, false, 0xfb)), 0xfb);
    assert_eq!(
        one(run(Scalar::I16, Scalar::U64, false, false, 0x8000)),
        0xffff_ffff_ffff_8000
    );
    let f32b = |x: f32| x.to_bits() as u64;
    assert_eq!(
        one(run(Scalar::F32, Scalar::F64, false, false, f32b(0.1))),
        (0.1f32 as f64).to_bits()
    );
    assert_eq!(
        one(run(Scalar::F16, Scalar::F32, false, false, 0x0001)),
        f32b(2f32.powi(-24)),
        "f16 subnormal widens exactly"
    );
    assert_eq!(
        one(run(
            Scalar::F64,
            Scalar::I32,
            false,
            true,
            f64::NAN.to_bits()
        )),
        0x8000_0000,
        "NaN from f64"
    );
    for (x, want) in [
        (1.5f32, 1.0f32),
        (-0.25, 0.0),
        (0.25, 0.25),
        (f32::NAN, 0.0),
        (-0.0, 0.0),
        (f32::INFINITY, 1.0),
    ] {
        assert_eq!(
            one(run(Scalar::F32, Scalar::F32, true, false, f32b(x))),
            f32b(want),
            "cvt.sat.f32.f32 {x}"
        );
    }
}

fn bin_kernel(s: Scalar, ops: &[BinOp]) -> Function {
    let ty = Type::Scalar(s);
    let mut k = Builder::new("bin", 64);
    let (pa, pb) = (k.param("a", fptr(s)), k.param("b", fptr(Scalar::U32)));
    let out = k.param("out", fptr(s));
    let i = k.global_id_x();
    let qa = k.ptr_add(pa, i);
    let a = k.load(ty, qa);
    let qb = k.ptr_add(pb, i);
    let amount = k.load(Type::U32, qb);
    let b = if s == Scalar::U32 {
        amount
    } else {
        k.bitcast(ty, amount)
    };
    let n = k.const_u32(ops.len() as u32);
    let base = k.mul(i, n);
    for (oi, op) in ops.iter().enumerate() {
        let v = k.bin(
            *op,
            a,
            if matches!(op, BinOp::Shl | BinOp::Shr) {
                amount
            } else {
                b
            },
        );
        let off = k.const_u32(oi as u32);
        let at = k.add(base, off);
        let q = k.ptr_add(out, at);
        k.store(q, v);
    }
    k.finish().expect("verifies")
}

/// Integer arithmetic wraps; division and remainder by zero give all ones (as on the
/// H200); MIN / -1 wraps; shift amounts past the width give 0 or the sign.
#[test]
fn integer_semantics() {
    use BinOp::*;
    let mut rng = rng();
    let ops = [
        Add, Sub, Mul, MulHi, Div, Rem, Min, Max, And, Or, Xor, Shl, Shr,
    ];
    for s in [Scalar::U32, Scalar::I32] {
        let f = bin_kernel(s, &ops);
        let mut a: Vec<u32> = (0..128).map(|_| rng.gen()).collect();
        let mut b: Vec<u32> = (0..128)
            .map(|_| {
                if rng.gen() {
                    rng.gen()
                } else {
                    rng.gen_range(0..40)
                }
            })
            .collect();
        (a[0], b[0], a[1], b[1], a[2], b[2]) = (7, 0, 0x8000_0000, u32::MAX, 12, 32);
        let mut dev = Device::new();
        let (pa, pb) = (upload_u32(&mut dev, &a), upload_u32(&mut dev, &b));
        let po = output(&mut dev, 4 * 128 * ops.len());
        launch(&f, &cfg(2, 64), &[pa, pb, po], &mut dev).expect("runs");
        let out = download_u32(&dev, po, 128 * ops.len());
        for i in 0..128 {
            let (x, y) = (a[i], b[i]);
            let signed = s == Scalar::I32;
            let (xi, yi) = (x as i32, y as i32);
            let want: Vec<u32> = ops
                .iter()
                .map(|op| match op {
                    Add => x.wrapping_add(y),
                    Sub => x.wrapping_sub(y),
                    Mul => x.wrapping_mul(y),
                    MulHi if signed => ((xi as i64 * yi as i64) >> 32) as u32,
                    MulHi => ((x as u64 * y as u64) >> 32) as u32,
                    Div if y == 0 => u32::MAX,
                    Rem if y == 0 => u32::MAX,
                    Div if signed => xi.wrapping_div(yi) as u32,
                    Rem if signed => xi.wrapping_rem(yi) as u32,
                    Div => x / y,
                    Rem => x % y,
                    Min if signed => xi.min(yi) as u32,
                    Max if signed => xi.max(yi) as u32,
                    Min => x.min(y),
                    Max => x.max(y),
                    And => x & y,
                    Or => x | y,
                    Xor => x ^ y,
                    Shl => x.checked_shl(y).unwrap_or(0),
                    Shr if signed => (xi >> y.min(31)) as u32,
                    Shr => x.checked_shr(y).unwrap_or(0),
                })
                .collect();
            assert_eq!(
                out[i * ops.len()..][..ops.len()],
                want[..],
                "{s} a={x:#x} b={y:#x} ({ops:?})"
            );
        }
    }
}

/// popc, clz, neg, abs and not on 32- and 64-bit integers.
#[test]
fn integer_unary_operations() {
    let mut rng = rng();
    let ops = [UnOp::Popc, UnOp::Clz, UnOp::Neg, UnOp::Abs, UnOp::Not];
    let mut k = Builder::new("un", 64);
    let pa = k.param("a", fptr(Scalar::I64));
    let out = k.param("out", fptr(Scalar::U64));
    let i = k.global_id_x();
    let q = k.ptr_add(pa, i);
    let a = k.load(Type::Scalar(Scalar::I64), q);
    let a32 = k.cvt(Scalar::I32, a);
    let n = k.const_u32(2 * ops.len() as u32);
    let base = k.mul(i, n);
    for (j, x) in [a, a32].into_iter().enumerate() {
        for (oi, op) in ops.iter().enumerate() {
            let v = k.un(*op, x);
            let v = k.cvt(Scalar::U64, v);
            let off = k.const_u32((j * ops.len() + oi) as u32);
            let at = k.add(base, off);
            let p = k.ptr_add(out, at);
            k.store(p, v);
        }
    }
    let f = k.finish().expect("verifies");
    let mut a: Vec<i64> = (0..64)
        .map(|_| rng.gen::<i64>() >> rng.gen_range(0..64))
        .collect();
    (a[0], a[1], a[2]) = (0, i64::MIN, i32::MIN as i64);
    let mut dev = Device::new();
    let (pa, po) = (
        upload_u64(&mut dev, &a.iter().map(|&x| x as u64).collect::<Vec<_>>()),
        output(&mut dev, 8 * 64 * 2 * ops.len()),
    );
    launch(&f, &cfg(1, 64), &[pa, po], &mut dev).expect("runs");
    let out = download_u64(&dev, po, 64 * 2 * ops.len());
    for (i, &x) in a.iter().enumerate() {
        let y = x as i32;
        // Results are converted to u64 from their own type: u32 zero-extends, i64/i32 sign-extend.
        let want = [
            x.count_ones() as u64,
            x.leading_zeros() as u64,
            x.wrapping_neg() as u64,
            x.wrapping_abs() as u64,
            !x as u64,
            y.count_ones() as u64,
            y.leading_zeros() as u64,
            y.wrapping_neg() as i64 as u64,
            y.wrapping_abs() as i64 as u64,
            !y as i64 as u64,
        ];
        assert_eq!(out[i * 10..][..10], want, "{x:#x}");
    }
}

/// PTX min/max: a NaN operand yields the other one, two NaNs the canonical NaN, and
/// -0 is below +0.
#[test]
fn float_min_max() {
    let cases = [
        (1.0f32, 2.0f32, 1.0f32, 2.0f32),
        (f32::NAN, 3.0, 3.0, 3.0),
        (-3.0, f32::NAN, -3.0, -3.0),
        (-0.0, 0.0, -0.0, 0.0),
        (0.0, -0.0, -0.0, 0.0),
        (
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::INFINITY,
        ),
    ];
    let f = bin_kernel(Scalar::F32, &[BinOp::Min, BinOp::Max]);
    let mut a: Vec<u32> = cases.iter().map(|c| c.0.to_bits()).collect();
    let mut b: Vec<u32> = cases.iter().map(|c| c.1.to_bits()).collect();
    a.push(f32::NAN.to_bits() | 5);
    b.push((-f32::NAN).to_bits());
    a.resize(64, 0);
    b.resize(64, 0);
    let mut dev = Device::new();
    let (pa, pb, po) = (
        upload_u32(&mut dev, &a),
        upload_u32(&mut dev, &b),
        output(&mut dev, 4 * 128),
    );
    launch(&f, &cfg(1, 64), &[pa, pb, po], &mut dev).expect("runs");
    let out = download_u32(&dev, po, 128);
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(
            (out[2 * i], out[2 * i + 1]),
            (c.2.to_bits(), c.3.to_bits()),
            "min/max of {} and {}",
            c.0,
            c.1
        );
    }
    let i = cases.len();
    assert_eq!(
        (out[2 * i], out[2 * i + 1]),
        (0x7fff_ffff, 0x7fff_ffff),
        "two NaNs give the canonical NaN"
    );
}

/// Approximate operations are the f32 rounding of the exact function, ex2/lg2 flush
/// subnormals, and the launch reports which approximations ran.
#[test]
fn approximate_operations_are_modeled_and_reported() {
    let ops = [
        UnOp::Ex2Approx,
        UnOp::Lg2Approx,
        UnOp::RcpApprox,
        UnOp::RsqrtApprox,
        UnOp::TanhApprox,
        UnOp::SinApprox,
        UnOp::CosApprox,
    ];
    let mut k = Builder::new("approx", 64);
    let pa = k.param("a", fptr(Scalar::F32));
    let out = k.param("out", fptr(Scalar::F32));
    let i = k.global_id_x();
    let q = k.ptr_add(pa, i);
    let a = k.load(Type::F32, q);
    let n = k.const_u32(ops.len() as u32 + 1);
    let base = k.mul(i, n);
    let store = |k: &mut Builder, j: usize, v: Value| {
        let off = k.const_u32(j as u32);
        let at = k.add(base, off);
        let p = k.ptr_add(out, at);
        k.store(p, v);
    };
    for (j, op) in ops.iter().enumerate() {
        let v = k.un(*op, a);
        store(&mut k, j, v);
    }
    let three = k.const_f32(3.0);
    let d = k.div_approx(a, three);
    store(&mut k, ops.len(), d);
    let f = k.finish().expect("verifies");

    let sub = f32::from_bits(0x0000_1234);
    let input = [0.7f32, 3.25, -130.0, sub, -sub, 1e-30, 20.0, 0.0];
    let mut a = input.to_vec();
    a.resize(64, 1.0);
    let mut dev = Device::new();
    let (pa, po) = (
        upload_u32(&mut dev, &a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
        output(&mut dev, 4 * 64 * (ops.len() + 1)),
    );
    let stats = launch(&f, &cfg(1, 64), &[pa, po], &mut dev).expect("runs");
    assert_eq!(stats.approx_ops_used, ops.to_vec());
    assert!(stats.approx_div_used && !stats.all_exact());
    let out: Vec<f32> = download_u32(&dev, po, 64 * (ops.len() + 1))
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let w = ops.len() + 1;
    for (i, &x) in input.iter().enumerate() {
        let d = x as f64;
        let ftz = |v: f64| if (v as f32).is_subnormal() { 0.0 } else { v };
        let want = [
            ftz(ftz(d).exp2()),
            ftz(d).log2(),
            1.0 / d,
            1.0 / d.sqrt(),
            d.tanh(),
            d.sin(),
            d.cos(),
            d / 3.0,
        ];
        for (j, v) in want.iter().enumerate() {
            let got = out[i * w + j];
            let v = *v as f32;
            assert!(
                got.to_bits() == v.to_bits() || (got.is_nan() && v.is_nan()),
                "op {j} of {x:e}: got {got:e}, want {v:e}"
            );
        }
    }
    assert_eq!(out[3 * w], 1.0, "ex2 of a subnormal is ex2(0)");
    assert_eq!(out[2 * w], 0.0, "ex2(-130) is subnormal, flushed");
    assert_eq!(
        out[3 * w + 1],
        f32::NEG_INFINITY,
        "lg2 of a subnormal is lg2(0)"
    );
}

/// NaN results have the bit patterns an H200 produced for the same operations (see
/// the interpreter's `nan` module): canonical for f32/f16/bf16 arithmetic, propagated
/// payloads for f64 and for conversions to or from f64.
#[test]
fn nan_results_follow_the_h200() {
    let mut k = Builder::new("nans", 32);
    let pf = k.param("f", fptr(Scalar::F32));
    let pd = k.param("d", fptr(Scalar::F64));
    let ph = k.param("h", fptr(Scalar::U16));
    let out = k.param("out", fptr(Scalar::U64));
    let load = |k: &mut Builder, p: Value, i: u32, ty: Type| {
        let i = k.const_u32(i);
        let q = k.ptr_add(p, i);
        k.load(ty, q)
    };
    let f: Vec<Value> = (0..4).map(|i| load(&mut k, pf, i, Type::F32)).collect();
    let d: Vec<Value> = (0..6)
        .map(|i| load(&mut k, pd, i, Type::Scalar(Scalar::F64)))
        .collect();
    let h16: Vec<Value> = (0..4)
        .map(|i| load(&mut k, ph, i, Type::Scalar(Scalar::U16)))
        .collect();
    let half = |k: &mut Builder, i: usize, s: Scalar| k.bitcast(Type::Scalar(s), h16[i]);
    let (na, nb, s32, one) = (f[0], f[1], f[2], f[3]);
    let (qa, qb, s64, one_d, inf_d, ns) = (d[0], d[1], d[2], d[3], d[4], d[5]);
    let rn = Some(Round::Rn);
    let mut results = vec![
        // f32
        k.neg(nb),
        k.abs(nb),
        k.bin_rnd(BinOp::Add, rn, na, one),
        k.min(na, nb),
        k.cvt(Scalar::F64, nb),
        k.cvt(Scalar::F64, s32),
        k.cvt_rnd(Scalar::F16, rn, false, nb),
        k.cvt_rnd(Scalar::BF16, rn, false, nb),
        // f64
        k.bin_rnd(BinOp::Sub, rn, inf_d, inf_d),
    ];
    let zero_d = k.const_f64(0.0);
    results.push(k.bin_rnd(BinOp::Mul, rn, zero_d, inf_d));
    results.push(k.bin_rnd(BinOp::Add, rn, qa, qb));
    results.push(k.bin_rnd(BinOp::Add, rn, qb, qa));
    results.push(k.neg(qb));
    results.push(k.neg(s64));
    results.push(k.abs(qb));
    results.push(k.emit(
        Type::Scalar(Scalar::F64),
        Op::Fma {
            rnd: Round::Rn,
            a: qa,
            b: one_d,
            c: qb,
        },
    ));
    results.push(k.emit(
        Type::Scalar(Scalar::F64),
        Op::Fma {
            rnd: Round::Rn,
            a: one_d,
            b: qb,
            c: qa,
        },
    ));
    results.push(k.min(qa, qb));
    results.push(k.min(qb, qa));
    results.push(k.max(s64, one_d));
    results.push(k.bin_rnd(BinOp::Mul, rn, s64, one_d));
    results.push(k.cvt_rnd(Scalar::F32, rn, false, ns));
    let n = k.const_f64(f64::from_bits(0x7ff8_1234_5678_9abc));
    results.push(k.cvt_rnd(Scalar::F16, rn, false, n));
    results.push(k.cvt_rnd(Scalar::BF16, rn, false, qa));
    let minus_one = k.neg(one_d);
    results.push(k.un(UnOp::Sqrt(Round::Rn), minus_one));
    results.push(k.bin_rnd(BinOp::Div, rn, zero_d, zero_d));
    // f16 and bf16
    let nh = half(&mut k, 0, Scalar::F16);
    let oh = half(&mut k, 1, Scalar::F16);
    results.push(k.neg(nh));
    results.push(k.bin_rnd(BinOp::Add, rn, nh, oh));
    results.push(k.cvt(Scalar::F32, nh));
    results.push(k.cvt(Scalar::F64, nh));
    let (ba, bb) = (half(&mut k, 2, Scalar::BF16), half(&mut k, 3, Scalar::BF16));
    results.push(k.cvt(Scalar::F32, ba));
    results.push(k.neg(ba));
    results.push(k.min(ba, bb));
    for (i, v) in results.iter().enumerate() {
        let bits = match k.ty(*v).scalar().map(|s| s.bits()) {
            Some(64) => k.bitcast(Type::U64, *v),
            Some(32) => k.bitcast(Type::U32, *v),
            _ => k.bitcast(Type::Scalar(Scalar::U16), *v),
        };
        let wide = if k.ty(bits) == Type::U64 {
            bits
        } else {
            k.cvt(Scalar::U64, bits)
        };
        let at = k.const_u32(i as u32);
        let q = k.ptr_add(out, at);
        k.store(q, wide);
    }
    let f = k.finish().expect("verifies");

    let (qa, qb) = (0x7ff8_0000_0000_0111u64, 0xfff8_0000_0000_0222u64);
    let want: [u64; 33] = [
        0x7fff_ffff,
        0x7fff_ffff,
        0x7fff_ffff,
        0x7fff_ffff,
        0xfff8_a864_2000_0000,
        0x7ff8_0000_2000_0000,
        0x7fff,
        0x7fff,
        0xfff8_0000_0000_0000,
        0xfff8_0000_0000_0000,
        qb,
        qb,
        qb,
        0x7ff8_0000_0000_0333,
        qb,
        qb,
        qa,
        qb,
        qb,
        1f64.to_bits(),
        0x7ff8_0000_0000_0333,
        0xffc0_0000,
        0x7e04,
        0x7fc0,
        0xfff8_0000_0000_0000,
        0xfff8_0000_0000_0000,
        0x7fff,
        0x7fff,
        0x7fff_ffff,
        0x7ff8_4800_0000_0000,
        0x7fc1_0000,
        0x7fff,
        0x7fff,
    ];
    assert_eq!(results.len(), want.len());
    let mut dev = Device::new();
    let pf = upload_u32(
        &mut dev,
        &[0x7fc1_2345, 0xffc5_4321, 0x7f80_0001, 1f32.to_bits()],
    );
    let ds = [
        qa,
        qb,
        0x7ff0_0000_0000_0333,
        1f64.to_bits(),
        f64::INFINITY.to_bits(),
        0xfff0_0000_0000_0abc,
    ];
    let pd = upload_u64(&mut dev, &ds);
    let ph = upload_u16(&mut dev, &[0x7e12, 0x3c00, 0x7fc1, 0xffc3]);
    let po = output(&mut dev, 8 * want.len());
    launch(&f, &cfg(1, 32), &[pf, pd, ph, po], &mut dev).expect("runs");
    let got = download_u64(&dev, po, want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(*g, w, "case {i}: got {g:#x}, the H200 gave {w:#x}");
    }
}
