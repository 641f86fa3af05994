//! Fragment layouts of `mma.sync` and `ldmatrix`, as measured on the GPU and committed
//! to `isa/sm90/mma_layout.json`, and the arithmetic of `mma.sync`.
//!
//! Which lane holds which matrix element is data, never assumed: the interpreter reads
//! it from the table. Until the table has been measured the file is a placeholder and
//! loading it gives [`InterpError::LayoutNotMeasured`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use serde::Deserialize;

use super::block::BlockCtx;
use super::exec::{bytes_at, resolve};
use super::program::CInst;
use super::warp::Warp;
use super::InterpError;
use crate::func::Value;
use crate::types::{AddrSpace, FragRole, MmaShape, Scalar, Type};

/// The format id the layout file must carry.
pub const LAYOUT_FORMAT: &str = "quench.sm90.mma-layout.v1";

const EMBEDDED: &str = include_str!("../../../../isa/sm90/mma_layout.json");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutFile {
    format: String,
    #[serde(default)]
    status: Option<String>,
    /// Device, driver and date of the measurement.
    #[serde(default)]
    measured_on: Option<String>,
    #[serde(default)]
    mma: Option<BTreeMap<String, MmaFile>>,
    #[serde(default)]
    ldmatrix: Option<BTreeMap<String, Vec<[u32; 5]>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MmaFile {
    a: Vec<[u32; 5]>,
    b: Vec<[u32; 5]>,
    c: Vec<[u32; 5]>,
    d: Vec<[u32; 5]>,
}

/// One fragment slot and the matrix element it holds: register `reg` of lane `lane`,
/// sub-element `sub` (16-bit half or byte of the register) ↔ element (`row`, `col`).
/// For `ldmatrix`, `row` is the lane that supplied the row's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub lane: u32,
    pub reg: u32,
    pub sub: u32,
    pub row: u32,
    pub col: u32,
}

/// Layout of the four operands of one MMA shape and element type.
#[derive(Clone, Debug)]
pub struct MmaTables {
    pub a: Vec<Slot>,
    pub b: Vec<Slot>,
    pub c: Vec<Slot>,
    pub d: Vec<Slot>,
}

/// The validated layout tables.
#[derive(Clone, Debug)]
pub struct MmaLayout {
    measured_on: Option<String>,
    mma: BTreeMap<String, MmaTables>,
    ldmatrix: BTreeMap<String, Vec<Slot>>,
}

/// The MMA entries the table may hold: key, (m, n, k), elements per 32-bit register.
const MMA_KEYS: [(&str, (u32, u32, u32), u32); 3] = [
    ("m16n8k16.bf16", (16, 8, 16), 2),
    ("m16n8k16.f16", (16, 8, 16), 2),
    ("m16n8k32.s8", (16, 8, 32), 4),
];

const LDMATRIX_KEYS: [&str; 6] = ["x1", "x2", "x4", "x1.trans", "x2.trans", "x4.trans"];

fn bad(msg: String) -> InterpError {
    InterpError::Layout(msg)
}

/// Check that `entries` map the slots of `regs` registers × `subs` sub-elements of 32
/// lanes one-to-one onto a `rows` × `cols` matrix.
fn validate(
    what: &str,
    entries: &[[u32; 5]],
    regs: u32,
    subs: u32,
    rows: u32,
    cols: u32,
) -> Result<Vec<Slot>, InterpError> {
    let expected = (32 * regs * subs) as usize;
    if entries.len() != expected || (rows * cols) as usize != expected {
        return Err(bad(format!(
            "{what}: {} entries, expected {expected} for a {rows}x{cols} operand",
            entries.len()
        )));
    }
    let mut slots = BTreeSet::new();
    let mut elems = BTreeSet::new();
    let mut out = Vec::with_capacity(expected);
    for &[lane, reg, sub, row, col] in entries {
        if lane >= 32 || reg >= regs || sub >= subs || row >= rows || col >= cols {
            return Err(bad(format!(
                "{what}: entry [{lane}, {reg}, {sub}, {row}, {col}] is out of range"
            )));
        }
        if !slots.insert((lane, reg, sub)) || !elems.insert((row, col)) {
            return Err(bad(format!(
                "{what}: entry [{lane}, {reg}, {sub}, {row}, {col}] repeats a slot or an element"
            )));
        }
        out.push(Slot {
            lane,
            reg,
            sub,
            row,
            col,
        });
    }
    Ok(out)
}

