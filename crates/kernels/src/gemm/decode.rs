//! Dequantizing a staged k-step of weight rows into the block's B tile, of the operand
//! type (bf16 or f16).
//!
//! The work is cut into **items**: `(row, part)`, a part being all 32 elements of the
//! row's step or one 16-element half, so that every thread takes the same number of
//! items. Item `i` of the block is row `i mod bn`, part `i / bn`, and thread `t` takes
//! items `t, t + threads, ...`: a warp's lanes take consecutive rows, whose staged words
//! sit an odd number of words apart, so their shared-memory loads hit distinct banks.
//!
//! **Exactness.** Each weight is computed in f32 exactly as [`quench_models::dequant`]
//! computes it, then rounded to the operand type (to nearest even): the tile holds
//! `bf16(dequant(w))` or `f16(dequant(w))`. Integer fields become floats by the magic-number trick: a field
//! masked in place within the low 16 bits of a word, `v = n·2^s`, gives
//! `bitcast(v | 0x4B00_0000) − (2^23 + bias·2^s) = (n − bias)·2^s` exactly, and the scale
//! it is multiplied by is taken times `2^-s` (exact: a power of two, far from
//! underflow), so that the product is the reference's product. Where the reference's
//! product is exact (`d·q`, `(d·sc)·q` for Q4_K and Q5_K) the kernel may fuse the
//! following addition into an `fma`; where it rounds (Q6_K's `(d·sc)·q`) the kernel
//! rounds the same exact product once.

use quench_ir::{Builder, Scalar, Type, Value};

use super::format::BFormat;
use super::raw::segment_bytes;
use super::tiles::{swizzled, Ids};
use super::{GemmParams, Operands, BK};
use crate::ggml::{f16_bits_to_f32, q4_k_scale_min, Magic, Scaled};

/// Four bytes in a register, each seen where the magic trick can convert it: bytes 0
/// and 1 in the word itself, bytes 2 and 3 in the word shifted down by 16.
struct Word {
    lo: Value,
    hi: Value,
}

impl Word {
    fn new(k: &mut Builder, w: Value) -> Word {
        Word {
            lo: w,
            hi: k.shr_const(w, 16),
        }
    }

    /// The `nbits`-bit field at bit `bit` of byte `byte`, converted as `(n − bias)·2^s`;
    /// returns the value and `s`.
    fn field(
        &self,
        k: &mut Builder,
        m: Magic,
        byte: u32,
        bit: u32,
        nbits: u32,
        bias: u32,
    ) -> (Value, u32) {
        let s = 8 * (byte % 2) + bit;
        let src = if byte < 2 { self.lo } else { self.hi };
        let v = k.and_const(src, ((1 << nbits) - 1) << s);
        (m.scaled(k, v, bias, s), s)
    }
}

/// One item's place: its row of the staged words and of the tile, and its part.
struct Item {
    /// Word offset of the row within a stage of the staged words.
    staged: Value,
    /// Which half of the row (`None`: the whole row).
    part: Option<Value>,
    /// Element offsets, within a tile buffer, of the item's 16-byte chunks.
    chunks: Vec<Value>,
}

/// One thread's share of dequantizing a k-step into the B tile.
pub struct Decoder {
    format: BFormat,
    operands: Operands,
    items: Vec<Item>,
    magic: Magic,
    /// Elements per item: 32 or 16.
    elems: u32,
}

impl Decoder {
    pub fn emit(k: &mut Builder, p: &GemmParams, ids: &Ids) -> Decoder {
        let threads = p.threads();
        let parts = (threads / p.bn).max(1);
        let elems = BK / parts;
        let per_thread = p.bn * parts / threads;
        let items = (0..per_thread)
            .map(|j| {
                let it = k.add_const(ids.tid, j * threads);
                let row = k.and_const(it, p.bn - 1);
                let part = (parts > 1).then(|| k.shr_const(it, p.bn.trailing_zeros()));
                let staged = k.mul_const(row, p.format.staged_stride());
                let first_chunk = match part {
                    Some(q) => k.mul_const(q, elems / 8),
                    None => k.const_u32(0),
                };
                let chunks = (0..elems / 8)
                    .map(|c| {
                        let c = k.add_const(first_chunk, c);
                        swizzled(k, row, c)
                    })
                    .collect();
                Item {
                    staged,
                    part,
                    chunks,
                }
            })
            .collect();
        Decoder {
            format: p.format,
            operands: p.operands,
            items,
            magic: Magic::new(k),
            elems,
        }
    }

