//! GGUF (ggml) weight blocks inside kernels: bytes loaded into registers, and each
//! format's dequantization written as IR so that it gives exactly the f32 values of
//! [`quench_models::dequant`] (the references dequantize with that module).
//!
//! **Exactness.** Integer fields become floats by the magic-number trick:
//! `bitcast(v | 0x4B00_0000) − (2^23 + bias)` = `v − bias` exactly for `v < 2^23`. A field
//! is not shifted down first: it is masked where it lies in the low or high half of its
//! word, `n·2^s` with `s + bits ≤ 16`, converted as `(n − bias)·2^s`, and multiplied by
//! the scale times `2^-s` (exact: a power of two, far from underflow), which gives the
//! same exact product. The products the formats form are exact in f32 where the
//! reference relies on that (an f16 scale has 11 significant bits, so `d·q` for a 4- to
//! 8-bit `q` is exact), which is why `d·q + m` may be one `fma`; where a product rounds
//! (Q6_K's `(d·sc)·q`), the kernel rounds the same exact product once, as the reference.
//!
//! **Cost.** With the magic constant in a register (see [`Magic`]), a field costs one
//! `lop3` (mask and or), one `fadd` and its multiply: the kernels are close to being
//! bound by instructions rather than bandwidth for the 4-bit formats.

use quench_ir::{Builder, CacheOp, Scalar, Type, Value};

/// `bitcast(v | MAGIC)` is the f32 `2^23 + v` for `v < 2^23`.
const MAGIC: u32 = 0x4B00_0000;

/// The magic-number constant, held in a register: computed from `%ctaid.x` (whose top
/// bit is always clear), so that ptxas cannot fold it into an immediate — `lop3` takes
/// one immediate, and with the field's mask as that immediate the `and` and the `or`
/// merge into one instruction. Emit once per kernel, outside loops.
#[derive(Clone, Copy, Debug)]
pub struct Magic(Value);

impl Magic {
    pub fn new(k: &mut Builder) -> Magic {
        let c = k.ctaid_x();
        let zero = k.shr_const(c, 31);
        let m = k.const_u32(MAGIC);
        Magic(k.or(zero, m))
    }

    /// `v − bias` as f32, exactly, for a `u32` value `v < 2^23`, `bias < 2^23`.
    pub fn int(self, k: &mut Builder, v: Value, bias: u32) -> Value {
        self.scaled(k, v, bias, 0)
    }

    /// `(n − bias)·2^s` for a masked field `v = n·2^s < 2^23`.
    pub(crate) fn scaled(self, k: &mut Builder, v: Value, bias: u32, s: u32) -> Value {
        let f = k.or(v, self.0);
        let f = k.bitcast(Type::F32, f);
        let c = k.const_f32(8_388_608.0 + (bias as f32) * (1u32 << s) as f32);
        k.sub(f, c)
    }

    /// The field of `nbits` bits at bit `lo` of byte `i` of `b`, minus `bias`, as
    /// `(value, s)`: the float is `(field − bias)·2^s`.
    pub fn field(
        self,
        k: &mut Builder,
        b: &Bytes,
        i: u32,
        lo: u32,
        nbits: u32,
        bias: u32,
    ) -> (Value, u32) {
        let (v, s) = b.field(k, i, lo, nbits);
        (self.scaled(k, v, bias, s), s)
    }
}

/// `x·2^-s` for each shift `s` a block uses, computed once per shift.
pub(crate) struct Scaled {
    x: Value,
    by_shift: Vec<(u32, Value)>,
}

impl Scaled {
    pub(crate) fn new(x: Value) -> Scaled {
        Scaled {
            x,
            by_shift: vec![(0, x)],
        }
    }

    pub(crate) fn get(&mut self, k: &mut Builder, s: u32) -> Value {
        if let Some(&(_, v)) = self.by_shift.iter().find(|(t, _)| *t == s) {
            return v;
        }
        let c = k.const_f32(1.0 / (1u32 << s) as f32);
        let v = k.mul(self.x, c);
        self.by_shift.push((s, v));
        v
    }
}

