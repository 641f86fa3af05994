//! Interpreter: `wgmma.mma_async` with operands in shared memory under every descriptor
//! layout, A also from registers. The host places each matrix element with the PTX ISA's
//! canonical-layout formulas (written out here, independently of the interpreter's
//! `element_address`) and reads D with the documented accumulator layout; small integer
//! values make every sum exact, so any misplaced element shows.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Descriptor, Device, InterpError};
use quench_ir::{AddrSpace, Builder, FragRole, Function, MmaShape, Scalar, Swizzle, Type};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);
const PF32: Type = Type::Ptr(AddrSpace::Global, Scalar::F32);
/// Shared bytes: A's tile at 0, B's at `B_AT` (both 1024-byte aligned).
const SHARED: u32 = 24576;
const B_AT: u32 = 8192;

/// Byte address of element `k` of operand row `row`, from the PTX ISA's K-major
/// canonical layouts: 8×16-byte core matrices without swizzling (`lbo` apart along k,
/// `sbo` between 8-row groups); with swizzling, rows of 32, 64 or 128 bytes whose
/// 16-byte chunk index is XORed with the row within its 8-row atom, shifted down to as
/// many bits as the row has chunks (all three bits for 128 bytes, the upper two for 64,
/// the top one for 32).
fn isa_address(z: Swizzle, start: u32, lbo: u32, sbo: u32, row: u32, k: u32) -> u32 {
    let (byte, group, r8) = (2 * k, (row / 8) * sbo, row % 8);
    let xor = match z {
        Swizzle::None => {
            return start + group + (byte / 16) * lbo + r8 * 16 + byte % 16;
        }
        Swizzle::B128 => r8,
        Swizzle::B64 => r8 >> 1,
        Swizzle::B32 => r8 >> 2,
    };
    start + group + r8 * z.bytes() + ((byte / 16) ^ xor) * 16 + byte % 16
}

/// Copy `words` u32 from `src` into shared memory, then one product with A through a
/// descriptor (`a_regs` false) or loaded from `afrag` (four registers per thread), store
/// D's registers to `d`.
fn kernel(shape: MmaShape, desc: (u32, u32, Swizzle), a_regs: bool) -> Function {
    let (lbo, sbo, z) = desc;
    let (_, n, _) = shape.dims();
    let mut k = Builder::new("wg", 128);
    let src = k.param("src", PU32);
    let afrag = k.param("afrag", PU32);
    let d = k.param("d", PF32);
    let tile = k.shared_array("tile", Scalar::U32, SHARED / 4, 1024);
    let tid = k.tid_x();
    for i in 0..SHARED / 4 / 128 {
        let at = k.add_const(tid, i * 128);
        let from = k.ptr_add(src, at);
        let x = k.load(Type::U32, from);
        let to = k.ptr_add(tile, at);
        k.store(to, x);
    }
    k.fence_proxy_async();
    k.barrier();
    let b_ptr = k.const_u32(B_AT / 4);
    let b_ptr = k.ptr_add(tile, b_ptr);
    let b = k.wgmma_desc(b_ptr, lbo, sbo, z);
    let a = if a_regs {
        let base = k.shl_const(tid, 2);
        let regs: Vec<_> = (0..4)
            .map(|r| {
                let i = k.add_const(base, r);
                let p = k.ptr_add(afrag, i);
                let x = k.load(Type::U32, p);
                k.bitcast(Type::Scalar(Scalar::F16x2), x)
            })
            .collect();
        k.pack(Builder::frag_type(shape, FragRole::A, Scalar::F16), &regs)
    } else {
        k.wgmma_desc(tile, lbo, sbo, z)
    };
    let zero = k.const_f32(0.0);
    let c = k.pack(
        Builder::frag_type(shape, FragRole::C, Scalar::F32),
        &vec![zero; (n / 2) as usize],
    );
    k.wgmma_fence();
    let out = k.wgmma(shape, Scalar::F16, a, b, c);
    k.wgmma_commit();
    k.wgmma_wait(0);
    let base = k.mul_const(tid, n / 2);
    for r in 0..n / 2 {
        let x = k.extract(out, r);
        let i = k.add_const(base, r);
        let p = k.ptr_add(d, i);
        k.store(p, x);
    }
    k.finish().expect("verifies")
}

/// Accumulator register `reg` of thread `t`: (row, column) of D.
fn d_slot(t: u32, reg: u32) -> (u32, u32) {
    let (warp, lane) = (t / 32, t % 32);
    let r = reg % 4;
    (
        16 * warp + lane / 4 + 8 * (r / 2),
        8 * (reg / 4) + 2 * (lane % 4) + r % 2,
    )
}

/// A register of thread `t` (m16n8k16's A fragment per warp): (row, k) of its halves.
fn a_slot(t: u32, reg: u32, half: u32) -> (u32, u32) {
    let (warp, lane) = (t / 32, t % 32);
    (
        16 * warp + lane / 4 + 8 * (reg % 2),
        2 * (lane % 4) + half + 8 * (reg / 2),
    )
}