    /// Dequantize k-step `tile` (a `u32`) from the staged words at word offset `stage` of
    /// `raw_s` into the tile buffer at element offset `buf` of `b_s`.
    pub fn decode(
        &self,
        k: &mut Builder,
        raw_s: Value,
        stage: Value,
        b_s: Value,
        buf: Value,
        tile: Value,
    ) {
        let bytes = segment_bytes(k, self.format, tile);
        // Where each segment's data starts in its first word: 0 or 2.
        let offsets: Vec<Value> = bytes.iter().map(|&b| k.and_const(b, 3)).collect();
        for item in &self.items {
            let row = k.add(stage, item.staged);
            let words = Words { raw_s, row };
            let values = match self.format {
                BFormat::Q8_0 => self.q8_0(k, &words, item, offsets[0]),
                BFormat::Q4_0 | BFormat::Q4_1 => self.q4_legacy(k, &words, item, offsets[0]),
                BFormat::Q4K => self.k_quant(k, &words, item, tile, false),
                BFormat::Q5K => self.k_quant(k, &words, item, tile, true),
                BFormat::Q6K => self.q6_k(k, &words, item, tile, &offsets),
                BFormat::Q3K => self.q3_k(k, &words, item, tile, &offsets),
                BFormat::Q2K => self.q2_k(k, &words, item, tile),
                BFormat::Bf16 | BFormat::F16 => vec![],
            };
            for (chunk, v) in item.chunks.iter().zip(values.chunks_exact(8)) {
                let packed: Vec<Value> = v
                    .chunks_exact(2)
                    .map(|p| self.operands.emit_pack(k, p[0], p[1]))
                    .collect();
                let vec = k.pack(Type::Vec(Scalar::U32, 4), &packed);
                let at = k.add(buf, *chunk);
                let at = k.ptr_add(b_s, at);
                let at = k.ptr_cast(Scalar::U32, at);
                k.store(at, vec);
            }
        }
    }

    /// The index of the item's first element within the step (`part · elems`).
    fn first_elem(&self, k: &mut Builder, item: &Item) -> Value {
        match item.part {
            Some(q) => k.mul_const(q, self.elems),
            None => k.const_u32(0),
        }
    }

    /// Q8_0: `x = q·d` with a signed byte `q`; the block (`d`, 32 bytes) starts at byte
    /// `o` of the staged words.
    fn q8_0(&self, k: &mut Builder, w: &Words, item: &Item, o: Value) -> Vec<Value> {
        let w0 = w.at(k, 0);
        let o8 = k.shl_const(o, 3);
        let d = k.shr(w0, o8);
        let mut d = Scaled::new(f16_bits_to_f32(k, d));
        let first = self.first_elem(k, item);
        let start = k.add(o, first);
        let start = k.add_const(start, 2);
        let quants = w.bytes_from(k, start, self.elems / 4);
        let flip = k.const_u32(0x8080_8080);
        let mut out = vec![];
        for q in quants {
            // The byte as unsigned, q + 128, then minus 128: sign bits flipped in place.
            let q = k.xor(q, flip);
            let q = Word::new(k, q);
            for byte in 0..4 {
                let (v, s) = q.field(k, self.magic, byte, 0, 8, 128);
                let ds = d.get(k, s);
                out.push(k.mul(v, ds));
            }
        }
        out
    }

