//! The IR text parser: every kernel of the library printed, then mutated. What parses is
//! verified and must print and re-parse to the same text (the printer and parser agree).

use quench_kernels::library;

use crate::Target;

/// Kernels whose text is longer than this are left out of the seeds: a mutant costs time
/// in proportion to its length, and the short ones cover the grammar.
const MAX_SEED_BYTES: usize = 24 << 10;

pub fn target() -> Target {
    Target {
        name: "ir",
        about: "the IR text parser (quench_ir::parse) over the kernel library's printed IR, then verify and print/parse round trip",
        seeds,
        dict: &[
            b"kernel ",
            b"for ",
            b"if ",
            b"else ",
            b"yield ",
            b"%4294967295",
            b"%0",
            b": f32",
            b": ptr<global, f16>",
            b"{",
            b"}",
            b"(",
            b")",
            b"0x7fc00000",
            b"\"",
            b"mma.sync",
            b"shared ",
        ],
        format: crate::Format::Text,
        run,
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = library()
        .iter()
        .filter_map(|spec| spec.build(&spec.default_params()).ok())
        .map(|f| quench_ir::print(&f).into_bytes())
        .filter(|text| text.len() <= MAX_SEED_BYTES)
        .collect();
    seeds.sort();
    seeds.dedup();
    seeds
}

fn run(bytes: &[u8]) -> Result<(), String> {
    let f = quench_ir::parse(super::text(bytes)?).map_err(|e| e.to_string())?;
    let verified = quench_ir::verify(&f).map_err(|e| e.to_string());
    let printed = quench_ir::print(&f);
    match quench_ir::parse(&printed) {
        Ok(again) => assert_eq!(
            quench_ir::print(&again),
            printed,
            "printing what parsed and parsing it again changed the kernel"
        ),
        Err(e) => panic!("the printed form of what parsed does not parse: {e}\n{printed}"),
    }
    verified
}
