//! The sm_90 encoding tables (`isa/sm90/encoding/forms.json`) and the decoder and encoder
//! over them.
//!
//! An instruction is a 128-bit little-endian word. A *form* is one template of
//! [`crate::syntax`] with the bits that identify it (`mask`/`value`) and, per hole, the bits
//! that hold it. Besides the forms, every instruction has the guard predicate (bits 12..15,
//! negation bit 15) and the control bits ([`Control`]); the operand-reuse flags (bits
//! 122..126) belong to a form's register holes as the probe found them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::syntax::{self, Guard, Hole, Kind};

pub const GUARD_MASK: u128 = 0xf << 12;

/// One hole's bits: runs of `len` word bits from `word_bit` holding value bits from
/// `value_bit`; the value is sign-extended at its top bit when `signed`, then `addend` is
/// added (a code address is relative to the instruction: `addend` is then 16, the next
/// instruction, when the field is an offset from it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    pub kind: Kind,
    pub runs: Vec<[u8; 3]>,
    pub signed: bool,
    pub addend: i64,
    /// The value is an address relative to the instruction's own.
    pub pcrel: bool,
}

impl Field {
    pub fn width(&self) -> u32 {
        self.runs
            .iter()
            .map(|r| u32::from(r[1]) + u32::from(r[2]))
            .max()
            .unwrap_or(0)
    }

    /// The word bits this field occupies.
    pub fn mask(&self) -> u128 {
        self.runs
            .iter()
            .fold(0u128, |m, r| m | (((1u128 << r[2]) - 1) << r[0]))
    }

    pub fn extract(&self, word: u128) -> i64 {
        let mut v: u64 = 0;
        for r in &self.runs {
            let bits = (word >> r[0]) as u64 & ((1u64 << r[2]) - 1);
            v |= bits << r[1];
        }
        let w = self.width();
        let v = if self.signed && w > 0 && w < 64 && v >> (w - 1) & 1 == 1 {
            (v | !((1u64 << w) - 1)) as i64
        } else {
            v as i64
        };
        v.wrapping_add(self.addend)
    }

