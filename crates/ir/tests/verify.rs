//! The verifier: one rejected kernel per kind of problem, each error checked to name
//! the problem, and kernels it must accept.

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::*;

fn gptr(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

fn fr(shape: MmaShape, role: FragRole, elem: Scalar) -> Type {
    Type::Frag(FragType { shape, role, elem })
}

/// A kernel `k` with parameters `x: ptr<global, f32>` and `n: u32` (values %0, %1).
fn kernel() -> (Builder, Value, Value) {
    let mut k = Builder::new("k", 128);
    let x = k.param("x", gptr(Scalar::F32));
    let n = k.param("n", Type::U32);
    (k, x, n)
}

fn build(body: impl FnOnce(&mut Builder, Value, Value)) -> Result<Function, VerifyError> {
    let (mut k, x, n) = kernel();
    body(&mut k, x, n);
    k.finish()
}

/// The error for a kernel that must be rejected; its message must contain each of
/// `words`.
fn rejected(body: impl FnOnce(&mut Builder, Value, Value), words: &[&str]) -> VerifyError {
    let e = build(body).expect_err("kernel should be rejected");
    assert_names(&e, words);
    e
}

fn assert_names(e: &VerifyError, words: &[&str]) {
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("kernel `{}`", e.kernel())),
        "{msg}"
    );
    for w in words {
        assert!(msg.contains(w), "`{msg}` does not mention `{w}`");
    }
}

fn problem(e: &VerifyError) -> &InstProblem {
    match e {
        VerifyError::Inst { problem, .. } => problem,
        other => panic!("expected an instruction problem, got {other}"),
    }
}

fn kernel_problem(e: &VerifyError) -> &KernelProblem {
    match e {
        VerifyError::Kernel { problem, .. } => problem,
        other => panic!("expected a kernel problem, got {other}"),
    }
}

/// A small valid kernel to break in place.
fn valid() -> Function {
    build(|k, x, n| {
        let i = k.tid_x();
        let inside = k.lt(i, n);
        k.if_then(inside, |k| {
            let p = k.ptr_add(x, i);
            let v = k.load(Type::F32, p);
            k.store(p, v);
        });
    })
    .expect("valid kernel")
}

fn verify_err(f: &Function, words: &[&str]) -> VerifyError {
    let e = verify(f).expect_err("kernel should be rejected");
    assert_names(&e, words);
    e
}

// ---- the error names kernel, instruction, place and problem ---------------------------

#[test]
fn error_message_names_kernel_instruction_place_and_problem() {
    let e = rejected(
        |k, _, _| {
            let a = k.const_f32(1.0);
            k.bin_rnd(BinOp::Add, None, a, a);
        },
        &[],
    );
    assert_eq!(
        e.to_string(),
        "kernel `k`: `%3: f32 = add %2, %2` at body[3]: `add on f32` needs a rounding mode"
    );
}

// ---- kernel header --------------------------------------------------------------------

#[test]
fn rejects_names_that_are_not_identifiers() {
    let mut f = valid();
    f.name = "my-kernel".into();
    let e = verify_err(&f, &["kernel name \"my-kernel\""]);
    assert!(matches!(
        kernel_problem(&e),
        KernelProblem::BadName { what: "kernel", .. }
    ));
    let mut f = valid();
    f.params[1].name = "n 2".into();
    assert!(matches!(
        kernel_problem(&verify_err(&f, &["parameter name \"n 2\""])),
        KernelProblem::BadName { .. }
    ));
    let e = build(|k, _, _| {
        k.shared_array("1st", Scalar::F32, 4, 4);
    })
    .expect_err("bad shared name");
    assert_names(&e, &["shared array name \"1st\""]);
}

#[test]
fn rejects_duplicate_names() {
    let mut f = valid();
    f.params[1].name = "x".into();
    verify_err(&f, &["two parameters are named `x`"]);
    let e = build(|k, _, _| {
        k.shared_array("t", Scalar::F32, 4, 4);
        k.shared_array("t", Scalar::U32, 4, 4);
    })
    .expect_err("duplicate shared");
    assert!(matches!(
        kernel_problem(&e),
        KernelProblem::DuplicateName {
            what: "shared array",
            ..
        }
    ));
}

#[test]
fn rejects_thread_counts_outside_1_to_1024() {
    for t in [0, 1025] {
        let mut f = valid();
        f.max_threads = t;
        let e = verify_err(&f, &[&format!("max_threads is {t}")]);
        assert_eq!(kernel_problem(&e), &KernelProblem::MaxThreads(t));
    }
    for t in [1, 1024] {
        let mut f = valid();
        f.max_threads = t;
        assert_eq!(verify(&f), Ok(()));
    }
}

#[test]
fn rejects_parameters_that_are_not_global_pointers_or_scalars() {
    for ty in [
        Type::PRED,
        Type::Ptr(AddrSpace::Shared, Scalar::F32),
        Type::Vec(Scalar::F32, 2),
        fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32),
    ] {
        let mut f = valid();
        f.params[1].ty = ty;
        f.values[1] = ty;
        let e = verify_err(&f, &["parameter `n`", &ty.to_string()]);
        assert!(matches!(
            kernel_problem(&e),
            KernelProblem::ParamType { .. }
        ));
    }
}

