//! `quench sass asm`: SASS text as [`crate::dis`] writes it back into a cubin.
//!
//! A kernel starts with `.kernel NAME`, then its ABI (`.registers N`, `.shared BYTES`,
//! `.barriers N`, `.maxntid X Y Z`, and one `.param SIZE ALIGN POINTEE_LOG_ALIGN
//! POINTEE_SPACE` per parameter), then labels (`name:`) and instructions, each optionally
//! starting with its `/*offset*/` (checked) and ending with ` ;` and its control bits in a
//! comment (`/* B------:R-:W-:-:S01 */`; without them the stall is 1 and nothing waits).
//! `.inst 0x…` gives a raw 128-bit instruction. One kernel per cubin.

use std::collections::HashMap;

use crate::build::{self, KernelDesc, Param};
use crate::error::{Result, SassError};
use crate::syntax::{self, Kind};
use crate::table::{Control, Tables};

fn err(line: usize, col: usize, msg: impl Into<String>) -> SassError {
    SassError::Asm {
        line,
        col: col + 1,
        msg: msg.into(),
    }
}

struct Inst<'a> {
    line: usize,
    /// Column of `text` in its line.
    col: usize,
    text: &'a str,
    control: Control,
}

fn number<T: std::str::FromStr>(s: &str, line: usize, col: usize, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| err(line, col, format!("{what} must be a number, not {s:?}")))
}

/// Assembles `text` into the kernel description it names (code and ABI).
pub fn assemble(text: &str, tables: &Tables) -> Result<KernelDesc> {
    let mut desc = KernelDesc {
        name: String::new(),
        text: Vec::new(),
        params: Vec::new(),
        registers: 0,
        shared_bytes: 0,
        barriers: 0,
        exit_offsets: Vec::new(),
        max_threads: None,
        subroutines: Vec::new(),
    };
    let mut insts: Vec<Inst> = Vec::new();
    let mut labels: HashMap<String, u64> = HashMap::new();
    let mut label_order: Vec<(String, u64)> = Vec::new();
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
            match key {
                "kernel" => {
                    if !desc.name.is_empty() {
                        return Err(err(line, col, "one kernel per cubin: a second .kernel"));
                    }
                    desc.name = argn(0)?.to_string();
                }
                "registers" => desc.registers = number(argn(0)?, line, col, "the register count")?,
                "shared" => {
                    desc.shared_bytes = number(argn(0)?, line, col, "the shared-memory size")?
                }
                "barriers" => desc.barriers = number(argn(0)?, line, col, "the barrier count")?,
                "maxntid" => {
                    desc.max_threads = Some([
                        number(argn(0)?, line, col, "maxntid x")?,
                        number(argn(1)?, line, col, "maxntid y")?,
                        number(argn(2)?, line, col, "maxntid z")?,
                    ])
                }
                "param" => desc.params.push(Param {
                    size: number(argn(0)?, line, col, "the parameter size")?,
                    align: number(argn(1)?, line, col, "the parameter alignment")?,
                    pointee_log_align: number(argn(2)?, line, col, "the pointee alignment")?,
                    pointee_space: number(argn(3)?, line, col, "the pointee space")?,
                }),
                "inst" => {} // handled below as an instruction line without an offset
                _ => return Err(err(line, col, format!("unknown directive .{key}"))),
            }
            if key != "inst" {
                continue;
            }
        }
        if let Some(name) = s.strip_suffix(':').filter(|l| !l.contains(' ')) {
            let addr = (insts.len() * 16) as u64;
            if labels.insert(name.to_string(), addr).is_some() {
                return Err(err(line, col, format!("label {name} is defined twice")));
            }
            label_order.push((name.to_string(), addr));
            continue;
        }
        // `/*0040*/` offset, checked against the instruction's position.
        if let Some(rest) = s.strip_prefix("/*") {
            let Some((off, after)) = rest.split_once("*/") else {
                return Err(err(line, col, "unterminated /* offset */"));
            };
            let want = insts.len() * 16;
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
        insts.push(Inst {
            line,
            col,
            text: body.trim_end(),
            control,
        });
    }
    if desc.name.is_empty() {
        return Err(err(1, 0, "no .kernel NAME"));
    }
    // Labels other than the kernel's own name and ptxas's `.L_x_` labels are subroutines.
    for (i, (name, addr)) in label_order.iter().enumerate() {
        if name == &desc.name || name.starts_with(".L") {
            continue;
        }
        let end = label_order[i + 1..]
            .iter()
            .find(|(n, _)| !n.starts_with(".L"))
            .map_or((insts.len() * 16) as u64, |(_, a)| *a);
        desc.subroutines.push((name.clone(), *addr, end - addr));
    }
    for (i, inst) in insts.iter().enumerate() {
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
            let mut p =
                syntax::parse(inst.text).map_err(|e| err(inst.line, inst.col + e.col, e.msg))?;
            let names = syntax::labels(inst.text);
            for (li, h) in p
                .holes
                .iter_mut()
                .filter(|h| h.kind == Kind::Label)
                .enumerate()
            {
                let name = names
                    .get(li)
                    .ok_or_else(|| err(inst.line, inst.col, "a label without a name"))?;
                h.value = *labels.get(name).ok_or_else(|| {
                    err(
                        inst.line,
                        inst.col + inst.text.find(name.as_str()).unwrap_or(0),
                        format!("undefined label {name}"),
                    )
                })? as i64;
            }
            tables
                .encode(&p, inst.control, addr)
                .map_err(|e| err(inst.line, inst.col, format!("{}: {e}", inst.text.trim())))?
        };
        if inst.text.trim_start().starts_with("EXIT") || inst.text.contains(" EXIT") {
            desc.exit_offsets.push(addr as u32);
        }
        desc.text.extend_from_slice(&word.to_le_bytes());
    }
    Ok(desc)
}

/// Assembles `text` into a cubin.
pub fn assemble_cubin(text: &str, tables: &Tables) -> Result<Vec<u8>> {
    build::build(&assemble(text, tables)?)
}