    /// The word bits holding `value`, or why it does not fit.
    pub fn insert(&self, value: i64) -> Result<u128, String> {
        let v = value.checked_sub(self.addend).ok_or("overflows")?;
        let w = self.width();
        if w == 0 {
            // A value the form fixes.
            return if v == 0 {
                Ok(0)
            } else {
                Err(format!("this form holds only {}", self.addend))
            };
        }
        let fits = if self.signed {
            let half = 1i64 << (w - 1);
            (-half..half).contains(&v)
        } else {
            v >= 0 && (w >= 63 || v < 1i64 << w)
        };
        if !fits {
            return Err(format!(
                "{value} does not fit the {}{w}-bit field",
                if self.signed { "signed " } else { "" }
            ));
        }
        let u = v as u64 & if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
        let mut word = 0u128;
        let mut covered = 0u64;
        for r in &self.runs {
            let m = (1u64 << r[2]) - 1;
            word |= u128::from((u >> r[1]) & m) << r[0];
            covered |= m << r[1];
        }
        if u & !covered != 0 {
            return Err(format!(
                "{value} sets bits the probe did not find in this field (known bits {covered:#x})"
            ));
        }
        Ok(word)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Form {
    pub template: String,
    /// 32 hex digits each.
    pub mask: String,
    pub value: String,
    pub fields: Vec<Field>,
    /// `[bit, hole]`: the reuse flag at `bit` marks hole `hole`.
    pub reuse: Vec<[u8; 2]>,
    /// How many instructions of the probe's corpus had this form.
    pub seen: u64,
    /// The guard is a uniform predicate (`@UP0`).
    pub uniform_guard: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableFile {
    pub format: String,
    pub arch: String,
    pub nvdisasm: String,
    pub forms: Vec<Form>,
}

pub const FORMAT: &str = "quench-sass-forms/1";

/// The control bits every sm_90 instruction carries (positions as Mesa NAK and
/// CuAssembler give them; the probe checks that nvdisasm ignores them and that ptxas's
/// barriers are consistent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Control {
    /// Cycles to stall before issuing the next instruction (bits 105..109).
    pub stall: u8,
    /// Yield hint (bit 109); printed as `Y` when the bit is *clear*.
    pub yield_bit: bool,
    /// Scoreboard set when the result is written (bits 110..113; 7 = none).
    pub write_barrier: u8,
    /// Scoreboard set when the operands have been read (bits 113..116; 7 = none).
    pub read_barrier: u8,
    /// Scoreboards to wait on before issuing (bits 116..122).
    pub wait: u8,
    /// Bits 126..128, which ptxas leaves zero.
    pub extra: u8,
}

pub const CONTROL_MASK: u128 = ((1u128 << 17) - 1) << 105 | 3u128 << 126;
pub const REUSE_MASK: u128 = 0xfu128 << 122;

impl Control {
    pub fn from_word(w: u128) -> Control {
        let f = |at: u32, len: u32| ((w >> at) & ((1u128 << len) - 1)) as u8;
        Control {
            stall: f(105, 4),
            yield_bit: f(109, 1) == 1,
            write_barrier: f(110, 3),
            read_barrier: f(113, 3),
            wait: f(116, 6),
            extra: f(126, 2),
        }
    }

    pub fn to_word(self) -> u128 {
        u128::from(self.stall & 0xf) << 105
            | u128::from(self.yield_bit) << 109
            | u128::from(self.write_barrier & 7) << 110
            | u128::from(self.read_barrier & 7) << 113
            | u128::from(self.wait & 0x3f) << 116
            | u128::from(self.extra & 3) << 126
    }

    /// CuAssembler's notation: `B0-2---:R1:W2:Y:S04` (waits, read and write barriers,
    /// `Y` when yielding, the stall), with `X` for bits 126..128 when set.
    pub fn text(self) -> String {
        let mut s = String::from("B");
        for i in 0..6 {
            s.push(if self.wait >> i & 1 == 1 {
                char::from(b'0' + i)
            } else {
                '-'
            });
        }
        let bar = |b: u8| {
            if b == 7 {
                "-".to_string()
            } else {
                b.to_string()
            }
        };
        s.push_str(&format!(
            ":R{}:W{}:{}:S{:02}",
            bar(self.read_barrier),
            bar(self.write_barrier),
            if self.yield_bit { '-' } else { 'Y' },
            self.stall
        ));
        if self.extra != 0 {
            s.push_str(&format!(":X{}", self.extra));
        }
        s
    }

    pub fn parse(s: &str) -> Result<Control, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() < 5 || parts.len() > 6 {
            return Err(format!("control {s:?} is not B......:R.:W.:.:S.."));
        }
        let waits = parts[0]
            .strip_prefix('B')
            .filter(|w| w.len() == 6)
            .ok_or("wait mask must be B and six places")?;
        let mut wait = 0u8;
        for (i, c) in waits.bytes().enumerate() {
            match c {
                b'-' => {}
                c if c == b'0' + i as u8 => wait |= 1 << i,
                _ => return Err(format!("wait mask place {i} must be '-' or '{i}'")),
            }
        }
        let bar = |p: &str, prefix: char| -> Result<u8, String> {
            let v = p.strip_prefix(prefix).ok_or(format!("expected {prefix}"))?;
            if v == "-" {
                return Ok(7);
            }
            match v.parse::<u8>() {
                Ok(b) if b < 6 => Ok(b),
                _ => Err(format!("barrier {p:?} must be 0..5 or -")),
            }
        };
        let yield_bit = match parts[3] {
            "Y" => false,
            "-" => true,
            p => return Err(format!("yield must be Y or -, not {p:?}")),
        };
        let stall = parts[4]
            .strip_prefix('S')
            .and_then(|v| v.parse::<u8>().ok())
            .filter(|&v| v < 16)
            .ok_or("stall must be S00..S15")?;
        let extra = match parts.get(5) {
            Some(p) => p
                .strip_prefix('X')
                .and_then(|v| v.parse::<u8>().ok())
                .filter(|&v| v < 4)
                .ok_or("extra bits must be X0..X3")?,
            None => 0,
        };
        Ok(Control {
            stall,
            yield_bit,
            write_barrier: bar(parts[2], 'W')?,
            read_barrier: bar(parts[1], 'R')?,
            wait,
            extra,
        })
    }
}

/// A form ready for use.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub form: Form,
    pub mask: u128,
    pub value: u128,
}