    /// Q4_0 (`x = d·(q − 8)`, block at byte `o`) and Q4_1 (`x = d·q + m`, block at byte
    /// 0): element `e` is nibble `e / 16` of nibble byte `e mod 16`.
    fn q4_legacy(&self, k: &mut Builder, w: &Words, item: &Item, o: Value) -> Vec<Value> {
        let q4_1 = self.format == BFormat::Q4_1;
        let w0 = w.at(k, 0);
        let (d, m, start) = if q4_1 {
            let dm = Word::new(k, w0);
            (
                f16_bits_to_f32(k, w0),
                Some(f16_bits_to_f32(k, dm.hi)),
                k.const_u32(4),
            )
        } else {
            let o8 = k.shl_const(o, 3);
            let d = k.shr(w0, o8);
            (f16_bits_to_f32(k, d), None, k.add_const(o, 2))
        };
        let mut d = Scaled::new(d);
        let nibbles = if q4_1 {
            w.aligned_from(k, start, 4)
        } else {
            w.bytes_from(k, start, 4)
        };
        // A half row takes one nibble of every byte: shift it down to the low nibble.
        let (nibbles, halves) = match item.part {
            Some(q) => {
                let sh = k.shl_const(q, 2);
                (nibbles.iter().map(|&v| k.shr(v, sh)).collect::<Vec<_>>(), 1)
            }
            None => (nibbles, 2),
        };
        let words: Vec<Word> = nibbles.iter().map(|&v| Word::new(k, v)).collect();
        let bias = if q4_1 { 0 } else { 8 };
        let mut out = vec![];
        for half in 0..halves {
            for word in &words {
                for byte in 0..4 {
                    let (v, s) = word.field(k, self.magic, byte, 4 * half, 4, bias);
                    let ds = d.get(k, s);
                    out.push(match m {
                        Some(m) => k.fma(ds, v, m),
                        None => k.mul(ds, v),
                    });
                }
            }
        }
        out
    }

    /// Q4_K and Q5_K: `x = (d·sc)·q − dmin·m` for sub-block `s = tile mod 8`, whose
    /// nibbles are nibble `s mod 2` of the staged qs bytes; header in words 0–3, then for
    /// Q4_K (`fifth` false) qs in 4–11; for Q5_K the qh bytes in 4–11, whose bit `s` is
    /// each element's fifth (bit 4 of `q`), and qs in 12–19.
    fn k_quant(
        &self,
        k: &mut Builder,
        w: &Words,
        item: &Item,
        tile: Value,
        fifth: bool,
    ) -> Vec<Value> {
        let s = k.and_const(tile, 7);
        let h: Vec<Value> = (0..4).map(|i| w.at(k, i)).collect();
        let d = f16_bits_to_f32(k, h[0]);
        let dmin = k.shr_const(h[0], 16);
        let dmin = f16_bits_to_f32(k, dmin);
        // Scale bytes 0..12 are in words 1..3; sub-block s takes byte s mod 4 of each.
        let j = k.and_const(s, 3);
        let j8 = k.shl_const(j, 3);
        let [a, b, c] = [1, 2, 3].map(|i| k.shr(h[i], j8));
        let four = k.const_u32(4);
        let high = k.ge(s, four);
        let (sc, mn) = q4_k_scale_min(k, [a, b, c], 0x01, high);
        let sc = self.magic.scaled(k, sc, 0, 0);
        let mn = self.magic.scaled(k, mn, 0, 0);
        // d·sc and dmin·m are exact (11 by 6 significant bits), and so is (d·sc)·q (4 or 5
        // more).
        let dl = k.mul(d, sc);
        let mut dl = Scaled::new(dl);
        let ml = k.mul(dmin, mn);
        let nml = k.neg(ml);
        let nib = k.and_const(s, 1);
        let nib = k.shl_const(nib, 2);
        let first = self.first_elem(k, item);
        let start = k.add_const(first, if fifth { 48 } else { 16 });
        let qs = w.aligned_from(k, start, self.elems / 4);
        let qh = fifth.then(|| {
            let start = k.add_const(first, 16);
            w.aligned_from(k, start, self.elems / 4)
        });
        let mut out = vec![];
        for (i, q) in qs.into_iter().enumerate() {
            let q = k.shr(q, nib);
            let (q, bits) = match &qh {
                Some(qh) => {
                    let q = k.and_const(q, 0x0f0f_0f0f);
                    let h = k.shr(qh[i], s);
                    let h = k.and_const(h, 0x0101_0101);
                    let h = k.shl_const(h, 4);
                    (k.or(q, h), 5)
                }
                None => (q, 4),
            };
            let q = Word::new(k, q);
            for byte in 0..4 {
                let (v, sh) = q.field(k, self.magic, byte, 0, bits, 0);
                let ds = dl.get(k, sh);
                out.push(k.fma(ds, v, nml));
            }
        }
        out
    }

