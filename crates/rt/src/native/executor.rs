//! The executor contract on the native backend: quench's own driver, no libcuda.
//!
//! One channel carries everything, in order: a launch is started without waiting for
//! it, and each grid starts once the one before has finished, so work is in order on
//! every stream; a copy waits for the work before it and for its data, so it comes after
//! all work issued before it, as the contract asks. Memory is the GPU's own, mapped into its address space only; copies go through
//! a staging buffer in host memory on the copy engine. Kernels come from quench's own
//! code generator or from ptxas (`Codegen::Ptx`: there is no driver JIT below libcuda).
//! Events are the GPU's clock (nanoseconds) read through a timestamped semaphore; a graph
//! is written into GPU memory as one push-buffer segment when it is first replayed, and
//! each replay submits that segment whole.

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use quench_ir::Function;
use quench_sass::cubin::Cubin;

use super::controls::PerfBoostParams;
use super::copy_kernel;
use super::dispatch::{CopyTicket, GridLaunch, Launcher, Program};
use super::launch::LaunchDims;
use super::memory::{Allocation, Gpu, Placement, Teardown};
use super::rm::ResourceManager;
use super::segment::Segment;
use super::{query_devices, version, Channel, DeviceFiles, NativeError, DEV_DIR};
use crate::abi::KernelAbi;
use crate::alloc_table::Allocations;
use crate::checks::{check_launch, DeviceLimits};
use crate::codegen::{own_cubin, Codegen};
use crate::error::RtError;
use crate::executor::{Arg, DevicePtr, EventId, Executor, GraphId, KernelId, Launch, StreamId};
use crate::handles::{self, Recorded, Recorder};

/// How long one operation may take on the GPU before it is reported as hung.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Host memory through which copies go, a piece at a time.
const STAGING_BYTES: u64 = 32 << 20;
/// GPFIFO entries of the channel.
const RING_ENTRIES: u32 = 1024;

struct NativeKernel<R: ResourceManager> {
    program: Program<R>,
    abi: KernelAbi,
    /// Where each argument goes in the parameter block: (offset, bytes), by ordinal.
    params: Vec<(usize, usize)>,
    param_bytes: usize,
}

/// The executor over NVIDIA's open kernel module.
pub struct NativeExecutor<R: ResourceManager = DeviceFiles> {
    name: String,
    multiprocessors: u32,
    // Declared before `gpu`: what runs on the GPU goes before the GPU's own objects
    // (each also keeps the GPU open until it has gone).
    launcher: Launcher<R>,
    staging: Allocation<R>,
    memory: BTreeMap<u64, Allocation<R>>,
    kernels: Vec<NativeKernel<R>>,
    gpu: Gpu<R>,
    allocs: Allocations,
    /// The GPU's clock when each event was recorded; `None` once released.
    events: Vec<Option<u64>>,
    recorder: Recorder,
    /// Graphs written as segments, by graph id.
    segments: BTreeMap<u32, Segment<R>>,
    codegen: Codegen,
    /// [`copy_kernel::copy_grains`], loaded by the first copy that runs it.
    copy_kernel: Option<KernelId>,
}

// SAFETY: the executor's resource manager, GPU and allocations are shared (`Rc`) only
// among its own fields and never handed out, so moving the executor to another thread
// moves every reference to them at once; the mappings are the process's, not a thread's.
// `&mut self` keeps calls from overlapping.
unsafe impl Send for NativeExecutor<DeviceFiles> {}

impl NativeExecutor<DeviceFiles> {
    /// Opens GPU `ordinal` through the kernel module's device nodes; an error says what is
    /// missing (module, node, permission, driver version).
    pub fn open(ordinal: u32) -> Result<Self, RtError> {
        let module = version::loaded_module(Path::new(version::PROC_VERSION))?;
        let rm = Rc::new(DeviceFiles::open(Path::new(DEV_DIR))?);
        let devices = query_devices(rm.as_ref(), &module.version)?;
        let info = devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .ok_or(NativeError::NoSuchGpu {
                ordinal: ordinal as usize,
                count: devices.len(),
            })?;
        let (name, multiprocessors) = (info.name.clone(), info.multiprocessors);
        Self::on(
            &rm,
            &module.version,
            ordinal as usize,
            name,
            multiprocessors,
        )
    }
}

