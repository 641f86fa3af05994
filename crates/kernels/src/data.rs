//! Host-side data: seeded random inputs and the byte images of f32/bf16 arrays.

use half::bf16;
use quench_ir::Scalar;
use quench_models::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The generator every case draws from: the same seed gives the same inputs on every
/// machine.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A fresh seed for a unit test: `QUENCH_SEED` if set, else the clock; printed so that a
/// failure can be replayed.
#[cfg(test)]
pub(crate) fn test_seed() -> u64 {
    let s = std::env::var("QUENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

/// `n` values with magnitude uniform in `[lo, hi]` (`lo > 0`, so never zero) and a random
/// sign.
pub fn signed(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let m = rng.gen_range(lo..=hi);
            if rng.gen::<bool>() {
                -m
            } else {
                m
            }
        })
        .collect()
}

/// `n` values uniform in `[lo, hi]`.
pub fn uniform(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..=hi)).collect()
}

/// Round each value to bf16 (to nearest even). With magnitudes of at least 2^-126 the
/// results are never zero.
pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Round each value to f16 (to nearest even).
pub fn to_f16(v: &[f32]) -> Vec<half::f16> {
    v.iter().map(|&x| half::f16::from_f32(x)).collect()
}

pub fn f16_values_bytes(v: &[half::f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

pub fn f32_from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn bf16_from_bytes(b: &[u8]) -> Vec<bf16> {
    b.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

/// Decode an array of `elem` into f64 for comparison. `None` for element types the
/// library never produces as outputs (predicates, packed pairs).
pub fn decode(elem: Scalar, b: &[u8]) -> Option<Vec<f64>> {
    let n = elem.bytes() as usize;
    if n == 0 || elem.is_packed() {
        return None;
    }
    Some(
        b.chunks_exact(n)
            .map(|c| match elem {
                Scalar::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                Scalar::F64 => f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                Scalar::BF16 => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                Scalar::F16 => half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
                Scalar::I8 => c[0] as i8 as f64,
                Scalar::U8 => c[0] as f64,
                Scalar::I16 => i16::from_le_bytes([c[0], c[1]]) as f64,
                Scalar::U16 => u16::from_le_bytes([c[0], c[1]]) as f64,
                Scalar::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                Scalar::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                Scalar::I64 => {
                    i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
                }
                Scalar::U64 => {
                    u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
                }
                Scalar::Pred | Scalar::F16x2 | Scalar::BF16x2 => f64::NAN,
            })
            .collect(),
    )
}

/// A value uniform in `0..n` (`n > 0`).
pub fn below(rng: &mut ChaCha8Rng, n: u32) -> u32 {
    rng.gen_range(0..n)
}

pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

/// Where each ggml block type keeps its f16 scale fields (`d`, and `m`/`dmin`).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q8_0 | Q4_0 | Q5_0 | IQ4_NL | IQ4_XS | IQ3_XXS | IQ3_S | IQ2_XXS | IQ2_XS | IQ2_S
        | IQ1_S => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// Sets IQ1_M's f16 scale `d`, kept in the top nibbles of the block's last four u16
/// (bits `4w..4w + 4` of `d` in u16 `w`).
fn set_iq1_m_scale(block: &mut [u8], d: u16) {
    for w in 0..4 {
        let at = 48 + 2 * w;
        let v = u16::from_le_bytes([block[at], block[at + 1]]) & 0x0fff;
        let v = v | (((d >> (4 * w)) & 0xf) << 12);
        block[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
}

/// `rows` rows of `cols` random elements of `ty`, back to back. Float types hold values
/// with magnitude in `[lo, hi]`; block types hold random bytes (every quant and packed
/// scale pattern) with their f16 scale fields set to magnitudes in `[lo, hi]`, random
/// signs (the k-quants' `dmin` too). Types without an f16 scale give random bytes
/// throughout.
pub fn ggml_rows(
    rng: &mut ChaCha8Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    lo: f32,
    hi: f32,
) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => f32_bytes(&signed(rng, n, lo, hi)),
        GgmlType::BF16 => bf16_bytes(&to_bf16(&signed(rng, n, lo, hi))),
        GgmlType::F16 => f16_bytes(&signed(rng, n, lo, hi)),
        _ => {
            let block = ty.type_size() as usize;
            let blocks = n / ty.block_size() as usize;
            let mut out: Vec<u8> = (0..blocks * block).map(|_| rng.gen()).collect();
            for b in out.chunks_exact_mut(block) {
                for &at in scale_fields(ty) {
                    let v = signed(rng, 1, lo, hi)[0];
                    b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
                if ty == GgmlType::IQ1_M {
                    let v = signed(rng, 1, lo, hi)[0];
                    set_iq1_m_scale(b, half::f16::from_f32(v).to_bits());
                }
            }
            out
        }
    }
}

/// Mistakes a dequantizer of `ty` could make, as [`q5_k_mistakes`] gives them for Q5_K
/// ([`q3_k_mistakes`] for Q3_K, [`q2_k_mistakes`] for Q2_K); none for the other types.
pub fn mistakes(ty: GgmlType, blocks: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    match ty {
        GgmlType::Q5_K => q5_k_mistakes(blocks),
        GgmlType::Q3_K => q3_k_mistakes(blocks),
        GgmlType::Q2_K => q2_k_mistakes(blocks),
        _ => vec![],
    }
}

/// Mistakes a Q2_K dequantizer could make, each as `(what, blocks)` (as
/// [`q3_k_mistakes`]):
/// - Each group's scale and min taken the other way round (the nibbles of its byte).
/// - The quants of the two halves of the super-block traded.
pub fn q2_k_mistakes(blocks: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let size = GgmlType::Q2_K.type_size() as usize;
    let mut swapped = blocks.to_vec();
    let mut halves = blocks.to_vec();
    for (b, (swap, half)) in blocks.chunks_exact(size).zip(
        swapped
            .chunks_exact_mut(size)
            .zip(halves.chunks_exact_mut(size)),
    ) {
        for byte in &mut swap[..16] {
            *byte = byte.rotate_left(4);
        }
        half[16..48].copy_from_slice(&b[48..80]);
        half[48..80].copy_from_slice(&b[16..48]);
    }
    vec![
        ("each group's scale and min swapped", swapped),
        ("the quants of the super-block's two halves traded", halves),
    ]
}

/// Mistakes a Q3_K dequantizer could make, each as `(what, blocks)` (whole super-blocks
/// that the right dequantizer reads as the mistaken one reads `blocks`):
/// - The hmask bit read the other way round (4 taken off where it is set).
/// - Each group's scale nibble taken from the other half of the super-block (group `j`'s
///   low four bits from group `j ± 8`'s nibble).
pub fn q3_k_mistakes(blocks: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let size = GgmlType::Q3_K.type_size() as usize;
    let mut polarity = blocks.to_vec();
    let mut nibbles = blocks.to_vec();
    for (flip, swap) in polarity
        .chunks_exact_mut(size)
        .zip(nibbles.chunks_exact_mut(size))
    {
        for byte in &mut flip[..32] {
            *byte = !*byte;
        }
        for byte in &mut swap[96..104] {
            *byte = byte.rotate_left(4);
        }
    }
    vec![
        ("the hmask bit taken the other way round", polarity),
        (
            "each group's scale nibble taken from the other half",
            nibbles,
        ),
    ]
}

/// Mistakes a Q5_K dequantizer could make, each as `(what, blocks)`: Q5_K super-blocks
/// that the right dequantizer turns into the values the mistaken one gives for `blocks`
/// (whole super-blocks, back to back). The Q5_K kernels' checks hold these as controls,
/// which their outputs must fail.
///
/// - The fifth bit placed at bit 0 of the quant (`q = 2·nibble + bit`) instead of bit 4:
///   the quant is right for 2 of its 32 values only.
/// - Each sub-block's 6-bit scale and min taken the other way round.
pub fn q5_k_mistakes(blocks: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let size = GgmlType::Q5_K.type_size() as usize;
    let mut low_bit = blocks.to_vec();
    let mut swapped = blocks.to_vec();
    for (b, (low, swap)) in blocks.chunks_exact(size).zip(
        low_bit
            .chunks_exact_mut(size)
            .zip(swapped.chunks_exact_mut(size)),
    ) {
        // Element i: nibble (i / 32) % 2 of qs byte 32·(i / 64) + i % 32, bit i / 32 of
        // qh byte i % 32.
        low[16..].fill(0);
        for i in 0..256 {
            let (nibble_at, shift) = (48 + 32 * (i / 64) + i % 32, 4 * ((i / 32) % 2));
            let (bit_at, bit) = (16 + i % 32, i / 32);
            let nibble = (b[nibble_at] >> shift) & 0x0f;
            let fifth = (b[bit_at] >> bit) & 1;
            let q = 2 * nibble + fifth;
            low[nibble_at] |= (q & 0x0f) << shift;
            low[bit_at] |= (q >> 4) << bit;
        }
        // Scale bytes 0..4 and min bytes 4..8 trade places, and so do the nibbles of
        // bytes 8..12 (the low four bits of sub-blocks 4..8's scale and min).
        swap[4..8].copy_from_slice(&b[8..12]);
        swap[8..12].copy_from_slice(&b[4..8]);
        for byte in &mut swap[12..16] {
            *byte = byte.rotate_left(4);
        }
    }
    vec![
        (
            "the fifth bit taken as bit 0 of the quant instead of bit 4",
            low_bit,
        ),
        ("each sub-block's scale and min swapped", swapped),
    ]
}
