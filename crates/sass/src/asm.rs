//! `quench sass asm`: SASS text as [`crate::dis`] writes it back into a cubin.
//!
//! A kernel starts with `.kernel NAME`, then its ABI (`.registers N`, `.shared BYTES`,
//! `.frame BYTES` of local memory a thread, `.barriers N`, `.maxntid X Y Z`, and one `.param SIZE ALIGN POINTEE_LOG_ALIGN
//! POINTEE_SPACE` per parameter), then labels (`name:`) and instructions, each optionally
//! starting with its `/*offset*/` (checked) and ending with ` ;` and its control bits in a
//! comment (`/* B------:R-:W-:-:S01 */`; without them the stall is 1 and nothing waits).
//! `.inst 0x…` gives a raw 128-bit instruction. One kernel per cubin, which may come with
//! device functions in code sections of their own: each starts with `.function NAME` and
//! `.registers N`, and is reached from other code through relocations, written as
//! [`crate::reloc`] describes (`MOV R20, 32@lo((k + .L_x_0@srel))`, or a line `.reloc
//! TYPE EXPR` before the instruction it patches). Offsets and branch labels are those of
//! each function's own code.

use std::collections::HashMap;

use crate::build::{self, FunctionDesc, KernelDesc, ModuleDesc, Param, RelocDesc};
use crate::cubin;
use crate::error::{Result, SassError};
use crate::reloc::{self, Addend, Expr};
use crate::syntax::{self, Kind};
use crate::table::{Control, Tables};

fn err(line: usize, col: usize, msg: impl Into<String>) -> SassError {
    SassError::Asm {
        line,
        col: col + 1,
        msg: msg.into(),
    }
}

/// A relocation as the text gives it, before its symbol and label are resolved.
struct PendingReloc {
    line: usize,
    col: usize,
    r_type: u32,
    expr: Expr,
}

struct Inst<'a> {
    line: usize,
    /// Column of `text` in its line.
    col: usize,
    text: &'a str,
    control: Control,
    relocs: Vec<PendingReloc>,
}

/// One kernel or device function of the text: its header and code.
struct Unit<'a> {
    name: String,
    entry: bool,
    registers: u32,
    shared_bytes: u64,
    frame_bytes: u32,
    barriers: u16,
    max_threads: Option<[u32; 3]>,
    params: Vec<Param>,
    insts: Vec<Inst<'a>>,
    labels: HashMap<String, u64>,
    label_order: Vec<(String, u64)>,
    /// `.reloc` lines waiting for the instruction they patch.
    pending: Vec<PendingReloc>,
}

fn number<T: std::str::FromStr>(s: &str, line: usize, col: usize, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| err(line, col, format!("{what} must be a number, not {s:?}")))
}

