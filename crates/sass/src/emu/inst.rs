//! A kernel's code as the emulator reads it: every 128-bit word through the decoder
//! ([`Tables::decode`]), its template split into opcode, modifiers and typed operands.
//!
//! The template keeps everything that is not a number (`IADD3.X {R}, {R}, {UR}, {R}, {P},
//! !{P}`), so the operand forms here are exactly the shapes nvdisasm prints; a shape this
//! module does not know is kept as text and refused when the instruction runs.

use crate::syntax::{Guard, Hole, Kind};
use crate::table::{Control, Tables};

use super::EmuError;

/// The special registers read by `S2R`, `S2UR` and `CS2R`; another is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// `SR_TID.X` .. `.Z` (0..2), `SR_CTAID.X` .. `.Z` (0..2).
    Tid(usize),
    Ctaid(usize),
    LaneId,
    /// `SR_CgaCtaId`: the block's rank in its cluster.
    CgaCtaId,
    /// `SRZ`, the zero register pair `CS2R` reads.
    Zero,
}

impl Special {
    fn parse(name: &str) -> Option<Special> {
        let xyz = |s: &str| ["X", "Y", "Z"].iter().position(|a| *a == s);
        Some(match name {
            "SR_LANEID" => Special::LaneId,
            "SR_CgaCtaId" => Special::CgaCtaId,
            "SRZ" => Special::Zero,
            _ => match name.split_once('.')? {
                ("SR_TID", d) => Special::Tid(xyz(d)?),
                ("SR_CTAID", d) => Special::Ctaid(xyz(d)?),
                _ => return None,
            },
        })
    }
}

/// One source or destination operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    /// A general (`R`, 255 = RZ) or uniform (`UR`, 63 = URZ) register, with the modifiers
    /// printed around it: `-` (negate), `~` (bitwise not), `|..|` (absolute value).
    Reg {
        uniform: bool,
        n: u8,
        neg: bool,
        not: bool,
        abs: bool,
    },
    /// One f16 half of a register, as both halves of an f16x2 operand: `R.H0_H0` (the low
    /// half) or `R.H1_H1`.
    Half { n: u8, high: bool },
    /// A predicate (`P`, 7 = PT) or uniform predicate (`UP`), `!` negating it.
    Pred { uniform: bool, n: u8, not: bool },
    /// A convergence barrier register (`B0`).
    Barrier(u8),
    /// A scoreboard (dependency barrier) named as an operand: `SB0` in `DEPBAR.LE SB0, n`.
    Scoreboard(u8),
    /// An integer immediate, and a negation printed before it.
    Imm(i64),
    /// A float immediate's bits (as the decoder holds them), with `-` and `|..|`.
    Float {
        kind: Kind,
        bits: i64,
        neg: bool,
        abs: bool,
    },
    /// `c[bank][offset]` or `c[bank][R+offset]`.
    Const {
        bank: u32,
        reg: Option<u8>,
        offset: i64,
    },
    /// A memory address: `desc[UR][R.64+imm]` (global), `[R+imm]` / `[UR+imm]` (shared).
    Mem {
        desc: Option<u8>,
        reg: Option<u8>,
        uniform: bool,
        wide: bool,
        offset: i64,
    },
    /// A special register the emulator knows (`SR_TID.X`, `SRZ`).
    Special(Special),
    /// A code address (absolute).
    Label(u64),
}

/// A decoded instruction.
#[derive(Clone, Debug)]
pub struct Inst {
    pub addr: u64,
    pub guard: Option<Guard>,
    /// The opcode without modifiers (`IMAD`).
    pub op: String,
    /// The modifiers in order (`WIDE`, `U32`).
    pub mods: Vec<String>,
    /// The operands, or the text of the first one this module cannot read.
    pub operands: Result<Vec<Operand>, String>,
    pub control: Control,
    /// nvdisasm's text of the instruction, for messages.
    pub text: String,
}

