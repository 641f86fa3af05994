//! The SASS emulator against the IR interpreter: library kernels through quench's PTX
//! and ptxas, run from their machine code in the emulator and as IR in the interpreter
//! on the same fresh random inputs, with outputs poisoned before each run; every output
//! byte must agree, and must match the kernel's own reference. Controls: a kernel with a
//! deliberately wrong instruction, or a store removed, must fail that comparison; an
//! instruction the emulator does not model is refused by name and address.

use quench_ir::{
    AddrSpace, AtomOp, BinOp, Builder, Function, Ordering, Round, Scalar, Scope, Type, Value,
};
use quench_kernels::case::{Buffer, Check, Expected, POISON};
use quench_kernels::{CaseArg, CaseOutputs, KernelCase};
use quench_rt::{Arg, InterpExecutor};
use quench_sass::cubin::Cubin;
use quench_sass::emu::{self, EmuError, Global, Kernel, Launch, Operand};
use quench_sass::table::Tables;

/// `case`'s kernel through quench's PTX and ptxas (sm_90); `None` (after `not_run`)
/// without ptxas.
fn assemble(case: &KernelCase) -> Option<Kernel> {
    quench_testkit::ok(quench_ptx::ptxas::find_ptxas())?;
    let ptx = quench_ptx::emit(&case.kernel).expect("kernel emits PTX");
    let r = quench_ptx::ptxas::assemble(&ptx, "sm_90").expect("ptxas assembles it");
    let c = Cubin::parse(&r.cubin).expect("ptxas's cubin parses");
    let tables = Tables::sm90().expect("tables load");
    Some(Kernel::from_cubin(&c, &c.kernels[0].name, tables).expect("kernel decodes"))
}

/// The bytes of a scalar argument.
fn scalar_bytes(a: &Arg) -> Vec<u8> {
    match *a {
        Arg::Ptr(p) => p.0.to_le_bytes().to_vec(),
        Arg::U8(v) => vec![v],
        Arg::I8(v) => v.to_le_bytes().to_vec(),
        Arg::U16(v) => v.to_le_bytes().to_vec(),
        Arg::I16(v) => v.to_le_bytes().to_vec(),
        Arg::U32(v) => v.to_le_bytes().to_vec(),
        Arg::I32(v) => v.to_le_bytes().to_vec(),
        Arg::U64(v) => v.to_le_bytes().to_vec(),
        Arg::I64(v) => v.to_le_bytes().to_vec(),
        Arg::F16(v) => v.to_bits().to_le_bytes().to_vec(),
        Arg::BF16(v) => v.to_bits().to_le_bytes().to_vec(),
        Arg::F32(v) => v.to_le_bytes().to_vec(),
        Arg::F64(v) => v.to_le_bytes().to_vec(),
    }
}

/// Runs `case` in the emulator as `run_case` runs it on an executor: inputs uploaded,
/// outputs poisoned, the parameters laid out as the cubin's records say.
fn run_emu(kernel: &Kernel, case: &KernelCase) -> Result<CaseOutputs, EmuError> {
    let mut global = Global::new();
    let addrs: Vec<u64> = case
        .buffers
        .iter()
        .map(|b| {
            let data = if b.poisoned {
                vec![POISON; b.data.len()]
            } else {
                b.data.clone()
            };
            global.alloc(data)
        })
        .collect();
    let mut params = vec![0u8; kernel.param_bytes];
    let ptxas_params = kernel_params(kernel);
    assert_eq!(
        ptxas_params.len(),
        case.args.len(),
        "{}: parameter count",
        case.name
    );
    for ((offset, size), a) in ptxas_params.iter().zip(&case.args) {
        let bytes = match a {
            CaseArg::Buffer(i) => addrs[*i].to_le_bytes().to_vec(),
            CaseArg::Scalar(s) => scalar_bytes(s),
        };
        assert_eq!(bytes.len(), *size, "{}: parameter at {offset}", case.name);
        params[*offset..offset + size].copy_from_slice(&bytes);
    }
    let l = &case.launch;
    emu::run(
        kernel,
        &Launch {
            grid: l.grid,
            block: l.block,
            dynamic_shared_bytes: l.dynamic_shared_bytes,
        },
        &params,
        &mut global,
    )?;
    Ok(CaseOutputs {
        outputs: case
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.output)
            .map(|(i, _)| (i, global.get(addrs[i]).unwrap().to_vec()))
            .collect(),
    })
}

/// `(offset, size)` of each parameter in ordinal order, from the cubin ptxas wrote.
fn kernel_params(kernel: &Kernel) -> Vec<(usize, usize)> {
    kernel
        .params
        .iter()
        .map(|p| (p.offset as usize, p.size as usize))
        .collect()
}

/// Every output of the emulator's run equals the interpreter's, byte for byte, and
/// passes the case's own check against its reference.
fn agree(case: &KernelCase, emu: &CaseOutputs) -> Result<(), String> {
    same_as_interpreter(case, emu)?;
    for r in quench_kernels::compare(case, emu).map_err(|e| e.to_string())? {
        if !r.passed {
            return Err(format!(
                "{}: {} fails its reference: {r:?}",
                case.name, r.buffer
            ));
        }
    }
    Ok(())
}

/// Every output byte of the emulator's run equals the interpreter's.
fn same_as_interpreter(case: &KernelCase, emu: &CaseOutputs) -> Result<(), String> {
    let interp = quench_kernels::run_case(&mut InterpExecutor::new(), case)
        .map_err(|e| format!("interpreter: {e}"))?;
    for ((i, ours), (_, theirs)) in emu.outputs.iter().zip(&interp.outputs) {
        if let Some(at) = ours.iter().zip(theirs).position(|(a, b)| a != b) {
            return Err(format!(
                "{}: buffer {} differs from the interpreter at byte {at} ({:#04x} vs {:#04x})",
                case.name, case.buffers[*i].name, ours[at], theirs[at]
            ));
        }
    }
    Ok(())
}

fn case(name: &str, params: &str, seed: u64) -> KernelCase {
    let spec = quench_kernels::find(name).expect("library kernel");
    let p = spec.parse_params(params).expect("parameters parse");
    spec.make_case(&p, seed).expect("case builds")
}

/// Library kernels the emulator runs bit for bit like the interpreter, at shapes that
/// leave partial blocks and tails.
const KERNELS: &[(&str, &str)] = &[
    ("add_f32", "n=1003 threads=64"),
    ("add_bf16", "n=1003 threads=64"),
    ("bias_rows_f32", ""),
    ("reduce_sum_f32", "rows=3 cols=324 threads=64"),
    ("reduce_max_f32", "rows=3 cols=324 threads=64"),
    ("gemv_bf16", "rows=5 cols=576 warps=2 unroll=2"),
];