/// Bytes of a span held in registers: `parts[i]` (a `u32`) holds bytes
/// `i·width .. (i + 1)·width` of the span, little-endian.
pub struct Bytes {
    parts: Vec<Value>,
    /// For 4-byte parts, each part shifted down by 16 bits (fields of the high half are
    /// masked there).
    halves: Vec<Value>,
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
                let parts = load_words(k, at, n, width);
                return Bytes::words(k, parts);
            }
        }
        if width == 4 {
            return Bytes::words(k, parts);
        }
        Bytes {
            parts,
            halves: vec![],
            width,
        }
    }

    /// Bytes held in 4-byte words, `parts[i]` holding bytes `4i .. 4i + 4` (loaded
    /// elsewhere: a word's fields are only read when they are decoded).
    pub fn words(k: &mut Builder, parts: Vec<Value>) -> Bytes {
        let halves = parts.iter().map(|&p| k.shr_const(p, 16)).collect();
        Bytes {
            parts,
            halves,
            width: 4,
        }
    }

    /// The field of `nbits` bits at bit `lo` of byte `i`, masked in place within the low
    /// or high 16 bits of its part: `(n·2^s, s)` with `s + nbits ≤ 16`.
    pub fn field(&self, k: &mut Builder, i: u32, lo: u32, nbits: u32) -> (Value, u32) {
        let at = (i / self.width) as usize;
        let b = 8 * (i % self.width) + lo;
        let (v, s) = if b + nbits <= 16 {
            (self.parts[at], b)
        } else {
            (self.halves[at], b - 16)
        };
        (k.and_const(v, ((1u32 << nbits) - 1) << s), s)
    }

    /// Register `i` (a `u32` holding bytes `i·width ..`).
    pub fn part(&self, i: usize) -> Value {
        self.parts[i]
    }

    /// `nbits` bits of byte `i` starting at bit `lo` (as a `u32`).
    pub fn bits(&self, k: &mut Builder, i: u32, lo: u32, nbits: u32) -> Value {
        let part = self.parts[(i / self.width) as usize];
        let shift = 8 * (i % self.width) + lo;
        let v = if shift == 0 {
            part
        } else {
            k.shr_const(part, shift)
        };
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
        let v = if shift == 0 {
            part
        } else {
            k.shr_const(part, shift)
        };
        f16_bits_to_f32(k, v)
    }
}

