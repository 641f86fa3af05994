//! The CUDA backend: the executor contract over the NVIDIA driver API (libcuda, loaded
//! at run time, so building quench needs no CUDA toolkit).
//!
//! Kernels go IR → PTX (`quench-ptx`) → the driver's JIT linker → cubin, and the cubin
//! is cached on disk ([`module_cache`]). Every stream, the default one included, is a
//! created stream that synchronizes with the legacy stream, which the synchronous
//! copies use: a copy is therefore ordered after all earlier work on every stream.

pub(crate) mod driver;
pub(crate) mod module_cache;

use std::collections::BTreeSet;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};

use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys::{
    self, CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUstreamCaptureMode,
};
use quench_ir::Function;

pub use module_cache::CacheStats;

use crate::abi::KernelAbi;
use crate::alloc_table::Allocations;
use crate::checks::{check_launch, DeviceLimits};
use crate::codegen::{own_cubin, Codegen};
use crate::devices::{device_info, DeviceInfo};
use crate::error::RtError;
use crate::executor::{Arg, DevicePtr, EventId, Executor, GraphId, KernelId, Launch, StreamId};
use crate::handles;
use driver::{compile_ptx, drv, load_cubin};
use module_cache::ModuleCache;

/// Shared memory a block may use without the opt-in function attribute.
const SHARED_WITHOUT_OPT_IN: u64 = 48 * 1024;

struct CudaKernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
    abi: KernelAbi,
    /// The MAX_DYNAMIC_SHARED_SIZE_BYTES attribute set on `func` so far.
    dynamic_shared_opt_in: u32,
}

/// What a kernel's cubin goes through between the JIT and the loader: given the kernel's
/// name and the JIT's cubin, the cubin to load instead.
pub type CubinRewrite = Box<dyn Fn(&str, &[u8]) -> Result<Vec<u8>, String> + Send>;

pub struct CudaExecutor {
    info: DeviceInfo,
    driver_version: i32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    limits: DeviceLimits,
    cache: ModuleCache,
    allocs: Allocations,
    kernels: Vec<CudaKernel>,
    /// `streams[0]` is [`StreamId::DEFAULT`].
    streams: Vec<sys::CUstream>,
    events: Vec<Option<sys::CUevent>>,
    graphs: Vec<Option<(sys::CUgraph, sys::CUgraphExec)>>,
    capturing: BTreeSet<u32>,
    rewrite: Option<CubinRewrite>,
    codegen: Codegen,
}

// SAFETY: the driver handles belong to the context, not to a thread, and every method
// makes the context current on the calling thread before it uses them. `&mut self`
// keeps calls from overlapping.
unsafe impl Send for CudaExecutor {}

impl CudaExecutor {
    /// Open device `ordinal` (its primary context), caching compiled kernels in the
    /// directory named by `QUENCH_CACHE_DIR`, `XDG_CACHE_HOME` or `HOME`.
    /// [`RtError::NoGpu`] when there is no driver, the driver is too old, or there is
    /// no such device.
    pub fn new(ordinal: u32) -> Result<CudaExecutor, RtError> {
        Self::with_cache_dir(
            ordinal,
            module_cache::resolve_dir(|k| std::env::var(k).ok()),
        )
    }

