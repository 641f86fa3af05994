//! Launch checks shared by every backend, run before anything reaches a device:
//! argument count and types against the kernel's ABI, pointer arguments against live
//! allocations, and the launch shape against the kernel's and the device's limits.

use crate::abi::{KernelAbi, ParamKind};
use crate::alloc_table::Allocations;
use crate::error::RtError;
use crate::executor::{Arg, Launch};

/// Limits of the device a launch goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    pub max_threads_per_block: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
    /// Static plus dynamic shared memory per block, with the opt-in attribute set.
    pub max_shared_per_block: u64,
}

impl DeviceLimits {
    /// sm_90 (H100/H200).
    pub const SM90: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block: [1024, 1024, 64],
        max_grid: [(1 << 31) - 1, 65535, 65535],
        max_shared_per_block: 227 * 1024,
    };
}

pub(crate) fn check_launch(
    abi: &KernelAbi,
    launch: &Launch,
    args: &[Arg],
    limits: &DeviceLimits,
    allocs: &Allocations,
) -> Result<(), RtError> {
    check_args(abi, args, allocs)?;
    check_shape(abi, launch, limits)
}

fn check_args(abi: &KernelAbi, args: &[Arg], allocs: &Allocations) -> Result<(), RtError> {
    if args.len() != abi.params.len() {
        return Err(RtError::ArgCount {
            kernel: abi.name.clone(),
            expected: abi.params.len(),
            given: args.len(),
        });
    }
    for (index, (param, arg)) in abi.params.iter().zip(args).enumerate() {
        let matches = match (&param.kind, arg) {
            (ParamKind::Ptr { .. }, Arg::Ptr(_)) => true,
            (ParamKind::Scalar(name), a) => a.scalar_name() == Some(name.as_str()),
            _ => false,
        };
        if !matches {
            return Err(RtError::ArgType {
                kernel: abi.name.clone(),
                index,
                param: param.name.clone(),
                expected: param.kind.describe(),
                given: arg.describe(),
            });
        }
        // A null pointer is a legitimate "no buffer"; any other address must lie in
        // (or one past the end of) a live allocation.
        if let Arg::Ptr(p) = arg {
            if p.0 != 0 && !allocs.contains_addr(p.0) {
                return Err(RtError::Memory {
                    message: format!(
                        "kernel `{}` argument {index} (`{}`) is {:#x}, which is not inside any live allocation",
                        abi.name, param.name, p.0
                    ),
                });
            }
        }
    }
    Ok(())
}

fn check_shape(abi: &KernelAbi, l: &Launch, limits: &DeviceLimits) -> Result<(), RtError> {
    let refuse = |message: String| {
        Err(RtError::LaunchShape {
            kernel: abi.name.clone(),
            message,
        })
    };
    const AXES: [char; 3] = ['x', 'y', 'z'];
    for (i, axis) in AXES.iter().enumerate() {
        if l.grid[i] == 0 || l.block[i] == 0 {
            return refuse(format!(
                "grid {:?} and block {:?} must be at least 1 in every dimension",
                l.grid, l.block
            ));
        }
        if l.grid[i] > limits.max_grid[i] {
            return refuse(format!(
                "grid.{axis} = {} exceeds the device limit {}",
                l.grid[i], limits.max_grid[i]
            ));
        }
        if l.block[i] > limits.max_block[i] {
            return refuse(format!(
                "block.{axis} = {} exceeds the device limit {}",
                l.block[i], limits.max_block[i]
            ));
        }
    }
    let threads: u64 = l.block.iter().map(|&b| b as u64).product();
    let max = abi.max_threads.min(limits.max_threads_per_block);
    if threads > max as u64 {
        return refuse(format!(
            "block {:?} has {threads} threads; the kernel allows at most {} and the device {}",
            l.block, abi.max_threads, limits.max_threads_per_block
        ));
    }
    let shared = abi.static_shared_bytes + l.dynamic_shared_bytes as u64;
    if shared > limits.max_shared_per_block {
        return refuse(format!(
            "{} bytes of static plus {} bytes of dynamic shared memory exceed the {} bytes a block may use",
            abi.static_shared_bytes, l.dynamic_shared_bytes, limits.max_shared_per_block
        ));
    }
    Ok(())
}
