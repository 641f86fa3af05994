//! Kernels run through a channel, one grid at a time.
//!
//! [`Program::load`] copies the code of every kernel of a cubin into GPU memory (each
//! kernel's `.text` section at a 256-byte boundary, with a page of slack after the last
//! one, which the instruction prefetcher may read). [`Launcher::new`] binds
//! HOPPER_COMPUTE_A to subchannel 1 of a channel and places the shared and local memory
//! windows. [`Launcher::run`] writes a launch's constant bank 0 and QMD into GPU memory,
//! and into host memory a push buffer that starts the grid (`SEND_PCAS_A`) and then, once
//! the grid has finished, releases a semaphore (a host semaphore with `RELEASE_WFI`); it
//! submits that and waits for the semaphore.
//!
//! Not yet: kernels whose code needs relocating (calls to functions in other sections),
//! and kernels with a stack frame (local memory is not set up): both are refused by name.

use std::time::{Duration, Instant};

use quench_sass::cubin::Cubin;

use super::channel::Channel;
use super::error::NativeError;
use super::launch::{KernelLaunch, LaunchAddresses, LaunchDims, LOCAL_WINDOW, SHARED_WINDOW};
use super::memory::{Allocation, Gpu, Placement};
use super::pushbuf::{GpEntry, Level, PcasAction, PushBuffer, HOPPER_COMPUTE_A};
use super::qmd::QMD_ALIGN;
use super::rm::ResourceManager;

/// The subchannel HOPPER_COMPUTE_A is bound to.
const COMPUTE: u32 = 1;
/// Where each kernel's code starts: a multiple of the instruction cache's line.
const CODE_ALIGN: u64 = 256;
/// Slack after the code, which the instruction prefetcher may read past the last kernel.
const CODE_SLACK: u64 = 4096;

/// Layout of a launcher's host memory: the semaphore, then the push buffer.
const SEMAPHORE: u64 = 0;
const PUSH: u64 = 0x100;
const HOST_BYTES: u64 = 0x1000;
/// Layout of its GPU memory: the QMD, then constant bank 0.
const QMD_AT: u64 = 0;
const BANK0_AT: u64 = 0x400;
/// Constant bank 0 holds at most 64 KiB.
const STATE_BYTES: u64 = BANK0_AT + 0x1_0000;

/// The kernels of one cubin, their code in GPU memory.
pub struct Program<'g, R: ResourceManager> {
    cubin: Cubin,
    code: Allocation<'g, R>,
    /// Each kernel's name and the offset of its code in `code`.
    entries: Vec<(String, u64)>,
}

impl<'g, R: ResourceManager> Program<'g, R> {
    /// Parses `cubin` and copies its kernels' code into GPU memory of `gpu`.
    pub fn load(gpu: &'g Gpu<'_, R>, cubin: &[u8]) -> Result<Self, NativeError> {
        let cubin = Cubin::parse(cubin).map_err(|e| NativeError::Cubin(e.to_string()))?;
        let mut entries = vec![];
        let mut end = 0u64;
        for k in &cubin.kernels {
            if !k.relocs.is_empty() {
                return Err(NativeError::Relocations {
                    kernel: k.name.clone(),
                    count: k.relocs.len(),
                });
            }
            let at = end.next_multiple_of(CODE_ALIGN);
            end = at + cubin.text(k).len() as u64;
            entries.push((k.name.clone(), at));
        }
        if entries.is_empty() {
            return Err(NativeError::Cubin("the cubin has no kernels".into()));
        }
        let code = gpu.allocate(end + CODE_SLACK, Placement::Device, true)?;
        for (k, (_, at)) in cubin.kernels.iter().zip(&entries) {
            code.write(*at, cubin.text(k))?;
        }
        Ok(Program {
            cubin,
            code,
            entries,
        })
    }

    /// The GPU address of `kernel`'s first instruction.
    fn entry(&self, kernel: &str) -> Option<u64> {
        self.entries
            .iter()
            .find(|(name, _)| name == kernel)
            .map(|&(_, at)| self.code.gpu_address() + at)
    }
}

