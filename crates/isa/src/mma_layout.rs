//! From probe outputs to the fragment-layout table the interpreter reads.
//!
//! The relation probe measures, for every A slot, which D slots it reaches and which B
//! slot it meets there; the accumulator probe measures where each C slot lands in D.
//! Matrix coordinates follow from that relation alone: A slots that reach the same D
//! slots share a row, A slots that meet the same B slots share a k, B slots that reach
//! the same D slots share a column. The classes are numbered by a fixed rule — rows
//! and k by the first slot that holds them in register-major order (register, then
//! lane, then sub-element), columns in lane-major order — and every measured triple
//! is then checked against the numbering, so a table is written only when the relation
//! is exactly a matrix product.

use std::collections::{BTreeMap, BTreeSet};

use quench_ir::FragRole;
use serde::{Deserialize, Serialize};

use crate::probe_kernels::{slots, MmaElem};
use crate::IsaError;

/// `[lane, reg, sub, row, col]`: element (row, col) of the operand is sub-element
/// `sub` of register `reg` of lane `lane`.
pub type FragEntry = [u32; 5];

/// Layout of one MMA shape and element type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmaLayout {
    pub a: Vec<FragEntry>,
    pub b: Vec<FragEntry>,
    pub c: Vec<FragEntry>,
    pub d: Vec<FragEntry>,
}

/// A slot of a fragment: (lane, reg, sub).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    lane: u32,
    reg: u32,
    sub: u32,
}

/// Slot numbering used by the probe kernels: `(lane * regs + reg) * per + sub`.
fn slot_of(index: u32, regs: u32, per: u32) -> Slot {
    Slot {
        lane: index / (regs * per),
        reg: (index / per) % regs,
        sub: index % per,
    }
}

fn reg_major(s: Slot, per: u32) -> u32 {
    (s.reg * 32 + s.lane) * per + s.sub
}

fn lane_major(s: Slot, regs: u32, per: u32) -> u32 {
    (s.lane * regs + s.reg) * per + s.sub
}

/// Raw outputs of the probes for one element type.
pub struct MmaMeasurement {
    pub elem: MmaElem,
    /// Relation probe output, one array per launch (`high` = 0, then 1 for s8), each
    /// `slots(A) * 32 * regs(C)` accumulator values as f64.
    pub relation: Vec<Vec<f64>>,
    /// Accumulator probe output: `32 * regs(C)` values.
    pub accumulator: Vec<f64>,
}

/// Decode the B slot number a D value names (0 = no contribution).
fn decode_b(elem: MmaElem, relation: &[Vec<f64>], i: usize) -> Result<Option<u32>, IsaError> {
    let as_code = |v: f64| -> Result<u32, IsaError> {
        if v.fract() != 0.0 || !(0.0..=256.0).contains(&v) {
            return Err(IsaError::Probe(format!(
                "{}: D value {v} is not a slot code",
                elem.key()
            )));
        }
        Ok(v as u32)
    };
    let lo = as_code(relation[0][i])?;
    if lo == 0 {
        return Ok(None);
    }
    match elem {
        MmaElem::S8 => {
            let hi_arr = relation
                .get(1)
                .ok_or_else(|| IsaError::Probe("s8 relation needs two launches".into()))?;
            let hi = as_code(hi_arr[i])?;
            if hi == 0 {
                return Err(IsaError::Probe(format!(
                    "s8: launches disagree at output {i}"
                )));
            }
            Ok(Some((hi - 1) * 127 + (lo - 1)))
        }
        _ => Ok(Some(lo - 1)),
    }
}

/// Number the classes of `groups` (class key → member slots) by the smallest member
/// under `order`.
fn number_classes<K: Ord + Clone>(
    groups: &BTreeMap<K, Vec<Slot>>,
    order: impl Fn(Slot) -> u32,
) -> BTreeMap<K, u32> {
    let mut firsts: Vec<(u32, K)> = groups
        .iter()
        .map(|(k, v)| {
            (
                v.iter().map(|s| order(*s)).min().unwrap_or(u32::MAX),
                k.clone(),
            )
        })
        .collect();
    firsts.sort();
    firsts
        .into_iter()
        .enumerate()
        .map(|(i, (_, k))| (k, i as u32))
        .collect()
}

