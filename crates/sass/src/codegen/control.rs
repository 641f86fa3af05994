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
/// The fewest cycles a branch, `BSYNC`, `EXIT` or `WARPSYNC` stalls: ptxas's code never
/// gives them fewer than 5 (every `BSYNC` across the library has exactly 5; the only
/// shorter `BRA` is the unreachable loop after the last `EXIT`). On the H100, quench's
/// code with them stalling a cycle merged split attention into infinities and sampled
/// wrong tokens; with each instruction stalling 8 cycles or more it computed right.
pub const CONTROL_FLOW_STALL: u8 = 5;

/// The fewest cycles between a block barrier (`BAR.SYNC.DEFER_BLOCKING`, which blocks the
/// warp only after it issues) and a memory instruction after it: ptxas's code never reads
/// or writes shared or global memory sooner than 6 cycles after one (127 of its barriers
/// across the library stall exactly 6 where a load follows). On the H100, quench's code
/// loading 1 cycle after the barrier read a counter before another warp's store to it
/// landed (split attention's last block never merged), and was right with that one stall
/// at 8. The code generator stalls every barrier this long.
pub const BARRIER_STALL: u8 = 6;

/// Whether `opcode` (a mnemonic's first part) is one that stalls [`CONTROL_FLOW_STALL`].
pub fn is_control_flow(opcode: &str) -> bool {
    matches!(
        opcode,
        "BRA" | "BSYNC" | "EXIT" | "WARPSYNC" | "RET" | "CALL"
    )
}
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

/// Cycles the scheduler counts for a variable-latency result: about a load from L2.
const VARIABLE_CYCLES: u8 = 30;

