//! Interpreter: `mma.sync` and `ldmatrix` through fragment layout tables.
//!
//! Two tables are used: one generated here from the PTX ISA manual's fragment figures
//! (never written to disk; the interpreter's own table is the one measured on the GPU),
//! so the test places data with formulas independent of any table file; and the
//! measured table that `launch` embeds, through its public slots.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, launch_with_layout, Device, InterpError, MmaLayout, Slot};
use quench_ir::{frag, AddrSpace, Builder, FragRole, Function, MmaShape, Scalar, Type};
use rand::Rng;
use serde_json::json;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);

/// Fragment coordinates from the PTX ISA figures: (row, col) of sub-element `sub` of
/// register `reg` of `lane`.
fn isa_figure(s8: bool, role: &str, lane: u32, reg: u32, sub: u32) -> (u32, u32) {
    let (g, t) = (lane / 4, lane % 4);
    match (s8, role) {
        (_, "c" | "d") => (g + 8 * (reg / 2), t * 2 + reg % 2),
        (false, "a") => (g + 8 * (reg % 2), t * 2 + sub + 8 * (reg / 2)),
        (false, _) => (t * 2 + sub + 8 * reg, g),
        (true, "a") => (g + 8 * (reg % 2), t * 4 + sub + 16 * (reg / 2)),
        (true, _) => (t * 4 + sub + 16 * reg, g),
    }
}

/// `ldmatrix` from the PTX ISA figure: which lane's row and which column land in
/// sub-element `sub` of register `reg` of `lane`.
fn isa_ldmatrix(trans: bool, lane: u32, reg: u32, sub: u32) -> (u32, u32) {
    if trans {
        (8 * reg + (lane % 4) * 2 + sub, lane / 4)
    } else {
        (8 * reg + lane / 4, (lane % 4) * 2 + sub)
    }
}

/// Registers and sub-elements per lane of each operand.
fn shape_of(s8: bool, role: &str) -> (u32, u32) {
    match role {
        "a" => (4, if s8 { 4 } else { 2 }),
        "b" => (2, if s8 { 4 } else { 2 }),
        _ => (4, 1),
    }
}

fn isa_layout_json() -> String {
    let mut mma = serde_json::Map::new();
    for (key, s8) in [
        ("m16n8k16.bf16", false),
        ("m16n8k16.f16", false),
        ("m16n8k32.s8", true),
    ] {
        let mut ops = serde_json::Map::new();
        for role in ["a", "b", "c", "d"] {
            let (regs, subs) = shape_of(s8, role);
            let mut entries = vec![];
            for lane in 0..32 {
                for reg in 0..regs {
                    for sub in 0..subs {
                        let (r, c) = isa_figure(s8, role, lane, reg, sub);
                        entries.push(json!([lane, reg, sub, r, c]));
                    }
                }
            }
            ops.insert(role.into(), entries.into());
        }
        mma.insert(key.into(), ops.into());
    }
    let mut ld = serde_json::Map::new();
    for num in [1u32, 2, 4] {
        for trans in [false, true] {
            let mut entries = vec![];
            for lane in 0..32 {
                for reg in 0..num {
                    for sub in 0..2 {
                        let (src, col) = isa_ldmatrix(trans, lane, reg, sub);
                        entries.push(json!([lane, reg, sub, src, col]));
                    }
                }
            }
            ld.insert(
                format!("x{num}{}", if trans { ".trans" } else { "" }),
                entries.into(),
            );
        }
    }
    json!({"format": "quench.sm90.mma-layout.v1", "mma": mma, "ldmatrix": ld}).to_string()
}

/// Load each lane's A, B and C registers, run one `mma`, store D's registers.
fn mma_kernel(shape: MmaShape, elem: Scalar) -> Function {
    let s8 = elem == Scalar::I8;
    let acc = if s8 { Scalar::I32 } else { Scalar::F32 };
    let mut k = Builder::new("mma", 32);
    let ps = [k.param("a", PU32), k.param("b", PU32), k.param("c", PU32)];
    let d = k.param("d", PU32);
    let lane = k.lane_id();
    let roles = [(FragRole::A, elem), (FragRole::B, elem), (FragRole::C, acc)];
    let mut frags = vec![];
    for (p, (role, e)) in ps.into_iter().zip(roles) {
        let ty = frag(shape, role, e);
        let Type::Frag(ft) = ty else { unreachable!() };
        let n = k.const_u32(ft.regs());
        let base = k.mul(lane, n);
        let mut parts = vec![];
        for r in 0..ft.regs() {
            let off = k.const_u32(r);
            let i = k.add(base, off);
            let q = k.ptr_add(p, i);
            let x = k.load(Type::U32, q);
            let x = if ft.reg_type() == Scalar::U32 {
                x
            } else {
                k.bitcast(Type::Scalar(ft.reg_type()), x)
            };
            parts.push(x);
        }
        frags.push(k.pack(ty, &parts));
    }
    let out = k.mma(shape, frags[0], frags[1], frags[2]);
    let four = k.const_u32(4);
    let base = k.mul(lane, four);
    for r in 0..4 {
        let x = k.extract(out, r);
        let x = k.bitcast(Type::U32, x);
        let off = k.const_u32(r);
        let i = k.add(base, off);
        let q = k.ptr_add(d, i);
        k.store(q, x);
    }
    k.finish().expect("verifies")
}

