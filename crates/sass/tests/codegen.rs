//! quench's own code generator (IR → sm_90 SASS): which library kernels it compiles, that
//! what it writes assembles into cubins nvdisasm reads, with the ABI ptxas gives the same
//! kernel, and that the rest is refused by name.

mod common;

use quench_sass::codegen;
use quench_sass::cubin::Cubin;

/// Every library kernel with its default parameters, and what the code generator says.
fn compiled() -> Vec<(String, quench_sass::Result<Vec<u8>>)> {
    quench_kernels::library()
        .into_iter()
        .map(|spec| {
            let params = spec.parse_params("").expect("defaults parse");
            let f = spec.build(&params).expect("library kernel builds");
            (spec.name.to_string(), codegen::compile_cubin(&f))
        })
        .collect()
}

#[test]
fn elementwise_kernels_compile_and_the_rest_are_refused_by_name() {
    let all = compiled();
    let ok: Vec<&str> = all
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| n.as_str())
        .collect();
    // gemm_bf16 fits the registers only with its loop's accumulators and fragments
    // updated in place.
    for name in [
        "add_f32",
        "gemv_tc_bf16_xf32",
        "gemm_q5_k",
        "attention_prefill_bf16",
        "gemm_bf16",
    ] {
        assert!(ok.contains(&name), "{name} compiles: {ok:?}");
    }
    for (name, r) in &all {
        if let Err(e) = r {
            let e = e.to_string();
            assert!(
                e.starts_with(&format!("kernel {name}: ")) && e.contains("not compiled yet")
                    || e.contains("no selection rule")
                    || e.contains("needs more than")
                    || e.contains("no encoding yet"),
                "{name}: the refusal names the kernel and what stops it: {e}"
            );
        }
    }
    eprintln!(
        "codegen: {} of {} library kernels compile to quench's own SASS: {ok:?}",
        ok.len(),
        all.len()
    );
    let mut why = std::collections::BTreeMap::new();
    for (_, r) in &all {
        if let Err(e) = r {
            let e = e.to_string();
            let reason = e.split_once(": ").map_or(e.clone(), |(_, r)| r.to_string());
            // Grouped by what stops them, not where.
            let reason = reason.split(" (at `").next().unwrap_or("").to_string();
            *why.entry(reason).or_insert(0) += 1;
        }
    }
    for (reason, n) in why {
        eprintln!("codegen: {n:4} refused: {reason}");
    }
}

#[test]
fn compiled_cubins_have_ptxas_abi_and_nvdisasm_reads_them() {
    let Some(lib) = common::library() else { return };
    for (name, r) in compiled() {
        let Ok(ours) = r else { continue };
        let c = Cubin::parse(&ours).unwrap_or_else(|e| panic!("{name}: {e}"));
        let theirs = lib.iter().find(|a| a.name == name).expect("in the corpus");
        let t = Cubin::parse(&theirs.cubin).unwrap();
        let (k, tk) = (&c.kernels[0], &t.kernels[0]);
        assert_eq!(k.name, tk.name);
        assert_eq!(
            k.params, tk.params,
            "{name}: parameters as ptxas lays them out"
        );
        assert_eq!(
            k.param_bytes, tk.param_bytes,
            "{name}: the parameter block's size"
        );
        assert!(!k.exit_offsets.is_empty(), "{name}: an EXIT is recorded");
        let Some(text) = quench_testkit::ok(quench_sass::tools::nvdisasm_cubin(&ours, &["-c"]))
        else {
            return;
        };
        let listing = quench_sass::tools::listing_instructions(&text);
        assert!(
            listing.iter().any(|(_, l)| l.contains("EXIT")),
            "{name}: nvdisasm reads the code: {text}"
        );
    }
}