/// Cycles until `mnemonic`'s result can be used, as the scheduler weighs chains: its
/// latency, or [`VARIABLE_CYCLES`] for a load, shuffle or the like.
pub(super) fn result_cycles(mnemonic: &str) -> u8 {
    if variable_latency(mnemonic) {
        VARIABLE_CYCLES
    } else {
        latency(mnemonic.split('.').next().unwrap_or(mnemonic))
    }
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

/// Cycles of `mnemonic`'s result beyond what its stall field holds (`HMMA`: 24 cycles of
/// latency), which the code generator covers with a `NOP` stalling that long, so that any
/// reader's wait fits in the stalls of the two.
pub fn beyond_stall(mnemonic: &str) -> Option<u8> {
    let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
    if variable_latency(mnemonic) {
        return None;
    }
    FixedResult::of(opcode)
        .given_to_any()
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

/// A fixed-latency result as its readers see it: the cycles after its writer issues that
/// an instruction may read it, which depend on the reader's pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedResult {
    latency: u8,
    fma: bool,
    floor: u8,
}

impl FixedResult {
    /// The result of an instruction of `opcode` (the mnemonic's first part).
    pub fn of(opcode: &str) -> FixedResult {
        FixedResult {
            latency: latency(opcode),
            fma: fma_pipe(opcode),
            floor: match opcode {
                "IMAD" => 2,
                "MOV" => 3,
                _ => 4,
            },
        }
    }

    /// The fewest cycles after its writer issues at which ptxas's code anywhere in the
    /// library reads a result: 2 after an `IMAD` (into another `IMAD`; 3 into an `IADD3`
    /// or `LEA`), 3 after a `MOV`, 4 after anything else (into the pipes outside the ALUs,
    /// 4 into `MUFU`, 5 into loads, stores and shuffles). What the emulator holds every
    /// code to, ptxas's included: a read sooner than that is certainly too soon.
    pub fn ready_for(self) -> u8 {
        self.floor
    }

    /// The cycles quench's code gives the result before `reader` (an opcode) reads it: the
    /// latency measured on the H200, a cycle more from the multiply-add pipe into another
    /// or back, [`TO_OTHER_PIPES`] more into a pipe outside the ALUs, and the margin.
    fn given_to(self, reader: &str) -> u8 {
        let extra = if other_pipe(reader) {
            TO_OTHER_PIPES
        } else {
            u8::from(self.fma != fma_pipe(reader))
        };
        self.latency + extra + MARGIN
    }

    /// The most cycles any reader is given.
    fn given_to_any(self) -> u8 {
        self.latency + TO_OTHER_PIPES + MARGIN
    }
}

/// The control bits of `mnemonic` (the text before the first space) on its own: scoreboard
/// 1 marking where a variable-latency instruction sets one (which one, and the waits, are
/// [`super::scoreboard::Scoreboards`]'s), and the shortest stall. Stalls for the results
/// of fixed-latency instructions are [`Results`]'.
pub fn control(mnemonic: &str) -> Control {
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
    // instruction waits on it; control flow and barriers take their own (see
    // `CONTROL_FLOW_STALL`, `BARRIER_STALL`).
    let stall = if is_control_flow(opcode) {
        CONTROL_FLOW_STALL
    } else if opcode == "BAR" {
        BARRIER_STALL
    } else if variable {
        2
    } else {
        1
    };
    stalled(c, stall)
}

/// The fixed-latency results not yet readable by every instruction, so that each
/// instruction issues only once what it reads (and what it overwrites) is ready: the
/// instruction before it stalls as long as that takes, and no longer.
#[derive(Default)]
pub struct Results {
    /// The cycle the instruction being issued issues at.
    cycle: u32,
    /// Registers (numbered as [`registers`] numbers them) whose fixed-latency writer issued
    /// at the cycle given, with the writer's opcode.
    pending: Vec<Pending>,
}

/// A fixed-latency result not yet readable by every instruction.
struct Pending {
    register: u16,
    at: u32,
    result: FixedResult,
    writer: String,
    /// Whether an instruction has read it (as an operand or a guard) since.
    read: bool,
}

impl Pending {
    /// The cycle an instruction of `opcode` that reads `reads` and writes `writes` may
    /// issue at, as far as this result goes (0 where it does not touch it).
    fn ready(&self, opcode: &str, reads: &[u16], writes: &[u16]) -> u32 {
        let read = reads.contains(&self.register);
        if !read && !writes.contains(&self.register) {
            return 0;
        }
        let mut given = self.result.given_to(opcode);
        // A predicate overwritten before anything has read it, by another opcode (another
        // pipe, perhaps a shorter one): the older write must land first, and a predicate
        // lands as late as a guard sees it. ptxas's code never overwrites an unread
        // predicate sooner than 12 cycles, and then only with the same opcode.
        if !read && !self.read && self.register >= PREDICATES && self.writer != opcode {
            given = given.max(GUARD_LATENCY + MARGIN);
        }
        self.at + u32::from(given)
    }

    /// The cycle after which nothing waits for this result any more.
    fn landed(&self) -> u32 {
        let mut given = self.result.given_to_any();
        if self.register >= PREDICATES {
            given = given.max(GUARD_LATENCY + MARGIN);
        }
        self.at + u32::from(given)
    }
}

impl Results {
    /// Issues `text` (its guard, e.g. `P0`, apart in `guard`: a guard reads its predicate)
    /// with control bits `c`: lengthens the stalls of the
    /// instructions issued since the last label (`earlier`, in order; `None` for labels),
    /// the latest first, until the registers `text` reads or writes are ready for it, and
    /// records the results it writes. With `drain`, `c`'s own stall covers every result
    /// pending (before a label, and at a branch, where what runs next is not the next
    /// line).
    pub fn issue(
        &mut self,
        c: Control,
        guard: Option<&str>,
        text: &str,
        earlier: &mut [Option<Control>],
        drain: bool,
    ) -> Control {
        let mnemonic = text.split(' ').next().unwrap_or(text);
        let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
        let (reads, writes) = registers(text);
        let needed = self
            .pending
            .iter()
            .map(|p| p.ready(opcode, &reads, &writes))
            .max()
            .unwrap_or(0);
        // Longer stalls before this instruction, as few as it takes.
        let mut short = needed.saturating_sub(self.cycle);
        for p in earlier.iter_mut().rev().map_while(Option::as_mut) {
            if short == 0 {
                break;
            }
            let more = (MAX_STALL - p.stall).min(short as u8);
            *p = stalled(*p, p.stall + more);
            short -= u32::from(more);
            self.cycle += u32::from(more);
        }
        self.pending
            .retain(|p| !writes.contains(&p.register) && p.landed() > self.cycle);
        // A guard's wait is `Guards`'; that it reads its predicate counts here.
        let guard = guard.and_then(predicate).map(|p| PREDICATES + p as u16);
        for p in &mut self.pending {
            p.read |= reads.contains(&p.register) || guard == Some(p.register);
        }
        if !variable_latency(mnemonic) {
            let result = FixedResult::of(opcode);
            self.pending.extend(writes.iter().map(|&register| Pending {
                register,
                at: self.cycle,
                result,
                writer: opcode.to_string(),
                read: false,
            }));
        }
        let mut c = c;
        if drain {
            let ready = self
                .pending
                .iter()
                .map(|p| p.at + u32::from(p.result.given_to_any()))
                .max()
                .unwrap_or(0);
            if ready > self.cycle + u32::from(c.stall) {
                c = stalled(c, ((ready - self.cycle) as u8).min(MAX_STALL));
            }
            self.pending.clear();
        }
        self.cycle += u32::from(c.stall);
        c
    }
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
    fn latencies_come_from_the_measured_table() {
        assert_eq!(measured().get("FFMA"), Some(&4));
        assert_eq!(FixedResult::of("FFMA").given_to("FFMA"), 4 + MARGIN);
        assert_eq!(
            FixedResult::of("IADD3").given_to("IADD3"),
            DEFAULT_STALL + MARGIN
        );
        // From the multiply-add pipe to the integer one or back, a cycle more; into a pipe
        // outside the ALUs (a load's address, a shuffle), three.
        assert_eq!(FixedResult::of("IMAD").given_to("IADD3"), 5 + MARGIN);
        assert_eq!(FixedResult::of("IADD3").given_to("IMAD"), 7 + MARGIN);
        assert_eq!(FixedResult::of("IMAD").given_to("IMAD"), 4 + MARGIN);
        assert_eq!(FixedResult::of("IMAD").given_to("LDG"), 8);
        assert_eq!(FixedResult::of("FADD").given_to("SHFL"), 8);
        // Never below what ptxas's code leaves.
        for op in ["IMAD", "MOV", "IADD3", "FFMA", "LOP3", "HMMA"] {
            let r = FixedResult::of(op);
            for reader in ["IMAD", "IADD3", "LDG", "MUFU", "FFMA"] {
                assert!(r.given_to(reader) > r.ready_for(), "{op} into {reader}");
            }
        }
        assert_eq!(beyond_stall("HMMA.16816.F32.BF16"), Some(13));
        assert_eq!(beyond_stall("FFMA"), None);
    }

    #[test]
    fn an_instruction_on_its_own_stalls_as_little_as_it_can() {
        assert_eq!(control("FFMA").text(), "B------:R-:W-:-:S01");
        let load = control("LDG.E.128");
        assert_eq!(
            (load.write_barrier, load.wait, load.stall),
            (SCOREBOARD, 0, 2)
        );
        assert_eq!(control("LDGDEPBAR").text(), "B------:R-:W0:-:S01");
    }

    /// Issues `lines` through a fresh tracker (the last one draining); their stalls.
    fn stalls(lines: &[&str]) -> Vec<u8> {
        let mut r = Results::default();
        let mut cs: Vec<Option<Control>> = vec![];
        for (i, text) in lines.iter().enumerate() {
            let mnemonic = text.split(' ').next().unwrap();
            let mut c = control(mnemonic);
            if mnemonic == "NOP" {
                c = stalled(c, 2);
            }
            let c = r.issue(c, None, text, &mut cs, i + 1 == lines.len());
            cs.push(Some(c));
        }
        cs.into_iter().map(|c| c.unwrap().stall).collect()
    }

    #[test]
    fn an_instruction_waits_only_for_what_it_reads() {
        // Independent instructions issue a cycle apart; the third reads both results,
        // the FADD's (issued at cycle 1, ready at 1 + 5) the later. The last line drains:
        // the third's result ready for any reader (4 + 3 + 1 cycles after it).
        assert_eq!(
            stalls(&[
                "FFMA R1, R2, R3, R4",
                "FADD R5, R6, R7",
                "FADD R8, R1, R5",
                "EXIT"
            ]),
            vec![1, 5, 1, 7]
        );
        // An overwrite waits too (the older result must not land after it), and a store's
        // data is read in another pipe: 4 + 1 + 2 + 1 cycles.
        assert_eq!(
            stalls(&[
                "FADD R1, R2, R3",
                "FADD R1, R4, R5",
                "STG.E desc[UR4][R2.64], R1",
                "EXIT"
            ]),
            vec![5, 8, 2, CONTROL_FLOW_STALL]
        );
        // A wait longer than one stall field spreads over the instructions before it: the
        // f64 multiply's NOP and the multiply itself.
        let dmul = stalls(&[
            "DMUL R2, R4, R6",
            "NOP",
            "STG.E.64 desc[UR4][R8.64], R2",
            "EXIT",
        ]);
        assert_eq!(
            dmul[..2].iter().sum::<u8>(),
            FP64_STALL + TO_OTHER_PIPES + MARGIN
        );
        // Before a label (the last line drains), every result is ready for any reader.
        assert_eq!(
            stalls(&["FADD R4, R5, R6", "IMAD R1, R2, R3, RZ"]),
            vec![1, 8]
        );
    }

    #[test]
    fn an_unread_predicate_is_overwritten_by_another_pipe_only_once_it_has_landed() {
        let overwrite = |between: &str, second: &str| {
            let s = stalls(&["FSETP.NEU.AND P0, PT, R1, R1, PT", between, second, "EXIT"]);
            s[0] + s[1]
        };
        // An ISETP over an FSETP's unread predicate: a guard's latency after it.
        assert_eq!(
            overwrite("MOV R2, R3", "ISETP.GE.U32.AND P0, PT, R4, R5, PT"),
            GUARD_LATENCY + MARGIN
        );
        // Read in between (the reader waited for it), or the same opcode (the same pipe,
        // in order): no more than before.
        assert!(overwrite("SEL R2, R3, R4, P0", "ISETP.GE.U32.AND P0, PT, R4, R5, PT") < 10);
        assert!(overwrite("MOV R2, R3", "FSETP.GT.AND P0, PT, R4, R5, PT") < 10);
        // Another predicate: nothing to wait for.
        assert!(overwrite("MOV R2, R3", "ISETP.GE.U32.AND P1, PT, R4, R5, PT") < 4);
    }

    #[test]
    fn a_guard_waits_for_its_predicate() {
        let alu = || control("IADD3");
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