/// Assembles `text` into the description of the cubin it names: the kernel, its device
/// functions and the relocations between them.
pub fn assemble(text: &str, tables: &Tables) -> Result<ModuleDesc> {
    let mut units: Vec<Unit> = Vec::new();
    // Which unit defines each label, to refuse a name defined twice anywhere.
    let mut label_unit: HashMap<String, usize> = HashMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let indent = raw.len() - raw.trim_start().len();
        let mut s = raw.trim();
        let mut col = indent;
        if s.is_empty() || s.starts_with("//") {
            continue;
        }
        if let Some(d) = s.strip_prefix('.').filter(|_| !s.starts_with(".L")) {
            let mut parts = d.split_whitespace();
            let key = parts.next().unwrap_or("");
            let args: Vec<&str> = parts.collect();
            let argn = |i: usize| {
                args.get(i)
                    .copied()
                    .ok_or_else(|| err(line, col, format!(".{key} needs {} arguments", i + 1)))
            };
            if key == "inst" {
                // An instruction line without an offset: handled below.
            } else if key == "kernel" || key == "function" {
                let entry = key == "kernel";
                if entry && units.iter().any(|u| u.entry) {
                    return Err(err(line, col, "one kernel per cubin: a second .kernel"));
                }
                let name = argn(0)?.to_string();
                if units.iter().any(|u| u.name == name) {
                    return Err(err(line, col, format!("{name} is defined twice")));
                }
                if let Some(u) = units.last().filter(|u| !u.pending.is_empty()) {
                    return Err(err(
                        u.pending[0].line,
                        u.pending[0].col,
                        "a .reloc with no instruction after it",
                    ));
                }
                units.push(Unit {
                    name,
                    entry,
                    registers: 0,
                    shared_bytes: 0,
                    frame_bytes: 0,
                    barriers: 0,
                    max_threads: None,
                    params: Vec::new(),
                    insts: Vec::new(),
                    labels: HashMap::new(),
                    label_order: Vec::new(),
                    pending: Vec::new(),
                });
                continue;
            } else {
                let u = units
                    .last_mut()
                    .ok_or_else(|| err(line, col, format!(".{key} before .kernel or .function")))?;
                let kernel_only = |u: &Unit| {
                    if u.entry {
                        Ok(())
                    } else {
                        Err(err(
                            line,
                            col,
                            format!(".{key} belongs to a .kernel, not to .function {}", u.name),
                        ))
                    }
                };
                match key {
                    "registers" => u.registers = number(argn(0)?, line, col, "the register count")?,
                    "shared" => {
                        kernel_only(u)?;
                        u.shared_bytes = number(argn(0)?, line, col, "the shared-memory size")?
                    }
                    "frame" => {
                        kernel_only(u)?;
                        u.frame_bytes = number(argn(0)?, line, col, "the frame size")?
                    }
                    "barriers" => {
                        kernel_only(u)?;
                        u.barriers = number(argn(0)?, line, col, "the barrier count")?
                    }
                    "maxntid" => {
                        kernel_only(u)?;
                        u.max_threads = Some([
                            number(argn(0)?, line, col, "maxntid x")?,
                            number(argn(1)?, line, col, "maxntid y")?,
                            number(argn(2)?, line, col, "maxntid z")?,
                        ])
                    }
                    "param" => {
                        kernel_only(u)?;
                        u.params.push(Param {
                            size: number(argn(0)?, line, col, "the parameter size")?,
                            align: number(argn(1)?, line, col, "the parameter alignment")?,
                            pointee_log_align: number(
                                argn(2)?,
                                line,
                                col,
                                "the pointee alignment",
                            )?,
                            pointee_space: number(argn(3)?, line, col, "the pointee space")?,
                        })
                    }
                    "reloc" => {
                        let t = argn(0)?;
                        let r_type = cubin::reloc_type(t).ok_or_else(|| {
                            err(line, col, format!("unknown relocation type {t}"))
                        })?;
                        // The expression is the rest of the line after the type.
                        let at = d.find(t).unwrap_or(0) + t.len();
                        let expr =
                            reloc::parse_expr(&d[at..]).map_err(|e| err(line, col + 1 + at, e))?;
                        u.pending.push(PendingReloc {
                            line,
                            col,
                            r_type,
                            expr,
                        });
                    }
                    _ => return Err(err(line, col, format!("unknown directive .{key}"))),
                }
                continue;
            }
        }
        let Some(ui) = units.len().checked_sub(1) else {
            return Err(err(line, col, "code before .kernel or .function"));
        };
        let u = &mut units[ui];
        if let Some(name) = s.strip_suffix(':').filter(|l| !l.contains(' ')) {
            let addr = (u.insts.len() * 16) as u64;
            if label_unit.insert(name.to_string(), ui).is_some() {
                return Err(err(line, col, format!("label {name} is defined twice")));
            }
            u.labels.insert(name.to_string(), addr);
            u.label_order.push((name.to_string(), addr));
            continue;
        }
        // `/*0040*/` offset, checked against the instruction's position.
        if let Some(rest) = s.strip_prefix("/*") {
            let Some((off, after)) = rest.split_once("*/") else {
                return Err(err(line, col, "unterminated /* offset */"));
            };
            let want = u.insts.len() * 16;
            match usize::from_str_radix(off, 16) {
                Ok(o) if o == want => {}
                _ => {
                    return Err(err(
                        line,
                        col,
                        format!("offset /*{off}*/ but this instruction is at {want:04x}"),
                    ))
                }
            }
            let trimmed = after.trim_start();
            col += 2 + off.len() + 2 + (after.len() - trimmed.len());
            s = trimmed;
        }
        // The control comment after ` ;`.
        let mut control = Control {
            stall: 1,
            yield_bit: false,
            write_barrier: 7,
            read_barrier: 7,
            wait: 0,
            extra: 0,
        };
        let body = match s.find(';') {
            Some(semi) => {
                let tail = s[semi + 1..].trim();
                if !tail.is_empty() {
                    let tail_col =
                        col + semi + 1 + (s[semi + 1..].len() - s[semi + 1..].trim_start().len());
                    let c = tail
                        .strip_prefix("/*")
                        .and_then(|t| t.strip_suffix("*/"))
                        .ok_or_else(|| {
                            err(
                                line,
                                tail_col,
                                "after ';' only a /* control */ comment may follow",
                            )
                        })?;
                    let c = c.trim();
                    let c = c.strip_prefix("not in the tables;").map_or(c, str::trim);
                    control = Control::parse(c).map_err(|e| err(line, tail_col, e))?;
                }
                &s[..semi]
            }
            None => return Err(err(line, col + s.len(), "an instruction ends with ';'")),
        };
        let relocs = std::mem::take(&mut u.pending);
        u.insts.push(Inst {
            line,
            col,
            text: body.trim_end(),
            control,
            relocs,
        });
    }
    if let Some(u) = units.iter().find(|u| !u.pending.is_empty()) {
        return Err(err(
            u.pending[0].line,
            u.pending[0].col,
            "a .reloc with no instruction after it",
        ));
    }

    let mut functions = Vec::new();
    let mut kernel = None;
    let mut pending: Vec<(usize, u64, PendingReloc)> = Vec::new();
    for (ui, u) in units.iter_mut().enumerate() {
        let Encoded {
            code: text,
            exits: exit_offsets,
            operands,
        } = encode(u, tables)?;
        pending.extend(operands.into_iter().map(|(a, r)| (ui, a, r)));
        for (i, inst) in u.insts.iter_mut().enumerate() {
            let addr = (i * 16) as u64;
            pending.extend(
                std::mem::take(&mut inst.relocs)
                    .into_iter()
                    .map(|r| (ui, addr, r)),
            );
        }
        let subroutines = subroutines(u);
        if u.entry {
            kernel = Some(KernelDesc {
                name: u.name.clone(),
                text,
                params: std::mem::take(&mut u.params),
                registers: u.registers,
                shared_bytes: u.shared_bytes,
                frame_bytes: u.frame_bytes,
                barriers: u.barriers,
                exit_offsets,
                max_threads: u.max_threads,
                subroutines,
            });
        } else {
            functions.push(FunctionDesc {
                name: u.name.clone(),
                text,
                registers: u.registers,
                subroutines,
            });
        }
    }
    // In the order of the code they patch, as nvlink writes them.
    pending.sort_by_key(|(ui, addr, _)| (*ui, *addr));
    let relocs = pending
        .into_iter()
        .map(|(ui, addr, r)| resolve(&units, &label_unit, ui, addr, r))
        .collect::<Result<Vec<_>>>()?;
    let kernel = kernel.ok_or_else(|| err(1, 0, "no .kernel NAME"))?;
    Ok(ModuleDesc {
        kernel,
        functions,
        relocs,
    })
}