/// Derive the layout of one element type from its measurement.
pub fn derive(m: &MmaMeasurement) -> Result<MmaLayout, IsaError> {
    let elem = m.elem;
    let (dm, dn, dk) = elem.shape().dims();
    let per = elem.per_reg();
    let a_n = slots(elem, FragRole::A);
    let b_n = slots(elem, FragRole::B);
    let c_n = slots(elem, FragRole::C);
    let (a_regs, b_regs, c_regs) = (a_n / 32 / per, b_n / 32 / per, c_n / 32);
    let bad = |msg: String| IsaError::Probe(format!("{}: {msg}", elem.key()));
    if m.relation.iter().any(|r| r.len() != (a_n * c_n) as usize)
        || m.accumulator.len() != c_n as usize
    {
        return Err(bad("probe output has the wrong length".into()));
    }

    // (a, b, d) triples: A slot a times B slot b lands in D slot d.
    let mut triples = vec![];
    for a in 0..a_n {
        for d in 0..c_n {
            if let Some(b) = decode_b(elem, &m.relation, (a * c_n + d) as usize)? {
                if b >= b_n {
                    return Err(bad(format!("B slot {b} out of range")));
                }
                triples.push((a, b, d));
            }
        }
    }
    if triples.len() != (dm * dn * dk) as usize {
        return Err(bad(format!(
            "{} products measured, a {dm}x{dn}x{dk} product has {}",
            triples.len(),
            dm * dn * dk
        )));
    }

    // Classes by what each slot meets.
    let mut a_rows: BTreeMap<BTreeSet<u32>, Vec<Slot>> = BTreeMap::new();
    let mut a_ks: BTreeMap<BTreeSet<u32>, Vec<Slot>> = BTreeMap::new();
    let mut b_cols: BTreeMap<BTreeSet<u32>, Vec<Slot>> = BTreeMap::new();
    let mut reach_a: BTreeMap<u32, (BTreeSet<u32>, BTreeSet<u32>)> = BTreeMap::new();
    let mut reach_b: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for &(a, b, d) in &triples {
        let e = reach_a.entry(a).or_default();
        e.0.insert(d);
        e.1.insert(b);
        reach_b.entry(b).or_default().insert(d);
    }
    if reach_a.len() != a_n as usize || reach_b.len() != b_n as usize {
        return Err(bad("some A or B slots take part in no product".into()));
    }
    for (a, (ds, bs)) in &reach_a {
        let s = slot_of(*a, a_regs, per);
        a_rows.entry(ds.clone()).or_default().push(s);
        a_ks.entry(bs.clone()).or_default().push(s);
    }
    for (b, ds) in &reach_b {
        b_cols
            .entry(ds.clone())
            .or_default()
            .push(slot_of(*b, b_regs, per));
    }
    if a_rows.len() != dm as usize || a_ks.len() != dk as usize || b_cols.len() != dn as usize {
        return Err(bad(format!(
            "found {} rows, {} k and {} columns, expected {dm}, {dk}, {dn}",
            a_rows.len(),
            a_ks.len(),
            b_cols.len()
        )));
    }
    // Rows are numbered by the D slots they reach, register-major; columns likewise
    // lane-major; k by the A slots that hold it, register-major.
    let d_groups_rows: BTreeMap<BTreeSet<u32>, Vec<Slot>> = a_rows
        .keys()
        .map(|ds| {
            (
                ds.clone(),
                ds.iter().map(|d| slot_of(*d, c_regs, 1)).collect(),
            )
        })
        .collect();
    let row_no = number_classes(&d_groups_rows, |s| reg_major(s, 1));
    let d_groups_cols: BTreeMap<BTreeSet<u32>, Vec<Slot>> = b_cols
        .keys()
        .map(|ds| {
            (
                ds.clone(),
                ds.iter().map(|d| slot_of(*d, c_regs, 1)).collect(),
            )
        })
        .collect();
    let col_no = number_classes(&d_groups_cols, |s| lane_major(s, c_regs, 1));
    let k_no = number_classes(&a_ks, |s| reg_major(s, per));

    // Coordinates of every slot.
    let mut a_coord = BTreeMap::new();
    for (a, (ds, bs)) in &reach_a {
        a_coord.insert(*a, (row_no[ds], k_no[bs]));
    }
    // B's k: the k of any A slot it meets (all agree, checked below).
    let mut b_coord: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    let mut d_coord: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    for &(a, b, d) in &triples {
        let (row, k) = a_coord[&a];
        let col = col_no[&reach_b[&b]];
        for (map, key, val, what) in [
            (&mut b_coord, b, (k, col), "B"),
            (&mut d_coord, d, (row, col), "D"),
        ] {
            if let Some(prev) = map.insert(key, val) {
                if prev != val {
                    return Err(bad(format!(
                        "{what} slot {key} has two coordinates {prev:?} and {val:?}"
                    )));
                }
            }
        }
    }
    // Every (row, col, k) must occur exactly once.
    let mut seen = BTreeSet::new();
    for &(a, b, d) in &triples {
        let (row, k) = a_coord[&a];
        let (k2, col) = b_coord[&b];
        if k2 != k || d_coord[&d] != (row, col) || !seen.insert((row, col, k)) {
            return Err(bad(format!(
                "product A{a}*B{b}->D{d} is not one term of a matrix product"
            )));
        }
    }
    for (coords, n, what) in [
        (&a_coord, a_n, "A"),
        (&b_coord, b_n, "B"),
        (&d_coord, c_n, "D"),
    ] {
        let distinct: BTreeSet<_> = coords.values().collect();
        if coords.len() != n as usize || distinct.len() != n as usize {
            return Err(bad(format!(
                "{what} slots do not map one-to-one onto matrix elements"
            )));
        }
    }

    // C: slot c lands in the D slot whose value is c + 1.
    let mut c_coord = BTreeMap::new();
    for (d, v) in m.accumulator.iter().enumerate() {
        if v.fract() != 0.0 || *v < 1.0 || *v > c_n as f64 {
            return Err(bad(format!("accumulator probe: D slot {d} holds {v}")));
        }
        c_coord.insert(*v as u32 - 1, d_coord[&(d as u32)]);
    }
    if c_coord.len() != c_n as usize {
        return Err(bad(
            "accumulator probe: C slots do not map one-to-one onto D".into(),
        ));
    }

    let entries = |coords: &BTreeMap<u32, (u32, u32)>, regs: u32, per: u32| -> Vec<FragEntry> {
        coords
            .iter()
            .map(|(i, (r, c))| {
                let s = slot_of(*i, regs, per);
                [s.lane, s.reg, s.sub, *r, *c]
            })
            .collect()
    };
    Ok(MmaLayout {
        a: entries(&a_coord, a_regs, per),
        b: entries(&b_coord, b_regs, per),
        c: entries(&c_coord, c_regs, 1),
        d: entries(&d_coord, c_regs, 1),
    })
}

