//! The interpreter backend: the executor contract over `quench_ir::interp`, so that
//! everything above the runtime runs without a GPU. With [`Codegen::Sass`] its kernels
//! run instead as quench's own sm_90 machine code, from their bytes, in the SASS emulator
//! (`quench_sass::emu`) on the same memory: what the machine code computes, checked on
//! any CPU.
//!
//! Every operation completes before it returns, so streams are trivially in order and
//! events read the interpreter's virtual clock. A capture records launches; a replay
//! checks and runs them again.

use quench_ir::interp::{self, Device, LaunchConfig, LaunchStats};
use quench_ir::Function;

use quench_sass::cubin::Cubin;
use quench_sass::emu;
use quench_sass::table::Tables;

use crate::abi::KernelAbi;
use crate::alloc_table::Allocations;
use crate::checks::{check_launch, DeviceLimits};
use crate::codegen::{own_cubin, Codegen};
use crate::error::RtError;
use crate::executor::{Arg, DevicePtr, EventId, Executor, GraphId, KernelId, Launch, StreamId};
use crate::handles::{self, Recorded, Recorder};

struct Loaded {
    f: Function,
    abi: KernelAbi,
    /// quench's own machine code of `f`, run in the emulator instead of `f`.
    sass: Option<emu::Kernel>,
}

pub struct InterpExecutor {
    dev: Device,
    allocs: Allocations,
    kernels: Vec<Loaded>,
    /// Virtual time at which each event was recorded; `None` once released.
    events: Vec<Option<u64>>,
    recorder: Recorder,
    last_stats: Option<LaunchStats>,
    codegen: Codegen,
}

impl Default for InterpExecutor {
    fn default() -> Self {
        InterpExecutor::new()
    }
}

impl InterpExecutor {
    pub fn new() -> InterpExecutor {
        InterpExecutor {
            dev: Device::new(),
            allocs: Allocations::default(),
            kernels: vec![],
            events: vec![],
            recorder: Recorder::new(),
            last_stats: None,
            codegen: Codegen::Ptx,
        }
    }

    /// Whether kernels loaded from now on are interpreted ([`Codegen::Ptx`], the default)
    /// or compiled by quench's code generator and run in the SASS emulator
    /// ([`Codegen::Sass`]; a kernel it cannot compile fails to load).
    pub fn set_codegen(&mut self, codegen: Codegen) {
        self.codegen = codegen;
    }

    /// The interpreted device (its memory and virtual clock).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// What the most recent launch did, in particular whether approximate operations
    /// ran (whose results need an error enclosure rather than equality); `None` after a
    /// launch of machine code.
    pub fn last_launch_stats(&self) -> Option<&LaunchStats> {
        self.last_stats.as_ref()
    }

    fn kernel(&self, k: KernelId) -> Result<&Loaded, RtError> {
        handles::kernel(&self.kernels, k)
    }

    fn event(&self, e: EventId) -> Result<u64, RtError> {
        handles::lookup(&self.events, "event", e.0)
    }

    /// Refuse an operation that cannot be part of a graph while a capture is open.
    fn refuse_during_capture(&self, what: &str) -> Result<(), RtError> {
        self.recorder.refuse_during_capture(what)
    }

    fn run(&mut self, r: &Recorded) -> Result<(), RtError> {
        let loaded = self.kernel(r.kernel)?;
        check_launch(
            &loaded.abi,
            &r.launch,
            &r.args,
            &DeviceLimits::SM90,
            &self.allocs,
        )?;
        let cfg = LaunchConfig {
            grid: r.launch.grid,
            block: r.launch.block,
            dynamic_shared_bytes: r.launch.dynamic_shared_bytes,
        };
        let bits: Vec<u64> = r.args.iter().map(Arg::bits).collect();
        let kernel = r.kernel.0 as usize;
        let f = &self.kernels[kernel].f;
        if let Some(k) = &self.kernels[kernel].sass {
            // The parameter block as the cubin lays it out: each argument's low bytes.
            let mut params = vec![0u8; k.param_bytes];
            for (p, b) in k.params.iter().zip(&bits) {
                let (at, size) = (p.offset as usize, p.size as usize);
                params[at..at + size].copy_from_slice(&b.to_le_bytes()[..size.min(8)]);
            }
            let launch = emu::Launch {
                grid: r.launch.grid,
                block: r.launch.block,
                dynamic_shared_bytes: r.launch.dynamic_shared_bytes,
            };
            let stats =
                emu::run(k, &launch, &params, &mut self.dev.mem).map_err(|e| RtError::Interp {
                    kernel: f.name.clone(),
                    message: format!("quench's machine code in the emulator: {e}"),
                })?;
            self.dev.clock_ns += stats.issued;
            self.last_stats = None;
            return Ok(());
        }
        let stats = interp::launch(f, &cfg, &bits, &mut self.dev).map_err(|e| RtError::Interp {
            kernel: f.name.clone(),
            message: e.to_string(),
        })?;
        self.last_stats = Some(stats);
        Ok(())
    }