#[test]
fn library_kernels_run_bit_exact_against_the_interpreter() {
    let seed = quench_testkit::seed();
    for (name, params) in KERNELS {
        let c = case(name, params, seed);
        let Some(k) = assemble(&c) else { return };
        let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("{name}: {e}"));
        agree(&c, &out).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// NaNs come out as the interpreter's measured table says: f32 arithmetic and the
/// conversions to bf16 and f16 given quiet and signalling NaNs of either sign.
#[test]
fn nans_come_out_as_measured() {
    let nans: [u32; 4] = [0x7fc0_0000, 0xffc1_2345, 0x7f80_0001, 0xffa0_0001];
    let canonical32 = 0x7fff_ffffu32.to_le_bytes().to_vec();
    let canonical16 = 0x7fffu16.to_le_bytes().to_vec();
    for (name, inputs, canonical) in [
        ("add_f32", 2, canonical32),
        ("cast_f32_bf16", 1, canonical16.clone()),
        ("cast_f32_f16", 1, canonical16),
    ] {
        let mut c = case(name, "n=1003 threads=64", quench_testkit::seed());
        for b in 0..inputs {
            for (k, nan) in nans.iter().enumerate() {
                let at = 4 * (37 * k + 11 * b);
                c.buffers[b].data[at..at + 4].copy_from_slice(&nan.to_le_bytes());
            }
        }
        let Some(k) = assemble(&c) else { return };
        let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("{name}: {e}"));
        same_as_interpreter(&c, &out).unwrap_or_else(|e| panic!("{e}"));
        let y = &out.outputs[0].1;
        let n = canonical.len();
        let found = y
            .chunks_exact(n)
            .filter(|w| *w == canonical.as_slice())
            .count();
        assert_eq!(found, 4 * inputs, "{name}: canonical NaNs out");
    }
}

/// The comparison has teeth: one FADD run as FMUL, or the stores dropped (outputs stay
/// poisoned), must fail it.
#[test]
fn a_wrong_instruction_fails_the_comparison() {
    let c = case("add_f32", "n=1003 threads=64", quench_testkit::seed());
    let Some(k) = assemble(&c) else { return };
    let mut wrong = k.clone();
    let fadd = wrong
        .code
        .iter_mut()
        .flatten()
        .find(|i| i.op == "FADD")
        .expect("add_f32 has an FADD");
    fadd.op = "FMUL".into();
    let out = run_emu(&wrong, &c).expect("runs");
    assert!(agree(&c, &out).is_err(), "FMUL for FADD went unnoticed");

    let mut no_store = k.clone();
    for i in no_store.code.iter_mut().flatten().filter(|i| i.op == "STG") {
        i.op = "NOP".into();
        i.mods.clear();
        i.operands = Ok(vec![]);
    }
    let out = run_emu(&no_store, &c).expect("runs");
    assert!(out
        .outputs
        .iter()
        .all(|(_, d)| d.iter().all(|&b| b == POISON)));
    assert!(agree(&c, &out).is_err(), "missing stores went unnoticed");
}

/// The dependency-barrier check: with the wait on its loads' scoreboards cleared, the
/// first FADD of add_f32 reads registers still owed by an LDG, and the run says so.
#[test]
fn a_missing_scoreboard_wait_is_an_error() {
    let c = case("add_f32", "n=1003 threads=64", 1);
    let Some(mut k) = assemble(&c) else { return };
    let fadd = k
        .code
        .iter_mut()
        .flatten()
        .find(|i| i.op == "FADD")
        .expect("add_f32 has an FADD");
    assert_ne!(
        fadd.control.wait, 0,
        "ptxas makes the FADD wait on its loads"
    );
    fadd.control.wait = 0;
    let at = fadd.addr;
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at);
            assert!(why.starts_with("reads R"), "{why}");
        }
        other => panic!("expected a hazard at {at:#x}, got {other:?}"),
    }
}

/// A block barrier reached by some lanes of a warp only is an error, not a hang or a
/// guess: reduce_sum_f32's BAR.SYNC guarded by a predicate that differs between lanes.
#[test]
fn a_barrier_under_divergence_is_an_error() {
    let c = case("reduce_sum_f32", "rows=3 cols=324 threads=64", 1);
    let Some(mut k) = assemble(&c) else { return };
    let code = &mut k.code;
    let bar = code
        .iter()
        .flatten()
        .position(|i| i.op == "BAR")
        .expect("a BAR");
    // The predicate the STS before it is guarded by (lane 0 of each warp stores).
    let guard = code[..bar]
        .iter()
        .flatten()
        .rev()
        .find(|i| i.op == "STS")
        .and_then(|i| i.guard)
        .expect("a guarded STS before the barrier");
    let bar = code[bar].as_mut().unwrap();
    bar.guard = Some(guard);
    match run_emu(&k, &c) {
        Err(EmuError::Divergent { at, why }) => {
            assert!(why.starts_with("BAR.SYNC by lanes"), "{why}");
            assert_eq!(k.code[(at / 16) as usize].as_ref().unwrap().op, "BAR");
        }
        other => panic!("expected a divergent barrier, got {other:?}"),
    }
}

/// An access outside every allocation is an error naming the instruction and the address:
/// add_f32 told that its arrays are longer than they are.
#[test]
fn an_access_out_of_bounds_is_an_error() {
    let mut c = case("add_f32", "n=1003 threads=64", 1);
    let Some(k) = assemble(&c) else { return };
    c.args[3] = CaseArg::Scalar(Arg::U32(1100));
    match run_emu(&k, &c) {
        Err(EmuError::Fault {
            at,
            space,
            addr,
            len,
        }) => {
            let inst = k.code[(at / 16) as usize].as_ref().unwrap();
            assert_eq!((inst.op.as_str(), space), ("LDG", "global"));
            assert_eq!(len, 16);
            assert!(addr % 16 == 0 && addr > 0x7f00_0000_0000, "{addr:#x}");
        }
        other => panic!("expected a fault, got {other:?}"),
    }
}

/// `silu_mul` converts f16 (HADD2.F32) and uses `ex2.approx` (MUFU.EX2), which the
/// emulator does not model: the run stops at the first with its name and address.
#[test]
fn an_unmodelled_instruction_is_refused_by_name() {
    let spec = quench_kernels::find("silu_mul_f16").expect("library kernel");
    let c = spec
        .make_case(&spec.parse_params(spec.small_params()).unwrap(), 1)
        .unwrap();
    let Some(k) = assemble(&c) else { return };
    let e = run_emu(&k, &c).expect_err("HADD2 and MUFU are not modelled");
    let EmuError::Unmodelled { mnemonic, at, .. } = &e else {
        panic!("expected a refusal, got {e}")
    };
    assert!(
        mnemonic.starts_with("HADD2") || mnemonic.starts_with("MUFU"),
        "{e}"
    );
    let inst = k.code[(*at / 16) as usize].as_ref().unwrap();
    assert_eq!(inst.mnemonic(), *mnemonic);
    assert!(e
        .to_string()
        .contains(&format!("does not model {mnemonic} at {at:#x}")));
}

