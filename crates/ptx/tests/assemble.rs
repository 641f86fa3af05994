//! Every kernel in `common::kernels` (and the byte dot products here) emits and assembles
//! with ptxas for sm_90, and together they use every operation of the IR.

mod common;

use std::collections::BTreeSet;

use common::kernels;
use quench_ir::{AddrSpace, Builder, Function, Op, Scalar, Type};

fn assemble_all(fs: impl IntoIterator<Item = Function>) {
    for f in fs {
        common::assemble(&f);
    }
}

#[test]
fn loads_and_stores_of_every_type() {
    assemble_all(common::storable().into_iter().map(kernels::memory));
}

#[test]
fn arithmetic_of_every_type() {
    assemble_all(Scalar::ALL.into_iter().map(kernels::arith));
}

#[test]
fn selection_of_every_shape() {
    assemble_all([kernels::selects()]);
}

#[test]
fn conversions_between_every_pair_of_types() {
    assemble_all(common::numeric().into_iter().map(kernels::convert_from));
}

#[test]
fn bit_reinterpretation_pack_and_extract() {
    assemble_all([kernels::bits()]);
}

#[test]
fn structured_control_flow() {
    let (ptx, _) = common::assemble(&kernels::control());
    // Two-sided `if`s and loops that test their bound at the top.
    assert!(ptx.contains("bra $Lelse_"));
    assert!(ptx.contains("setp.ge.u32"), "unsigned loop bound");
    assert!(ptx.contains("setp.ge.s32"), "signed loop bound");
    assert!(ptx.contains("setp.ge.u16"), "byte loop bound");
}

#[test]
fn warp_collectives_and_special_registers() {
    assemble_all([kernels::warp()]);
}

#[test]
fn fences_and_atomics() {
    let (ptx, _) = common::assemble(&kernels::atomics());
    assert!(ptx.contains("atom.relaxed.cta.global.add.s32"), "{ptx}");
    assert!(ptx.contains("fence.sc.gpu;"));
}

#[test]
fn tensor_cores_and_async_copies() {
    let (ptx, _) = common::assemble(&kernels::tensor());
    for needle in [
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
        "cp.async.cg.shared.global",
        "cp.async.wait_group 1;",
    ] {
        assert!(ptx.contains(needle), "missing {needle}");
    }
}

/// `dp4a` in every signedness, chained as a dot product would chain it.
fn byte_dots() -> Function {
    let mut k = Builder::new("byte_dots", 32);
    let words = k.param("words", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::I32));
    let t = k.tid_x();
    let at = k.ptr_add(words, t);
    let a = k.load(Type::U32, at);
    let b = k.shr_const(a, 3);
    let zero = k.const_u32(0);
    let uu = k.dp4a(a, false, b, false, zero);
    let su = k.bitcast(Type::I32, uu);
    let su = k.dp4a(a, true, b, false, su);
    let us = k.dp4a(b, false, a, true, su);
    let ss = k.dp4a(a, true, a, true, us);
    let at = k.ptr_add(out, t);
    k.store(at, ss);
    k.finish().expect("byte_dots verifies")
}

/// The warpgroup products target sm_90a; a loop's accumulator stays in its registers
/// (no copy between products), the one read after its product is copied first.
#[test]
fn warpgroup_products() {
    let (ptx, report) = common::assemble(&kernels::warpgroup());
    assert!(ptx.contains(".target sm_90a"), "{ptx}");
    for inst in [
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "wgmma.fence.sync.aligned",
        "wgmma.commit_group.sync.aligned",
        "wgmma.wait_group.sync.aligned 1",
        "fence.proxy.async.shared::cta",
    ] {
        assert!(ptx.contains(inst), "no {inst} in\n{ptx}");
    }
    // Registers copied into each product's accumulator (the lines its emission begins
    // with): none in the loops, each shape's n/2 for the product after its loop.
    let mut copies: Vec<usize> = ptx
        .split("= wgmma m64n")
        .skip(1)
        .map(|part| {
            part.lines()
                .skip(1)
                .take_while(|l| l.trim_start().starts_with("mov.f32"))
                .count()
        })
        .collect();
    copies.sort_unstable();
    assert_eq!(
        copies,
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 16, 32, 64, 128],
        "{ptx}"
    );
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
}

/// mbarrier initialization, arrivals (also on `cp.async` completion) and a parity wait
/// loop.
#[test]
fn mbarriers() {
    let (ptx, _) = common::assemble(&kernels::mbarriers());
    for inst in [
        "mbarrier.init.shared::cta.b64",
        "mbarrier.arrive.shared::cta.b64 _,",
        "mbarrier.try_wait.parity.shared::cta.b64",
        "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
    ] {
        assert!(ptx.contains(inst), "no {inst} in\n{ptx}");
    }
}

