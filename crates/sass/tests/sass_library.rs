//! The library's kernels through ptxas: quench's disassembly equals nvdisasm's instruction
//! for instruction, and assembling that text gives back the same code and ABI. Fails on
//! any difference among the instructions the tables cover; prints the coverage.

mod common;

use std::collections::BTreeSet;

use quench_sass::cubin::Cubin;
use quench_sass::table::Tables;
use quench_sass::tools;

#[test]
fn library_kernels_disassemble_as_nvdisasm_and_reassemble_bit_for_bit() {
    let Some(lib) = common::library() else { return };
    let Some(_) = quench_testkit::ok(tools::find("nvdisasm")) else {
        return;
    };
    let tables = Tables::sm90().expect("the shipped tables load");
    let (mut total, mut covered, mut kernels_full) = (0usize, 0usize, 0usize);
    let mut forms = BTreeSet::new();
    for a in lib {
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
            assert_eq!(mt, tt, "{} at {ma:#06x}", a.name);
        }
        total += cov.instructions;
        covered += cov.decoded;
        if cov.decoded == cov.instructions {
            kernels_full += 1;
        }
        let k = &c.kernels[0];
        for w in quench_sass::probe::words(c.text(k)) {
            if let Some(d) = tables.decode(w, 0) {
                forms.insert(d.form);
            }
        }
        // dis -> asm: the same code, the same ABI.
        let desc =
            quench_sass::asm::assemble(&ours, tables).unwrap_or_else(|e| panic!("{}: {e}", a.name));
        assert!(
            desc.text == c.text(k),
            "{}: reassembled code differs",
            a.name
        );
        assert_eq!(desc.registers, k.registers.unwrap(), "{}", a.name);
        assert_eq!(desc.shared_bytes, k.shared_bytes, "{}", a.name);
        assert_eq!(
            desc.exit_offsets, k.exit_offsets,
            "{}: exit offsets",
            a.name
        );
        let built = Cubin::parse(&quench_sass::build::build(&desc).unwrap()).unwrap();
        let offs = |k: &quench_sass::cubin::Kernel| {
            k.params
                .iter()
                .map(|p| (p.offset, p.size, p.log_align, p.space))
                .collect::<Vec<_>>()
        };
        assert_eq!(offs(&built.kernels[0]), offs(k), "{}: parameters", a.name);
    }
    let opcodes: BTreeSet<&str> = forms
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
        "sass coverage: {kernels_full}/{} kernels whole, {covered}/{total} instructions equal to nvdisasm and reassembled; {} forms, {} opcodes",
        lib.len(),
        forms.len(),
        opcodes.len()
    );
    assert!(covered > 0);
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
    ];
    for (body, want) in cases {
        let e = quench_sass::asm::assemble(&format!("{head}{body}"), tables)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{body:?}: {e}");
    }
}