/// A vector instruction reading URZ is refused: ptxas writes URZ only on the uniform
/// datapath, so what such a read gives is not known (add_f32's products with URZ as the
/// addend instead of RZ).
#[test]
fn urz_in_a_vector_instruction_is_refused() {
    let c = case("add_f32", "n=300", 1);
    let text = quench_sass::codegen::compile(&c.kernel).expect("add_f32 compiles");
    // The products of two registers (a constant factor is an immediate, a form with no
    // uniform addend).
    let of_registers = |l: &str| {
        l.trim_start()
            .strip_prefix("IMAD ")
            .is_some_and(|ops| ops.split(',').take(3).all(|o| o.trim().starts_with('R')))
    };
    assert!(
        text.lines().any(of_registers),
        "add_f32 has a product of registers: {text}"
    );
    let text = text
        .lines()
        .map(|l| match of_registers(l) {
            true => l.replacen(", RZ ;", ", URZ ;", 1),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let tables = Tables::sm90().expect("tables load");
    let cubin = quench_sass::asm::assemble_cubin(&text, tables).expect("assembles");
    let cubin = Cubin::parse(&cubin).expect("parses");
    let k = Kernel::from_cubin(&cubin, "add_f32", tables).expect("decodes");
    let e = run_emu(&k, &c).expect_err("URZ in IMAD is refused");
    assert!(
        matches!(&e, EmuError::Unmodelled { mnemonic, detail, .. }
            if mnemonic == "IMAD" && detail.contains("URZ")),
        "{e}"
    );
}

/// Outputs per thread of [`mix`].
const MIX_OUTPUTS: u32 = 12;

/// A kernel that is not in the library, built to reach what the library's simple
/// kernels do not: loops whose trip counts differ between lanes, if/else under
/// divergence, 64-bit and signed arithmetic and comparisons, min/max, `mul.hi`, a
/// shuffle, and f32 conversion, fused multiply-add and min/max.
fn mix() -> Function {
    let u32p = Type::Ptr(quench_ir::AddrSpace::Global, Scalar::U32);
    let mut k = Builder::new("emu_mix", 64);
    let x = k.param("x", u32p);
    let y = k.param("y", u32p);
    let out = k.param("out", u32p);
    let n = k.param("n", Type::U32);
    let gid = k.global_id_x();
    // A shuffle while the whole warp takes part (the tables decode SHFL.BFLY only).
    let tid = k.tid_x();
    let t7 = k.mul_const(tid, 7);
    let shuffled = k.shfl_bfly(t7, 6);

    let in_range = k.lt(gid, n);
    k.if_then(in_range, |k| {
        let px = k.ptr_add(x, gid);
        let xv = k.load(Type::U32, px);
        let py = k.ptr_add(y, gid);
        let yv = k.load(Type::U32, py);
        // A loop of 0..15 trips, differing between lanes.
        let trips = k.and_const(xv, 15);
        let zero = k.const_u32(0);
        let one = k.const_u32(1);
        let seed64 = k.const_u64(0x1234_5678_9abc_def1);
        let r = k.for_range(zero, trips, one, &[yv, seed64], |k, iv, c| {
            let m = k.mul_const(c[0], 0x9e37_79b1);
            let ix = k.xor(iv, xv);
            let acc = k.add(m, ix);
            let three64 = k.const_u64(3);
            let m64 = k.mul(c[1], three64);
            let w = k.cvt(Scalar::U64, acc);
            let acc64 = k.add(m64, w);
            vec![acc, acc64]
        });
        let (acc, acc64) = (r[0], r[1]);
        let lo = k.cvt(Scalar::U32, acc64);
        let c32 = k.const_u32(32);
        let hi64 = k.shr(acc64, c32);
        let hi = k.cvt(Scalar::U32, hi64);
        let xs = k.bitcast(Type::I32, xv);
        let ys = k.bitcast(Type::I32, yv);
        // By a constant: the tables lack SHF.R.W.S32.HI with a register count.
        let seven = k.const_u32(7);
        let sra = k.shr(xs, seven);
        let sra = k.bitcast(Type::U32, sra);
        // Unsigned: the tables have only VIMNMX.U32.
        let umin = k.min(xv, yv);
        let umax = k.max(xv, yv);
        // 64-bit words made of the two inputs, compared: the high words decide unless
        // equal. (Unsigned, and not sums or products of sign-extended words, which need
        // forms the tables lack: `ISETP.GE.AND.EX`, `SHF.L.U64.HI`,
        // `LEA.HI.X.SX32`.)
        let xw = k.cvt(Scalar::U64, xv);
        let yw = k.cvt(Scalar::U64, yv);
        let c32 = k.const_u32(32);
        let xh = k.shl(xw, c32);
        let yh = k.shl(yw, c32);
        let xy = k.or(xh, yw);
        let yx = k.or(yh, xw);
        let lt64 = k.lt(xy, yx);
        let sel64 = k.select(lt64, xv, yv);
        let hi_mul = k.mul_hi(xv, yv);
        let odd = k.and_const(xv, 1);
        let is_odd = k.ne(odd, zero);
        let branch = k.if_else(
            is_odd,
            &[Type::U32],
            |k| vec![k.xor(xv, yv)],
            |k| {
                let y5 = k.mul_const(yv, 5);
                vec![k.add(xv, y5)]
            },
        )[0];
        let fx = k.cvt(Scalar::F32, xs);
        // Signed: the tables have no I2FP.F32.U32.
        let fy = k.cvt(Scalar::F32, ys);
        let c037 = k.const_f32(0.37);
        let f = k.fma(fx, c037, fy);
        // Maxima only: the tables have FMNMX with `!PT` (max), not with `PT` (min).
        let fmax_x = k.max(f, fx);
        let fmax = k.max(f, fy);
        let fmax_x = k.bitcast(Type::U32, fmax_x);
        let fmax = k.bitcast(Type::U32, fmax);
        let base = k.mul_const(gid, MIX_OUTPUTS);
        let outs = [
            acc, lo, hi, sra, umin, umax, sel64, hi_mul, branch, shuffled, fmax_x, fmax,
        ];
        for (i, v) in outs.into_iter().enumerate() {
            let at = k.add_const(base, i as u32);
            let p = k.ptr_add(out, at);
            k.store(p, v);
        }
    });
    k.finish().expect("emu_mix verifies")
}

/// [`mix`] over `n` threads of random words, its expected output the interpreter's.
/// A case of a hand-built kernel over `n` threads: `inputs` arrays of `n` fresh random
/// words, then an output of `outputs` words a thread, then `n`; what the interpreter
/// writes is the expected output.
fn words_case(kernel: Function, inputs: usize, outputs: u32, n: u32, seed: u64) -> KernelCase {
    let mut s = seed | 1;
    let mut word = || {
        // xorshift64*: any fresh words do.
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    };
    let mut buffers: Vec<Buffer> = (0..inputs)
        .map(|i| {
            let data = (0..n).flat_map(|_| word().to_le_bytes()).collect();
            Buffer::input(&format!("in{i}"), data)
        })
        .collect();
    buffers.push(Buffer::output("out", (n * outputs * 4) as usize));
    let mut args: Vec<CaseArg> = (0..=inputs).map(CaseArg::Buffer).collect();
    args.push(CaseArg::Scalar(Arg::U32(n)));
    let mut c = KernelCase {
        name: kernel.name.clone(),
        shape: n.to_string(),
        kernel,
        launch: quench_rt::Launch::linear(n.div_ceil(64), 64),
        buffers,
        args,
        expected: vec![],
        controls: vec![],
        bytes_moved: 0,
        flops: 0,
    };
    let want =
        quench_kernels::run_case(&mut InterpExecutor::new(), &c).expect("interpreter runs it");
    c.expected.push(Expected {
        buffer: inputs,
        data: want.get(inputs).unwrap().to_vec(),
        elem: Scalar::U32,
        check: Check::Exact,
    });
    c
}

fn mix_case(n: u32, seed: u64) -> KernelCase {
    words_case(mix(), 2, MIX_OUTPUTS, n, seed)
}

#[test]
fn divergence_loops_and_wide_arithmetic_match_the_interpreter() {
    let c = mix_case(150, quench_testkit::seed());
    let Some(k) = assemble(&c) else { return };
    let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("emu_mix: {e}"));
    agree(&c, &out).unwrap_or_else(|e| panic!("{e}"));
}

/// Products as ptxas writes them: `x·y + n` with `n` a kernel parameter (one product of
/// two registers plus a uniform register, `IMAD R, R, R, UR`) and the 64-bit product of
/// the zero-extended words (`IMAD.WIDE.U32 R, R, R, RZ`). quench's code generator emits
/// both forms for every product; no library kernel the emulator runs has them in ptxas's
/// code, so this is where their semantics in the emulator meet ptxas's.
fn products() -> Function {
    per_thread("emu_products", Scalar::U32, 3, |k, xv, yv, n| {
        let p = k.mul(xv, yv);
        let mad = k.add(p, n);
        let xw = k.cvt(Scalar::U64, xv);
        let yw = k.cvt(Scalar::U64, yv);
        let w = k.mul(xw, yw);
        let lo = k.cvt(Scalar::U32, w);
        let c32 = k.const_u32(32);
        let hi = k.shr(w, c32);
        let hi = k.cvt(Scalar::U32, hi);
        vec![mad, lo, hi]
    })
}

#[test]
fn products_of_registers_match_the_interpreter() {
    let c = words_case(products(), 2, 3, 200, quench_testkit::seed());
    let Some(k) = assemble(&c) else { return };
    // ptxas's code must hold the two forms, or this checks nothing about them.
    let texts: Vec<&str> = k.code.iter().flatten().map(|i| i.text.as_str()).collect();
    let has = |re: &dyn Fn(&str) -> bool| texts.iter().any(|t| re(t));
    assert!(
        has(&|t| t.starts_with("IMAD R") && t.contains(", UR")),
        "no IMAD R, R, R, UR in {texts:#?}"
    );
    assert!(
        has(&|t| t.starts_with("IMAD.WIDE.U32 R") && t.ends_with(", RZ")),
        "no IMAD.WIDE.U32 R, R, R, RZ in {texts:#?}"
    );
    let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("emu_products: {e}"));
    agree(&c, &out).unwrap_or_else(|e| panic!("{e}"));
}

