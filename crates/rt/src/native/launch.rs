//! From a cubin's kernel, launch dimensions and parameter bytes to what the QMD of the
//! launch says ([`super::qmd::QmdLaunch`]), refusing by name what Hopper cannot run: a
//! cubin for another SM, a parameter block of another size than the cubin records, a
//! grid, block, shared memory, register or barrier count past Hopper's limits.
//!
//! The cubin is read by `quench-sass` (its `.nv.info` records: parameter block size,
//! registers, barriers, frame size, `.maxntid`; its `.nv.shared.<kernel>` section: static
//! shared memory). Addresses (code, constant bank 0, completion semaphore) are known only
//! once memory is allocated; [`KernelLaunch::qmd`] takes them.

use quench_sass::cubin::{Cubin, Kernel, PARAM_BASE};
use quench_sass::nvinfo;

use super::qmd::{ConstantBuffer, Qmd, QmdError, QmdLaunch, SemaphoreRelease};

/// The SM whose code HOPPER_COMPUTE_A runs.
pub const SM_VERSION: u32 = 90;
/// Threads per block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Block size per dimension.
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// Grid size per dimension.
pub const MAX_GRID: [u32; 3] = [(1 << 31) - 1, 65535, 65535];
/// Shared memory per block, static and dynamic (228 KiB per SM less 1 KiB the hardware
/// reserves per block).
pub const MAX_SHARED_PER_BLOCK: u32 = 227 * 1024;
/// Registers one block may hold (the SM's register file).
pub const MAX_REGISTERS_PER_BLOCK: u32 = 65536;
/// Registers per thread.
pub const MAX_REGISTERS_PER_THREAD: u32 = 255;
/// Named barriers per block.
pub const MAX_BARRIERS: u32 = 16;

/// The grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// Why a kernel cannot be launched as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "the cubin is for sm_{sm}; the native backend launches sm_{SM_VERSION} code \
         (HOPPER_COMPUTE_A)"
    )]
    Architecture { sm: u32 },
    #[error("the cubin has no kernel {kernel}; it has: {available}")]
    NoKernel { kernel: String, available: String },
    #[error("kernel {kernel}: the cubin has no {record} record")]
    MissingRecord {
        kernel: String,
        record: &'static str,
    },
    #[error("kernel {kernel} takes {expected} bytes of parameters, but {given} were given")]
    Parameters {
        kernel: String,
        expected: usize,
        given: usize,
    },
    #[error("block {block:?} of kernel {kernel}: {why}")]
    Block {
        kernel: String,
        block: [u32; 3],
        why: String,
    },
    #[error("grid {grid:?} of kernel {kernel}: {why}")]
    Grid {
        kernel: String,
        grid: [u32; 3],
        why: String,
    },
    #[error(
        "kernel {kernel}: {static_bytes} bytes of static and {dynamic_bytes} of dynamic \
         shared memory exceed Hopper's {MAX_SHARED_PER_BLOCK} per block"
    )]
    SharedMemory {
        kernel: String,
        static_bytes: u64,
        dynamic_bytes: u32,
    },
    #[error(
        "kernel {kernel}: {registers} registers per thread for {threads} threads exceed \
         the {MAX_REGISTERS_PER_BLOCK} registers of an SM"
    )]
    Registers {
        kernel: String,
        registers: u32,
        threads: u32,
    },
    #[error("kernel {kernel} uses {barriers} barriers; a block has {MAX_BARRIERS}")]
    Barriers { kernel: String, barriers: u32 },
}

/// A kernel launch checked against Hopper's limits: what its QMD will say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Static and dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    pub registers: u32,
    pub barriers: u32,
    /// The kernel's stack frame per thread, bytes.
    pub local_bytes_per_thread: u32,
    /// The parameter block, which lies in constant bank 0 from [`PARAM_BASE`] on.
    pub params: Vec<u8>,
}

