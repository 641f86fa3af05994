//! What the integration tests share: the seed, and an instrumented kernel whose output
//! and records are known for any grid and block shape.
#![allow(dead_code)] // each test binary uses its own part

use quench_ir::{AddrSpace, Builder, Function, Scalar, Special, Type};
use quench_prof::{instrument, LANES};
use quench_rt::{Arg, DevicePtr, Executor, InterpExecutor, Launch, StreamId};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The seed of a test's random inputs, printed (`QUENCH_SEED` replays one).
pub use quench_testkit::seed;

/// `out[i] = b ^ c` and `times[i] = (%globaltimer at the start of the body, at its end)`
/// for thread `i = b · threads + t`: `t` the linear thread index within the block (of
/// `threads`) and `b` the linear block index.
fn grid_kernel() -> Function {
    let mut k = Builder::new("grid_ids", 64);
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::U32));
    let times = k.param("times", Type::Ptr(AddrSpace::Global, Scalar::U64));
    let c = k.param("c", Type::U32);
    let began = k.special(Special::GlobalTimer);
    // `x + nx·(y + ny·z)` of the ids `xyz` in a space of extents `n`.
    let linear = |k: &mut Builder, xyz: [Special; 3], n: [Special; 2]| {
        let [x, y, z] = xyz.map(|s| k.special(s));
        let [nx, ny] = n.map(|s| k.special(s));
        let nyz = k.mul(ny, z);
        let yz = k.add(y, nyz);
        let nxyz = k.mul(nx, yz);
        k.add(x, nxyz)
    };
    let b = linear(
        &mut k,
        [Special::CtaidX, Special::CtaidY, Special::CtaidZ],
        [Special::NctaidX, Special::NctaidY],
    );
    let t = linear(
        &mut k,
        [Special::TidX, Special::TidY, Special::TidZ],
        [Special::NtidX, Special::NtidY],
    );
    let [nx, ny, nz] = [Special::NtidX, Special::NtidY, Special::NtidZ].map(|s| k.special(s));
    let nxy = k.mul(nx, ny);
    let threads = k.mul(nxy, nz);
    let row = k.mul(b, threads);
    let i = k.add(row, t);
    let at = k.ptr_add(out, i);
    let v = k.xor(b, c);
    k.store(at, v);
    let two = k.const_u32(2);
    let pair = k.mul(i, two);
    let at = k.ptr_add(times, pair);
    k.store(at, began);
    let one = k.const_u32(1);
    let second = k.add(pair, one);
    let at = k.ptr_add(times, second);
    let ended = k.special(Special::GlobalTimer);
    k.store(at, ended);
    k.finish().expect("verifies")
}

/// Launches of the instrumented [`grid_kernel`] over `grid` in blocks of `block`, each
/// with its outputs poisoned first and checked after.
pub struct GridRun {
    kernel: quench_rt::KernelId,
    grid: [u32; 3],
    pub block: [u32; 3],
    out: DevicePtr,
    times: DevicePtr,
    c: u32,
}

/// When the threads of a launch ran their body, by the interpreter's clock.
pub struct BodyTimes {
    /// The earliest start of the body in block 0.
    pub block0_began: u64,
    /// The latest end of the body in any block.
    pub last_ended: u64,
}

impl GridRun {
    pub fn new(exec: &mut InterpExecutor, grid: [u32; 3], block: [u32; 3], c: u32) -> GridRun {
        let kernel = exec
            .load(&instrument(&grid_kernel()).expect("instrumented"))
            .expect("loads");
        let threads = grid.iter().product::<u32>() * block.iter().product::<u32>();
        let out = exec.alloc(4 * threads as u64).expect("alloc");
        let times = exec.alloc(16 * threads as u64).expect("alloc");
        GridRun {
            kernel,
            grid,
            block,
            out,
            times,
            c,
        }
    }

    /// A grid and block of up to 64 threads, both of random shape.
    pub fn random(exec: &mut InterpExecutor, rng: &mut ChaCha8Rng, grid: [u32; 3]) -> GridRun {
        let block = [
            rng.gen_range(1..=16),
            rng.gen_range(1..=2),
            rng.gen_range(1..=2),
        ];
        GridRun::new(exec, grid, block, rng.gen())
    }

    pub fn blocks(&self) -> u32 {
        self.grid.iter().product()
    }

    pub fn threads(&self) -> u32 {
        self.block.iter().product()
    }

    /// The most end-time lanes its blocks can raise.
    pub fn most_lanes(&self) -> u32 {
        self.blocks().min(LANES as u32)
    }

    pub fn poison(&self, exec: &mut InterpExecutor) {
        let n = (self.blocks() * self.threads()) as usize;
        exec.copy_to_device(self.out, &vec![0xA5u8; 4 * n])
            .expect("poison");
        exec.copy_to_device(self.times, &vec![0x5Au8; 16 * n])
            .expect("poison");
    }

    /// Launch without poisoning the outputs first (as while capturing a graph).
    pub fn launch_only(&self, exec: &mut InterpExecutor, slot: &[Arg; 2]) {
        let launch = Launch {
            grid: self.grid,
            block: self.block,
            dynamic_shared_bytes: 0,
        };
        let args = [
            Arg::Ptr(self.out),
            Arg::Ptr(self.times),
            Arg::U32(self.c),
            slot[0],
            slot[1],
        ];
        exec.launch(self.kernel, &launch, &args, StreamId::DEFAULT)
            .expect("launch");
    }

    pub fn launch(&self, exec: &mut InterpExecutor, slot: &[Arg; 2]) {
        self.poison(exec);
        self.launch_only(exec, slot);
    }

    /// Check every element of the output; return when the bodies ran.
    pub fn check_output(&self, exec: &mut InterpExecutor) -> BodyTimes {
        let n = (self.blocks() * self.threads()) as usize;
        let mut bytes = vec![0u8; 4 * n];
        exec.copy_to_host(self.out, &mut bytes).expect("read");
        for (i, w) in bytes.chunks_exact(4).enumerate() {
            let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(got, (i as u32 / self.threads()) ^ self.c, "element {i}");
        }
        let mut bytes = vec![0u8; 16 * n];
        exec.copy_to_host(self.times, &mut bytes).expect("read");
        let times: Vec<(u64, u64)> = bytes
            .chunks_exact(16)
            .map(|w| {
                let word =
                    |at: usize| u64::from_le_bytes(w[at..at + 8].try_into().expect("8 bytes"));
                (word(0), word(8))
            })
            .collect();
        for (i, &(began, ended)) in times.iter().enumerate() {
            assert!(began < ended, "thread {i}: body from {began} to {ended}");
        }
        let threads = self.threads() as usize;
        BodyTimes {
            block0_began: times[..threads].iter().map(|t| t.0).min().expect("threads"),
            last_ended: times.iter().map(|t| t.1).max().expect("threads"),
        }
    }
}

/// Word `plane` of the record whose slot arguments are `slot`, straight from the device.
pub fn word(exec: &mut InterpExecutor, slot: &[Arg; 2], plane: usize) -> u64 {
    let (Arg::Ptr(record), Arg::U32(stride)) = (slot[0], slot[1]) else {
        panic!("slot arguments {slot:?}")
    };
    let mut b = [0u8; 8];
    exec.copy_to_host(record.offset(8 * plane as u64 * stride as u64), &mut b)
        .expect("read");
    u64::from_le_bytes(b)
}