/// Library kernels whose small shapes are left at their (large) defaults, and a smaller
/// shape for the emulator.
const SMALLER: &[(&str, &str)] = &[
    ("cast_f32_bf16", "n=1003 threads=64"),
    ("cast_f32_f16", "n=1003 threads=64"),
    ("gelu_f32_bf16", "n=1003 threads=64"),
    ("gelu_f32_f16", "n=1003 threads=64"),
    ("bias_rows_f32", "rows=3 cols=300 threads=64"),
];

/// Kernels that must run to the end (a regression in coverage fails here).
const RUN_TO_THE_END: &[&str] = &[
    "add_f32",
    "add_bf16",
    "reduce_sum_f32",
    "reduce_max_f32",
    "gemv_bf16",
    "embed_f32",
    "embed_bf16",
    "mask_logits_f32",
    "argmax_f32",
    "rope_append_neox_f32",
    "rope_append_gptj_f32",
    "cast_f32_bf16",
    "cast_f32_f16",
    "bias_rows_f32",
    "embed_f16",
    "embed_q8_0",
    "embed_q4_k",
    "rope_append_neox_bf16",
    "rope_append_neox_f16",
    "gemv_f16",
    "gemv_bf16_xf32",
    "qgemv_q3_k",
    "gemm_bf16",
    "gemm_bf16_xf16",
];

/// Every library kernel at its small shape: it runs in the emulator and agrees with the
/// interpreter byte for byte, or it is refused by name (an instruction, modifier or
/// operand not modelled, or a word the tables do not decode). Any other failure — a
/// fault, a missed dependency barrier, a deadlock, a wrong output — fails the test.
/// Prints which kernels ran and what stopped the others.
#[test]
fn every_library_kernel_runs_bit_exact_or_is_refused_by_name() {
    let seed = quench_testkit::seed();
    let mut ran = Vec::new();
    let mut refused: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for spec in quench_kernels::library() {
        let params = SMALLER
            .iter()
            .find(|(n, _)| *n == spec.name)
            .map_or(spec.small_params(), |(_, p)| p);
        let c = case(spec.name, params, seed);
        let Some(k) = assemble(&c) else { return };
        match run_emu(&k, &c) {
            Ok(out) => {
                agree(&c, &out).unwrap_or_else(|e| panic!("{e}"));
                ran.push(spec.name);
            }
            Err(EmuError::Unmodelled { mnemonic, .. }) => {
                refused.entry(mnemonic).or_default().push(spec.name)
            }
            Err(EmuError::Undecoded { .. }) => refused
                .entry("(undecoded word)".into())
                .or_default()
                .push(spec.name),
            Err(e) => panic!("{}: {e}", spec.name),
        }
    }
    println!("{} kernels run bit-exact: {}", ran.len(), ran.join(" "));
    for (why, names) in &refused {
        println!("{why} stops {} kernels, first {}", names.len(), names[0]);
    }
    for name in RUN_TO_THE_END {
        assert!(ran.contains(name), "{name} no longer runs to the end");
    }
}

// ---- quench's own code generator, checked without a GPU -----------------------------

