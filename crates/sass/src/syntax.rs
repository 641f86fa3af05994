//! nvdisasm's instruction syntax split into a *template* and *holes*.
//!
//! `@!P0 IADD3.X R5, R12.reuse, UR7, RZ, P1, !PT` becomes the guard (`!P0`), the template
//! `IADD3.X {R}, {R}, {UR}, {R}, {P}, !{P}` and the holes R5, R12, UR7, RZ (R255), P1, PT
//! (P7), with the reuse flag on the second hole. Everything that is not a number — opcode,
//! modifiers, negation, brackets, special-register names — stays in the template, so two
//! instructions with one template differ only in the values of their holes. The tables in
//! [`crate::table`] map each template's holes to bit fields.

use std::fmt::Write;

/// What a hole holds and how it is printed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Kind {
    /// General register; 255 prints as `RZ`.
    R,
    /// Uniform register; 63 prints as `URZ`.
    UR,
    /// Predicate; 7 prints as `PT`.
    P,
    /// Uniform predicate; 7 prints as `UPT`.
    UP,
    /// Convergence barrier register `B0`..
    B,
    /// An integer printed in hex, `-0x10` when negative.
    X,
    /// A code address printed as a label in a listing, as hex in raw disassembly.
    Label,
    /// Floating-point immediates, held as their bit patterns.
    F16,
    F32,
    /// A double immediate: the upper 32 bits of the f64 (the lower are zero).
    F64,
}

