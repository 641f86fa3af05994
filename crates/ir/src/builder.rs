//! A builder that reads like the kernel it builds.
//!
//! ```
//! use quench_ir::{Builder, Scalar, Type, AddrSpace};
//! let mut k = Builder::new("scale", 256);
//! let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::F32));
//! let n = k.param("n", Type::U32);
//! let i = k.global_id_x();
//! let inside = k.lt(i, n);
//! k.if_then(inside, |k| {
//!     let p = k.ptr_add(x, i);
//!     let v = k.load(Type::F32, p);
//!     let two = k.const_f32(2.0);
//!     let y = k.mul(v, two);
//!     k.store(p, y);
//! });
//! let f = k.finish().unwrap();
//! assert_eq!(f.name, "scale");
//! ```

use crate::func::{Block, Function, Inst, Param, SharedDecl, Value};
use crate::ops::*;
use crate::types::{AddrSpace, FragType, MmaShape, Scalar, Swizzle, Type};
use crate::verify::{verify, VerifyError};

pub struct Builder {
    name: String,
    max_threads: u32,
    params: Vec<Param>,
    shared: Vec<SharedDecl>,
    values: Vec<Type>,
    /// Innermost block last.
    stack: Vec<Block>,
}

impl Builder {
    pub fn new(name: &str, max_threads: u32) -> Builder {
        Builder {
            name: name.to_string(),
            max_threads,
            params: vec![],
            shared: vec![],
            values: vec![],
            stack: vec![Block::default()],
        }
    }

    /// Verify and return the kernel.
    pub fn finish(mut self) -> Result<Function, VerifyError> {
        let body = self.stack.pop().unwrap_or_default();
        let f = Function {
            name: self.name,
            params: self.params,
            shared: self.shared,
            max_threads: self.max_threads,
            values: self.values,
            body,
        };
        verify(&f)?;
        Ok(f)
    }

    pub fn ty(&self, v: Value) -> Type {
        self.values.get(v.index()).copied().unwrap_or(Type::PRED)
    }

    fn scalar_of(&self, v: Value) -> Scalar {
        match self.ty(v) {
            Type::Scalar(s) | Type::Vec(s, _) => s,
            Type::Ptr(..) => Scalar::U64,
            Type::Frag(f) => f.reg_type(),
        }
    }

    fn new_value(&mut self, ty: Type) -> Value {
        self.values.push(ty);
        Value(self.values.len() as u32 - 1)
    }

    fn block(&mut self) -> &mut Block {
        // The stack always holds the function body at least.
        let last = self.stack.len() - 1;
        &mut self.stack[last]
    }

    /// Append an instruction defining one value of `ty`.
    pub fn emit(&mut self, ty: Type, op: Op) -> Value {
        let v = self.new_value(ty);
        self.block().insts.push(Inst {
            results: vec![v],
            op,
        });
        v
    }

    /// Append an instruction that defines nothing.
    pub fn emit_void(&mut self, op: Op) {
        self.block().insts.push(Inst {
            results: vec![],
            op,
        });
    }

    // ---- parameters, constants, special registers -------------------------------

    pub fn param(&mut self, name: &str, ty: Type) -> Value {
        let idx = self.params.len() as u32;
        self.params.push(Param {
            name: name.to_string(),
            ty,
        });
        self.emit(ty, Op::Param(idx))
    }

    pub fn const_bits(&mut self, ty: Type, bits: u64) -> Value {
        self.emit(ty, Op::Const { ty, bits })
    }
    pub fn const_u32(&mut self, x: u32) -> Value {
        self.const_bits(Type::U32, x as u64)
    }
    pub fn const_i32(&mut self, x: i32) -> Value {
        self.const_bits(Type::I32, x as u32 as u64)
    }
    pub fn const_u64(&mut self, x: u64) -> Value {
        self.const_bits(Type::U64, x)
    }
    pub fn const_f32(&mut self, x: f32) -> Value {
        self.const_bits(Type::F32, x.to_bits() as u64)
    }
    pub fn const_f64(&mut self, x: f64) -> Value {
        self.const_bits(Type::Scalar(Scalar::F64), x.to_bits())
    }
    pub fn const_pred(&mut self, x: bool) -> Value {
        self.const_bits(Type::PRED, x as u64)
    }