impl<R: ResourceManager> NativeExecutor<R> {
    /// The executor on GPU `ordinal` of `rm`, as described by `name` and
    /// `multiprocessors`.
    pub(crate) fn on(
        rm: &Rc<R>,
        driver_version: &str,
        ordinal: usize,
        name: String,
        multiprocessors: u32,
    ) -> Result<Self, RtError> {
        let gpu = Gpu::open(rm, driver_version, ordinal)?;
        // Without this the GPU stays at low clocks for a while for work that reaches it
        // through a channel of its own (SMs measured at 345 MHz where libcuda runs them at
        // 1,980): ask for what CUDA asks for. A driver that refuses leaves the clocks to
        // the GPU's governor, slower to rise but correct, so a refusal is not an error.
        let _ = Teardown::under(&gpu).control(gpu.subdevice(), PerfBoostParams::cuda_max());
        let channel = Channel::create(&gpu, RING_ENTRIES)?;
        let launcher = Launcher::new(&gpu, channel)?;
        let staging = gpu.allocate(STAGING_BYTES, Placement::Host, true)?;
        Ok(NativeExecutor {
            name,
            multiprocessors,
            launcher,
            staging,
            memory: BTreeMap::new(),
            kernels: vec![],
            gpu,
            allocs: Allocations::default(),
            events: vec![],
            recorder: Recorder::new(),
            segments: BTreeMap::new(),
            codegen: Codegen::Ptx,
            copy_kernel: None,
        })
    }

    /// Where kernels' machine code comes from: ptxas (the default) or quench's own code
    /// generator.
    pub fn set_codegen(&mut self, codegen: Codegen) {
        self.codegen = codegen;
    }

    /// The GPU's memory for allocations.
    pub fn heap_bytes(&self) -> u64 {
        self.gpu.heap_bytes()
    }

    fn kernel(&self, k: KernelId) -> Result<&NativeKernel<R>, RtError> {
        handles::kernel(&self.kernels, k)
    }

    /// Copies between the staging buffer and device memory, half a staging buffer at a
    /// time, the halves in turn, so that the CPU fills (or drains) one half while the
    /// copy engine moves the other: `each(staging, at, done, piece)` fills or drains
    /// `piece` bytes at offset `at` of the staging buffer, bytes `done..done + piece` of
    /// the copy.
    fn staged(
        &mut self,
        device: DevicePtr,
        bytes: u64,
        to_device: bool,
        mut each: impl FnMut(&Allocation<R>, u64, u64, u64) -> Result<(), NativeError>,
    ) -> Result<(), RtError> {
        const HALF: u64 = STAGING_BYTES / 2;
        // Each half's copy in flight: its ticket, and where its bytes go in the copy.
        let mut in_flight: [Option<(CopyTicket, u64, u64)>; 2] = [None, None];
        let mut done = 0;
        let mut half = 0;
        while done < bytes {
            let piece = (bytes - done).min(HALF);
            let at = half as u64 * HALF;
            let staging = self.staging.gpu_address() + at;
            // The half's previous copy lands before the half is used again.
            self.land(in_flight[half].take(), at, to_device, &mut each)?;
            let r = if to_device {
                each(&self.staging, at, done, piece)?;
                self.launcher
                    .start_copy(staging, device.0 + done, piece, TIMEOUT)
            } else {
                self.launcher
                    .start_copy(device.0 + done, staging, piece, TIMEOUT)
            };
            in_flight[half] = Some((self.recovering(r)?, done, piece));
            done += piece;
            half ^= 1;
        }
        // The older copy first: `half` is the half the next piece would have used.
        for h in [half, half ^ 1] {
            self.land(in_flight[h].take(), h as u64 * HALF, to_device, &mut each)?;
        }
        Ok(())
    }

    /// Waits for `flight`, a copy through the staging buffer at offset `at` (its ticket
    /// and which bytes of the copy it moves), to land; one to the host is then drained by
    /// `each`, as in [`NativeExecutor::staged`].
    fn land(
        &mut self,
        flight: Option<(CopyTicket, u64, u64)>,
        at: u64,
        to_device: bool,
        each: &mut impl FnMut(&Allocation<R>, u64, u64, u64) -> Result<(), NativeError>,
    ) -> Result<(), RtError> {
        if let Some((ticket, done, piece)) = flight {
            let r = self.launcher.wait_copy(ticket, TIMEOUT);
            self.recovering(r)?;
            if !to_device {
                each(&self.staging, at, done, piece)?;
            }
        }
        Ok(())
    }

