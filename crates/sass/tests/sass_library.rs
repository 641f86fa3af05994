//! The library's kernels through ptxas: quench's disassembly equals nvdisasm's instruction
//! for instruction, and assembling that text gives back the same code and ABI. Fails on
//! any difference among the instructions the tables cover; prints the coverage. The same
//! for the kernels as the driver's JIT links them (ptxas -c, then nvlink), whose device
//! functions have code sections of their own: the same code in every section, the same
//! relocations and call graph as nvlink wrote; and `cuobjdump -elf` reads every cubin
//! quench writes.

mod common;

use std::collections::BTreeSet;

use common::Assembled;
use quench_sass::build::ModuleDesc;
use quench_sass::cubin::Cubin;
use quench_sass::table::Tables;
use quench_sass::tools;

/// (function, offset, type, symbol, addend) of every relocation of code, sorted.
fn code_relocs(c: &Cubin) -> Vec<(String, u64, u32, String, i64)> {
    let mut out: Vec<_> = c
        .code_functions()
        .into_iter()
        .flat_map(|k| {
            k.relocs.iter().map(|r| {
                (
                    k.name.clone(),
                    r.offset,
                    r.r_type,
                    c.symbols[r.sym as usize].name.clone(),
                    r.addend,
                )
            })
        })
        .collect();
    out.sort();
    out
}

/// The calls `.nv.callgraph` records, (caller, callee) by name.
fn call_edges(c: &Cubin) -> BTreeSet<(String, String)> {
    let Some((_, s)) = c.elf.section(".nv.callgraph") else {
        return BTreeSet::new();
    };
    s.data
        .chunks_exact(8)
        .map(|p| {
            let w = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]) as usize;
            (w(0), w(4))
        })
        .filter(|&(a, _)| a != 0)
        .map(|(a, b)| (c.symbols[a].name.clone(), c.symbols[b].name.clone()))
        .collect()
}

/// The code of every kernel and function, by name.
fn code(c: &Cubin) -> Vec<(String, Vec<u8>)> {
    c.code_functions()
        .into_iter()
        .map(|k| (k.name.clone(), c.text(k).to_vec()))
        .collect()
}

#[derive(Default)]
struct Seen {
    total: usize,
    covered: usize,
    kernels_full: usize,
    forms: BTreeSet<usize>,
    with_functions: usize,
    /// Kernels whose EIATTR_NUM_BARRIERS (a byte record) says they use barriers.
    with_barriers: usize,
    relocs: usize,
    /// Instructions the tables decode but print unlike nvdisasm: `kernel at offset: ours |
    /// nvdisasm: theirs`.
    text_differs: Vec<String>,
}