/// Labels other than the unit's own name and ptxas's `.L_x_` labels are subroutines: name,
/// offset, and size up to the next such label or the end.
fn subroutines(u: &Unit) -> Vec<(String, u64, u64)> {
    let end_of_code = (u.insts.len() * 16) as u64;
    let mut out = Vec::new();
    for (i, (name, addr)) in u.label_order.iter().enumerate() {
        if name == &u.name || name.starts_with(".L") {
            continue;
        }
        let end = u.label_order[i + 1..]
            .iter()
            .find(|(n, _)| !n.starts_with(".L"))
            .map_or(end_of_code, |(_, a)| *a);
        out.push((name.clone(), *addr, end - addr));
    }
    out
}

/// A unit's instructions encoded.
struct Encoded {
    code: Vec<u8>,
    /// Offsets of its EXIT instructions.
    exits: Vec<u32>,
    /// The relocations of its operands (`32@lo(…)`), by the address of their instruction.
    operands: Vec<(u64, PendingReloc)>,
}

/// Encodes the instructions of a unit.
fn encode(u: &Unit, tables: &Tables) -> Result<Encoded> {
    let mut code = Vec::with_capacity(u.insts.len() * 16);
    let mut exits = Vec::new();
    let mut operands = Vec::new();
    for (i, inst) in u.insts.iter().enumerate() {
        let addr = (i * 16) as u64;
        let word = if let Some(raw) = inst.text.trim().strip_prefix(".inst") {
            let raw = raw.trim();
            let hex = raw
                .strip_prefix("0x")
                .ok_or_else(|| err(inst.line, inst.col, ".inst needs a 0x… word"))?;
            let w = u128::from_str_radix(hex, 16).map_err(|_| {
                err(
                    inst.line,
                    inst.col,
                    format!("{raw} is not a 128-bit hex word"),
                )
            })?;
            // The comment's control bits win over those in the word only when given.
            (w & !crate::table::CONTROL_MASK & !crate::table::REUSE_MASK)
                | (w & crate::table::REUSE_MASK)
                | inst.control.to_word()
        } else {
            // Relocated operands hold zeros; the driver fills them in.
            let stripped = reloc::strip_operands(inst.text)
                .map_err(|(c, m)| err(inst.line, inst.col + c, m))?;
            let text = stripped.text.as_str();
            let mut p = syntax::parse(text)
                .map_err(|e| err(inst.line, inst.col + stripped.original_col(e.col), e.msg))?;
            let names = syntax::labels(text);
            for (li, h) in p
                .holes
                .iter_mut()
                .filter(|h| h.kind == Kind::Label)
                .enumerate()
            {
                let name = names
                    .get(li)
                    .ok_or_else(|| err(inst.line, inst.col, "a label without a name"))?;
                h.value = *u.labels.get(name).ok_or_else(|| {
                    err(
                        inst.line,
                        inst.col + inst.text.find(name.as_str()).unwrap_or(0),
                        format!("undefined label {name} in the code of {}", u.name),
                    )
                })? as i64;
            }
            let w = tables
                .encode(&p, inst.control, addr)
                .map_err(|e| err(inst.line, inst.col, format!("{}: {e}", inst.text.trim())))?;
            for o in stripped.operands {
                operands.push((
                    addr,
                    PendingReloc {
                        line: inst.line,
                        col: inst.col + o.col,
                        r_type: o.r_type,
                        expr: o.expr,
                    },
                ));
            }
            w
        };
        if inst.text.trim_start().starts_with("EXIT") || inst.text.contains(" EXIT") {
            exits.push(addr as u32);
        }
        code.extend_from_slice(&word.to_le_bytes());
    }
    // An operand relocation fills bits 32..64; the form must hold its immediate there.
    for (addr, r) in &operands {
        let at = *addr as usize;
        let mut b = [0u8; 16];
        b.copy_from_slice(&code[at..at + 16]);
        let word = u128::from_le_bytes(b);
        let fits = tables.decode(word, *addr).is_some_and(|d| {
            let form = &tables.forms[d.form].form;
            form.fields
                .iter()
                .any(|f| f.kind == Kind::X && f.runs == reloc::OPERAND_RUNS)
        });
        if !fits {
            return Err(err(
                r.line,
                r.col,
                "a relocated operand needs a 32-bit immediate at bit 32, which this instruction does not hold",
            ));
        }
    }
    Ok(Encoded {
        code,
        exits,
        operands,
    })
}