    fn run(&mut self, r: &Recorded) -> Result<(), RtError> {
        let l = checked(&self.kernels, &self.allocs, r)?;
        let r = self.launcher.start(&l, TIMEOUT);
        self.recovering(r)
    }

    /// Writes graph `g` as a segment if it has not been yet. Its launches are checked as
    /// they are written (the allocations they name must still live).
    fn write_segment(&mut self, g: GraphId) -> Result<(), RtError> {
        if self.segments.contains_key(&g.0) {
            return Ok(());
        }
        let launches = self
            .recorder
            .graph(g)?
            .iter()
            .map(|r| checked(&self.kernels, &self.allocs, r))
            .collect::<Result<Vec<_>, _>>()?;
        let written = self.launcher.record(&launches, TIMEOUT);
        drop(launches);
        let segment = self.recovering(written)?;
        self.segments.insert(g.0, segment);
        Ok(())
    }
}

impl<R: ResourceManager> NativeExecutor<R> {
    /// `r`, and where it is the GPU stopping the channel on a fault, a new channel and
    /// launcher in the old one's place first (memory, kernels, streams and graphs stay), so
    /// that the executor goes on working after the error.
    fn recovering<T>(&mut self, mut r: Result<T, NativeError>) -> Result<T, RtError> {
        if let Err(NativeError::ChannelFault { kernel, .. }) = &mut r {
            if kernel.is_none() {
                // Stopped inside a graph's segment: the segment knows how far it got.
                if let Ok(serial) = self.launcher.first_unfinished() {
                    *kernel = self
                        .segments
                        .values()
                        .find_map(|s| s.unfinished(serial).ok().flatten());
                }
            }
            let fresh = Channel::create(&self.gpu, RING_ENTRIES)
                .and_then(|channel| Launcher::new(&self.gpu, channel));
            // Where even that fails, the next operation meets the fault and tries again.
            if let Ok(fresh) = fresh {
                self.launcher = fresh;
            }
        }
        Ok(r?)
    }
}

/// `r` checked against its kernel and the live allocations `allocs`: what the launcher
/// needs.
fn checked<'a, R: ResourceManager>(
    kernels: &'a [NativeKernel<R>],
    allocs: &Allocations,
    r: &Recorded,
) -> Result<GridLaunch<'a, R>, RtError> {
    let kernel = handles::kernel(kernels, r.kernel)?;
    check_launch(&kernel.abi, &r.launch, &r.args, &DeviceLimits::SM90, allocs)?;
    let mut params = vec![0u8; kernel.param_bytes];
    for (&(at, size), arg) in kernel.params.iter().zip(&r.args) {
        params[at..at + size].copy_from_slice(&arg.bits().to_le_bytes()[..size]);
    }
    Ok(GridLaunch {
        program: &kernel.program,
        kernel: &kernel.abi.name,
        dims: LaunchDims {
            grid: r.launch.grid,
            block: r.launch.block,
            dynamic_shared_bytes: r.launch.dynamic_shared_bytes,
        },
        params,
    })
}

/// `f` as a cubin: quench's own code, or ptxas's from the PTX.
fn cubin_of(f: &Function, codegen: Codegen) -> Result<Vec<u8>, RtError> {
    match codegen {
        Codegen::Sass => own_cubin(f),
        Codegen::Ptx => {
            let failed = |message: String| RtError::Ptx {
                kernel: f.name.clone(),
                message,
            };
            let ptx = quench_ptx::emit(f).map_err(|e| failed(e.to_string()))?;
            quench_ptx::ptxas::assemble(&ptx, "sm_90")
                .map(|report| report.cubin)
                .map_err(|e| failed(format!("ptxas: {e}")))
        }
    }
}

