//! How each weight format is cut into the pieces that lanes take, what a piece loads,
//! and the order of its elements.
//!
//! A row is a sequence of **units** (the smallest run of whole GGUF blocks that keeps
//! every unit's loads aligned), each cut into `pieces_per_unit` **pieces**; lane `l` of
//! the row's warp takes pieces `l, l + 32, l + 64, ...`. Since `pieces_per_unit` divides
//! 32, a lane always takes the same sub-piece `j = l mod pieces_per_unit` of its units,
//! so everything that depends on `j` is computed once per lane.
//!
//! | format | unit | bytes | pieces | piece | loads per piece |
//! |---|---|---|---|---|---|
//! | bf16, f16 | 8 elements | 16 | 1 | 8 elements | one 16-byte |
//! | Q8_0 | 2 blocks, 64 elements | 68 | 1 | 64 elements | 17 × 4-byte, on integer activations ([`super::integer`]) |
//! | Q4_0 | 2 blocks | 36 | 1 | 64 elements | 9 × 4-byte, on integer activations |
//! | Q4_1 | 2 blocks | 40 | 1 | 64 elements | 5 × 8-byte, on integer activations |
//! | Q4_K | 1 super-block, 256 elements | 144 | 4 | 64 elements | 3 × 16-byte (header, 2 × quants), on integer activations ([`super::integer`]) |
//! | Q5_K | 1 super-block | 176 | 4 | 64 elements | 5 × 16-byte (header, 2 × fifth bits, 2 × nibbles), on integer activations ([`super::integer`]) |
//! | Q6_K | 1 super-block | 210 | 4 | 2 runs of 32 elements | 18 × 4-byte (ql and qh, from the word boundary below), 3 × 2-byte, on integer activations ([`super::integer`]) |
//! | Q3_K | 1 super-block | 110 | 8 | 32 elements (4 runs of 8) | 15 × 2-byte |
//! | Q2_K | 1 super-block | 84 | 8 | 32 elements (4 runs of 8, as Q3_K) | 3 × 4-byte, 4 × 2-byte |
//!
//! The unaligned formats (Q8_0's 34-byte and Q4_0's 18-byte blocks, Q6_K's 210-byte and
//! Q3_K's 110-byte super-blocks) cannot use 16-byte loads in GGUF layout; pairs of legacy
//! blocks are 4- or 8-byte aligned, and Q6_K and Q3_K are only 2-byte aligned. Q4_K's 144-byte and Q5_K's
//! 176-byte super-blocks are 16-byte aligned.

use quench_ir::{AddrSpace, Builder, CacheOp, Scalar, Type, Value};
use quench_models::GgmlType;

use crate::ggml::{self, Bytes, Magic, Q2kLane, Q2kRaw, Q3kLane, Q3kRaw};
use crate::lanes::emit_unpack_bf16x2;
use crate::lanes::emit_unpack_f16x2;
use crate::norm_residual::OutType;

