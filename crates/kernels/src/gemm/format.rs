//! The weight formats of the matrix products, and where each k-step's bytes of a weight
//! row lie.
//!
//! A k-step covers 32 consecutive elements of a row. For the block formats, the bytes
//! a step needs are a few runs ([`Segment`]s) of the row, each copied to shared memory
//! as whole 4-byte words from the word boundary at or below its first byte: rows start
//! 4-byte aligned (the `k` multiples in [`BFormat::k_multiple`] make sure of it), but
//! Q8_0's 34-byte and Q4_0's 18-byte blocks and Q6_K's 210-byte and Q3_K's 110-byte
//! super-blocks start 2-byte aligned every other block, so their data then begins two bytes into the
//! copied window ([`BFormat::data_offset`]).

use quench_ir::Scalar;
use quench_models::GgmlType;

/// How `B` (the `[n, k]` weight operand) is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BFormat {
    /// bf16, row-major `[n, k]`.
    Bf16,
    /// f16, row-major `[n, k]` (GGUF type F16); with f16 operands only.
    F16,
    /// GGUF blocks, rows of `k` elements back to back.
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q5K,
    Q6K,
    Q3K,
    Q2K,
}

/// One run of 4-byte words of a row that a k-step copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where it starts in the step's staged words.
    pub first_word: u32,
    pub words: u32,
}

impl BFormat {
    pub const ALL: [BFormat; 10] = [
        BFormat::Bf16,
        BFormat::F16,
        BFormat::Q8_0,
        BFormat::Q4_0,
        BFormat::Q4_1,
        BFormat::Q4K,
        BFormat::Q5K,
        BFormat::Q6K,
        BFormat::Q3K,
        BFormat::Q2K,
    ];

    pub fn ggml(self) -> GgmlType {
        match self {
            BFormat::Bf16 => GgmlType::BF16,
            BFormat::F16 => GgmlType::F16,
            BFormat::Q8_0 => GgmlType::Q8_0,
            BFormat::Q4_0 => GgmlType::Q4_0,
            BFormat::Q4_1 => GgmlType::Q4_1,
            BFormat::Q4K => GgmlType::Q4_K,
            BFormat::Q5K => GgmlType::Q5_K,
            BFormat::Q6K => GgmlType::Q6_K,
            BFormat::Q3K => GgmlType::Q3_K,
            BFormat::Q2K => GgmlType::Q2_K,
        }
    }

    pub fn is_quantized(self) -> bool {
        !matches!(self, BFormat::Bf16 | BFormat::F16)
    }

    /// The element type of `B` in memory: bf16, f16, or bytes for the block formats.
    pub fn stored_elem(self) -> Scalar {
        match self {
            BFormat::Bf16 => Scalar::BF16,
            BFormat::F16 => Scalar::F16,
            _ => Scalar::U8,
        }
    }

    /// `k` must be a multiple of this: whole blocks per row, rows 4-byte aligned, and for
    /// Q6_K and Q3_K an even number of super-blocks per row, so that every row's
    /// super-block `j` has the same alignment.
    pub fn k_multiple(self) -> u32 {
        match self {
            BFormat::Bf16 | BFormat::F16 => 32,
            BFormat::Q8_0 | BFormat::Q4_0 | BFormat::Q4_1 => 64,
            BFormat::Q4K | BFormat::Q5K | BFormat::Q2K => 256,
            BFormat::Q6K | BFormat::Q3K => 512,
        }
    }

    /// Bytes of one row of `k` elements.
    pub fn row_bytes(self, k: u32) -> u64 {
        let k = k as u64;
        match self {
            BFormat::Bf16 | BFormat::F16 => 2 * k,
            BFormat::Q8_0 => k / 32 * 34,
            BFormat::Q4_0 => k / 32 * 18,
            BFormat::Q4_1 => k / 32 * 20,
            BFormat::Q4K => k / 256 * 144,
            BFormat::Q5K => k / 256 * 176,
            BFormat::Q6K => k / 256 * 210,
            BFormat::Q3K => k / 256 * 110,
            BFormat::Q2K => k / 256 * 84,
        }
    }

