//! `wgmma.mma_async` and its shared-memory matrix descriptors.
//!
//! A warpgroup is four consecutive warps of a block (warps `4g .. 4g + 4`); warp `q` of
//! it holds rows `16q .. 16q + 16` of A (as a fragment) and of C and D. Within a warp the
//! fragments are those of `mma.sync.m16n8k16` from the measured table: A's 16 × 16 as
//! `m16n8k16`'s A, and C/D as `m16n8k16`'s C/D repeated over the `n / 8` column blocks,
//! block `j` in registers `4j .. 4j + 4`. Each warp computes its own rows when it issues
//! the instruction (no warp reads another's registers), from shared memory as it is then:
//! a program that follows the rules — operands left alone until `wgmma.wait_group`
//! retires the group — sees the same result the asynchronous hardware gives.
//!
//! A descriptor gives the operand tile's start address, leading and stride byte offsets
//! and swizzle ([`Swizzle`]); elements are read at the addresses [`element_address`]
//! computes. The layouts were checked on the H200 (`quench isa wgmma-check`).

use super::block::BlockCtx;
use super::mma::{element, multiply};
use super::program::CInst;
use super::warp::Warp;
use super::InterpError;
use crate::func::Value;
use crate::types::{FragRole, MmaShape, Scalar, Swizzle, Type};

/// A matrix descriptor's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub start: u32,
    pub lbo: u32,
    pub sbo: u32,
    pub swizzle: Swizzle,
}

impl Descriptor {
    /// The 64-bit descriptor: address, LBO and SBO in 16-byte units (14 bits each, at
    /// bits 0, 16 and 32), base offset 0, layout type at bits 62–63.
    pub fn encode(self) -> u64 {
        let f = |x: u32| (x as u64 >> 4) & 0x3fff;
        f(self.start) | f(self.lbo) << 16 | f(self.sbo) << 32 | self.swizzle.code() << 62
    }

    /// The fields of a 64-bit descriptor, or why it is not one the interpreter models.
    pub fn decode(d: u64) -> Result<Descriptor, String> {
        let base_offset = (d >> 49) & 7;
        if base_offset != 0 {
            return Err(format!(
                "descriptor {d:#x} has a matrix base offset of {base_offset}; only 0 is modeled"
            ));
        }
        let f = |shift: u32| (((d >> shift) & 0x3fff) << 4) as u32;
        Ok(Descriptor {
            start: f(0),
            lbo: f(16),
            sbo: f(32),
            swizzle: Swizzle::from_code(d >> 62),
        })
    }
}

/// The shared-memory byte address of element `k` (of 16 bits) of operand row `row` (an
/// `m` row of A, an `n` column of B) under a K-major descriptor.
pub fn element_address(d: Descriptor, row: u32, k: u32) -> u32 {
    let kb = 2 * k;
    let group = (row / 8) * d.sbo;
    match d.swizzle {
        Swizzle::None => d.start + group + (row % 8) * 16 + (kb / 16) * d.lbo + kb % 16,
        z => z.apply(d.start + group + (row % 8) * z.bytes() + kb),
    }
}

/// `WgmmaDesc`: each lane's descriptor of the tile at its shared pointer.
pub(crate) fn exec_desc(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    (ptr, lbo, sbo, swizzle): (Value, u32, u32, Swizzle),
) -> Result<(), InterpError> {
    let p = ctx.prog;
    let (pi, o) = (p.info(ptr), p.info(ci.inst.results[0]));
    for l in (0..32).filter(|l| active >> l & 1 == 1) {
        let start = w.regs.get(pi, 0, l);
        if !start.is_multiple_of(16) || start >= 1 << 18 {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                format!("lane {l}: operand tile at shared offset {start:#x}, which is not 16-byte aligned below 2^18"),
            ));
        }
        let d = Descriptor {
            start: start as u32,
            lbo,
            sbo,
            swizzle,
        };
        w.regs.set(o, 0, l, d.encode());
        let prov = w.regs.prov(pi, l);
        w.regs.set_prov(o, l, prov);
    }
    Ok(())
}