impl Inst {
    /// `IMAD.WIDE.U32`.
    pub fn mnemonic(&self) -> String {
        std::iter::once(self.op.as_str())
            .chain(self.mods.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(".")
    }

    pub fn has(&self, m: &str) -> bool {
        self.mods.iter().any(|x| x == m)
    }
}

/// Decodes `code` (a kernel's `.text` section) into instructions at addresses 0, 16, ...;
/// a word the tables do not decode is kept as that error, raised if it is ever issued.
pub fn decode_all(code: &[u8], tables: &Tables) -> Result<Vec<Result<Inst, EmuError>>, EmuError> {
    if !code.len().is_multiple_of(16) {
        return Err(EmuError::Program(format!(
            "code of {} bytes is not a whole number of 16-byte instructions",
            code.len()
        )));
    }
    Ok(code
        .chunks_exact(16)
        .enumerate()
        .map(|(i, c)| {
            let mut b = [0u8; 16];
            b.copy_from_slice(c);
            let word = u128::from_le_bytes(b);
            let addr = i as u64 * 16;
            let d = tables
                .decode(word, addr)
                .ok_or(EmuError::Undecoded { addr, word })?;
            let template = &tables.forms[d.form].form.template;
            let text = tables.render(&d, &[]);
            Ok(split(addr, d.guard, template, &d.holes, d.control, text))
        })
        .collect())
}

fn split(
    addr: u64,
    guard: Option<Guard>,
    template: &str,
    holes: &[Hole],
    control: Control,
    text: String,
) -> Inst {
    let (mnemonic, rest) = template.split_once(' ').unwrap_or((template, ""));
    let mut parts = mnemonic.split('.');
    let op = parts.next().unwrap_or_default().to_string();
    let mods = parts.map(str::to_string).collect();
    let mut holes = holes.iter();
    let operands = if rest.trim().is_empty() {
        Ok(Vec::new())
    } else {
        rest.split(',')
            .map(|piece| operand(piece.trim(), &mut holes))
            .collect()
    };
    Inst {
        addr,
        guard,
        op,
        mods,
        operands,
        control,
        text,
    }
}

/// Takes the next hole, which must be of one of `kinds`.
fn take<'a>(holes: &mut impl Iterator<Item = &'a Hole>, kinds: &[Kind]) -> Option<&'a Hole> {
    holes.next().filter(|h| kinds.contains(&h.kind))
}