/// `n` bytes at `at` (a `ptr<global, u8>` aligned to `width`) as 4-byte words, loaded
/// `width` bytes (8 or 16) at a time through the read-only path. `n` is a multiple of
/// `width`.
pub fn load_words(k: &mut Builder, at: Value, n: u32, width: u32) -> Vec<Value> {
    let lanes = width / 4;
    let p = k.ptr_cast(Scalar::U32, at);
    let mut words = vec![];
    for i in 0..n / width {
        let c = k.const_u32(i * lanes);
        let pi = k.ptr_add(p, c);
        let v = k.load_with(Type::Vec(Scalar::U32, lanes as u8), pi, CacheOp::Nc);
        for l in 0..lanes {
            words.push(k.extract(v, l));
        }
    }
    words
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

/// The signed byte in the low 8 bits of `v` (higher bits zero), as f32.
fn signed_byte_to_f32(k: &mut Builder, magic: Magic, v: Value) -> Value {
    let sign = k.const_u32(0x80);
    let flipped = k.xor(v, sign);
    magic.int(k, flipped, 128)
}

/// Q8_0 block at byte `at` of `b`: `x = q · d`, 32 values in element order.
pub fn q8_0_block(k: &mut Builder, magic: Magic, b: &Bytes, at: u32) -> Vec<Value> {
    let mut d = Scaled::new(b.f16(k, at));
    (0..32)
        .map(|e| {
            // The byte as unsigned, q + 128, then minus 128: the sign bit flipped in place.
            let (field, s) = b.field(k, at + 2 + e, 0, 8);
            let sign = k.const_u32(0x80 << s);
            let flipped = k.xor(field, sign);
            let q = magic.scaled(k, flipped, 128, s);
            let ds = d.get(k, s);
            k.mul(q, ds)
        })
        .collect()
}

/// Q4_1 block at byte `at`: `x = d · q + m` (`d · q` is exact, so one fma).
pub fn q4_1_block(k: &mut Builder, magic: Magic, b: &Bytes, at: u32) -> Vec<Value> {
    let mut d = Scaled::new(b.f16(k, at));
    let m = b.f16(k, at + 2);
    (0..32)
        .map(|e| {
            let (q, s) = magic.field(k, b, at + 4 + e % 16, 4 * (e / 16), 4, 0);
            let ds = d.get(k, s);
            k.fma(ds, q, m)
        })
        .collect()
}

/// Per-lane constants of a Q4_K piece (a 64-element quarter of a 256-element
/// super-block): piece `g` covers the 32 qs bytes `32g ..`, whose low nibbles are
/// sub-block `2g` (elements `64g + b`) and high nibbles sub-block `2g + 1` (`64g + 32 + b`).
pub struct Q4kLane {
    /// Sub-blocks 4..8 keep their scales split across bytes.
    high_pair: Value,
    /// `8·(low sub-block mod 4)`: the piece's two sub-blocks `2g`, `2g + 1` sit in
    /// adjacent bytes of the scale words, from this bit on.
    shift: Value,
}

impl Q4kLane {
    /// The constants of piece `g` (a `u32` below 4).
    pub fn new(k: &mut Builder, g: Value) -> Q4kLane {
        let two = k.const_u32(2);
        let high_pair = k.ge(g, two);
        // The low sub-block 2g sits at byte 2·(g mod 2) of its scale words.
        let g1 = k.and_const(g, 1);
        let shift = k.shl_const(g1, 4);
        Q4kLane { high_pair, shift }
    }
}

/// The 6-bit scales and mins of Q4_K sub-blocks from the three 32-bit words of the
/// header's 12 scale bytes, each shifted so that the wanted sub-blocks' bytes sit in the
/// bytes that `bytes` marks (0x01: byte 0 alone; 0x0101: bytes 0 and 1). Sub-blocks 0..4
/// take six bits of bytes 0..4 (scale) and 4..8 (min); sub-blocks 4..8 (`high`) the low
/// four bits from the nibbles of bytes 8..12 and the top two from bits 6..8 of 0..8.
pub(crate) fn q4_k_scale_min(
    k: &mut Builder,
    [a, b, c]: [Value; 3],
    bytes: u32,
    high: Value,
) -> (Value, Value) {
    let sc_low = k.and_const(a, 0x3f * bytes);
    let m_low = k.and_const(b, 0x3f * bytes);
    let c_lo = k.and_const(c, 0x0f * bytes);
    let a_top = k.shr_const(a, 2);
    let a_top = k.and_const(a_top, 0x30 * bytes);
    let sc_high = k.or(c_lo, a_top);
    let c_hi = k.shr_const(c, 4);
    let c_hi = k.and_const(c_hi, 0x0f * bytes);
    let b_top = k.shr_const(b, 2);
    let b_top = k.and_const(b_top, 0x30 * bytes);
    let m_high = k.or(c_hi, b_top);
    let sc = k.select(high, sc_high, sc_low);
    let m = k.select(high, m_high, m_low);
    (sc, m)
}

/// A Q4_K piece's super-block scales and its two sub-blocks' 6-bit scales and mins (in
/// bytes 0 and 1 of `sc` and `m`), from the 16 header bytes.
pub struct Q4kScales {
    d: Value,
    dmin: Value,
    sc: Value,
    m: Value,
}

impl Q4kScales {
    pub fn new(k: &mut Builder, lane: &Q4kLane, header: &Bytes) -> Q4kScales {
        let d = header.f16(k, 0);
        let dmin = header.f16(k, 2);
        let [a, b, c] = [1, 2, 3].map(|i| header.parts[i]);
        let a = k.shr(a, lane.shift);
        let b = k.shr(b, lane.shift);
        let c = k.shr(c, lane.shift);
        let (sc, m) = q4_k_scale_min(k, [a, b, c], 0x0101, lane.high_pair);
        Q4kScales { d, dmin, sc, m }
    }

    /// Sub-block `2g + half`'s `(d·sc, dmin·m)` in f32, both exact (an 11-bit by a 6-bit
    /// significand): the factors of its integer dot products.
    pub fn sub_block(&self, k: &mut Builder, magic: Magic, half: u32) -> (Value, Value) {
        let factor = |k: &mut Builder, packed: Value, scale: Value| {
            let v = if half == 0 {
                packed
            } else {
                k.shr_const(packed, 8 * half)
            };
            let v = k.and_const(v, 0x3f);
            let v = magic.int(k, v, 0);
            k.mul(scale, v)
        };
        (factor(k, self.sc, self.d), factor(k, self.m, self.dmin))
    }
}

/// One Q4_K or Q5_K piece (elements `64g .. 64g + 64` of its super-block, `g` the piece
/// of `scales`) from its 32 qs bytes and, for Q5_K, its fifth bits (`high`, from
/// [`Q5kLane::fifth_bits`]): `x = (d·sc)·q − dmin·m` (the product exact: 11 by 6 by 4 or
/// 5 significant bits), in element order: the low nibbles, then the high ones.
pub fn k_quant_piece(
    k: &mut Builder,
    magic: Magic,
    scales: &Q4kScales,
    qs: &Bytes,
    high: Option<&[Value]>,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(64);
    for half in 0..2 {
        let (dl, ml) = scales.sub_block(k, magic, half);
        let mut dl = Scaled::new(dl);
        // Each word's four quants, one a byte: the half's nibbles, and for Q5_K the fifth
        // bit at bit 4.
        let words = (0..8)
            .map(|w| {
                let q = qs.part(w);
                let q = if half == 0 { q } else { k.shr_const(q, 4) };
                match high {
                    Some(h) => {
                        let q = k.and_const(q, 0x0f0f_0f0f);
                        let b = if half == 0 {
                            h[w]
                        } else {
                            k.shr_const(h[w], 1)
                        };
                        let b = k.and_const(b, 0x0101_0101);
                        let b = k.shl_const(b, 4);
                        k.or(q, b)
                    }
                    None => q,
                }
            })
            .collect();
        let quants = Bytes::words(k, words);
        let bits = if high.is_some() { 5 } else { 4 };
        for b in 0..32 {
            let (q, s) = magic.field(k, &quants, b, 0, bits, 0);
            let ds = dl.get(k, s);
            let x = k.mul(ds, q);
            out.push(k.sub(x, ml));
        }
    }
    out
}

/// Per-lane constants of a Q5_K piece: Q4_K's (a Q5_K super-block is a Q4_K one with 32
/// bytes of fifth bits, `qh`, between the 16-byte header and the 128 qs bytes), and where
/// the piece's fifth bits lie: bits `2g` and `2g + 1` of every qh byte (bit `j` of qh byte
/// `l` is element `32j + l`'s).
pub struct Q5kLane {
    pub q4k: Q4kLane,
    /// `2g`: the shift bringing the piece's two bits of each qh byte down to bits 0, 1.
    qh_shift: Value,
    /// Byte offset in the super-block of the piece's 32 qs bytes: `48 + 32g`.
    qs: Value,
}

impl Q5kLane {
    /// The constants of piece `g` (a `u32` below 4).
    pub fn new(k: &mut Builder, g: Value) -> Q5kLane {
        let q4k = Q4kLane::new(k, g);
        let qh_shift = k.shl_const(g, 1);
        let qs = k.shl_const(g, 5);
        let qs = k.add_const(qs, 48);
        Q5kLane { q4k, qh_shift, qs }
    }

    /// The piece's bytes in the super-block at `at` (a `ptr<global, u8>`, 16-aligned):
    /// its 16 header bytes, the 32 qh bytes (as 8 words) and its 32 qs bytes, in 16-byte
    /// loads.
    pub fn load(&self, k: &mut Builder, at: Value) -> (Bytes, Vec<Value>, Bytes) {
        let header = Bytes::load(k, at, 16, 16);
        let c16 = k.const_u32(16);
        let a = k.ptr_add(at, c16);
        let qh = load_words(k, a, 32, 16);
        let a = k.ptr_add(at, self.qs);
        let qs = Bytes::load(k, a, 32, 16);
        (header, qh, qs)
    }

    /// The qh words with the piece's two bits of each byte moved down to bits 0 (the low
    /// sub-block) and 1 (the high one), as [`k_quant_piece`] takes them.
    pub fn fifth_bits(&self, k: &mut Builder, qh: &[Value]) -> Vec<Value> {
        qh.iter().map(|&w| k.shr(w, self.qh_shift)).collect()
    }
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
    /// The super-block elements the piece's two runs of 16 start at: `128hh + 16c` and 64
    /// past it.
    pub runs: [Value; 2],
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
        let hh128 = k.shl_const(hh, 7);
        let first = k.add(hh128, c16);
        let second = k.add_const(first, 64);
        Q6kLane {
            ql,
            qh,
            scale_pair,
            scale_shift,
            crumb_shift: [lo, hi],
            runs: [first, second],
        }
    }

    /// The piece's bytes in the super-block at `at` (a `ptr<global, u8>`, 2-aligned): its
    /// 16 ql and 16 qh bytes, its two scale pairs and the bits of `d`, as
    /// [`q6_k_piece`] takes them.
    pub fn load(&self, k: &mut Builder, at: Value) -> (Bytes, Bytes, [Value; 2], Value) {
        let a = k.ptr_add(at, self.ql);
        let ql = Bytes::load(k, a, 16, 2);
        let a = k.ptr_add(at, self.qh);
        let qh = Bytes::load(k, a, 16, 2);
        let a = k.ptr_add(at, self.scale_pair);
        let low = load_u16(k, a);
        let four = k.const_u32(4);
        let a = k.ptr_add(a, four);
        let high = load_u16(k, a);
        let c208 = k.const_u32(208);
        let a = k.ptr_add(at, c208);
        let d = load_u16(k, a);
        (ql, qh, [low, high], d)
    }
}