/// Runs grids on one channel, one at a time.
pub struct Launcher<'c, 'g, R: ResourceManager> {
    channel: &'c mut Channel<'g, R>,
    /// The semaphore and the push buffer.
    host: Allocation<'g, R>,
    /// The QMD and constant bank 0.
    state: Allocation<'g, R>,
    /// The semaphore's value after the latest submission.
    serial: u64,
}

impl<'c, 'g, R: ResourceManager> Launcher<'c, 'g, R> {
    /// Binds the compute class on `channel` and places the memory windows, waiting up to
    /// `timeout` for the GPU to take them.
    pub fn new(
        gpu: &'g Gpu<'_, R>,
        channel: &'c mut Channel<'g, R>,
        timeout: Duration,
    ) -> Result<Self, NativeError> {
        let host = gpu.allocate(HOST_BYTES, Placement::Host, true)?;
        host.write_u64(SEMAPHORE, 0)?;
        let state = gpu.allocate(STATE_BYTES, Placement::Device, true)?;
        let mut l = Launcher {
            channel,
            host,
            state,
            serial: 0,
        };
        let mut push = PushBuffer::new();
        push.set_object(COMPUTE, HOPPER_COMPUTE_A)?;
        push.shader_windows(COMPUTE, SHARED_WINDOW, LOCAL_WINDOW)?;
        l.submit_and_wait(push, "binding the compute class", timeout)?;
        Ok(l)
    }

    /// Runs `kernel` of `program` over `dims` with the parameter block `params` (laid out
    /// as the cubin records), and waits up to `timeout` for it to finish. Returns the time
    /// from submission to the semaphore, as the CPU saw it.
    pub fn run(
        &mut self,
        program: &Program<'g, R>,
        kernel: &str,
        dims: &LaunchDims,
        params: &[u8],
        timeout: Duration,
    ) -> Result<Duration, NativeError> {
        let launch = KernelLaunch::from_cubin(&program.cubin, kernel, dims, params)?;
        if launch.local_bytes_per_thread > 0 {
            return Err(NativeError::LocalMemory {
                kernel: launch.kernel,
                bytes: launch.local_bytes_per_thread,
            });
        }
        let program_address = program
            .entry(kernel)
            .ok_or_else(|| NativeError::Cubin(format!("no code for kernel {kernel}")))?;
        let at = LaunchAddresses {
            program: program_address,
            constant_buffer0: self.state.gpu_address() + BANK0_AT,
            release: None,
        };
        let qmd = launch.qmd(&at)?;
        self.state.write(QMD_AT, &qmd.to_bytes())?;
        self.state.write(BANK0_AT, &launch.constant_buffer0())?;

        let mut push = PushBuffer::new();
        push.launch(
            COMPUTE,
            self.state.gpu_address() + QMD_AT,
            PcasAction::InvalidateCopySchedule,
        )?;
        let start = Instant::now();
        self.submit_and_wait(push, &format!("kernel {kernel}"), timeout)?;
        Ok(start.elapsed())
    }

    /// Appends the semaphore release to `push`, submits it and waits for the release.
    fn submit_and_wait(
        &mut self,
        mut push: PushBuffer,
        what: &str,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        let serial = self.serial + 1;
        push.semaphore_release(self.host.gpu_address() + SEMAPHORE, serial)?;
        let bytes = push.to_bytes();
        if PUSH + bytes.len() as u64 > HOST_BYTES {
            return Err(NativeError::OutOfBounds {
                what: "a push buffer",
                offset: PUSH,
                length: bytes.len() as u64,
                size: HOST_BYTES,
            });
        }
        self.host.write(PUSH, &bytes)?;
        let entry = GpEntry::new(
            self.host.gpu_address() + PUSH,
            push.words().len(),
            Level::Main,
        )?;
        self.channel.submit(entry)?;
        self.serial = serial;
        let start = Instant::now();
        loop {
            if self.host.read_u64(SEMAPHORE)? == serial {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(NativeError::Timeout {
                    what: what.to_string(),
                    seconds: timeout.as_secs_f64(),
                    gp_get: self.channel.gp_get()?,
                });
            }
            std::hint::spin_loop();
        }
    }
}