/// dis → asm → cubin for every cubin of `corpus`, checked as the module docs say.
fn round_trip(corpus: &[Assembled], tables: &Tables, cuobjdump: bool) -> Seen {
    let mut seen = Seen::default();
    for a in corpus {
        let c = Cubin::parse(&a.cubin).unwrap();
        let (ours, cov) = quench_sass::dis::disassemble(&c, tables).unwrap();
        let theirs =
            tools::listing_instructions(&tools::nvdisasm_cubin(&a.cubin, &["-c"]).unwrap());
        let mine = tools::listing_instructions(&ours);
        assert_eq!(mine.len(), theirs.len(), "{}: instruction count", a.name);
        for ((ma, mt), (ta, tt)) in mine.iter().zip(&theirs) {
            assert_eq!(ma, ta, "{}: addresses", a.name);
            if mt.starts_with(".inst") {
                continue;
            }
            if mt != tt {
                seen.text_differs
                    .push(format!("{} at {ma:#06x}: {mt} | nvdisasm: {tt}", a.name));
            }
        }
        seen.total += cov.instructions;
        seen.covered += cov.decoded;
        if cov.decoded == cov.instructions {
            seen.kernels_full += 1;
        }
        for k in c.code_functions() {
            for w in quench_sass::probe::words(c.text(k)) {
                if let Some(d) = tables.decode(w, 0) {
                    seen.forms.insert(d.form);
                }
            }
        }
        if !c.functions.is_empty() {
            seen.with_functions += 1;
        }
        seen.relocs += code_relocs(&c).len();
        assert_eq!(c.kernels.len(), 1, "{}", a.name);
        let k = &c.kernels[0];

        // dis -> asm: the same code in every section, the same ABI and relocations.
        let m =
            quench_sass::asm::assemble(&ours, tables).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        let assembled: Vec<(String, Vec<u8>)> = m
            .functions
            .iter()
            .map(|f| (f.name.clone(), f.text.clone()))
            .chain([(m.kernel.name.clone(), m.kernel.text.clone())])
            .collect();
        assert!(
            assembled == code(&c),
            "{}: reassembled code differs",
            a.name
        );
        assert_eq!(m.kernel.registers, k.registers.unwrap(), "{}", a.name);
        for (f, g) in m.functions.iter().zip(&c.functions) {
            assert_eq!(f.registers, g.registers.unwrap(), "{}: {}", a.name, f.name);
        }
        assert_eq!(m.kernel.shared_bytes, k.shared_bytes, "{}", a.name);
        assert_eq!(m.kernel.barriers, k.barriers.unwrap_or(0), "{}", a.name);
        if k.barriers.is_some_and(|b| b > 0) {
            seen.with_barriers += 1;
        }
        assert_eq!(
            m.kernel.exit_offsets, k.exit_offsets,
            "{}: exit offsets",
            a.name
        );
        let mut relocs: Vec<_> = m
            .relocs
            .iter()
            .map(|r| {
                (
                    r.function.clone(),
                    r.offset,
                    r.r_type,
                    r.symbol.clone(),
                    r.addend,
                )
            })
            .collect();
        relocs.sort();
        assert_eq!(relocs, code_relocs(&c), "{}: relocations", a.name);

        // asm -> cubin: read back, the same again, and the calls nvlink recorded.
        let bytes =
            quench_sass::build::build_module(&m).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        let built = Cubin::parse(&bytes).unwrap();
        assert!(code(&built) == code(&c), "{}: written code differs", a.name);
        assert_eq!(
            code_relocs(&built),
            code_relocs(&c),
            "{}: written relocations",
            a.name
        );
        assert_eq!(call_edges(&built), call_edges(&c), "{}: call graph", a.name);
        let offs = |k: &quench_sass::cubin::Kernel| {
            k.params
                .iter()
                .map(|p| (p.offset, p.size, p.log_align, p.space))
                .collect::<Vec<_>>()
        };
        assert_eq!(offs(&built.kernels[0]), offs(k), "{}: parameters", a.name);
        assert_eq!(
            built.kernels[0].barriers, k.barriers,
            "{}: barriers",
            a.name
        );
        assert_eq!(
            ModuleDesc::from_cubin(&built, &built.kernels[0]).unwrap(),
            m,
            "{}: the written cubin describes what was assembled",
            a.name
        );
        // nvdisasm reads the written file as it reads NVIDIA's: every instruction, call
        // target and relocated operand the same.
        let again = tools::listing_instructions(&tools::nvdisasm_cubin(&bytes, &["-c"]).unwrap());
        assert!(
            again == theirs,
            "{}: nvdisasm reads the written cubin differently",
            a.name
        );
        if cuobjdump {
            if let Some(Err(e)) = common::cuobjdump_elf(&bytes) {
                panic!("{}: cuobjdump -elf refuses quench's cubin: {e}", a.name);
            }
        }
    }
    seen
}