/// Where generic addresses reach shared memory (`SET_SHADER_SHARED_MEMORY_WINDOW`, and
/// bank 0 at 0x18 for the code): far above anything the address space hands out, below
/// the window methods' 49 bits.
pub const SHARED_WINDOW: u64 = 0x7e00_0000_0000;
/// Where generic addresses reach local memory (`SET_SHADER_LOCAL_MEMORY_WINDOW`, bank 0
/// at 0x20).
pub const LOCAL_WINDOW: u64 = 0x7f00_0000_0000;
/// The stack pointer's first value, which compiled code loads from bank 0 at 0x28 into
/// R1: the top of a thread's local memory window less what the hardware keeps there.
pub const STACK_TOP: u64 = 0x00ff_fdc0;

/// Bytes above the stack top in each thread's local memory, which the hardware keeps.
pub const STACK_RESERVED: u32 = 0x0100_0000 - STACK_TOP as u32;

/// Local memory per thread that a stack frame of `frame` bytes needs: the frame below the
/// stack top and what lies above it, in 32-byte units; none without a frame.
pub fn stack_bytes(frame: u32) -> u32 {
    if frame == 0 {
        0
    } else {
        (frame + STACK_RESERVED).next_multiple_of(32)
    }
}

/// Byte offsets of the launch state in constant bank 0, as compiled code reads it:
/// `%ntid` at 0x0, `%nctaid` at 0xc (a word per dimension), the windows and stack top.
mod bank0 {
    pub const NTID: usize = 0x0;
    pub const NCTAID: usize = 0xc;
    pub const SHARED_WINDOW: usize = 0x18;
    pub const LOCAL_WINDOW: usize = 0x20;
    pub const STACK_TOP: usize = 0x28;
}

/// Where a launch's pieces lie in the GPU's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchAddresses {
    /// The kernel's first instruction.
    pub program: u64,
    /// Constant bank 0: the launch state, then the parameters at [`PARAM_BASE`].
    pub constant_buffer0: u64,
    /// The semaphore the GPU writes when the grid completes.
    pub release: Option<SemaphoreRelease>,
}

/// The `sm_NN` a cubin's code is for: the ELF header's flags carry it in bits 15:8.
pub fn cubin_sm(cubin: &Cubin) -> u32 {
    (cubin.elf.flags >> 8) & 0xff
}

/// The size of the parameter block the cubin records for `k`
/// (`EIATTR_CBANK_PARAM_SIZE`, else the end of the last `EIATTR_KPARAM_INFO`).
fn param_bytes(k: &Kernel) -> usize {
    match k.param_bytes {
        Some(n) => usize::from(n),
        None => k
            .params
            .iter()
            .map(|p| usize::from(p.offset) + p.size as usize)
            .max()
            .unwrap_or(0),
    }
}

/// The block size `.maxntid` declares (`EIATTR_MAX_THREADS`), if any.
fn declared_max_threads(k: &Kernel) -> Option<[u32; 3]> {
    let a = k
        .info
        .iter()
        .find(|a| a.attr == nvinfo::EIATTR_MAX_THREADS)?;
    Some([a.u32_at(0)?, a.u32_at(1)?, a.u32_at(2)?])
}