    fn mem_err(e: impl std::fmt::Display) -> RtError {
        RtError::InterpMemory {
            message: e.to_string(),
        }
    }
}

impl Executor for InterpExecutor {
    fn backend(&self) -> &'static str {
        "interp"
    }

    fn device_name(&self) -> String {
        match self.codegen {
            Codegen::Ptx => "quench interpreter (sm_90 model)",
            Codegen::Sass => "quench SASS emulator (quench's own sm_90 code)",
        }
        .to_string()
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, RtError> {
        self.refuse_during_capture("allocation")?;
        if bytes == 0 {
            return Err(RtError::Memory {
                message: "cannot allocate 0 bytes".into(),
            });
        }
        let addr = self.dev.mem.alloc(bytes).map_err(Self::mem_err)?;
        self.allocs.insert(addr, bytes);
        Ok(DevicePtr(addr))
    }

    fn free(&mut self, p: DevicePtr) -> Result<(), RtError> {
        self.refuse_during_capture("free")?;
        self.allocs.remove(p.0)?;
        self.dev.mem.free(p.0).map_err(Self::mem_err)
    }

    fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), RtError> {
        self.refuse_during_capture("copy to device")?;
        self.allocs
            .check_range(dst.0, src.len() as u64, "copy to device")?;
        self.dev.mem.write(dst.0, src).map_err(Self::mem_err)
    }

    fn copy_to_host(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RtError> {
        self.refuse_during_capture("copy to host")?;
        self.allocs
            .check_range(src.0, dst.len() as u64, "copy to host")?;
        self.dev.mem.read(src.0, dst).map_err(Self::mem_err)
    }

    fn copy_device_to_device(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(), RtError> {
        self.refuse_during_capture("device-to-device copy")?;
        self.allocs.check_copy(dst.0, src.0, bytes)?;
        let len = usize::try_from(bytes).map_err(|_| RtError::Memory {
            message: format!("copy of {bytes} bytes exceeds host memory"),
        })?;
        let mut staging = vec![0u8; len];
        self.dev
            .mem
            .read(src.0, &mut staging)
            .map_err(Self::mem_err)?;
        self.dev.mem.write(dst.0, &staging).map_err(Self::mem_err)
    }

    fn load(&mut self, f: &Function) -> Result<KernelId, RtError> {
        quench_ir::verify(f)?;
        let abi = KernelAbi::from_function(f)?;
        let sass = match self.codegen {
            Codegen::Ptx => None,
            Codegen::Sass => Some(emulated(f)?),
        };
        self.kernels.push(Loaded {
            f: f.clone(),
            abi,
            sass,
        });
        Ok(KernelId(self.kernels.len() as u32 - 1))
    }

    fn abi(&self, k: KernelId) -> Result<&KernelAbi, RtError> {
        Ok(&self.kernel(k)?.abi)
    }

    fn launch(
        &mut self,
        k: KernelId,
        launch: &Launch,
        args: &[Arg],
        stream: StreamId,
    ) -> Result<(), RtError> {
        let abi = &handles::kernel(&self.kernels, k)?.abi;
        match self
            .recorder
            .launch(abi, &self.allocs, k, launch, args, stream)?
        {
            Some(r) => self.run(&r),
            None => Ok(()),
        }
    }

    fn create_stream(&mut self) -> Result<StreamId, RtError> {
        Ok(self.recorder.create_stream())
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, RtError> {
        self.recorder.check_event_stream(stream)?;
        self.events.push(Some(self.dev.clock_ns));
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn elapsed_ms(&mut self, start: EventId, end: EventId) -> Result<f32, RtError> {
        let (t0, t1) = (self.event(start)?, self.event(end)?);
        Ok(((t1 as f64 - t0 as f64) / 1e6) as f32)
    }

    fn release_event(&mut self, e: EventId) -> Result<(), RtError> {
        self.event(e)?;
        self.events[e.0 as usize] = None;
        Ok(())
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), RtError> {
        self.recorder.begin(stream)
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, RtError> {
        self.recorder.end(stream)
    }

    fn replay(&mut self, g: GraphId, stream: StreamId) -> Result<(), RtError> {
        for r in &self.recorder.replay(g, stream)? {
            self.run(r)?;
        }
        Ok(())
    }

    fn release_graph(&mut self, g: GraphId) -> Result<(), RtError> {
        self.recorder.release(g)
    }

    fn synchronize(&mut self) -> Result<(), RtError> {
        self.refuse_during_capture("synchronize")
    }
}

/// `f` compiled by quench's code generator and decoded for the emulator.
fn emulated(f: &Function) -> Result<emu::Kernel, RtError> {
    let bad = |e: String| RtError::Codegen {
        kernel: f.name.clone(),
        message: format!("kernel {}: {e}", f.name),
    };
    let cubin = own_cubin(f)?;
    let c = Cubin::parse(&cubin).map_err(|e| bad(e.to_string()))?;
    let tables = Tables::sm90().map_err(|e| bad(e.to_string()))?;
    emu::Kernel::from_cubin(&c, &f.name, tables).map_err(|e| bad(e.to_string()))
}