/// The one descriptor a warp passes in `v` (every lane must pass the same).
fn warp_descriptor(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    v: Value,
    what: &str,
) -> Result<(Descriptor, u16), InterpError> {
    let i = ctx.prog.info(v);
    let d0 = w.regs.get(i, 0, 0);
    if let Some(l) = (1..32).find(|&l| w.regs.get(i, 0, l) != d0) {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!("lanes 0 and {l} pass different {what} descriptors"),
        ));
    }
    let d = Descriptor::decode(d0).map_err(|e| ctx.unsupported(w.index, ci, e))?;
    Ok((d, w.regs.prov(i, 0)))
}

/// Read the 16-bit element at `addr` of shared memory.
fn read16(ctx: &BlockCtx, w: &Warp, ci: &CInst, addr: u32, prov: u16) -> Result<u16, InterpError> {
    let i = ctx.shared.check(addr as u64, 2, prov).map_err(|region| {
        InterpError::SharedOutOfBounds {
            site: ctx.site(w.index, None, ci),
            offset: addr as u64,
            bytes: 2,
            region,
        }
    })?;
    Ok(u16::from_le_bytes([
        ctx.shared.bytes[i],
        ctx.shared.bytes[i + 1],
    ]))
}

fn half(ab: Scalar, bits: u16) -> f64 {
    element(ab, bits as u64, 0)
}

/// `wgmma.mma_async`: this warp's 16 rows of D = A·B + C.
pub(crate) fn exec_wgmma(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    (shape, ab): (MmaShape, Scalar),
    [a, b, c]: [Value; 3],
) -> Result<(), InterpError> {
    if active != u32::MAX {
        return Err(InterpError::NotConverged {
            site: ctx.site(w.index, None, ci),
            active,
        });
    }
    let p = ctx.prog;
    let warps = ctx.ntid.iter().product::<u32>().div_ceil(32);
    let group_end = (w.index / 4 + 1) * 4;
    if group_end > warps {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!(
                "warp {} has no full warpgroup in a block of {warps} warps",
                w.index
            ),
        ));
    }
    let c_ok = matches!(p.ty(c), Type::Frag(f) if f.shape == shape && f.role == FragRole::C);
    if !shape.is_warpgroup() || !c_ok || p.ty(ci.inst.results[0]) != p.ty(c) {
        return Err(ctx.bad_inst(w.index, ci, "operands do not fit the warpgroup shape"));
    }
    let layout = ctx.layout.ok_or(InterpError::LayoutNotMeasured)?;
    let t = layout.mma(MmaShape::M16N8K16, ab)?;
    let (_, n, k) = shape.dims();
    let row0 = 16 * (w.index % 4);

    // A: 16 × 16 of this warp, from its registers or through the descriptor.
    let mut am = vec![0.0; 16 * 16];
    if matches!(p.ty(a), Type::Frag(_)) {
        let ai = p.info(a);
        for s in &t.a {
            am[(s.row * 16 + s.col) as usize] = element(ab, w.regs.get(ai, s.reg, s.lane), s.sub);
        }
    } else {
        let (d, prov) = warp_descriptor(ctx, w, ci, a, "A")?;
        for r in 0..16 {
            for kk in 0..k {
                let bits = read16(ctx, w, ci, element_address(d, row0 + r, kk), prov)?;
                am[(r * 16 + kk) as usize] = half(ab, bits);
            }
        }
    }
    // B: k × n through its descriptor (column `j` of B is operand row `j`).
    let (d, prov) = warp_descriptor(ctx, w, ci, b, "B")?;
    let mut bm = vec![0.0; (k * n) as usize];
    for j in 0..n {
        for kk in 0..k {
            let bits = read16(ctx, w, ci, element_address(d, j, kk), prov)?;
            bm[(kk * n + j) as usize] = half(ab, bits);
        }
    }
    let (cv, o) = (p.info(c), p.info(ci.inst.results[0]));
    let mut cm = vec![0u64; (16 * n) as usize];
    for blk in 0..n / 8 {
        for s in &t.c {
            cm[(s.row * n + 8 * blk + s.col) as usize] = w.regs.get(cv, 4 * blk + s.reg, s.lane);
        }
    }
    ctx.stats.approx_mma_used = true;
    let dm = multiply(false, (16, n, k), &am, &bm, &cm);
    for blk in 0..n / 8 {
        for s in &t.d {
            w.regs.set(
                o,
                4 * blk + s.reg,
                s.lane,
                dm[(s.row * n + 8 * blk + s.col) as usize],
            );
        }
    }
    Ok(())
}
