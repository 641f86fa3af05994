//! The machine-code readers: the cubin reader (`quench_sass::cubin::Cubin::parse`, then
//! every kernel's ABI, its disassembly and the file written back) and the SASS assembler
//! (`quench_sass::asm::assemble_cubin`, then the cubin it wrote read and disassembled
//! again). Seeds are cubins quench's own writer builds around real instructions — each
//! form of the sm_90 tables with its operand fields zero — and their disassembly, so no
//! NVIDIA tool is needed.

use quench_sass::build::{build, KernelDesc, Param};
use quench_sass::cubin::Cubin;
use quench_sass::table::Tables;

use crate::Target;

/// Instructions per seed kernel (the tables' forms are spread over the seeds).
const PER_KERNEL: usize = 24;

pub fn cubin_target() -> Target {
    Target {
        name: "cubin",
        about: "the cubin reader (quench_sass::cubin) over cubins of quench's writer, then every kernel's ABI, disassembly and the file written back",
        seeds: cubin_seeds,
        dict: &[
            b"\x7fELF",
            b".nv.info",
            b".text.",
            b".nv.constant0.",
            b"\x04\x17\x0c\x00",
            b"\x04\x0a\x08\x00",
            b"\xff\xff\xff\xff",
            b"\x00\x00\x00\x80",
        ],
        format: crate::Format::Binary,
        run: run_cubin,
    }
}

pub fn sass_target() -> Target {
    Target {
        name: "sass",
        about: "the SASS assembler (quench_sass::asm) over the disassembly of those cubins, then the cubin it writes read and disassembled again",
        seeds: sass_seeds,
        dict: &[
            b".kernel ",
            b".registers ",
            b".shared ",
            b".param 8 8 2 4\n",
            b".inst 0x",
            b"/*0000*/",
            b" ;  /* B------:R-:W-:-:S01 */",
            b"@!PT ",
            b"R255",
            b"UR63",
            b"c[0x0][0x210]",
            b"desc[UR4][R2.64]",
            b"0xffffffff",
        ],
        format: crate::Format::Text,
        run: run_sass,
    }
}

fn tables() -> &'static Tables {
    Tables::sm90().expect("the tables shipped with quench")
}

/// Each form's fixed bits: an instruction of that form with every field zero.
fn words(t: &Tables) -> Vec<u128> {
    t.forms.iter().map(|f| f.value).collect()
}

fn cubin_seeds() -> Vec<Vec<u8>> {
    let words = words(tables());
    words
        .chunks(PER_KERNEL)
        .enumerate()
        .filter_map(|(i, chunk)| {
            let text: Vec<u8> = chunk.iter().flat_map(|w| w.to_le_bytes()).collect();
            let desc = KernelDesc {
                name: format!("seed_{i}"),
                text,
                params: vec![Param::pointer(), Param::scalar(4)],
                registers: 32,
                shared_bytes: if i % 2 == 0 { 0 } else { 4096 },
                frame_bytes: 0,
                barriers: (i % 3) as u16,
                exit_offsets: vec![0],
                max_threads: (i % 4 == 0).then_some([128, 1, 1]),
                subroutines: Vec::new(),
            };
            build(&desc).ok()
        })
        .collect()
}

fn sass_seeds() -> Vec<Vec<u8>> {
    cubin_seeds()
        .iter()
        .filter_map(|bytes| {
            let c = Cubin::parse(bytes).ok()?;
            quench_sass::dis::disassemble(&c, tables())
                .ok()
                .map(|(text, _)| text.into_bytes())
        })
        .collect()
}

fn run_cubin(bytes: &[u8]) -> Result<(), String> {
    let c = Cubin::parse(bytes).map_err(|e| e.to_string())?;
    for k in &c.kernels {
        KernelDesc::from_cubin(&c, k).map_err(|e| e.to_string())?;
    }
    quench_sass::dis::disassemble(&c, tables()).map_err(|e| e.to_string())?;
    let again = c.write().map_err(|e| e.to_string())?;
    Cubin::parse(&again).map_err(|e| format!("the file written back does not read: {e}"))?;
    Ok(())
}

fn run_sass(bytes: &[u8]) -> Result<(), String> {
    let text = super::text(bytes)?;
    let cubin = quench_sass::asm::assemble_cubin(text, tables()).map_err(|e| e.to_string())?;
    let c = Cubin::parse(&cubin)
        .unwrap_or_else(|e| panic!("the assembler wrote a cubin its reader refuses: {e}"));
    quench_sass::dis::disassemble(&c, tables()).map_err(|e| e.to_string())?;
    Ok(())
}
