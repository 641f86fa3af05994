//! The data operations (everything but control flow), executed for a warp's active
//! lanes in lane order.

use super::arith::{self, ArithError};
use super::block::BlockCtx;
use super::program::{CInst, ValInfo};
use super::warp::{lanes, Regs, Warp};
use super::{collective, cp_async, mbarrier, mma, wgmma, InterpError};
use crate::func::Value;
use crate::ops::{AtomOp, BinOp, Op, Special, UnOp};
use crate::types::{AddrSpace, Scalar, Type};

/// A checked memory location.
#[derive(Clone, Copy)]
pub(crate) enum Loc {
    Global(u64),
    /// Index into the block's shared memory.
    Shared(usize),
}

pub(crate) fn exec<'p>(
    ctx: &mut BlockCtx<'_, 'p>,
    w: &mut Warp<'p>,
    ci: &CInst,
    active: u32,
) -> Result<(), InterpError> {
    let p = ctx.prog;
    let inst = ci.inst;
    // Every data operation but stores, fences and cp.async defines exactly one value
    // (checked when the program was prepared).
    let out = || p.info(inst.results[0]);
    let wi = w.index;
    match &inst.op {
        Op::Const { ty, bits } => {
            let o = out();
            let size = ty.bytes() as usize;
            if o.parts > 1 && size > 8 {
                return Err(ctx.unsupported(
                    w.index,
                    ci,
                    format!("constant of type {ty} is wider than 64 bits"),
                ));
            }
            for l in lanes(active) {
                if o.parts == 1 {
                    w.regs.set(o, 0, l, bits & arith::mask(o.elem.bits()));
                } else {
                    from_bytes(&mut w.regs, o, l, &bits.to_le_bytes()[..size]);
                }
                w.regs.set_prov(o, l, 0);
            }
        }
        Op::Param(i) => {
            let (o, x) = (out(), ctx.args[*i as usize]);
            for l in lanes(active) {
                w.regs.set(o, 0, l, x);
                w.regs.set_prov(o, l, 0);
            }
        }
        Op::Special(s) => {
            let o = out();
            for l in lanes(active) {
                let [tx, ty, tz] = ctx.thread(w.index, l);
                let x = match s {
                    Special::TidX => tx as u64,
                    Special::TidY => ty as u64,
                    Special::TidZ => tz as u64,
                    Special::NtidX => ctx.ntid[0] as u64,
                    Special::NtidY => ctx.ntid[1] as u64,
                    Special::NtidZ => ctx.ntid[2] as u64,
                    Special::CtaidX => ctx.ctaid[0] as u64,
                    Special::CtaidY => ctx.ctaid[1] as u64,
                    Special::CtaidZ => ctx.ctaid[2] as u64,
                    Special::NctaidX => ctx.nctaid[0] as u64,
                    Special::NctaidY => ctx.nctaid[1] as u64,
                    Special::NctaidZ => ctx.nctaid[2] as u64,
                    Special::LaneId => l as u64,
                    Special::WarpId => w.index as u64,
                    Special::Clock => *ctx.clock & 0xffff_ffff,
                    Special::Clock64 | Special::GlobalTimer => *ctx.clock,
                };
                w.regs.set(o, 0, l, x);
            }
        }
        Op::Bin { op, rnd, a, b } => {
            let s = scalar(ctx, wi, ci, *a)?;
            let shift = matches!(op, BinOp::Shl | BinOp::Shr);
            if p.ty(inst.results[0]) != p.ty(*a) || (!shift && p.ty(*b) != p.ty(*a)) {
                return Err(ctx.bad_inst(w.index, ci, "operand and result types differ"));
            }
            let (a, b, o) = (p.info(*a), p.info(*b), out());
            for l in lanes(active) {
                let r = arith::bin(*op, *rnd, s, w.regs.get(a, 0, l), w.regs.get(b, 0, l))
                    .map_err(|e| arith_err(ctx, wi, ci, e))?;
                w.regs.set(o, 0, l, r);
            }
        }
        Op::Fma { rnd, a, b, c } => {
            let s = scalar(ctx, wi, ci, *a)?;
            let t = p.ty(*a);
            if p.ty(*b) != t || p.ty(*c) != t || p.ty(inst.results[0]) != t {
                return Err(ctx.bad_inst(w.index, ci, "operand and result types differ"));
            }
            let (a, b, c, o) = (p.info(*a), p.info(*b), p.info(*c), out());
            for l in lanes(active) {
                let (x, y, z) = (
                    w.regs.get(a, 0, l),
                    w.regs.get(b, 0, l),
                    w.regs.get(c, 0, l),
                );
                w.regs.set(
                    o,
                    0,
                    l,
                    arith::fma(*rnd, s, x, y, z).map_err(|e| arith_err(ctx, wi, ci, e))?,
                );
            }
        }
        Op::Dp4a {
            a_signed,
            b_signed,
            a,
            b,
            c,
        } => {
            let acc = if *a_signed || *b_signed {
                Type::I32
            } else {
                Type::U32
            };
            let word = |t: Type| matches!(t, Type::Scalar(Scalar::U32 | Scalar::I32));
            if !word(p.ty(*a)) || !word(p.ty(*b)) || p.ty(*c) != acc || p.ty(inst.results[0]) != acc
            {
                return Err(ctx.bad_inst(
                    w.index,
                    ci,
                    format!("dp4a takes 32-bit words and an {acc} addend"),
                ));
            }
            let (a, b, c, o) = (p.info(*a), p.info(*b), p.info(*c), out());
            for l in lanes(active) {
                let (x, y, z) = (
                    w.regs.get(a, 0, l),
                    w.regs.get(b, 0, l),
                    w.regs.get(c, 0, l),
                );
                let r = arith::dp4a(x as u32, *a_signed, y as u32, *b_signed, z as u32);
                w.regs.set(o, 0, l, r as u64);
            }
        }
        Op::Un { op, a } => {
            let s = scalar(ctx, wi, ci, *a)?;
            if op.is_approx() && !ctx.stats.approx_ops_used.contains(op) {
                ctx.stats.approx_ops_used.push(*op);
            }
            let expected = if matches!(op, UnOp::Popc | UnOp::Clz) {
                Type::U32
            } else {
                p.ty(*a)
            };
            if p.ty(inst.results[0]) != expected {
                return Err(ctx.bad_inst(w.index, ci, format!("result should be {expected}")));
            }
            let (a, o) = (p.info(*a), out());
            for l in lanes(active) {
                w.regs.set(
                    o,
                    0,
                    l,
                    arith::un(*op, s, w.regs.get(a, 0, l))
                        .map_err(|e| arith_err(ctx, wi, ci, e))?,
                );
            }
        }
        Op::DivApprox { a, b } => {
            if p.ty(*a) != Type::F32 || p.ty(*b) != Type::F32 || p.ty(inst.results[0]) != Type::F32
            {
                return Err(ctx.unsupported(w.index, ci, "div.approx is f32 only"));
            }
            ctx.stats.approx_div_used = true;
            let (a, b, o) = (p.info(*a), p.info(*b), out());
            for l in lanes(active) {
                w.regs.set(
                    o,
                    0,
                    l,
                    arith::div_approx(w.regs.get(a, 0, l), w.regs.get(b, 0, l)),
                );
            }
        }
        Op::Cmp { op, a, b } => {
            let s = match p.ty(*a) {
                Type::Ptr(..) => Scalar::U64,
                _ => scalar(ctx, wi, ci, *a)?,
            };
            if p.ty(*b) != p.ty(*a) {
                return Err(ctx.bad_inst(w.index, ci, "operands differ in type"));
            }
            let (a, b, o) = (p.info(*a), p.info(*b), out());
            for l in lanes(active) {
                let r = arith::cmp(*op, s, w.regs.get(a, 0, l), w.regs.get(b, 0, l))
                    .map_err(|e| arith_err(ctx, wi, ci, e))?;
                w.regs.set(o, 0, l, r as u64);
            }
        }
        Op::Select { cond, a, b } => {
            let (c, a, b, o) = (p.info(*cond), p.info(*a), p.info(*b), out());
            for l in lanes(active) {
                let src = if w.regs.get(c, 0, l) & 1 == 1 { a } else { b };
                w.regs.copy(src, l, o, l);
            }
        }
        Op::Cvt { to, rnd, sat, a } => {
            let from = scalar(ctx, wi, ci, *a)?;
            let (a, o) = (p.info(*a), out());
            for l in lanes(active) {
                let r = arith::cvt(from, *to, *rnd, *sat, w.regs.get(a, 0, l))
                    .map_err(|e| arith_err(ctx, wi, ci, e))?;
                w.regs.set(o, 0, l, r);
            }
        }
        Op::Bitcast { to, a } => {
            let from = p.ty(*a);
            if from.bytes() != to.bytes() || to.bytes() == 0 || p.ty(inst.results[0]) != *to {
                return Err(ctx.bad_inst(
                    w.index,
                    ci,
                    format!("cannot reinterpret {from} as {to}"),
                ));
            }
            let (a, o) = (p.info(*a), out());
            let mut buf = Vec::with_capacity(to.bytes() as usize);
            for l in lanes(active) {
                buf.clear();
                to_bytes(&w.regs, a, l, &mut buf);
                from_bytes(&mut w.regs, o, l, &buf);
                w.regs.set_prov(o, l, 0);
            }
        }
        Op::Pack { ty, parts } => pack(ctx, w, ci, active, *ty, parts)?,
        Op::Extract { a, index } => extract(ctx, w, ci, active, *a, *index)?,
        Op::PtrAdd { ptr, index } => {
            let Type::Ptr(_, elem) = p.ty(*ptr) else {
                return Err(ctx.bad_inst(w.index, ci, "not a pointer"));
            };
            let s = scalar(ctx, wi, ci, *index)?;
            if !s.is_int() || elem.bytes() == 0 || p.ty(inst.results[0]) != p.ty(*ptr) {
                return Err(ctx.bad_inst(
                    w.index,
                    ci,
                    "needs an integer index and a storable pointee",
                ));
            }
            let (ptr, index, o) = (p.info(*ptr), p.info(*index), out());
            for l in lanes(active) {
                let i = arith::int_value(s, w.regs.get(index, 0, l)) as i64 as u64;
                let addr = w
                    .regs
                    .get(ptr, 0, l)
                    .wrapping_add(i.wrapping_mul(elem.bytes() as u64));
                w.regs.set(o, 0, l, addr);
                let origin = w.regs.prov(ptr, l);
                w.regs.set_prov(o, l, origin);
            }
        }
        Op::PtrCast { ptr, .. } => {
            let (ptr, o) = (p.info(*ptr), out());
            for l in lanes(active) {
                w.regs.copy(ptr, l, o, l);
            }
        }
        Op::SharedAddr { decl } => {
            let o = out();
            let offset = ctx.prog.shared_offsets[*decl as usize];
            for l in lanes(active) {
                w.regs.set(o, 0, l, offset);
                w.regs.set_prov(o, l, *decl as u16 + 1);
            }
        }
        Op::Load { ty, ptr, .. } => {
            let size = access_size(ctx, w, ci, *ty)?;
            if p.ty(inst.results[0]) != *ty {
                return Err(ctx.bad_inst(w.index, ci, "result type differs from the loaded type"));
            }
            let o = out();
            let mut buf = [0u8; 16];
            for l in lanes(active) {
                let data = &mut buf[..size as usize];
                access(ctx, w, ci, l, *ptr, size, size, |m| data.copy_from_slice(m))?;
                from_bytes(&mut w.regs, o, l, data);
                w.regs.set_prov(o, l, 0);
            }
        }
        Op::Store { ptr, value, .. } => {
            let size = access_size(ctx, w, ci, p.ty(*value))?;
            let v = p.info(*value);
            let mut buf = Vec::with_capacity(16);
            for l in lanes(active) {
                buf.clear();
                to_bytes(&w.regs, v, l, &mut buf);
                access(ctx, w, ci, l, *ptr, size, size, |m| m.copy_from_slice(&buf))?;
            }
        }
        // Lanes run one at a time and see each other's writes at once: fences have
        // nothing to order.
        Op::Fence { .. } => {}
        Op::Atomic { op, ptr, a, b, .. } => atomic(ctx, w, ci, active, *op, *ptr, *a, *b)?,
        Op::Shfl {
            mode,
            value,
            b,
            c,
            mask,
        } => collective::shfl(ctx, w, ci, active, *mode, *value, *b, *c, *mask)?,
        Op::Vote { mode, pred, mask } => collective::vote(ctx, w, ci, active, *mode, *pred, *mask)?,
        Op::Redux { op, value, mask } => collective::redux(ctx, w, ci, active, *op, *value, *mask)?,
        Op::Mma { shape, a, b, c } => mma::exec_mma(ctx, w, ci, active, *shape, [*a, *b, *c])?,
        Op::LdMatrix {
            num, trans, ptr, ..
        } => mma::exec_ldmatrix(ctx, w, ci, active, *num, *trans, *ptr)?,
        Op::CpAsync {
            dst, src, bytes, ..
        } => cp_async::issue(ctx, w, ci, active, *dst, *src, *bytes)?,
        Op::CpAsyncCommit => cp_async::commit(w, active),
        Op::CpAsyncWait { n } => cp_async::wait(ctx, w, ci, active, *n)?,
        Op::WgmmaDesc {
            ptr,
            lbo,
            sbo,
            swizzle,
        } => wgmma::exec_desc(ctx, w, ci, active, (*ptr, *lbo, *sbo, *swizzle))?,
        Op::Wgmma { shape, ab, a, b, c } => {
            wgmma::exec_wgmma(ctx, w, ci, active, (*shape, *ab), [*a, *b, *c])?
        }
        // Each warp's products are complete when it issues them (see `wgmma`): the
        // fence, the groups and the waits have nothing left to order, but like the
        // hardware they need the whole warp.
        Op::WgmmaFence | Op::WgmmaCommit | Op::WgmmaWait { .. } => {
            if active != u32::MAX {
                return Err(InterpError::NotConverged {
                    site: ctx.site(w.index, None, ci),
                    active,
                });
            }
        }
        // Shared memory is one memory here: no proxy to synchronize with.
        Op::FenceProxyAsync => {}
        Op::MbarrierInit { bar, count } => mbarrier::init(ctx, w, ci, active, (*bar, *count))?,
        Op::MbarrierArrive { bar } => mbarrier::arrive(ctx, w, ci, active, (*bar, false))?,
        Op::CpAsyncMbarrierArrive { bar } => mbarrier::arrive(ctx, w, ci, active, (*bar, true))?,
        // The warp checked that the wait passes before it got here (`Warp::run`).
        Op::MbarrierWait { .. } => {}
        Op::Barrier | Op::If { .. } | Op::For { .. } | Op::Yield(_) | Op::Return => {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                "control flow where data operations were expected",
            ));
        }
    }
    Ok(())
}