/// Results whose latency varies reach their readers through a scoreboard, as in ptxas's
/// code: every opcode ptxas gives a write scoreboard in most of its instances across the
/// library (loads, constant loads, special registers, `MUFU`, shuffles, atomics) sets one
/// in each instance quench's code generator writes. (A shuffle read after a fixed stall
/// reads whatever the register held before.)
#[test]
fn variable_latency_results_wait_on_a_scoreboard_as_in_ptxas_code() {
    let Some(lib) = common::library() else { return };
    let tables = quench_sass::table::Tables::sm90().expect("tables load");
    let decoded = |cubin: &[u8]| -> Vec<quench_sass::emu::Inst> {
        let c = Cubin::parse(cubin).expect("cubin parses");
        c.kernels
            .iter()
            .flat_map(|k| quench_sass::emu::decode_all(c.text(k), tables).expect("decodes"))
            .flatten()
            .collect()
    };
    // Per opcode: instances with a write scoreboard, and all instances.
    let mut theirs: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for a in lib {
        for i in decoded(&a.cubin) {
            let e = theirs.entry(i.op.clone()).or_default();
            e.0 += usize::from(i.control.write_barrier < 6);
            e.1 += 1;
        }
    }
    let variable: Vec<&String> = theirs
        .iter()
        .filter(|(_, (with, all))| 2 * with > *all)
        .map(|(op, _)| op)
        .collect();
    for needed in ["LDG", "S2R", "SHFL", "MUFU"] {
        assert!(
            variable.iter().any(|op| *op == needed),
            "ptxas scoreboards {needed}: {theirs:?}"
        );
    }
    let mut checked = 0;
    for (name, r) in compiled() {
        let Ok(ours) = r else { continue };
        for i in decoded(&ours) {
            if variable.contains(&&i.op) {
                checked += 1;
                assert!(
                    i.control.write_barrier < 6,
                    "{name}: {} at {:#x} sets no scoreboard, as ptxas's {} do",
                    i.text,
                    i.addr,
                    i.op
                );
            }
        }
    }
    assert!(
        checked > 0,
        "no instruction of {variable:?} in quench's code"
    );
}

/// The highest general register `code` names (an address pair counts both), if any.
fn highest_register(code: &[quench_sass::emu::Inst]) -> Option<u32> {
    use quench_sass::emu::Operand;
    code.iter()
        .filter_map(|i| i.operands.as_ref().ok())
        .flatten()
        .filter_map(|o| match *o {
            Operand::Reg {
                uniform: false, n, ..
            }
            | Operand::Half { n, .. } => Some(u32::from(n)),
            Operand::Mem {
                reg: Some(n),
                uniform: false,
                wide,
                ..
            } => Some(u32::from(n) + u32::from(wide)),
            _ => None,
        })
        .filter(|&n| n != 255)
        .max()
}

/// A cubin's register count holds two registers past the highest its code names, as
/// every ptxas cubin of the library does (22 for code naming R0–R19): quench's too.
#[test]
fn register_counts_hold_the_two_registers_ptxas_reserves() {
    let Some(lib) = common::library() else { return };
    let tables = quench_sass::table::Tables::sm90().expect("tables load");
    let margin = |name: &str, cubin: &[u8]| -> Option<i64> {
        let c = Cubin::parse(cubin).expect("cubin parses");
        let k = c.kernels.iter().find(|k| k.name == name)?;
        let code: Vec<_> = quench_sass::emu::decode_all(c.text(k), tables)
            .expect("decodes")
            .into_iter()
            .flatten()
            .collect();
        let count = k.registers.expect("EIATTR_REGCOUNT");
        Some(i64::from(count) - i64::from(highest_register(&code)?) - 1)
    };
    for a in lib {
        if let Some(m) = margin(&a.name, &a.cubin) {
            assert!(
                m >= 2,
                "ptxas's {}: {m} registers past the named ones",
                a.name
            );
        }
    }
    let mut checked = 0;
    for (name, r) in compiled() {
        let Ok(ours) = r else { continue };
        let m = margin(&name, &ours).expect("quench's code names registers");
        assert!(m >= 2, "{name}: {m} registers past the named ones");
        checked += 1;
    }
    assert!(checked > 100, "only {checked} kernels compiled");
}