impl MmaLayout {
    /// Parse and validate a layout file's text.
    pub fn from_json(text: &str) -> Result<MmaLayout, InterpError> {
        let file: LayoutFile =
            serde_json::from_str(text).map_err(|e| bad(format!("not a layout file: {e}")))?;
        if file.format != LAYOUT_FORMAT {
            return Err(bad(format!(
                "format `{}`, expected `{LAYOUT_FORMAT}`",
                file.format
            )));
        }
        let (Some(mma_in), Some(ld_in)) = (file.mma, file.ldmatrix) else {
            return match file.status {
                Some(_) => Err(InterpError::LayoutNotMeasured),
                None => Err(bad("the file has no `mma` or no `ldmatrix` tables".into())),
            };
        };
        let mut mma = BTreeMap::new();
        for (key, t) in mma_in {
            let Some(&(_, (m, n, k), per)) = MMA_KEYS.iter().find(|e| e.0 == key) else {
                return Err(bad(format!("unknown mma entry `{key}`")));
            };
            let tables = MmaTables {
                a: validate(&format!("{key}.a"), &t.a, m * k / per / 32, per, m, k)?,
                b: validate(&format!("{key}.b"), &t.b, k * n / per / 32, per, k, n)?,
                c: validate(&format!("{key}.c"), &t.c, m * n / 32, 1, m, n)?,
                d: validate(&format!("{key}.d"), &t.d, m * n / 32, 1, m, n)?,
            };
            mma.insert(key, tables);
        }
        let mut ldmatrix = BTreeMap::new();
        for (key, t) in ld_in {
            if !LDMATRIX_KEYS.contains(&key.as_str()) {
                return Err(bad(format!("unknown ldmatrix entry `{key}`")));
            }
            let num = key[1..2]
                .parse::<u32>()
                .map_err(|_| bad(format!("bad ldmatrix entry `{key}`")))?;
            ldmatrix.insert(
                key.clone(),
                validate(&format!("ldmatrix.{key}"), &t, num, 2, 8 * num, 8)?,
            );
        }
        Ok(MmaLayout {
            measured_on: file.measured_on,
            mma,
            ldmatrix,
        })
    }

    /// The table committed at `isa/sm90/mma_layout.json`, embedded at build time.
    pub fn measured() -> Result<&'static MmaLayout, InterpError> {
        static LOADED: OnceLock<Result<MmaLayout, InterpError>> = OnceLock::new();
        LOADED
            .get_or_init(|| MmaLayout::from_json(EMBEDDED))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Device, driver and date of the measurement, as the file states them.
    pub fn measured_on(&self) -> Option<&str> {
        self.measured_on.as_deref()
    }

    /// The tables of `mma` with `shape` and A/B element type `elem`.
    pub fn mma(&self, shape: MmaShape, elem: Scalar) -> Result<&MmaTables, InterpError> {
        let key = format!("{}.{}", shape.name(), elem.name());
        self.mma
            .get(&key)
            .ok_or_else(|| bad(format!("no entry for mma `{key}`")))
    }

    /// The table of `ldmatrix.x{num}[.trans]`.
    pub fn ldmatrix(&self, num: u8, trans: bool) -> Result<&[Slot], InterpError> {
        let key = format!("x{num}{}", if trans { ".trans" } else { "" });
        self.ldmatrix
            .get(&key)
            .map(Vec::as_slice)
            .ok_or_else(|| bad(format!("no entry for ldmatrix `{key}`")))
    }
}