fn scalar(ctx: &BlockCtx, warp: u32, ci: &CInst, v: Value) -> Result<Scalar, InterpError> {
    match ctx.prog.ty(v) {
        Type::Scalar(s) => Ok(s),
        t => Err(ctx.unsupported(warp, ci, format!("operand of type {t}"))),
    }
}

fn arith_err(ctx: &BlockCtx, warp: u32, ci: &CInst, e: ArithError) -> InterpError {
    match e {
        ArithError::Unsupported(s) => ctx.unsupported(warp, ci, s),
        ArithError::Malformed(s) => ctx.bad_inst(warp, ci, s),
    }
}

/// Bytes of a value's parts in order, each little-endian.
pub(crate) fn to_bytes(regs: &Regs, v: ValInfo, lane: u32, out: &mut Vec<u8>) {
    let n = v.elem.bytes() as usize;
    for part in 0..v.parts {
        out.extend_from_slice(&regs.get(v, part, lane).to_le_bytes()[..n]);
    }
}

/// Fill a value's parts from little-endian bytes (as many as it occupies).
pub(crate) fn from_bytes(regs: &mut Regs, v: ValInfo, lane: u32, data: &[u8]) {
    let n = v.elem.bytes() as usize;
    if n == 0 {
        return;
    }
    if v.parts == 1 && data.len() >= n {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&data[..n]);
        regs.set(v, 0, lane, u64::from_le_bytes(b));
        return;
    }
    for (part, chunk) in data.chunks(n).take(v.parts as usize).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        regs.set(v, part as u32, lane, u64::from_le_bytes(b));
    }
}