fn f16_bits(x: i32) -> u16 {
    half::f16::from_f32(x as f32).to_bits()
}

fn run_case(shape: MmaShape, desc: (u32, u32, Swizzle), a_regs: bool) -> Result<(), String> {
    run_placed(shape, desc, desc, a_regs)
}

/// Place A and B in shared memory as `placed` says, read them through descriptors of
/// `read`, compare D with the exact product.
fn run_placed(
    shape: MmaShape,
    placed: (u32, u32, Swizzle),
    read: (u32, u32, Swizzle),
    a_regs: bool,
) -> Result<(), String> {
    let (lbo, sbo, z) = placed;
    let (m, n, kk) = shape.dims();
    let mut rng = rng();
    let a: Vec<i32> = (0..m * kk).map(|_| rng.gen_range(-3..=3)).collect();
    let b: Vec<i32> = (0..kk * n).map(|_| rng.gen_range(-3..=3)).collect();
    let mut shared = vec![0u8; SHARED as usize];
    let mut put = |addr: u32, x: i32| {
        shared[addr as usize..addr as usize + 2].copy_from_slice(&f16_bits(x).to_le_bytes())
    };
    for row in 0..m {
        for k in 0..kk {
            put(
                isa_address(z, 0, lbo, sbo, row, k),
                a[(row * kk + k) as usize],
            );
        }
    }
    for col in 0..n {
        for k in 0..kk {
            put(
                isa_address(z, B_AT, lbo, sbo, col, k),
                b[(k * n + col) as usize],
            );
        }
    }
    let mut afrag = vec![0u32; 128 * 4];
    for t in 0..128 {
        for reg in 0..4 {
            let word = (0..2).fold(0u32, |w, h| {
                let (r, k) = a_slot(t, reg, h);
                w | (f16_bits(a[(r * kk + k) as usize]) as u32) << (16 * h)
            });
            afrag[(t * 4 + reg) as usize] = word;
        }
    }
    let words: Vec<u32> = shared
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut dev = Device::new();
    let src = upload_u32(&mut dev, &words);
    let af = upload_u32(&mut dev, &afrag);
    let out = output(&mut dev, (128 * n / 2 * 4) as usize);
    launch(
        &kernel(shape, read, a_regs),
        &cfg(1, 128),
        &[src, af, out],
        &mut dev,
    )
    .map_err(|e| e.to_string())?;
    let got = download_u32(&dev, out, (128 * n / 2) as usize);
    for t in 0..128 {
        for reg in 0..n / 2 {
            let (r, c) = d_slot(t, reg);
            let want: i32 = (0..kk)
                .map(|k| a[(r * kk + k) as usize] * b[(k * n + c) as usize])
                .sum();
            let g = f32::from_bits(got[(t * n / 2 + reg) as usize]);
            if g != want as f32 {
                return Err(format!(
                    "{} {z:?} a_regs {a_regs}: D[{r}][{c}] = {g}, want {want}; it differs",
                    shape.name()
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn products_read_every_layout_and_land_in_the_accumulator_layout() {
    // (lbo, sbo) per layout: core matrices 128 bytes apart along k, 8-row groups 256
    // bytes apart; swizzled atoms of 8 rows back to back.
    let layouts = [
        (128, 256, Swizzle::None),
        (16, 256, Swizzle::B32),
        (16, 512, Swizzle::B64),
        (16, 1024, Swizzle::B128),
    ];
    for shape in [
        MmaShape::M64N16K16,
        MmaShape::M64N64K16,
        MmaShape::M64N128K16,
    ] {
        for desc in layouts {
            for a_regs in [false, true] {
                run_case(shape, desc, a_regs).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

#[test]
fn a_wrong_layout_is_seen() {
    // Data placed 128-byte swizzled and read as 64-byte swizzled: the check must fail.
    let placed = (16, 1024, Swizzle::B128);
    let read = (16, 512, Swizzle::B64);
    match run_placed(MmaShape::M64N64K16, placed, read, false) {
        Err(e) => assert!(e.contains("differs"), "{e}"),
        Ok(()) => panic!("a misread layout passed"),
    }
}

#[test]
fn descriptors_encode_and_decode() {
    for z in Swizzle::ALL {
        let d = Descriptor {
            start: 0x3_fff0,
            lbo: 0x1230,
            sbo: 0x2000,
            swizzle: z,
        };
        assert_eq!(Descriptor::decode(d.encode()), Ok(d));
    }
    let e = Descriptor::decode(1 << 49).unwrap_err();
    assert!(e.contains("base offset"), "{e}");
}

#[test]
fn a_partial_warpgroup_is_refused() {
    let mut dev = Device::new();
    let f = kernel(MmaShape::M64N16K16, (128, 256, Swizzle::None), false);
    let src = output(&mut dev, SHARED as usize);
    let out = output(&mut dev, 4096);
    match launch(&f, &cfg(1, 96), &[src, src, out], &mut dev) {
        Err(InterpError::BadInst { what, .. }) => {
            assert!(what.contains("no full warpgroup"), "{what}")
        }
        other => panic!("{other:?}"),
    }
}
