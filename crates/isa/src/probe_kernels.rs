//! Probe kernels: tiny IR kernels whose outputs reveal how the hardware lays out MMA
//! fragments and `ldmatrix` results, and how accurate its approximate instructions are.

use quench_ir::{
    AddrSpace, Builder, FragRole, Function, MmaShape, Scalar, Type, UnOp, Value, VerifyError,
};

/// Element type of an MMA probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaElem {
    Bf16,
    F16,
    S8,
}

impl MmaElem {
    pub const ALL: [MmaElem; 3] = [MmaElem::Bf16, MmaElem::F16, MmaElem::S8];

    pub fn shape(self) -> MmaShape {
        match self {
            MmaElem::Bf16 | MmaElem::F16 => MmaShape::M16N8K16,
            MmaElem::S8 => MmaShape::M16N8K32,
        }
    }

    pub fn scalar(self) -> Scalar {
        match self {
            MmaElem::Bf16 => Scalar::BF16,
            MmaElem::F16 => Scalar::F16,
            MmaElem::S8 => Scalar::I8,
        }
    }

    pub fn acc(self) -> Scalar {
        match self {
            MmaElem::S8 => Scalar::I32,
            _ => Scalar::F32,
        }
    }

    /// Table key, e.g. `m16n8k16.bf16`.
    pub fn key(self) -> String {
        let e = match self {
            MmaElem::Bf16 => "bf16",
            MmaElem::F16 => "f16",
            MmaElem::S8 => "s8",
        };
        format!("{}.{e}", self.shape().name())
    }

    /// Elements packed in one 32-bit register of A or B.
    pub fn per_reg(self) -> u32 {
        4 / self.scalar().bytes()
    }

    /// Bit pattern of 1 in the element type.
    fn one_bits(self) -> u64 {
        match self {
            MmaElem::Bf16 => 0x3f80,
            MmaElem::F16 => 0x3c00,
            MmaElem::S8 => 1,
        }
    }
}

/// Number of slots (lane, register, sub-element) of an operand fragment.
pub fn slots(elem: MmaElem, role: FragRole) -> u32 {
    let ft = quench_ir::FragType {
        shape: elem.shape(),
        role,
        elem: if role == FragRole::C {
            elem.acc()
        } else {
            elem.scalar()
        },
    };
    let per = if role == FragRole::C {
        1
    } else {
        elem.per_reg()
    };
    32 * ft.regs() * per
}

fn frag_ty(elem: MmaElem, role: FragRole) -> Type {
    let e = if role == FragRole::C {
        elem.acc()
    } else {
        elem.scalar()
    };
    Builder::frag_type(elem.shape(), role, e)
}

/// Build one 32-bit register from `per` sub-element values (already of the element
/// type for 16-bit elements; `u32` bytes for s8).
fn pack_reg(k: &mut Builder, elem: MmaElem, parts: &[Value]) -> Value {
    match elem {
        MmaElem::Bf16 => k.pack(Type::Scalar(Scalar::BF16x2), parts),
        MmaElem::F16 => k.pack(Type::Scalar(Scalar::F16x2), parts),
        MmaElem::S8 => {
            let mut acc = k.const_u32(0);
            for (i, p) in parts.iter().enumerate() {
                let sh = k.const_u32(8 * i as u32);
                let shifted = k.shl(*p, sh);
                acc = k.or(acc, shifted);
            }
            acc
        }
    }
}

/// Converts a small positive `u32` to the element type (exact for values ≤ 127).
fn small_int_to_elem(k: &mut Builder, elem: MmaElem, v: Value) -> Value {
    match elem {
        MmaElem::S8 => k.and_const(v, 0xff),
        _ => {
            let f = k.cvt(Scalar::F32, v);
            k.cvt(elem.scalar(), f)
        }
    }
}