#[test]
fn rejects_bad_shared_declarations() {
    let e = build(|k, _, _| {
        k.shared_array("flags", Scalar::Pred, 4, 4);
    })
    .expect_err("pred array");
    assert!(matches!(
        kernel_problem(&e),
        KernelProblem::SharedElem { .. }
    ));
    build(|k, _, _| {
        k.shared_array("dynamic", Scalar::F32, 0, 4);
    })
    .expect("one array of length 0: the dynamic shared memory");
    let e = build(|k, _, _| {
        k.shared_array("table", Scalar::F32, 4, 4);
        k.shared_array("none", Scalar::F32, 0, 4);
    })
    .expect_err("empty array beside another");
    assert_names(&e, &["`none` has length 0"]);
    for align in [3, 2] {
        let mut f = valid();
        f.shared.push(SharedDecl {
            name: "t".into(),
            elem: Scalar::F32,
            len: 4,
            align,
        });
        let e = verify_err(&f, &[&format!("alignment {align}"), "at least 4"]);
        assert!(matches!(
            kernel_problem(&e),
            KernelProblem::SharedAlign { .. }
        ));
    }
}

#[test]
fn rejects_shared_memory_over_the_limit_counting_alignment() {
    let words = (MAX_STATIC_SHARED_BYTES / 4) as u32;
    build(|k, _, _| {
        k.shared_array("all", Scalar::F32, words, 16);
    })
    .expect("exactly the limit fits");
    let e = build(|k, _, _| {
        k.shared_array("byte", Scalar::U8, 1, 1);
        k.shared_array("all", Scalar::F32, words, 16);
    })
    .expect_err("padding pushes it over");
    assert_eq!(
        kernel_problem(&e),
        &KernelProblem::SharedTooLarge {
            used: MAX_STATIC_SHARED_BYTES + 16,
            limit: MAX_STATIC_SHARED_BYTES
        }
    );
    assert_names(&e, &["49168 bytes", "limit of 49152"]);
}

#[test]
fn rejects_kernel_body_arguments_and_values_nothing_defines() {
    let mut f = valid();
    f.values.push(Type::U32);
    f.body.args.push(Value(f.values.len() as u32 - 1));
    assert_eq!(
        kernel_problem(&verify_err(&f, &["block arguments"])),
        &KernelProblem::BodyArgs(1)
    );
    let mut f = valid();
    f.values.push(Type::F32);
    let last = Value(f.values.len() as u32 - 1);
    let e = verify_err(&f, &[&format!("{last} (of type f32) is not defined")]);
    assert!(matches!(
        kernel_problem(&e),
        KernelProblem::NeverDefined { .. }
    ));
}

// ---- values and scope ---------------------------------------------------------------

#[test]
fn rejects_undefined_operands() {
    let e = rejected(
        |k, _, _| {
            k.emit(
                Type::F32,
                Op::Un {
                    op: UnOp::Neg,
                    a: Value(999),
                },
            );
        },
        &[
            "%999 is not a value of this kernel, which has 3 values",
            "neg %999",
        ],
    );
    assert_eq!(
        problem(&e),
        &InstProblem::NoSuchValue {
            value: Value(999),
            count: 3
        }
    );
    // In the value table, but nothing defines it.
    let mut f = valid();
    f.values.push(Type::U32);
    let ghost = Value(f.values.len() as u32 - 1);
    f.body.insts.push(Inst {
        results: vec![],
        op: Op::Store {
            ptr: Value(0),
            value: ghost,
            cache: CacheOp::Default,
        },
    });
    let e = verify_err(&f, &[&format!("{ghost} is not defined anywhere")]);
    assert_eq!(problem(&e), &InstProblem::Undefined(ghost));
    // A result outside the value table.
    let mut f = valid();
    f.body.insts.push(Inst {
        results: vec![Value(500)],
        op: Op::Special(Special::LaneId),
    });
    let e = verify_err(&f, &["%500 is not a value of this kernel"]);
    assert!(matches!(problem(&e), InstProblem::NoSuchValue { .. }));
}

#[test]
fn rejects_use_before_definition() {
    let e = rejected(
        |k, _, _| {
            let c = k.const_f32(1.0);
            let later = Value(c.0 + 2);
            k.emit(
                Type::F32,
                Op::Un {
                    op: UnOp::Neg,
                    a: later,
                },
            );
            k.const_f32(2.0);
        },
        &["%4 is used before its definition"],
    );
    assert_eq!(problem(&e), &InstProblem::UseBeforeDef(Value(4)));
}

