//! Per-operation emission: dispatch to the instruction families.

mod arith;
mod atomic;
mod convert;
mod memory;
mod tensor;
mod warp;

use quench_ir::{Inst, Op, Value};

use crate::emitter::{Emitter, Res};
use crate::regs::RegClass;

pub(crate) fn emit(e: &mut Emitter, i: &Inst) -> Res<()> {
    match &i.op {
        Op::Const { ty, bits } => convert::constant(e, one(i)?, *ty, *bits),
        Op::Param(index) => memory::param(e, one(i)?, *index),
        Op::Special(s) => {
            let d = e.def1(one(i)?)?;
            let t = if s.ty().bits() == 64 { "u64" } else { "u32" };
            e.line(format!("mov.{t} {d}, %{}", s.name()));
            Ok(())
        }
        Op::Bin { op, rnd, a, b } => arith::bin(e, one(i)?, *op, *rnd, *a, *b),
        Op::Fma { rnd, a, b, c } => arith::fma(e, one(i)?, *rnd, [*a, *b, *c]),
        Op::Dp4a {
            a_signed,
            b_signed,
            a,
            b,
            c,
        } => arith::dp4a(e, one(i)?, [*a_signed, *b_signed], [*a, *b, *c]),
        Op::Un { op, a } => arith::un(e, one(i)?, *op, *a),
        Op::DivApprox { a, b } => arith::div_approx(e, one(i)?, *a, *b),
        Op::Cmp { op, a, b } => arith::cmp(e, one(i)?, *op, *a, *b),
        Op::Select { cond, a, b } => arith::select(e, one(i)?, *cond, *a, *b),
        Op::Cvt { to, rnd, sat, a } => convert::cvt(e, one(i)?, *to, *rnd, *sat, *a),
        Op::Bitcast { to, a } => convert::bitcast(e, one(i)?, *to, *a),
        Op::Pack { ty, parts } => convert::pack(e, one(i)?, *ty, parts),
        Op::Extract { a, index } => convert::extract(e, one(i)?, *a, *index),
        Op::PtrAdd { ptr, index } => memory::ptr_add(e, one(i)?, *ptr, *index),
        Op::PtrCast { ptr, .. } => memory::ptr_cast(e, one(i)?, *ptr),
        Op::SharedAddr { decl } => memory::shared_addr(e, one(i)?, *decl),
        Op::Load { ty, ptr, cache } => memory::load(e, one(i)?, *ty, *ptr, *cache),
        Op::Store { ptr, value, cache } => memory::store(e, *ptr, *value, *cache),
        Op::Barrier => {
            e.line("bar.sync 0");
            Ok(())
        }
        Op::Fence { ord, scope } => atomic::fence(e, *ord, *scope),
        Op::Atomic {
            op,
            ord,
            scope,
            ptr,
            a,
            b,
        } => atomic::atomic(e, one(i)?, *op, *ord, *scope, *ptr, *a, *b),
        Op::Shfl {
            mode,
            value,
            b,
            c,
            mask,
        } => warp::shfl(e, one(i)?, *mode, *value, [*b, *c, *mask]),
        Op::Vote { mode, pred, mask } => warp::vote(e, one(i)?, *mode, *pred, *mask),
        Op::Redux { op, value, mask } => warp::redux(e, one(i)?, *op, *value, *mask),
        Op::Mma { shape, a, b, c } => tensor::mma(e, one(i)?, *shape, [*a, *b, *c]),
        Op::LdMatrix {
            num, trans, ptr, ..
        } => tensor::ldmatrix(e, one(i)?, *num, *trans, *ptr),
        Op::CpAsync {
            dst,
            src,
            bytes,
            cache,
        } => memory::cp_async(e, *dst, *src, *bytes, *cache),
        Op::CpAsyncCommit => {
            e.line("cp.async.commit_group");
            Ok(())
        }
        Op::CpAsyncWait { n } => {
            e.line(format!("cp.async.wait_group {n}"));
            Ok(())
        }
        Op::WgmmaDesc {
            ptr,
            lbo,
            sbo,
            swizzle,
        } => tensor::wgmma_desc(e, one(i)?, *ptr, (*lbo, *sbo, *swizzle)),
        Op::Wgmma { shape, ab, a, b, c } => {
            tensor::wgmma(e, i, one(i)?, (*shape, *ab), [*a, *b, *c])
        }
        Op::WgmmaFence => {
            e.line("wgmma.fence.sync.aligned");
            Ok(())
        }
        Op::WgmmaCommit => {
            e.line("wgmma.commit_group.sync.aligned");
            Ok(())
        }
        Op::WgmmaWait { n } => {
            e.line(format!("wgmma.wait_group.sync.aligned {n}"));
            Ok(())
        }
        Op::FenceProxyAsync => {
            e.line("fence.proxy.async.shared::cta");
            Ok(())
        }
        Op::MbarrierInit { bar, count } => {
            let (b, c) = (e.reg1(*bar)?, e.reg1(*count)?);
            e.line(format!("mbarrier.init.shared::cta.b64 [{b}], {c}"));
            Ok(())
        }
        Op::MbarrierArrive { bar } => {
            let b = e.reg1(*bar)?;
            e.line(format!("mbarrier.arrive.shared::cta.b64 _, [{b}]"));
            Ok(())
        }
        Op::MbarrierWait { bar, parity } => {
            let (b, q) = (e.reg1(*bar)?, e.reg1(*parity)?);
            let p = e.temp(RegClass::Pred);
            let id = e.label_id();
            let label = format!("$Lmbar_{id}");
            e.label(&label);
            e.line(format!(
                "mbarrier.try_wait.parity.shared::cta.b64 {p}, [{b}], {q}"
            ));
            e.line(format!("@!{p} bra {label}"));
            Ok(())
        }
        Op::CpAsyncMbarrierArrive { bar } => {
            let b = e.reg1(*bar)?;
            e.line(format!(
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{b}]"
            ));
            Ok(())
        }
        Op::If { .. } | Op::For { .. } | Op::Yield(_) | Op::Return => {
            Err("structured control flow reached the instruction emitter".into())
        }
    }
}