impl Kind {
    fn placeholder(self) -> &'static str {
        match self {
            Kind::R => "{R}",
            Kind::UR => "{UR}",
            Kind::P => "{P}",
            Kind::UP => "{UP}",
            Kind::B => "{B}",
            Kind::X => "{X}",
            Kind::Label => "{L}",
            Kind::F16 | Kind::F32 | Kind::F64 => "{F}",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hole {
    pub kind: Kind,
    pub value: i64,
    /// The register carries `.reuse` (an operand-reuse cache flag of the control bits).
    pub reuse: bool,
}

/// The guard predicate: `@P3` is `{neg: false, pred: 3}`; `@!UPT` has `uniform`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    pub neg: bool,
    pub pred: u8,
    /// A uniform predicate (`@UP0`), which uniform-datapath instructions take.
    pub uniform: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub guard: Option<Guard>,
    pub template: String,
    pub holes: Vec<Hole>,
}

/// A syntax error: the byte column (0-based) in the text and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub col: usize,
    pub msg: String,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The float kind for an instruction's immediates: half for `H*` opcodes, double for `D*`.
pub fn float_kind(mnemonic: &str) -> Kind {
    if mnemonic.starts_with('H') {
        Kind::F16
    } else if mnemonic.starts_with('D') {
        Kind::F64
    } else {
        Kind::F32
    }
}

/// The register-like token at the start of `s`: (kind, value, length).
fn register(s: &[u8]) -> Option<(Kind, i64, usize)> {
    let named: [(&[u8], Kind, i64); 4] = [
        (b"URZ", Kind::UR, 63),
        (b"UPT", Kind::UP, 7),
        (b"RZ", Kind::R, 255),
        (b"PT", Kind::P, 7),
    ];
    for (name, kind, v) in named {
        if s.starts_with(name) && s.get(name.len()).is_none_or(|&c| !is_word(c)) {
            return Some((kind, v, name.len()));
        }
    }
    let prefixes: [(&[u8], Kind); 5] = [
        (b"UR", Kind::UR),
        (b"UP", Kind::UP),
        (b"R", Kind::R),
        (b"P", Kind::P),
        (b"B", Kind::B),
    ];
    for (p, kind) in prefixes {
        if !s.starts_with(p) {
            continue;
        }
        let digits = s[p.len()..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let end = p.len() + digits;
        if digits == 0 || digits > 3 || s.get(end).is_some_and(|&c| is_word(c)) {
            continue;
        }
        let v = std::str::from_utf8(&s[p.len()..end]).ok()?.parse().ok()?;
        return Some((kind, v, end));
    }
    None
}

/// A hex number `0x…` (optionally `-0x…`) at the start of `s`: (value, length).
fn hex(s: &[u8]) -> Option<(i64, usize)> {
    let (neg, rest) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if !rest.starts_with(b"0x") {
        return None;
    }
    let digits = rest[2..]
        .iter()
        .take_while(|c| c.is_ascii_hexdigit())
        .count();
    if digits == 0 || digits > 16 || rest.get(2 + digits).is_some_and(|&c| is_word(c)) {
        return None;
    }
    let v = u64::from_str_radix(std::str::from_utf8(&rest[2..2 + digits]).ok()?, 16).ok()? as i64;
    Some((
        if neg { v.wrapping_neg() } else { v },
        usize::from(neg) + 2 + digits,
    ))
}

/// A decimal float at the start of `s` (`1`, `-0.5`, `1.5e-10`, `+INF`, `-QNAN`): (value, length).
fn float(s: &[u8]) -> Option<(f64, usize)> {
    for (name, v) in [
        (&b"+INF"[..], f64::INFINITY),
        (b"-INF", f64::NEG_INFINITY),
        (b"+QNAN", f64::NAN),
        (b"-QNAN", -f64::NAN),
    ] {
        if s.starts_with(name) && s.get(name.len()).is_none_or(|&c| !is_word(c)) {
            return Some((v, name.len()));
        }
    }
    let mut i = usize::from(matches!(s.first(), Some(b'-' | b'+')));
    let int = s[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    if int == 0 {
        return None;
    }
    i += int;
    if s.get(i) == Some(&b'.') {
        i += 1;
        i += s[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    }
    if s.get(i) == Some(&b'e') {
        let mut j = i + 1;
        if matches!(s.get(j), Some(b'-' | b'+')) {
            j += 1;
        }
        let d = s[j..].iter().take_while(|c| c.is_ascii_digit()).count();
        if d > 0 {
            i = j + d;
        }
    }
    if s.get(i).is_some_and(|&c| is_word(c) || c == b'.') {
        return None;
    }
    let v = std::str::from_utf8(&s[..i]).ok()?.parse().ok()?;
    Some((v, i))
}

/// The bit pattern of `v` as an immediate of `kind`, if it is exactly representable.
pub fn float_bits(kind: Kind, v: f64) -> Option<i64> {
    match kind {
        Kind::F32 => {
            let f = v as f32;
            (f64::from(f).to_bits() == v.to_bits() || (v.is_nan() && f.is_nan()))
                .then(|| i64::from(if v.is_nan() { nan32(v) } else { f.to_bits() }))
        }
        Kind::F16 => {
            let h = f16_from_f64(v)?;
            Some(i64::from(h))
        }
        Kind::F64 => {
            let b = if v.is_nan() {
                u64::from(nan32(v)) << 32
            } else {
                v.to_bits()
            };
            (b & 0xffff_ffff == 0).then_some((b >> 32) as i64)
        }
        _ => None,
    }
}

/// The quiet NaN nvdisasm prints as `+QNAN`/`-QNAN`, as f32 bits (the upper half of an f64).
fn nan32(v: f64) -> u32 {
    if v.is_sign_negative() {
        0xffc0_0000
    } else {
        0x7fc0_0000
    }
}

fn f16_from_f64(v: f64) -> Option<u16> {
    if v.is_nan() {
        return Some(if v.is_sign_negative() { 0xfe00 } else { 0x7e00 });
    }
    // Exhaustive over the 65536 patterns is cheap enough for an assembler and exact.
    (0..=u16::MAX).find(|&h| {
        let f = f16_to_f64(h);
        !f.is_nan() && f.to_bits() == v.to_bits()
    })
}

pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    match exp {
        0 => sign * man * 2f64.powi(-24),
        31 if man == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + man / 1024.0) * 2f64.powi(e - 15),
    }
}

/// The value of a float hole's bits.
pub fn float_value(kind: Kind, bits: i64) -> f64 {
    match kind {
        Kind::F16 => f16_to_f64(bits as u16),
        Kind::F64 => f64::from_bits((bits as u64 & 0xffff_ffff) << 32),
        _ => f64::from(f32::from_bits(bits as u32)),
    }
}

/// Formats a float as nvdisasm does: `%.20g`, with `+INF`, `-INF`, `+QNAN`, `-QNAN`.
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() {
            "-QNAN"
        } else {
            "+QNAN"
        }
        .into();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-INF" } else { "+INF" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{v:.19e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..17).contains(&exp) {
        let decimals = (19 - exp).max(0) as usize;
        strip(&format!("{v:.decimals$}"))
    } else if exp >= 17 {
        // nvdisasm keeps 21 significant digits for large values (1.84467440737095516160e+19
        // is 2^64), unlike C's %.20g.
        let sci = format!("{v:.20e}");
        let (m, e) = sci.split_once('e').unwrap_or((&sci, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    } else {
        format!(
            "{}e{}{:02}",
            strip(mant),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// Parses one instruction as nvdisasm prints it (without the address and ` ;`).
pub fn parse(text: &str) -> Result<Parsed, SyntaxError> {
    let text = text.trim_end().trim_end_matches(';').trim_end();
    let lead = text.len() - text.trim_start().len();
    let mut s = text.trim_start();
    let mut col = lead;
    let mut guard = None;
    if let Some(rest) = s.strip_prefix('@') {
        let (neg, rest) = match rest.strip_prefix('!') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let b = rest.as_bytes();
        let Some((kind, v, len)) = register(b).filter(|(k, _, _)| matches!(k, Kind::P | Kind::UP))
        else {
            return Err(SyntaxError {
                col: col + 1,
                msg: "a guard must be a predicate such as @P0 or @!P1".into(),
            });
        };
        guard = Some(Guard {
            neg,
            pred: v as u8,
            uniform: kind == Kind::UP,
        });
        let after = &rest[len..];
        let trimmed = after.trim_start();
        col += 1 + usize::from(neg) + len + (after.len() - trimmed.len());
        s = trimmed;
    }
    let b = s.as_bytes();
    let mn_len = b.iter().position(|&c| c == b' ').unwrap_or(b.len());
    let mnemonic = &s[..mn_len];
    if mnemonic.is_empty() || !mnemonic.as_bytes()[0].is_ascii_uppercase() {
        return Err(SyntaxError {
            col,
            msg: format!("expected an opcode, found {s:?}"),
        });
    }
    let fkind = float_kind(mnemonic);
    let mut template = String::from(mnemonic);
    let mut holes: Vec<Hole> = Vec::new();
    let mut i = mn_len;
    while i < b.len() {
        let boundary = i == 0 || !(is_word(b[i - 1]) || b[i - 1] == b'.');
        let rest = &b[i..];
        if boundary {
            if let Some((kind, value, len)) = register(rest) {
                holes.push(Hole {
                    kind,
                    value,
                    reuse: false,
                });
                template.push_str(kind.placeholder());
                i += len;
                if b[i..].starts_with(b".reuse") && b.get(i + 6).is_none_or(|&c| !is_word(c)) {
                    if let Some(h) = holes.last_mut() {
                        h.reuse = true;
                    }
                    i += 6;
                } else if b[i..].starts_with(b"|.reuse") {
                    // `|R63|.reuse`: the flag follows the absolute-value bars.
                    if let Some(h) = holes.last_mut() {
                        h.reuse = true;
                    }
                    template.push('|');
                    i += 7;
                }
                continue;
            }
            if let Some((value, len)) = hex(rest) {
                holes.push(Hole {
                    kind: Kind::X,
                    value,
                    reuse: false,
                });
                template.push_str("{X}");
                i += len;
                continue;
            }
            // A float stands alone as an operand: after ", " or "-"/"|" or at the start.
            let prev = if i > 0 { b[i - 1] } else { b' ' };
            if matches!(prev, b' ' | b',' | b'|') {
                if let Some((v, len)) = float(rest) {
                    let Some(bits) = float_bits(fkind, v) else {
                        return Err(SyntaxError {
                            col: col + i,
                            msg: format!("{} is not a {fkind:?} value", &s[i..i + len]),
                        });
                    };
                    holes.push(Hole {
                        kind: fkind,
                        value: bits,
                        reuse: false,
                    });
                    template.push_str("{F}");
                    i += len;
                    continue;
                }
            }
        }
        if b[i] == b'`' {
            // A label: `(.L_x_12) or `(name); its value is resolved by the caller.
            let end = s[i..].find(')').map(|e| i + e + 1).ok_or(SyntaxError {
                col: col + i,
                msg: "unterminated label".into(),
            })?;
            holes.push(Hole {
                kind: Kind::Label,
                value: 0,
                reuse: false,
            });
            template.push_str("{L}");
            i = end;
            continue;
        }
        if b[i] == b'{' || b[i] == b'}' {
            return Err(SyntaxError {
                col: col + i,
                msg: "unexpected brace".into(),
            });
        }
        template.push(b[i] as char);
        i += 1;
    }
    Ok(Parsed {
        guard,
        template,
        holes,
    })
}

/// `template` with its `k`-th hole shown as a label (`{L}`) wherever `labels[k]`.
pub fn with_labels(template: &str, labels: &[bool]) -> String {
    let mut out = String::new();
    let mut rest = template;
    let mut k = 0;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        if labels.get(k).copied().unwrap_or(false) {
            out.push_str("{L}");
        } else {
            out.push_str(&rest[start..start + end + 1]);
        }
        k += 1;
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The label text between `` `( `` and `)` of each label hole of `text`, in order.
pub fn labels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("`(") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_string());
        rest = &after[end..];
    }
    out
}

/// Prints a hole.
pub fn format_hole(h: &Hole, label: Option<&str>) -> String {
    let mut s = match h.kind {
        Kind::R if h.value == 255 => "RZ".to_string(),
        Kind::UR if h.value == 63 => "URZ".to_string(),
        Kind::P if h.value == 7 => "PT".to_string(),
        Kind::UP if h.value == 7 => "UPT".to_string(),
        Kind::R => format!("R{}", h.value),
        Kind::UR => format!("UR{}", h.value),
        Kind::P => format!("P{}", h.value),
        Kind::UP => format!("UP{}", h.value),
        Kind::B => format!("B{}", h.value),
        Kind::X if h.value < 0 => format!("-{:#x}", h.value.unsigned_abs()),
        Kind::X => format!("{:#x}", h.value),
        Kind::Label => match label {
            Some(l) => format!("`({l})"),
            None => format!("{:#x}", h.value),
        },
        Kind::F16 | Kind::F32 | Kind::F64 => format_float(float_value(h.kind, h.value)),
    };
    if h.reuse {
        s.push_str(".reuse");
    }
    s
}

/// Prints an instruction from its parts; `labels` names the label holes in order.
pub fn render(guard: Option<Guard>, template: &str, holes: &[Hole], labels: &[String]) -> String {
    render_with(guard, template, holes, labels, &|_| None)
}

/// [`render`], with the text of hole `k` replaced by `over(k)` where that is given (a
/// relocation's expression in place of the zeros the file holds, as nvdisasm prints it).
pub fn render_with(
    guard: Option<Guard>,
    template: &str,
    holes: &[Hole],
    labels: &[String],
    over: &dyn Fn(usize) -> Option<String>,
) -> String {
    let mut out = String::new();
    if let Some(g) = guard {
        let u = if g.uniform { "U" } else { "" };
        let p = if g.pred == 7 {
            format!("{u}PT")
        } else {
            format!("{u}P{}", g.pred)
        };
        let _ = write!(out, "@{}{p} ", if g.neg { "!" } else { "" });
    }
    let mut rest = template;
    let (mut h, mut l) = (0, 0);
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            break;
        };
        if let Some(hole) = holes.get(h) {
            let label = (hole.kind == Kind::Label)
                .then(|| labels.get(l).map(String::as_str))
                .flatten();
            if hole.kind == Kind::Label {
                l += 1;
            }
            if let Some(text) = over(h) {
                out.push_str(&text);
                h += 1;
                rest = &rest[start + end + 1..];
                continue;
            }
            if hole.reuse && hole.kind == Kind::R && rest[start + end + 1..].starts_with('|') {
                let plain = Hole {
                    reuse: false,
                    ..hole.clone()
                };
                out.push_str(&format_hole(&plain, label));
                out.push_str("|.reuse");
                h += 1;
                rest = &rest[start + end + 2..];
                continue;
            }
            out.push_str(&format_hole(hole, label));
        }
        h += 1;
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_an_instruction_into_template_and_holes() {
        let p = parse("@!P0 IADD3.X R5, R12.reuse, UR7, RZ, P1, !PT").unwrap();
        assert_eq!(
            p.guard,
            Some(Guard {
                neg: true,
                pred: 0,
                uniform: false
            })
        );
        assert_eq!(p.template, "IADD3.X {R}, {R}, {UR}, {R}, {P}, !{P}");
        let v: Vec<i64> = p.holes.iter().map(|h| h.value).collect();
        assert_eq!(v, [5, 12, 7, 255, 1, 7]);
        assert!(p.holes[1].reuse);
        assert_eq!(
            render(p.guard, &p.template, &p.holes, &[]),
            "@!P0 IADD3.X R5, R12.reuse, UR7, RZ, P1, !PT"
        );
        let p = parse("LDG.E.128 R4, desc[UR4][R4.64+-0x10]").unwrap();
        assert_eq!(p.template, "LDG.E.128 {R}, desc[{UR}][{R}.64+{X}]");
        let p = parse("FFMA R0, -R56, R3, 1.84467440737095516160e+19").unwrap();
        assert_eq!(p.template, "FFMA {R}, -{R}, {R}, {F}");
        assert_eq!(
            render(None, &p.template, &p.holes, &[]),
            "FFMA R0, -R56, R3, 1.84467440737095516160e+19"
        );
        let p = parse("S2R R3, SR_TID.X").unwrap();
        assert_eq!(p.template, "S2R {R}, SR_TID.X");
        let p = parse("BSSY B0, `(.L_x_0)").unwrap();
        assert_eq!(p.template, "BSSY {B}, {L}");
        let p = parse("HFMA2.MMA R0, -RZ, RZ, 0, 1.847743988037109375e-06").unwrap();
        assert_eq!(
            render(None, &p.template, &p.holes, &[]),
            "HFMA2.MMA R0, -RZ, RZ, 0, 1.847743988037109375e-06"
        );
    }

    #[test]
    fn floats_print_as_nvdisasm_prints_them() {
        for (v, s) in [
            (1.0f32, "1"),
            (-8388608.0, "-8388608"),
            (0.00390625, "0.00390625"),
            (std::f32::consts::LOG2_E, "1.4426950216293334961"),
            (1.175_494_4e-38, "1.175494350822287508e-38"),
            (2.328_306_4e-10, "2.3283064365386962891e-10"),
            (18446744073709551616.0, "1.84467440737095516160e+19"),
        ] {
            assert_eq!(format_float(f64::from(v)), s);
        }
    }
}
