//! Memory semantics: LDG/STG (global, through a 64-bit register pair), LDS/STS (the
//! block's shared window), LDC/ULDC (constant bank 0). Sizes are 8/16 bits (zero- or
//! sign-extended into one register), 32, 64 and 128 bits (consecutive registers).

use super::exec::{lanes, Ctx, Step};
use super::inst::Operand;
use super::EmuError;

/// The access width in bytes from the modifiers, and whether a narrow load sign-extends.
pub(super) fn width(c: &Ctx) -> (usize, bool) {
    let mut w = (4, false);
    for m in &c.inst.mods {
        w = match m.as_str() {
            "U8" => (1, false),
            "S8" => (1, true),
            "U16" => (2, false),
            "S16" => (2, true),
            "64" => (8, false),
            "128" => (16, false),
            _ => continue,
        };
    }
    w
}

/// Little-endian bytes to register words; narrow values extended to one word.
fn words(bytes: &[u8], signed: bool) -> Vec<u32> {
    match bytes.len() {
        1 if signed => vec![bytes[0] as i8 as i32 as u32],
        1 => vec![u32::from(bytes[0])],
        2 => {
            let v = u16::from_le_bytes([bytes[0], bytes[1]]);
            vec![if signed {
                v as i16 as i32 as u32
            } else {
                u32::from(v)
            }]
        }
        _ => bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    }
}

/// Register words to the `len` little-endian bytes a store writes.
fn bytes(words: &[u32], len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    b.truncate(len);
    b
}

/// The address operand `i` names for `lane`.
pub(super) fn address(c: &mut Ctx, lane: usize, i: usize, global: bool) -> Result<u64, EmuError> {
    let Operand::Mem {
        desc,
        reg,
        uniform,
        wide,
        offset,
    } = *c.op(i)?
    else {
        return Err(c.unmodelled(format!("address operand {}", i + 1)));
    };
    if global != (desc.is_some() && wide) {
        return Err(c.unmodelled("this addressing form"));
    }
    if let Some(d) = desc {
        // The memory descriptor (ULDC.64 of c[0x0][0x208]) is read but not modelled: every
        // global access goes to the flat memory.
        c.reg_pair(lane, true, d)?;
    }
    let base = match reg {
        None => 0,
        Some(n) if wide => c.reg_pair(lane, uniform, n)?,
        Some(n) => u64::from(c.reg_value(lane, uniform, n)),
    };
    Ok(base.wrapping_add(offset as u64))
}

/// `LDG[.E][.size][.CONSTANT|.STRONG.GPU] d, desc[UR][R.64+imm]` and
/// `STG[.E][.size] desc[UR][R.64+imm], r`.
pub fn global(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[
        "E", "U8", "S8", "U16", "S16", "64", "128", "CONSTANT", "STRONG", "GPU",
    ])?;
    c.arity(2)?;
    let (len, signed) = width(c);
    let at = c.inst.addr;
    let load = c.inst.op == "LDG";
    for l in lanes(on) {
        if load {
            let a = address(c, l, 1, true)?;
            let mut buf = [0u8; 16];
            c.global.read(at, a, &mut buf[..len])?;
            c.set_many(l, 0, &words(&buf[..len], signed))?;
        } else {
            let a = address(c, l, 0, true)?;
            let data = c.get_many(l, 1, len.div_ceil(4))?;
            c.global.write(at, a, &bytes(&data, len))?;
        }
    }
    Ok(Step::Next)
}

/// `ATOMG.E.ADD.STRONG.GPU PT, d, [R.64], r`: adds `r` to the 32-bit word at the address
/// and returns the old word. Warps run one instruction at a time here, so every
/// read-modify-write is whole.
pub fn atomic(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["E", "ADD", "STRONG", "GPU"] {
        return Err(c.unmodelled(format!("ATOMG.{}", c.inst.mods.join("."))));
    }
    c.arity(4)?;
    if !matches!(c.op(0)?, Operand::Pred { .. }) {
        return Err(c.unmodelled("a first operand other than a predicate"));
    }
    let at = c.inst.addr;
    for l in lanes(on) {
        let a = address(c, l, 2, true)?;
        let mut old = [0u8; 4];
        c.global.read(at, a, &mut old)?;
        let old = u32::from_le_bytes(old);
        let add = c.int(l, 3)?;
        c.global
            .write(at, a, &old.wrapping_add(add).to_le_bytes())?;
        c.set(l, 1, old)?;
    }
    Ok(Step::Next)
}