/// One Q6_K piece: `ql`, `qh` the piece's 16 + 16 bytes, `scales` the two scale pairs
/// (low-half pair in part 0, high-half pair in part 1), `d` the super-block scale bits.
/// `x = (d · sc) · (q − 32)`, rounded in that order; low elements then high, in byte order.
pub fn q6_k_piece(
    k: &mut Builder,
    magic: Magic,
    lane: &Q6kLane,
    ql: &Bytes,
    qh: &Bytes,
    scales: [Value; 2],
    d: Value,
) -> Vec<Value> {
    let d = f16_bits_to_f32(k, d);
    let mut out = Vec::with_capacity(32);
    for (half, (&scale, &crumb_shift)) in scales.iter().zip(&lane.crumb_shift).enumerate() {
        let s = k.shr(scale, lane.scale_shift);
        let s = k.and_const(s, 0xff);
        let s = signed_byte_to_f32(k, magic, s);
        let dl = k.mul(d, s);
        for t in 0..16 {
            let low = ql.bits(k, t, 4 * half as u32, 4);
            let h = qh.byte(k, t);
            let h = k.shr(h, crumb_shift);
            let h = k.and_const(h, 3);
            let h = k.shl_const(h, 4);
            let q = k.or(low, h);
            let q = magic.int(k, q, 32);
            out.push(k.mul(dl, q));
        }
    }
    out
}