    /// As [`CudaExecutor::new`], with the kernel cache in `cache_dir` (`None`: no cache).
    pub fn with_cache_dir(
        ordinal: u32,
        cache_dir: Option<PathBuf>,
    ) -> Result<CudaExecutor, RtError> {
        let info = device_info(ordinal)?;
        let driver_version = driver::driver()?;
        let device = result::device::get(ordinal as i32).map_err(drv("cuDeviceGet"))?;
        // SAFETY: `device` came from cuDeviceGet.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(drv("cuDevicePrimaryCtxRetain"))?;
        // From here on, Drop releases whatever has been acquired.
        let mut ex = CudaExecutor {
            info,
            driver_version,
            device,
            ctx,
            limits: DeviceLimits::SM90,
            cache: ModuleCache::new(cache_dir),
            allocs: Allocations::default(),
            kernels: vec![],
            streams: vec![],
            events: vec![],
            graphs: vec![],
            capturing: BTreeSet::new(),
            rewrite: None,
            codegen: Codegen::Ptx,
        };
        ex.bind()?;
        ex.limits = ex.query_limits()?;
        ex.streams
            .push(result::stream::create(StreamKind::Default).map_err(drv("cuStreamCreate"))?);
        Ok(ex)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Load every kernel loaded from now on from what `rewrite` makes of the JIT's cubin
    /// (see [`CubinRewrite`]). Such kernels bypass the disk cache, which holds the JIT's
    /// cubins only; a rewrite that fails is the kernel's load error.
    pub fn set_cubin_rewrite(&mut self, rewrite: CubinRewrite) {
        self.rewrite = Some(rewrite);
    }

    /// Where the machine code of kernels loaded from now on comes from.
    pub fn set_codegen(&mut self, codegen: Codegen) {
        self.codegen = codegen;
    }

    /// Where compiled kernels are cached (`None`: caching is off, see
    /// [`CudaExecutor::cache_problem`]).
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.dir()
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Why the cache is off or the last entry that could not be written.
    pub fn cache_problem(&self) -> Option<&str> {
        self.cache.last_problem()
    }

    fn bind(&self) -> Result<(), RtError> {
        // SAFETY: the context is retained for the executor's life.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent"))
    }

    fn query_limits(&self) -> Result<DeviceLimits, RtError> {
        use CUdevice_attribute::*;
        let attr = |a| {
            // SAFETY: `self.device` came from cuDeviceGet.
            unsafe { result::device::get_attribute(self.device, a) }
                .map(|v| v.max(0) as u32)
                .map_err(drv("cuDeviceGetAttribute"))
        };
        Ok(DeviceLimits {
            max_threads_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_block: [
                attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            max_grid: [
                attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            max_shared_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u64,
        })
    }

    fn stream(&self, s: StreamId) -> Result<sys::CUstream, RtError> {
        self.streams
            .get(s.0 as usize)
            .copied()
            .ok_or(RtError::UnknownHandle {
                kind: "stream",
                id: s.0 as u64,
            })
    }

    fn event(&self, e: EventId) -> Result<sys::CUevent, RtError> {
        handles::lookup(&self.events, "event", e.0)
    }

    fn refuse_during_capture(&self, what: &str) -> Result<(), RtError> {
        handles::refuse_during_capture(self.capturing.iter().copied(), what)
    }

    /// Load a kernel whose PTX is already generated; `abi` must be derived from the
    /// same kernel.
    pub(crate) fn load_ptx(&mut self, abi: KernelAbi, ptx: &str) -> Result<KernelId, RtError> {
        self.bind()?;
        let module = self.module_for(ptx, &abi)?;
        self.add_kernel(module, abi)
    }

    /// Takes kernel `abi.name` from `module` (unloading it on failure).
    fn add_kernel(&mut self, module: sys::CUmodule, abi: KernelAbi) -> Result<KernelId, RtError> {
        let name = CString::new(abi.name.as_str()).map_err(|_| RtError::Abi {
            kernel: abi.name.clone(),
            message: "kernel name contains a NUL byte".into(),
        })?;
        // SAFETY: `module` was just loaded.
        let func = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: loaded above and referenced nowhere else.
                let _ = unsafe { result::module::unload(module) };
                return Err(drv("cuModuleGetFunction")(e));
            }
        };
        self.kernels.push(CudaKernel {
            module,
            func,
            abi,
            dynamic_shared_opt_in: 0,
        });
        Ok(KernelId(self.kernels.len() as u32 - 1))
    }

    /// A module for `ptx`: compiled and rewritten when a rewrite is set, else from the
    /// cache or compiled (and then cached).
    fn module_for(&mut self, ptx: &str, abi: &KernelAbi) -> Result<sys::CUmodule, RtError> {
        if let Some(rewrite) = &self.rewrite {
            let cubin = compile_ptx(ptx, &abi.name)?;
            let ours = rewrite(&abi.name, &cubin).map_err(|message| RtError::Ptx {
                kernel: abi.name.clone(),
                message: format!("rewriting its cubin: {message}"),
            })?;
            return load_cubin(&ours).map_err(drv("cuModuleLoadData"));
        }
        let key = module_cache::key(
            ptx,
            self.driver_version,
            &self.info.name,
            self.info.compute_capability,
        );
        if let Some(cubin) = self.cache.lookup(&key, abi) {
            match load_cubin(&cubin) {
                Ok(m) => return Ok(m),
                Err(_) => self.cache.reject(&key),
            }
        }
        let cubin = compile_ptx(ptx, &abi.name)?;
        let module = load_cubin(&cubin).map_err(drv("cuModuleLoadData"))?;
        self.cache.store(&key, &cubin, abi);
        Ok(module)
    }
}

impl Executor for CudaExecutor {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        self.info.name.clone()
    }