/// The relation probe: block `s` (one warp) sets A slot `s` to one and every other A
/// slot to zero, gives B slot `j` a value that identifies `j`, and C zero. The D slots
/// that come out nonzero are those A slot `s` contributes to, and their values name the
/// B slot it met there. For s8, `code_base` splits B slot numbers into two launches
/// (`j % 127 + 1` when `high == 0`, `j / 127 + 1` when `high == 1`) to stay in range.
///
/// Parameters: `out: ptr<global, acc>` of `slots(A) * 32 * regs(C)` elements, `high: u32`.
pub fn mma_relation_probe(elem: MmaElem) -> Result<Function, VerifyError> {
    let mut k = Builder::new(&format!("probe_mma_{}", elem.key().replace('.', "_")), 32);
    let out = k.param("out", Type::Ptr(AddrSpace::Global, elem.acc()));
    let high = k.param("high", Type::U32);
    let s = k.ctaid_x();
    let lane = k.lane_id();
    let per = elem.per_reg();
    let a_regs = slots(elem, FragRole::A) / 32 / per;
    let b_regs = slots(elem, FragRole::B) / 32 / per;
    let c_regs = slots(elem, FragRole::C) / 32;

    // A: one-hot at slot s = (lane * a_regs + reg) * per + sub.
    let one = k.const_bits(Type::Scalar(elem_storage(elem)), elem.one_bits());
    let zero = k.const_bits(Type::Scalar(elem_storage(elem)), 0);
    let mut a_parts = vec![];
    for r in 0..a_regs {
        let mut subs = vec![];
        for sub in 0..per {
            let base = k.mul_const(lane, a_regs * per);
            let idx = k.add_const(base, r * per + sub);
            let hit = k.eq(idx, s);
            subs.push(k.select(hit, one, zero));
        }
        a_parts.push(pack_reg(&mut k, elem, &subs));
    }
    let a = k.pack(frag_ty(elem, FragRole::A), &a_parts);

    // B: slot j = (lane * b_regs + reg) * per + sub carries a code of j.
    let mut b_parts = vec![];
    for r in 0..b_regs {
        let mut subs = vec![];
        for sub in 0..per {
            let base = k.mul_const(lane, b_regs * per);
            let j = k.add_const(base, r * per + sub);
            let code = match elem {
                MmaElem::S8 => {
                    let c127 = k.const_u32(127);
                    let lo = k.rem(j, c127);
                    let hi = k.div(j, c127);
                    let zero_u = k.const_u32(0);
                    let is_high = k.ne(high, zero_u);
                    let pick = k.select(is_high, hi, lo);
                    k.add_const(pick, 1)
                }
                _ => k.add_const(j, 1),
            };
            subs.push(small_int_to_elem(&mut k, elem, code));
        }
        b_parts.push(pack_reg(&mut k, elem, &subs));
    }
    let b = k.pack(frag_ty(elem, FragRole::B), &b_parts);

    let acc_zero = k.const_bits(Type::Scalar(elem.acc()), 0);
    let c = k.pack(frag_ty(elem, FragRole::C), &vec![acc_zero; c_regs as usize]);
    let d = k.mma(elem.shape(), a, b, c);
    store_frag(&mut k, out, d, s, lane, c_regs);
    k.finish()
}

/// The accumulator probe: A and B zero, C slot `lane * regs + r` holds that number plus
/// one; D shows where each C slot lands.
pub fn mma_accumulator_probe(elem: MmaElem) -> Result<Function, VerifyError> {
    let mut k = Builder::new(
        &format!("probe_mma_acc_{}", elem.key().replace('.', "_")),
        32,
    );
    let out = k.param("out", Type::Ptr(AddrSpace::Global, elem.acc()));
    let lane = k.lane_id();
    let per = elem.per_reg();
    let zero_reg = match elem {
        MmaElem::S8 => k.const_u32(0),
        MmaElem::Bf16 => k.const_bits(Type::Scalar(Scalar::BF16x2), 0),
        MmaElem::F16 => k.const_bits(Type::Scalar(Scalar::F16x2), 0),
    };
    let a_regs = slots(elem, FragRole::A) / 32 / per;
    let b_regs = slots(elem, FragRole::B) / 32 / per;
    let c_regs = slots(elem, FragRole::C) / 32;
    let a = k.pack(frag_ty(elem, FragRole::A), &vec![zero_reg; a_regs as usize]);
    let b = k.pack(frag_ty(elem, FragRole::B), &vec![zero_reg; b_regs as usize]);
    let mut c_parts = vec![];
    for r in 0..c_regs {
        let base = k.mul_const(lane, c_regs);
        let idx = k.add_const(base, r + 1);
        c_parts.push(match elem {
            MmaElem::S8 => k.bitcast(Type::Scalar(Scalar::I32), idx),
            _ => k.cvt(Scalar::F32, idx),
        });
    }
    let c = k.pack(frag_ty(elem, FragRole::C), &c_parts);
    let d = k.mma(elem.shape(), a, b, c);
    let block = k.const_u32(0);
    store_frag(&mut k, out, d, block, lane, c_regs);
    k.finish()
}

fn elem_storage(elem: MmaElem) -> Scalar {
    match elem {
        MmaElem::S8 => Scalar::U32,
        e => e.scalar(),
    }
}

/// `out[(block * 32 + lane) * regs + r] = d[r]`
fn store_frag(k: &mut Builder, out: Value, d: Value, block: Value, lane: Value, regs: u32) {
    let row = k.mul_const(block, 32);
    let row = k.add(row, lane);
    let base = k.mul_const(row, regs);
    for r in 0..regs {
        let v = k.extract(d, r);
        let i = k.add_const(base, r);
        let p = k.ptr_add(out, i);
        k.store(p, v);
    }
}