/// What Q3_K and Q2_K pieces share: piece `j` (`h = j / 4`, `c = j % 4`) covers the
/// elements `128h + 32g + 8c + t` of each 32-element run `g` of half `h`, whose crumbs
/// `g` are in the 8 qs bytes `32h + 8c ..` past the format's qs array start.
struct LowKPiece {
    h: Value,
    /// `8c`: the piece's first byte within a 32-byte run of bytes.
    c8: Value,
    /// `32h + 8c`: the piece's qs bytes within the qs array.
    qs: Value,
    /// `8·(c/2)`: the bit of the piece's byte within a pair of scale bytes.
    pair_shift: Value,
    /// `128h + 8c + 32g` for each run `g` ([`q3_k_piece_elements`]).
    runs: [Value; 4],
}

impl LowKPiece {
    fn new(k: &mut Builder, j: Value) -> LowKPiece {
        let h = k.shr_const(j, 2);
        let c = k.and_const(j, 3);
        let h32 = k.shl_const(h, 5);
        let c8 = k.shl_const(c, 3);
        let qs = k.add(h32, c8);
        let chalf = k.shr_const(c, 1);
        let pair_shift = k.shl_const(chalf, 3);
        let h128 = k.shl_const(h, 7);
        let first = k.add(h128, c8);
        let runs = std::array::from_fn(|g| k.add_const(first, 32 * g as u32));
        LowKPiece {
            h,
            c8,
            qs,
            pair_shift,
            runs,
        }
    }
}

