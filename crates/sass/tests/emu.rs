//! The SASS emulator against the IR interpreter: library kernels through quench's PTX
//! and ptxas, run from their machine code in the emulator and as IR in the interpreter
//! on the same fresh random inputs, with outputs poisoned before each run; every output
//! byte must agree, and must match the kernel's own reference. Controls: a kernel with a
//! deliberately wrong instruction, or a store removed, must fail that comparison; an
//! instruction the emulator does not model is refused by name and address.

use quench_kernels::case::POISON;
use quench_kernels::{CaseArg, CaseOutputs, KernelCase};
use quench_rt::{Arg, InterpExecutor};
use quench_sass::cubin::Cubin;
use quench_sass::emu::{self, EmuError, Global, Kernel, Launch};
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
        .find(|i| i.op == "FADD")
        .expect("add_f32 has an FADD");
    fadd.op = "FMUL".into();
    let out = run_emu(&wrong, &c).expect("runs");
    assert!(agree(&c, &out).is_err(), "FMUL for FADD went unnoticed");

    let mut no_store = k.clone();
    for i in no_store.code.iter_mut().filter(|i| i.op == "STG") {
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
    assert_eq!(k.code[(*at / 16) as usize].mnemonic(), *mnemonic);
    assert!(e
        .to_string()
        .contains(&format!("does not model {mnemonic} at {at:#x}")));
}