/// The width of a load or store of `ty`: 1, 2, 4, 8 or 16 bytes.
fn access_size(ctx: &BlockCtx, w: &Warp, ci: &CInst, ty: Type) -> Result<u64, InterpError> {
    match ty.bytes() {
        n @ (1 | 2 | 4 | 8 | 16) => Ok(n as u64),
        n => Err(ctx.unsupported(w.index, ci, format!("a {n}-byte access of {ty}"))),
    }
}

/// Check the space and alignment of an access of `len` bytes through the pointer
/// `ptr` of `lane`, and return its space and address.
#[allow(clippy::too_many_arguments)]
fn address(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    lane: u32,
    ptr: Value,
    len: u64,
    align: u64,
) -> Result<(AddrSpace, u64), InterpError> {
    let addr = w.regs.get(ctx.prog.info(ptr), 0, lane);
    let space = match ctx.prog.ty(ptr) {
        Type::Ptr(s, _) => s,
        t => return Err(ctx.bad_inst(w.index, ci, format!("address operand of type {t}"))),
    };
    let site = || ctx.site(w.index, Some(lane), ci);
    if space == AddrSpace::Local {
        return Err(InterpError::LocalMemory { site: site() });
    }
    if !addr.is_multiple_of(align) {
        return Err(InterpError::Misaligned {
            site: site(),
            space: space.name(),
            addr,
            bytes: len,
            align,
        });
    }
    Ok((space, addr))
}