#[test]
fn rejects_values_used_outside_their_block() {
    let e = rejected(
        |k, _, n| {
            let p = k.const_pred(true);
            let mut inner = None;
            k.if_then(p, |k| inner = Some(k.add(n, n)));
            let inner = inner.expect("set");
            k.add(inner, n);
        },
        &["%3 is defined inside a nested block"],
    );
    assert_eq!(problem(&e), &InstProblem::OutOfScope(Value(3)));
    // A loop's induction variable is not visible after the loop.
    let e = rejected(
        |k, _, n| {
            let zero = k.const_u32(0);
            let mut iv = None;
            k.for_range(zero, n, n, &[], |_, i, _| {
                iv = Some(i);
                vec![]
            });
            k.add(iv.expect("set"), n);
        },
        &["not visible here"],
    );
    assert!(matches!(problem(&e), InstProblem::OutOfScope(_)));
    // Nor is a value of the then-branch in the else-branch.
    let e = rejected(
        |k, _, n| {
            let p = k.const_pred(true);
            let inner = std::cell::Cell::new(None);
            k.if_else(
                p,
                &[],
                |k| {
                    inner.set(Some(k.add(n, n)));
                    vec![]
                },
                |k| {
                    k.add(inner.get().expect("set"), n);
                    vec![]
                },
            );
        },
        &["at body[3]/else[0]"],
    );
    assert!(matches!(problem(&e), InstProblem::OutOfScope(_)));
}

#[test]
fn rejects_values_defined_twice() {
    let mut f = valid();
    let again = f.body.insts[2].clone();
    f.body.insts.push(again);
    let e = verify_err(&f, &["%2 is defined a second time", "special tid.x"]);
    assert_eq!(problem(&e), &InstProblem::Redefined(Value(2)));
}

#[test]
fn rejects_invalid_types() {
    let cases: Vec<(Type, &str)> = vec![
        (Type::Vec(Scalar::F32, 3), "2 or 4 lanes"),
        (Type::Vec(Scalar::F64, 4), "at most 16 bytes"),
        (
            fr(MmaShape::M16N8K16, FragRole::A, Scalar::F32),
            "does not fit the fragment",
        ),
    ];
    for (ty, why) in cases {
        let e = rejected(
            |k, x, _| {
                let (n, part) = match ty {
                    Type::Vec(s, n) => (n as usize, Type::Scalar(s)),
                    Type::Frag(f) => (f.regs() as usize, Type::Scalar(f.reg_type())),
                    _ => unreachable!(),
                };
                let parts: Vec<Value> = (0..n).map(|_| k.const_bits(part, 0)).collect();
                k.pack(ty, &parts);
                let _ = x;
            },
            &[&ty.to_string(), why],
        );
        assert!(matches!(problem(&e), InstProblem::InvalidType { .. }));
    }
    let e = rejected(
        |k, x, _| {
            k.ptr_cast(Scalar::Pred, x);
        },
        &["ptr<global, pred>", "cannot point to predicates"],
    );
    assert!(matches!(problem(&e), InstProblem::InvalidType { .. }));
}

// ---- operation typing ----------------------------------------------------------------

/// Each case: a kernel body that misuses an operand's type, and words of the message.
#[test]
fn rejects_operands_of_the_wrong_type() {
    type Case = (Box<dyn FnOnce(&mut Builder, Value, Value)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            Box::new(|k, _, n| {
                let f = k.const_f32(1.0);
                k.select(n, f, f);
            }),
            "operand `cond` (%1) has type u32, expected pred",
        ),
        (
            Box::new(|k, _, n| {
                let f = k.const_f32(1.0);
                k.bin(BinOp::Add, f, n);
            }),
            "expected f32 (the type of `a`)",
        ),
        (
            Box::new(|k, _, _| {
                let a = k.const_i32(1);
                k.bin(BinOp::Shl, a, a);
            }),
            "expected u32 (the shift amount)",
        ),
        (
            Box::new(|k, x, _| {
                let f = k.const_f32(1.0);
                k.ptr_add(x, f);
            }),
            "operand `index`",
        ),
        (
            Box::new(|k, _, n| {
                k.ptr_add(n, n);
            }),
            "expected a pointer",
        ),
        (
            Box::new(|k, _, _| {
                let d = k.const_f64(1.0);
                k.shfl_bfly(d, 1);
            }),
            "expected a 32-bit scalar",
        ),
        (
            Box::new(|k, _, n| {
                k.vote(VoteMode::All, n);
            }),
            "operand `pred`",
        ),
        (
            Box::new(|k, _, _| {
                let f = k.const_f32(1.0);
                k.redux(ReduxOp::Add, f);
            }),
            "expected s32 or u32",
        ),
        (
            Box::new(|k, _, _| {
                let u = k.const_u32(1);
                k.pack(Type::Vec(Scalar::F32, 2), &[u, u]);
            }),
            "operand `part 0`",
        ),
        (
            Box::new(|k, x, _| {
                k.ldmatrix(Type::U32, 1, false, x);
            }),
            "expected a pointer to shared memory",
        ),
        (
            Box::new(|k, x, _| {
                let s = k.shared_array("t", Scalar::F32, 64, 16);
                k.cp_async(s, s, 16, CacheOp::Ca);
                let _ = x;
            }),
            "operand `src`",
        ),
        (
            Box::new(|k, _, n| {
                let p = k.const_u32(0);
                k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, p, n);
            }),
            "a pointer to global or shared memory",
        ),
        (
            Box::new(|k, _, _| {
                let f = k.const_f32(0.0);
                k.for_range(f, f, f, &[], |_, _, _| vec![]);
            }),
            "operand `lo`",
        ),
        (
            Box::new(|k, _, n| {
                let z = k.const_i32(0);
                k.for_range(z, n, z, &[], |_, _, _| vec![]);
            }),
            "operand `hi` (%1) has type u32, expected s32 (the type of `lo`)",
        ),
        (
            Box::new(|k, _, n| {
                k.if_then(n, |_| {});
            }),
            "operand `cond`",
        ),
        (
            Box::new(|k, _, _| {
                let a = k.const_f32(1.0);
                k.div_approx(a, a);
                let d = k.const_f64(1.0);
                k.div_approx(d, d);
            }),
            "expected f32",
        ),
    ];
    for (body, words) in cases {
        let e = rejected(body, &[words]);
        assert!(matches!(problem(&e), InstProblem::Operand { .. }), "{e}");
    }
}

