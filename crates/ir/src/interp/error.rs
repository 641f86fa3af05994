//! What can go wrong when the interpreter runs a kernel, each case named with where it
//! happened.

use std::fmt;

/// Where in a launch something happened: kernel, block, warp, thread (when one thread
/// is to blame) and instruction (numbered in program order, depth first, from 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub kernel: String,
    pub block: [u32; 3],
    pub warp: u32,
    pub thread: Option<[u32; 3]>,
    pub inst: u32,
    /// The instruction's mnemonic with its types, e.g. `ld.shared.f32`.
    pub op: String,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [bx, by, bz] = self.block;
        write!(
            f,
            "kernel `{}`, block ({bx},{by},{bz}), warp {}",
            self.kernel, self.warp
        )?;
        if let Some([x, y, z]) = self.thread {
            write!(f, ", thread ({x},{y},{z})")?;
        }
        write!(f, ", instruction #{} `{}`", self.inst, self.op)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    // ---- device memory, from the host side ------------------------------------------
    #[error("device memory: cannot allocate {bytes} bytes")]
    OutOfMemory { bytes: u64 },
    #[error("device memory: {addr:#x} is not the start of a live allocation ({detail})")]
    BadFree { addr: u64, detail: String },
    #[error(
        "device memory: host access of {bytes} bytes at {addr:#x} is out of bounds ({detail})"
    )]
    HostOutOfBounds {
        addr: u64,
        bytes: u64,
        detail: String,
    },

    // ---- launch -------------------------------------------------------------------------
    #[error("kernel `{kernel}` takes {expected} arguments, the launch passed {got}")]
    ArgCount {
        kernel: String,
        expected: usize,
        got: usize,
    },
    #[error("kernel `{kernel}`: argument {index} (`{name}`, {ty}) {problem}")]
    BadArg {
        kernel: String,
        index: usize,
        name: String,
        ty: String,
        problem: String,
    },
    #[error("kernel `{kernel}`: invalid launch: {problem}")]
    LaunchShape { kernel: String, problem: String },
    #[error("kernel `{kernel}` is malformed: {problem}")]
    Malformed { kernel: String, problem: String },
    #[error(
        "the sm_90 fragment layouts of mma and ldmatrix have not been measured yet \
         (isa/sm90/mma_layout.json is a placeholder): kernels using them cannot be interpreted"
    )]
    LayoutNotMeasured,
    #[error("fragment layout table: {0}")]
    Layout(String),

    // ---- during execution ---------------------------------------------------------------
    #[error("{site}: {bytes}-byte global access at {addr:#x} is out of bounds ({detail})")]
    GlobalOutOfBounds {
        site: Box<Site>,
        addr: u64,
        bytes: u64,
        detail: String,
    },
    #[error("{site}: {bytes}-byte shared access at offset {offset:#x} is outside {region}")]
    SharedOutOfBounds {
        site: Box<Site>,
        offset: u64,
        bytes: u64,
        region: String,
    },
    #[error("{site}: {bytes}-byte {space} access at {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        site: Box<Site>,
        space: &'static str,
        addr: u64,
        bytes: u64,
        align: u64,
    },
    #[error("{site}: local memory is not supported by the interpreter")]
    LocalMemory { site: Box<Site> },
    #[error(
        "{site}: barrier reached by lanes {arrived:#010x} of the warp while lanes \
         {missing:#010x} have not exited and are elsewhere (barrier under divergent control flow)"
    )]
    BarrierDivergence {
        site: Box<Site>,
        arrived: u32,
        missing: u32,
    },
    #[error("{site}: member mask {mask:#010x} of lane {lane} leaves out lanes executing it together ({active:#010x})")]
    CollectiveMask {
        site: Box<Site>,
        lane: u32,
        mask: u32,
        active: u32,
    },
    #[error("{site}: lane {lane} reads lane {src}, which is not executing the shuffle")]
    ShuffleInactiveSource {
        site: Box<Site>,
        lane: u32,
        src: u32,
    },
    #[error(
        "{site}: needs all 32 lanes of the warp converged, only lanes {active:#010x} execute it"
    )]
    NotConverged { site: Box<Site>, active: u32 },
    #[error("{site}: not supported by the interpreter: {what}")]
    Unsupported { site: Box<Site>, what: String },
    #[error("{site}: malformed: {what}")]
    BadInst { site: Box<Site>, what: String },
    #[error(
        "kernel `{kernel}`, block {block:?}: deadlock: warps {waiting:?} wait on mbarriers \
         that no other warp can complete (the rest have ended or wait at a barrier)"
    )]
    Deadlock {
        kernel: String,
        block: [u32; 3],
        waiting: Vec<u32>,
    },
}
