//! Copying the stored bytes of a k-step of `bn` weight rows into shared memory.
//!
//! Each row contributes [`BFormat::step_words`] 4-byte words (its [`Segment`]s, each
//! from the word boundary at or below its first byte), staged `[bn][staged_stride]`.
//! The copy is spread so that a warp's lanes take consecutive words of a few rows: lane
//! `l` copies word `l mod W` of row `l / W` (`W` the words per row), `32 / W` rows per
//! instruction, so each `cp.async` instruction touches one or two cache lines of each of
//! those rows instead of 32 scattered ones. Lanes past the last whole row, and rows past
//! the warp's share in its last instruction, repeat a copy another lane makes (same
//! bytes to the same place).
//!
//! [`Segment`]: super::format::Segment

use quench_ir::{Builder, CacheOp, Scalar, Value};

use super::format::BFormat;
use super::tiles::Ids;
use super::GemmParams;

/// The unrounded byte offsets, within a row, of each segment's data at k-step `tile`
/// (a `u32`): the kernel's twin of [`BFormat::segment_byte`].
pub fn segment_bytes(k: &mut Builder, f: BFormat, tile: Value) -> Vec<Value> {
    let sb = k.shr_const(tile, 3);
    let s = k.and_const(tile, 7);
    match f {
        BFormat::Bf16 | BFormat::F16 => vec![],
        BFormat::Q8_0 => vec![k.mul_const(tile, 34)],
        BFormat::Q4_0 => vec![k.mul_const(tile, 18)],
        BFormat::Q4_1 => vec![k.mul_const(tile, 20)],
        BFormat::Q4K => {
            let head = k.mul_const(sb, 144);
            let pair = k.shr_const(s, 1);
            let pair = k.shl_const(pair, 5);
            let qs = k.add(head, pair);
            vec![head, k.add_const(qs, 16)]
        }
        BFormat::Q5K => {
            let head = k.mul_const(sb, 176);
            let pair = k.shr_const(s, 1);
            let pair = k.shl_const(pair, 5);
            let qs = k.add(head, pair);
            vec![head, k.add_const(head, 16), k.add_const(qs, 48)]
        }
        BFormat::Q6K => {
            let base = k.mul_const(sb, 210);
            let h = k.shr_const(s, 2);
            let odd = k.and_const(s, 1);
            let ql = k.shl_const(h, 6);
            let ql = k.add(base, ql);
            let odd32 = k.shl_const(odd, 5);
            let ql = k.add(ql, odd32);
            let qh = k.shl_const(h, 5);
            let qh = k.add(base, qh);
            let qh = k.add_const(qh, 128);
            let s2 = k.shl_const(s, 1);
            let sc = k.add(base, s2);
            let sc = k.add_const(sc, 192);
            let d = k.add_const(base, 208);
            vec![ql, qh, sc, d]
        }
        BFormat::Q2K => {
            let base = k.mul_const(sb, 84);
            let h = k.shr_const(s, 2);
            let h32 = k.shl_const(h, 5);
            let qs = k.add(base, h32);
            let pair = k.shr_const(s, 1);
            let pair = k.shl_const(pair, 2);
            let sc = k.add(base, pair);
            vec![k.add_const(qs, 16), sc, k.add_const(base, 80)]
        }
        BFormat::Q3K => {
            let base = k.mul_const(sb, 110);
            let h = k.shr_const(s, 2);
            let h32 = k.shl_const(h, 5);
            let qs = k.add(base, h32);
            vec![base, k.add_const(qs, 32), k.add_const(base, 96)]
        }
    }
}

