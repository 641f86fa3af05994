//! Scoreboards for the variable-latency instructions: each load, store, shuffle or
//! conversion whose latency the warp cannot know sets one of scoreboards 1 to 5, and an
//! instruction waits on it only where it touches that instruction's registers — reads or
//! overwrites a result still to come, or overwrites a source still to be read — so that
//! independent loads are in flight together. Where code may be reached from elsewhere (after
//! a label) and before barriers, fences and the end of the kernel, everything is waited for.
//! Scoreboard 0 stays with the copy groups (`LDGDEPBAR`, see `control`).
//!
//! Such an instruction may read its sources long after it issues (the GPU faulted on
//! addresses overwritten 8 cycles after their load, where the memory system was busy), so
//! overwriting a source waits until it has been read: on the instruction's read scoreboard,
//! which the first such overwrite gives it afterwards (as ptxas's code has `R1:W2`, reads
//! released on 1 and results on 2), so that the wait is for the read, not the whole load.

use super::control::predicate;
use crate::table::Control;

/// The scoreboards handed out, round the pending ones.
const FIRST: u8 = 1;
const LAST: u8 = 5;
/// The wait mask of every scoreboard handed out.
const ALL: u8 = ((1 << (LAST + 1)) - 1) & !((1 << FIRST) - 1);
/// The field's value for no scoreboard.
const NONE: u8 = 7;

/// A register as the tracker numbers them: `Rn` is n, `URn` 256 + n, `Pn` 512 + n.
type Reg = u16;
/// Where [`registers`] numbers predicate registers: `P0` is `PREDICATES` (general registers
/// count from 0, uniform ones from 256, uniform predicates from 520).
pub const PREDICATES: Reg = 512;

/// A variable-latency instruction still owed: where its control bits are, its scoreboard,
/// the registers it will write and the ones it may have yet to read.
struct Pending {
    at: usize,
    sb: u8,
    writes: Vec<Reg>,
    reads: Vec<Reg>,
    /// The scoreboard released once its sources are read, where it has one.
    read_sb: Option<u8>,
}

#[derive(Default)]
pub struct Scoreboards {
    /// Oldest first.
    pending: Vec<Pending>,
    /// Whatever may be pending is unknown (code reached from elsewhere).
    unknown: bool,
}

impl Scoreboards {
    /// What follows may be reached from elsewhere: its first instruction waits for every
    /// scoreboard.
    pub fn label(&mut self) {
        self.unknown = true;
    }

    /// `c` (from [`super::control::control`], which marks a scoreboard to set with any
    /// value below 7) with the scoreboard it sets and the ones `text` must wait for.
    /// `controls` holds the control bits of the instructions before it (`text` is the
    /// next): an instruction whose source `text` overwrites is given a read scoreboard
    /// there.
    pub fn issue(&mut self, c: Control, text: &str, controls: &mut [Option<Control>]) -> Control {
        let (reads, writes) = registers(text);
        let opcode = text.split(['.', ' ']).next().unwrap_or(text);
        let drain = self.unknown
            || matches!(
                opcode,
                "BAR"
                    | "MEMBAR"
                    | "FENCE"
                    | "ERRBAR"
                    | "CCTL"
                    | "EXIT"
                    | "RET"
                    | "BSYNC"
                    | "WARPSYNC"
            );
        let sets_write = c.write_barrier < NONE && c.write_barrier >= FIRST;
        let sets_read = c.read_barrier < NONE && c.read_barrier >= FIRST;
        let mut wait = if drain { ALL } else { 0 };
        // After a fence, ptxas's `CCTL.IVALL` waits on scoreboard 0 as well.
        if opcode == "CCTL" {
            wait |= 1;
        }
        if !drain {
            // Results still to come that `text` reads or overwrites.
            for p in &self.pending {
                if p.writes
                    .iter()
                    .any(|r| reads.contains(r) || writes.contains(r))
                {
                    wait |= 1 << p.sb;
                }
            }
            // Sources still to be read that `text` overwrites.
            for i in 0..self.pending.len() {
                let p = &self.pending[i];
                if wait >> p.sb & 1 == 1 || !p.reads.iter().any(|r| writes.contains(r)) {
                    continue;
                }
                let sb = match p.read_sb {
                    Some(sb) => sb,
                    None => {
                        let sb = self.unheld().unwrap_or(p.sb);
                        let at = p.at;
                        self.pending[i].read_sb = Some(sb);
                        if let Some(Some(owner)) = controls.get_mut(at) {
                            owner.read_barrier = sb;
                        }
                        sb
                    }
                };
                wait |= 1 << sb;
            }
        }
        self.unknown = false;
        self.pending.retain_mut(|p| {
            if wait >> p.sb & 1 == 1 {
                return false;
            }
            if p.read_sb.is_some_and(|sb| wait >> sb & 1 == 1) {
                p.reads.clear();
                p.read_sb = None;
            }
            !p.writes.is_empty() || !p.reads.is_empty()
        });
        let mut c = Control {
            wait: c.wait | wait,
            ..c
        };
        if sets_write || sets_read {
            let sb = self.unheld().unwrap_or_else(|| self.youngest());
            if sets_write {
                c.write_barrier = sb;
            }
            if sets_read {
                c.read_barrier = sb;
            }
            self.pending.push(Pending {
                at: controls.len(),
                sb,
                writes: if sets_write { writes } else { Vec::new() },
                reads,
                read_sb: sets_read.then_some(sb),
            });
        }
        c
    }