#[test]
fn library_kernels_disassemble_as_nvdisasm_and_reassemble_bit_for_bit() {
    let Some(lib) = common::library() else { return };
    let Some(_) = quench_testkit::ok(tools::find("nvdisasm")) else {
        return;
    };
    let tables = Tables::sm90().expect("the shipped tables load");
    let cuobjdump = quench_testkit::ok(tools::find("cuobjdump")).is_some();
    let seen = round_trip(lib, tables, cuobjdump);
    assert!(
        seen.text_differs.is_empty(),
        "printed unlike nvdisasm:\n{}",
        seen.text_differs.join("\n")
    );
    let opcodes: BTreeSet<&str> = seen
        .forms
        .iter()
        .map(|&f| {
            tables.forms[f]
                .form
                .template
                .split(['.', ' '])
                .next()
                .unwrap_or("")
        })
        .collect();
    eprintln!(
        "sass coverage: {}/{} kernels whole, {}/{} instructions equal to nvdisasm and reassembled; {} forms, {} opcodes",
        seen.kernels_full,
        lib.len(),
        seen.covered,
        seen.total,
        seen.forms.len(),
        opcodes.len()
    );
    assert!(seen.covered > 0);
    // ptxas records barriers in a byte record: the reader must see them (it once did not).
    assert!(seen.with_barriers > 0, "no kernel reads as using barriers");
}

#[test]
fn linked_kernels_reassemble_with_their_device_functions_and_relocations() {
    let Some(linked) = common::linked() else {
        return;
    };
    let Some(_) = quench_testkit::ok(tools::find("nvdisasm")) else {
        return;
    };
    let tables = Tables::sm90().expect("the shipped tables load");
    let cuobjdump = quench_testkit::ok(tools::find("cuobjdump")).is_some();
    let seen = round_trip(linked, tables, cuobjdump);
    // The linker's code has a few encodings ptxas's whole-program code (the probe's corpus)
    // never showed, which the tables decode under a more general form: `IMAD.U32` where
    // nvdisasm prints a power-of-two multiplier as `IMAD.SHL.U32`, `[UR4+0x0]` for `[UR4]`.
    // They reassemble to the same bits (checked above); the text is reported, not failed.
    eprintln!(
        "linked: {} of {} cubins hold device functions ({} relocations), all reassembled with the same code and relocations; {}/{} instructions decoded, {} printed unlike nvdisasm:\n{}",
        seen.with_functions,
        linked.len(),
        seen.relocs,
        seen.covered,
        seen.total,
        seen.text_differs.len(),
        seen.text_differs.join("\n")
    );
    // The slow paths of division and square root: more than a few kernels call them.
    assert!(seen.with_functions > 0 && seen.relocs > 0);
}

#[test]
fn bad_assembly_is_refused_with_line_and_column() {
    let tables = Tables::sm90().expect("the shipped tables load");
    let head = ".kernel k\n.registers 8\n";
    let cases = [
        ("        FROB R1, R2 ;\n", "line 3, column 9"),
        ("        IADD3 R1, R2, R3, R4, R5, R6 ;\n", "line 3"),
        ("        EXIT ;  /* B------:R-:W-:Y:S99 */\n", "stall"),
        ("        BRA `(.L_x_9) ;\n", "undefined label"),
        ("        @P9 EXIT ;\n", "line 3"),
        (
            "        IMAD.MOV.U32 R1, RZ, RZ, 0x100000000 ;\n",
            "does not fit",
        ),
        // Relocations: an unknown type, a symbol that is no function, a label outside the
        // symbol's code, an operand relocation where no 32-bit immediate is, a dangling
        // `.reloc`.
        (
            "        .reloc R_CUDA_NOPE k\n        EXIT ;\n",
            "line 3, column 9: unknown relocation type",
        ),
        (
            "        MOV R20, 32@lo(nobody) ;\n        EXIT ;\n",
            "line 3, column 18: relocation names nobody",
        ),
        (
            "        MOV R20, 32@lo((k + .L_x_0@srel)) ;\n        EXIT ;\n",
            "label .L_x_0 is not in the code of k",
        ),
        (
            "        LDG.E.64 R4, desc[UR4][R4.64+32@hi(k)] ;\n        EXIT ;\n",
            "line 3, column 38: a relocated operand needs a 32-bit immediate at bit 32",
        ),
        (
            "        EXIT ;\n        .reloc R_CUDA_ABS55_16_34 k\n",
            "line 4, column 9: a .reloc with no instruction",
        ),
        ("        MOV R20, 32@lo((k + x)) ;\n", "line 3, column 24"),
        (
            ".param 8 8 0 0\n.function f\n.param 8 8 0 0\n",
            "line 5, column 1: .param belongs to a .kernel",
        ),
    ];
    for (body, want) in cases {
        let e = quench_sass::asm::assemble(&format!("{head}{body}"), tables)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{body:?}: {e}");
    }
    // Code before any header, and a function without a kernel.
    let e = quench_sass::asm::assemble("        EXIT ;\n", tables)
        .unwrap_err()
        .to_string();
    assert!(e.contains("before .kernel or .function"), "{e}");
    let e = quench_sass::asm::assemble(".function f\n.registers 8\n        EXIT ;\n", tables)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no .kernel"), "{e}");
}

