//! The tensor-core instructions of `mma.sync` code: `LDSM` (`ldmatrix`) and `HMMA`
//! (`mma.sync.m16n8k16` with f16 or bf16 operands and f32 accumulators). Which lane
//! holds which element comes from the layout measured on the H200
//! (`isa/sm90/mma_layout.json`) and the products from the interpreter's arithmetic
//! ([`quench_ir::interp::warp_mma`]), so the two agree bit for bit; both run over the
//! whole warp and refuse to run under divergence.

use quench_ir::interp::{warp_ldmatrix, warp_mma, MmaLayout};
use quench_ir::{FragRole, MmaShape, Scalar};

use super::exec::{Ctx, Step};
use super::mem::address;
use super::EmuError;

/// Every lane of the warp must execute it.
fn whole_warp(c: &Ctx, on: u32) -> Result<(), EmuError> {
    if on == u32::MAX {
        return Ok(());
    }
    Err(EmuError::Divergent {
        at: c.inst.addr,
        why: format!(
            "{} by lanes {on:#010x} of warp {}: it needs all 32",
            c.inst.mnemonic(),
            c.w.index
        ),
    })
}

fn layout() -> Result<&'static MmaLayout, EmuError> {
    MmaLayout::measured().map_err(|e| EmuError::Program(format!("the fragment layouts: {e}")))
}

/// `LDSM.16.M88.4 d, [R+imm]` (and `.MT88`, transposed): lane `i` gives the address of
/// the 16-byte row `i` of four 8×8 matrices of 16-bit elements; each lane receives four
/// registers.
pub fn ldsm(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["16", "M88", "MT88", "4"])?;
    c.arity(2)?;
    let trans = c.inst.has("MT88");
    if !c.inst.has("16") || !c.inst.has("4") || trans == c.inst.has("M88") {
        return Err(c.unmodelled("a shape other than .16.M88.4 or .16.MT88.4"));
    }
    whole_warp(c, on)?;
    let table = layout()?
        .ldmatrix(4, trans)
        .map_err(|e| EmuError::Program(e.to_string()))?;
    let at = c.inst.addr;
    let mut rows = [[0u16; 8]; 32];
    for (lane, row) in rows.iter_mut().enumerate() {
        let a = address(c, lane, 1, false)?;
        let mut bytes = [0u8; 16];
        c.shared.read(at, a, &mut bytes)?;
        for (e, pair) in row.iter_mut().zip(bytes.chunks_exact(2)) {
            *e = u16::from_le_bytes([pair[0], pair[1]]);
        }
    }
    for (lane, regs) in warp_ldmatrix(table, 4, &rows).iter().enumerate() {
        c.set_many(lane, 0, regs)?;
    }
    Ok(Step::Next)
}

/// `HMMA.16816.F32[.BF16] d, a, b, c`: D = A·B + C on one warp's fragments, A in four
/// registers, B in two, C and D in four (f16 operands without `.BF16`).
pub fn hmma(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["16816", "F32", "BF16"])?;
    c.arity(4)?;
    if !c.inst.has("16816") || !c.inst.has("F32") {
        return Err(c.unmodelled("a shape other than 16816 into f32"));
    }
    whole_warp(c, on)?;
    let elem = if c.inst.has("BF16") {
        Scalar::BF16
    } else {
        Scalar::F16
    };
    let t = layout()?
        .mma(MmaShape::M16N8K16, elem)
        .map_err(|e| EmuError::Program(e.to_string()))?;
    let mut frags = Vec::with_capacity(32);
    for lane in 0..32 {
        frags.push([
            c.get_many(lane, 1, 4)?,
            c.get_many(lane, 2, 2)?,
            c.get_many(lane, 3, 4)?,
        ]);
    }
    let d = warp_mma(t, MmaShape::M16N8K16, elem, |role, reg, lane| {
        let i = match role {
            FragRole::A => 0,
            FragRole::B => 1,
            FragRole::C => 2,
        };
        u64::from(frags[lane as usize][i][reg as usize])
    });
    for (lane, regs) in d.iter().enumerate() {
        let words: Vec<u32> = regs.iter().map(|&x| x as u32).collect();
        c.set_many(lane, 0, &words)?;
    }
    Ok(Step::Next)
}