/// Matrices placed into per-lane registers by a slot function, D read back by it.
struct MmaCase {
    a: Vec<u32>,
    b: Vec<u32>,
    c: Vec<u32>,
    want: Vec<u32>,
}

/// Random A (m×k), B (k×n), C (m×n); registers filled through `slot(role, lane,
/// reg, sub) -> (row, col)`; expected D = A·B + C in the documented model.
/// Where a fragment slot's element sits: `(role, lane, reg, sub) -> (row, col)`.
type SlotFn<'a> = &'a dyn Fn(&str, u32, u32, u32) -> (u32, u32);

fn mma_case(rng: &mut rand_chacha::ChaCha8Rng, elem: Scalar, slot: SlotFn) -> MmaCase {
    let s8 = elem == Scalar::I8;
    let (m, n, k) = if s8 { (16, 8, 32) } else { (16, 8, 16) };
    let half = |rng: &mut rand_chacha::ChaCha8Rng| -> (u32, f64) {
        let x: f32 = rng.gen_range(-4.0..4.0);
        if elem == Scalar::BF16 {
            let h = half::bf16::from_f32(x);
            (h.to_bits() as u32, h.to_f64())
        } else {
            let h = half::f16::from_f32(x);
            (h.to_bits() as u32, h.to_f64())
        }
    };
    let elem_of = |rng: &mut rand_chacha::ChaCha8Rng| -> (u32, f64) {
        if s8 {
            let v: i8 = rng.gen();
            (v as u8 as u32, v as f64)
        } else {
            half(rng)
        }
    };
    let am: Vec<(u32, f64)> = (0..m * k).map(|_| elem_of(rng)).collect();
    let bm: Vec<(u32, f64)> = (0..k * n).map(|_| elem_of(rng)).collect();
    let cm: Vec<u32> = (0..m * n)
        .map(|_| {
            if s8 {
                rng.gen::<i32>() as u32
            } else {
                rng.gen_range(-100.0f32..100.0).to_bits()
            }
        })
        .collect();
    let sub_bits = if s8 { 8 } else { 16 };
    let regs = |role: &str, mat: &dyn Fn(u32, u32) -> u32| -> Vec<u32> {
        let (nregs, subs) = shape_of(s8, role);
        let mut v = vec![0u32; 32 * nregs as usize];
        for lane in 0..32 {
            for reg in 0..nregs {
                for sub in 0..subs {
                    let (r, c) = slot(role, lane, reg, sub);
                    let bits = if subs == 1 { 32 } else { sub_bits };
                    v[(lane * nregs + reg) as usize] |= mat(r, c) << (bits * sub);
                }
            }
        }
        v
    };
    let a = regs("a", &|r, c| am[(r * k + c) as usize].0);
    let b = regs("b", &|r, c| bm[(r * n + c) as usize].0);
    let c = regs("c", &|r, c| cm[(r * n + c) as usize]);
    let d: Vec<u32> = (0..m * n)
        .map(|i| {
            let (row, col) = (i / n, i % n);
            if s8 {
                (0..k).fold(cm[i as usize] as i32, |s, j| {
                    s.wrapping_add(
                        am[(row * k + j) as usize].1 as i32 * bm[(j * n + col) as usize].1 as i32,
                    )
                }) as u32
            } else {
                let s: f64 = (0..k)
                    .map(|j| am[(row * k + j) as usize].1 * bm[(j * n + col) as usize].1)
                    .fold(0.0, |s, p| s + p);
                ((s + f32::from_bits(cm[i as usize]) as f64) as f32).to_bits()
            }
        })
        .collect();
    let want = regs("d", &|r, c| d[(r * n + c) as usize]);
    MmaCase { a, b, c, want }
}

/// Run an MMA case (with `layout`, or the measured table when `None`) and return D's
/// registers and whether the launch reported an approximate MMA.
fn run_mma(f: &Function, case: &MmaCase, layout: Option<&MmaLayout>) -> (Vec<u32>, bool) {
    let mut dev = Device::new();
    let (a, b, c) = (
        upload_u32(&mut dev, &case.a),
        upload_u32(&mut dev, &case.b),
        upload_u32(&mut dev, &case.c),
    );
    let d = output(&mut dev, 4 * 128);
    let stats = match layout {
        Some(l) => launch_with_layout(f, &cfg(1, 32), &[a, b, c, d], &mut dev, l),
        None => launch(f, &cfg(1, 32), &[a, b, c, d], &mut dev),
    }
    .expect("runs");
    (download_u32(&dev, d, 128), stats.approx_mma_used)
}

