//! The probe that recovers the encoding tables: ptxas's instructions, each flipped one
//! bit at a time and shown to nvdisasm.
//!
//! For every template (see [`crate::syntax`]) met in a corpus of ptxas output, up to
//! [`EXEMPLARS`] instructions are taken; each of their bits outside the guard and control
//! bits is flipped and the results disassembled together (twice, at two base addresses, to
//! tell code addresses from other numbers). A flip that changes one hole's value by a power
//! of two places that bit in the hole's field (a change of all bits above it makes it the
//! field's sign bit); one that changes the template or makes the instruction illegal marks
//! an identifying bit; one that adds `.reuse` to a register finds its reuse flag. The
//! identifying bits' values in the corpus become the forms' `mask`/`value`.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::syntax::{self, Kind, Parsed};
use crate::table::{self, Field, Form, TableFile, CONTROL_MASK, GUARD_MASK, REUSE_MASK};
use crate::tools;

/// Instructions per template that are flipped.
pub const EXEMPLARS: usize = 4;
const SHIFTED_BASE: u64 = 0x10_0000;

/// One instruction of the corpus: its word and nvdisasm's text of it.
#[derive(Clone, Debug)]
pub struct Instance {
    pub word: u128,
    pub text: String,
    /// The address nvdisasm disassembled it at (code addresses in `text` are absolute).
    pub addr: u64,
}

/// What the probe found, besides the tables.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub instances: usize,
    pub templates: usize,
    pub forms: usize,
    pub opcodes: usize,
    pub flips: usize,
    /// Control-bit flips (bits 105..122 and 126..128) that changed nvdisasm's text (must
    /// be none), and those it rejected as illegal (nvdisasm checks some stall/yield
    /// combinations per instruction class).
    pub control_flips_visible: usize,
    pub control_flips_illegal: usize,
    /// A few of the visible ones: (bit, before, after).
    pub control_flip_examples: Vec<(u32, String, String)>,
    /// Instances the parser could not split (skipped).
    pub unparsed: Vec<String>,
}

pub fn words(code: &[u8]) -> Vec<u128> {
    code.chunks_exact(16)
        .map(|c| {
            let mut b = [0u8; 16];
            b.copy_from_slice(c);
            u128::from_le_bytes(b)
        })
        .collect()
}