    fn multiprocessors(&self) -> Option<u32> {
        Some(self.info.multiprocessors)
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, RtError> {
        self.refuse_during_capture("allocation")?;
        if bytes == 0 {
            return Err(RtError::Memory {
                message: "cannot allocate 0 bytes".into(),
            });
        }
        let len = usize::try_from(bytes).map_err(|_| RtError::Memory {
            message: format!("{bytes} bytes exceed the address space"),
        })?;
        self.bind()?;
        // SAFETY: plain allocation; the memory is uninitialized bytes.
        let p = unsafe { result::malloc_sync(len) }.map_err(drv("cuMemAlloc"))?;
        self.allocs.insert(p, bytes);
        Ok(DevicePtr(p))
    }

    fn free(&mut self, p: DevicePtr) -> Result<(), RtError> {
        self.refuse_during_capture("free")?;
        self.allocs.remove(p.0)?;
        self.bind()?;
        // SAFETY: `p` is the start of a live allocation of this context.
        unsafe { result::free_sync(p.0) }.map_err(drv("cuMemFree"))
    }

    fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), RtError> {
        self.refuse_during_capture("copy to device")?;
        self.allocs
            .check_range(dst.0, src.len() as u64, "copy to device")?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the destination range lies inside a live allocation.
        unsafe { result::memcpy_htod_sync(dst.0, src) }.map_err(drv("cuMemcpyHtoD"))
    }

