//! Relocations of code in SASS text.
//!
//! A relocated immediate reads as nvdisasm prints it: `32@lo(EXPR)` and `32@hi(EXPR)` are
//! `R_CUDA_ABS32_LO_32` and `R_CUDA_ABS32_HI_32`, the low and high halves of an address in
//! the 32-bit immediate at bit 32 (how a caller puts its return address in two `MOV`s).
//! Any other relocation — the target of a `CALL.ABS`, which the tables do not decode — is
//! a line `.reloc TYPE EXPR` before the instruction it patches, `TYPE` an `R_CUDA_…` name
//! or a number. `EXPR` is `SYMBOL`, `(SYMBOL + LABEL@srel)` (the label's offset in its
//! section: nvdisasm's form for a return address), or `(SYMBOL + 0x…)` / `(SYMBOL - 0x…)`.
//! The instruction holds zeros where the driver puts the address when it loads the code.

use crate::cubin::{R_CUDA_ABS32_HI_32, R_CUDA_ABS32_LO_32};

/// What is added to the symbol's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addend {
    /// A number (`0` when the expression is the symbol alone).
    Number(i64),
    /// The offset of a label in its section (`LABEL@srel`).
    Label(String),
}

/// `SYMBOL`, `SYMBOL + LABEL@srel` or `SYMBOL ± number`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    pub symbol: String,
    pub addend: Addend,
}

impl Expr {
    /// The text of the expression, as nvdisasm prints it.
    pub fn text(&self) -> String {
        match &self.addend {
            Addend::Number(0) => self.symbol.clone(),
            Addend::Number(n) if *n < 0 => format!("({} - {:#x})", self.symbol, n.unsigned_abs()),
            Addend::Number(n) => format!("({} + {n:#x})", self.symbol),
            Addend::Label(l) => format!("({} + {l}@srel)", self.symbol),
        }
    }
}

/// The bits an operand relocation fills: 32 bits at bit 32, as `[word bit, value bit,
/// length]` runs of a table field.
pub const OPERAND_RUNS: [[u8; 3]; 1] = [[32, 0, 32]];

/// The operand syntax (`32@lo`) of relocation type `t`, for those that have one.
pub fn operand_prefix(t: u32) -> Option<&'static str> {
    match t {
        R_CUDA_ABS32_LO_32 => Some("32@lo"),
        R_CUDA_ABS32_HI_32 => Some("32@hi"),
        _ => None,
    }
}

fn is_name_char(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '(' | ')' | '+' | ',' | ';' | '`')
}

/// Parses an expression (the whole of `s`, surrounding blanks aside).
pub fn parse_expr(s: &str) -> Result<Expr, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not SYMBOL, (SYMBOL + LABEL@srel) or (SYMBOL + 0x…)");
    let Some(inner) = s.strip_prefix('(') else {
        if s.is_empty() || !s.chars().all(is_name_char) {
            return Err(bad());
        }
        return Ok(Expr {
            symbol: s.to_string(),
            addend: Addend::Number(0),
        });
    };
    let inner = inner.strip_suffix(')').ok_or_else(bad)?.trim();
    let (symbol, sign, rest) = match (inner.find(" + "), inner.find(" - ")) {
        (Some(i), _) => (&inner[..i], 1i64, &inner[i + 3..]),
        (None, Some(i)) => (&inner[..i], -1, &inner[i + 3..]),
        _ => return Err(bad()),
    };
    let (symbol, rest) = (symbol.trim(), rest.trim());
    if symbol.is_empty() || !symbol.chars().all(is_name_char) {
        return Err(bad());
    }
    let addend = if let Some(label) = rest.strip_suffix("@srel") {
        if sign < 0 || label.is_empty() || !label.chars().all(is_name_char) {
            return Err(bad());
        }
        Addend::Label(label.to_string())
    } else {
        let hex = rest.strip_prefix("0x").ok_or_else(bad)?;
        let v = i64::from_str_radix(hex, 16).map_err(|_| bad())?;
        Addend::Number(sign * v)
    };
    Ok(Expr {
        symbol: symbol.to_string(),
        addend,
    })
}