/// An element of an A or B fragment register: the `sub`-th 16-bit half or byte.
pub(crate) fn element(elem: Scalar, reg: u64, sub: u32) -> f64 {
    match elem {
        Scalar::BF16 => half::bf16::from_bits((reg >> (16 * sub)) as u16).to_f64(),
        Scalar::F16 => half::f16::from_bits((reg >> (16 * sub)) as u16).to_f64(),
        _ => (reg >> (8 * sub)) as u8 as i8 as f64,
    }
}

/// D = A·B + C on full matrices (row-major, `m`×`k`, `k`×`n`, `m`×`n`).
///
/// Floats: each D element is the f64 sum of the products in k order (exact products of
/// 16-bit floats), plus C, rounded to f32 once. The hardware accumulates differently,
/// so results are an approximation of it. Integers: exact, wrapping to 32 bits.
pub(crate) fn multiply(
    int: bool,
    (m, n, k): (u32, u32, u32),
    a: &[f64],
    b: &[f64],
    c: &[u64],
) -> Vec<u64> {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let mut d = Vec::with_capacity(m * n);
    for row in 0..m {
        for col in 0..n {
            let c0 = c[row * n + col];
            if int {
                let mut s = c0 as u32 as i32;
                for i in 0..k {
                    s = s.wrapping_add((a[row * k + i] as i32).wrapping_mul(b[i * n + col] as i32));
                }
                d.push(s as u32 as u64);
            } else {
                let mut s = 0.0f64;
                for i in 0..k {
                    s += a[row * k + i] * b[i * n + col];
                }
                s += f32::from_bits(c0 as u32) as f64;
                let r = s as f32;
                d.push(if r.is_nan() {
                    0x7fff_ffff
                } else {
                    r.to_bits() as u64
                });
            }
        }
    }
    d
}

/// `mma.sync.aligned`: D = A·B + C over the whole warp, elements placed by the table.
pub(crate) fn exec_mma(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    shape: MmaShape,
    [a, b, c]: [Value; 3],
) -> Result<(), InterpError> {
    if active != u32::MAX {
        return Err(InterpError::NotConverged {
            site: ctx.site(w.index, None, ci),
            active,
        });
    }
    let p = ctx.prog;
    let frag = |v: Value, role: FragRole| match p.ty(v) {
        Type::Frag(f) if f.shape == shape && f.role == role && f.is_valid() => Some(f),
        _ => None,
    };
    let (Some(fa), Some(fb), Some(_)) = (
        frag(a, FragRole::A),
        frag(b, FragRole::B),
        frag(c, FragRole::C),
    ) else {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!(
                "operands must be the A, B and C fragments of {}",
                shape.name()
            ),
        ));
    };
    if fa.elem != fb.elem || p.ty(ci.inst.results[0]) != p.ty(c) {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            "A and B differ in element type, or the result is not C's type",
        ));
    }
    let layout = ctx.layout.ok_or(InterpError::LayoutNotMeasured)?;
    let t = layout.mma(shape, fa.elem)?;
    let (ai, bi, cv, o) = (p.info(a), p.info(b), p.info(c), p.info(ci.inst.results[0]));
    if fa.elem != Scalar::I8 {
        ctx.stats.approx_mma_used = true;
    }
    let d = warp_mma(t, shape, fa.elem, |role, reg, lane| {
        let v = match role {
            FragRole::A => ai,
            FragRole::B => bi,
            FragRole::C => cv,
        };
        w.regs.get(v, reg, lane)
    });
    for (lane, regs) in d.iter().enumerate() {
        for (reg, &x) in regs.iter().enumerate() {
            w.regs.set(o, reg as u32, lane as u32, x);
        }
    }
    Ok(())
}