    fn copy_to_host(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RtError> {
        self.refuse_during_capture("copy to host")?;
        self.allocs
            .check_range(src.0, dst.len() as u64, "copy to host")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the source range lies inside a live allocation.
        unsafe { result::memcpy_dtoh_sync(dst, src.0) }.map_err(drv("cuMemcpyDtoH"))
    }

    fn copy_device_to_device(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(), RtError> {
        self.refuse_during_capture("device-to-device copy")?;
        self.allocs.check_copy(dst.0, src.0, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie inside live allocations.
        unsafe { result::memcpy_dtod_sync(dst.0, src.0, bytes as usize) }
            .map_err(drv("cuMemcpyDtoD"))
    }

    fn load(&mut self, f: &Function) -> Result<KernelId, RtError> {
        quench_ir::verify(f)?;
        let abi = KernelAbi::from_function(f)?;
        if self.codegen == Codegen::Sass {
            let cubin = own_cubin(f)?;
            self.bind()?;
            let module = load_cubin(&cubin).map_err(drv("cuModuleLoadData"))?;
            return self.add_kernel(module, abi);
        }
        let ptx = quench_ptx::emit(f).map_err(|e| RtError::Ptx {
            kernel: f.name.clone(),
            message: e.to_string(),
        })?;
        self.load_ptx(abi, &ptx)
    }

    fn abi(&self, k: KernelId) -> Result<&KernelAbi, RtError> {
        self.kernels
            .get(k.0 as usize)
            .map(|k| &k.abi)
            .ok_or(RtError::UnknownHandle {
                kind: "kernel",
                id: k.0 as u64,
            })
    }

    fn launch(
        &mut self,
        k: KernelId,
        launch: &Launch,
        args: &[Arg],
        stream: StreamId,
    ) -> Result<(), RtError> {
        let s = self.stream(stream)?;
        let kernel = self
            .kernels
            .get(k.0 as usize)
            .ok_or(RtError::UnknownHandle {
                kind: "kernel",
                id: k.0 as u64,
            })?;
        check_launch(&kernel.abi, launch, args, &self.limits, &self.allocs)?;
        self.bind()?;
        let kernel = &mut self.kernels[k.0 as usize];
        let dynamic = launch.dynamic_shared_bytes;
        if kernel.abi.static_shared_bytes + dynamic as u64 > SHARED_WITHOUT_OPT_IN
            && dynamic > kernel.dynamic_shared_opt_in
        {
            // SAFETY: `func` belongs to a loaded module.
            unsafe {
                result::function::set_function_attribute(
                    kernel.func,
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
            }
            .map_err(drv("cuFuncSetAttribute"))?;
            kernel.dynamic_shared_opt_in = dynamic;
        }
        // The driver reads each parameter's size (from the kernel's metadata) starting
        // at its pointer; the little-endian u64 slots hold each value in their low bytes.
        let mut values: Vec<u64> = args.iter().map(Arg::bits).collect();
        let mut params: Vec<*mut c_void> =
            values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let (g, b) = (launch.grid, launch.block);
        // SAFETY: the arguments were checked against the kernel's ABI; `values` outlives
        // the call, which copies the parameters.
        unsafe {
            result::launch_kernel(
                kernel.func,
                (g[0], g[1], g[2]),
                (b[0], b[1], b[2]),
                dynamic,
                s,
                &mut params,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }

    fn create_stream(&mut self) -> Result<StreamId, RtError> {
        self.bind()?;
        let s = result::stream::create(StreamKind::Default).map_err(drv("cuStreamCreate"))?;
        self.streams.push(s);
        Ok(StreamId(self.streams.len() as u32 - 1))
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, RtError> {
        let s = self.stream(stream)?;
        if self.capturing.contains(&stream.0) {
            return Err(RtError::Capture {
                message: format!(
                    "cannot record an event on stream {} while it is capturing",
                    stream.0
                ),
            });
        }
        self.bind()?;
        let e =
            result::event::create(CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?;
        // SAFETY: fresh event, live stream.
        if let Err(err) = unsafe { result::event::record(e, s) } {
            // SAFETY: created above and referenced nowhere else.
            let _ = unsafe { result::event::destroy(e) };
            return Err(drv("cuEventRecord")(err));
        }
        self.events.push(Some(e));
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn elapsed_ms(&mut self, start: EventId, end: EventId) -> Result<f32, RtError> {
        let (e0, e1) = (self.event(start)?, self.event(end)?);
        self.bind()?;
        // SAFETY: both events are live and recorded.
        unsafe {
            result::event::synchronize(e1).map_err(drv("cuEventSynchronize"))?;
            result::event::elapsed(e0, e1).map_err(drv("cuEventElapsedTime"))
        }
    }

    fn release_event(&mut self, e: EventId) -> Result<(), RtError> {
        let ev = self.event(e)?;
        self.events[e.0 as usize] = None;
        self.bind()?;
        // SAFETY: live event, now forgotten by the executor.
        unsafe { result::event::destroy(ev) }.map_err(drv("cuEventDestroy"))
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), RtError> {
        let s = self.stream(stream)?;
        if self.capturing.contains(&stream.0) {
            return Err(RtError::Capture {
                message: format!("stream {} is already capturing", stream.0),
            });
        }
        self.bind()?;
        // Thread-local mode: other threads' unrelated driver calls stay legal meanwhile.
        // SAFETY: live stream.
        unsafe {
            result::stream::begin_capture(
                s,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(drv("cuStreamBeginCapture"))?;
        self.capturing.insert(stream.0);
        Ok(())
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, RtError> {
        let s = self.stream(stream)?;
        if !self.capturing.remove(&stream.0) {
            return Err(RtError::Capture {
                message: format!("stream {} is not capturing", stream.0),
            });
        }
        self.bind()?;
        // SAFETY: the stream is capturing.
        let graph = unsafe { result::stream::end_capture(s) }.map_err(drv("cuStreamEndCapture"))?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` was just captured.
        if let Err(e) = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result() {
            // SAFETY: not referenced elsewhere.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(drv("cuGraphInstantiate")(e));
        }
        self.graphs.push(Some((graph, exec)));
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn replay(&mut self, g: GraphId, stream: StreamId) -> Result<(), RtError> {
        let s = self.stream(stream)?;
        let (_, exec) =
            self.graphs
                .get(g.0 as usize)
                .copied()
                .flatten()
                .ok_or(RtError::UnknownHandle {
                    kind: "graph",
                    id: g.0 as u64,
                })?;
        self.bind()?;
        // SAFETY: live executable graph and stream.
        unsafe { result::graph::launch(exec, s) }.map_err(drv("cuGraphLaunch"))
    }

    fn release_graph(&mut self, g: GraphId) -> Result<(), RtError> {
        let slot = self
            .graphs
            .get_mut(g.0 as usize)
            .ok_or(RtError::UnknownHandle {
                kind: "graph",
                id: g.0 as u64,
            })?;
        let (graph, exec) = slot.take().ok_or(RtError::UnknownHandle {
            kind: "graph",
            id: g.0 as u64,
        })?;
        self.bind()?;
        // SAFETY: live graph, now forgotten by the executor.
        unsafe {
            result::graph::exec_destroy(exec).map_err(drv("cuGraphExecDestroy"))?;
            result::graph::destroy(graph).map_err(drv("cuGraphDestroy"))
        }
    }

    fn synchronize(&mut self) -> Result<(), RtError> {
        self.refuse_during_capture("synchronize")?;
        self.bind()?;
        result::ctx::synchronize().map_err(drv("cuCtxSynchronize"))
    }
}

impl Drop for CudaExecutor {
    /// Release everything in dependency order. Errors cannot be reported from here;
    /// each release is attempted regardless.
    fn drop(&mut self) {
        // The context is released even where it cannot be made current (after a fault).
        if self.bind().is_err() {
            // SAFETY: the context was retained by this executor and is released once.
            let _ = unsafe { result::primary_ctx::release(self.device) };
            return;
        }
        // SAFETY: every handle below was created by this executor and is released once.
        unsafe {
            for s in std::mem::take(&mut self.capturing) {
                if let Ok(graph) = result::stream::end_capture(self.streams[s as usize]) {
                    let _ = result::graph::destroy(graph);
                }
            }
            let _ = result::ctx::synchronize();
            for (graph, exec) in self.graphs.drain(..).flatten() {
                let _ = result::graph::exec_destroy(exec);
                let _ = result::graph::destroy(graph);
            }
            for e in self.events.drain(..).flatten() {
                let _ = result::event::destroy(e);
            }
            for s in self.streams.drain(..) {
                let _ = result::stream::destroy(s);
            }
            for k in self.kernels.drain(..) {
                let _ = result::module::unload(k.module);
            }
            for p in self.allocs.addrs() {
                let _ = result::free_sync(p);
            }
            let _ = result::primary_ctx::release(self.device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX module the driver refuses comes back as `Jit` with the driver's message.
    #[test]
    #[ignore = "needs a GPU: scripts/device/gpu-tests.sh runs it"]
    fn rejected_ptx_reports_the_driver_log() {
        let mut ex = match CudaExecutor::with_cache_dir(0, None) {
            Ok(ex) => ex,
            Err(other) => panic!("this test needs a GPU: {other}"),
        };
        let abi = KernelAbi {
            name: "broken".into(),
            params: vec![],
            static_shared_bytes: 0,
            max_threads: 32,
            features: vec![],
        };
        let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry broken()\n{\n  frobnicate.u32 %r1;\n  ret;\n}\n";
        match ex.load_ptx(abi, ptx) {
            Err(RtError::Jit { kernel, log }) => {
                assert_eq!(kernel, "broken");
                assert!(
                    log.contains("frobnicate") || log.to_lowercase().contains("error"),
                    "{log}"
                );
                println!("driver log: {log}");
            }
            other => panic!("expected a JIT error, got {other:?}"),
        }
    }
}