/// Weight formats of the matrix–vector kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    BF16,
    F16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q5K,
    Q6K,
    Q3K,
    Q2K,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 10] = [
        WeightFormat::BF16,
        WeightFormat::F16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
        WeightFormat::Q3K,
        WeightFormat::Q2K,
    ];

    pub fn ggml(self) -> GgmlType {
        match self {
            WeightFormat::BF16 => GgmlType::BF16,
            WeightFormat::F16 => GgmlType::F16,
            WeightFormat::Q8_0 => GgmlType::Q8_0,
            WeightFormat::Q4_0 => GgmlType::Q4_0,
            WeightFormat::Q4_1 => GgmlType::Q4_1,
            WeightFormat::Q4K => GgmlType::Q4_K,
            WeightFormat::Q5K => GgmlType::Q5_K,
            WeightFormat::Q6K => GgmlType::Q6_K,
            WeightFormat::Q3K => GgmlType::Q3_K,
            WeightFormat::Q2K => GgmlType::Q2_K,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, WeightFormat::BF16 | WeightFormat::F16)
    }

    /// Whether products with these weights take integer activations, quantized in every
    /// block ([`super::integer`]).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4K
                | WeightFormat::Q5K
                | WeightFormat::Q6K
                | WeightFormat::Q8_0
                | WeightFormat::Q4_0
                | WeightFormat::Q4_1
        )
    }

    /// Elements per unit; rows must be a whole number of units.
    pub fn unit_elems(self) -> u32 {
        match self {
            WeightFormat::BF16 | WeightFormat::F16 => 8,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => 64,
            WeightFormat::Q4K
            | WeightFormat::Q5K
            | WeightFormat::Q6K
            | WeightFormat::Q3K
            | WeightFormat::Q2K => 256,
        }
    }

    pub fn unit_bytes(self) -> u32 {
        match self {
            WeightFormat::BF16 | WeightFormat::F16 => 16,
            WeightFormat::Q8_0 => 68,
            WeightFormat::Q4_0 => 36,
            WeightFormat::Q4_1 => 40,
            WeightFormat::Q4K => 144,
            WeightFormat::Q5K => 176,
            WeightFormat::Q6K => 210,
            WeightFormat::Q3K => 110,
            WeightFormat::Q2K => 84,
        }
    }

    pub fn pieces_per_unit(self) -> u32 {
        match self {
            WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => 4,
            WeightFormat::Q3K | WeightFormat::Q2K => 8,
            _ => 1,
        }
    }

    pub fn row_bytes(self, cols: u32) -> u32 {
        cols / self.unit_elems() * self.unit_bytes()
    }

    /// Element offsets within its unit of sub-piece `j`, in the order the kernel
    /// multiplies them.
    pub fn piece_elements(self, j: u32) -> Vec<u32> {
        match self {
            // A lane's 32 quant bytes: low nibbles (sub-block 2j), then high (2j + 1).
            WeightFormat::Q4K | WeightFormat::Q5K => (64 * j..64 * j + 64).collect(),
            // The ql bytes 32j.. : low nibbles, then high ([`super::integer`]).
            WeightFormat::Q6K => {
                let first = 128 * (j / 2) + 32 * (j % 2);
                (first..first + 32).chain(first + 64..first + 96).collect()
            }
            WeightFormat::Q3K | WeightFormat::Q2K => ggml::q3_k_piece_elements(j),
            _ => (0..self.unit_elems()).collect(),
        }
    }
}

/// What a lane computes once: its format and its sub-piece's constants.
pub enum Lane {
    Half { f16: bool },
    Q3k { lane: Q3kLane, magic: Magic },
    Q2k { lane: Q2kLane, magic: Magic },
}

impl Lane {
    /// The constants of sub-piece `j` (a `u32`, `lane mod pieces_per_unit`). Emit once
    /// per kernel, outside loops. Not for the formats whose products multiply integers
    /// ([`WeightFormat::is_integer`], [`super::integer`]): [`super::build`] never asks.
    pub fn new(k: &mut Builder, f: WeightFormat, j: Value) -> Lane {
        match f {
            WeightFormat::BF16 => Lane::Half { f16: false },
            WeightFormat::F16 => Lane::Half { f16: true },
            WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q4K
            | WeightFormat::Q5K
            | WeightFormat::Q6K => unreachable!("{f:?} products take the integer path"),
            WeightFormat::Q3K => Lane::Q3k {
                lane: Q3kLane::new(k, j),
                magic: Magic::new(k),
            },
            WeightFormat::Q2K => Lane::Q2k {
                lane: Q2kLane::new(k, j),
                magic: Magic::new(k),
            },
        }
    }

    /// The piece's runs of consecutive elements: (offset within the unit, length).
    pub fn x_runs(&self, k: &mut Builder) -> Vec<(Value, u32)> {
        match self {
            Lane::Q3k { lane, .. } => lane.runs.iter().map(|&r| (r, 8)).collect(),
            Lane::Q2k { lane, .. } => lane.runs.iter().map(|&r| (r, 8)).collect(),
            Lane::Half { .. } => vec![(k.const_u32(0), 8)],
        }
    }