/// The one value an instruction defines, after checking it defines exactly one.
fn one(i: &Inst) -> Res<Value> {
    match i.results.as_slice() {
        [v] => Ok(*v),
        r => Err(format!("defines {} values, one expected", r.len())),
    }
}

/// Short name of an operation for comments and error messages: `bin add`, `load`.
pub(crate) fn op_name(op: &Op) -> String {
    match op {
        Op::Const { ty, .. } => format!("const {ty}"),
        Op::Param(i) => format!("param {i}"),
        Op::Special(s) => format!("special {}", s.name()),
        Op::Bin { op, .. } => op.name().to_string(),
        Op::Fma { .. } => "fma".into(),
        Op::Dp4a { .. } => "dp4a".into(),
        Op::Un { op, .. } => format!("{op:?}").to_lowercase(),
        Op::DivApprox { .. } => "div.approx".into(),
        Op::Cmp { op, .. } => format!("cmp {}", op.name()),
        Op::Select { .. } => "select".into(),
        Op::Cvt { to, .. } => format!("cvt {to}"),
        Op::Bitcast { to, .. } => format!("bitcast {to}"),
        Op::Pack { ty, .. } => format!("pack {ty}"),
        Op::Extract { index, .. } => format!("extract {index}"),
        Op::PtrAdd { .. } => "ptr_add".into(),
        Op::PtrCast { to, .. } => format!("ptr_cast {to}"),
        Op::SharedAddr { decl } => format!("shared_addr {decl}"),
        Op::Load { ty, .. } => format!("load {ty}"),
        Op::Store { .. } => "store".into(),
        Op::Barrier => "barrier".into(),
        Op::Fence { ord, scope } => format!("fence {} {}", ord.name(), scope.name()),
        Op::Atomic { op, .. } => format!("atomic {}", op.name()),
        Op::Shfl { mode, .. } => format!("shfl {}", mode.name()),
        Op::Vote { mode, .. } => format!("vote {}", mode.name()),
        Op::Redux { op, .. } => format!("redux {}", op.name()),
        Op::Mma { shape, .. } => format!("mma {}", shape.name()),
        Op::LdMatrix { num, trans, .. } => {
            format!("ldmatrix x{num}{}", if *trans { " trans" } else { "" })
        }
        Op::CpAsync { bytes, .. } => format!("cp.async {bytes}"),
        Op::CpAsyncCommit => "cp.async.commit".into(),
        Op::CpAsyncWait { n } => format!("cp.async.wait {n}"),
        Op::WgmmaDesc { swizzle, .. } => format!("wgmma_desc {}", swizzle.name()),
        Op::Wgmma { shape, .. } => format!("wgmma {}", shape.name()),
        Op::WgmmaFence => "wgmma.fence".into(),
        Op::WgmmaCommit => "wgmma.commit".into(),
        Op::WgmmaWait { n } => format!("wgmma.wait {n}"),
        Op::FenceProxyAsync => "fence_proxy_async".into(),
        Op::MbarrierInit { .. } => "mbarrier.init".into(),
        Op::MbarrierArrive { .. } => "mbarrier.arrive".into(),
        Op::MbarrierWait { .. } => "mbarrier.wait".into(),
        Op::CpAsyncMbarrierArrive { .. } => "cp.async.mbarrier_arrive".into(),
        Op::If { .. } => "if".into(),
        Op::For { .. } => "for".into(),
        Op::Yield(_) => "yield".into(),
        Op::Return => "return".into(),
    }
}