/// `ldmatrix` variants probed: (matrices, transposed).
pub const LDMATRIX_VARIANTS: [(u8, bool); 6] = [
    (1, false),
    (2, false),
    (4, false),
    (1, true),
    (2, true),
    (4, true),
];

pub fn ldmatrix_key(num: u8, trans: bool) -> String {
    format!("x{num}{}", if trans { ".trans" } else { "" })
}

/// The `ldmatrix` probe: each lane writes the 8 16-bit elements `lane * 8 + col` of its
/// own row into shared memory and supplies that row's address, so every element that
/// arrives names the lane whose address was used and its column.
///
/// Parameters: `out: ptr<global, u32>` of `32 * num` words.
pub fn ldmatrix_probe(num: u8, trans: bool) -> Result<Function, VerifyError> {
    let mut k = Builder::new(
        &format!(
            "probe_ldmatrix_{}",
            ldmatrix_key(num, trans).replace('.', "_")
        ),
        32,
    );
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let rows = k.shared_array("rows", Scalar::U16, 32 * 8, 16);
    let lane = k.lane_id();
    let row_start = k.mul_const(lane, 8);
    for col in 0..8 {
        let idx = k.add_const(row_start, col);
        let v = k.cvt(Scalar::U16, idx);
        let p = k.ptr_add(rows, idx);
        k.store(p, v);
    }
    k.barrier();
    let addr = k.ptr_add(rows, row_start);
    let ty = match num {
        1 => Type::U32,
        n => Type::Vec(Scalar::U32, n),
    };
    let got = k.ldmatrix(ty, num, trans, addr);
    let base = k.mul_const(lane, num as u32);
    for r in 0..num as u32 {
        let v = if num == 1 { got } else { k.extract(got, r) };
        let i = k.add_const(base, r);
        let p = k.ptr_add(out, i);
        k.store(p, v);
    }
    k.finish()
}

/// Approximate instructions whose error is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApproxOp {
    Un(UnOp),
    Div,
}

impl ApproxOp {
    pub const ALL: [ApproxOp; 8] = [
        ApproxOp::Un(UnOp::Ex2Approx),
        ApproxOp::Un(UnOp::Lg2Approx),
        ApproxOp::Un(UnOp::RcpApprox),
        ApproxOp::Un(UnOp::RsqrtApprox),
        ApproxOp::Un(UnOp::TanhApprox),
        ApproxOp::Un(UnOp::SinApprox),
        ApproxOp::Un(UnOp::CosApprox),
        ApproxOp::Div,
    ];

    /// PTX spelling of the instruction measured.
    pub fn name(self) -> &'static str {
        match self {
            ApproxOp::Un(UnOp::Ex2Approx) => "ex2.approx.ftz.f32",
            ApproxOp::Un(UnOp::Lg2Approx) => "lg2.approx.ftz.f32",
            ApproxOp::Un(UnOp::RcpApprox) => "rcp.approx.f32",
            ApproxOp::Un(UnOp::RsqrtApprox) => "rsqrt.approx.f32",
            ApproxOp::Un(UnOp::TanhApprox) => "tanh.approx.f32",
            ApproxOp::Un(UnOp::SinApprox) => "sin.approx.f32",
            ApproxOp::Un(UnOp::CosApprox) => "cos.approx.f32",
            ApproxOp::Div => "div.approx.f32",
            ApproxOp::Un(_) => "unknown",
        }
    }
}

/// `out[i] = op(x[i])` (or `x[i] / y[i]` for division), one element per thread.
/// Parameters: `x, y, out: ptr<global, f32>`, `n: u32`.
pub fn approx_probe(op: ApproxOp) -> Result<Function, VerifyError> {
    let name = format!("probe_{}", op.name().replace('.', "_"));
    let mut k = Builder::new(&name, 256);
    let x = k.param("x", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let y = k.param("y", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let n = k.param("n", Type::U32);
    let i = k.global_id_x();
    let inside = k.lt(i, n);
    k.if_then(inside, |k| {
        let px = k.ptr_add(x, i);
        let xv = k.load(Type::F32, px);
        let r = match op {
            ApproxOp::Un(u) => k.un(u, xv),
            ApproxOp::Div => {
                let py = k.ptr_add(y, i);
                let yv = k.load(Type::F32, py);
                k.div_approx(xv, yv)
            }
        };
        let po = k.ptr_add(out, i);
        k.store(po, r);
    });
    k.finish()
}