/// `ATOMS.CAST.SPIN.64 d, [R], cmp, new`: where the 64-bit word at the shared address
/// equals `cmp`, `new` replaces it and `d` is 1, else `d` is 0 (ptxas's loop for a 64-bit
/// shared atomic retries until it reads 1). Lanes act one after another.
pub fn shared_cas(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["CAST", "SPIN", "64"] {
        return Err(c.unmodelled(format!("ATOMS.{}", c.inst.mods.join("."))));
    }
    c.arity(4)?;
    let at = c.inst.addr;
    for l in lanes(on) {
        let a = address(c, l, 1, false)?;
        let (cmp, new) = (c.get_many(l, 2, 2)?, c.get_many(l, 3, 2)?);
        let mut word = [0u8; 8];
        c.shared.read(at, a, &mut word)?;
        let swapped = word[..4] == cmp[0].to_le_bytes() && word[4..] == cmp[1].to_le_bytes();
        if swapped {
            c.shared.write(at, a, &bytes(&new, 8))?;
        }
        c.set_many(l, 0, &[u32::from(swapped), 0])?;
    }
    Ok(Step::Next)
}

/// `LDS[.size] d, [R+imm]` and `STS[.size] [R+imm], r` (also `[UR+imm]`).
pub fn shared(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["U8", "S8", "U16", "S16", "64", "128"])?;
    c.arity(2)?;
    let (len, signed) = width(c);
    let at = c.inst.addr;
    let load = c.inst.op == "LDS";
    for l in lanes(on) {
        if load {
            let a = address(c, l, 1, false)?;
            let mut buf = [0u8; 16];
            c.shared.read(at, a, &mut buf[..len])?;
            c.set_many(l, 0, &words(&buf[..len], signed))?;
        } else {
            let a = address(c, l, 0, false)?;
            let data = c.get_many(l, 1, len.div_ceil(4))?;
            c.shared.write(at, a, &bytes(&data, len))?;
        }
    }
    Ok(Step::Next)
}

/// `LDL[.64] d, [R+imm]` and `STL[.64] [R+imm], r`: the lane's own frame, which lies
/// below [`LOCAL_TOP`](super::warp::LOCAL_TOP); an access outside it, or one not aligned
/// to its width, is an error.
pub fn local(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["64"])?;
    c.arity(2)?;
    let (len, signed) = width(c);
    let load = c.inst.op == "LDL";
    let frame = c.w.frame as u64;
    for l in lanes(on) {
        let a = address(c, l, usize::from(load), false)?;
        super::memory::aligned(c.inst.addr, "local", a, len)?;
        let start = u64::from(super::warp::LOCAL_TOP) - frame;
        let Some(off) = a.checked_sub(start).filter(|o| o + len as u64 <= frame) else {
            return Err(EmuError::Fault {
                at: c.inst.addr,
                space: "local",
                addr: a,
                len,
            });
        };
        let at = l * frame as usize + off as usize;
        if load {
            let data = c.w.local[at..at + len].to_vec();
            c.set_many(l, 0, &words(&data, signed))?;
        } else {
            let data = c.get_many(l, 1, len.div_ceil(4))?;
            c.w.local[at..at + len].copy_from_slice(&bytes(&data, len));
        }
    }
    Ok(Step::Next)
}

/// `LDC[.64] d, c[bank][R+imm]`, `ULDC[.64] ud, c[bank][imm]`.
pub fn constant(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["64"])?;
    c.arity(2)?;
    let wide = c.inst.has("64");
    let Operand::Const { bank, reg, offset } = *c.op(1)? else {
        return Err(c.unmodelled("a source other than c[..][..]"));
    };
    for l in lanes(on) {
        let base = match reg {
            Some(n) => i64::from(c.reg_value(l, false, n)),
            None => 0,
        };
        let v = c.constant(bank, base + offset, if wide { 8 } else { 4 })?;
        if wide {
            c.set_many(l, 0, &[v as u32, (v >> 32) as u32])?;
        } else {
            c.set(l, 0, v as u32)?;
        }
    }
    Ok(Step::Next)
}
