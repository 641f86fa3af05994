//! The order instructions issue in within straight-line code: a list schedule over the
//! dependencies between them, so that independent work fills the cycles a result takes
//! instead of the warp stalling on it.
//!
//! Between two instructions that touch a common register (one writes what the other reads
//! or writes, predicates and a guard's predicate included), the first stays first; memory
//! accesses, fences and copy-group markers keep their order among themselves; and nothing
//! moves across control flow, barriers, `NOP`s (which pad a long latency) or
//! instructions with a stall of their own. Among the instructions ready to go, the one
//! heading the longest chain of latencies to the end of the run goes first (the earlier
//! in program order on a tie), so loads start early and long chains do not wait for
//! short ones.

use super::control::result_cycles;
use super::scoreboard::{registers, PREDICATES};

/// One instruction as the scheduler sees it: its guard (`"@!P0 "`, or empty), its text,
/// and whether it must stay where it is relative to everything else.
pub struct Item<'a> {
    pub guard: &'a str,
    pub text: &'a str,
    pub pinned: bool,
}

/// Instructions nothing moves across: control flow, barriers, waits, padding.
fn fence(opcode: &str) -> bool {
    matches!(
        opcode,
        "BRA"
            | "BSSY"
            | "BSYNC"
            | "EXIT"
            | "RET"
            | "CALL"
            | "WARPSYNC"
            | "BAR"
            | "NOP"
            | "DEPBAR"
            | "LDGDEPBAR"
            | "MEMBAR"
            | "FENCE"
            | "ERRBAR"
            | "CGAERRBAR"
            | "CCTL"
    )
}

/// Instructions that touch memory other than constants: their order among themselves is
/// kept.
fn memory(opcode: &str) -> bool {
    matches!(
        opcode,
        "LDG"
            | "STG"
            | "LDS"
            | "STS"
            | "LDL"
            | "STL"
            | "LDSM"
            | "LDGSTS"
            | "ATOMG"
            | "ATOMS"
            | "RED"
            | "LD"
            | "ST"
            | "ATOM"
    )
}

fn opcode(text: &str) -> &str {
    let mnemonic = text.split(' ').next().unwrap_or(text);
    mnemonic.split('.').next().unwrap_or(mnemonic)
}

/// The order in which to issue `items`: a permutation of their indices.
pub fn order(items: &[Item]) -> Vec<usize> {
    let mut out = Vec::with_capacity(items.len());
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        if item.pinned || fence(opcode(item.text)) {
            out.extend(order_run(&items[start..i]).into_iter().map(|j| start + j));
            out.push(i);
            start = i + 1;
        }
    }
    out.extend(order_run(&items[start..]).into_iter().map(|j| start + j));
    out
}

/// The registers (as [`registers`] numbers them) `item` reads, its guard's predicate
/// among them, and writes.
fn touched(item: &Item) -> (Vec<u16>, Vec<u16>) {
    let (mut reads, writes) = registers(item.text);
    let guard = item.guard.trim().trim_start_matches(['@', '!']);
    if let Some(n) = guard.strip_prefix('P').and_then(|n| n.parse::<u16>().ok()) {
        reads.push(PREDICATES + n);
    }
    (reads, writes)
}

/// A run with no fence in it, scheduled.
fn order_run(run: &[Item]) -> Vec<usize> {
    let n = run.len();
    if n < 2 {
        return (0..n).collect();
    }
    let regs: Vec<(Vec<u16>, Vec<u16>)> = run.iter().map(touched).collect();
    let mems: Vec<bool> = run.iter().map(|i| memory(opcode(i.text))).collect();
    // successors[i]: the instructions that must come after i.
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting_on = vec![0usize; n];
    for j in 0..n {
        let (rj, wj) = &regs[j];
        for i in 0..j {
            let (ri, wi) = &regs[i];
            let clash = wi.iter().any(|r| rj.contains(r) || wj.contains(r))
                || ri.iter().any(|r| wj.contains(r))
                || (mems[i] && mems[j]);
            if clash {
                successors[i].push(j);
                waiting_on[j] += 1;
            }
        }
    }
    // The longest chain of issue latencies from each instruction to the run's end.
    let mut height = vec![0u32; n];
    for i in (0..n).rev() {
        let mnemonic = run[i].text.split(' ').next().unwrap_or(run[i].text);
        let own = u32::from(result_cycles(mnemonic));
        height[i] = own + successors[i].iter().map(|&j| height[j]).max().unwrap_or(0);
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| waiting_on[i] == 0).collect();
    let mut out = Vec::with_capacity(n);
    while let Some(pick) = ready
        .iter()
        .copied()
        .max_by_key(|&i| (height[i], std::cmp::Reverse(i)))
    {
        ready.retain(|&i| i != pick);
        out.push(pick);
        for &j in &successors[pick] {
            waiting_on[j] -= 1;
            if waiting_on[j] == 0 {
                ready.push(j);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items<'a>(texts: &[&'a str]) -> Vec<Item<'a>> {
        texts
            .iter()
            .map(|t| Item {
                guard: "",
                text: t,
                pinned: false,
            })
            .collect()
    }

    #[test]
    fn loads_start_first_and_dependent_chains_keep_their_order() {
        let run = items(&[
            "IADD3 R1, R2, R3, RZ",
            "IADD3 R4, R1, R3, RZ",
            "LDG.E R8, desc[UR4][R10.64]",
            "FADD R9, R8, R8",
        ]);
        // The load heads the longest chain, so it goes first; the IADD3s keep their order,
        // and the FADD comes after the load it reads.
        assert_eq!(order(&run), vec![2, 0, 1, 3]);
    }

    #[test]
    fn nothing_moves_across_a_fence_and_memory_keeps_its_order() {
        let run = items(&[
            "IADD3 R1, R2, R3, RZ",
            "STG.E desc[UR4][R10.64], R5",
            "LDG.E R8, desc[UR4][R12.64]",
            "BAR.SYNC.DEFER_BLOCKING 0x0",
            "LDS R7, [R6]",
        ]);
        let o = order(&run);
        assert_eq!(o[3], 3);
        assert_eq!(o[4], 4);
        let at = |i| o.iter().position(|&x| x == i).unwrap();
        assert!(at(1) < at(2), "{o:?}");
    }

    #[test]
    fn an_overwrite_waits_for_the_reads_before_it_and_a_guard_reads_its_predicate() {
        let mut run = items(&[
            "ISETP.GE.AND P0, PT, R1, R2, PT",
            "MOV R3, R4",
            "LDG.E R4, desc[UR4][R10.64]",
            "IADD3 R5, R6, R7, RZ",
        ]);
        run[3].guard = "@!P0 ";
        let o = order(&run);
        let at = |i| o.iter().position(|&x| x == i).unwrap();
        // The load overwrites R4, which the MOV reads first; the guarded IADD3 waits for
        // the comparison.
        assert!(at(1) < at(2), "{o:?}");
        assert!(at(0) < at(3), "{o:?}");
    }
}
