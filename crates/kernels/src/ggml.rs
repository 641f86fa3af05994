//! GGUF (ggml) weight blocks inside kernels: bytes loaded into registers, and each
//! format's dequantization written as IR so that it gives exactly the f32 values of
//! [`quench_models::dequant`] (the references dequantize with that module).
//!
//! **Exactness.** Every integer field is turned into a float with the magic-number trick,
//! `bitcast(v | 0x4B00_0000) − (2^23 + bias)` = `v − bias` exactly for `v < 2^23` (one
//! integer op and one exact float subtraction instead of a slow integer conversion). The
//! products the formats form are exact in f32 where the reference relies on that (an f16
//! scale has 11 significant bits, so `d · q` for a 4- to 8-bit `q` is exact), which is why
//! `d · q + m` may be one `fma`; where a product rounds (Q6_K's `(d · sc) · q`), the
//! kernel rounds it in the reference's order.

use quench_ir::{Builder, CacheOp, Scalar, Type, Value};

/// `bitcast(v | MAGIC)` is the f32 `2^23 + v` for `v < 2^23`.
const MAGIC: u32 = 0x4B00_0000;

/// Bytes of a span held in registers: `parts[i]` (a `u32`) holds bytes
/// `i·width .. (i + 1)·width` of the span, little-endian.
pub struct Bytes {
    parts: Vec<Value>,
    width: u32,
}

impl Bytes {
    /// Load `n` bytes at `at` (a `ptr<global, u8>` aligned to `width`) with loads of
    /// `width` bytes (2, 4, 8 or 16) through the read-only path. `n` is a multiple of
    /// `width`.
    pub fn load(k: &mut Builder, at: Value, n: u32, width: u32) -> Bytes {
        let mut parts = vec![];
        match width {
            2 => {
                let p = k.ptr_cast(Scalar::U16, at);
                for i in 0..n / 2 {
                    let c = k.const_u32(i);
                    let pi = k.ptr_add(p, c);
                    let h = k.load_with(Type::Scalar(Scalar::U16), pi, CacheOp::Nc);
                    parts.push(k.cvt(Scalar::U32, h));
                }
            }
            4 => {
                let p = k.ptr_cast(Scalar::U32, at);
                for i in 0..n / 4 {
                    let c = k.const_u32(i);
                    let pi = k.ptr_add(p, c);
                    parts.push(k.load_with(Type::U32, pi, CacheOp::Nc));
                }
            }
            _ => {
                let lanes = width / 4;
                let p = k.ptr_cast(Scalar::U32, at);
                for i in 0..n / width {
                    let c = k.const_u32(i * lanes);
                    let pi = k.ptr_add(p, c);
                    let v = k.load_with(Type::Vec(Scalar::U32, lanes as u8), pi, CacheOp::Nc);
                    for l in 0..lanes {
                        parts.push(k.extract(v, l));
                    }
                }
                return Bytes { parts, width: 4 };
            }
        }
        Bytes { parts, width }
    }

    /// Register `i` (a `u32` holding bytes `i·width ..`).
    pub fn part(&self, i: usize) -> Value {
        self.parts[i]
    }

    /// `nbits` bits of byte `i` starting at bit `lo` (as a `u32`).
    pub fn bits(&self, k: &mut Builder, i: u32, lo: u32, nbits: u32) -> Value {
        let part = self.parts[(i / self.width) as usize];
        let shift = 8 * (i % self.width) + lo;
        let v = if shift == 0 { part } else { k.shr_const(part, shift) };
        if shift + nbits >= 8 * self.width {
            v
        } else {
            k.and_const(v, (1 << nbits) - 1)
        }
    }

    pub fn byte(&self, k: &mut Builder, i: u32) -> Value {
        self.bits(k, i, 0, 8)
    }

    /// The f16 stored at bytes `i, i + 1` (`i` even), widened to f32 (exact).
    pub fn f16(&self, k: &mut Builder, i: u32) -> Value {
        let part = self.parts[(i / self.width) as usize];
        let shift = 8 * (i % self.width);
        let v = if shift == 0 { part } else { k.shr_const(part, shift) };
        f16_bits_to_f32(k, v)
    }
}

/// The u16 at `at` (a `ptr<global, u8>`, 2-aligned), zero-extended to a `u32`.
pub fn load_u16(k: &mut Builder, at: Value) -> Value {
    let p = k.ptr_cast(Scalar::U16, at);
    let h = k.load_with(Type::Scalar(Scalar::U16), p, CacheOp::Nc);
    k.cvt(Scalar::U32, h)
}

/// The f16 in the low 16 bits of `v` (a `u32`), widened to f32.
pub fn f16_bits_to_f32(k: &mut Builder, v: Value) -> Value {
    let h = k.cvt(Scalar::U16, v);
    let h = k.bitcast(Type::Scalar(Scalar::F16), h);
    k.cvt(Scalar::F32, h)
}