    /// A scoreboard no pending instruction holds, for its results or its reads.
    fn unheld(&self) -> Option<u8> {
        (FIRST..=LAST).find(|&sb| {
            self.pending
                .iter()
                .all(|p| p.sb != sb && p.read_sb != Some(sb))
        })
    }

    /// The youngest pending instruction's scoreboard, shared when none is free (waiting on
    /// it then waits for both; results are mostly read in the order they were asked for,
    /// so the older ones stay apart).
    fn youngest(&self) -> u8 {
        self.pending.last().map_or(FIRST, |p| p.sb)
    }
}

/// The registers `text` reads and writes, erring wide: every register operand counts as
/// many consecutive registers as the widest value the instruction moves (4 for `.128`,
/// `LDSM …4` and `HMMA`; 2 for `.64`, `.WIDE` and 64-bit types), a 64-bit address (`.64`)
/// as two, and a memory descriptor's uniform register as two.
pub fn registers(text: &str) -> (Vec<Reg>, Vec<Reg>) {
    let (mnemonic, operands) = text.split_once(' ').unwrap_or((text, ""));
    let mods: Vec<&str> = mnemonic.split('.').collect();
    let opcode = mods[0];
    let width: u16 = if mods.contains(&"128") || opcode == "HMMA" || opcode == "LDSM" {
        4
    } else if mods
        .iter()
        .any(|m| matches!(*m, "64" | "WIDE" | "F64" | "U64" | "S64"))
        || opcode.starts_with('D')
    {
        2
    } else {
        1
    };
    let ops: Vec<&str> = operands.split(',').map(str::trim).collect();
    // Operands written: none for stores; for `SHFL` and `ATOMG` the value after the
    // predicate; for the rest the first, and a predicate second (`ISETP P0, P1, …`, a carry).
    let store = matches!(opcode, "STG" | "STS" | "STL" | "RED" | "LDGSTS" | "ST");
    let written: Vec<usize> = if store {
        vec![]
    } else if matches!(opcode, "SHFL" | "ATOMG") || ops.get(1).is_some_and(|o| is_predicate(o)) {
        vec![0, 1]
    } else {
        vec![0]
    };
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for (i, op) in ops.iter().enumerate() {
        let into = if written.contains(&i) && !op.starts_with('[') && !op.contains("desc[") {
            &mut writes
        } else {
            &mut reads
        };
        operand_registers(op, width, into);
    }
    (reads, writes)
}

fn is_predicate(op: &str) -> bool {
    predicate(op.trim_start_matches('!')).is_some()
}