fn global_out_of_bounds(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    lane: u32,
    addr: u64,
    len: u64,
    detail: String,
) -> InterpError {
    InterpError::GlobalOutOfBounds {
        site: ctx.site(w.index, Some(lane), ci),
        addr,
        bytes: len,
        detail,
    }
}

/// The index in shared memory of an access of `len` bytes at `addr` through `ptr`.
#[allow(clippy::too_many_arguments)]
fn shared_index(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    lane: u32,
    ptr: Value,
    addr: u64,
    len: u64,
) -> Result<usize, InterpError> {
    let origin = w.regs.prov(ctx.prog.info(ptr), lane);
    ctx.shared
        .check(addr, len, origin)
        .map_err(|region| InterpError::SharedOutOfBounds {
            site: ctx.site(w.index, Some(lane), ci),
            offset: addr,
            bytes: len,
            region,
        })
}

/// Check an access of `len` bytes through the pointer `ptr` of `lane` (space,
/// alignment, bounds) and return where it lands.
pub(crate) fn resolve(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    lane: u32,
    ptr: Value,
    len: u64,
    align: u64,
) -> Result<Loc, InterpError> {
    let (space, addr) = address(ctx, w, ci, lane, ptr, len, align)?;
    if space == AddrSpace::Shared {
        return Ok(Loc::Shared(shared_index(ctx, w, ci, lane, ptr, addr, len)?));
    }
    match ctx.mem.slice(addr, len) {
        Ok(_) => Ok(Loc::Global(addr)),
        Err(detail) => Err(global_out_of_bounds(ctx, w, ci, lane, addr, len, detail)),
    }
}