/// `v − bias` as f32, exactly, for a `u32` value `v < 2^23`, `bias < 2^23`.
pub fn small_int_to_f32(k: &mut Builder, v: Value, bias: u32) -> Value {
    let m = k.const_u32(MAGIC);
    let f = k.or(v, m);
    let f = k.bitcast(Type::F32, f);
    let c = k.const_f32(8_388_608.0 + bias as f32);
    k.sub(f, c)
}

/// The signed byte in the low 8 bits of `v` (higher bits zero), as f32.
fn signed_byte_to_f32(k: &mut Builder, v: Value) -> Value {
    let sign = k.const_u32(0x80);
    let flipped = k.xor(v, sign);
    small_int_to_f32(k, flipped, 128)
}

/// Q8_0 block at byte `at` of `b`: `x = q · d`, 32 values in element order.
pub fn q8_0_block(k: &mut Builder, b: &Bytes, at: u32) -> Vec<Value> {
    let d = b.f16(k, at);
    (0..32)
        .map(|e| {
            let q = b.byte(k, at + 2 + e);
            let q = signed_byte_to_f32(k, q);
            k.mul(q, d)
        })
        .collect()
}

/// The 4-bit quant of element `e` of a 32-element block whose nibbles start at byte
/// `qs`: byte `e % 16`, low nibble for `e < 16`.
fn legacy_nibble(k: &mut Builder, b: &Bytes, qs: u32, e: u32) -> Value {
    b.bits(k, qs + e % 16, 4 * (e / 16), 4)
}

/// Q4_0 block at byte `at`: `x = d · (q − 8)`.
pub fn q4_0_block(k: &mut Builder, b: &Bytes, at: u32) -> Vec<Value> {
    let d = b.f16(k, at);
    (0..32)
        .map(|e| {
            let q = legacy_nibble(k, b, at + 2, e);
            let q = small_int_to_f32(k, q, 8);
            k.mul(d, q)
        })
        .collect()
}

/// Q4_1 block at byte `at`: `x = d · q + m` (`d · q` is exact, so one fma).
pub fn q4_1_block(k: &mut Builder, b: &Bytes, at: u32) -> Vec<Value> {
    let d = b.f16(k, at);
    let m = b.f16(k, at + 2);
    (0..32)
        .map(|e| {
            let q = legacy_nibble(k, b, at + 4, e);
            let q = small_int_to_f32(k, q, 0);
            k.fma(d, q, m)
        })
        .collect()
}

/// Per-lane constants of a Q4_K piece (a 32-element eighth of a 256-element super-block):
/// piece `j` covers the nibbles of qs bytes `16j .. 16j + 16`, i.e. elements
/// `64g + 16h + t` (low nibbles, sub-block `2g`) and `64g + 32 + 16h + t` (high nibbles,
/// sub-block `2g + 1`) for `t < 16`, with `g = j / 2`, `h = j % 2`.
pub struct Q4kLane {
    /// Sub-blocks 4..8 keep their scales split across bytes.
    high_pair: Value,
    /// `8·(sub-block mod 4)` for the low and high sub-blocks.
    shift: [Value; 2],
}

impl Q4kLane {
    pub fn new(k: &mut Builder, j: Value) -> Q4kLane {
        let g = k.shr_const(j, 1);
        let two = k.const_u32(2);
        let high_pair = k.ge(g, two);
        // The low sub-block 2g sits at byte 2·(g mod 2) of its scale words.
        let g1 = k.and_const(g, 1);
        let lo = k.shl_const(g1, 4);
        let hi = k.add_const(lo, 8);
        Q4kLane { high_pair, shift: [lo, hi] }
    }
}

/// One Q4_K piece from the 16 header bytes (`d`, `dmin`, 12 scale bytes) and the 16 qs
/// bytes of the piece: 32 values, low nibbles then high nibbles, each in byte order.
pub fn q4_k_piece(k: &mut Builder, lane: &Q4kLane, header: &Bytes, qs: &Bytes) -> Vec<Value> {
    let d = header.f16(k, 0);
    let dmin = header.f16(k, 2);
    let [a, bw, c] = [1, 2, 3].map(|i| header.parts[i]);
    let mut out = Vec::with_capacity(32);
    for (half, shift) in lane.shift.iter().enumerate() {
        let a = k.shr(a, *shift);
        let b = k.shr(bw, *shift);
        let c = k.shr(c, *shift);
        // Sub-blocks 0..4: six bits of bytes 0..4 (scale) and 4..8 (min). Sub-blocks 4..8:
        // low four bits from the nibbles of bytes 8..12, top two from bits 6..8 of 0..8.
        let sc_low = k.and_const(a, 63);
        let m_low = k.and_const(b, 63);
        let c_lo = k.and_const(c, 15);
        let a_top = k.shr_const(a, 2);
        let a_top = k.and_const(a_top, 48);
        let sc_high = k.or(c_lo, a_top);
        let c_hi = k.shr_const(c, 4);
        let c_hi = k.and_const(c_hi, 15);
        let b_top = k.shr_const(b, 2);
        let b_top = k.and_const(b_top, 48);
        let m_high = k.or(c_hi, b_top);
        let sc = k.select(lane.high_pair, sc_high, sc_low);
        let m = k.select(lane.high_pair, m_high, m_low);
        let sc = small_int_to_f32(k, sc, 0);
        let m = small_int_to_f32(k, m, 0);
        let dl = k.mul(d, sc);
        let ml = k.mul(dmin, m);
        let nml = k.neg(ml);
        for t in 0..16 {
            let q = qs.bits(k, t, 4 * half as u32, 4);
            let q = small_int_to_f32(k, q, 0);
            out.push(k.fma(dl, q, nml));
        }
    }
    out
}

