//! Control bits for the code generator's instructions: stalls from the latencies measured
//! on the H200, scoreboard 0 for everything whose latency varies.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::table::Control;

/// Cycles a fixed-latency instruction whose latency was not measured stalls for: above
/// every fixed-latency ALU result measured on the H200 (4 for FFMA, FADD, FMUL, IMAD).
pub const DEFAULT_STALL: u8 = 6;
/// The scoreboard a variable-latency instruction sets and its successor waits on.
const SCOREBOARD: u8 = 0;
/// No scoreboard (the field's value 7).
const NONE: u8 = 7;

/// Instructions whose results arrive after a time the issuing warp cannot know: the
/// consumer waits on a scoreboard instead of a stall.
fn variable_latency(mnemonic: &str) -> bool {
    [
        "LDG", "STG", "LDC", "S2R", "S2UR", "LDS", "STS", "MUFU", "ATOMG", "SHFL",
    ]
    .iter()
    .any(|m| mnemonic == *m || mnemonic.starts_with(&format!("{m}.")))
}

/// Single-instruction latencies measured on the H200 (`isa/sm90/latencies.json`): the
/// rows whose chain is one opcode.
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
                // A chain of this opcode alone, at a latency a stall field can hold.
                (per_link.len() == 1 && per_link.contains_key(opcode) && cycles <= 15.0)
                    .then(|| (opcode.to_string(), cycles.ceil() as u8))
            })
            .collect()
    })
}

/// The control bits of `mnemonic` (the text before the first space), given whether the
/// instruction before it set the scoreboard.
pub fn control(mnemonic: &str, after_variable: bool) -> Control {
    let opcode = mnemonic.split('.').next().unwrap_or(mnemonic);
    let variable = variable_latency(mnemonic);
    // A store writes no register: its scoreboard is released once its operands are read.
    let store = matches!(opcode, "STG" | "STS");
    Control {
        // A variable-latency instruction is followed by a wait; two cycles let the
        // scoreboard be set before it is read.
        stall: if variable {
            2
        } else {
            measured().get(opcode).copied().unwrap_or(DEFAULT_STALL)
        },
        yield_bit: true,
        write_barrier: if variable && !store { SCOREBOARD } else { NONE },
        read_barrier: if store { SCOREBOARD } else { NONE },
        wait: if after_variable { 1 << SCOREBOARD } else { 0 },
        extra: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_come_from_the_measured_table() {
        assert_eq!(measured().get("FFMA"), Some(&4));
        assert_eq!(control("FFMA", false).stall, 4);
        assert_eq!(control("IADD3.X", false).stall, DEFAULT_STALL);
        let load = control("LDG.E.128", false);
        assert_eq!((load.write_barrier, load.wait), (SCOREBOARD, 0));
        assert_eq!(control("FADD", true).wait, 1);
        assert_eq!(control("FADD", true).text(), "B0-----:R-:W-:-:S04");
    }
}