    /// Q6_K: `x = (d·sc)·(q − 32)`, the product rounded once, for sub-block `s = tile mod
    /// 8` (`g = s mod 4`): the low four bits are nibble `g / 2` of the ql bytes (words
    /// 0–8), the top two bits field `g` of the qh bytes (words 9–17); scales in word 18,
    /// `d` in word 19, each at its segment's offset.
    fn q6_k(
        &self,
        k: &mut Builder,
        w: &Words,
        item: &Item,
        tile: Value,
        offsets: &[Value],
    ) -> Vec<Value> {
        let s = k.and_const(tile, 7);
        let g = k.and_const(s, 3);
        let d = w.at(k, 19);
        let o8 = k.shl_const(offsets[3], 3);
        let d = k.shr(d, o8);
        let d = f16_bits_to_f32(k, d);
        let sc = w.at(k, 18);
        let o8 = k.shl_const(offsets[2], 3);
        let sc = k.shr(sc, o8);
        let flip = k.const_u32(0x8080);
        let sc = k.xor(sc, flip);
        let sc = Word::new(k, sc);
        let dls: Vec<Value> = (0..2)
            .map(|i| {
                let (v, s) = sc.field(k, self.magic, i, 0, 8, 128);
                // The field came as sc·2^s; d·sc is exact (11 by 8 significant bits).
                let unscale = k.const_f32(1.0 / (1u32 << s) as f32);
                let v = k.mul(v, unscale);
                k.mul(d, v)
            })
            .collect();
        let first = self.first_elem(k, item);
        let lo_start = k.add(offsets[0], first);
        let hi_start = k.add(offsets[1], first);
        let hi_start = k.add_const(hi_start, 36);
        let lows = w.bytes_from(k, lo_start, self.elems / 4);
        let highs = w.bytes_from(k, hi_start, self.elems / 4);
        let nib = k.shr_const(g, 1);
        let nib = k.shl_const(nib, 2);
        let crumb = k.shl_const(g, 1);
        let per_scale = match item.part {
            // A half row is one 16-element scale group.
            Some(q) => {
                let one = k.const_u32(1);
                let second = k.eq(q, one);
                vec![k.select(second, dls[1], dls[0])]
            }
            None => dls,
        };
        let mut scales: Vec<Scaled> = per_scale.into_iter().map(Scaled::new).collect();
        let mut out = vec![];
        for (i, (&lo, &hi)) in lows.iter().zip(&highs).enumerate() {
            let lo = k.shr(lo, nib);
            let lo = k.and_const(lo, 0x0f0f_0f0f);
            let hi = k.shr(hi, crumb);
            let hi = k.and_const(hi, 0x0303_0303);
            let hi = k.shl_const(hi, 4);
            let q = k.or(lo, hi);
            let q = Word::new(k, q);
            let scale = &mut scales[i * 4 / 16];
            for byte in 0..4 {
                let (v, sh) = q.field(k, self.magic, byte, 0, 6, 32);
                let ds = scale.get(k, sh);
                out.push(k.mul(ds, v));
            }
        }
        out
    }

