//! `quench sass dis`: a cubin's code as SASS text in nvdisasm's syntax, each instruction
//! followed by its control bits, each kernel headed by its ABI, so that [`crate::asm`]
//! can assemble the text back into the same code.
//!
//! ```text
//! .kernel add_f32
//! .registers 22
//! .param 8 8 2 4
//! add_f32:
//!         /*0000*/                   LDC R1, c[0x0][0x28] ;  /* B------:R-:W-:-:S01 */
//! ```
//!
//! A device function with a code section of its own (what the driver's JIT makes of the
//! slow paths of division and square root) is headed by `.function NAME` and its register
//! count; its callers reach it through relocations, printed as [`crate::reloc`] describes.
//! Functions come in section order, as nvdisasm lists them.

use std::collections::HashMap;
use std::fmt::Write;

use crate::cubin::{self, Cubin, Kernel, Reloc, STT_FUNC};
use crate::error::{Result, SassError};
use crate::probe::words;
use crate::reloc::{self, Addend, Expr};
use crate::syntax::Kind;
use crate::table::{Control, Decoded, Tables};

/// How much of a listing the tables decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub instructions: usize,
    pub decoded: usize,
}

/// One code section being listed.
struct Unit<'a> {
    k: &'a Kernel,
    words: Vec<u128>,
    decoded: Vec<Option<Decoded>>,
    /// Function symbols at code addresses of this section (the function, subroutines).
    names: HashMap<u64, String>,
    /// Labels at code addresses of this section.
    labels: HashMap<u64, String>,
}

/// The listing of every kernel and device function of `cubin`.
pub fn disassemble(cubin: &Cubin, tables: &Tables) -> Result<(String, Coverage)> {
    let mut units: Vec<Unit> = cubin
        .code_functions()
        .into_iter()
        .map(|k| {
            let ws = words(cubin.text(k));
            let decoded = ws
                .iter()
                .enumerate()
                .map(|(i, &w)| tables.decode(w, (i * 16) as u64))
                .collect();
            let names = cubin
                .symbols
                .iter()
                .filter(|s| s.kind() == STT_FUNC && usize::from(s.shndx) == k.text_section)
                .map(|s| (s.value, s.name.clone()))
                .collect();
            Unit {
                k,
                words: ws,
                decoded,
                names,
                labels: HashMap::new(),
            }
        })
        .collect();
    // Labels as nvdisasm numbers them: first the code addresses relocations add to a
    // symbol (return addresses), then each section's branch targets in order of first
    // reference, then one past each section's last instruction (printed by nvdisasm,
    // not here, but counted).
    let mut next = 0usize;
    let mut new_label = || {
        next += 1;
        format!(".L_x_{}", next - 1)
    };
    for u in 0..units.len() {
        for r in &units[u].k.relocs {
            if let Some((t, addr)) = addend_target(cubin, &units, r) {
                let unit = &units[t];
                if !unit.names.contains_key(&addr) && !unit.labels.contains_key(&addr) {
                    let l = new_label();
                    units[t].labels.insert(addr, l);
                }
            }
        }
    }
    for unit in &mut units {
        for d in unit.decoded.iter().flatten() {
            for h in &d.holes {
                let t = h.value as u64;
                if h.kind == Kind::Label
                    && !unit.names.contains_key(&t)
                    && !unit.labels.contains_key(&t)
                {
                    let l = new_label();
                    unit.labels.insert(t, l);
                }
            }
        }
    }
    let mut out = String::new();
    let mut cov = Coverage::default();
    for u in 0..units.len() {
        header(&mut out, units[u].k);
        listing(&mut out, cubin, &units, u, tables, &mut cov)?;
    }
    Ok((out, cov))
}

/// The unit and code address a relocation's addend names, when its symbol is a function
/// at the start of a code section and the addend is an instruction of that section.
fn addend_target(c: &Cubin, units: &[Unit], r: &Reloc) -> Option<(usize, u64)> {
    let s = c.symbols.get(r.sym as usize)?;
    let t = units
        .iter()
        .position(|u| usize::from(s.shndx) == u.k.text_section)?;
    let addr = u64::try_from(r.addend).ok()?;
    (s.kind() == STT_FUNC
        && s.value == 0
        && addr > 0
        && addr % 16 == 0
        && addr < units[t].words.len() as u64 * 16)
        .then_some((t, addr))
}