    /// The runs a k-step copies from each row, in staging order.
    ///
    /// | format | runs (bytes of the row, step `t`) | words |
    /// |---|---|---|
    /// | Q8_0 | block `t` (34 bytes at `34t`) | 9 |
    /// | Q4_0 | block `t` (18 bytes at `18t`) | 5 |
    /// | Q4_1 | block `t` (20 bytes at `20t`) | 5 |
    /// | Q4_K | super-block header (16 bytes), the 32 nibble bytes of sub-block `t mod 8` | 4 + 8 |
    /// | Q5_K | super-block header (16 bytes), the 32 high-bit bytes, the 32 nibble bytes of sub-block `t mod 8` | 4 + 8 + 8 |
    /// | Q6_K | 32 low-nibble bytes, 32 high-bit bytes, the two scales, `d` | 9 + 9 + 1 + 1 |
    /// | Q3_K | the 32 hmask bytes, the 32 qs bytes of half `s / 4`, the 12 scale bytes and `d` | 9 + 9 + 4 |
    /// | Q2_K | the 32 qs bytes of half `s / 4`, the word of the sub-block's two scale/min bytes, `d` and `dmin` | 8 + 1 + 1 |
    pub fn segments(self) -> &'static [Segment] {
        const fn seg(first_word: u32, words: u32) -> Segment {
            Segment { first_word, words }
        }
        const Q8_0: [Segment; 1] = [seg(0, 9)];
        const Q4: [Segment; 1] = [seg(0, 5)];
        const Q4K: [Segment; 2] = [seg(0, 4), seg(4, 8)];
        const Q5K: [Segment; 3] = [seg(0, 4), seg(4, 8), seg(12, 8)];
        const Q6K: [Segment; 4] = [seg(0, 9), seg(9, 9), seg(18, 1), seg(19, 1)];
        const Q3K: [Segment; 3] = [seg(0, 9), seg(9, 9), seg(18, 4)];
        const Q2K: [Segment; 3] = [seg(0, 8), seg(8, 1), seg(9, 1)];
        match self {
            BFormat::Bf16 | BFormat::F16 => &[],
            BFormat::Q8_0 => &Q8_0,
            BFormat::Q4_0 | BFormat::Q4_1 => &Q4,
            BFormat::Q4K => &Q4K,
            BFormat::Q5K => &Q5K,
            BFormat::Q6K => &Q6K,
            BFormat::Q3K => &Q3K,
            BFormat::Q2K => &Q2K,
        }
    }

    /// Words a k-step copies per row.
    pub fn step_words(self) -> u32 {
        self.segments().iter().map(|s| s.words).sum()
    }

    /// Row stride of the staged words: odd, so that lanes reading the same word of
    /// consecutive rows hit distinct banks, and one word longer than the data where the
    /// decoder reads a word past a window's end (Q8_0, Q4_0: the funnel shift of data
    /// that starts two bytes in reads one extra word, unused when it starts at 0).
    pub fn staged_stride(self) -> u32 {
        let overrun = u32::from(matches!(self, BFormat::Q8_0 | BFormat::Q4_0));
        (self.step_words() + overrun) | 1
    }

    /// Byte offset (relative to the row's start) of segment `seg`'s first needed byte
    /// at step `t`, before rounding down to a word; host twin of the kernel's address
    /// computation.
    pub fn segment_byte(self, seg: usize, t: u32) -> u64 {
        let t64 = t as u64;
        let (sb, s) = (t64 / 8, t64 % 8);
        match (self, seg) {
            (BFormat::Q8_0, _) => 34 * t64,
            (BFormat::Q4_0, _) => 18 * t64,
            (BFormat::Q4_1, _) => 20 * t64,
            (BFormat::Q4K, 0) => 144 * sb,
            (BFormat::Q4K, _) => 144 * sb + 16 + 32 * (s / 2),
            (BFormat::Q5K, 0) => 176 * sb,
            (BFormat::Q5K, 1) => 176 * sb + 16,
            (BFormat::Q5K, _) => 176 * sb + 48 + 32 * (s / 2),
            (BFormat::Q6K, 0) => 210 * sb + 64 * (s / 4) + 32 * (s % 2),
            (BFormat::Q6K, 1) => 210 * sb + 128 + 32 * (s / 4),
            (BFormat::Q6K, 2) => 210 * sb + 192 + 2 * s,
            (BFormat::Q6K, _) => 210 * sb + 208,
            (BFormat::Q3K, 0) => 110 * sb,
            (BFormat::Q3K, 1) => 110 * sb + 32 + 32 * (s / 4),
            (BFormat::Q3K, _) => 110 * sb + 96,
            (BFormat::Q2K, 0) => 84 * sb + 16 + 32 * (s / 4),
            (BFormat::Q2K, 1) => 84 * sb + 4 * (s / 2),
            (BFormat::Q2K, _) => 84 * sb + 80,
            (BFormat::Bf16 | BFormat::F16, _) => 0,
        }
    }

    /// Where the data of segment `seg` starts within its first copied word at step `t`
    /// (0 or 2): the byte offset's remainder modulo 4, since rows start 4-byte aligned.
    pub fn data_offset(self, seg: usize, t: u32) -> u32 {
        (self.segment_byte(seg, t) % 4) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step's runs lie inside the row, cover the bytes the step's elements are
    /// made of, and start at offsets 0 or 2 of their first word.
    #[test]
    fn segments_cover_each_steps_bytes() {
        for f in BFormat::ALL.into_iter().filter(|f| f.is_quantized()) {
            let k = f.k_multiple() * 2;
            let rb = f.row_bytes(k);
            assert_eq!(rb, f.ggml().bytes_for(k as u64).unwrap_or(0), "{f:?}");
            assert_eq!(rb % 4, 0, "{f:?}: rows must start 4-byte aligned");
            let segs = f.segments();
            let mut first = 0;
            for s in segs {
                assert_eq!(s.first_word, first, "{f:?}");
                first += s.words;
            }
            for t in 0..k / 32 {
                for (i, s) in segs.iter().enumerate() {
                    let at = f.segment_byte(i, t);
                    let o = f.data_offset(i, t);
                    assert!(o == 0 || o == 2, "{f:?} step {t}");
                    assert!(
                        at - o as u64 + 4 * s.words as u64 <= rb,
                        "{f:?} step {t} segment {i} leaves the row"
                    );
                }
                // The bytes each step needs, by format, fit in their windows.
                let need: &[u64] = match f {
                    BFormat::Q8_0 => &[34],
                    BFormat::Q4_0 => &[18],
                    BFormat::Q4_1 => &[20],
                    BFormat::Q4K => &[16, 32],
                    BFormat::Q5K => &[16, 32, 32],
                    BFormat::Q3K => &[32, 32, 14],
                    BFormat::Q2K => &[32, 4, 4],
                    _ => &[32, 32, 2, 2],
                };
                for (i, (s, n)) in segs.iter().zip(need).enumerate() {
                    assert!(
                        f.data_offset(i, t) as u64 + n <= 4 * s.words as u64,
                        "{f:?} step {t} segment {i}"
                    );
                }
            }
            assert_eq!(f.staged_stride() % 2, 1);
        }
    }
}