/// One warp's `mma.sync` of `shape` with A and B elements of type `elem`, laid out as `t`
/// says: `reg(role, r, lane)` reads register `r` of a lane's A, B or C fragment; the
/// result is D's registers, `d[lane][r]`. The interpreter and the SASS emulator's `HMMA`
/// both compute it here.
pub fn warp_mma(
    t: &MmaTables,
    shape: MmaShape,
    elem: Scalar,
    reg: impl Fn(FragRole, u32, u32) -> u64,
) -> Vec<Vec<u64>> {
    let (m, n, k) = shape.dims();
    let mut am = vec![0.0; (m * k) as usize];
    for s in &t.a {
        am[(s.row * k + s.col) as usize] = element(elem, reg(FragRole::A, s.reg, s.lane), s.sub);
    }
    let mut bm = vec![0.0; (k * n) as usize];
    for s in &t.b {
        bm[(s.row * n + s.col) as usize] = element(elem, reg(FragRole::B, s.reg, s.lane), s.sub);
    }
    let mut cm = vec![0u64; (m * n) as usize];
    for s in &t.c {
        cm[(s.row * n + s.col) as usize] = reg(FragRole::C, s.reg, s.lane);
    }
    let dm = multiply(elem == Scalar::I8, (m, n, k), &am, &bm, &cm);
    let mut d = vec![vec![0u64; (m * n / 32) as usize]; 32];
    for s in &t.d {
        d[s.lane as usize][s.reg as usize] = dm[(s.row * n + s.col) as usize];
    }
    d
}

/// `ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`: lanes 0..8·num each supply
/// the shared address of one 16-byte row; the table says which lane receives which
/// 16-bit element in which register half.
pub(crate) fn exec_ldmatrix(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    num: u8,
    trans: bool,
    ptr: Value,
) -> Result<(), InterpError> {
    if active != u32::MAX {
        return Err(InterpError::NotConverged {
            site: ctx.site(w.index, None, ci),
            active,
        });
    }
    let p = ctx.prog;
    let o = p.info(ci.inst.results[0]);
    if !matches!(num, 1 | 2 | 4) || o.parts != num as u32 || o.elem.bytes() != 4 {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!("ldmatrix.x{num} yields {num} 32-bit registers"),
        ));
    }
    if !matches!(p.ty(ptr), Type::Ptr(AddrSpace::Shared, _)) {
        return Err(ctx.bad_inst(w.index, ci, "ldmatrix reads through a shared pointer"));
    }
    let layout = ctx.layout.ok_or(InterpError::LayoutNotMeasured)?;
    let table = layout.ldmatrix(num, trans)?;
    let mut rows = vec![[0u16; 8]; 8 * num as usize];
    for (src, row) in rows.iter_mut().enumerate() {
        let loc = resolve(ctx, w, ci, src as u32, ptr, 16, 16)?;
        let Some(bytes) = bytes_at(ctx, loc, 16) else {
            return Err(ctx.bad_inst(w.index, ci, "memory changed under the access"));
        };
        for (e, pair) in row.iter_mut().zip(bytes.chunks(2)) {
            *e = u16::from_le_bytes([pair[0], pair[1]]);
        }
    }
    for (l, regs) in warp_ldmatrix(table, num, &rows).iter().enumerate() {
        for (r, &x) in regs.iter().enumerate() {
            w.regs.set(o, r as u32, l as u32, u64::from(x));
        }
        w.regs.set_prov(o, l as u32, 0);
    }
    Ok(())
}

/// One warp's `ldmatrix.x{num}` laid out as `table` says: `rows[i]` is the 16-byte row
/// whose address lane `i` gave, as 16-bit elements; the result is each lane's `num`
/// registers, `out[lane][r]`. The interpreter and the SASS emulator's `LDSM` both use it.
pub fn warp_ldmatrix(table: &[Slot], num: u8, rows: &[[u16; 8]]) -> Vec<Vec<u32>> {
    let mut out = vec![vec![0u32; num as usize]; 32];
    for s in table {
        out[s.lane as usize][s.reg as usize] |=
            u32::from(rows[s.row as usize][s.col as usize]) << (16 * s.sub);
    }
    out
}