#[test]
fn rejects_mma_with_mismatched_fragments() {
    let e = rejected(
        |k, _, _| {
            let r = k.const_bits(Type::Scalar(Scalar::F16x2), 0);
            let rb = k.const_bits(Type::Scalar(Scalar::BF16x2), 0);
            let z = k.const_f32(0.0);
            let a = k.pack(fr(MmaShape::M16N8K16, FragRole::A, Scalar::F16), &[r; 4]);
            let b = k.pack(fr(MmaShape::M16N8K16, FragRole::B, Scalar::BF16), &[rb; 2]);
            let c = k.pack(fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32), &[z; 4]);
            k.mma(MmaShape::M16N8K16, a, b, c);
        },
        &["operand `b`", "f16 elements (matching `a`)"],
    );
    assert!(matches!(problem(&e), InstProblem::Operand { .. }));
    let e = rejected(
        |k, _, _| {
            let r = k.const_bits(Type::Scalar(Scalar::F16x2), 0);
            let z = k.const_f32(0.0);
            let a = k.pack(fr(MmaShape::M16N8K16, FragRole::A, Scalar::F16), &[r; 4]);
            let b = k.pack(fr(MmaShape::M16N8K16, FragRole::B, Scalar::F16), &[r; 2]);
            let c = k.pack(fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32), &[z; 4]);
            k.mma(MmaShape::M16N8K32, a, b, c);
        },
        &["operand `a`", "a valid a fragment of m16n8k32"],
    );
    assert!(matches!(problem(&e), InstProblem::Operand { .. }));
}

#[test]
fn rejects_operations_on_types_they_are_not_defined_on() {
    type Case = (Box<dyn FnOnce(&mut Builder, Value, Value)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            Box::new(|k, _, n| {
                k.fma(n, n, n);
            }),
            "`fma` is not defined on u32",
        ),
        (
            Box::new(|k, _, _| {
                let f = k.const_f32(1.0);
                k.mul_hi(f, f);
            }),
            "`mulhi` is not defined on f32",
        ),
        (
            Box::new(|k, _, _| {
                let h = k.const_bits(Type::Scalar(Scalar::F16), 0);
                k.div(h, h);
            }),
            "`div` is not defined on f16",
        ),
        (
            Box::new(|k, _, _| {
                let p = k.const_pred(true);
                k.add(p, p);
            }),
            "`add` is not defined on pred",
        ),
        (
            Box::new(|k, _, _| {
                let p = k.const_pred(true);
                k.lt(p, p);
            }),
            "`cmp.lt` is not defined on pred",
        ),
        (
            Box::new(|k, _, n| {
                k.cvt_rnd(Scalar::F16x2, Some(Round::Rn), false, n);
            }),
            "`cvt` is not defined on f16x2",
        ),
        (
            Box::new(|k, _, n| {
                k.neg(n);
            }),
            "`neg` is not defined on u32",
        ),
        (
            Box::new(|k, _, _| {
                let d = k.const_f64(1.0);
                k.ex2_approx(d);
            }),
            "`ex2.approx` is not defined on f64",
        ),
        (
            Box::new(|k, _, _| {
                let h = k.const_bits(Type::Scalar(Scalar::U16), 0);
                k.un(UnOp::Popc, h);
            }),
            "`popc` is not defined on u16",
        ),
        (
            Box::new(|k, _, n| {
                k.extract(n, 0);
            }),
            "`extract` is not defined on u32",
        ),
        (
            Box::new(|k, x, _| {
                k.emit(
                    Type::U64,
                    Op::Bitcast {
                        to: Type::U64,
                        a: x,
                    },
                );
            }),
            "`bitcast` is not defined on ptr<global, f32>",
        ),
        (
            Box::new(|k, x, _| {
                let p = k.ptr_cast(Scalar::U8, x);
                let b = k.const_bits(Type::Scalar(Scalar::U8), 1);
                k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, p, b);
            }),
            "`atom.add` is not defined on u8",
        ),
        (
            Box::new(|k, _, _| {
                let f = k.const_f32(1.0);
                k.emit(
                    Type::F32,
                    Op::Vote {
                        mode: VoteMode::Any,
                        pred: f,
                        mask: f,
                    },
                );
            }),
            "operand `pred`",
        ),
    ];
    for (body, words) in cases {
        let e = build(body).expect_err(words);
        assert_names(&e, &[words]);
    }
}