fn bytes(words: &[u128]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The instructions of `code` (the code of one or more kernels one after another) with
/// nvdisasm's raw text of each.
pub fn instances(code: &[u8]) -> Result<Vec<Instance>> {
    let ws = words(code);
    let texts = tools::nvdisasm_raw(code, 0)?;
    Ok(ws
        .into_iter()
        .zip(texts)
        .enumerate()
        .filter_map(|(i, (word, t))| {
            Some(Instance {
                word,
                text: t?,
                addr: (i * 16) as u64,
            })
        })
        .collect())
}

/// Values of a parsed instruction's holes, code addresses made relative to `addr`.
fn normalized(p: &Parsed, shifted: &Parsed, addr: u64) -> Vec<(Kind, i64, bool)> {
    p.holes
        .iter()
        .zip(&shifted.holes)
        .map(|(h, s)| {
            let pcrel = h.kind == Kind::X && s.value.wrapping_sub(h.value) == SHIFTED_BASE as i64;
            let v = if pcrel {
                h.value.wrapping_sub(addr as i64)
            } else {
                h.value
            };
            (if pcrel { Kind::Label } else { h.kind }, v, pcrel)
        })
        .collect()
}

/// The bits that are flipped: all but the guard and control bits (which are probed
/// separately: they must not change the text).
fn flip_bits() -> Vec<u32> {
    (0..128u32)
        .filter(|&b| (GUARD_MASK >> b) & 1 == 0 && ((CONTROL_MASK & !REUSE_MASK) >> b) & 1 == 0)
        .collect()
}

/// Solves the tables from `corpus`.
pub fn solve(corpus: &[Instance], nvdisasm_version: &str) -> Result<(TableFile, Summary)> {
    let mut summary = Summary {
        instances: corpus.len(),
        ..Summary::default()
    };
    // Group by template; the guard and reuse flags are left out of the word (the guard
    // is common to every form, reuse is probed).
    let mut groups: BTreeMap<String, Vec<(u128, Parsed, u64)>> = BTreeMap::new();
    for inst in corpus {
        match syntax::parse(&inst.text) {
            Ok(p) => groups
                .entry(p.template.clone())
                .or_default()
                .push((inst.word, p, inst.addr)),
            Err(e) => summary.unparsed.push(format!("{}: {}", inst.text, e.msg)),
        }
    }
    summary.templates = groups.len();

    // The flip batch: per exemplar, the exemplar itself (guard PT, no reuse) then one
    // word per flipped bit; then control-bit flips of the first exemplar of each group.
    let bits = flip_bits();
    let control_bits: Vec<u32> = (0..128)
        .filter(|&b| ((CONTROL_MASK & !REUSE_MASK) >> b) & 1 == 1)
        .collect();
    let mut batch: Vec<u128> = Vec::new();
    let mut plan: Vec<(String, Vec<usize>, usize)> = Vec::new(); // template, exemplar starts, control start
    for (template, insts) in &groups {
        let mut seen = Vec::new();
        let mut starts = Vec::new();
        for (w, p, _) in insts {
            let base = (w & !GUARD_MASK & !REUSE_MASK) | 7u128 << 12;
            let vals: Vec<i64> = p.holes.iter().map(|h| h.value).collect();
            if seen
                .iter()
                .any(|(b, v): &(u128, Vec<i64>)| *b == base || *v == vals)
            {
                continue;
            }
            seen.push((base, vals));
            starts.push(batch.len());
            batch.push(base);
            for &b in &bits {
                batch.push(base ^ 1u128 << b);
            }
            if starts.len() == EXEMPLARS {
                break;
            }
        }
        let control_start = batch.len();
        let base = batch[starts[0]];
        for &b in &control_bits {
            batch.push(base ^ 1u128 << b);
        }
        // The guard set to predicate 0 shows whether it is @P0 or @UP0.
        batch.push(base & !GUARD_MASK);
        plan.push((template.clone(), starts, control_start));
    }
    summary.flips = batch.len();

    // Disassemble in chunks, at base 0 and at a shifted base.
    let chunk = 1 << 15;
    let mut text0 = Vec::with_capacity(batch.len());
    let mut text1 = Vec::with_capacity(batch.len());
    for (i, c) in batch.chunks(chunk).enumerate() {
        let base = (i * chunk * 16) as u64;
        text0.extend(tools::nvdisasm_raw(&bytes(c), base)?);
        text1.extend(tools::nvdisasm_raw(&bytes(c), base + SHIFTED_BASE)?);
    }
    let parsed = |i: usize| -> Option<(Parsed, Parsed)> {
        let a = syntax::parse(text0[i].as_deref()?).ok()?;
        let b = syntax::parse(text1[i].as_deref()?).ok()?;
        (a.template == b.template && a.holes.len() == b.holes.len()).then_some((a, b))
    };

    let mut forms = Vec::new();
    for (template, starts, control_start) in &plan {
        // hole -> word bit -> (value bit, is sign bit)
        let mut field_bits: Vec<BTreeMap<u32, (u32, bool)>> = Vec::new();
        let mut pcrel: Vec<bool> = Vec::new();
        let mut kinds: Vec<Kind> = Vec::new();
        let mut reuse: BTreeMap<u32, usize> = BTreeMap::new();
        let mut exemplars: Vec<(u128, Vec<i64>)> = Vec::new();
        for &start in starts {
            let addr = |i: usize| (i * 16) as u64;
            let Some((p0, s0)) = parsed(start) else {
                continue;
            };
            if &p0.template != template {
                continue;
            }
            let v0 = normalized(&p0, &s0, addr(start));
            if kinds.is_empty() {
                kinds = v0.iter().map(|v| v.0).collect();
                pcrel = v0.iter().map(|v| v.2).collect();
                field_bits = vec![BTreeMap::new(); v0.len()];
            }
            if v0.iter().map(|v| v.0).collect::<Vec<_>>() != kinds {
                continue;
            }
            exemplars.push((batch[start], v0.iter().map(|v| v.1).collect()));
            for (j, &bit) in bits.iter().enumerate() {
                let i = start + 1 + j;
                let Some((p1, s1)) = parsed(i) else { continue };
                if p1.template != p0.template {
                    continue;
                }
                let v1 = normalized(&p1, &s1, addr(i));
                let changed: Vec<usize> = (0..v0.len())
                    .filter(|&k| v0[k].1 != v1[k].1 || v0[k].0 != v1[k].0)
                    .collect();
                let reuse_changed: Vec<usize> = (0..v0.len())
                    .filter(|&k| p0.holes[k].reuse != p1.holes[k].reuse)
                    .collect();
                if changed.is_empty() && reuse_changed.len() == 1 && (REUSE_MASK >> bit) & 1 == 1 {
                    reuse.insert(bit, reuse_changed[0]);
                    continue;
                }
                let [k] = changed[..] else { continue };
                let d = (v0[k].1 ^ v1[k].1) as u64;
                if d.count_ones() == 1 {
                    field_bits[k].insert(bit, (d.trailing_zeros(), false));
                } else if d.leading_ones() + d.trailing_zeros() == 64 && d.trailing_zeros() < 63 {
                    field_bits[k].insert(bit, (d.trailing_zeros(), true));
                }
            }
        }
        if let Some(&start) = starts.first() {
            for (j, i) in (*control_start..control_start + control_bits.len()).enumerate() {
                let same = match (parsed(i), parsed(start)) {
                    (Some((a, sa)), Some((b, sb))) => {
                        a.template == b.template
                            && normalized(&a, &sa, (i * 16) as u64)
                                == normalized(&b, &sb, (start * 16) as u64)
                    }
                    _ => false,
                };
                let t = text0[i].as_deref();
                match t {
                    None => summary.control_flips_illegal += 1,
                    t if !same => {
                        summary.control_flips_visible += 1;
                        if summary.control_flip_examples.len() < 10 {
                            let before = text0[start].clone().unwrap_or_default();
                            summary.control_flip_examples.push((
                                control_bits[j],
                                before,
                                t.unwrap_or("").to_string(),
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        let uniform_guard = text0
            .get(control_start + control_bits.len())
            .cloned()
            .flatten()
            .is_some_and(|t| t.starts_with("@UP"));
        if exemplars.is_empty() {
            continue;
        }
        // Fields from the bits. A hole none of whose bits was found (nvdisasm prints
        // another template for every change, as IMAD.SHL.U32 for a power of two) is fixed
        // by the identifying bits: its field has no runs and the form its value.
        let mut fields = Vec::new();
        let mut field_mask = 0u128;
        for (k, fb) in field_bits.iter().enumerate() {
            let mut runs: Vec<[u8; 3]> = Vec::new();
            let signed = fb.values().any(|v| v.1);
            for (&wb, &(vb, _)) in fb {
                match runs.last_mut() {
                    Some(r)
                        if u32::from(r[0]) + u32::from(r[2]) == wb
                            && u32::from(r[1]) + u32::from(r[2]) == vb =>
                    {
                        r[2] += 1
                    }
                    _ => runs.push([wb as u8, vb as u8, 1]),
                }
            }
            let f = Field {
                kind: kinds[k],
                runs,
                signed,
                addend: 0,
                pcrel: pcrel[k],
            };
            field_mask |= f.mask();
            fields.push(f);
        }
        // Reuse flags the flips missed (nvdisasm rejects some flag and stall combinations)
        // from the corpus itself: bit b marks hole k when, in every instance, b is set
        // exactly where k carries `.reuse`.
        for bit in 122..126u32 {
            if reuse.contains_key(&bit) {
                continue;
            }
            let insts = &groups[template];
            if !insts.iter().any(|(w, _, _)| w >> bit & 1 == 1) {
                continue;
            }
            let holes = insts.first().map_or(0, |(_, p, _)| p.holes.len());
            let taken: Vec<usize> = reuse.values().copied().collect();
            let found = (0..holes).filter(|k| !taken.contains(k)).find(|&k| {
                insts.iter().all(|(w, p, _)| {
                    p.holes
                        .get(k)
                        .is_some_and(|h| h.reuse == (w >> bit & 1 == 1))
                })
            });
            if let Some(k) = found {
                reuse.insert(bit, k);
            }
        }
        let mask = !(GUARD_MASK | CONTROL_MASK | REUSE_MASK | field_mask);
        // One form per distinct value of the identifying bits among the instances, each
        // hole's addend from the form's first instance; instances it does not reproduce
        // are left out (and stay uncovered).
        let mut variants: BTreeMap<u128, (Vec<Field>, u64)> = BTreeMap::new();
        for (w, p, addr) in &groups[template] {
            let vals: Vec<i64> = p
                .holes
                .iter()
                .zip(&fields)
                .map(|(h, f)| {
                    if f.pcrel {
                        h.value.wrapping_sub(*addr as i64)
                    } else {
                        h.value
                    }
                })
                .collect();
            if vals.len() != fields.len() {
                continue;
            }
            let entry = variants.entry(w & mask).or_insert_with(|| {
                let fs = fields
                    .iter()
                    .zip(&vals)
                    .map(|(f, v)| Field {
                        addend: v.wrapping_sub(f.extract(*w)),
                        ..f.clone()
                    })
                    .collect();
                (fs, 0)
            });
            if entry.0.iter().zip(&vals).all(|(f, v)| f.extract(*w) == *v) {
                entry.1 += 1;
            }
        }
        let mut variants: Vec<(u128, (Vec<Field>, u64))> =
            variants.into_iter().filter(|v| v.1 .1 > 0).collect();
        variants.sort_by_key(|(v, (_, n))| (std::cmp::Reverse(*n), *v));
        for (value, (fields, seen)) in variants {
            forms.push(Form {
                template: template.clone(),
                mask: table::hex(mask),
                value: table::hex(value),
                fields,
                reuse: reuse.iter().map(|(&b, &h)| [b as u8, h as u8]).collect(),
                seen,
                uniform_guard,
            });
        }
    }
    summary.forms = forms.len();
    let mut ops: Vec<&str> = forms
        .iter()
        .map(|f| f.template.split(['.', ' ']).next().unwrap_or(""))
        .collect();
    ops.sort_unstable();
    ops.dedup();
    summary.opcodes = ops.len();
    Ok((
        TableFile {
            format: table::FORMAT.into(),
            arch: "sm_90".into(),
            nvdisasm: nvdisasm_version.into(),
            forms,
        },
        summary,
    ))
}

/// How the tables fare on a corpus: each instruction decoded, printed as nvdisasm printed
/// it, and encoded back from that text into the same word.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub instructions: usize,
    pub decoded: usize,
    pub text_equal: usize,
    pub reencoded: usize,
    /// Up to 20 instructions that failed, with why.
    pub failures: Vec<String>,
}

/// Checks `tables` on `corpus` (raw nvdisasm text at address 0 of each instruction).
pub fn check(corpus: &[Instance], tables: &table::Tables) -> Check {
    let mut c = Check {
        instructions: corpus.len(),
        ..Check::default()
    };
    let fail = |c: &mut Check, s: String| {
        if c.failures.len() < 20 {
            c.failures.push(s);
        }
    };
    for inst in corpus {
        let Some(d) = tables.decode(inst.word, inst.addr) else {
            fail(&mut c, format!("{:032x} {}: no form", inst.word, inst.text));
            continue;
        };
        c.decoded += 1;
        let text = tables.render(&d, &[]);
        if text != inst.text {
            fail(
                &mut c,
                format!(
                    "{:032x}: printed {text:?}, nvdisasm {:?}",
                    inst.word, inst.text
                ),
            );
            continue;
        }
        c.text_equal += 1;
        let Ok(mut p) = syntax::parse(&text) else {
            continue;
        };
        // Raw text shows code addresses as numbers; the form says which are addresses.
        let fields = &tables.forms[d.form].form.fields;
        for (h, f) in p.holes.iter_mut().zip(fields) {
            if f.pcrel {
                h.kind = Kind::Label;
            }
        }
        p.template = syntax::with_labels(
            &p.template,
            &fields.iter().map(|f| f.pcrel).collect::<Vec<_>>(),
        );
        match tables.encode(&p, d.control, inst.addr) {
            Ok(w) if w == inst.word => c.reencoded += 1,
            Ok(w) => fail(
                &mut c,
                format!("{}: encoded {w:032x}, ptxas {:032x}", inst.text, inst.word),
            ),
            Err(e) => fail(&mut c, format!("{}: {e}", inst.text)),
        }
    }
    c
}