/// `case`'s kernel through quench's own code generator (no ptxas); `None` when the
/// generator refuses it.
fn compile_own(case: &KernelCase) -> Option<Kernel> {
    let cubin = quench_sass::codegen::compile_cubin(&case.kernel).ok()?;
    let c = Cubin::parse(&cubin).expect("quench's cubin parses");
    let tables = Tables::sm90().expect("tables load");
    Some(Kernel::from_cubin(&c, &c.kernels[0].name, tables).expect("quench's code decodes"))
}

/// Every library kernel the code generator compiles runs in the emulator byte for byte
/// like the interpreter: its output may use no instruction the emulator does not model,
/// and a regression in what it compiles fails here too.
#[test]
fn quench_generated_code_runs_bit_exact_against_the_interpreter() {
    let seed = quench_testkit::seed();
    let mut ran = Vec::new();
    for spec in quench_kernels::library() {
        let params = SMALLER
            .iter()
            .find(|(n, _)| *n == spec.name)
            .map_or(spec.small_params(), |(_, p)| p);
        let c = case(spec.name, params, seed);
        let Some(k) = compile_own(&c) else { continue };
        let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        agree(&c, &out).unwrap_or_else(|e| panic!("quench's code for {e}"));
        ran.push(spec.name);
    }
    eprintln!(
        "quench's own code: {} library kernels bit-exact in the emulator: {ran:?}",
        ran.len()
    );
    for name in [
        "add_f32",
        "add_bf16",
        "reduce_sum_f32",
        "gemv_bf16",
        "embed_q4_k",
        "rope_append_neox_f32",
        "qgemv_q3_k",
        "cast_f32_f16",
        "gemv_tc_bf16_xf32",
        "gemm_q5_k_xf16",
        "attention_prefill_bf16",
        "gemm_bf16",
        "gemm_f16_xf16",
        "gemm_q8_0",
        "gemm_q4_k_xf16",
        "sample_f32",
    ] {
        assert!(ran.contains(&name), "{name} no longer compiles: {ran:?}");
    }
}

/// A load or store sooner than [`quench_sass::codegen::BARRIER_STALL`] cycles after a block
/// barrier stops the run there: quench's own sample_f32 with the barrier before a shared
/// load stalling a cycle (on the H100 such a load read a value before another warp's store
/// landed).
#[test]
fn memory_too_soon_after_a_barrier_is_an_error() {
    let spec = quench_kernels::find("sample_f32").expect("library kernel");
    let c = case(spec.name, spec.small_params(), quench_testkit::seed());
    let mut k = compile_own(&c).expect("the code generator compiles sample_f32");
    let mut insts: Vec<&mut emu::Inst> = k.code.iter_mut().flatten().collect();
    let bar = insts
        .windows(2)
        .position(|w| w[0].op == "BAR" && matches!(w[1].op.as_str(), "LDS" | "STS"))
        .expect("sample_f32 loads from shared memory right after a barrier");
    assert!(insts[bar].control.stall >= quench_sass::codegen::BARRIER_STALL);
    insts[bar].control.stall = 1;
    let (at, op) = (insts[bar + 1].addr, insts[bar + 1].op.clone());
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at);
            assert!(
                why.starts_with(&format!("{op} 1 cycles after BAR")),
                "{why}"
            );
        }
        other => panic!("expected a hazard at {at:#x}, got {other:?}"),
    }
}

/// A predicate overwritten unread by another opcode before the first write has landed
/// stops the run there: quench's own sample_f32 writes a predicate with `FSETP` that an
/// `ISETP` overwrites before anything reads it (something ptxas's code never does sooner
/// than 12 cycles, and then only with the same opcode). The code generator spaces them
/// as a guard's latency; cut to a cycle each, the run must say so at the `ISETP`.
#[test]
fn a_predicate_overwritten_unread_too_soon_is_an_error() {
    let spec = quench_kernels::find("sample_f32").expect("library kernel");
    let c = case(spec.name, spec.small_params(), quench_testkit::seed());
    let mut k = compile_own(&c).expect("the code generator compiles sample_f32");
    let run_before = run_emu(&k, &c);
    assert!(run_before.is_ok(), "{:?}", run_before.err());
    let mut insts: Vec<&mut emu::Inst> = k.code.iter_mut().flatten().collect();
    let writes = |i: &emu::Inst| match i.operands.as_ref().ok()?.first()? {
        emu::Operand::Pred { n, .. } => Some(*n),
        _ => None,
    };
    // The first FSETP whose predicate an ISETP overwrites with nothing between reading it.
    let (fsetp, isetp) = (0..insts.len())
        .filter(|&f| insts[f].op == "FSETP")
        .find_map(|f| {
            let p = writes(insts[f])?;
            let i = (f + 1..insts.len().min(f + 6))
                .find(|&i| insts[i].op == "ISETP" && writes(insts[i]) == Some(p))?;
            let untouched = insts[f + 1..i].iter().all(|x| {
                x.guard.is_none()
                    && !x.operands.as_ref().is_ok_and(|ops| {
                        ops.iter()
                            .any(|o| matches!(o, emu::Operand::Pred { n, .. } if *n == p))
                    })
            });
            untouched.then_some((f, i))
        })
        .expect("sample_f32 overwrites an FSETP's predicate unread");
    let at = insts[isetp].addr;
    for i in &mut insts[fsetp..isetp] {
        i.control.stall = 1;
    }
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at, "{why}");
            assert!(why.starts_with("writes P"), "{why}");
        }
        other => panic!("expected a predicate hazard at {at:#x}, got {other:?}"),
    }
}

/// Changes an instruction in place; whether it was one it changes.
type Mutation = fn(&mut emu::Inst) -> bool;

/// The tensor-core instructions have teeth in the emulator: in quench's own code of a
/// tensor-core GEMM (asynchronous copies, `LDSM`, `HMMA`), dropping the waits for the
/// copies (`DEPBAR`), reading the bf16 operands as f16, or loading the matrices
/// transposed must each break the agreement with the interpreter.
#[test]
fn a_missing_copy_wait_or_a_wrong_tensor_instruction_fails_the_comparison() {
    let spec = quench_kernels::find("gemm_q5_k").expect("library kernel");
    let c = case(spec.name, spec.small_params(), quench_testkit::seed());
    let k = compile_own(&c).expect("quench compiles gemm_q5_k");
    let out = run_emu(&k, &c).expect("runs");
    agree(&c, &out).expect("quench's gemm_q5_k agrees with the interpreter");
    let mutants: [(&str, Mutation); 3] = [
        ("DEPBAR dropped", |i| {
            let hit = i.op == "DEPBAR";
            if hit {
                i.op = "NOP".into();
                i.mods.clear();
                i.operands = Ok(vec![]);
            }
            hit
        }),
        ("HMMA on f16", |i| {
            let before = i.mods.len();
            i.mods.retain(|m| !(i.op == "HMMA" && m == "BF16"));
            i.mods.len() != before
        }),
        ("LDSM transposed", |i| {
            let hit = i.op == "LDSM";
            for m in i.mods.iter_mut().filter(|m| hit && *m == "M88") {
                *m = "MT88".into();
            }
            hit
        }),
    ];
    for (what, mutate) in mutants {
        let mut wrong = k.clone();
        let hits = wrong
            .code
            .iter_mut()
            .flatten()
            .filter_map(|i| mutate(i).then_some(()))
            .count();
        assert!(hits > 0, "{what}: gemm_q5_k has such instructions");
        let out = run_emu(&wrong, &c).expect("runs");
        assert!(agree(&c, &out).is_err(), "{what} went unnoticed");
    }
}

