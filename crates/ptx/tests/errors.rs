//! What is refused, and how: invalid IR, valid IR that PTX cannot express, and PTX
//! that ptxas rejects.

use quench_ir::{AddrSpace, BinOp, Builder, CacheOp, Function, Op, Round, Scalar, Type};
use quench_ptx::{emit, ptxas, PtxError};

fn f16_kernel(rnd: Round) -> Function {
    let mut k = Builder::new("half_add", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::F16));
    let x = k.load(Type::Scalar(Scalar::F16), p);
    let y = k.bin_rnd(BinOp::Add, Some(rnd), x, x);
    k.store(p, y);
    k.finish().expect("valid kernel")
}

fn unsupported(f: &Function) -> (String, String) {
    match emit(f) {
        Err(PtxError::Unsupported { kernel, at, msg }) => {
            assert_eq!(kernel, f.name);
            (at, msg)
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn half_precision_rounds_only_to_nearest() {
    assert!(emit(&f16_kernel(Round::Rn)).is_ok_and(|p| p.contains("add.rn.f16")));
    for r in [Round::Rz, Round::Rm, Round::Rp] {
        let (at, msg) = unsupported(&f16_kernel(r));
        assert!(at.contains("add"), "{at}");
        assert_eq!(
            msg,
            format!(
                "`add` on f16 rounds only to nearest (rn) in PTX, not {}",
                r.name()
            )
        );
    }
}

#[test]
fn saturating_int_to_float_conversion_is_refused() {
    let mut k = Builder::new("sat_i2f", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::I32));
    let q = k.param("q", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let x = k.load(Type::I32, p);
    let y = k.cvt_rnd(Scalar::F32, Some(Round::Rn), true, x);
    k.store(q, y);
    let (_, msg) = unsupported(&k.finish().expect("valid kernel"));
    assert!(
        msg.contains("`sat` on a conversion from s32 to f32"),
        "{msg}"
    );
}

#[test]
fn shared_memory_accesses_take_no_cache_operator() {
    let mut k = Builder::new("shared_cg", 32);
    let s = k.shared_array("s", Scalar::F32, 32, 4);
    let x = k.load_with(Type::F32, s, CacheOp::Cg);
    k.store(s, x);
    let (at, msg) = unsupported(&k.finish().expect("valid kernel"));
    assert!(at.contains("load"), "{at}");
    assert_eq!(msg, "a shared load takes no cache operator (`cg` given)");
}

#[test]
fn invalid_ir_is_refused_with_the_verifier_reason() {
    let mut k = Builder::new("float_rem", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let x = k.load(Type::F32, p);
    let y = k.add(x, x);
    k.store(p, y);
    let mut f = k.finish().expect("valid kernel");
    // Turn the add into a remainder, which has no meaning (or instruction) on floats.
    for inst in &mut f.body.insts {
        if let Op::Bin { op, rnd, .. } = &mut inst.op {
            *op = BinOp::Rem;
            *rnd = None;
        }
    }
    match emit(&f) {
        Err(e @ PtxError::Invalid(_)) => {
            let text = e.to_string();
            assert!(text.contains("rem") && text.contains("f32"), "{text}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn predicate_parameters_are_refused_by_name() {
    let text = emit(&pred_param_kernel())
        .expect_err("a pred parameter")
        .to_string();
    assert!(text.contains("flag") && text.contains("pred"), "{text}");
}

/// A kernel with a pred parameter, built directly (the builder's check would refuse it).
fn pred_param_kernel() -> Function {
    Function {
        name: "pred_param".into(),
        params: vec![quench_ir::Param {
            name: "flag".into(),
            ty: Type::PRED,
        }],
        shared: vec![],
        max_threads: 32,
        values: vec![],
        body: Default::default(),
    }
}

#[test]
fn ptxas_rejection_carries_its_message_and_the_line() {
    let mut k = Builder::new("ok", 32);
    let p = k.param("p", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let x = k.load(Type::U32, p);
    let y = k.add(x, x);
    k.store(p, y);
    let ptx = emit(&k.finish().expect("valid kernel")).expect("emits");
    let broken = ptx.replacen("add.u32", "add.u33", 1);
    let line = broken
        .lines()
        .position(|l| l.contains("add.u33"))
        .expect("the edit")
        + 1;
    match ptxas::assemble(&broken, "sm_90") {
        Err(PtxError::PtxasRejected {
            arch,
            message,
            line: at,
            text,
        }) => {
            assert_eq!(arch, "sm_90");
            assert_eq!(at, Some(line), "{message}");
            assert!(text.is_some_and(|t| t.contains("add.u33")));
            assert!(message.contains("error"), "{message}");
            assert!(
                !message.contains("quench-ptxas-"),
                "temporary path leaked: {message}"
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn assemble_checks_the_architecture_name() {
    let err = ptxas::assemble(".version 9.0", "sm_90; rm -rf /").expect_err("bad arch");
    assert!(err.to_string().contains("sm_90 or sm_90a"), "{err}");
}