const _: () = assert!(QMD_AT.is_multiple_of(QMD_ALIGN) && BANK0_AT.is_multiple_of(64));

#[cfg(test)]
mod tests {
    use super::super::fake::{FakeRm, H200};
    use super::super::memory::tests::DRIVER;
    use super::*;
    use quench_sass::build::{build, KernelDesc, Param};

    /// sm_90's `EXIT` (0x000000000000794d, 0x000fea0003800000) three times over, so the
    /// copy is told apart from zeros.
    fn code() -> Vec<u8> {
        let mut c = vec![];
        for _ in 0..3 {
            c.extend_from_slice(&0x0000_0000_0000_794du64.to_le_bytes());
            c.extend_from_slice(&0x000f_ea00_0380_0000u64.to_le_bytes());
        }
        c
    }

    fn cubin(frame_bytes: u32) -> Vec<u8> {
        build(&KernelDesc {
            name: "probe".into(),
            text: code(),
            params: vec![Param::pointer(), Param::scalar(4)],
            registers: 16,
            shared_bytes: 0,
            frame_bytes,
            barriers: 0,
            exit_offsets: vec![0, 16, 32],
            max_threads: None,
            subroutines: vec![],
        })
        .unwrap()
    }

    #[test]
    fn a_program_is_its_kernels_code_in_gpu_memory() {
        let rm = FakeRm::new(DRIVER, vec![H200]);
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let p = Program::load(&gpu, &cubin(0)).unwrap();
        assert_eq!(p.entry("probe"), Some(p.code.gpu_address()));
        assert_eq!(p.entry("other"), None);
        let mut read = vec![];
        for at in (0..code().len() as u64).step_by(4) {
            read.extend_from_slice(&p.code.read_u32(at).unwrap().to_le_bytes());
        }
        assert_eq!(read, code());
        // The prefetcher's slack past the code is inside the allocation.
        assert!(p.code.size() >= code().len() as u64 + CODE_SLACK);
    }

    #[test]
    fn bad_cubins_are_refused_by_name() {
        let rm = FakeRm::new(DRIVER, vec![H200]);
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let e = Program::load(&gpu, b"not an ELF").err().unwrap();
        assert!(e.to_string().starts_with("cannot load the cubin: "), "{e}");
    }