/// A relocated operand found in an instruction's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operand {
    pub r_type: u32,
    pub expr: Expr,
    /// Byte column of the operand in the original text.
    pub col: usize,
}

/// An instruction's text with each relocated operand (`32@lo(…)`) replaced by `0x0`, the
/// operands, and a map from columns of the new text back to the original's.
pub struct Stripped {
    pub text: String,
    pub operands: Vec<Operand>,
    /// `(column in the new text after which, extra bytes the original had)`.
    shifts: Vec<(usize, usize)>,
}

impl Stripped {
    /// The column in the original text of column `col` of the new text.
    pub fn original_col(&self, col: usize) -> usize {
        col + self
            .shifts
            .iter()
            .filter(|(at, _)| col > *at)
            .map(|(_, d)| d)
            .sum::<usize>()
    }
}

/// Finds the relocated operands of `text`; an error is `(column, message)`.
pub fn strip_operands(text: &str) -> Result<Stripped, (usize, String)> {
    let mut out = Stripped {
        text: String::with_capacity(text.len()),
        operands: Vec::new(),
        shifts: Vec::new(),
    };
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let found = [
            ("32@lo(", R_CUDA_ABS32_LO_32),
            ("32@hi(", R_CUDA_ABS32_HI_32),
        ]
        .into_iter()
        .find(|(p, _)| rest.starts_with(p));
        let Some((prefix, r_type)) = found else {
            let c = rest.chars().next().unwrap_or(' ');
            out.text.push(c);
            i += c.len_utf8();
            continue;
        };
        // The matching parenthesis of `prefix`'s.
        let mut depth = 0usize;
        let mut end = None;
        for (j, c) in rest.char_indices().skip(prefix.len() - 1) {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.ok_or((i, format!("unbalanced parentheses after {prefix}")))?;
        let expr = parse_expr(&rest[prefix.len()..end]).map_err(|e| (i + prefix.len(), e))?;
        out.operands.push(Operand {
            r_type,
            expr,
            col: i,
        });
        let replaced = "0x0";
        out.shifts.push((out.text.len(), end + 1 - replaced.len()));
        out.text.push_str(replaced);
        i += end + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_read_back_as_they_print() {
        for (text, symbol, addend) in [
            ("softmax_f32", "softmax_f32", Addend::Number(0)),
            (
                "(softmax_f32 + .L_x_0@srel)",
                "softmax_f32",
                Addend::Label(".L_x_0".into()),
            ),
            ("(f + 0x40)", "f", Addend::Number(0x40)),
            ("(f - 0x10)", "f", Addend::Number(-0x10)),
        ] {
            let e = parse_expr(text).unwrap();
            assert_eq!(e.symbol, symbol);
            assert_eq!(e.addend, addend);
            assert_eq!(e.text(), text);
        }
        for bad in ["", "(f)", "(f + )", "(f + x)", "(f - .L@srel)", "a b"] {
            assert!(parse_expr(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relocated_operands_become_zeros() {
        let s = strip_operands("MOV R20, 32@lo((softmax_f32 + .L_x_0@srel))").unwrap();
        assert_eq!(s.text, "MOV R20, 0x0");
        assert_eq!(s.operands.len(), 1);
        assert_eq!(s.operands[0].r_type, R_CUDA_ABS32_LO_32);
        assert_eq!(s.operands[0].col, 9);
        assert_eq!(s.original_col(9), 9);
        let s = strip_operands("IADD3 R1, 32@hi(f), R2, RZ").unwrap();
        assert_eq!(s.text, "IADD3 R1, 0x0, R2, RZ");
        // `R2` is at column 15 of the new text and 20 of the original.
        assert_eq!(s.original_col(15), 20);
        assert!(strip_operands("MOV R1, 32@lo((f + 0x1)").is_err());
    }
}