#[test]
fn rejects_missing_and_superfluous_rounding() {
    let e = rejected(
        |k, _, n| {
            k.cvt_rnd(
                Scalar::F16,
                None,
                false,
                k.ty(n).scalar().map(|_| n).expect("u32"),
            );
        },
        &["`cvt from u32 to f16` needs a rounding mode"],
    );
    assert!(matches!(problem(&e), InstProblem::RoundingRequired { .. }));
    let e = rejected(
        |k, _, _| {
            let h = k.const_bits(Type::Scalar(Scalar::F16), 0);
            k.cvt_rnd(Scalar::BF16, None, false, h);
        },
        &["`cvt from f16 to bf16` needs a rounding mode"],
    );
    assert!(matches!(problem(&e), InstProblem::RoundingRequired { .. }));
    let e = rejected(
        |k, _, n| {
            k.bin_rnd(BinOp::Add, Some(Round::Rn), n, n);
        },
        &["`add on u32` takes no rounding mode"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::RoundingNotAllowed { .. }
    ));
    let e = rejected(
        |k, _, _| {
            let f = k.const_f32(1.0);
            k.bin_rnd(BinOp::Max, Some(Round::Rz), f, f);
        },
        &["`max on f32` takes no rounding mode"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::RoundingNotAllowed { .. }
    ));
    let e = rejected(
        |k, _, _| {
            let h = k.const_bits(Type::Scalar(Scalar::F16), 0);
            k.cvt_rnd(Scalar::F32, Some(Round::Rn), false, h);
        },
        &["`cvt from f16 to f32` takes no rounding mode"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::RoundingNotAllowed { .. }
    ));
}

#[test]
fn default_conversions_agree_with_the_verifier() {
    let all: Vec<Scalar> = Scalar::ALL
        .into_iter()
        .filter(|s| s.is_int() || s.is_float())
        .collect();
    for &from in &all {
        for &to in &all {
            build(|k, _, _| {
                let a = k.const_bits(Type::Scalar(from), 1);
                k.cvt(to, a);
            })
            .unwrap_or_else(|e| panic!("cvt {from} -> {to}: {e}"));
        }
    }
}

#[test]
fn rejects_wrong_result_counts_and_types() {
    let e = rejected(
        |k, _, n| {
            k.emit_void(Op::Bin {
                op: BinOp::Add,
                rnd: None,
                a: n,
                b: n,
            })
        },
        &["defines 0 results, expected 1"],
    );
    assert_eq!(
        problem(&e),
        &InstProblem::ResultCount {
            expected: 1,
            found: 0
        }
    );
    let e = rejected(
        |k, x, _| {
            let f = k.const_f32(1.0);
            k.emit(
                Type::U32,
                Op::Store {
                    ptr: x,
                    value: f,
                    cache: CacheOp::Default,
                },
            );
        },
        &["defines 1 results, expected 0"],
    );
    assert!(matches!(problem(&e), InstProblem::ResultCount { .. }));
    let e = rejected(
        |k, _, n| {
            k.emit(
                Type::F32,
                Op::Bin {
                    op: BinOp::Add,
                    rnd: None,
                    a: n,
                    b: n,
                },
            );
        },
        &["result %2 has type f32, expected u32"],
    );
    assert!(matches!(problem(&e), InstProblem::ResultType { .. }));
    let e = rejected(
        |k, _, _| {
            k.emit(Type::F32, Op::Param(1));
        },
        &["result %2 has type f32, expected u32", "param 1 // n"],
    );
    assert!(matches!(problem(&e), InstProblem::ResultType { .. }));
}

#[test]
fn rejects_bad_constants() {
    let e = rejected(
        |k, _, _| {
            k.const_bits(Type::Vec(Scalar::F32, 2), 0);
        },
        &["constants have a scalar type, not vec2<f32>"],
    );
    assert!(matches!(problem(&e), InstProblem::ConstType(_)));
    for (ty, bits) in [
        (Scalar::U8, 0x100u64),
        (Scalar::Pred, 2),
        (Scalar::F16, 0x1_0000),
        (Scalar::I32, 1 << 32),
    ] {
        let e = rejected(
            |k, _, _| {
                k.const_bits(Type::Scalar(ty), bits);
            },
            &[&format!("{bits:#x} do not fit in {ty}")],
        );
        assert!(matches!(problem(&e), InstProblem::ConstBits { .. }));
    }
}

#[test]
fn rejects_out_of_range_parameter_and_shared_indices() {
    let e = rejected(
        |k, _, _| {
            k.emit(Type::U32, Op::Param(5));
        },
        &["parameter index 5 is out of range: the kernel has 2"],
    );
    assert!(matches!(problem(&e), InstProblem::ParamIndex { .. }));
    let e = rejected(
        |k, _, _| {
            k.emit(Type::U32, Op::SharedAddr { decl: 3 });
        },
        &["shared array index 3 is out of range"],
    );
    assert!(matches!(problem(&e), InstProblem::SharedIndex { .. }));
}

