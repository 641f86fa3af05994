//! The PTX chosen for particular IR, where the choice matters for correctness.

use quench_ir::{AddrSpace, Builder, Function, Scalar, Type};

fn ptx(f: &Function) -> String {
    quench_ptx::emit(f).unwrap_or_else(|e| panic!("{e}"))
}

fn global(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

#[test]
fn module_header_and_parameters() {
    let mut k = Builder::new("header", 256);
    let h = k.param("h", Type::Scalar(Scalar::BF16));
    let p = k.param("p", global(Scalar::BF16));
    k.param("n", Type::Scalar(Scalar::I64));
    k.store(p, h);
    let text = ptx(&k.finish().expect("valid kernel"));
    for needle in [
        ".version 9.0\n.target sm_90\n.address_size 64\n",
        ".visible .entry header(",
        ".param .b16 header_param_0,",
        ".param .u64 .ptr.global.align 2 header_param_1,",
        ".param .s64 header_param_2\n)",
        ".maxntid 256, 1, 1\n",
        "cvta.to.global.u64",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn constants_are_exact_bit_patterns() {
    let mut k = Builder::new("consts", 32);
    let pf = k.param("pf", global(Scalar::F32));
    let pd = k.param("pd", global(Scalar::F64));
    let pb = k.param("pb", global(Scalar::I8));
    let f = k.const_f32(1.0);
    let d = k.const_f64(-2.5);
    let b = k.const_bits(Type::Scalar(Scalar::I8), 0xFF);
    k.store(pf, f);
    k.store(pd, d);
    k.store(pb, b);
    let text = ptx(&k.finish().expect("valid kernel"));
    assert!(text.contains("mov.f32 %f0, 0f3F800000;"), "{text}");
    assert!(text.contains("mov.f64 %fd0, 0dC004000000000000;"), "{text}");
    // An s8 is held sign-extended in its 16-bit register.
    assert!(text.contains("mov.b16 %rs0, 0xFFFF;"), "{text}");
}

#[test]
fn float_compares_are_ordered_except_not_equal() {
    let mut k = Builder::new("compares", 32);
    let p = k.param("p", global(Scalar::F32));
    let q = k.param("q", global(Scalar::U32));
    let x = k.load(Type::F32, p);
    let ne = k.ne(x, x);
    let lt = k.lt(x, x);
    let both = k.and(ne, lt);
    let (one, zero) = (k.const_u32(1), k.const_u32(0));
    let r = k.select(both, one, zero);
    k.store(q, r);
    let text = ptx(&k.finish().expect("valid kernel"));
    assert!(text.contains("setp.neu.f32"), "{text}");
    assert!(text.contains("setp.lt.f32"), "{text}");
    assert!(text.contains("and.pred"), "{text}");
    assert!(text.contains("selp.b32"), "{text}");
}

#[test]
fn byte_arithmetic_is_re_extended() {
    let mut k = Builder::new("bytes", 32);
    let p = k.param("p", global(Scalar::I8));
    let x = k.load(Type::Scalar(Scalar::I8), p);
    let y = k.add(x, x);
    k.store(p, y);
    let text = ptx(&k.finish().expect("valid kernel"));
    assert!(text.contains("ld.global.s8 %rs0"), "{text}");
    assert!(
        text.contains("add.s16 %rs1, %rs0, %rs0;\n\tcvt.s16.s8 %rs1, %rs1;"),
        "{text}"
    );
    assert!(text.contains("st.global.s8 ["), "{text}");
}

#[test]
fn approximations_are_the_ones_the_ir_names() {
    let mut k = Builder::new("approx", 32);
    let p = k.param("p", global(Scalar::F32));
    let x = k.load(Type::F32, p);
    let a = k.ex2_approx(x);
    let b = k.lg2_approx(a);
    let c = k.rcp_approx(b);
    let d = k.div_approx(c, x);
    k.store(p, d);
    let text = ptx(&k.finish().expect("valid kernel"));
    for needle in [
        "ex2.approx.ftz.f32",
        "lg2.approx.ftz.f32",
        "rcp.approx.f32",
        "div.approx.f32",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[test]
fn swapped_loop_values_are_copied_through_temporaries() {
    let mut k = Builder::new("swap", 32);
    let p = k.param("p", global(Scalar::U32));
    let (lo, hi, step) = (k.const_u32(0), k.const_u32(3), k.const_u32(1));
    let (a, b) = (k.const_u32(10), k.const_u32(20));
    let r = k.for_range(lo, hi, step, &[a, b], |_, _, c| vec![c[1], c[0]]);
    let s = k.sub(r[0], r[1]);
    k.store(p, s);
    let text = ptx(&k.finish().expect("valid kernel"));
    // Carried values live in %r6 and %r7; the swap reads both before writing either.
    let body = text.split("// yield\n").nth(1).expect("a yield");
    let copies: Vec<&str> = body.lines().take(4).map(str::trim).collect();
    assert_eq!(
        copies,
        [
            "mov.b32 %r8, %r7;",
            "mov.b32 %r9, %r6;",
            "mov.b32 %r6, %r8;",
            "mov.b32 %r7, %r9;"
        ],
        "{text}"
    );
}