/// Element offsets (within the super-block) of Q4_K piece `j`, in the order of
/// [`q4_k_piece`].
pub fn q4_k_piece_elements(j: u32) -> Vec<u32> {
    let (g, h) = (j / 2, j % 2);
    (0..16).map(|t| 64 * g + 16 * h + t).chain((0..16).map(|t| 64 * g + 32 + 16 * h + t)).collect()
}

/// Per-lane constants of a Q6_K piece: piece `j` (`hh = j / 4`, `c = j % 4`) covers
/// elements `128hh + 16c + t` (low nibbles of ql bytes `64hh + 16c + t`, 2-bit field
/// `c / 2` of qh bytes `32hh + 16(c mod 2) + t`, scale `8hh + c`) and `128hh + 64 + 16c + t`
/// (high nibbles, field `2 + c / 2`, scale `8hh + 4 + c`).
pub struct Q6kLane {
    /// Byte offsets in the block of the piece's 16 ql bytes and 16 qh bytes.
    pub ql: Value,
    pub qh: Value,
    /// Byte offset of the (even-aligned) pair holding the low-half scale; the high-half
    /// scale is 4 bytes further.
    pub scale_pair: Value,
    /// Shift selecting the scale byte in its pair.
    scale_shift: Value,
    /// Shifts of the 2-bit fields for the low and high elements.
    crumb_shift: [Value; 2],
}

impl Q6kLane {
    pub fn new(k: &mut Builder, j: Value) -> Q6kLane {
        let hh = k.shr_const(j, 2);
        let c = k.and_const(j, 3);
        let hh64 = k.shl_const(hh, 6);
        let c16 = k.shl_const(c, 4);
        let ql = k.add(hh64, c16);
        let hh32 = k.shl_const(hh, 5);
        let codd = k.and_const(c, 1);
        let codd16 = k.shl_const(codd, 4);
        let qh = k.add(hh32, codd16);
        let qh = k.add_const(qh, 128);
        let hh8 = k.shl_const(hh, 3);
        let ceven = k.and_const(c, 2);
        let sp = k.add(hh8, ceven);
        let scale_pair = k.add_const(sp, 192);
        let scale_shift = k.shl_const(codd, 3);
        let chalf = k.shr_const(c, 1);
        let lo = k.shl_const(chalf, 1);
        let hi = k.add_const(lo, 4);
        Q6kLane { ql, qh, scale_pair, scale_shift, crumb_shift: [lo, hi] }
    }
}

/// One Q6_K piece: `ql`, `qh` the piece's 16 + 16 bytes, `scales` the two scale pairs
/// (low-half pair in part 0, high-half pair in part 1), `d` the super-block scale bits.
/// `x = (d · sc) · (q − 32)`, rounded in that order; low elements then high, in byte order.
pub fn q6_k_piece(k: &mut Builder, lane: &Q6kLane, ql: &Bytes, qh: &Bytes, scales: [Value; 2], d: Value) -> Vec<Value> {
    let d = f16_bits_to_f32(k, d);
    let mut out = Vec::with_capacity(32);
    for half in 0..2 {
        let s = k.shr(scales[half], lane.scale_shift);
        let s = k.and_const(s, 0xff);
        let s = signed_byte_to_f32(k, s);
        let dl = k.mul(d, s);
        for t in 0..16 {
            let low = ql.bits(k, t, 4 * half as u32, 4);
            let h = qh.byte(k, t);
            let h = k.shr(h, lane.crumb_shift[half]);
            let h = k.and_const(h, 3);
            let h = k.shl_const(h, 4);
            let q = k.or(low, h);
            let q = small_int_to_f32(k, q, 32);
            out.push(k.mul(dl, q));
        }
    }
    out
}

/// Element offsets (within the super-block) of Q6_K piece `j`, in the order of
/// [`q6_k_piece`].
pub fn q6_k_piece_elements(j: u32) -> Vec<u32> {
    let (hh, c) = (j / 4, j % 4);
    (0..16).map(|t| 128 * hh + 16 * c + t).chain((0..16).map(|t| 128 * hh + 64 + 16 * c + t)).collect()
}