/// The registers named in one operand (`R4`, `-R4.reuse`, `[R2.64+0x10]`,
/// `desc[UR4][R12.64]`, `!P0`), each register `width` wide unless it is an address.
fn operand_registers(op: &str, width: u16, into: &mut Vec<Reg>) {
    let bytes = op.as_bytes();
    let mut i = 0;
    let mut in_brackets = false;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'[' {
            in_brackets = true;
        } else if c == b']' {
            in_brackets = false;
        }
        let starts = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        let (base, skip) = match (c, bytes.get(i + 1)) {
            (b'U', Some(b'R')) if starts => (256, 2),
            (b'U', Some(b'P')) if starts => (520, 2),
            (b'R', _) if starts => (0, 1),
            (b'P', _) if starts => (PREDICATES, 1),
            _ => {
                i += 1;
                continue;
            }
        };
        let digits: String = op[i + skip..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        i += skip + digits.len();
        let Ok(n) = digits.parse::<u16>() else {
            continue;
        };
        let wide_address = op[i..].starts_with(".64");
        let count = if base == 256 && op[..i].ends_with(&format!("desc[UR{n}")) {
            2
        } else if in_brackets {
            if wide_address {
                2
            } else {
                1
            }
        } else if wide_address {
            width.max(2)
        } else if base == 0 {
            width
        } else {
            1
        };
        into.extend((0..count).map(|k| base + n + k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::control::stalled;

    /// Scoreboards with the control bits issued so far, as the code generator keeps them.
    #[derive(Default)]
    struct Track {
        s: Scoreboards,
        controls: Vec<Option<Control>>,
    }

    impl Track {
        fn issue(&mut self, c: Control, text: &str) -> Control {
            let c = self.s.issue(c, text, &mut self.controls);
            self.controls.push(Some(c));
            c
        }

        /// The control bits of the `i`th instruction as they stand now.
        fn at(&self, i: usize) -> Control {
            self.controls[i].expect("an instruction")
        }
    }

    fn load(sb_marker: u8) -> Control {
        Control {
            stall: 3,
            yield_bit: true,
            write_barrier: sb_marker,
            read_barrier: NONE,
            wait: 0,
            extra: 0,
        }
    }

    fn alu() -> Control {
        Control {
            write_barrier: NONE,
            ..load(NONE)
        }
    }

    #[test]
    fn operands_name_their_registers() {
        let (r, w) = registers("LDG.E.128.CONSTANT R16, desc[UR4][R12.64]");
        assert_eq!(w, vec![16, 17, 18, 19]);
        assert_eq!(r, vec![260, 261, 12, 13]);
        let (r, w) = registers("STG.E.64 desc[UR4][R8.64], R2");
        assert!(w.is_empty());
        assert_eq!(r, vec![260, 261, 8, 9, 2, 3]);
        let (r, w) = registers("IMAD.WIDE.U32 R14, R13, 0x4, R2");
        assert_eq!((r, w), (vec![13, 14, 2, 3], vec![14, 15]));
        let (r, w) = registers("SHFL.BFLY PT, R9, R13, R2, R3");
        assert_eq!((r, w), (vec![13, 2, 3], vec![9]));
        let (r, w) = registers("ISETP.GE.U32.AND P6, PT, R12, R10, !P0");
        assert_eq!((r, w), (vec![12, 10, 512], vec![518]));
        let (r, _) = registers("LDL.64 R4, [R1+0x8]");
        assert_eq!(r, vec![1]);
    }

    #[test]
    fn independent_loads_overlap_and_a_reader_waits_for_its_own() {
        let mut s = Track::default();
        let a = s.issue(load(1), "LDG.E R4, desc[UR4][R2.64]");
        let b = s.issue(load(1), "LDG.E R5, desc[UR4][R6.64]");
        assert_ne!(a.write_barrier, b.write_barrier);
        assert_eq!((a.wait, b.wait), (0, 0));
        // Reading R5 waits for the second load only.
        let add = s.issue(alu(), "FADD R8, R5, R9");
        assert_eq!(add.wait, 1 << b.write_barrier);
        // Overwriting a load's address waits until the load has read it; what it has not
        // read, not.
        s.issue(load(1), "LDG.E R6, desc[UR4][R10.64]");
        let mov = s.issue(alu(), "MOV R10, 0x0");
        assert_eq!(mov.wait, 1 << s.at(3).read_barrier);
        let mov = s.issue(alu(), "MOV R8, 0x0");
        assert_eq!(mov.wait, 0);
        // The first load may still have to read R3.
        assert_eq!(
            s.issue(alu(), "MOV R3, 0x0").wait,
            1 << s.at(0).read_barrier
        );
        // After a label, everything.
        s.issue(load(1), "LDG.E R4, desc[UR4][R2.64]");
        s.s.label();
        assert_eq!(s.issue(alu(), "MOV R20, 0x0").wait, ALL);
    }

    #[test]
    fn overwriting_a_load_s_address_waits_for_its_read_not_the_load() {
        let mut s = Track::default();
        let ld = s.issue(load(1), "LDG.E R6, desc[UR4][R10.64]");
        assert_eq!(ld.read_barrier, NONE);
        // However late the overwrite comes, the load is given a read scoreboard of its
        // own, and the overwrite waits on that.
        s.issue(stalled(alu(), 15), "FADD R8, R9, R9");
        s.issue(stalled(alu(), 15), "FADD R8, R9, R9");
        let mov = s.issue(alu(), "MOV R11, 0x0");
        let read = s.at(0).read_barrier;
        assert!((FIRST..=LAST).contains(&read) && read != ld.write_barrier);
        assert_eq!(mov.wait, 1 << read);
        // Its result is still to come.
        assert_eq!(
            s.issue(alu(), "FADD R0, R6, R6").wait,
            1 << ld.write_barrier
        );
        // Both scoreboards are free again: another load takes the first.
        assert_eq!(
            s.issue(load(1), "LDG.E R7, desc[UR4][R12.64]")
                .write_barrier,
            FIRST
        );
    }

    #[test]
    fn overwriting_a_shuffle_s_source_waits_for_its_read() {
        let mut s = Track::default();
        let sh = s.issue(load(1), "SHFL.BFLY PT, R4, R2, R3, R5");
        let mov = s.issue(alu(), "MOV R3, 0x1");
        assert_ne!(s.at(0).read_barrier, sh.write_barrier);
        assert_eq!(mov.wait, 1 << s.at(0).read_barrier);
        // Once read, another source is free to overwrite.
        assert_eq!(s.issue(alu(), "MOV R5, 0x1").wait, 0);
    }

    #[test]
    fn with_every_scoreboard_held_an_overwrite_waits_for_the_whole_load() {
        let mut s = Track::default();
        let sbs: Vec<u8> = (0..5)
            .map(|i| {
                s.issue(
                    load(1),
                    &format!("LDG.E R{}, desc[UR4][R{}.64]", 10 + i, 20 + 2 * i),
                )
                .write_barrier
            })
            .collect();
        let mov = s.issue(alu(), "MOV R22, 0x0");
        assert_eq!(mov.wait, 1 << sbs[1]);
        assert_eq!(s.at(1).read_barrier, sbs[1]);
    }

    #[test]
    fn a_store_holds_its_sources_until_read() {
        let mut s = Track::default();
        let store = Control {
            write_barrier: NONE,
            read_barrier: 1,
            ..alu()
        };
        let st = s.issue(store, "STS [R8], R2");
        assert!(st.read_barrier >= FIRST && st.read_barrier <= LAST);
        assert_eq!(s.issue(alu(), "FADD R9, R2, R2").wait, 0);
        assert_eq!(s.issue(alu(), "MOV R2, 0x1").wait, 1 << st.read_barrier);
    }

    #[test]
    fn a_sixth_pending_load_shares_the_youngest_scoreboard() {
        let mut s = Track::default();
        let sbs: Vec<u8> = (0..6)
            .map(|i| {
                s.issue(load(1), &format!("LDS R{}, [R40]", 10 + i))
                    .write_barrier
            })
            .collect();
        assert_eq!(sbs, vec![1, 2, 3, 4, 5, 5]);
        // Reading the first load's register waits for it alone; the sixth's waits for the
        // fifth too.
        assert_eq!(s.issue(alu(), "FADD R0, R10, R10").wait, 1 << 1);
        assert_eq!(s.issue(alu(), "FADD R0, R15, R15").wait, 1 << 5);
        assert_eq!(s.issue(alu(), "FADD R0, R14, R14").wait, 0);
    }
}