/// Values spilled to local memory come back: the quantized tensor-core GEMMs need more
/// registers than a thread may name, so the code generator keeps some values in each
/// thread's frame (`STL` after their definition, `LDL` before each use). Their code
/// agrees with the interpreter, and with the stores dropped it no longer does.
#[test]
fn spilled_values_come_back_from_local_memory() {
    let spec = quench_kernels::find("gemm_q4_k").expect("library kernel");
    let c = case(spec.name, spec.small_params(), quench_testkit::seed());
    let k = compile_own(&c).expect("quench compiles gemm_q4_k");
    assert!(k.frame_bytes > 0, "gemm_q4_k keeps values in local memory");
    let out = run_emu(&k, &c).expect("runs");
    agree(&c, &out).expect("quench's gemm_q4_k agrees with the interpreter");
    let mut wrong = k.clone();
    let mut stores = 0;
    for i in wrong.code.iter_mut().flatten().filter(|i| i.op == "STL") {
        i.op = "NOP".into();
        i.mods.clear();
        i.operands = Ok(vec![]);
        stores += 1;
    }
    assert!(stores > 0, "gemm_q4_k stores spilled values");
    // Reloaded zeros either fault (an address) or change the output.
    if let Ok(out) = run_emu(&wrong, &c) {
        assert!(
            agree(&c, &out).is_err(),
            "dropped spill stores went unnoticed"
        );
    }
}

#[test]
fn quench_generated_loops_branches_and_division_match_the_interpreter() {
    for c in [
        words_case(
            codegen_mix(),
            1,
            CODEGEN_OUTPUTS,
            150,
            quench_testkit::seed(),
        ),
        mix_case(150, quench_testkit::seed()),
    ] {
        let Some(k) = compile_own(&c) else {
            let e = quench_sass::codegen::compile_cubin(&c.kernel).unwrap_err();
            panic!("{}: {e}", c.name)
        };
        let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        agree(&c, &out).unwrap_or_else(|e| panic!("quench's code for {e}"));
    }
}

/// Outputs per thread of [`codegen_mix`].
const CODEGEN_OUTPUTS: u32 = 15;

/// A kernel made to exercise the code generator where it is easiest to get wrong: a loop
/// whose carried values swap places each trip (a parallel copy with a cycle), an `if` with
/// results inside it, shared memory across a barrier, 64-bit shared atomics, division and
/// remainder by
/// constants of each kind, predicate logic, 64-bit arithmetic (carries and borrows across
/// the words), and 16-bit halves packed
/// and taken apart.
fn codegen_mix() -> Function {
    let u32p = Type::Ptr(AddrSpace::Global, Scalar::U32);
    let mut k = Builder::new("codegen_mix", 64);
    let x = k.param("x", u32p);
    let out = k.param("out", u32p);
    let n = k.param("n", Type::U32);
    let gid = k.global_id_x();
    let tid = k.tid_x();
    let shared = k.shared_array("s", Scalar::U32, 64, 4);
    let in_range = k.lt(gid, n);
    let xv = k.if_else(
        in_range,
        &[Type::U32],
        |k| {
            let p = k.ptr_add(x, gid);
            vec![k.load(Type::U32, p)]
        },
        |k| vec![k.const_u32(0x5bd1_e995)],
    )[0];
    let slot = k.ptr_add(shared, tid);
    k.store(slot, xv);
    // Four 64-bit counters in shared memory, zeroed, then summed into by 16 threads each
    // with relaxed atomics (a compare-and-swap loop in the machine code).
    let buckets = k.shared_array("counts", Scalar::U64, 4, 8);
    let four = k.const_u32(4);
    let first = k.lt(tid, four);
    k.if_then(first, |k| {
        let b = k.ptr_add(buckets, tid);
        let z = k.const_u64(0);
        k.store(b, z);
    });
    k.barrier();
    let mine = k.and_const(tid, 3);
    let bucket = k.ptr_add(buckets, mine);
    let wide = k.cvt(Scalar::U64, xv);
    let c20 = k.const_u32(20);
    let shifted = k.shl(wide, c20);
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Cta, bucket, shifted);
    k.barrier();
    let total = k.load(Type::U64, bucket);
    let c32 = k.const_u32(32);
    let total_hi = k.shr(total, c32);
    let (total_lo, total_hi) = (k.cvt(Scalar::U32, total), k.cvt(Scalar::U32, total_hi));
    let counted = k.xor(total_lo, total_hi);
    let next = k.add_const(tid, 1);
    let next = k.and_const(next, 63);
    let nslot = k.ptr_add(shared, next);
    let neighbour = k.load(Type::U32, nslot);
    // (a, b) ← (b, a + i), a trip count differing between lanes.
    let trips = k.and_const(xv, 7);
    let (zero, one) = (k.const_u32(0), k.const_u32(1));
    let swapped = k.for_range(zero, trips, one, &[xv, neighbour], |k, iv, c| {
        let odd = k.and_const(iv, 1);
        let is_odd = k.ne(odd, zero);
        let bumped = k.if_else(
            is_odd,
            &[Type::U32],
            |k| vec![k.add(c[0], iv)],
            |k| vec![k.xor(c[0], iv)],
        )[0];
        vec![c[1], bumped]
    });
    let mut outs = swapped.clone();
    for d in [7u32, 16, 1_000_000_007, 641] {
        let dv = k.const_u32(d);
        outs.push(k.div(xv, dv));
        outs.push(k.rem(neighbour, dv));
    }
    // p = (x < 2^31) and not (neighbour > x), or (x == neighbour).
    let half = k.const_u32(1 << 31);
    let small = k.lt(xv, half);
    let above = k.gt(neighbour, xv);
    let not_above = k.not(above);
    let both = k.and(small, not_above);
    let same = k.eq(xv, neighbour);
    let p = k.or(both, same);
    let (two, three) = (k.const_u32(2), k.const_u32(3));
    outs.push(k.select(p, two, three));
    // 64-bit: x·neighbour + x, its high word.
    let xw = k.cvt(Scalar::U64, xv);
    let nw = k.cvt(Scalar::U64, neighbour);
    let prod = k.mul(xw, nw);
    let sum = k.add(prod, xw);
    let c32 = k.const_u32(32);
    let hi = k.shr(sum, c32);
    outs.push(k.cvt(Scalar::U32, hi));
    // x − x·neighbour, its high word: the low word's borrow crosses.
    let diff = k.sub(xw, prod);
    let hi = k.shr(diff, c32);
    outs.push(k.cvt(Scalar::U32, hi));
    outs.push(counted);
    assert_eq!(outs.len() as u32, CODEGEN_OUTPUTS - 1);
    // The halves of x swapped through a pair of u16.
    let lo16 = k.cvt(Scalar::U16, xv);
    let sh16 = k.const_u32(16);
    let hi32 = k.shr(xv, sh16);
    let hi16 = k.cvt(Scalar::U16, hi32);
    let pair = k.pack(Type::Vec(Scalar::U16, 2), &[hi16, lo16]);
    outs.push(k.bitcast(Type::U32, pair));
    k.if_then(in_range, |k| {
        let base = k.mul_const(gid, CODEGEN_OUTPUTS);
        for (j, v) in outs.iter().enumerate() {
            let at = k.add_const(base, j as u32);
            let p = k.ptr_add(out, at);
            k.store(p, *v);
        }
    });
    k.finish().expect("codegen_mix verifies")
}