/// The `.kernel` or `.function` header: name and ABI.
fn header(out: &mut String, k: &Kernel) {
    if !k.entry {
        let _ = writeln!(out, ".function {}", k.name);
        let _ = writeln!(out, ".registers {}", k.registers.unwrap_or(0));
        return;
    }
    let _ = writeln!(out, ".kernel {}", k.name);
    let _ = writeln!(out, ".registers {}", k.registers.unwrap_or(0));
    if k.shared_bytes > 0 {
        let _ = writeln!(out, ".shared {}", k.shared_bytes);
    }
    if let Some(f) = k.frame_size.filter(|&f| f > 0) {
        let _ = writeln!(out, ".frame {f}");
    }
    if let Some(b) = k.barriers.filter(|&b| b > 0) {
        let _ = writeln!(out, ".barriers {b}");
    }
    if let Some(a) = k
        .info
        .iter()
        .find(|a| a.attr == crate::nvinfo::EIATTR_MAX_THREADS)
    {
        let v: Vec<String> = (0..3)
            .map(|i| a.u32_at(i).unwrap_or(1).to_string())
            .collect();
        let _ = writeln!(out, ".maxntid {}", v.join(" "));
    }
    for p in &k.params {
        let _ = writeln!(
            out,
            ".param {} {} {} {}",
            p.size,
            p.size.clamp(1, 8),
            p.log_align,
            p.space
        );
    }
}

/// The expression of relocation `r`: its symbol, plus a label where its addend is one.
fn expr(c: &Cubin, units: &[Unit], r: &Reloc, what: &str) -> Result<Expr> {
    let s = c.symbols.get(r.sym as usize).ok_or_else(|| {
        SassError::malformed(
            what,
            format!(
                "relocation at {:#x} names symbol {}, which does not exist",
                r.offset, r.sym
            ),
        )
    })?;
    let label = addend_target(c, units, r).and_then(|(t, a)| units[t].labels.get(&a));
    Ok(Expr {
        symbol: s.name.clone(),
        addend: match label {
            Some(l) => Addend::Label(l.clone()),
            None => Addend::Number(r.addend),
        },
    })
}

/// The instructions of unit `u`, with its labels and relocations.
fn listing(
    out: &mut String,
    c: &Cubin,
    units: &[Unit],
    u: usize,
    tables: &Tables,
    cov: &mut Coverage,
) -> Result<()> {
    let unit = &units[u];
    let what = format!("section .rela.text.{}", unit.k.name);
    // Relocations by the instruction they patch.
    let mut relocs: HashMap<u64, Vec<&Reloc>> = HashMap::new();
    for r in &unit.k.relocs {
        if r.offset % 16 != 0 || r.offset >= unit.words.len() as u64 * 16 {
            return Err(SassError::malformed(
                &what,
                format!(
                    "relocation at {:#x} is not at an instruction of the code",
                    r.offset
                ),
            ));
        }
        relocs.entry(r.offset).or_default().push(r);
    }
    for (i, (&w, d)) in unit.words.iter().zip(&unit.decoded).enumerate() {
        let addr = (i * 16) as u64;
        if let Some(n) = unit.names.get(&addr) {
            let _ = writeln!(out, "{n}:");
        }
        if let Some(l) = unit.labels.get(&addr) {
            let _ = writeln!(out, "{l}:");
        }
        // Relocated operands print in the instruction, as nvdisasm prints them; the
        // others as `.reloc` lines before it.
        let mut operands: HashMap<usize, String> = HashMap::new();
        for r in relocs.get(&addr).into_iter().flatten() {
            let e = expr(c, units, r, &what)?;
            let hole = d.as_ref().and_then(|d| {
                let prefix = reloc::operand_prefix(r.r_type)?;
                let form = &tables.forms[d.form].form;
                let k = form.fields.iter().zip(&d.holes).position(|(f, h)| {
                    f.kind == Kind::X && f.runs == reloc::OPERAND_RUNS && h.value == 0
                })?;
                Some((k, format!("{prefix}({})", e.text())))
            });
            match hole {
                Some((k, text)) if !operands.contains_key(&k) => {
                    operands.insert(k, text);
                }
                _ => {
                    let t = cubin::reloc_name(r.r_type)
                        .map_or_else(|| format!("{:#x}", r.r_type), str::to_string);
                    let _ = writeln!(out, "        .reloc {t} {}", e.text());
                }
            }
        }
        cov.instructions += 1;
        match d {
            Some(d) => {
                cov.decoded += 1;
                let targets: Vec<String> = d
                    .holes
                    .iter()
                    .filter(|h| h.kind == Kind::Label)
                    .map(|h| {
                        let t = h.value as u64;
                        unit.names
                            .get(&t)
                            .or_else(|| unit.labels.get(&t))
                            .cloned()
                            .unwrap_or_else(|| format!("{t:#x}"))
                    })
                    .collect();
                let text = tables.render_with(d, &targets, &|k| operands.get(&k).cloned());
                let (guard, rest) = match text.split_once(' ') {
                    Some((g, r)) if g.starts_with('@') => (g, r),
                    _ => ("", text.as_str()),
                };
                let _ = writeln!(
                    out,
                    "        /*{addr:04x}*/ {guard:>18} {rest} ;  /* {} */",
                    d.control.text()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "        /*{addr:04x}*/ {:>18} .inst {:#034x} ;  /* not in the tables; {} */",
                    "",
                    w,
                    Control::from_word(w).text()
                );
            }
        }
    }
    out.push('\n');
    Ok(())
}