/// One operand from its template text (`-{R}`, `desc[{UR}][{R}.64+{X}]`), consuming its
/// holes.
fn operand<'a>(text: &str, holes: &mut impl Iterator<Item = &'a Hole>) -> Result<Operand, String> {
    let bad = || text.to_string();
    let mut s = text;
    let (mut neg, mut not, mut abs) = (false, false, false);
    loop {
        if let Some(r) = s.strip_prefix('-') {
            neg = true;
            s = r;
        } else if let Some(r) = s.strip_prefix('!') {
            not = true;
            s = r;
        } else if let Some(r) = s.strip_prefix('~') {
            not = true;
            s = r;
        } else if let Some(r) = s.strip_prefix('|').and_then(|r| r.strip_suffix('|')) {
            abs = true;
            s = r;
        } else {
            break;
        }
    }
    let plain = !neg && !not && !abs;
    match s {
        "{R}" | "{UR}" => {
            let h = take(holes, &[Kind::R, Kind::UR]).ok_or_else(bad)?;
            Ok(Operand::Reg {
                uniform: h.kind == Kind::UR,
                n: h.value as u8,
                neg,
                not,
                abs,
            })
        }
        "{R}.H0_H0" | "{R}.H1_H1" if plain => Ok(Operand::Half {
            n: take(holes, &[Kind::R]).ok_or_else(bad)?.value as u8,
            high: s.ends_with("H1_H1"),
        }),
        "{P}" | "{UP}" if !neg && !abs => {
            let h = take(holes, &[Kind::P, Kind::UP]).ok_or_else(bad)?;
            Ok(Operand::Pred {
                uniform: h.kind == Kind::UP,
                n: h.value as u8,
                not,
            })
        }
        "{B}" if plain => Ok(Operand::Barrier(
            take(holes, &[Kind::B]).ok_or_else(bad)?.value as u8,
        )),
        "{X}" if !not && !abs => {
            let h = take(holes, &[Kind::X, Kind::Label]).ok_or_else(bad)?;
            Ok(if h.kind == Kind::Label {
                Operand::Label(h.value as u64)
            } else {
                Operand::Imm(if neg { h.value.wrapping_neg() } else { h.value })
            })
        }
        "{L}" if plain => Ok(Operand::Label(
            take(holes, &[Kind::Label]).ok_or_else(bad)?.value as u64,
        )),
        "{F}" if !not => {
            let h = take(holes, &[Kind::F16, Kind::F32, Kind::F64]).ok_or_else(bad)?;
            Ok(Operand::Float {
                kind: h.kind,
                bits: h.value,
                neg,
                abs,
            })
        }
        _ if !plain => Err(bad()),
        _ if s.starts_with("SB") && !s.contains('{') => s[2..]
            .parse()
            .ok()
            .filter(|&n: &u8| n < 6)
            .map(Operand::Scoreboard)
            .ok_or_else(bad),
        _ if s.starts_with("SR") && !s.contains('{') => {
            Special::parse(s).map(Operand::Special).ok_or_else(bad)
        }
        _ if s.starts_with("c[") => constant(s, holes).ok_or_else(bad),
        _ if s.starts_with("desc[") || s.starts_with('[') => memory(s, holes).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// `c[{X}][{X}]`, `c[{X}][{R}]`, `c[{X}][{R}+{X}]`.
fn constant<'a>(s: &str, holes: &mut impl Iterator<Item = &'a Hole>) -> Option<Operand> {
    let inner = s.strip_prefix("c[{X}][")?.strip_suffix(']')?;
    let bank = take(holes, &[Kind::X])?.value as u32;
    let (reg, offset) = match inner {
        "{X}" => (None, take(holes, &[Kind::X])?.value),
        "{R}" => (Some(take(holes, &[Kind::R])?.value as u8), 0),
        "{R}+{X}" => {
            let r = take(holes, &[Kind::R])?.value as u8;
            (Some(r), take(holes, &[Kind::X])?.value)
        }
        _ => return None,
    };
    Some(Operand::Const { bank, reg, offset })
}

/// `desc[{UR}][{R}.64+{X}]` and the shared forms `[{R}+{X}]`, `[{UR}+{X}]`, `[{R}]`.
fn memory<'a>(s: &str, holes: &mut impl Iterator<Item = &'a Hole>) -> Option<Operand> {
    let (desc, addr) = match s.strip_prefix("desc[{UR}]") {
        Some(rest) => (Some(take(holes, &[Kind::UR])?.value as u8), rest),
        None => (None, s),
    };
    let inner = addr.strip_prefix('[')?.strip_suffix(']')?;
    let (base, has_offset) = match inner.strip_suffix("+{X}") {
        Some(b) => (b, true),
        None => (inner, false),
    };
    let (base, wide) = match base.strip_suffix(".64") {
        Some(b) => (b, true),
        None => (base, false),
    };
    let (reg, uniform) = match base {
        "{R}" => (Some(take(holes, &[Kind::R])?.value as u8), false),
        "{UR}" => (Some(take(holes, &[Kind::UR])?.value as u8), true),
        "" if has_offset => (None, false),
        _ => return None,
    };
    let offset = if has_offset {
        take(holes, &[Kind::X])?.value
    } else {
        0
    };
    Some(Operand::Mem {
        desc,
        reg,
        uniform,
        wide,
        offset,
    })
}