/// Per-lane constants of a Q3_K piece: piece `j` (`h = j / 4`, `c = j % 4`) covers, for
/// each 32-element run `g` of half `h`, the 8 elements `128h + 32g + 8c + t`: crumb `g` of
/// qs bytes `32 + 32h + 8c + t`, bit `4h + g` of hmask bytes `8c + t`, and the scale of
/// group `8h + 2g + c/2` (its low nibble: nibble `h` of scale byte `2g + c/2`; its top two
/// bits: bits `4h + 2·(g/2)` of byte `8 + 2·(g mod 2) + c/2`).
pub struct Q3kLane {
    /// Byte offsets in the block of the piece's 8 qs bytes and 8 hmask bytes.
    qs: Value,
    hmask: Value,
    /// `8·(c/2) + 4h`: brings the piece's scale nibble (and, plus `2·(g/2)`, its top bits)
    /// down to bit 0 of the scale byte pairs.
    scale_shift: Value,
    /// `4h + g`: the shift bringing run `g`'s hmask bit of each byte down to bit 0.
    hmask_shift: [Value; 4],
    /// The super-block elements the piece's four runs of 8 start at
    /// ([`q3_k_piece_elements`]).
    pub runs: [Value; 4],
}

impl Q3kLane {
    pub fn new(k: &mut Builder, j: Value) -> Q3kLane {
        let p = LowKPiece::new(k, j);
        let qs = k.add_const(p.qs, 32);
        let h4 = k.shl_const(p.h, 2);
        let scale_shift = k.add(p.pair_shift, h4);
        let hmask_shift = std::array::from_fn(|g| k.add_const(h4, g as u32));
        Q3kLane {
            qs,
            hmask: p.c8,
            scale_shift,
            hmask_shift,
            runs: p.runs,
        }
    }