    pub fn special(&mut self, s: Special) -> Value {
        self.emit(Type::Scalar(s.ty()), Op::Special(s))
    }
    pub fn tid_x(&mut self) -> Value {
        self.special(Special::TidX)
    }
    pub fn ntid_x(&mut self) -> Value {
        self.special(Special::NtidX)
    }
    pub fn ctaid_x(&mut self) -> Value {
        self.special(Special::CtaidX)
    }
    pub fn ctaid_y(&mut self) -> Value {
        self.special(Special::CtaidY)
    }
    pub fn nctaid_x(&mut self) -> Value {
        self.special(Special::NctaidX)
    }
    pub fn lane_id(&mut self) -> Value {
        self.special(Special::LaneId)
    }
    /// `ctaid.x * ntid.x + tid.x`
    pub fn global_id_x(&mut self) -> Value {
        let b = self.ctaid_x();
        let n = self.ntid_x();
        let t = self.tid_x();
        let bn = self.mul(b, n);
        self.add(bn, t)
    }

    // ---- arithmetic ------------------------------------------------------------

    /// A binary op; floats round to nearest even.
    pub fn bin(&mut self, op: BinOp, a: Value, b: Value) -> Value {
        let s = self.scalar_of(a);
        let rnd = if (s.is_float() || s.is_packed())
            && matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div)
        {
            Some(Round::Rn)
        } else {
            None
        };
        self.bin_rnd(op, rnd, a, b)
    }
    pub fn bin_rnd(&mut self, op: BinOp, rnd: Option<Round>, a: Value, b: Value) -> Value {
        let ty = self.ty(a);
        self.emit(ty, Op::Bin { op, rnd, a, b })
    }
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Add, a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Mul, a, b)
    }
    pub fn mul_hi(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::MulHi, a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Div, a, b)
    }
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Rem, a, b)
    }
    pub fn min(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Min, a, b)
    }
    pub fn max(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Max, a, b)
    }
    pub fn and(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::And, a, b)
    }
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Or, a, b)
    }
    pub fn xor(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Xor, a, b)
    }
    pub fn shl(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Shl, a, b)
    }
    pub fn shr(&mut self, a: Value, b: Value) -> Value {
        self.bin(BinOp::Shr, a, b)
    }
    /// `a op c` with `c` a constant of `a`'s type (integers; `c` zero-extended).
    fn with_const(&mut self, op: BinOp, a: Value, c: u32) -> Value {
        let ty = self.ty(a);
        let cv = self.const_bits(ty, c as u64);
        self.bin(op, a, cv)
    }
    pub fn add_const(&mut self, a: Value, c: u32) -> Value {
        self.with_const(BinOp::Add, a, c)
    }
    pub fn mul_const(&mut self, a: Value, c: u32) -> Value {
        self.with_const(BinOp::Mul, a, c)
    }
    pub fn and_const(&mut self, a: Value, c: u32) -> Value {
        self.with_const(BinOp::And, a, c)
    }
    /// Shift left by a constant amount.
    pub fn shl_const(&mut self, a: Value, c: u32) -> Value {
        let cv = self.const_u32(c);
        self.bin(BinOp::Shl, a, cv)
    }
    /// Shift right by a constant amount.
    pub fn shr_const(&mut self, a: Value, c: u32) -> Value {
        let cv = self.const_u32(c);
        self.bin(BinOp::Shr, a, cv)
    }
    /// a*b+c with one rounding (to nearest even).
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        let ty = self.ty(a);
        self.emit(
            ty,
            Op::Fma {
                rnd: Round::Rn,
                a,
                b,
                c,
            },
        )
    }
    /// `c + Σ a.byte[i]·b.byte[i]` ([`Op::Dp4a`]), the bytes of `a` and `b` signed as
    /// asked; `c` is `i32` when either is signed, else `u32`, and so is the result.
    pub fn dp4a(&mut self, a: Value, a_signed: bool, b: Value, b_signed: bool, c: Value) -> Value {
        let ty = if a_signed || b_signed {
            Type::I32
        } else {
            Type::U32
        };
        self.emit(
            ty,
            Op::Dp4a {
                a_signed,
                b_signed,
                a,
                b,
                c,
            },
        )
    }
    pub fn un(&mut self, op: UnOp, a: Value) -> Value {
        let ty = match op {
            UnOp::Popc | UnOp::Clz => Type::U32,
            _ => self.ty(a),
        };
        self.emit(ty, Op::Un { op, a })
    }
    pub fn neg(&mut self, a: Value) -> Value {
        self.un(UnOp::Neg, a)
    }
    pub fn abs(&mut self, a: Value) -> Value {
        self.un(UnOp::Abs, a)
    }
    pub fn not(&mut self, a: Value) -> Value {
        self.un(UnOp::Not, a)
    }
    pub fn sqrt(&mut self, a: Value) -> Value {
        self.un(UnOp::Sqrt(Round::Rn), a)
    }
    pub fn rcp(&mut self, a: Value) -> Value {
        self.un(UnOp::Rcp(Round::Rn), a)
    }
    pub fn rcp_approx(&mut self, a: Value) -> Value {
        self.un(UnOp::RcpApprox, a)
    }
    pub fn rsqrt_approx(&mut self, a: Value) -> Value {
        self.un(UnOp::RsqrtApprox, a)
    }
    pub fn ex2_approx(&mut self, a: Value) -> Value {
        self.un(UnOp::Ex2Approx, a)
    }
    pub fn lg2_approx(&mut self, a: Value) -> Value {
        self.un(UnOp::Lg2Approx, a)
    }
    pub fn tanh_approx(&mut self, a: Value) -> Value {
        self.un(UnOp::TanhApprox, a)
    }
    pub fn div_approx(&mut self, a: Value, b: Value) -> Value {
        let ty = self.ty(a);
        self.emit(ty, Op::DivApprox { a, b })
    }

    // ---- comparison and selection ------------------------------------------------

    pub fn cmp(&mut self, op: CmpOp, a: Value, b: Value) -> Value {
        self.emit(Type::PRED, Op::Cmp { op, a, b })
    }
    pub fn eq(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Eq, a, b)
    }
    pub fn ne(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Ne, a, b)
    }
    pub fn lt(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Lt, a, b)
    }
    pub fn le(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Le, a, b)
    }
    pub fn gt(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Gt, a, b)
    }
    pub fn ge(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Ge, a, b)
    }
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let ty = self.ty(a);
        self.emit(ty, Op::Select { cond, a, b })
    }

    // ---- conversions -------------------------------------------------------------

    /// Convert with the usual rounding: float narrowing and int→float to nearest even,
    /// float→int toward zero (C truncation), exact conversions without rounding.
    pub fn cvt(&mut self, to: Scalar, a: Value) -> Value {
        let from = self.scalar_of(a);
        let rnd = default_cvt_round(from, to);
        self.cvt_rnd(to, rnd, false, a)
    }
    pub fn cvt_rnd(&mut self, to: Scalar, rnd: Option<Round>, sat: bool, a: Value) -> Value {
        self.emit(Type::Scalar(to), Op::Cvt { to, rnd, sat, a })
    }
    pub fn bitcast(&mut self, to: Type, a: Value) -> Value {
        self.emit(to, Op::Bitcast { to, a })
    }
    /// Build a vector, packed pair or fragment of type `ty` from parts.
    pub fn pack(&mut self, ty: Type, parts: &[Value]) -> Value {
        self.emit(
            ty,
            Op::Pack {
                ty,
                parts: parts.to_vec(),
            },
        )
    }
    pub fn extract(&mut self, a: Value, index: u32) -> Value {
        let ty = match self.ty(a) {
            Type::Vec(s, _) => Type::Scalar(s),
            Type::Scalar(s) => Type::Scalar(s.packed_elem().unwrap_or(s)),
            Type::Frag(f) => Type::Scalar(f.reg_type()),
            t @ Type::Ptr(..) => t,
        };
        self.emit(ty, Op::Extract { a, index })
    }

    // ---- memory --------------------------------------------------------------------

    pub fn ptr_add(&mut self, ptr: Value, index: Value) -> Value {
        let ty = self.ty(ptr);
        self.emit(ty, Op::PtrAdd { ptr, index })
    }
    pub fn ptr_cast(&mut self, to: Scalar, ptr: Value) -> Value {
        let space = match self.ty(ptr) {
            Type::Ptr(s, _) => s,
            _ => AddrSpace::Global,
        };
        self.emit(Type::Ptr(space, to), Op::PtrCast { to, ptr })
    }
    /// Declare a shared-memory array and return its address.
    pub fn shared_array(&mut self, name: &str, elem: Scalar, len: u32, align: u32) -> Value {
        let decl = self.shared.len() as u32;
        self.shared.push(SharedDecl {
            name: name.to_string(),
            elem,
            len,
            align: align.max(elem.bytes()),
        });
        self.emit(Type::Ptr(AddrSpace::Shared, elem), Op::SharedAddr { decl })
    }
    pub fn load(&mut self, ty: Type, ptr: Value) -> Value {
        self.load_with(ty, ptr, CacheOp::Default)
    }
    pub fn load_with(&mut self, ty: Type, ptr: Value, cache: CacheOp) -> Value {
        self.emit(ty, Op::Load { ty, ptr, cache })
    }
    pub fn store(&mut self, ptr: Value, value: Value) {
        self.store_with(ptr, value, CacheOp::Default)
    }
    pub fn store_with(&mut self, ptr: Value, value: Value, cache: CacheOp) {
        self.emit_void(Op::Store { ptr, value, cache })
    }
    pub fn barrier(&mut self) {
        self.emit_void(Op::Barrier)
    }
    pub fn fence(&mut self, ord: Ordering, scope: Scope) {
        self.emit_void(Op::Fence { ord, scope })
    }
    pub fn atomic(
        &mut self,
        op: AtomOp,
        ord: Ordering,
        scope: Scope,
        ptr: Value,
        a: Value,
    ) -> Value {
        let ty = self.ty(a);
        self.emit(
            ty,
            Op::Atomic {
                op,
                ord,
                scope,
                ptr,
                a,
                b: None,
            },
        )
    }
    /// Compare-and-swap: writes `new` where the old value equals `cmp`; returns the old.
    pub fn atomic_cas(
        &mut self,
        ord: Ordering,
        scope: Scope,
        ptr: Value,
        cmp: Value,
        new: Value,
    ) -> Value {
        let ty = self.ty(cmp);
        self.emit(
            ty,
            Op::Atomic {
                op: AtomOp::Cas,
                ord,
                scope,
                ptr,
                a: cmp,
                b: Some(new),
            },
        )
    }

    // ---- warp collectives -----------------------------------------------------------

    /// `shfl.sync` over the full warp (mask 0xffffffff, clamp as PTX wants per mode).
    pub fn shfl(&mut self, mode: ShflMode, value: Value, lane_or_delta: Value) -> Value {
        let c = self.const_u32(if mode == ShflMode::Up { 0 } else { 31 });
        let mask = self.const_u32(u32::MAX);
        let ty = self.ty(value);
        self.emit(
            ty,
            Op::Shfl {
                mode,
                value,
                b: lane_or_delta,
                c,
                mask,
            },
        )
    }
    pub fn shfl_bfly(&mut self, value: Value, lane_mask: u32) -> Value {
        let b = self.const_u32(lane_mask);
        self.shfl(ShflMode::Bfly, value, b)
    }
    pub fn vote(&mut self, mode: VoteMode, pred: Value) -> Value {
        let mask = self.const_u32(u32::MAX);
        let ty = if mode == VoteMode::Ballot {
            Type::U32
        } else {
            Type::PRED
        };
        self.emit(ty, Op::Vote { mode, pred, mask })
    }
    pub fn redux(&mut self, op: ReduxOp, value: Value) -> Value {
        let mask = self.const_u32(u32::MAX);
        let ty = self.ty(value);
        self.emit(ty, Op::Redux { op, value, mask })
    }

    // ---- tensor cores ---------------------------------------------------------------

    pub fn mma(&mut self, shape: MmaShape, a: Value, b: Value, c: Value) -> Value {
        let ty = self.ty(c);
        self.emit(ty, Op::Mma { shape, a, b, c })
    }
    /// `ldmatrix` into a value of `ty` (`u32`, `vec2<u32>`, `vec4<u32>` or a fragment of
    /// `num` registers).
    pub fn ldmatrix(&mut self, ty: Type, num: u8, trans: bool, ptr: Value) -> Value {
        self.emit(
            ty,
            Op::LdMatrix {
                ty,
                num,
                trans,
                ptr,
            },
        )
    }
    pub fn cp_async(&mut self, dst: Value, src: Value, bytes: u8, cache: CacheOp) {
        self.emit_void(Op::CpAsync {
            dst,
            src,
            bytes,
            cache,
        })
    }
    pub fn cp_async_commit(&mut self) {
        self.emit_void(Op::CpAsyncCommit)
    }
    pub fn cp_async_wait(&mut self, n: u32) {
        self.emit_void(Op::CpAsyncWait { n })
    }
    /// A `wgmma` matrix descriptor of the operand tile at the shared pointer `ptr`.
    pub fn wgmma_desc(&mut self, ptr: Value, lbo: u32, sbo: u32, swizzle: Swizzle) -> Value {
        self.emit(
            Type::Scalar(Scalar::U64),
            Op::WgmmaDesc {
                ptr,
                lbo,
                sbo,
                swizzle,
            },
        )
    }
    /// `wgmma.mma_async`: `a` a fragment or a descriptor, `b` a descriptor, `c` the
    /// accumulator.
    pub fn wgmma(&mut self, shape: MmaShape, ab: Scalar, a: Value, b: Value, c: Value) -> Value {
        let ty = self.ty(c);
        self.emit(ty, Op::Wgmma { shape, ab, a, b, c })
    }
    pub fn wgmma_fence(&mut self) {
        self.emit_void(Op::WgmmaFence)
    }
    pub fn wgmma_commit(&mut self) {
        self.emit_void(Op::WgmmaCommit)
    }
    pub fn wgmma_wait(&mut self, n: u32) {
        self.emit_void(Op::WgmmaWait { n })
    }
    pub fn fence_proxy_async(&mut self) {
        self.emit_void(Op::FenceProxyAsync)
    }
    pub fn mbarrier_init(&mut self, bar: Value, count: Value) {
        self.emit_void(Op::MbarrierInit { bar, count })
    }
    pub fn mbarrier_arrive(&mut self, bar: Value) {
        self.emit_void(Op::MbarrierArrive { bar })
    }
    pub fn mbarrier_wait(&mut self, bar: Value, parity: Value) {
        self.emit_void(Op::MbarrierWait { bar, parity })
    }
    pub fn cp_async_mbarrier_arrive(&mut self, bar: Value) {
        self.emit_void(Op::CpAsyncMbarrierArrive { bar })
    }
    pub fn frag_type(shape: MmaShape, role: crate::types::FragRole, elem: Scalar) -> Type {
        Type::Frag(FragType { shape, role, elem })
    }

    // ---- control flow ---------------------------------------------------------------

    fn nested(
        &mut self,
        args: Vec<Value>,
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> Block {
        self.stack.push(Block {
            args: args.clone(),
            insts: vec![],
        });
        let yielded = body(self, &args);
        self.emit_void(Op::Yield(yielded));
        self.stack.pop().unwrap_or_default()
    }

    /// `if cond { then }` with no results.
    pub fn if_then(&mut self, cond: Value, then_: impl FnOnce(&mut Builder)) {
        self.if_else(
            cond,
            &[],
            |k| {
                then_(k);
                vec![]
            },
            |_| vec![],
        );
    }

    /// `if cond { then } else { else }`, each branch yielding values of `results`.
    pub fn if_else(
        &mut self,
        cond: Value,
        results: &[Type],
        then_: impl FnOnce(&mut Builder) -> Vec<Value>,
        else_: impl FnOnce(&mut Builder) -> Vec<Value>,
    ) -> Vec<Value> {
        let then_b = self.nested(vec![], |k, _| then_(k));
        let else_b = self.nested(vec![], |k, _| else_(k));
        let outs: Vec<Value> = results.iter().map(|t| self.new_value(*t)).collect();
        self.block().insts.push(Inst {
            results: outs.clone(),
            op: Op::If {
                cond,
                then_: then_b,
                else_: else_b,
                results: results.to_vec(),
            },
        });
        outs
    }

    /// `for iv in (lo..hi).step_by(step)` carrying `init`; the body gets `iv` and the
    /// carried values and returns the next carried values. Returns the final ones.
    pub fn for_range(
        &mut self,
        lo: Value,
        hi: Value,
        step: Value,
        init: &[Value],
        body: impl FnOnce(&mut Builder, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let iv = self.new_value(self.ty(lo));
        let mut args = vec![iv];
        for v in init {
            let t = self.ty(*v);
            args.push(self.new_value(t));
        }
        let block = self.nested(args, |k, a| body(k, a[0], &a[1..]));
        let outs: Vec<Value> = init.iter().map(|v| self.new_value(self.ty(*v))).collect();
        self.block().insts.push(Inst {
            results: outs.clone(),
            op: Op::For {
                lo,
                hi,
                step,
                init: init.to_vec(),
                body: block,
            },
        });
        outs
    }

    pub fn ret(&mut self) {
        self.emit_void(Op::Return)
    }
}

/// The rounding a plain conversion uses: none where the conversion is exact.
pub fn default_cvt_round(from: Scalar, to: Scalar) -> Option<Round> {
    if from.is_float() && to.is_float() {
        // Narrowing rounds, and so does f16↔bf16 (each loses range or precision).
        (from != to && to.bits() <= from.bits()).then_some(Round::Rn)
    } else if from.is_int() && to.is_float() {
        Some(Round::Rn)
    } else if from.is_float() && to.is_int() {
        Some(Round::Rz)
    } else {
        None
    }
}