impl KernelLaunch {
    /// The launch of kernel `name` of `cubin` with `dims` and the parameter block
    /// `params`, or what makes it impossible.
    pub fn from_cubin(
        cubin: &Cubin,
        name: &str,
        dims: &LaunchDims,
        params: &[u8],
    ) -> Result<KernelLaunch, LaunchError> {
        let sm = cubin_sm(cubin);
        if sm != SM_VERSION {
            return Err(LaunchError::Architecture { sm });
        }
        let k = cubin
            .kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| LaunchError::NoKernel {
                kernel: name.to_string(),
                available: cubin
                    .kernels
                    .iter()
                    .map(|k| k.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let kernel = k.name.clone();

        let expected = param_bytes(k);
        if params.len() != expected {
            return Err(LaunchError::Parameters {
                kernel,
                expected,
                given: params.len(),
            });
        }

        let block = dims.block;
        let block_err = |why: String| LaunchError::Block {
            kernel: kernel.clone(),
            block,
            why,
        };
        if block.contains(&0) {
            return Err(block_err(
                "every dimension needs at least one thread".into(),
            ));
        }
        for (d, (&n, &max)) in block.iter().zip(&MAX_BLOCK).enumerate() {
            if n > max {
                return Err(block_err(format!(
                    "{} threads in {} exceed Hopper's {max}",
                    n,
                    ["x", "y", "z"][d]
                )));
            }
        }
        let threads = block.iter().map(|&n| u64::from(n)).product::<u64>();
        if threads > u64::from(MAX_THREADS_PER_BLOCK) {
            return Err(block_err(format!(
                "{threads} threads exceed Hopper's {MAX_THREADS_PER_BLOCK} per block"
            )));
        }
        let threads = threads as u32;
        if let Some(max) = declared_max_threads(k) {
            let declared = max.iter().map(|&n| u64::from(n)).product::<u64>();
            if u64::from(threads) > declared {
                return Err(block_err(format!(
                    "{threads} threads exceed the {declared} the kernel declares \
                     (.maxntid {max:?})"
                )));
            }
        }

        let grid = dims.grid;
        let grid_err = |why: String| LaunchError::Grid {
            kernel: kernel.clone(),
            grid,
            why,
        };
        if grid.contains(&0) {
            return Err(grid_err("every dimension needs at least one block".into()));
        }
        for (d, (&n, &max)) in grid.iter().zip(&MAX_GRID).enumerate() {
            if n > max {
                return Err(grid_err(format!(
                    "{} blocks in {} exceed Hopper's {max}",
                    n,
                    ["x", "y", "z"][d]
                )));
            }
        }

        let shared = k.shared_bytes + u64::from(dims.dynamic_shared_bytes);
        if shared > u64::from(MAX_SHARED_PER_BLOCK) {
            return Err(LaunchError::SharedMemory {
                kernel,
                static_bytes: k.shared_bytes,
                dynamic_bytes: dims.dynamic_shared_bytes,
            });
        }

        let registers = k.registers.ok_or_else(|| LaunchError::MissingRecord {
            kernel: kernel.clone(),
            record: "EIATTR_REGCOUNT",
        })?;
        // Registers are allocated per warp, 8 per thread at a time.
        let warps = threads.div_ceil(32);
        let per_block = u64::from(registers).next_multiple_of(8) * u64::from(warps) * 32;
        if registers > MAX_REGISTERS_PER_THREAD || per_block > u64::from(MAX_REGISTERS_PER_BLOCK) {
            return Err(LaunchError::Registers {
                kernel,
                registers,
                threads,
            });
        }

        let barriers = u32::from(k.barriers.unwrap_or(0));
        if barriers > MAX_BARRIERS {
            return Err(LaunchError::Barriers { kernel, barriers });
        }

        Ok(KernelLaunch {
            kernel,
            grid,
            block,
            shared_bytes: shared as u32,
            registers,
            barriers,
            local_bytes_per_thread: k.frame_size.unwrap_or(0),
            params: params.to_vec(),
        })
    }

    /// The size of constant bank 0: the launch state below [`PARAM_BASE`] and the
    /// parameters, in the 16-byte units the QMD counts.
    pub fn constant_buffer0_size(&self) -> u32 {
        (PARAM_BASE as usize + self.params.len()).next_multiple_of(16) as u32
    }

    /// Constant bank 0 of this launch, [`KernelLaunch::constant_buffer0_size`] bytes:
    /// the block and grid sizes, the shared and local windows and the stack top, and the
    /// parameters from [`PARAM_BASE`] on. Everything else is zero (the global memory
    /// descriptor at 0x208 among it: the default access policy).
    pub fn constant_buffer0(&self) -> Vec<u8> {
        let mut bank = vec![0u8; self.constant_buffer0_size() as usize];
        let mut put = |at: usize, bytes: &[u8]| bank[at..at + bytes.len()].copy_from_slice(bytes);
        for d in 0..3 {
            put(bank0::NTID + 4 * d, &self.block[d].to_le_bytes());
            put(bank0::NCTAID + 4 * d, &self.grid[d].to_le_bytes());
        }
        put(bank0::SHARED_WINDOW, &SHARED_WINDOW.to_le_bytes());
        put(bank0::LOCAL_WINDOW, &LOCAL_WINDOW.to_le_bytes());
        put(bank0::STACK_TOP, &STACK_TOP.to_le_bytes());
        put(PARAM_BASE as usize, &self.params);
        bank
    }

    /// What the QMD says about this launch, once its pieces have addresses.
    pub fn qmd_launch(&self, at: &LaunchAddresses) -> QmdLaunch {
        QmdLaunch {
            grid: self.grid,
            block: self.block,
            shared_bytes: self.shared_bytes,
            registers: self.registers,
            barriers: self.barriers,
            stack_bytes_per_thread: stack_bytes(self.local_bytes_per_thread),
            program_address: at.program,
            constant_buffer0: ConstantBuffer {
                address: at.constant_buffer0,
                size: self.constant_buffer0_size(),
            },
            release: at.release,
            next: None,
            invalidate_caches: true,
            invalidate_code: true,
            program_bytes: 0,
        }
    }

    /// The QMD of this launch.
    pub fn qmd(&self, at: &LaunchAddresses) -> Result<Qmd, QmdError> {
        self.qmd_launch(at).pack()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::native::qmd::field;
    use quench_sass::build::{build, KernelDesc, Param};

    /// sm_90's `EXIT` as nvdisasm lists it (0x000000000000794d, 0x000fea0003800000): the
    /// code does not matter to the launch description, but it is a real kernel.
    fn exit() -> Vec<u8> {
        let mut code = 0x0000_0000_0000_794du64.to_le_bytes().to_vec();
        code.extend_from_slice(&0x000f_ea00_0380_0000u64.to_le_bytes());
        code
    }

    pub(crate) fn desc() -> KernelDesc {
        KernelDesc {
            name: "scale".into(),
            text: exit(),
            params: vec![Param::pointer(), Param::scalar(4)],
            registers: 24,
            shared_bytes: 4096,
            frame_bytes: 0,
            barriers: 1,
            exit_offsets: vec![0],
            max_threads: None,
            subroutines: vec![],
        }
    }

    /// The cubin quench's own cubin writer makes for `d`, read back as a launch would.
    fn cubin(d: &KernelDesc) -> Cubin {
        Cubin::parse(&build(d).unwrap()).unwrap()
    }

    fn dims() -> LaunchDims {
        LaunchDims {
            grid: [100, 2, 1],
            block: [256, 1, 1],
            dynamic_shared_bytes: 1000,
        }
    }

    #[test]
    fn a_cubin_kernel_becomes_qmd_fields() {
        let c = cubin(&desc());
        assert_eq!(cubin_sm(&c), 90);
        // A pointer at 0 and a u32 at 8: 12 bytes.
        assert_eq!(c.kernels[0].param_bytes, Some(12));
        let l = KernelLaunch::from_cubin(&c, "scale", &dims(), &[7; 12]).unwrap();
        assert_eq!(
            l,
            KernelLaunch {
                kernel: "scale".into(),
                grid: [100, 2, 1],
                block: [256, 1, 1],
                shared_bytes: 5096,
                registers: 24,
                barriers: 1,
                local_bytes_per_thread: 0,
                params: vec![7; 12],
            }
        );
        // 0x210 bytes of launch state and 12 of parameters, in 16-byte units.
        assert_eq!(l.constant_buffer0_size(), 0x220);
        let at = LaunchAddresses {
            program: 0x7f00_0000_0000,
            constant_buffer0: 0x7f00_0001_0000,
            release: Some(SemaphoreRelease {
                address: 0x7f00_0002_0000,
                payload: 1,
            }),
        };
        let q = l.qmd(&at).unwrap();
        assert_eq!(q.get(field::GRID_WIDTH), 100);
        assert_eq!(q.get(field::GRID_HEIGHT), 2);
        assert_eq!(q.get(field::CTA_THREAD_DIMENSION0), 256);
        assert_eq!(q.get(field::REGISTER_COUNT), 24);
        assert_eq!(q.get(field::BARRIER_COUNT), 1);
        assert_eq!(q.get(field::SHARED_MEMORY_SIZE), 5120);
        assert_eq!(q.get(field::CONSTANT_BUFFER0_SIZE_SHIFTED4), 0x22);
        assert_eq!(q.get(field::PROGRAM_ADDRESS_UPPER), 0x7f00);
        assert_eq!(q.get(field::RELEASE0_ENABLE), 1);
    }

    #[test]
    fn constant_bank0_holds_the_launch_state_and_the_parameters() {
        let params: Vec<u8> = (1..=12).collect();
        let l = KernelLaunch::from_cubin(&cubin(&desc()), "scale", &dims(), &params).unwrap();
        let bank = l.constant_buffer0();
        assert_eq!(bank.len(), 0x220);
        let word = |at: usize| u32::from_le_bytes(bank[at..at + 4].try_into().unwrap());
        let dword = |at: usize| u64::from_le_bytes(bank[at..at + 8].try_into().unwrap());
        // %ntid.x/y/z, then %nctaid.x/y/z.
        assert_eq!([word(0), word(4), word(8)], [256, 1, 1]);
        assert_eq!([word(0xc), word(0x10), word(0x14)], [100, 2, 1]);
        assert_eq!(dword(0x18), SHARED_WINDOW);
        assert_eq!(dword(0x20), LOCAL_WINDOW);
        assert_eq!(dword(0x28), 0xfffdc0);
        assert_eq!(&bank[0x210..0x21c], &params[..]);
        // Nothing else is set: the rest of the state, the descriptor at 0x208, the tail.
        let set = [0..0x30, 0x210..0x21c];
        for (i, b) in bank.iter().enumerate() {
            if !set.iter().any(|r| r.contains(&i)) {
                assert_eq!(*b, 0, "byte {i:#x}");
            }
        }
    }

    fn refused(d: &KernelDesc, dims: &LaunchDims, params: usize) -> String {
        KernelLaunch::from_cubin(&cubin(d), "scale", dims, &vec![0; params])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_parameter_block_of_another_size_is_refused() {
        let e = refused(&desc(), &dims(), 16);
        assert_eq!(
            e,
            "kernel scale takes 12 bytes of parameters, but 16 were given"
        );
        assert!(refused(&desc(), &dims(), 8).contains("12 bytes"));
    }

    #[test]
    fn blocks_past_hopper_limits_are_refused() {
        let with = |block| LaunchDims { block, ..dims() };
        let e = refused(&desc(), &with([1025, 1, 1]), 12);
        assert!(e.contains("1025 threads in x exceed Hopper's 1024"), "{e}");
        let e = refused(&desc(), &with([32, 32, 2]), 12);
        assert!(
            e.contains("2048 threads exceed Hopper's 1024 per block"),
            "{e}"
        );
        let e = refused(&desc(), &with([1, 1, 65]), 12);
        assert!(e.contains("65 threads in z exceed Hopper's 64"), "{e}");
        let e = refused(&desc(), &with([0, 1, 1]), 12);
        assert!(e.contains("at least one thread"), "{e}");
        // 1024 threads in three dimensions are fine.
        KernelLaunch::from_cubin(&cubin(&desc()), "scale", &with([16, 16, 4]), &[0; 12]).unwrap();

        let declared = KernelDesc {
            max_threads: Some([64, 1, 1]),
            ..desc()
        };
        let e = refused(&declared, &with([128, 1, 1]), 12);
        assert!(e.contains("the 64 the kernel declares"), "{e}");
    }

    #[test]
    fn grids_past_hopper_limits_are_refused() {
        let with = |grid| LaunchDims { grid, ..dims() };
        let e = refused(&desc(), &with([1 << 31, 1, 1]), 12);
        assert!(
            e.contains("2147483648 blocks in x exceed Hopper's 2147483647"),
            "{e}"
        );
        let e = refused(&desc(), &with([1, 65536, 1]), 12);
        assert!(e.contains("in y exceed Hopper's 65535"), "{e}");
        let e = refused(&desc(), &with([1, 1, 65536]), 12);
        assert!(e.contains("in z exceed"), "{e}");
        KernelLaunch::from_cubin(
            &cubin(&desc()),
            "scale",
            &with([(1 << 31) - 1, 65535, 65535]),
            &[0; 12],
        )
        .unwrap();
    }

    #[test]
    fn shared_memory_past_227_kib_is_refused() {
        let at_limit = LaunchDims {
            dynamic_shared_bytes: 227 * 1024 - 4096,
            ..dims()
        };
        let l = KernelLaunch::from_cubin(&cubin(&desc()), "scale", &at_limit, &[0; 12]).unwrap();
        assert_eq!(l.shared_bytes, 227 * 1024);
        let over = LaunchDims {
            dynamic_shared_bytes: 227 * 1024 - 4095,
            ..dims()
        };
        let e = refused(&desc(), &over, 12);
        assert!(
            e.contains("4096 bytes of static and 228353 of dynamic shared memory"),
            "{e}"
        );
    }

    #[test]
    fn registers_and_barriers_past_the_sm_are_refused() {
        let heavy = KernelDesc {
            registers: 255,
            ..desc()
        };
        let full = LaunchDims {
            block: [1024, 1, 1],
            ..dims()
        };
        let e = refused(&heavy, &full, 12);
        assert!(
            e.contains("255 registers per thread for 1024 threads"),
            "{e}"
        );
        // 64 registers for 1024 threads fill the register file exactly.
        let fits = KernelDesc {
            registers: 64,
            ..desc()
        };
        KernelLaunch::from_cubin(&cubin(&fits), "scale", &full, &[0; 12]).unwrap();

        // quench's writer refuses such a count; another cubin may carry one.
        let mut absurd = cubin(&desc());
        absurd.kernels[0].registers = Some(u32::MAX);
        let e = KernelLaunch::from_cubin(&absurd, "scale", &dims(), &[0; 12]).unwrap_err();
        assert!(
            e.to_string().contains("4294967295 registers per thread"),
            "{e}"
        );
        absurd.kernels[0].registers = None;
        let e = KernelLaunch::from_cubin(&absurd, "scale", &dims(), &[0; 12]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel scale: the cubin has no EIATTR_REGCOUNT record"
        );

        let barriers = KernelDesc {
            barriers: 17,
            ..desc()
        };
        let e = refused(&barriers, &dims(), 12);
        assert!(e.contains("uses 17 barriers"), "{e}");
    }

    #[test]
    fn a_cubin_for_another_sm_is_refused() {
        let mut c = cubin(&desc());
        // sm_80 in bits 15:8 of e_flags.
        c.elf.flags = (c.elf.flags & !0xff00) | (80 << 8);
        let c = Cubin::parse(&c.write().unwrap()).unwrap();
        let e = KernelLaunch::from_cubin(&c, "scale", &dims(), &[0; 12]).unwrap_err();
        assert_eq!(e, LaunchError::Architecture { sm: 80 });
        assert!(e.to_string().starts_with("the cubin is for sm_80"), "{e}");
    }

    #[test]
    fn an_unknown_kernel_is_refused_with_the_ones_there_are() {
        let e = KernelLaunch::from_cubin(&cubin(&desc()), "scal", &dims(), &[0; 12])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "the cubin has no kernel scal; it has: scale");
    }
}