    /// Q3_K: `x = (d·(sc − 32))·(q − 4)` (every product exact) for sub-block `s = tile
    /// mod 8` (half `h = s / 4`, run `g = s mod 4`): `q`'s low two bits are crumb `g` of
    /// the qs bytes (words 9–17), its third bit is bit `s` of the hmask bytes (words 0–8);
    /// group `p` of the run (its elements `16p ..`) takes scale `8h + 2g + p`, whose low
    /// nibble is nibble `h` of scale byte `2g + p` and whose top bits are bits
    /// `2·(2h + g/2)` of byte `8 + 2·(g mod 2) + p` (words 18–21, `d` after them).
    fn q3_k(
        &self,
        k: &mut Builder,
        w: &Words,
        item: &Item,
        tile: Value,
        offsets: &[Value],
    ) -> Vec<Value> {
        let s = k.and_const(tile, 7);
        let h = k.shr_const(s, 2);
        let g = k.and_const(s, 3);
        let sc_start = k.add_const(offsets[2], 72);
        let sc = w.bytes_from(k, sc_start, 3);
        let d = w.at(k, 21);
        let o8 = k.shl_const(offsets[2], 3);
        let d = k.shr(d, o8);
        let d = f16_bits_to_f32(k, d);
        // Scale bytes 0..8 (the low nibbles) lie in words 0 and 1; the run's pair in word
        // g / 2, from bit 16·(g mod 2); their top bits in word 2, from the same bit.
        let two = k.const_u32(2);
        let upper = k.ge(g, two);
        let low_word = k.select(upper, sc[1], sc[0]);
        let godd = k.and_const(g, 1);
        let pair = k.shl_const(godd, 4);
        let h4 = k.shl_const(h, 2);
        let low_shift = k.add(pair, h4);
        let ghalf = k.shr_const(g, 1);
        let ghalf2 = k.shl_const(ghalf, 1);
        let high_shift = k.add(low_shift, ghalf2);
        let scale = |k: &mut Builder, p: Value| -> Value {
            let p8 = k.shl_const(p, 3);
            let sh = k.add(low_shift, p8);
            let low = k.shr(low_word, sh);
            let low = k.and_const(low, 0x0f);
            let sh = k.add(high_shift, p8);
            let high = k.shr(sc[2], sh);
            let high = k.and_const(high, 3);
            let high = k.shl_const(high, 4);
            let v = k.or(low, high);
            let v = self.magic.int(k, v, 32);
            k.mul(d, v)
        };
        let mut scales: Vec<Scaled> = per_group(k, item, scale)
            .into_iter()
            .map(Scaled::new)
            .collect();
        let first = self.first_elem(k, item);
        let hm_start = k.add(offsets[0], first);
        let qs_start = k.add(offsets[1], first);
        let qs_start = k.add_const(qs_start, 36);
        let hmask = w.bytes_from(k, hm_start, self.elems / 4);
        let qs = w.bytes_from(k, qs_start, self.elems / 4);
        let crumb = k.shl_const(g, 1);
        let mut out = vec![];
        for (i, (&q, &hm)) in qs.iter().zip(&hmask).enumerate() {
            let q = k.shr(q, crumb);
            let q = k.and_const(q, 0x0303_0303);
            let b = k.shr(hm, s);
            let b = k.and_const(b, 0x0101_0101);
            let b = k.shl_const(b, 2);
            let q = k.or(q, b);
            let q = Word::new(k, q);
            let scale = &mut scales[i * 4 / 16];
            for byte in 0..4 {
                let (v, sh) = q.field(k, self.magic, byte, 0, 3, 4);
                let ds = scale.get(k, sh);
                out.push(k.mul(ds, v));
            }
        }
        out
    }