#[test]
fn byte_dot_products() {
    let (ptx, _) = common::assemble(&byte_dots());
    for inst in [
        "dp4a.u32.u32",
        "dp4a.s32.u32",
        "dp4a.u32.s32",
        "dp4a.s32.s32",
    ] {
        assert!(ptx.contains(inst), "no {inst} in\n{ptx}");
    }
}

#[test]
fn address_arithmetic() {
    assemble_all([kernels::addressing()]);
}

#[test]
fn a_block_reduction_reports_its_resources() {
    let (_, report) = common::assemble(&kernels::block_sum());
    assert_eq!(report.shared_bytes, 32, "8 f32 partial sums");
    assert!(report.registers > 0 && report.registers < 64, "{report:?}");
    assert_eq!((report.spill_store_bytes, report.spill_load_bytes), (0, 0));
}

/// The name of an op's variant; the match is exhaustive so that a new op fails to
/// compile here until a test kernel uses it.
fn variant(op: &Op) -> &'static str {
    match op {
        Op::Const { .. } => "Const",
        Op::Param(_) => "Param",
        Op::Special(_) => "Special",
        Op::Bin { .. } => "Bin",
        Op::Fma { .. } => "Fma",
        Op::Dp4a { .. } => "Dp4a",
        Op::Un { .. } => "Un",
        Op::DivApprox { .. } => "DivApprox",
        Op::Cmp { .. } => "Cmp",
        Op::Select { .. } => "Select",
        Op::Cvt { .. } => "Cvt",
        Op::Bitcast { .. } => "Bitcast",
        Op::Pack { .. } => "Pack",
        Op::Extract { .. } => "Extract",
        Op::PtrAdd { .. } => "PtrAdd",
        Op::PtrCast { .. } => "PtrCast",
        Op::SharedAddr { .. } => "SharedAddr",
        Op::Load { .. } => "Load",
        Op::Store { .. } => "Store",
        Op::Barrier => "Barrier",
        Op::Fence { .. } => "Fence",
        Op::Atomic { .. } => "Atomic",
        Op::Shfl { .. } => "Shfl",
        Op::Vote { .. } => "Vote",
        Op::Redux { .. } => "Redux",
        Op::Mma { .. } => "Mma",
        Op::LdMatrix { .. } => "LdMatrix",
        Op::CpAsync { .. } => "CpAsync",
        Op::CpAsyncCommit => "CpAsyncCommit",
        Op::CpAsyncWait { .. } => "CpAsyncWait",
        Op::WgmmaDesc { .. } => "WgmmaDesc",
        Op::Wgmma { .. } => "Wgmma",
        Op::WgmmaFence => "WgmmaFence",
        Op::WgmmaCommit => "WgmmaCommit",
        Op::WgmmaWait { .. } => "WgmmaWait",
        Op::FenceProxyAsync => "FenceProxyAsync",
        Op::MbarrierInit { .. } => "MbarrierInit",
        Op::MbarrierArrive { .. } => "MbarrierArrive",
        Op::MbarrierWait { .. } => "MbarrierWait",
        Op::CpAsyncMbarrierArrive { .. } => "CpAsyncMbarrierArrive",
        Op::If { .. } => "If",
        Op::For { .. } => "For",
        Op::Yield(_) => "Yield",
        Op::Return => "Return",
    }
}

const VARIANTS: [&str; 44] = [
    "Const",
    "Param",
    "Special",
    "Bin",
    "Fma",
    "Dp4a",
    "Un",
    "DivApprox",
    "Cmp",
    "Select",
    "Cvt",
    "Bitcast",
    "Pack",
    "Extract",
    "PtrAdd",
    "PtrCast",
    "SharedAddr",
    "Load",
    "Store",
    "Barrier",
    "Fence",
    "Atomic",
    "Shfl",
    "Vote",
    "Redux",
    "Mma",
    "LdMatrix",
    "CpAsync",
    "CpAsyncCommit",
    "CpAsyncWait",
    "WgmmaDesc",
    "Wgmma",
    "WgmmaFence",
    "WgmmaCommit",
    "WgmmaWait",
    "FenceProxyAsync",
    "MbarrierInit",
    "MbarrierArrive",
    "MbarrierWait",
    "CpAsyncMbarrierArrive",
    "If",
    "For",
    "Yield",
    "Return",
];

#[test]
fn the_test_kernels_use_every_op_variant() {
    let mut seen = BTreeSet::new();
    for f in kernels::all().into_iter().chain([byte_dots()]) {
        f.walk(&mut |i| {
            seen.insert(variant(&i.op));
        });
    }
    let all: BTreeSet<&str> = VARIANTS.into_iter().collect();
    assert_eq!(seen, all);
}
