//! Control bits for the code generator's instructions: stalls from the latencies measured
//! on the H200, scoreboard 1 for everything whose latency varies, scoreboard 0 counting
//! the groups of asynchronous copies (`LDGDEPBAR`, waited for by `DEPBAR.LE SB0, n`), as
//! ptxas counts them.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::scoreboard::{registers, PREDICATES};
use crate::table::Control;

/// Cycles a fixed-latency instruction whose latency was not measured stalls for: above
/// every fixed-latency ALU result measured on the H200 (4 for FFMA, FADD, FMUL, IMAD).
pub const DEFAULT_STALL: u8 = 6;
/// The scoreboard a variable-latency instruction sets and its successor waits on.
const SCOREBOARD: u8 = 1;
/// The scoreboard `LDGDEPBAR` counts copy groups on. Waiting on it waits for every group,
/// so nothing else uses it.
const COPY_GROUPS: u8 = 0;
/// The most cycles a stall field holds.
const MAX_STALL: u8 = 15;
/// The longest stall ptxas writes with the yield bit set (across the library's code; 12
/// to 15 come only with it clear, and nvdisasm rejects `HMMA` stalling 15 with it set).
const MAX_STALL_WITHOUT_YIELD: u8 = 11;
/// No scoreboard (the field's value 7).
const NONE: u8 = 7;

/// Instructions whose results arrive after a time the issuing warp cannot know: the
/// consumer waits on a scoreboard instead of a stall.
fn variable_latency(mnemonic: &str) -> bool {
    [
        "LDG", "STG", "LDC", "S2R", "S2UR", "LDS", "STS", "MUFU", "ATOMG", "ATOMS", "SHFL", "LDSM",
        "LDGSTS", "F2I", "I2F", "LDL", "STL",
    ]
    .iter()
    .any(|m| mnemonic == *m || mnemonic.starts_with(&format!("{m}.")))
}

/// Single-instruction latencies measured on the H200 (`isa/sm90/latencies.json`): the
/// rows whose chain is one opcode, alone or with a `NOP` a link (whose cycle then counts
/// toward the latency, which errs long).
fn measured() -> &'static HashMap<String, u8> {
    static M: OnceLock<HashMap<String, u8>> = OnceLock::new();
    M.get_or_init(|| {
        let text = include_str!("../../../../isa/sm90/latencies.json");
        let table: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        let rows = table["rows"].as_array().cloned().unwrap_or_default();
        rows.iter()
            .filter_map(|r| {
                let opcode = r["opcode"].as_str()?;
                let per_link = r["per_link"].as_object()?;
                let cycles = r["latency_cycles"].as_f64()?;
                let alone = per_link.keys().all(|k| k == opcode || k == "NOP")
                    && per_link.contains_key(opcode);
                (alone && cycles < 256.0).then(|| (opcode.to_string(), cycles.ceil() as u8))
            })
            .collect()
    })
}

/// Cycles an f64 result (`DMUL`, `F2F.F64.F32`) is given, not measured on the H200:
/// ptxas's code reads them 10 cycles after issue at the earliest, and 15 leaves a margin.
const FP64_STALL: u8 = 15;

/// The cycles a fixed-latency instruction's result takes.
fn latency(opcode: &str) -> u8 {
    let unmeasured = match opcode {
        "DMUL" | "F2F" => FP64_STALL,
        _ => DEFAULT_STALL,
    };
    measured().get(opcode).copied().unwrap_or(unmeasured)
}

/// Cycles of `mnemonic`'s latency beyond what its stall field holds (`HMMA`: 24), which
/// the code generator covers with a `NOP` stalling that long.
pub fn beyond_stall(mnemonic: &str) -> Option<u8> {
    let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
    if variable_latency(mnemonic) {
        return None;
    }
    (latency(opcode) + MARGIN)
        .checked_sub(MAX_STALL)
        .filter(|&c| c > 0)
}

/// Cycles beyond its latency a fixed-latency result takes to reach an instruction outside
/// the ALU pipes that read it (loads, stores, shuffles, conversions, the tensor and f64
/// pipes): ptxas's code never gives those fewer than 5 to 7 cycles after a 4-cycle ALU
/// result (5–6 before `LDG`/`STG`/`LDS`/`SHFL`, 6–7 before `F2I`, 7 before `HMMA`),
/// where another ALU instruction reads it after 4.
const TO_OTHER_PIPES: u8 = 3;

