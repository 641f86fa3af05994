//! Elementwise add, `y = a + b`, in f32 or bf16.
//!
//! **Layout**: `a`, `b`, `y` are contiguous arrays of `n` elements (a runtime argument);
//! see [`crate::elementwise`] for the thread mapping. bf16 is added in f32 and rounded
//! once. The kernel is exact, so the reference matches bit for bit.

use half::bf16;
use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::elementwise;
use crate::error::KernelError;
use crate::lanes::{gptr, round_bf16};

/// Parameters of the add kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddParams {
    /// `F32` or `BF16`.
    pub elem: Scalar,
    /// Threads per block.
    pub threads: u32,
}

impl AddParams {
    pub fn name(&self) -> &'static str {
        if self.elem == Scalar::BF16 {
            "add_bf16"
        } else {
            "add_f32"
        }
    }

    /// The launch for `n` elements.
    pub fn launch(&self, n: u32) -> Launch {
        elementwise::launch(self.elem, n, self.threads)
    }
}

/// `add_f32(a, b, y, n)` / `add_bf16(a, b, y, n)`.
pub fn build(p: &AddParams) -> Result<Function, KernelError> {
    if !matches!(p.elem, Scalar::F32 | Scalar::BF16) {
        return Err(KernelError::unsupported(
            p.name(),
            format!("element type {} (f32 or bf16 only)", p.elem),
        ));
    }
    let mut k = Builder::new(p.name(), p.threads);
    let a = k.param("a", gptr(p.elem));
    let b = k.param("b", gptr(p.elem));
    let y = k.param("y", gptr(p.elem));
    let n = k.param("n", Type::U32);
    elementwise::emit_map(&mut k, p.elem, &[a, b], y, n, &|k, x| k.add(x[0], x[1]));
    Ok(k.finish()?)
}

pub fn reference_f32(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub fn reference_bf16(a: &[bf16], b: &[bf16]) -> Vec<bf16> {
    a.iter()
        .zip(b)
        .map(|(x, y)| round_bf16(x.to_f32() + y.to_f32()))
        .collect()
}

/// A case over `n` elements, inputs of magnitude in [2^-4, 4].
pub fn case(p: &AddParams, n: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let len = n as usize;
    let a = data::signed(&mut rng, len, 0.0625, 4.0);
    let b = data::signed(&mut rng, len, 0.0625, 4.0);
    let (da, db, want) = if p.elem == Scalar::F32 {
        (
            data::f32_bytes(&a),
            data::f32_bytes(&b),
            data::f32_bytes(&reference_f32(&a, &b)),
        )
    } else {
        let (a, b) = (data::to_bf16(&a), data::to_bf16(&b));
        (
            data::bf16_bytes(&a),
            data::bf16_bytes(&b),
            data::bf16_bytes(&reference_bf16(&a, &b)),
        )
    };
    let bytes = len * p.elem.bytes() as usize;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: n.to_string(),
        kernel,
        launch: p.launch(n),
        buffers: vec![
            Buffer::input("a", da),
            Buffer::input("b", db),
            Buffer::output("y", bytes),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(n)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: want,
            elem: p.elem,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: 3 * bytes as u64,
        flops: n as u64,
    })
}