/// `[lane, reg, sub, src_lane, col]`: sub-element `sub` of register `reg` of lane
/// `lane` receives column `col` of the row whose address lane `src_lane` supplied.
pub type LdMatrixEntry = [u32; 5];

/// Decode the `ldmatrix` probe output (`32 * num` words).
pub fn derive_ldmatrix(num: u8, words: &[u32]) -> Result<Vec<LdMatrixEntry>, IsaError> {
    let num = num as u32;
    if words.len() != (32 * num) as usize {
        return Err(IsaError::Probe(format!(
            "ldmatrix x{num}: {} words, expected {}",
            words.len(),
            32 * num
        )));
    }
    let mut out = vec![];
    let mut seen = BTreeSet::new();
    for lane in 0..32 {
        for reg in 0..num {
            let w = words[(lane * num + reg) as usize];
            for sub in 0..2 {
                let v = (w >> (16 * sub)) & 0xffff;
                let (src, col) = (v / 8, v % 8);
                if src >= 32 || !seen.insert(v) {
                    return Err(IsaError::Probe(format!(
                        "ldmatrix x{num}: lane {lane} reg {reg} got element {v}"
                    )));
                }
                out.push([lane, reg, sub, src, col]);
            }
        }
    }
    Ok(out)
}

/// The fragment figures of the PTX ISA manual, as formulas, used only to report whether
/// the measured layout agrees with the documentation.
pub fn ptx_isa_figure(elem: MmaElem, role: FragRole, lane: u32, reg: u32, sub: u32) -> (u32, u32) {
    let group = lane / 4;
    let tig = lane % 4;
    match (elem, role) {
        (_, FragRole::C) => (group + 8 * (reg / 2), tig * 2 + reg % 2),
        (MmaElem::S8, FragRole::A) => (group + 8 * (reg % 2), tig * 4 + sub + 16 * (reg / 2)),
        (MmaElem::S8, FragRole::B) => (tig * 4 + sub + 16 * reg, group),
        (_, FragRole::A) => (group + 8 * (reg % 2), tig * 2 + sub + 8 * (reg / 2)),
        (_, FragRole::B) => (tig * 2 + sub + 8 * reg, group),
    }
}

/// Whether every entry of a layout equals the PTX ISA figure.
pub fn agrees_with_ptx_isa(elem: MmaElem, l: &MmaLayout) -> bool {
    [
        (FragRole::A, &l.a),
        (FragRole::B, &l.b),
        (FragRole::C, &l.c),
        (FragRole::C, &l.d),
    ]
    .iter()
    .all(|(role, es)| {
        es.iter()
            .all(|e| ptx_isa_figure(elem, *role, e[0], e[1], e[2]) == (e[3], e[4]))
    })
}