/// Outputs per thread of [`f32_division`].
const IEEE_OUTPUTS: u32 = 6;

/// `x / y`, `1 / x`, `y / x`, `sqrt(x)` and `sqrt(y)` in f32 with round-to-nearest:
/// quench's integer division and root against the interpreter's IEEE ones; and `x` toward
/// zero as a u32 (saturating, NaN to 0) over the same special operands.
fn f32_division() -> Function {
    per_thread("f32_division", Scalar::F32, IEEE_OUTPUTS, |k, xv, yv, _| {
        vec![
            k.bin_rnd(BinOp::Div, Some(Round::Rn), xv, yv),
            k.rcp(xv),
            k.bin_rnd(BinOp::Div, Some(Round::Rn), yv, xv),
            k.sqrt(xv),
            k.sqrt(yv),
            {
                let t = k.cvt_rnd(Scalar::U32, Some(Round::Rz), false, xv);
                k.bitcast(Type::F32, t)
            },
        ]
    })
}

/// A kernel `name(x, y, out, n)` over `n` threads: thread `gid` loads `x[gid]` and
/// `y[gid]` (of `elem`) and stores the `outputs` values `body` makes of them (and `n`) at
/// `out[gid * outputs ..]`.
fn per_thread(
    name: &str,
    elem: Scalar,
    outputs: u32,
    body: impl FnOnce(&mut Builder, Value, Value, Value) -> Vec<Value>,
) -> Function {
    let ptr = Type::Ptr(AddrSpace::Global, elem);
    let mut k = Builder::new(name, 64);
    let x = k.param("x", ptr);
    let y = k.param("y", ptr);
    let out = k.param("out", ptr);
    let n = k.param("n", Type::U32);
    let gid = k.global_id_x();
    let in_range = k.lt(gid, n);
    k.if_then(in_range, |k| {
        let px = k.ptr_add(x, gid);
        let xv = k.load(Type::Scalar(elem), px);
        let py = k.ptr_add(y, gid);
        let yv = k.load(Type::Scalar(elem), py);
        let values = body(k, xv, yv, n);
        assert_eq!(values.len() as u32, outputs, "{name}: outputs a thread");
        let base = k.mul_const(gid, outputs);
        for (j, v) in values.into_iter().enumerate() {
            let at = k.add_const(base, j as u32);
            let p = k.ptr_add(out, at);
            k.store(p, v);
        }
    });
    k.finish()
        .unwrap_or_else(|e| panic!("{name} verifies: {e}"))
}

/// Operands where division goes wrong first: zeros, infinities, NaNs, subnormals, the
/// largest and smallest normals, powers of two, quotients that overflow or fall below the
/// normals, and random words.
fn division_operands(n: usize, seed: u64) -> Vec<u32> {
    let special = [
        0u32,
        0x8000_0000,
        1,
        0x8000_0001,
        3,
        0x7f_ffff,
        0x40_0000,
        0x80_0000,
        0x7f7f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffff_ffff,
        0x3f80_0000,
        0x3f7f_ffff,
        0x3f80_0001,
        0x0080_0001,
        0x4b80_0000,
    ];
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let w = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let r = (w >> 32) as u32;
            // Each operand's kind drawn on its own, so that every pair of kinds meets.
            match (w >> 59) % 5 {
                0 => special[(w % special.len() as u64) as usize],
                // Powers of two: quotients exact to the last bit, rounded only where they
                // fall below the normals.
                4 => (w as u32 % 254 + 1) << 23 | r & 0x8000_0000,
                // Exponents near the ends of the range.
                1 => r & 0x807f_ffff | ((w as u32 % 24) << 23),
                2 => r & 0x807f_ffff | ((230 + w as u32 % 25) << 23),
                _ => r,
            }
        })
        .collect()
}

#[test]
fn quench_generated_f32_division_and_root_are_ieee_exact() {
    let n = 16384u32;
    let seed = quench_testkit::seed();
    let bytes = |w: Vec<u32>| w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let mut c = KernelCase {
        name: "f32_division".into(),
        shape: n.to_string(),
        kernel: f32_division(),
        launch: quench_rt::Launch::linear(n / 64, 64),
        buffers: vec![
            Buffer::input("x", bytes(division_operands(n as usize, seed))),
            Buffer::input(
                "y",
                bytes(division_operands(n as usize, seed ^ 0x9e37_79b9)),
            ),
            Buffer::output("out", (n * IEEE_OUTPUTS * 4) as usize),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(n)),
        ],
        expected: vec![],
        controls: vec![],
        bytes_moved: 0,
        flops: 0,
    };
    let want =
        quench_kernels::run_case(&mut InterpExecutor::new(), &c).expect("interpreter runs it");
    c.expected.push(Expected {
        buffer: 2,
        data: want.get(2).unwrap().to_vec(),
        elem: Scalar::F32,
        check: Check::Exact,
    });
    let k = compile_own(&c).unwrap_or_else(|| {
        panic!(
            "{}",
            quench_sass::codegen::compile_cubin(&c.kernel).unwrap_err()
        )
    });
    let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("f32_division: {e}"));
    agree(&c, &out).unwrap_or_else(|e| panic!("quench's code for {e}"));
}