    /// The piece's bytes in the super-block at `at` (a `ptr<global, u8>`, 2-aligned), as
    /// [`q3_k_piece`] takes them: its 8 qs and 8 hmask bytes, the 12 scale bytes and `d`.
    pub fn load(&self, k: &mut Builder, at: Value) -> Q3kRaw {
        let a = k.ptr_add(at, self.qs);
        let qs = Bytes::load(k, a, 8, 2);
        let a = k.ptr_add(at, self.hmask);
        let hmask = Bytes::load(k, a, 8, 2);
        let c96 = k.const_u32(96);
        let a = k.ptr_add(at, c96);
        let scales = Bytes::load(k, a, 12, 2);
        let c108 = k.const_u32(108);
        let a = k.ptr_add(at, c108);
        let d = load_u16(k, a);
        Q3kRaw {
            qs,
            hmask,
            scales,
            d,
        }
    }
}

/// A Q3_K piece's loaded bytes.
pub struct Q3kRaw {
    pub qs: Bytes,
    pub hmask: Bytes,
    /// The 12 scale bytes, as 2-byte parts.
    pub scales: Bytes,
    /// The bits of `d`.
    pub d: Value,
}

/// One Q3_K piece: `x = (d·(sc − 32))·(q − 4)` with `q` the crumb plus 4 where the hmask
/// bit is set (every product exact: 11 by 6 by 3 significant bits), in the order of
/// [`q3_k_piece_elements`].
pub fn q3_k_piece(k: &mut Builder, magic: Magic, lane: &Q3kLane, raw: &Q3kRaw) -> Vec<Value> {
    let d = f16_bits_to_f32(k, raw.d);
    // The piece's 8 qs and hmask bytes as two words each.
    let word = |k: &mut Builder, b: &Bytes, i: usize| {
        let hi = k.shl_const(b.part(2 * i + 1), 16);
        k.or(b.part(2 * i), hi)
    };
    let qs: Vec<Value> = (0..2).map(|i| word(k, &raw.qs, i)).collect();
    let hm: Vec<Value> = (0..2).map(|i| word(k, &raw.hmask, i)).collect();
    let mut out = Vec::with_capacity(32);
    for g in 0..4u32 {
        // Scale byte pair g holds the low nibbles of groups 2g, 2g + 1 of each half;
        // pair 4 + g mod 2 their top bits.
        let low = k.shr(raw.scales.part(g as usize), lane.scale_shift);
        let low = k.and_const(low, 0x0f);
        let high = k.shr(raw.scales.part(4 + (g % 2) as usize), lane.scale_shift);
        let high = k.shr_const(high, 2 * (g / 2));
        let high = k.and_const(high, 3);
        let high = k.shl_const(high, 4);
        let sc = k.or(low, high);
        let sc = magic.int(k, sc, 32);
        let dl = k.mul(d, sc);
        let mut dl = Scaled::new(dl);
        let words: Vec<Value> = (0..2)
            .map(|i| {
                let q = k.shr_const(qs[i], 2 * g);
                let q = k.and_const(q, 0x0303_0303);
                let b = k.shr(hm[i], lane.hmask_shift[g as usize]);
                let b = k.and_const(b, 0x0101_0101);
                let b = k.shl_const(b, 2);
                k.or(q, b)
            })
            .collect();
        let quants = Bytes::words(k, words);
        for t in 0..8 {
            let (q, s) = magic.field(k, &quants, t, 0, 3, 4);
            let ds = dl.get(k, s);
            out.push(k.mul(ds, q));
        }
    }
    out
}

/// Element offsets (within the super-block) of Q3_K piece `j`, in the order of
/// [`q3_k_piece`].
pub fn q3_k_piece_elements(j: u32) -> Vec<u32> {
    let (h, c) = (j / 4, j % 4);
    (0..4)
        .flat_map(|g| (0..8).map(move |t| 128 * h + 32 * g + 8 * c + t))
        .collect()
}

