//! `quench sass dis`: a cubin's kernels as SASS text in nvdisasm's syntax, each
//! instruction followed by its control bits, with a header of the kernel's ABI, so that
//! [`crate::asm`] can assemble the text back into the same code.
//!
//! ```text
//! .kernel add_f32
//! .registers 22
//! .param 8 8 2 4
//! add_f32:
//!         /*0000*/                   LDC R1, c[0x0][0x28] ;  /* B------:R-:W-:-:S01 */
//! ```

use std::collections::HashMap;
use std::fmt::Write;

use crate::cubin::{Cubin, Kernel, STT_FUNC};
use crate::error::Result;
use crate::probe::words;
use crate::syntax::Kind;
use crate::table::{Control, Tables};

/// How much of a listing the tables decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub instructions: usize,
    pub decoded: usize,
}

/// The listing of every kernel of `cubin`.
pub fn disassemble(cubin: &Cubin, tables: &Tables) -> Result<(String, Coverage)> {
    let mut out = String::new();
    let mut cov = Coverage::default();
    let mut next_label = 0usize;
    for k in &cubin.kernels {
        kernel(&mut out, cubin, k, tables, &mut next_label, &mut cov)?;
    }
    Ok((out, cov))
}

fn kernel(
    out: &mut String,
    c: &Cubin,
    k: &Kernel,
    tables: &Tables,
    next_label: &mut usize,
    cov: &mut Coverage,
) -> Result<()> {
    let code = c.text(k);
    let _ = writeln!(out, ".kernel {}", k.name);
    let _ = writeln!(out, ".registers {}", k.registers.unwrap_or(0));
    if k.shared_bytes > 0 {
        let _ = writeln!(out, ".shared {}", k.shared_bytes);
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
    // Function symbols inside this code: the kernel and ptxas's subroutines.
    let mut names: HashMap<u64, String> = HashMap::new();
    for s in &c.symbols {
        if s.kind() == STT_FUNC && usize::from(s.shndx) == k.text_section {
            names.insert(s.value, s.name.clone());
        }
    }
    let ws = words(code);
    let decoded: Vec<_> = ws
        .iter()
        .enumerate()
        .map(|(i, &w)| tables.decode(w, (i * 16) as u64))
        .collect();
    // Labels in order of first reference, as nvdisasm numbers them.
    let mut labels: HashMap<u64, String> = HashMap::new();
    for d in decoded.iter().flatten() {
        for h in &d.holes {
            if h.kind == Kind::Label {
                let t = h.value as u64;
                if !names.contains_key(&t) && !labels.contains_key(&t) {
                    labels.insert(t, format!(".L_x_{next_label}"));
                    *next_label += 1;
                }
            }
        }
    }
    // The label nvdisasm puts after the last instruction.
    *next_label += 1;
    for (i, (&w, d)) in ws.iter().zip(&decoded).enumerate() {
        let addr = (i * 16) as u64;
        if let Some(n) = names.get(&addr) {
            let _ = writeln!(out, "{n}:");
        }
        if let Some(l) = labels.get(&addr) {
            let _ = writeln!(out, "{l}:");
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
                        names
                            .get(&t)
                            .or_else(|| labels.get(&t))
                            .cloned()
                            .unwrap_or_else(|| format!("{t:#x}"))
                    })
                    .collect();
                let text = tables.render(d, &targets);
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
