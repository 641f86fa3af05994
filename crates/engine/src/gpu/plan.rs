//! What a planned GPU program is made of, for the decode step ([`super::graph`]) and the
//! prompt chunk ([`super::prefill`]) alike: dispatches whose every argument is named
//! symbolically — a buffer of the program's arena, a weight group ([`super::weights`]), a
//! layer's KV cache, a count of the rows — so that memory can be planned before anything
//! is allocated, and resolved to device addresses once it is ([`resolve`]). One
//! [`Assembler`] builds both programs.
//!
//! A program runs for some number of **rows**: a decode step for each of its sequences, a
//! prompt chunk for each of its tokens. A dispatch says which row counts it is part of
//! ([`Rows`]), how its grid follows the rows ([`Grid`]) and how its pointers do
//! ([`Offset`]).

use std::collections::HashMap;

use quench_ir::Function;
use quench_kernels::gemm::GemmParams;
use quench_kernels::silu_mul::SiluMulParams;
use quench_kernels::to_bf16::ToBf16Params;
use quench_kernels::{attention::prefill::PrefillParams, KernelError};
use quench_rt::{Arg, DevicePtr, KernelId, Launch};

use super::error::GpuError;

/// Where a pointer argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Region {
    /// A buffer of the program's own arena (index into its buffers).
    Act(usize),
    /// A weight group ([`super::weights::ModelWeights`]).
    Weights(usize),
    KCache(usize),
    VCache(usize),
    /// A buffer of the decode step's arena, which a prompt chunk writes its last row's
    /// logits (and next token) into.
    Step(usize),
}

/// How far into its region a pointer is, given the program's `n` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offset {
    Fixed(u64),
    /// `n · bytes`: past `n` rows of `bytes`.
    Rows(u64),
    /// `(n − 1) · bytes`: the last row.
    LastRow(u64),
}

impl Offset {
    pub fn bytes(self, n: u32) -> u64 {
        match self {
            Offset::Fixed(b) => b,
            Offset::Rows(b) => n as u64 * b,
            Offset::LastRow(b) => (n as u64).saturating_sub(1) * b,
        }
    }
}

/// One argument of a dispatch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    At(Region, Offset),
    Value(Arg),
    /// The row count (u32).
    Rows,
    /// A prompt chunk's first position (u32).
    Start,
    /// `n · per_row` elements (u32).
    Elements(u32),
}

/// `bytes` into `region`.
pub(crate) fn at(region: Region, bytes: u64) -> Operand {
    Operand::At(region, Offset::Fixed(bytes))
}

/// The row counts a dispatch is part of. The matrix–vector products that read a
/// normalized input differ: a one-row step normalizes inside each product, a step of
/// several rows with a dispatch of its own and then multiplies several vectors a pass.
/// The tensor-core products come in variants by row count ([`Rows::Span`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Any row count.
    Any,
    /// One row.
    One,
    /// Two rows or more.
    Many,
    /// `least ..= most` rows.
    Span { least: u32, most: u32 },
}

impl Rows {
    /// Whether a program of `rows` rows includes the dispatch.
    pub fn includes(self, rows: u32) -> bool {
        match self {
            Rows::Any => true,
            Rows::One => rows == 1,
            Rows::Many => rows > 1,
            Rows::Span { least, most } => (least..=most).contains(&rows),
        }
    }
}

/// How a dispatch's grid follows the rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Grid {
    /// The same launch for any row count.
    Once(Launch),
    /// `launch.grid[axis]` blocks per row.
    PerRow(Launch, usize),
    Gemm(GemmParams),
    /// One thread per group of elements, `per_row` elements a row.
    Cast(ToBf16Params, u32),
    SiluMul(SiluMulParams, u32),
    /// The tensor-core prompt attention's query tiles by heads.
    Prefill(PrefillParams),
}

impl Grid {
    /// The launch for `n` rows.
    pub fn launch(&self, n: u32) -> Launch {
        match *self {
            Grid::Once(l) => l,
            Grid::PerRow(mut l, axis) => {
                l.grid[axis] *= n;
                l
            }
            Grid::Gemm(p) => p.launch(n),
            Grid::Cast(p, w) => p.launch(n * w),
            Grid::SiluMul(p, w) => p.launch(n * w),
            Grid::Prefill(p) => p.launch(n),
        }
    }
}

/// One kernel launch of a program.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// What it computes, for messages: `layer 3: attention`.
    pub label: String,
    /// Index into the program's kernels.
    pub kernel: usize,
    /// The row counts it is part of.
    pub rows: Rows,
    pub(crate) grid: Grid,
    pub(crate) args: Vec<Operand>,
}

impl Dispatch {
    /// The launch for `rows` rows (a count that [`Dispatch::rows`] includes).
    pub fn launch_for(&self, rows: u32) -> Launch {
        self.grid.launch(rows)
    }
}

/// A buffer of a program's arena.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Buffer {
    pub name: String,
    pub bytes: u64,
    /// Read or written by the host between runs: live for the whole program.
    pub host: bool,
}

/// Kernels built once per distinct parameters, indexed in the order first asked for.
#[derive(Default)]
struct KernelSet {
    kernels: Vec<Function>,
    built: HashMap<String, usize>,
}