/// The bytes of a checked location.
pub(crate) fn bytes_at<'m>(ctx: &'m mut BlockCtx, loc: Loc, len: u64) -> Option<&'m mut [u8]> {
    match loc {
        Loc::Global(addr) => ctx.mem.slice_mut(addr, len).ok(),
        Loc::Shared(i) => ctx.shared.bytes.get_mut(i..i + len as usize),
    }
}

/// Check an access and hand the memory to `f`.
#[allow(clippy::too_many_arguments)]
fn access<T>(
    ctx: &mut BlockCtx,
    w: &Warp,
    ci: &CInst,
    lane: u32,
    ptr: Value,
    len: u64,
    align: u64,
    f: impl FnOnce(&mut [u8]) -> T,
) -> Result<T, InterpError> {
    let (space, addr) = address(ctx, w, ci, lane, ptr, len, align)?;
    let mem = if space == AddrSpace::Shared {
        let i = shared_index(ctx, w, ci, lane, ptr, addr, len)?;
        &mut ctx.shared.bytes[i..i + len as usize]
    } else {
        match ctx.mem.slice_mut(addr, len) {
            Ok(m) => m,
            Err(detail) => return Err(global_out_of_bounds(ctx, w, ci, lane, addr, len, detail)),
        }
    };
    Ok(f(mem))
}

fn pack(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    ty: Type,
    parts: &[Value],
) -> Result<(), InterpError> {
    let p = ctx.prog;
    let part_ty = match ty {
        Type::Vec(s, n) if parts.len() == n as usize => Type::Scalar(s),
        Type::Scalar(s) if s.is_packed() && parts.len() == 2 => {
            Type::Scalar(s.packed_elem().unwrap_or(s))
        }
        Type::Frag(f) if parts.len() == f.regs() as usize => Type::Scalar(f.reg_type()),
        _ => {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                format!("cannot build {ty} from {} parts", parts.len()),
            ))
        }
    };
    if parts.iter().any(|v| p.ty(*v) != part_ty) || p.ty(ci.inst.results[0]) != ty {
        return Err(ctx.bad_inst(w.index, ci, format!("the parts of {ty} must be {part_ty}")));
    }
    let o = p.info(ci.inst.results[0]);
    for l in lanes(active) {
        if o.parts == 1 {
            let lo = w.regs.get(p.info(parts[0]), 0, l);
            let hi = w.regs.get(p.info(parts[1]), 0, l);
            w.regs.set(o, 0, l, lo | hi << 16);
        } else {
            for (i, v) in parts.iter().enumerate() {
                let x = w.regs.get(p.info(*v), 0, l);
                w.regs.set(o, i as u32, l, x);
            }
        }
    }
    Ok(())
}