const ELEMS: [(MmaShape, Scalar); 3] = [
    (MmaShape::M16N8K16, Scalar::BF16),
    (MmaShape::M16N8K16, Scalar::F16),
    (MmaShape::M16N8K32, Scalar::I8),
];

/// With the PTX ISA layout: every D register of every lane matches A·B + C.
#[test]
fn mma_with_the_documented_layout() {
    let mut rng = rng();
    let layout = MmaLayout::from_json(&isa_layout_json()).expect("valid layout");
    for (shape, elem) in ELEMS {
        let f = mma_kernel(shape, elem);
        let s8 = elem == Scalar::I8;
        let case = mma_case(&mut rng, elem, &|role, lane, reg, sub| {
            isa_figure(s8, role, lane, reg, sub)
        });
        let (d, approx) = run_mma(&f, &case, Some(&layout));
        assert_eq!(d, case.want, "{shape:?} {elem}");
        assert_eq!(approx, !s8, "float mma is approximate, integer mma exact");
    }
}

fn slot_of(slots: &[Slot], lane: u32, reg: u32, sub: u32) -> (u32, u32) {
    let s = slots
        .iter()
        .find(|s| (s.lane, s.reg, s.sub) == (lane, reg, sub))
        .expect("slot in table");
    (s.row, s.col)
}

/// `launch` uses the measured table embedded from `isa/sm90/mma_layout.json`; until
/// it is measured, kernels with `mma` are refused by name.
#[test]
fn mma_with_the_measured_layout() {
    let mut rng = rng();
    let measured = match MmaLayout::measured() {
        Ok(l) => l,
        Err(InterpError::LayoutNotMeasured) => {
            let f = mma_kernel(MmaShape::M16N8K16, Scalar::BF16);
            let mut dev = Device::new();
            let err = launch(&f, &cfg(1, 32), &[0, 0, 0, 0], &mut dev).expect_err("refused");
            assert_eq!(err, InterpError::LayoutNotMeasured);
            return;
        }
        Err(e) => panic!("the committed layout table does not load: {e}"),
    };
    for (shape, elem) in ELEMS {
        let t = measured.mma(shape, elem).expect("table has the shape");
        let f = mma_kernel(shape, elem);
        let case = mma_case(&mut rng, elem, &|role, lane, reg, sub| {
            let slots = match role {
                "a" => &t.a,
                "b" => &t.b,
                "c" => &t.c,
                _ => &t.d,
            };
            slot_of(slots, lane, reg, sub)
        });
        assert_eq!(run_mma(&f, &case, None).0, case.want, "{shape:?} {elem}");
    }
}

/// Copy a 4-matrix tile to shared memory, point each lane at a row (in a shuffled
/// order), `ldmatrix`, store the registers.
fn ldmatrix_kernel(num: u8, trans: bool) -> Function {
    let mut k = Builder::new("ldmatrix", 32);
    let src = k.param("src", Type::Ptr(AddrSpace::Global, Scalar::U16));
    let rows = k.param("rows", PU32);
    let out = k.param("out", PU32);
    let s = k.shared_array("tile", Scalar::U16, 256, 16);
    let lane = k.lane_id();
    let eight = k.const_u32(8);
    let base = k.mul(lane, eight);
    for j in 0..8 {
        let off = k.const_u32(j);
        let i = k.add(base, off);
        let p = k.ptr_add(src, i);
        let x = k.load(Type::Scalar(Scalar::U16), p);
        let q = k.ptr_add(s, i);
        k.store(q, x);
    }
    k.barrier();
    let p = k.ptr_add(rows, lane);
    let row = k.load(Type::U32, p);
    let at = k.mul(row, eight);
    let addr = k.ptr_add(s, at);
    let ty = if num == 1 {
        Type::U32
    } else {
        Type::Vec(Scalar::U32, num)
    };
    let v = k.ldmatrix(ty, num, trans, addr);
    let n = k.const_u32(num as u32);
    let base = k.mul(lane, n);
    for r in 0..num as u32 {
        let x = if num == 1 { v } else { k.extract(v, r) };
        let off = k.const_u32(r);
        let i = k.add(base, off);
        let q = k.ptr_add(out, i);
        k.store(q, x);
    }
    k.finish().expect("verifies")
}

