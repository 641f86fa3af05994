//! The element type of a forward pass.
//!
//! Every forward is written once over [`Real`] and instantiated twice: `f64` is the reference
//! (every operation in double precision, weights upcast exactly from their f32 dequantization)
//! and `f32` is the one used for chatting.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

pub trait Real:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + Debug
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + MulAssign
{
    const ZERO: Self;
    const ONE: Self;
    /// Whether a decoder keeps weights that a checkpoint stores in a block format it can
    /// multiply directly (Q4_1, Q8_0) in that format: `f32`, for speed. `f64`, the reference,
    /// expands every weight exactly instead.
    const KEEPS_BLOCKS: bool;
    /// Rounds to nearest for `f32`; exact for `f64`.
    fn from_f64(v: f64) -> Self;
    /// Exact for both.
    fn from_f32(v: f32) -> Self;
    fn to_f64(self) -> f64;
    fn to_f32(self) -> f32;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    fn max(self, other: Self) -> Self;
    /// The slice as f32, where `Self` is f32 (to write expanded weights in place).
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]>;
    /// The slice as f32, where `Self` is f32 (for vector code written for f32).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
}

macro_rules! impl_real {
    ($t:ty, $keeps_blocks:expr, $as_f32_mut:expr, $as_f32:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const KEEPS_BLOCKS: bool = $keeps_blocks;
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
                $as_f32_mut(s)
            }
            fn as_f32(s: &[Self]) -> Option<&[f32]> {
                $as_f32(s)
            }
        }
    };
}

impl_real!(f32, true, Some, Some);
impl_real!(f64, false, |_| None, |_| None);
