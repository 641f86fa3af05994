//! Parameters, addresses, loads, stores and asynchronous copies.

use quench_ir::{AddrSpace, CacheOp, Scalar, Type, Value};

use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

pub(super) fn param(e: &mut Emitter, d: Value, index: u32) -> Res<()> {
    let p =
        e.f.params
            .get(index as usize)
            .ok_or_else(|| format!("there is no parameter {index}"))?;
    let symbol = e
        .param_names
        .get(index as usize)
        .cloned()
        .ok_or("parameter without a symbol")?;
    let dr = e.def1(d)?;
    match p.ty {
        // Parameters hold generic addresses; convert once to the global window.
        Type::Ptr(AddrSpace::Global, _) => {
            let generic = e.temp(RegClass::B64);
            e.line(format!("ld.param.u64 {generic}, [{symbol}]"));
            e.line(format!("cvta.to.global.u64 {dr}, {generic}"));
        }
        Type::Scalar(s) => e.line(format!("ld.param.{} {dr}, [{symbol}]", ptype::mem(s))),
        t => return Err(format!("a kernel parameter cannot be a {t}")),
    }
    Ok(())
}

pub(super) fn shared_addr(e: &mut Emitter, d: Value, decl: u32) -> Res<()> {
    let sym = e
        .shared_names
        .get(decl as usize)
        .cloned()
        .ok_or_else(|| format!("there is no shared array {decl}"))?;
    let dr = e.def1(d)?;
    e.line(format!("mov.u32 {dr}, {sym}"));
    Ok(())
}

fn pointee(e: &Emitter, p: Value) -> Res<(AddrSpace, Scalar)> {
    match e.ty(p)? {
        Type::Ptr(space, elem) => Ok((space, elem)),
        t => Err(format!("{p} is a {t}, not a pointer")),
    }
}

/// `ptr + index * sizeof(elem)`, sign-extending signed indices: `mad.wide` for 32-bit
/// indices into 64-bit global addresses, `mad.lo` in the 32-bit shared window.
pub(super) fn ptr_add(e: &mut Emitter, d: Value, ptr: Value, index: Value) -> Res<()> {
    let (space, elem) = pointee(e, ptr)?;
    let size = elem.bytes();
    if size == 0 {
        return Err(format!("no address arithmetic on a pointer to {elem}"));
    }
    let s = e.scalar(index)?;
    let (pr, ir) = (e.reg1(ptr)?, e.reg1(index)?);
    let sign = if s.is_signed() { "s" } else { "u" };
    // 8- and 16-bit indices first widen to 32 bits (bytes are held extended already).
    let idx32 = |e: &mut Emitter| {
        if s.bits() < 32 {
            let w = e.temp(RegClass::B32);
            e.line(format!("cvt.{sign}32.{sign}16 {w}, {ir}"));
            w
        } else {
            ir.clone()
        }
    };
    let dr = e.def1(d)?;
    match (space, s.bits()) {
        (AddrSpace::Global, 64) => e.line(format!("mad.lo.s64 {dr}, {ir}, {size}, {pr}")),
        (AddrSpace::Global, _) => {
            let w = idx32(e);
            e.line(format!("mad.wide.{sign}32 {dr}, {w}, {size}, {pr}"));
        }
        (_, 64) => {
            let w = e.temp(RegClass::B32);
            e.line(format!("cvt.u32.u64 {w}, {ir}"));
            e.line(format!("mad.lo.s32 {dr}, {w}, {size}, {pr}"));
        }
        (_, _) => {
            let w = idx32(e);
            e.line(format!("mad.lo.s32 {dr}, {w}, {size}, {pr}"));
        }
    }
    Ok(())
}

pub(super) fn ptr_cast(e: &mut Emitter, d: Value, ptr: Value) -> Res<()> {
    let (pr, dr) = (e.reg1(ptr)?, e.def1(d)?);
    let c = RegClass::of_type(e.ty(ptr)?)?[0];
    e.line(format!("mov{} {dr}, {pr}", c.mov_type()));
    Ok(())
}

/// The element type and lane count of a loadable/storable value (a scalar, or a
/// vector of at most 16 bytes, as the IR allows).
fn access_shape(ty: Type) -> Res<(Scalar, u8)> {
    match ty {
        Type::Scalar(s) => Ok((s, 1)),
        Type::Vec(s, n) => Ok((s, n)),
        _ => Err(format!("a {ty} cannot be loaded or stored")),
    }
}

/// `global.nc`, `global.cg`, `shared`, ... for an access.
fn space_and_cache(space: AddrSpace, cache: CacheOp, load: bool) -> Res<String> {
    let valid = if load {
        cache.valid_for_load()
    } else {
        cache.valid_for_store()
    };
    let kind = if load { "load" } else { "store" };
    if !valid {
        return Err(format!(
            "cache operator `{}` does not apply to a {kind}",
            cache.name()
        ));
    }
    match (space, cache) {
        (AddrSpace::Global, CacheOp::Default) => Ok("global".into()),
        (AddrSpace::Global, c) => Ok(format!("global.{}", c.name())),
        (AddrSpace::Shared, CacheOp::Default) => Ok("shared".into()),
        (s, c) => Err(format!(
            "a {} {kind} takes no cache operator (`{}` given)",
            s.name(),
            c.name()
        )),
    }
}

/// `.v4.f32` / `.s8` and the `{a, b}` or `a` register operand.
fn data(s: Scalar, n: u8, regs: &[String]) -> (String, String) {
    let t = ptype::mem(s);
    if n == 1 {
        (format!(".{t}"), regs[0].clone())
    } else {
        (format!(".v{n}.{t}"), format!("{{{}}}", regs.join(", ")))
    }
}

pub(super) fn load(e: &mut Emitter, d: Value, ty: Type, ptr: Value, cache: CacheOp) -> Res<()> {
    let (space, _) = pointee(e, ptr)?;
    let (s, n) = access_shape(ty)?;
    let sc = space_and_cache(space, cache, true)?;
    let pr = e.reg1(ptr)?;
    let dr = e.def(d)?;
    let (t, regs) = data(s, n, &dr);
    // Byte loads (`.s8`/`.u8`) extend into their 16-bit registers by themselves.
    e.line(format!("ld.{sc}{t} {regs}, [{pr}]"));
    Ok(())
}

pub(super) fn store(e: &mut Emitter, ptr: Value, value: Value, cache: CacheOp) -> Res<()> {
    let (space, _) = pointee(e, ptr)?;
    let (s, n) = access_shape(e.ty(value)?)?;
    let sc = space_and_cache(space, cache, false)?;
    let (pr, vr) = (e.reg1(ptr)?, e.regs(value)?);
    let (t, regs) = data(s, n, &vr);
    e.line(format!("st.{sc}{t} [{pr}], {regs}"));
    Ok(())
}

/// The IR allows `.ca` with 4, 8 or 16 bytes and `.cg` with 16, as PTX does.
pub(super) fn cp_async(
    e: &mut Emitter,
    dst: Value,
    src: Value,
    bytes: u8,
    cache: CacheOp,
) -> Res<()> {
    let (dr, sr) = (e.reg1(dst)?, e.reg1(src)?);
    e.line(format!(
        "cp.async.{}.shared.global [{dr}], [{sr}], {bytes}",
        cache.name()
    ));
    Ok(())
}