/// The loaded tables.
pub struct Tables {
    pub forms: Vec<Compiled>,
    by_template: HashMap<String, Vec<usize>>,
    /// Forms by the low 12 bits of their value (the opcode bits every form fixes).
    by_opcode: HashMap<u16, Vec<usize>>,
}

/// A decoded instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub form: usize,
    pub guard: Option<Guard>,
    pub holes: Vec<Hole>,
    pub control: Control,
}

fn hex128(s: &str) -> Result<u128, String> {
    u128::from_str_radix(s, 16).map_err(|e| format!("{s:?}: {e}"))
}

pub fn hex(v: u128) -> String {
    format!("{v:032x}")
}

impl Tables {
    pub fn from_file(f: TableFile) -> Result<Tables, String> {
        if f.format != FORMAT {
            return Err(format!(
                "tables of format {:?}, expected {FORMAT}",
                f.format
            ));
        }
        let mut forms = Vec::new();
        let mut by_template: HashMap<String, Vec<usize>> = HashMap::new();
        let mut by_opcode: HashMap<u16, Vec<usize>> = HashMap::new();
        for (i, form) in f.forms.into_iter().enumerate() {
            let mask = hex128(&form.mask)?;
            let value = hex128(&form.value)?;
            for fl in &form.fields {
                if fl.runs.iter().any(|r| {
                    u32::from(r[0]) + u32::from(r[2]) > 128
                        || u32::from(r[1]) + u32::from(r[2]) > 64
                        || r[2] == 0
                }) {
                    return Err(format!(
                        "form {i} ({}): a field's bits are out of range",
                        form.template
                    ));
                }
            }
            if mask & 0xfff != 0xfff {
                return Err(format!(
                    "form {i} ({}) does not fix the opcode bits 0..12",
                    form.template
                ));
            }
            // Code addresses are labels in assembly text (`{L}`), numbers in raw listings.
            let pcrel: Vec<bool> = form.fields.iter().map(|f| f.pcrel).collect();
            by_template
                .entry(syntax::with_labels(&form.template, &pcrel))
                .or_default()
                .push(i);
            by_opcode.entry((value & 0xfff) as u16).or_default().push(i);
            forms.push(Compiled { form, mask, value });
        }
        // Most specific first (more identifying bits), then the most common.
        for list in by_opcode.values_mut() {
            list.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(forms[i].mask.count_ones()),
                    std::cmp::Reverse(forms[i].form.seen),
                )
            });
        }
        for list in by_template.values_mut() {
            list.sort_by_key(|&i| std::cmp::Reverse(forms[i].form.seen));
        }
        Ok(Tables {
            forms,
            by_template,
            by_opcode,
        })
    }

    /// The tables shipped in `isa/sm90/encoding/forms.json`.
    pub fn sm90() -> Result<&'static Tables, String> {
        static T: std::sync::OnceLock<Result<Tables, String>> = std::sync::OnceLock::new();
        T.get_or_init(|| {
            let text = include_str!("../../../isa/sm90/encoding/forms.json");
            let f: TableFile = serde_json::from_str(text)
                .map_err(|e| format!("isa/sm90/encoding/forms.json: {e}"))?;
            Tables::from_file(f)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Decodes one instruction at `addr`; label holes hold absolute addresses.
    pub fn decode(&self, word: u128, addr: u64) -> Option<Decoded> {
        let list = self.by_opcode.get(&((word & 0xfff) as u16))?;
        let i = *list
            .iter()
            .find(|&&i| word & self.forms[i].mask == self.forms[i].value)?;
        let form = &self.forms[i].form;
        let mut holes: Vec<Hole> = form
            .fields
            .iter()
            .map(|f| {
                let mut v = f.extract(word);
                if f.pcrel {
                    v = v.wrapping_add(addr as i64);
                }
                Hole {
                    kind: f.kind,
                    value: v,
                    reuse: false,
                }
            })
            .collect();
        for [bit, hole] in &form.reuse {
            if word >> bit & 1 == 1 {
                if let Some(h) = holes.get_mut(usize::from(*hole)) {
                    h.reuse = true;
                }
            }
        }
        let pred = ((word >> 12) & 7) as u8;
        let neg = (word >> 15) & 1 == 1;
        let guard = (pred != 7 || neg).then_some(Guard {
            neg,
            pred,
            uniform: form.uniform_guard,
        });
        Some(Decoded {
            form: i,
            guard,
            holes,
            control: Control::from_word(word),
        })
    }

    /// The text of a decoded instruction; `labels` names its label holes in order.
    pub fn render(&self, d: &Decoded, labels: &[String]) -> String {
        syntax::render(d.guard, &self.forms[d.form].form.template, &d.holes, labels)
    }

    /// [`Tables::render`] with the text of hole `k` replaced by `over(k)` where given.
    pub fn render_with(
        &self,
        d: &Decoded,
        labels: &[String],
        over: &dyn Fn(usize) -> Option<String>,
    ) -> String {
        syntax::render_with(
            d.guard,
            &self.forms[d.form].form.template,
            &d.holes,
            labels,
            over,
        )
    }

    /// Encodes an instruction at `addr` (label holes absolute), trying the forms of its
    /// template from the most common; the error says why none fits.
    pub fn encode(&self, p: &syntax::Parsed, control: Control, addr: u64) -> Result<u128, String> {
        let list = self
            .by_template
            .get(&p.template)
            .ok_or_else(|| format!("no form {:?} in the tables", p.template))?;
        let mut why = String::new();
        'forms: for &i in list {
            let c = &self.forms[i];
            let mut word = c.value;
            for (k, (f, h)) in c.form.fields.iter().zip(&p.holes).enumerate() {
                if f.kind != h.kind {
                    why = format!("operand {k} is {:?}, the form holds {:?}", h.kind, f.kind);
                    continue 'forms;
                }
                let v = if f.pcrel {
                    h.value.wrapping_sub(addr as i64)
                } else {
                    h.value
                };
                match f.insert(v) {
                    Ok(bits) => word |= bits,
                    Err(e) => {
                        why = format!("operand {} ({}): {e}", k + 1, syntax::format_hole(h, None));
                        continue 'forms;
                    }
                }
            }
            for (k, h) in p.holes.iter().enumerate() {
                if h.reuse {
                    match c.form.reuse.iter().find(|r| usize::from(r[1]) == k) {
                        Some(r) => word |= 1u128 << r[0],
                        None => {
                            why = format!("operand {} cannot carry .reuse", k + 1);
                            continue 'forms;
                        }
                    }
                }
            }
            let g = p.guard.unwrap_or(Guard {
                neg: false,
                pred: 7,
                uniform: c.form.uniform_guard,
            });
            if g.uniform != c.form.uniform_guard {
                why = format!(
                    "the guard must be a{} predicate",
                    if c.form.uniform_guard {
                        " uniform"
                    } else {
                        " non-uniform"
                    }
                );
                continue 'forms;
            }
            if g.pred > 7 {
                return Err(format!("guard P{} does not exist (P0..P6, PT)", g.pred));
            }
            word = (word & !GUARD_MASK) | u128::from(g.pred) << 12 | u128::from(g.neg) << 15;
            word |= control.to_word();
            return Ok(word);
        }
        Err(why)
    }
}