#[test]
fn rejects_bitcasts_between_sizes_and_bad_part_counts_and_indices() {
    let e = rejected(
        |k, _, _| {
            let f = k.const_f32(1.0);
            k.bitcast(Type::U64, f);
        },
        &["bitcast from f32 (4 bytes) to u64 (8 bytes)"],
    );
    assert!(matches!(problem(&e), InstProblem::BitcastSize { .. }));
    let e = rejected(
        |k, _, _| {
            let f = k.const_f32(1.0);
            k.pack(Type::Vec(Scalar::F32, 4), &[f, f, f]);
        },
        &["vec4<f32> is built from 4 parts, found 3"],
    );
    assert!(matches!(problem(&e), InstProblem::PartCount { .. }));
    let e = rejected(
        |k, _, _| {
            let f = k.const_f32(1.0);
            let v = k.pack(Type::Vec(Scalar::F32, 4), &[f; 4]);
            k.extract(v, 4);
        },
        &["part index 4 is out of range for vec4<f32>, which has 4 parts"],
    );
    assert!(matches!(problem(&e), InstProblem::PartIndex { .. }));
}

#[test]
fn rejects_memory_accesses_of_the_wrong_type() {
    let e = rejected(
        |k, x, _| {
            k.load(Type::Scalar(Scalar::F16), x);
        },
        &["load of f16 through ptr<global, f32>"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::MemoryType { access: "load", .. }
    ));
    let e = rejected(
        |k, x, n| k.store(x, n),
        &["store of u32 through ptr<global, f32>"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::MemoryType {
            access: "store",
            ..
        }
    ));
    let e = rejected(
        |k, x, n| {
            k.atomic(AtomOp::Exch, Ordering::Relaxed, Scope::Gpu, x, n);
        },
        &["atomic of u32 through ptr<global, f32>"],
    );
    assert!(matches!(
        problem(&e),
        InstProblem::MemoryType {
            access: "atomic",
            ..
        }
    ));
    build(|k, x, _| {
        let v = k.load(Type::Vec(Scalar::F32, 4), x);
        k.store(x, v);
    })
    .expect("vector access of the pointee");
}

#[test]
fn rejects_invalid_cache_operators() {
    type Case = (Box<dyn FnOnce(&mut Builder, Value, Value)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            Box::new(|k, x, _| {
                k.load_with(Type::F32, x, CacheOp::Wb);
            }),
            "`.wb` is not valid on a load",
        ),
        (
            Box::new(|k, x, _| {
                let f = k.const_f32(0.0);
                k.store_with(x, f, CacheOp::Nc);
            }),
            "`.nc` is not valid on a store",
        ),
        (
            Box::new(|k, x, _| {
                let f = k.const_f32(0.0);
                k.store_with(x, f, CacheOp::Ca);
            }),
            "`.ca` is not valid on a store",
        ),
        (
            Box::new(|k, _, _| {
                let s = k.shared_array("t", Scalar::F32, 4, 4);
                k.load_with(Type::F32, s, CacheOp::Nc);
            }),
            "`.nc` loads only from global memory",
        ),
        (
            Box::new(|k, x, _| {
                let s = k.shared_array("t", Scalar::F32, 4, 4);
                k.cp_async(s, x, 16, CacheOp::Default);
            }),
            "`.default` is not one of cp.async's",
        ),
        (
            Box::new(|k, x, _| {
                let s = k.shared_array("t", Scalar::F32, 4, 4);
                k.cp_async(s, x, 8, CacheOp::Cg);
            }),
            "`.cg` copies only 16 bytes",
        ),
    ];
    for (body, words) in cases {
        let e = rejected(body, &[words]);
        assert!(matches!(problem(&e), InstProblem::Cache { .. }), "{e}");
    }
}

#[test]
fn rejects_relaxed_fences_and_wrong_atomic_operand_counts() {
    let e = rejected(
        |k, _, _| k.fence(Ordering::Relaxed, Scope::Gpu),
        &["fence.relaxed.gpu", "relaxed ordering orders nothing"],
    );
    assert_eq!(problem(&e), &InstProblem::RelaxedFence);
    let e = rejected(
        |k, x, _| {
            let f = k.const_f32(0.0);
            k.atomic(AtomOp::Cas, Ordering::Relaxed, Scope::Gpu, x, f);
        },
        &["`atom.cas` takes 3 operands, found 2"],
    );
    assert!(matches!(problem(&e), InstProblem::OperandCount { .. }));
    let e = rejected(
        |k, x, _| {
            let f = k.const_f32(0.0);
            k.emit(
                Type::F32,
                Op::Atomic {
                    op: AtomOp::Add,
                    ord: Ordering::Relaxed,
                    scope: Scope::Gpu,
                    ptr: x,
                    a: f,
                    b: Some(f),
                },
            );
        },
        &["`atom.add` takes 2 operands, found 3"],
    );
    assert!(matches!(problem(&e), InstProblem::OperandCount { .. }));
}

