//! A kernel's binary interface: what the host must pass and what the launch must
//! provide. It is always derived from the IR ([`KernelAbi::from_function`]), never
//! written by hand, and it is recomputed whenever a kernel is loaded, so that an ABI
//! stored beside a cached binary can be checked against the kernel it claims to be.

use std::collections::BTreeSet;

use quench_ir::func::{MAX_STATIC_SHARED_BYTES, MAX_THREADS_PER_BLOCK};
use quench_ir::{AddrSpace, Function, Op, Scalar, Type, UnOp};
use serde::{Deserialize, Serialize};

use crate::error::RtError;

/// The interface of one kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelAbi {
    /// Entry-point name.
    pub name: String,
    pub params: Vec<AbiParam>,
    /// Shared memory the kernel declares statically; dynamic shared memory comes on
    /// top of it at launch.
    pub static_shared_bytes: u64,
    /// The most threads per block the kernel may be launched with (`.maxntid`).
    pub max_threads: u32,
    /// Hardware features the kernel uses, sorted: `approx`, `cp.async`, `ldmatrix`,
    /// `mma.sync`, `redux.sync`.
    pub features: Vec<String>,
}

/// One kernel parameter as the host sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbiParam {
    pub name: String,
    pub kind: ParamKind,
    /// Bytes the parameter occupies in the parameter buffer.
    pub size: u32,
    pub align: u32,
}

/// What a parameter holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ParamKind {
    /// A device address; `space` is always `global` for kernel parameters, `elem` is
    /// the IR name of the element type (`f32`, `bf16`, `u8`, ...).
    Ptr { space: String, elem: String },
    /// A scalar passed by value, named as in the IR (`u32`, `s64`, `f32`, ...).
    Scalar(String),
}

impl ParamKind {
    /// How the kind reads in messages: `ptr<global, f32>`, `u32`.
    pub fn describe(&self) -> String {
        match self {
            ParamKind::Ptr { space, elem } => format!("ptr<{space}, {elem}>"),
            ParamKind::Scalar(s) => s.clone(),
        }
    }
}

impl KernelAbi {
    /// Derive the interface of a kernel from its IR. Refuses parameters the host
    /// cannot pass (predicates, packed pairs, vectors, fragments, pointers outside
    /// global memory), more static shared memory than sm_90 allows without opt-in,
    /// and a thread bound outside 1..=1024.
    pub fn from_function(f: &Function) -> Result<KernelAbi, RtError> {
        let refuse = |message: String| RtError::Abi {
            kernel: f.name.clone(),
            message,
        };
        let mut params = Vec::with_capacity(f.params.len());
        for (i, p) in f.params.iter().enumerate() {
            let (kind, size) = match p.ty {
                Type::Ptr(AddrSpace::Global, elem) => (
                    ParamKind::Ptr {
                        space: AddrSpace::Global.name().into(),
                        elem: elem.name().into(),
                    },
                    8,
                ),
                Type::Scalar(s) if passable_scalar(s) => {
                    (ParamKind::Scalar(s.name().into()), s.bytes())
                }
                other => {
                    return Err(refuse(format!(
                        "parameter {i} (`{}`) has type {other}, which cannot be passed to a kernel \
                         (kernel parameters are global pointers or integer/float scalars)",
                        p.name
                    )))
                }
            };
            params.push(AbiParam {
                name: p.name.clone(),
                kind,
                size,
                align: size,
            });
        }
        let static_shared_bytes = f.shared_bytes();
        if static_shared_bytes > MAX_STATIC_SHARED_BYTES {
            return Err(refuse(format!(
                "declares {static_shared_bytes} bytes of static shared memory, more than the \
                 {MAX_STATIC_SHARED_BYTES} a kernel may declare statically (use dynamic shared memory)"
            )));
        }
        if !(1..=MAX_THREADS_PER_BLOCK).contains(&f.max_threads) {
            return Err(refuse(format!(
                "thread bound {} is outside 1..={}",
                f.max_threads, MAX_THREADS_PER_BLOCK
            )));
        }
        Ok(KernelAbi {
            name: f.name.clone(),
            params,
            static_shared_bytes,
            max_threads: f.max_threads,
            features: features(f),
        })
    }
}

/// Scalars with a host representation (see [`crate::Arg`]).
fn passable_scalar(s: Scalar) -> bool {
    s.is_int() || s.is_float()
}

fn features(f: &Function) -> Vec<String> {
    let mut set = BTreeSet::new();
    f.walk(&mut |inst| {
        let name = match &inst.op {
            Op::Mma { .. } => "mma.sync",
            Op::Wgmma { .. } | Op::WgmmaFence | Op::WgmmaCommit | Op::WgmmaWait { .. } => "wgmma",
            Op::MbarrierInit { .. }
            | Op::MbarrierArrive { .. }
            | Op::MbarrierWait { .. }
            | Op::CpAsyncMbarrierArrive { .. } => "mbarrier",
            Op::LdMatrix { .. } => "ldmatrix",
            Op::CpAsync { .. } | Op::CpAsyncCommit | Op::CpAsyncWait { .. } => "cp.async",
            Op::DivApprox { .. } => "approx",
            Op::Un { op, .. } if UnOp::is_approx(*op) => "approx",
            Op::Redux { .. } => "redux.sync",
            _ => return,
        };
        set.insert(name.to_string());
    });
    set.into_iter().collect()
}