    /// Issue the loads of this lane's piece of unit `unit` (a `u32`) in the row starting
    /// at byte pointer `wrow`.
    pub fn load(&self, k: &mut Builder, wrow: Value, unit: Value) -> Raw<'_> {
        // A unit's bytes, and the width of the loads of the formats that load it whole.
        let (unit_bytes, width) = match self {
            Lane::Half { .. } => (16, 16),
            Lane::Q3k { .. } => (110, 2),
            Lane::Q2k { .. } => (84, 4),
        };
        let off = k.mul_const(unit, unit_bytes);
        let at = k.ptr_add(wrow, off);
        match self {
            Lane::Half { f16 } => Raw::Half {
                bytes: Bytes::load(k, at, unit_bytes, width),
                f16: *f16,
            },
            Lane::Q3k { lane, magic } => Raw::Q3k {
                lane,
                magic: *magic,
                raw: lane.load(k, at),
            },
            Lane::Q2k { lane, magic } => Raw::Q2k {
                lane,
                magic: *magic,
                raw: lane.load(k, at),
            },
        }
    }
}

/// A piece's loaded bytes, before decoding.
pub enum Raw<'a> {
    Half {
        bytes: Bytes,
        f16: bool,
    },
    Q3k {
        lane: &'a Q3kLane,
        magic: Magic,
        raw: Q3kRaw,
    },
    Q2k {
        lane: &'a Q2kLane,
        magic: Magic,
        raw: Q2kRaw,
    },
}

impl Raw<'_> {
    /// The piece's weights as f32, in [`WeightFormat::piece_elements`] order.
    pub fn decode(&self, k: &mut Builder) -> Vec<Value> {
        match self {
            Raw::Half { bytes, f16 } => (0..4)
                .flat_map(|i| {
                    let w = bytes.part(i);
                    if *f16 {
                        emit_unpack_f16x2(k, w)
                    } else {
                        emit_unpack_bf16x2(k, w)
                    }
                })
                .collect(),
            Raw::Q3k { lane, magic, raw } => ggml::q3_k_piece(k, *magic, lane, raw),
            Raw::Q2k { lane, magic, raw } => ggml::q2_k_piece(k, *magic, lane, raw),
        }
    }
}

/// Load the activations of one run (`len` a multiple of 8, `first` 8-aligned) as 16-byte
/// words, `xw` being `x` viewed as 32-bit words: 8 bf16 or 4 f32 a word; [`unpack_x`]
/// widens them. `x` in global memory is read through the read-only path; in shared
/// memory (a block's staged copy) plainly.
pub fn load_x(k: &mut Builder, act: OutType, xw: Value, first: Value, len: u32) -> Vec<Value> {
    let (word, per_load) = match act {
        OutType::BF16 => (k.shr_const(first, 1), 8),
        OutType::F32 => (first, 4),
    };
    let cache = match k.ty(xw) {
        Type::Ptr(AddrSpace::Shared, _) => CacheOp::Default,
        _ => CacheOp::Nc,
    };
    (0..len / per_load)
        .map(|i| {
            let w = k.add_const(word, 4 * i);
            let at = k.ptr_add(xw, w);
            k.load_with(Type::Vec(Scalar::U32, 4), at, cache)
        })
        .collect()
}

/// The f32 activations of loaded 16-byte words, in element order.
pub fn unpack_x(k: &mut Builder, act: OutType, loaded: &[Value]) -> Vec<Value> {
    let mut out = vec![];
    for &v in loaded {
        for i in 0..4 {
            let w = k.extract(v, i);
            match act {
                OutType::BF16 => out.extend(emit_unpack_bf16x2(k, w)),
                OutType::F32 => out.push(k.bitcast(Type::F32, w)),
            }
        }
    }
    out
}