#[test]
fn rejects_bad_ldmatrix_and_cp_async_immediates_and_types() {
    let e = rejected(
        |k, _, _| {
            let s = k.shared_array("t", Scalar::U16, 256, 16);
            k.ldmatrix(Type::Vec(Scalar::U32, 4), 3, false, s);
        },
        &["the ldmatrix count is 3; it must be 1, 2 or 4"],
    );
    assert!(matches!(problem(&e), InstProblem::Immediate { .. }));
    let e = rejected(
        |k, x, _| {
            let s = k.shared_array("t", Scalar::F32, 4, 16);
            k.cp_async(s, x, 12, CacheOp::Ca);
        },
        &["the cp.async size is 12"],
    );
    assert!(matches!(problem(&e), InstProblem::Immediate { .. }));
    let bad_types = [
        (2, Type::Vec(Scalar::U32, 4)),
        (4, fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32)),
        (2, fr(MmaShape::M16N8K16, FragRole::A, Scalar::F16)),
        (1, Type::F32),
    ];
    for (num, ty) in bad_types {
        let e = rejected(
            |k, _, _| {
                let s = k.shared_array("t", Scalar::U16, 256, 16);
                k.ldmatrix(ty, num, false, s);
            },
            &[&format!(".x{num} gives"), &format!("not {ty}")],
        );
        assert!(matches!(problem(&e), InstProblem::LdMatrixType { .. }));
    }
}

// ---- block structure -----------------------------------------------------------------

#[test]
fn rejects_misplaced_yield_and_return() {
    let e = rejected(
        |k, _, _| k.emit_void(Op::Yield(vec![])),
        &["`yield` may only end an if-branch or a loop body"],
    );
    assert_eq!(problem(&e), &InstProblem::MisplacedYield);
    let mut f = valid();
    if let Op::If { then_, .. } = &mut f.body.insts[4].op {
        then_.insts.insert(
            0,
            Inst {
                results: vec![],
                op: Op::Yield(vec![]),
            },
        );
    }
    let e = verify_err(&f, &["at body[4]/then[0]"]);
    assert_eq!(problem(&e), &InstProblem::MisplacedYield);
    let e = rejected(
        |k, _, n| {
            let p = k.lt(n, n);
            k.if_then(p, |k| k.ret());
        },
        &[
            "`return` may only be the last instruction of the kernel body",
            "body[3]/then[0]",
        ],
    );
    assert_eq!(problem(&e), &InstProblem::MisplacedReturn);
    let e = rejected(
        |k, _, _| {
            k.ret();
            k.barrier();
        },
        &["`return`"],
    );
    assert_eq!(problem(&e), &InstProblem::MisplacedReturn);
    build(|k, _, _| k.ret()).expect("return at the end is fine");
}

#[test]
fn rejects_nested_blocks_without_yield() {
    let mut f = valid();
    if let Op::If { else_, .. } = &mut f.body.insts[4].op {
        else_.insts.clear();
    }
    let e = verify_err(
        &f,
        &["`if %3`", "its else-branch does not end with `yield`"],
    );
    assert_eq!(
        problem(&e),
        &InstProblem::MissingYield {
            block: "else-branch"
        }
    );
}

#[test]
fn rejects_block_arguments_that_do_not_match() {
    let mut f = valid();
    f.values.push(Type::U32);
    let extra = Value(f.values.len() as u32 - 1);
    if let Op::If { then_, .. } = &mut f.body.insts[4].op {
        then_.args.push(extra);
    }
    let e = verify_err(&f, &["its then-branch has 1 block arguments, expected 0"]);
    assert!(matches!(problem(&e), InstProblem::BlockArgs { .. }));

    let looped = build(|k, _, n| {
        let z = k.const_u32(0);
        let f0 = k.const_f32(0.0);
        k.for_range(z, n, n, &[f0], |_, _, c| vec![c[0]]);
    })
    .expect("valid loop");
    let mut f = looped.clone();
    if let Op::For { body, .. } = &mut f.body.insts[4].op {
        body.args.pop();
    }
    let e = verify_err(&f, &["its loop body has 1 block arguments, expected 2"]);
    assert!(matches!(problem(&e), InstProblem::BlockArgs { .. }));
    let mut f = looped;
    let Op::For { body, .. } = &f.body.insts[4].op else {
        panic!("for")
    };
    let iv = body.args[0];
    f.values[iv.index()] = Type::I32;
    let e = verify_err(
        &f,
        &[&format!(
            "block argument {iv} of its loop body has type s32, expected u32"
        )],
    );
    assert!(matches!(problem(&e), InstProblem::BlockArgType { .. }));
}

#[test]
fn rejects_yields_that_do_not_match() {
    let e = rejected(
        |k, _, n| {
            let p = k.lt(n, n);
            k.if_else(p, &[Type::F32], |_| vec![], |k| vec![k.const_f32(0.0)]);
        },
        &["yields 0 values, the enclosing if expects 1", "then[0]"],
    );
    assert!(matches!(problem(&e), InstProblem::YieldCount { .. }));
    let e = rejected(
        |k, _, n| {
            let p = k.lt(n, n);
            k.if_else(p, &[Type::F32], |_| vec![n], |k| vec![k.const_f32(0.0)]);
        },
        &["yields %1 of type u32, the enclosing if expects f32"],
    );
    assert!(matches!(problem(&e), InstProblem::YieldType { .. }));
    let e = rejected(
        |k, _, n| {
            let z = k.const_u32(0);
            let f = k.const_f32(0.0);
            k.for_range(z, n, n, &[f], |_, i, _| vec![i]);
        },
        &["the enclosing for expects f32"],
    );
    assert!(matches!(problem(&e), InstProblem::YieldType { .. }));
}