/// Per-lane constants of a Q2_K piece: piece `j` (`h = j / 4`, `c = j % 4`) covers, for
/// each 32-element run `g` of half `h`, the 8 elements `128h + 32g + 8c + t`: crumb `g`
/// of qs bytes `16 + 32h + 8c + t`, and the scale/min byte `8h + 2g + c/2` (scale in its
/// low nibble, min in its high one).
pub struct Q2kLane {
    /// Byte offsets in the block of the piece's 8 qs bytes and of its half's 8 scale
    /// bytes.
    qs: Value,
    scales: Value,
    /// `8·(c/2)`: brings the piece's scale/min byte down to bits 0..8 of its pair.
    scale_shift: Value,
    /// The super-block elements the piece's four runs of 8 start at (as Q3_K's,
    /// [`q3_k_piece_elements`]).
    pub runs: [Value; 4],
}

impl Q2kLane {
    pub fn new(k: &mut Builder, j: Value) -> Q2kLane {
        let p = LowKPiece::new(k, j);
        Q2kLane {
            qs: k.add_const(p.qs, 16),
            scales: k.shl_const(p.h, 3),
            scale_shift: p.pair_shift,
            runs: p.runs,
        }
    }

    /// The piece's bytes in the super-block at `at` (a `ptr<global, u8>`, 4-aligned): its
    /// 8 qs bytes and `d` with `dmin` in 4-byte loads, its half's 8 scale bytes in 2-byte
    /// ones (a pair a register).
    pub fn load(&self, k: &mut Builder, at: Value) -> Q2kRaw {
        let a = k.ptr_add(at, self.qs);
        let qs = Bytes::load(k, a, 8, 4);
        let a = k.ptr_add(at, self.scales);
        let scales = Bytes::load(k, a, 8, 2);
        let c80 = k.const_u32(80);
        let a = k.ptr_add(at, c80);
        let p = k.ptr_cast(Scalar::U32, a);
        let d = k.load_with(Type::U32, p, CacheOp::Nc);
        Q2kRaw { qs, scales, d }
    }
}

/// A Q2_K piece's loaded bytes.
pub struct Q2kRaw {
    pub qs: Bytes,
    /// The 8 scale/min bytes of the piece's half, a pair a part.
    pub scales: Bytes,
    /// `d` in the low 16 bits, `dmin` in the high ones.
    pub d: Value,
}

/// One Q2_K piece: `x = (d·sc)·q − dmin·m` (the product exact: 11 by 4 by 2 significant
/// bits, so one `fma`), in the order of [`q3_k_piece_elements`].
pub fn q2_k_piece(k: &mut Builder, magic: Magic, lane: &Q2kLane, raw: &Q2kRaw) -> Vec<Value> {
    let d = f16_bits_to_f32(k, raw.d);
    let dmin = k.shr_const(raw.d, 16);
    let dmin = f16_bits_to_f32(k, dmin);
    let neg_dmin = k.neg(dmin);
    let mut out = Vec::with_capacity(32);
    for g in 0..4u32 {
        // Scale byte 2g + c/2 of the half: byte c/2 of the half's pair g.
        let b = k.shr(raw.scales.part(g as usize), lane.scale_shift);
        let sc = k.and_const(b, 0x0f);
        let m = k.shr_const(b, 4);
        let m = k.and_const(m, 0x0f);
        let sc = magic.int(k, sc, 0);
        let m = magic.int(k, m, 0);
        let dl = k.mul(d, sc);
        let mut dl = Scaled::new(dl);
        // −(dmin·m), exactly the negated product.
        let nml = k.mul(neg_dmin, m);
        let words: Vec<Value> = (0..2)
            .map(|i| {
                let q = k.shr_const(raw.qs.part(i), 2 * g);
                k.and_const(q, 0x0303_0303)
            })
            .collect();
        let quants = Bytes::words(k, words);
        for t in 0..8 {
            let (q, s) = magic.field(k, &quants, t, 0, 2, 0);
            let ds = dl.get(k, s);
            out.push(k.fma(ds, q, nml));
        }
    }
    out
}