/// Every variant of `ldmatrix`, with the documented table and the measured one.
#[test]
fn ldmatrix_moves_rows_as_the_table_says() {
    let mut rng = rng();
    let documented = MmaLayout::from_json(&isa_layout_json()).expect("valid layout");
    let measured = MmaLayout::measured().ok();
    let tile: Vec<u16> = (0..256).map(|_| rng.gen()).collect();
    let mut rows: Vec<u32> = (0..32).collect();
    for i in (1..32).rev() {
        rows.swap(i, rng.gen_range(0..=i));
    }
    for num in [1u8, 2, 4] {
        for trans in [false, true] {
            let f = ldmatrix_kernel(num, trans);
            let mut layouts: Vec<(&str, &MmaLayout)> = vec![("documented", &documented)];
            if let Some(m) = measured {
                layouts.push(("measured", m));
            }
            for (name, layout) in layouts {
                let table = layout.ldmatrix(num, trans).expect("table has the variant");
                let mut dev = Device::new();
                let (sp, rp) = (upload_u16(&mut dev, &tile), upload_u32(&mut dev, &rows));
                let op = output(&mut dev, 4 * 32 * num as usize);
                launch_with_layout(&f, &cfg(1, 32), &[sp, rp, op], &mut dev, layout).expect("runs");
                let out = download_u32(&dev, op, 32 * num as usize);
                for lane in 0..32 {
                    for reg in 0..num as u32 {
                        let mut want = 0u32;
                        for sub in 0..2 {
                            let (src, col) = if name == "documented" {
                                isa_ldmatrix(trans, lane, reg, sub)
                            } else {
                                slot_of(table, lane, reg, sub)
                            };
                            want |= (tile[(rows[src as usize] * 8 + col) as usize] as u32)
                                << (16 * sub);
                        }
                        assert_eq!(
                            out[(lane * num as u32 + reg) as usize],
                            want,
                            "{name} x{num} trans {trans} lane {lane} reg {reg}"
                        );
                    }
                }
            }
        }
    }
}

/// `mma` needs the whole warp: under `if lane < 16` it is an error.
#[test]
fn mma_needs_a_converged_warp() {
    let layout = MmaLayout::from_json(&isa_layout_json()).expect("valid layout");
    let mut k = Builder::new("partial_mma", 32);
    let lane = k.lane_id();
    let sixteen = k.const_u32(16);
    let c = k.lt(lane, sixteen);
    k.if_then(c, |k| {
        let z = k.const_u32(0);
        let zf = k.const_f32(0.0);
        let zb = k.bitcast(Type::Scalar(Scalar::BF16x2), z);
        let a = k.pack(
            frag(MmaShape::M16N8K16, FragRole::A, Scalar::BF16),
            &[zb; 4],
        );
        let b = k.pack(
            frag(MmaShape::M16N8K16, FragRole::B, Scalar::BF16),
            &[zb; 2],
        );
        let cc = k.pack(frag(MmaShape::M16N8K16, FragRole::C, Scalar::F32), &[zf; 4]);
        k.mma(MmaShape::M16N8K16, a, b, cc);
    });
    let f = k.finish().expect("verifies");
    let mut dev = Device::new();
    match launch_with_layout(&f, &cfg(1, 32), &[], &mut dev, &layout) {
        Err(InterpError::NotConverged { active: 0xffff, .. }) => {}
        other => panic!("expected a convergence error, got {other:?}"),
    }
}

/// Loading refuses the placeholder by name and malformed tables with the problem.
#[test]
fn layout_files_are_validated() {
    let placeholder = r#"{"format":"quench.sm90.mma-layout.v1","status":"not measured yet"}"#;
    assert_eq!(
        MmaLayout::from_json(placeholder).err(),
        Some(InterpError::LayoutNotMeasured)
    );
    let good = isa_layout_json();
    assert!(MmaLayout::from_json(&good.replace("quench.sm90.mma-layout.v1", "v0")).is_err());
    // Make two A entries of the bf16 table name the same element.
    let mut v: serde_json::Value = serde_json::from_str(&good).expect("json");
    v["mma"]["m16n8k16.bf16"]["a"][1][3] = json!(0);
    v["mma"]["m16n8k16.bf16"]["a"][1][4] = json!(0);
    match MmaLayout::from_json(&v.to_string()) {
        Err(InterpError::Layout(msg)) => assert!(
            msg.contains("m16n8k16.bf16.a") && msg.contains("repeats"),
            "{msg}"
        ),
        other => panic!("expected a layout error, got {other:?}"),
    }
    let mut v: serde_json::Value = serde_json::from_str(&good).expect("json");
    v["ldmatrix"]["x2"][0][3] = json!(16);
    assert!(
        matches!(MmaLayout::from_json(&v.to_string()), Err(InterpError::Layout(m)) if m.contains("out of range"))
    );
}