// ---- barriers and uniformity ------------------------------------------------------------

#[test]
fn rejects_barriers_under_thread_dependent_control_flow() {
    let e = rejected(
        |k, _, n| {
            let t = k.tid_x();
            let p = k.lt(t, n);
            k.if_then(p, |k| k.barrier());
        },
        &[
            "barrier",
            "at body[4]/then[0]",
            "`if %3` depends on `%2: u32 = special tid.x`",
        ],
    );
    assert!(matches!(problem(&e), InstProblem::DivergentBarrier { .. }));
    // Under a uniform `if` that is itself inside a divergent one.
    let e = rejected(
        |k, x, n| {
            let v = k.load(Type::F32, x);
            let zero = k.const_f32(0.0);
            let p = k.lt(v, zero);
            k.if_then(p, |k| {
                let q = k.lt(n, n);
                k.if_then(q, |k| k.barrier());
            });
        },
        &["`%2: f32 = load %0`", "body[5]/then[1]/then[0]"],
    );
    assert!(matches!(problem(&e), InstProblem::DivergentBarrier { .. }));
    // A loop whose trip count differs between threads.
    let e = rejected(
        |k, _, n| {
            let t = k.lane_id();
            let one = k.const_u32(1);
            k.for_range(t, n, one, &[], |k, _, _| {
                k.barrier();
                vec![]
            });
        },
        &["the bounds of `for`", "special laneid"],
    );
    assert!(matches!(problem(&e), InstProblem::DivergentBarrier { .. }));
    // A loop-carried value that becomes thread-dependent only through its yield.
    let e = rejected(
        |k, _, n| {
            let zero = k.const_u32(0);
            let one = k.const_u32(1);
            k.for_range(zero, n, one, &[zero], |k, _, c| {
                let p = k.eq(c[0], zero);
                k.if_then(p, |k| k.barrier());
                let t = k.tid_x();
                vec![k.add(c[0], t)]
            });
        },
        &["special tid.x"],
    );
    assert!(matches!(problem(&e), InstProblem::DivergentBarrier { .. }));
    // Warp collectives give values that differ between warps.
    rejected(
        |k, _, n| {
            let one = k.const_u32(1);
            let r = k.redux(ReduxOp::Add, one);
            let p = k.lt(r, n);
            k.if_then(p, |k| k.barrier());
        },
        &["redux.add"],
    );
}

#[test]
fn accepts_barriers_under_uniform_control_flow() {
    build(|k, _, n| {
        let b = k.ctaid_x();
        let w = k.ntid_x();
        let base = k.mul(b, w);
        let p = k.lt(base, n);
        k.if_then(p, |k| k.barrier());
        let zero = k.const_u32(0);
        let one = k.const_u32(1);
        let out = k.for_range(zero, n, one, &[zero], |k, i, c| {
            k.barrier();
            let q = k.eq(c[0], i);
            k.if_then(q, |k| k.barrier());
            vec![k.add(c[0], i)]
        });
        let r = k.if_else(p, &[Type::U32], |_| vec![out[0]], |k| vec![k.const_u32(7)]);
        let s = k.lt(r[0], n);
        k.if_then(s, |k| k.barrier());
        let t = k.tid_x();
        let u = k.lt(t, n);
        k.if_then(u, |k| {
            let sh = k.shared_array("t", Scalar::F32, 32, 16);
            let _ = sh;
        });
    })
    .expect("uniform control flow");
}

/// A loop whose body loads a wgmma A fragment and leaves its product pending at the back
/// edge is refused; waiting for it, or two steps a body (each with its own fragment),
/// passes.
#[test]
fn a_pending_wgmma_fragment_written_again_is_refused() {
    let looped = |steps: usize, wait: u32| {
        let mut k = Builder::new("wg", 128);
        let tile = k.shared_array("tile", Scalar::F16, 4096, 1024);
        let desc = k.wgmma_desc(tile, 16, 512, quench_ir::Swizzle::B64);
        let shape = quench_ir::MmaShape::M64N64K16;
        let zero = k.const_f32(0.0);
        let c = k.pack(
            Builder::frag_type(shape, quench_ir::FragRole::C, Scalar::F32),
            &[zero; 32],
        );
        let (lo, hi, one) = (k.const_u32(0), k.const_u32(4), k.const_u32(1));
        k.for_range(lo, hi, one, &[c], |k, _, acc| {
            let mut acc = acc[0];
            for _ in 0..steps {
                let a = k.ldmatrix(
                    Builder::frag_type(shape, quench_ir::FragRole::A, Scalar::F16),
                    4,
                    false,
                    tile,
                );
                k.wgmma_fence();
                acc = k.wgmma(shape, Scalar::F16, a, desc, acc);
                k.wgmma_commit();
                k.wgmma_wait(wait);
            }
            vec![acc]
        });
        k.wgmma_wait(0);
        k.finish()
    };
    let e = looped(1, 1).expect_err("one step a body, its group left pending");
    assert!(
        e.to_string().contains("defines this wgmma's A fragment"),
        "{e}"
    );
    looped(1, 0).expect("waited for");
    looped(2, 1).expect("two steps a body");
}