    #[test]
    fn a_launcher_binds_the_compute_class_and_reports_a_gpu_that_never_answers() {
        let rm = FakeRm::new(DRIVER, vec![H200]);
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let mut channel = Channel::create(&gpu, 64).unwrap();
        let e = Launcher::new(&gpu, &mut channel, Duration::from_millis(20))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("binding the compute class did not finish within 0.02 s"),
            "{e}"
        );
        // One GPFIFO entry was submitted, as long as the binding (2 words), the windows
        // (6) and the semaphore release (6).
        let entry = channel.ring().read_u64(0).unwrap();
        assert_eq!((entry >> 42) & 0x1f_ffff, 14);
        assert_eq!(channel.ring().read_u64(8).unwrap(), 0);
    }

    /// `y[i] = x[i] * 3 + i` for `i < n`: global loads and stores, the parameters, and
    /// `%ntid`/`%nctaid` from constant bank 0.
    fn probe() -> quench_ir::Function {
        use quench_ir::{AddrSpace, Builder, Scalar, Type};
        let ptr = Type::Ptr(AddrSpace::Global, Scalar::U32);
        let mut k = Builder::new("native_probe", 128);
        let x = k.param("x", ptr);
        let y = k.param("y", ptr);
        let n = k.param("n", Type::U32);
        let gid = k.global_id_x();
        let in_range = k.lt(gid, n);
        k.if_then(in_range, |k| {
            let px = k.ptr_add(x, gid);
            let xv = k.load(Type::U32, px);
            let tripled = k.mul_const(xv, 3);
            let v = k.add(tripled, gid);
            let py = k.ptr_add(y, gid);
            k.store(py, v);
        });
        k.finish().unwrap()
    }

    /// The parameter block of `kernel` in `cubin`, each value at the offset the cubin
    /// records for its ordinal.
    fn params(cubin: &[u8], kernel: &str, values: &[&[u8]]) -> Vec<u8> {
        let c = Cubin::parse(cubin).unwrap();
        let k = c.kernels.iter().find(|k| k.name == kernel).unwrap();
        let mut block = vec![0u8; usize::from(k.param_bytes.unwrap())];
        for p in &k.params {
            let v = values[usize::from(p.ordinal)];
            assert_eq!(v.len(), p.size as usize, "parameter {}", p.ordinal);
            let at = usize::from(p.offset);
            block[at..at + v.len()].copy_from_slice(v);
        }
        block
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
    fn on_the_gpu_kernels_run_from_quench_sass_and_from_ptxas() {
        use super::super::version;
        use super::super::DeviceFiles;
        use std::path::Path;

        const N: u32 = 100_003;
        const WAIT: Duration = Duration::from_secs(5);
        let step = |what: &str| eprintln!("native-dispatch: {what}");
        let f = probe();
        let own = quench_sass::codegen::compile_cubin(&f).unwrap();
        let ptx = quench_ptx::emit(&f).unwrap();
        let ptxas = quench_ptx::ptxas::assemble(&ptx, "sm_90").unwrap().cubin;

        let module = version::loaded_module(Path::new(version::PROC_VERSION)).unwrap();
        let rm = DeviceFiles::open(Path::new("/dev")).unwrap();
        let gpu = Gpu::open(&rm, &module.version, 0).unwrap();
        let bytes = u64::from(N) * 4;
        let x = gpu.allocate(bytes, Placement::Device, true).unwrap();
        let y = gpu.allocate(bytes, Placement::Host, true).unwrap();
        let xs: Vec<u32> = (0..N)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5bd1)
            .collect();
        let mut packed = vec![];
        for v in &xs {
            packed.extend_from_slice(&v.to_le_bytes());
        }
        x.write(0, &packed).unwrap();
        let mut channel = Channel::create(&gpu, 1024).unwrap();
        let mut launcher = Launcher::new(&gpu, &mut channel, WAIT).unwrap();
        step("compute class bound, windows placed");

        let block = 128;
        let dims = LaunchDims {
            grid: [N.div_ceil(block), 1, 1],
            block: [block, 1, 1],
            dynamic_shared_bytes: 0,
        };
        for (label, cubin) in [("quench's own SASS", &own), ("ptxas", &ptxas)] {
            for i in 0..u64::from(N) {
                y.write_u32(i * 4, 0xdead_beef).unwrap();
            }
            let program = Program::load(&gpu, cubin).unwrap();
            let block = params(
                cubin,
                "native_probe",
                &[
                    &x.gpu_address().to_le_bytes(),
                    &y.gpu_address().to_le_bytes(),
                    &N.to_le_bytes(),
                ],
            );
            let first = launcher
                .run(&program, "native_probe", &dims, &block, WAIT)
                .unwrap();
            let wrong = (0..N)
                .filter(|&i| {
                    let want = xs[i as usize].wrapping_mul(3).wrapping_add(i);
                    y.read_u32(u64::from(i) * 4).unwrap() != want
                })
                .count();
            assert_eq!(wrong, 0, "{label}: {wrong} of {N} elements wrong");
            let mut times: Vec<Duration> = (0..200)
                .map(|_| {
                    launcher
                        .run(&program, "native_probe", &dims, &block, WAIT)
                        .unwrap()
                })
                .collect();
            times.sort();
            step(&format!(
                "{label}: {N} elements right (first run {first:?}); submit to semaphore, \
                 median of 200 runs {:?}",
                times[100]
            ));
        }
    }
}