/// Each parameter's (offset, bytes) in the block, by ordinal, from the cubin's records;
/// and the block's size.
fn parameter_layout(
    cubin: &[u8],
    abi: &KernelAbi,
) -> Result<(Vec<(usize, usize)>, usize), RtError> {
    let bad = |message: String| RtError::Abi {
        kernel: abi.name.clone(),
        message,
    };
    let c = Cubin::parse(cubin).map_err(|e| bad(e.to_string()))?;
    let k = c
        .kernels
        .iter()
        .find(|k| k.name == abi.name)
        .ok_or_else(|| bad("the cubin has no such kernel".into()))?;
    let mut layout = vec![None; abi.params.len()];
    for p in &k.params {
        let slot = layout.get_mut(usize::from(p.ordinal)).ok_or_else(|| {
            bad(format!(
                "the cubin records parameter {} of a kernel with {}",
                p.ordinal,
                abi.params.len()
            ))
        })?;
        if p.size > 8 {
            return Err(bad(format!(
                "parameter {} is {} bytes; arguments are at most 8",
                p.ordinal, p.size
            )));
        }
        *slot = Some((usize::from(p.offset), p.size as usize));
    }
    let layout = layout
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.ok_or_else(|| bad(format!("the cubin records no parameter {i}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = usize::from(k.param_bytes.unwrap_or(0));
    if let Some((at, size)) = layout.iter().find(|(at, size)| at + size > bytes) {
        return Err(bad(format!(
            "a parameter at {at} of {size} bytes lies past the {bytes}-byte block"
        )));
    }
    Ok((layout, bytes))
}

impl<R: ResourceManager> Executor for NativeExecutor<R> {
    fn backend(&self) -> &'static str {
        "native"
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn multiprocessors(&self) -> Option<u32> {
        Some(self.multiprocessors)
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, RtError> {
        self.recorder.refuse_during_capture("allocation")?;
        if bytes == 0 {
            return Err(RtError::Memory {
                message: "cannot allocate 0 bytes".into(),
            });
        }
        let a = self.gpu.allocate(bytes, Placement::Device, false)?;
        let at = a.gpu_address();
        self.memory.insert(at, a);
        self.allocs.insert(at, bytes);
        Ok(DevicePtr(at))
    }

    fn free(&mut self, p: DevicePtr) -> Result<(), RtError> {
        self.recorder.refuse_during_capture("free")?;
        self.allocs.remove(p.0)?;
        // A grid started before may still be using it.
        let r = self.launcher.finish(TIMEOUT);
        self.recovering(r)?;
        self.memory.remove(&p.0);
        Ok(())
    }

    fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), RtError> {
        self.recorder.refuse_during_capture("copy to device")?;
        self.allocs
            .check_range(dst.0, src.len() as u64, "copy to device")?;
        self.staged(dst, src.len() as u64, true, |staging, at, done, piece| {
            staging.write(at, &src[done as usize..(done + piece) as usize])
        })
    }

    fn copy_to_host(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RtError> {
        self.recorder.refuse_during_capture("copy to host")?;
        self.allocs
            .check_range(src.0, dst.len() as u64, "copy to host")?;
        self.staged(src, dst.len() as u64, false, |staging, at, done, piece| {
            staging.read(at, &mut dst[done as usize..(done + piece) as usize])
        })
    }

    fn copy_device_to_device(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(), RtError> {
        self.recorder
            .refuse_during_capture("device-to-device copy")?;
        self.allocs.check_copy(dst.0, src.0, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        if !copy_kernel::fits(dst.0, src.0, bytes) {
            let r = self.launcher.copy(src.0, dst.0, bytes, TIMEOUT);
            return self.recovering(r);
        }
        let k = match self.copy_kernel {
            Some(k) => k,
            None => {
                let k = self.load(&copy_kernel::copy_grains())?;
                self.copy_kernel = Some(k);
                k
            }
        };
        for (at, grains) in copy_kernel::pieces(bytes) {
            let launch =
                Launch::linear(grains.div_ceil(copy_kernel::THREADS), copy_kernel::THREADS);
            let args = [
                Arg::Ptr(src.offset(at)),
                Arg::Ptr(dst.offset(at)),
                Arg::U32(grains),
            ];
            self.launch(k, &launch, &args, StreamId::DEFAULT)?;
        }
        Ok(())
    }

    fn load(&mut self, f: &Function) -> Result<KernelId, RtError> {
        quench_ir::verify(f)?;
        let abi = KernelAbi::from_function(f)?;
        let cubin = cubin_of(f, self.codegen)?;
        let (params, param_bytes) = parameter_layout(&cubin, &abi)?;
        let program = Program::load(&self.gpu, &cubin)?;
        self.kernels.push(NativeKernel {
            program,
            abi,
            params,
            param_bytes,
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
        let r = self.launcher.timestamp(TIMEOUT);
        let now = self.recovering(r)?;
        self.events.push(Some(now));
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn elapsed_ms(&mut self, start: EventId, end: EventId) -> Result<f32, RtError> {
        let t0 = handles::lookup(&self.events, "event", start.0)?;
        let t1 = handles::lookup(&self.events, "event", end.0)?;
        Ok(((t1 as f64 - t0 as f64) / 1e6) as f32)
    }

    fn release_event(&mut self, e: EventId) -> Result<(), RtError> {
        handles::lookup(&self.events, "event", e.0)?;
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
        if self.recorder.replay_into_capture(g, stream)? {
            return Ok(());
        }
        self.write_segment(g)?;
        let segment = self.segments.get_mut(&g.0).expect("written above");
        let r = self.launcher.replay(segment, TIMEOUT);
        self.recovering(r)
    }

    fn release_graph(&mut self, g: GraphId) -> Result<(), RtError> {
        self.recorder.release(g)?;
        if let Some(segment) = self.segments.remove(&g.0) {
            // Its memory goes once no replay of it still runs.
            let r = self.launcher.finish(TIMEOUT);
            drop(segment);
            self.recovering(r)?;
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), RtError> {
        self.recorder.refuse_during_capture("synchronize")?;
        let r = self.launcher.finish(TIMEOUT);
        self.recovering(r)
    }
}

#[cfg(test)]
mod tests {
    use super::super::controls::Control;
    use super::super::fake::{Call, FakeRm, H200};
    use super::super::memory::tests::DRIVER;
    use super::*;
    use quench_ir::{AddrSpace, Builder, Scalar, Type};

    fn executor(rm: &Rc<FakeRm>) -> NativeExecutor<FakeRm> {
        let mut ex = NativeExecutor::on(rm, DRIVER, 0, "NVIDIA H200".into(), 132).unwrap();
        ex.set_codegen(Codegen::Sass);
        ex
    }

    /// `y[i] = x[i] + a` for `i < n`.
    fn offset() -> Function {
        let ptr = Type::Ptr(AddrSpace::Global, Scalar::F32);
        let mut k = Builder::new("offset", 128);
        let x = k.param("x", ptr);
        let y = k.param("y", ptr);
        let a = k.param("a", Type::F32);
        let n = k.param("n", Type::U32);
        let i = k.global_id_x();
        let inside = k.lt(i, n);
        k.if_then(inside, |k| {
            let px = k.ptr_add(x, i);
            let v = k.load(Type::F32, px);
            let w = k.add(v, a);
            let py = k.ptr_add(y, i);
            k.store(py, w);
        });
        k.finish().unwrap()
    }

    #[test]
    fn parameters_go_where_the_cubin_records_them() {
        let f = offset();
        let cubin = own_cubin(&f).unwrap();
        let abi = KernelAbi::from_function(&f).unwrap();
        let (layout, bytes) = parameter_layout(&cubin, &abi).unwrap();
        assert_eq!(layout, vec![(0, 8), (8, 8), (16, 4), (20, 4)]);
        assert_eq!(bytes, 24);
    }

    #[test]
    fn a_fault_is_reported_by_name_and_the_executor_goes_on_on_a_new_channel() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let mut ex = executor(&rm);
        let kept = ex.alloc(4096).unwrap();
        let live = rm.live_objects();
        let old = ex.launcher.channel().work_submit_token();
        // The resource manager stops the channel on a page fault.
        let errors = ex.launcher.channel().errors();
        errors
            .write_u32(super::super::channel::notifier::INFO32, 31)
            .unwrap();
        errors
            .write_u32(super::super::channel::notifier::INFO16_STATUS, 0xffff_0000)
            .unwrap();
        let err = ex.record_event(StreamId::DEFAULT).unwrap_err().to_string();
        assert!(
            err.contains("a GPU memory page fault (an address not mapped for the GPU) (robust-channel error 31)")
                && err.contains("binding the compute and copy classes"),
            "{err}"
        );
        // A new channel took the old one's place, which is gone; the memory stays.
        assert_ne!(ex.launcher.channel().work_submit_token(), old);
        assert_eq!(ex.launcher.channel().fault().unwrap(), None);
        assert_eq!(rm.live_objects().len(), live.len());
        assert!(ex.memory.contains_key(&kept.0));
    }

    #[test]
    fn memory_is_the_gpu_s_and_freed_with_its_handle() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let mut ex = executor(&rm);
        let live = rm.live_objects().len();
        let p = ex.alloc(1 << 20).unwrap();
        assert_eq!(rm.live_objects().len(), live + 2, "memory and its range");
        assert!(matches!(ex.alloc(0), Err(RtError::Memory { .. })));
        ex.free(p).unwrap();
        assert_eq!(rm.live_objects().len(), live);
        assert!(matches!(ex.free(p), Err(RtError::Memory { .. })));
        drop(ex);
        assert!(rm.live_objects().is_empty(), "{:?}", rm.live_objects());
    }

    #[test]
    fn an_executor_asks_for_the_clocks_cuda_gets() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let ex = executor(&rm);
        let boost = rm.calls().into_iter().find_map(|c| match c {
            Call::Control { object, cmd } if cmd == PerfBoostParams::CMD => Some(object),
            _ => None,
        });
        assert_eq!(boost, Some(ex.gpu.subdevice()));
    }

    #[test]
    fn a_thousand_executors_made_and_dropped_leave_nothing_behind() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        for i in 0..1000 {
            let mut ex = executor(&rm);
            let p = ex.alloc(1 << 16).unwrap();
            // In 2 MiB pages.
            ex.alloc(4 << 20).unwrap();
            ex.load(&offset()).unwrap();
            // Half of them free what they allocated, half leave it to the drop.
            if i % 2 == 0 {
                ex.free(p).unwrap();
            }
        }
        assert!(rm.live_objects().is_empty(), "{:?}", rm.live_objects());
        assert_eq!(rm.live_mappings(), (0, 0));
    }

    #[test]
    fn copies_outside_an_allocation_are_refused_before_the_gpu_sees_them() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let mut ex = executor(&rm);
        let p = ex.alloc(4096).unwrap();
        let refused = |r: Result<(), RtError>| matches!(r, Err(RtError::Memory { .. }));
        assert!(refused(ex.copy_to_device(p.offset(4000), &[0; 200])));
        assert!(refused(ex.copy_to_device(DevicePtr(0x10), &[0; 4])));
        let mut out = [0u8; 8];
        assert!(refused(ex.copy_to_host(p.offset(4092), &mut out)));
        assert!(refused(ex.copy_device_to_device(p, p.offset(2048), 4096)));
        assert_eq!(
            ex.launcher.channel().ring().read_u64(0).unwrap(),
            0,
            "nothing submitted"
        );
    }

    /// Bad launches are refused by name before anything reaches the GPU: the fake never
    /// answers a semaphore, so a launch that got as far as the channel would time out.
    #[test]
    fn bad_launches_are_refused_before_the_gpu_sees_them() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let mut ex = executor(&rm);
        let k = ex.load(&offset()).unwrap();
        let x = ex.alloc(4096).unwrap();
        let y = ex.alloc(4096).unwrap();
        let good = [Arg::Ptr(x), Arg::Ptr(y), Arg::F32(1.0), Arg::U32(1024)];
        let l = Launch::linear(8, 128);
        let s = StreamId::DEFAULT;
        assert!(matches!(
            ex.launch(k, &l, &good[..3], s),
            Err(RtError::ArgCount { .. })
        ));
        let wrong = [Arg::Ptr(x), Arg::Ptr(y), Arg::U32(1), Arg::U32(1024)];
        assert!(matches!(
            ex.launch(k, &l, &wrong, s),
            Err(RtError::ArgType { index: 2, .. })
        ));
        let stray = [
            Arg::Ptr(x),
            Arg::Ptr(y.offset(1 << 30)),
            Arg::F32(1.0),
            Arg::U32(1),
        ];
        assert!(matches!(
            ex.launch(k, &l, &stray, s),
            Err(RtError::Memory { .. })
        ));
        assert!(matches!(
            ex.launch(k, &Launch::linear(1, 256), &good, s),
            Err(RtError::LaunchShape { .. })
        ));
        assert!(matches!(
            ex.launch(KernelId(7), &l, &good, s),
            Err(RtError::UnknownHandle { kind: "kernel", .. })
        ));
        // Captured launches are checked too, and recorded without running.
        ex.begin_capture(s).unwrap();
        assert!(matches!(
            ex.launch(k, &l, &wrong, s),
            Err(RtError::ArgType { .. })
        ));
        ex.launch(k, &l, &good, s).unwrap();
        assert!(matches!(ex.alloc(64), Err(RtError::Capture { .. })));
        ex.end_capture(s).unwrap();
        assert_eq!(ex.launcher.channel().gp_get().unwrap(), 0);
        assert_eq!(
            ex.launcher.channel().ring().read_u64(0).unwrap(),
            0,
            "nothing submitted"
        );
    }
}