/// Whether `mnemonic` reads its operands outside the fixed-latency ALU pipes (see
/// [`TO_OTHER_PIPES`]).
fn other_pipe(mnemonic: &str) -> bool {
    let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
    variable_latency(mnemonic) || matches!(opcode, "HMMA" | "DMUL" | "F2F")
}

/// Whether `opcode` issues to the pipe of the fused multiply-add (the measured 4-cycle
/// results). Its results reach another instruction of that pipe after their latency and
/// any other one cycle later: ptxas's code reads an `IMAD` result in an `IMAD` after 4
/// cycles and in an `IADD3`, `LOP3` or `ISETP` after 5, and an `IADD3` result in an
/// `IMAD` after 5.
fn fma_pipe(opcode: &str) -> bool {
    matches!(opcode, "IMAD" | "FFMA" | "FMUL" | "FADD" | "VIADD" | "IDP")
}

/// The control bits of `mnemonic` (the text before the first space), given the next
/// instruction's: its stall, and scoreboard 1 marking where a variable-latency instruction
/// sets one (which one, and the waits, are [`super::scoreboard::Scoreboards`]'s).
pub fn control(mnemonic: &str, next: Option<&str>) -> Control {
    let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
    let variable = variable_latency(mnemonic);
    // A store writes no register: its scoreboard is released once its operands are read.
    // So for an asynchronous copy, whose address registers are read after it issues.
    let store = matches!(opcode, "STG" | "STS" | "STL" | "LDGSTS");
    let c = Control {
        stall: 0,
        yield_bit: true,
        write_barrier: if opcode == "LDGDEPBAR" {
            COPY_GROUPS
        } else if variable && !store {
            SCOREBOARD
        } else {
            NONE
        },
        read_barrier: if store { SCOREBOARD } else { NONE },
        wait: 0,
        extra: 0,
    };
    // Two cycles let a variable-latency instruction's scoreboard be set before an
    // instruction waits on it.
    let stall = if variable {
        2
    } else if next.is_some_and(other_pipe) {
        latency(opcode) + TO_OTHER_PIPES
    } else if fma_pipe(opcode) && !next.is_some_and(|n| fma_pipe(n.split('.').next().unwrap_or(n)))
    {
        latency(opcode) + 1
    } else {
        latency(opcode)
    };
    stalled(c, (stall + MARGIN).min(MAX_STALL))
}

/// A cycle added to every stall. On the H100, quench's `add_f32` with each stall at the
/// cycles above summed some elements wrong in some runs (never with each a cycle longer):
/// one of them is a cycle short of what the hardware needs, not yet pinned down.
const MARGIN: u8 = 1;

/// `c` stalling `stall` cycles, with the yield bit as ptxas sets it for that stall.
pub fn stalled(c: Control, stall: u8) -> Control {
    Control {
        stall,
        yield_bit: stall <= MAX_STALL_WITHOUT_YIELD,
        ..c
    }
}

/// Cycles from an instruction writing a predicate to one that it guards (`@P0 …`). ptxas's
/// code never guards an instruction with a predicate sooner than 13 cycles after its writer
/// (`ISETP`, `FSETP`, `PLOP3`, `LOP3`), for branches and ALU instructions alike, where an
/// instruction reading it as an operand (`SEL`, `PLOP3`, a carry) does after 4; on the H100,
/// quench's code guarding 7 cycles after an `ISETP` computed wrong results.
pub const GUARD_LATENCY: u8 = 13;

/// When each predicate register was last written, in issue cycles, so that an instruction
/// it guards waits [`GUARD_LATENCY`] cycles.
#[derive(Default)]
pub struct Guards {
    /// The cycle the instruction being issued issues at.
    cycle: u32,
    written: [Option<u32>; 7],
}