/// Builds a program: its kernels (each built once), dispatches and buffers.
#[derive(Default)]
pub(crate) struct Assembler {
    kernels: KernelSet,
    pub dispatches: Vec<Dispatch>,
    pub buffers: Vec<Buffer>,
}

/// What an [`Assembler`] built.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub kernels: Vec<Function>,
    pub dispatches: Vec<Dispatch>,
    pub buffers: Vec<Buffer>,
}

impl Assembler {
    /// The kernel built from `params` (built now if these parameters are new); `part`
    /// names what it computes in an error.
    pub fn kernel<P: std::fmt::Debug>(
        &mut self,
        part: &str,
        params: &P,
        build: impl FnOnce(&P) -> Result<Function, KernelError>,
    ) -> Result<usize, GpuError> {
        let set = &mut self.kernels;
        let key = format!("{params:?}");
        if let Some(&i) = set.built.get(&key) {
            return Ok(i);
        }
        let f = build(params).map_err(GpuError::kernel(part))?;
        set.kernels.push(f);
        set.built.insert(key, set.kernels.len() - 1);
        Ok(set.kernels.len() - 1)
    }

    /// A new buffer of `bytes` (its index: [`Region::Act`]).
    pub fn buffer(&mut self, name: String, bytes: u64, host: bool) -> usize {
        self.buffers.push(Buffer { name, bytes, host });
        self.buffers.len() - 1
    }

    /// A dispatch of the row counts `rows` includes.
    pub fn push(
        &mut self,
        rows: Rows,
        label: String,
        kernel: usize,
        grid: Grid,
        args: Vec<Operand>,
    ) {
        self.dispatches.push(Dispatch {
            label,
            kernel,
            rows,
            grid,
            args,
        });
    }

    pub fn finish(self) -> Program {
        Program {
            kernels: self.kernels.kernels,
            dispatches: self.dispatches,
            buffers: self.buffers,
        }
    }
}

impl Program {
    /// The dispatches of a run of `rows` rows, in order.
    pub fn run_of(&self, rows: u32) -> impl Iterator<Item = &Dispatch> {
        self.dispatches
            .iter()
            .filter(move |d| d.rows.includes(rows))
    }
}

/// A launch argument resolved to a device address or value, or what follows the rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Slot {
    Arg(Arg),
    /// A pointer whose offset follows the rows.
    Ptr(DevicePtr, Offset),
    Rows,
    Start,
    Elements(u32),
}

/// A dispatch resolved to device addresses and a loaded kernel.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub label: String,
    pub kernel: KernelId,
    pub rows: Rows,
    pub grid: Grid,
    pub args: Vec<Slot>,
}

impl Resolved {
    /// The launch and arguments for `rows` rows from position `start` on.
    pub fn at(&self, rows: u32, start: u32) -> (Launch, Vec<Arg>) {
        let args = self
            .args
            .iter()
            .map(|s| match *s {
                Slot::Arg(a) => a,
                Slot::Ptr(p, off) => Arg::Ptr(p.offset(off.bytes(rows))),
                Slot::Rows => Arg::U32(rows),
                Slot::Start => Arg::U32(start),
                Slot::Elements(w) => Arg::U32(rows * w),
            })
            .collect();
        (self.grid.launch(rows), args)
    }
}

/// Resolves `dispatches`: `base` gives each region's device address, `kernels` each
/// kernel's id.
pub(crate) fn resolve(
    dispatches: &[Dispatch],
    kernels: &[KernelId],
    base: impl Fn(Region) -> Result<DevicePtr, GpuError>,
) -> Result<Vec<Resolved>, GpuError> {
    let slot = |op: &Operand| -> Result<Slot, GpuError> {
        Ok(match *op {
            Operand::At(r, Offset::Fixed(off)) => Slot::Arg(Arg::Ptr(base(r)?.offset(off))),
            Operand::At(r, off) => Slot::Ptr(base(r)?, off),
            Operand::Value(a) => Slot::Arg(a),
            Operand::Rows => Slot::Rows,
            Operand::Start => Slot::Start,
            Operand::Elements(w) => Slot::Elements(w),
        })
    };
    dispatches
        .iter()
        .map(|d| {
            Ok(Resolved {
                label: d.label.clone(),
                kernel: kernels[d.kernel],
                rows: d.rows,
                grid: d.grid,
                args: d.args.iter().map(slot).collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_rows() {
        assert_eq!(Offset::Fixed(12).bytes(7), 12);
        assert_eq!(Offset::Rows(8).bytes(3), 24);
        assert_eq!(Offset::LastRow(8).bytes(3), 16);
        assert_eq!(Offset::LastRow(8).bytes(1), 0);
    }

    #[test]
    fn grids_grow_with_the_rows() {
        let l = Launch {
            grid: [4, 2, 1],
            block: [128, 1, 1],
            dynamic_shared_bytes: 0,
        };
        assert_eq!(Grid::PerRow(l, 1).launch(5).grid, [4, 10, 1]);
        assert_eq!(Grid::Once(l).launch(5).grid, [4, 2, 1]);
    }
}