fn extract(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    a: Value,
    index: u32,
) -> Result<(), InterpError> {
    let p = ctx.prog;
    let (ai, o) = (p.info(a), p.info(ci.inst.results[0]));
    let halves = matches!(p.ty(a), Type::Scalar(s) if s.is_packed());
    let count = if halves { 2 } else { ai.parts };
    let is_part = matches!(p.ty(a), Type::Vec(..) | Type::Frag(_)) || halves;
    if !is_part || index >= count || o.parts != 1 {
        return Err(ctx.bad_inst(w.index, ci, format!("no part {index} in {}", p.ty(a))));
    }
    for l in lanes(active) {
        let x = if halves {
            w.regs.get(ai, 0, l) >> (16 * index) & 0xffff
        } else {
            w.regs.get(ai, index, l)
        };
        w.regs.set(o, 0, l, x);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn atomic(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    op: AtomOp,
    ptr: Value,
    a: Value,
    b: Option<Value>,
) -> Result<(), InterpError> {
    let p = ctx.prog;
    let Type::Scalar(s) = p.ty(a) else {
        return Err(ctx.unsupported(w.index, ci, format!("atomic on {}", p.ty(a))));
    };
    let size = s.bytes() as u64;
    if !matches!(size, 2 | 4 | 8) {
        return Err(ctx.unsupported(w.index, ci, format!("atomic on {s}")));
    }
    let b = match (op, b) {
        (AtomOp::Cas, Some(b)) if p.ty(b) == p.ty(a) => Some(p.info(b)),
        (AtomOp::Cas, _) => {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                "compare-and-swap needs a new value of the same type",
            ))
        }
        _ => None,
    };
    let global = matches!(p.ty(ptr), Type::Ptr(AddrSpace::Global, _));
    let float = s.is_float() || s.is_packed();
    let supported = match op {
        AtomOp::Add => s.is_int() || float,
        AtomOp::Min | AtomOp::Max | AtomOp::And | AtomOp::Or | AtomOp::Xor => s.is_int(),
        AtomOp::Exch | AtomOp::Cas => true,
    };
    if !supported {
        return Err(ctx.unsupported(w.index, ci, format!("atom.{} on {s}", op.name())));
    }
    let (ai, o) = (p.info(a), p.info(ci.inst.results[0]));
    let m = arith::mask(s.bits());
    for l in lanes(active) {
        let x = w.regs.get(ai, 0, l);
        let y = b.map(|b| w.regs.get(b, 0, l)).unwrap_or(0);
        let (old, new) = access(ctx, w, ci, l, ptr, size, size, |mem| {
            let mut raw = [0u8; 8];
            raw[..mem.len()].copy_from_slice(mem);
            let old = u64::from_le_bytes(raw);
            let new = match op {
                AtomOp::Add if float => arith::atomic_fadd(s, global, old, x),
                AtomOp::Add => Ok(old.wrapping_add(x) & m),
                AtomOp::Min => Ok(if arith::int_value(s, x) < arith::int_value(s, old) {
                    x
                } else {
                    old
                }),
                AtomOp::Max => Ok(if arith::int_value(s, x) > arith::int_value(s, old) {
                    x
                } else {
                    old
                }),
                AtomOp::And => Ok(old & x),
                AtomOp::Or => Ok(old | x),
                AtomOp::Xor => Ok(old ^ x),
                AtomOp::Exch => Ok(x),
                AtomOp::Cas => Ok(if old == x { y } else { old }),
            };
            if let Ok(n) = &new {
                mem.copy_from_slice(&n.to_le_bytes()[..mem.len()]);
            }
            (old, new)
        })?;
        new.map_err(|e| arith_err(ctx, w.index, ci, e))?;
        w.regs.set(o, 0, l, old);
    }
    Ok(())
}