impl Guards {
    /// The control bits `c` of the instruction `text` (guard removed), stalled longer where
    /// the next instruction is guarded by a predicate written too recently. `next_guard` is
    /// that instruction's guard (`"@!P0 "`, or empty); `None` when what follows may be
    /// reached from elsewhere (a label follows, or `text` branches), where every predicate
    /// must be ready.
    pub fn issue(&mut self, c: Control, text: &str, next_guard: Option<&str>) -> Control {
        for p in registers(text).1 {
            if let Some(p) = p.checked_sub(PREDICATES).filter(|&p| p < 7) {
                self.written[usize::from(p)] = Some(self.cycle);
            }
        }
        let ready = |w: Option<u32>| {
            w.map_or(0, |w| {
                u32::from(GUARD_LATENCY + MARGIN).saturating_sub(self.cycle - w)
            })
        };
        let needed = match next_guard {
            Some(g) => predicate(g.trim().trim_start_matches(['@', '!']))
                .map_or(0, |p| ready(self.written[p])),
            None => self.written.iter().map(|w| ready(*w)).max().unwrap_or(0),
        };
        let c = if needed > u32::from(c.stall) {
            stalled(c, needed as u8)
        } else {
            c
        };
        self.cycle += u32::from(c.stall);
        if next_guard.is_none() {
            self.written = [None; 7];
        }
        c
    }
}

/// The number of predicate register `P0`–`P6` named by `operand`.
pub(super) fn predicate(operand: &str) -> Option<usize> {
    let n = operand.strip_prefix('P')?.parse::<usize>().ok()?;
    (n < 7).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_come_from_the_measured_table() {
        assert_eq!(measured().get("FFMA"), Some(&4));
        assert_eq!(control("FFMA", Some("FFMA")).stall, 4 + MARGIN);
        assert_eq!(control("IADD3.X", None).stall, DEFAULT_STALL + MARGIN);
        let load = control("LDG.E.128", None);
        assert_eq!((load.write_barrier, load.wait), (SCOREBOARD, 0));
        assert_eq!(control("FADD", Some("FFMA")).text(), "B------:R-:W-:-:S05");
        assert_eq!(control("LDGDEPBAR", None).text(), "B------:R-:W0:-:S07");
        assert_eq!(beyond_stall("HMMA.16816.F32.BF16"), Some(10));
        assert_eq!(
            control("HMMA.16816.F32.BF16", None).text(),
            "B------:R-:W-:Y:S15"
        );
        assert_eq!(beyond_stall("FFMA"), None);
        // A result read by a load's address or a shuffle waits longer than by an ALU.
        assert_eq!(control("IMAD.WIDE.U32", Some("LDG.E.128")).stall, 8);
        assert_eq!(control("FADD", Some("SHFL.BFLY")).stall, 8);
        assert_eq!(control("FADD", Some("FFMA")).stall, 4 + MARGIN);
        // From the multiply-add pipe to the integer one, a cycle more.
        assert_eq!(control("IMAD", Some("IADD3")).stall, 5 + MARGIN);
        assert_eq!(control("IMAD", Some("IMAD.WIDE.U32")).stall, 4 + MARGIN);
    }

    #[test]
    fn a_guard_waits_for_its_predicate() {
        let alu = || control("IADD3", Some("IADD3"));
        let mut g = Guards::default();
        let set = g.issue(alu(), "ISETP.GE.U32.AND P6, PT, R1, R2, PT", Some("@P6 "));
        assert_eq!(set.stall, GUARD_LATENCY + MARGIN);
        // Another predicate's guard, or a predicate read as an operand, does not wait.
        let mut g = Guards::default();
        g.issue(alu(), "ISETP.GE.U32.AND P6, PT, R1, R2, PT", Some("@P5 "));
        assert_eq!(g.issue(alu(), "MOV R1, R2", Some("")).stall, alu().stall);
        // The cycles between writer and guard count.
        let mut g = Guards::default();
        g.issue(alu(), "IADD3 R1, P0, R2, R3, RZ", Some(""));
        let before = g.issue(alu(), "MOV R1, R2", Some("@!P0 "));
        assert_eq!(before.stall, GUARD_LATENCY + MARGIN - alu().stall);
        // Before a label or a branch's target, every predicate is ready.
        let mut g = Guards::default();
        g.issue(alu(), "ISETP.EQ.U32.AND P0, PT, R1, R2, PT", Some(""));
        let bra = g.issue(alu(), "BRA `(.L_q_0)", None);
        assert_eq!(bra.stall, GUARD_LATENCY + MARGIN - alu().stall);
        assert_eq!(
            g.issue(alu(), "MOV R1, R2", Some("@P0 ")).stall,
            alu().stall
        );
    }
}