/// A kernel that calls a function through the three relocations nvlink writes for a call:
/// the return address in two MOVs and the CALL.ABS target (not in the tables, so `.inst`
/// with a `.reloc` line).
const CALL: &str = "\
.function f
.registers 24
f:
        /*0000*/ .inst 0x001fea0003e000000000000014007950 ;
.kernel k
.registers 30
.param 8 8 0 0
k:
        /*0000*/ MOV R20, 32@lo((k + .L_x_0@srel)) ;
        /*0010*/ MOV R21, 32@hi((k + .L_x_0@srel)) ;
        .reloc R_CUDA_ABS55_16_34 f
        /*0020*/ .inst 0x000fea0003c000000000000000007943 ;
.L_x_0:
        /*0030*/ EXIT ;
";

#[test]
fn a_call_between_sections_reads_and_writes_as_nvlink_writes_it() {
    let tables = Tables::sm90().expect("the shipped tables load");
    let m = quench_sass::asm::assemble(CALL, tables).unwrap();
    let bytes = quench_sass::build::build_module(&m).unwrap();
    let c = Cubin::parse(&bytes).unwrap();
    assert_eq!(c.kernels.len(), 1);
    assert_eq!(c.functions.len(), 1);
    assert_eq!(
        code_relocs(&c),
        [
            ("k".to_string(), 0x00, 0x38, "k".to_string(), 0x30),
            ("k".to_string(), 0x10, 0x39, "k".to_string(), 0x30),
            ("k".to_string(), 0x20, 0x4b, "f".to_string(), 0),
        ]
    );
    assert_eq!(
        call_edges(&c),
        BTreeSet::from([("k".to_string(), "f".to_string())])
    );
    // The function's code comes first, as nvlink lays it out, and dis prints it back.
    assert!(c.functions[0].text_section < c.kernels[0].text_section);
    let (again, _) = quench_sass::dis::disassemble(&c, tables).unwrap();
    assert!(again.contains(".function f\n.registers 24\n"), "{again}");
    assert!(
        again.contains("MOV R20, 32@lo((k + .L_x_0@srel))"),
        "{again}"
    );
    assert!(again.contains(".reloc R_CUDA_ABS55_16_34 f\n"), "{again}");
    assert_eq!(quench_sass::asm::assemble(&again, tables).unwrap(), m);
    if let Some(Err(e)) = common::cuobjdump_elf(&bytes) {
        panic!("cuobjdump -elf refuses the cubin: {e}");
    }
}

#[test]
fn damaged_calls_are_errors_not_panics() {
    // Every line of the call cut short at every byte, dropped, or doubled: the assembler
    // answers each with a cubin or an error, and a cubin it writes reads back.
    let tables = Tables::sm90().expect("the shipped tables load");
    let lines: Vec<&str> = CALL.lines().collect();
    let mut texts = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let with = |l: Option<String>| {
            let mut t: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            match l {
                Some(l) => t[i] = l,
                None => {
                    t.remove(i);
                }
            }
            t.join("\n")
        };
        for cut in (0..line.len()).filter(|&c| line.is_char_boundary(c)) {
            texts.push(with(Some(line[..cut].to_string())));
        }
        texts.push(with(None));
        texts.push(with(Some(format!("{line}\n{line}"))));
    }
    let mut refused = 0;
    for t in &texts {
        match quench_sass::asm::assemble_cubin(t, tables) {
            Ok(bytes) => {
                let c = Cubin::parse(&bytes).unwrap_or_else(|e| panic!("{t}\n{e}"));
                quench_sass::dis::disassemble(&c, tables).unwrap();
            }
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0);
}