    /// Q2_K: `x = (d·sc)·q − dmin·m` (the product exact, so one `fma`) for sub-block
    /// `s = tile mod 8` (run `g = s mod 4` of half `s / 4`): `q` is crumb `g` of the qs
    /// bytes (words 0–7); group `p` of the run takes scale/min byte `2s + p`, byte
    /// `2·(s mod 2) + p` of word 8 (scale low nibble, min high); `d`, `dmin` in word 9.
    fn q2_k(&self, k: &mut Builder, w: &Words, item: &Item, tile: Value) -> Vec<Value> {
        let s = k.and_const(tile, 7);
        let g = k.and_const(s, 3);
        let dd = w.at(k, 9);
        let d = f16_bits_to_f32(k, dd);
        let dmin = k.shr_const(dd, 16);
        let dmin = f16_bits_to_f32(k, dmin);
        let sc = w.at(k, 8);
        let sodd = k.and_const(s, 1);
        let pair = k.shl_const(sodd, 4);
        let scale = |k: &mut Builder, p: Value| -> (Value, Value) {
            let p8 = k.shl_const(p, 3);
            let sh = k.add(pair, p8);
            let b = k.shr(sc, sh);
            let scale = k.and_const(b, 0x0f);
            let min = k.shr_const(b, 4);
            let min = k.and_const(min, 0x0f);
            let scale = self.magic.int(k, scale, 0);
            let min = self.magic.int(k, min, 0);
            let ml = k.mul(dmin, min);
            (k.mul(d, scale), k.neg(ml))
        };
        let mut scales: Vec<(Scaled, Value)> = per_group(k, item, scale)
            .into_iter()
            .map(|(dl, nml)| (Scaled::new(dl), nml))
            .collect();
        let first = self.first_elem(k, item);
        let qs = w.aligned_from(k, first, self.elems / 4);
        let crumb = k.shl_const(g, 1);
        let mut out = vec![];
        for (i, &q) in qs.iter().enumerate() {
            let q = k.shr(q, crumb);
            let q = k.and_const(q, 0x0303_0303);
            let q = Word::new(k, q);
            let (dl, nml) = &mut scales[i * 4 / 16];
            for byte in 0..4 {
                let (v, sh) = q.field(k, self.magic, byte, 0, 2, 0);
                let ds = dl.get(k, sh);
                out.push(k.fma(ds, v, *nml));
            }
        }
        out
    }
}

/// `f` of each 16-element scale group the item covers (its group `p` within the step's
/// 32 elements, a `u32`): both for a whole row, the half's own for a half row.
fn per_group<T>(
    k: &mut Builder,
    item: &Item,
    mut f: impl FnMut(&mut Builder, Value) -> T,
) -> Vec<T> {
    match item.part {
        Some(q) => vec![f(k, q)],
        None => {
            let (zero, one) = (k.const_u32(0), k.const_u32(1));
            vec![f(k, zero), f(k, one)]
        }
    }
}

/// The staged words of one row of one stage.
struct Words {
    raw_s: Value,
    /// Word offset of the row.
    row: Value,
}

impl Words {
    fn at(&self, k: &mut Builder, i: u32) -> Value {
        let at = k.add_const(self.row, i);
        self.load(k, at)
    }

    fn load(&self, k: &mut Builder, at: Value) -> Value {
        let p = k.ptr_add(self.raw_s, at);
        k.load(Type::U32, p)
    }

    /// `n` words holding the bytes from byte `start` (a `u32`, a multiple of 4) of the
    /// row on.
    fn aligned_from(&self, k: &mut Builder, start: Value, n: u32) -> Vec<Value> {
        let first = k.shr_const(start, 2);
        let first = k.add(self.row, first);
        (0..n)
            .map(|i| {
                let at = k.add_const(first, i);
                self.load(k, at)
            })
            .collect()
    }

    /// `n` words holding the bytes from byte `start` (a `u32`, even) of the row on: the
    /// `n + 1` words around them, funnel-shifted where `start` is 2 past a word boundary.
    fn bytes_from(&self, k: &mut Builder, start: Value, n: u32) -> Vec<Value> {
        let first = k.shr_const(start, 2);
        let first = k.add(self.row, first);
        let raw: Vec<Value> = (0..=n)
            .map(|i| {
                let at = k.add_const(first, i);
                self.load(k, at)
            })
            .collect();
        let sh = k.and_const(start, 3);
        let sh = k.shl_const(sh, 3);
        let thirty_two = k.const_u32(32);
        let back = k.sub(thirty_two, sh);
        // A shift by 32 gives 0 (PTX clamps shift amounts), so `sh = 0` takes raw[i] alone.
        (0..n as usize)
            .map(|i| {
                let lo = k.shr(raw[i], sh);
                let hi = k.shl(raw[i + 1], back);
                k.or(lo, hi)
            })
            .collect()
    }
}