/// A relocation with its symbol checked and its label (if any) made an offset.
fn resolve(
    units: &[Unit],
    label_unit: &HashMap<String, usize>,
    ui: usize,
    addr: u64,
    r: PendingReloc,
) -> Result<RelocDesc> {
    // The symbol: a kernel or function, or a subroutine label inside one.
    let symbol_unit = units
        .iter()
        .position(|u| u.name == r.expr.symbol)
        .or_else(|| {
            label_unit
                .get(&r.expr.symbol)
                .copied()
                .filter(|_| !r.expr.symbol.starts_with(".L"))
        })
        .ok_or_else(|| {
            err(
                r.line,
                r.col,
                format!(
                    "relocation names {}, which is no kernel, function or subroutine here",
                    r.expr.symbol
                ),
            )
        })?;
    let addend = match &r.expr.addend {
        Addend::Number(n) => *n,
        Addend::Label(l) => {
            // `LABEL@srel`: the label's offset in the section of the symbol.
            let at = units[symbol_unit].labels.get(l).ok_or_else(|| {
                err(
                    r.line,
                    r.col,
                    format!(
                        "label {l} is not in the code of {}",
                        units[symbol_unit].name
                    ),
                )
            })?;
            *at as i64
        }
    };
    Ok(RelocDesc {
        function: units[ui].name.clone(),
        offset: addr,
        r_type: r.r_type,
        symbol: r.expr.symbol,
        addend,
    })
}

/// Assembles `text` into a cubin.
pub fn assemble_cubin(text: &str, tables: &Tables) -> Result<Vec<u8>> {
    build::build_module(&assemble(text, tables)?)
}