/// One thread's share of copying the stored bytes of a k-step of the block's rows.
pub struct RawCopy {
    format: BFormat,
    /// Global address of this lane's word (step 0, first instruction), less its
    /// segment's start.
    src: Value,
    /// Word offset of its destination within a stage.
    dst: Value,
    /// The last instruction's own source and destination where its rows are clamped.
    last: Option<(Value, Value)>,
    /// `word ≥ first word of segment j`, for segments 1.. (which segment this lane copies).
    in_segment: Vec<Value>,
    instructions: u32,
    rows_per_instruction: u32,
    row_bytes: u64,
    stride: u32,
}

impl RawCopy {
    pub fn emit(k: &mut Builder, p: &GemmParams, ids: &Ids, b: Value) -> RawCopy {
        let f = p.format;
        let words = f.step_words();
        let stride = f.staged_stride();
        let per = 32 / words;
        let rows_per_warp = p.bn / (p.threads() / 32);
        let instructions = rows_per_warp.div_ceil(per);
        let row_bytes = f.row_bytes(p.k);

        let cap = k.const_u32(per * words - 1);
        let l = k.min(ids.lane, cap);
        let wv = k.const_u32(words);
        let row_sub = k.div(l, wv);
        let word = k.rem(l, wv);
        let segs = f.segments();
        let in_segment: Vec<Value> = segs[1..]
            .iter()
            .map(|s| {
                let first = k.const_u32(s.first_word);
                k.ge(word, first)
            })
            .collect();
        // The word's offset within its segment, in bytes.
        let mut seg_first = k.const_u32(0);
        for (s, &inside) in segs[1..].iter().zip(&in_segment) {
            let first = k.const_u32(s.first_word);
            seg_first = k.select(inside, first, seg_first);
        }
        let in_seg = k.sub(word, seg_first);
        let in_seg = k.shl_const(in_seg, 2);

        let warp_row0 = k.mul_const(ids.warp, rows_per_warp);
        let place = |k: &mut Builder, row_in_warp: Value| {
            let r = k.add(warp_row0, row_in_warp);
            let g = k.add(ids.col0, r);
            let g = k.cvt(Scalar::U64, g);
            let rb = k.const_u64(row_bytes);
            let at = k.mul(g, rb);
            let in_seg64 = k.cvt(Scalar::U64, in_seg);
            let at = k.add(at, in_seg64);
            let src = k.ptr_add(b, at);
            let dst = k.mul_const(r, stride);
            (src, k.add(dst, word))
        };
        let (src, dst) = place(k, row_sub);
        let last = (instructions * per > rows_per_warp).then(|| {
            let r = k.add_const(row_sub, (instructions - 1) * per);
            let cap = k.const_u32(rows_per_warp - 1);
            let r = k.min(r, cap);
            place(k, r)
        });
        RawCopy {
            format: f,
            src,
            dst,
            last,
            in_segment,
            instructions,
            rows_per_instruction: per,
            row_bytes,
            stride,
        }
    }

    /// Copy k-step `tile`'s words into the stage at word offset `stage` of `raw_s`.
    pub fn issue(&self, k: &mut Builder, raw_s: Value, stage: Value, tile: Value) {
        let bytes = segment_bytes(k, self.format, tile);
        let mut off = k.and_const(bytes[0], !3);
        for (&b, &inside) in bytes[1..].iter().zip(&self.in_segment) {
            let b = k.and_const(b, !3);
            off = k.select(inside, b, off);
        }
        let src = k.ptr_add(self.src, off);
        let dst = k.add(stage, self.dst);
        for i in 0..self.instructions {
            let (s, d) = match self.last {
                Some((ls, ld)) if i + 1 == self.instructions => {
                    (k.ptr_add(ls, off), k.add(stage, ld))
                }
                _ => {
                    let rows = (i * self.rows_per_instruction) as u64;
                    let o = k.const_u64(rows * self.row_bytes);
                    let d = k.add_const(dst, i * self.rows_per_instruction * self.stride);
                    (k.ptr_add(src, o), d)
                }
            };
            let d = k.ptr_add(raw_s, d);
            k.cp_async(d, s, 4, CacheOp::Ca);
        }
    }
}