/// The guard-latency check: in quench's own add_f32, the instructions from the comparison
/// to the first guarded one stalled a cycle each read its predicate long before the 13
/// cycles the hardware takes to deliver it, and the run says so at the guarded instruction.
#[test]
fn a_guard_read_too_soon_is_an_error() {
    let c = case("add_f32", "n=1003 threads=64", 1);
    let mut k = compile_own(&c).expect("quench compiles add_f32");
    let run_before = run_emu(&k, &c);
    assert!(run_before.is_ok(), "{:?}", run_before.err());
    let insts: Vec<&mut emu::Inst> = k.code.iter_mut().flatten().collect();
    let guarded = insts
        .iter()
        .position(|i| i.guard.is_some_and(|g| !g.uniform))
        .expect("add_f32 has a guarded instruction");
    let at = insts[guarded].addr;
    // From the comparison that sets the predicate on (so that no other read comes sooner).
    let writer = insts[..guarded]
        .iter()
        .rposition(|i| i.op == "ISETP")
        .expect("add_f32 compares before its guarded instruction");
    for i in insts.into_iter().take(guarded).skip(writer) {
        i.control.stall = 1;
    }
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at);
            assert!(why.starts_with("guarded by P"), "{why}");
        }
        other => panic!("expected a guard hazard at {at:#x}, got {other:?}"),
    }
}

/// The result-latency check: in quench's own rmsnorm_rows_f32, the first fixed-latency result
/// (not an `IMAD`'s) that an instruction at most three further reads, with the stalls
/// between them cut to a cycle each, is read sooner than any code reads one, and the run
/// says so at the reader.
#[test]
fn a_result_read_too_soon_is_an_error() {
    let c = case("rmsnorm_rows_f32", "rows=3 cols=256 threads=64", 1);
    let mut k = compile_own(&c).expect("quench compiles rmsnorm_rows_f32");
    let run_before = run_emu(&k, &c);
    assert!(run_before.is_ok(), "{:?}", run_before.err());
    let mut insts: Vec<&mut emu::Inst> = k.code.iter_mut().flatten().collect();
    let register = |o: &emu::Operand| match *o {
        emu::Operand::Reg {
            uniform: false, n, ..
        } if n != 255 => Some(n),
        _ => None,
    };
    let dst = |i: &emu::Inst| {
        let ops = i.operands.as_ref().ok()?;
        let fixed = i.control.write_barrier == 7 && i.op != "IMAD" && i.guard.is_none();
        fixed.then(|| ops.first().and_then(register)).flatten()
    };
    let reads = |i: &emu::Inst, n: u8| {
        i.operands
            .as_ref()
            .is_ok_and(|ops| ops.iter().skip(1).any(|o| register(o) == Some(n)))
    };
    let (writer, reader) = (0..insts.len())
        .find_map(|w| {
            let n = dst(insts[w])?;
            let r = (w + 1..insts.len().min(w + 4)).find(|&r| reads(insts[r], n))?;
            Some((w, r))
        })
        .expect("rmsnorm_rows_f32 reads a fixed-latency result within three instructions");
    let at = insts[reader].addr;
    for i in &mut insts[writer..reader] {
        i.control.stall = 1;
    }
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at, "{why}");
            assert!(why.starts_with("reads R"), "{why}");
        }
        other => panic!("expected a result hazard at {at:#x}, got {other:?}"),
    }
}

/// A value defined before a loop and read inside it through a view of its registers (a
/// pointer cast) keeps them for the whole loop: in quench's code for embed_f32 at four
/// trips of its row loop, the row's address was overwritten in the first trip, and the
/// GPU faulted in the second.
#[test]
fn values_read_in_a_loop_keep_their_registers_for_every_trip() {
    let c = case("embed_f32", "tokens=3 vocab=11 dim=1024 threads=32", 1);
    let k = compile_own(&c).expect("quench compiles embed_f32");
    let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("embed_f32: {e}"));
    agree(&c, &out).unwrap_or_else(|e| panic!("quench's code for {e}"));
}

/// quench's code for every library kernel also runs bit-exact at the shape `quench
/// check-kernels` compares on the GPU, where its family names one (the rest compare at
/// their full default sizes, minutes in the emulator): larger than the small shapes, so
/// that loops run several trips and blocks fill. (At small shapes, embed_f32's row loop ran
/// once and hid a register given back inside it, which faulted on the GPU.)
#[test]
fn quench_generated_code_runs_bit_exact_at_the_gpu_comparison_shapes() {
    let seed = quench_testkit::seed();
    let mut ran = 0;
    for spec in quench_kernels::library() {
        if spec.compare_params().is_empty() {
            continue;
        }
        let c = case(spec.name, spec.compare_params(), seed);
        let k =
            compile_own(&c).unwrap_or_else(|| panic!("quench no longer compiles {}", spec.name));
        let out = run_emu(&k, &c).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        agree(&c, &out).unwrap_or_else(|e| panic!("quench's code for {e}"));
        ran += 1;
    }
    assert!(ran > 150, "only {ran} kernels name a comparison shape");
}

/// A shuffle reads its sources late, so overwriting one before waiting for the shuffle is
/// an error however many cycles have passed: in quench's own code of reduce_sum_f32, the
/// `MOV` right after a shuffle, made to write the shuffle's last source instead of its own
/// register, stops the run there.
#[test]
fn overwriting_a_shuffle_s_source_unwaited_is_an_error() {
    let c = case("reduce_sum_f32", "rows=3 cols=324 threads=64", 1);
    let mut k = compile_own(&c).expect("the code generator compiles reduce_sum_f32");
    let mut code: Vec<&mut emu::Inst> = k.code.iter_mut().flatten().collect();
    let i = (1..code.len())
        .find(|&i| code[i - 1].op == "SHFL" && code[i].op == "MOV" && code[i].control.wait == 0)
        .expect("a MOV waiting on nothing right after a shuffle");
    let source = match code[i - 1].operands.as_ref().ok().and_then(|o| o.last()) {
        Some(&Operand::Reg { n, .. }) => n,
        other => panic!("a shuffle's last operand is a register, not {other:?}"),
    };
    let Ok(ops) = code[i].operands.as_mut() else {
        panic!("the MOV's operands decode")
    };
    let Some(Operand::Reg { n, .. }) = ops.first_mut() else {
        panic!("a MOV writes a register")
    };
    *n = source;
    let at = code[i].addr;
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at);
            assert!(why.starts_with(&format!("overwrites R{source} ")), "{why}");
        }
        other => panic!("expected a hazard at {at:#x}, got {other:?}"),
    }
}

/// A branch, `BSYNC` or `EXIT` that stalls fewer cycles than control flow takes stops the
/// run there: quench's own add_f32 with its `EXIT` stalling a cycle.
#[test]
fn control_flow_stalling_too_little_is_an_error() {
    let c = case("add_f32", "n=1003 threads=64", 1);
    let mut k = compile_own(&c).expect("the code generator compiles add_f32");
    let exit = k
        .code
        .iter_mut()
        .flatten()
        .find(|i| i.op == "EXIT")
        .expect("add_f32 ends with EXIT");
    exit.control.stall = 1;
    let at = exit.addr;
    match run_emu(&k, &c) {
        Err(EmuError::Hazard { at: a, why }) => {
            assert_eq!(a, at);
            assert!(why.starts_with("EXIT with a stall of 1:"), "{why}");
        }
        other => panic!("expected a hazard at {at:#x}, got {other:?}"),
    }
}
