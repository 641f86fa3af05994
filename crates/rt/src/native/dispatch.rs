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
//! A kernel with a stack frame needs local memory: the launcher allocates it the first
//! time a kernel needs it (and again, larger, when one needs more), enough for every
//! thread the GPU can hold at once, sized from the chip's design as the resource manager
//! reports it, and hands it to the compute class (`SET_SHADER_LOCAL_MEMORY_*`).
//!
//! Not yet: kernels whose code needs relocating (calls to functions in other sections)
//! are refused by name.

use std::time::{Duration, Instant};

use quench_sass::cubin::Cubin;

use super::channel::Channel;
use super::controls::{
    GrGetInfoV2Params, GR_INFO_INDEX_LITTER_NUM_GPCS, GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC,
    GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC, GR_INFO_INDEX_MAX_WARPS_PER_SM,
};
use super::error::NativeError;
use super::launch::{
    stack_bytes, KernelLaunch, LaunchAddresses, LaunchDims, LOCAL_WINDOW, SHARED_WINDOW,
};
use super::memory::{Allocation, Gpu, Placement, Teardown};
use super::pushbuf::{
    copy, GpEntry, Level, PcasAction, PushBuffer, HOPPER_COMPUTE_A, HOPPER_DMA_COPY_A,
};
use super::qmd::{QmdLaunch, QMD_ALIGN};
use super::rm::ResourceManager;

/// The subchannel HOPPER_COMPUTE_A is bound to.
pub(super) const COMPUTE: u32 = 1;
/// The subchannel HOPPER_DMA_COPY_A is bound to.
const COPY: u32 = 4;
/// Where each kernel's code starts: a multiple of the instruction cache's line.
const CODE_ALIGN: u64 = 256;
/// Slack after the code, which the instruction prefetcher may read past the last kernel.
const CODE_SLACK: u64 = 4096;

/// Layout of a launcher's host memory: the host's semaphore, the copy engine's, a
/// timestamped report, then the push buffers, one region per submission in a ring.
const SEMAPHORE: u64 = 0;
const COPY_SEMAPHORE: u64 = 0x10;
const TIMESTAMP: u64 = 0x20;
const PUSH: u64 = 0x100;
const PUSH_REGION: u64 = 0x200;
/// Submissions whose push buffers are kept: a region is written again once the GPU has
/// finished the submission that had it. Fewer than a channel's GPFIFO entries, so the
/// ring of entries never fills.
const PUSH_REGIONS: u64 = 256;
const HOST_BYTES: u64 = PUSH + PUSH_REGION * PUSH_REGIONS;
/// Layout of its GPU memory: launch slots, each a QMD and then constant bank 0, used in
/// turn and written again once the grid that had the slot has finished.
const QMD_AT: u64 = 0;
const BANK0_AT: u64 = 0x400;
const SLOT_BYTES: u64 = 0x2000;
const SLOTS: usize = 256;
const STATE_BYTES: u64 = SLOT_BYTES * SLOTS as u64;

/// One kernel's code in a [`Program`].
struct Entry {
    name: String,
    /// Offset in the program's code allocation.
    at: u64,
    bytes: u32,
}

/// The kernels of one cubin, their code in GPU memory.
pub struct Program<R: ResourceManager> {
    cubin: Cubin,
    code: Allocation<R>,
    /// Each kernel's name, and the offset and length of its code in `code`.
    entries: Vec<Entry>,
}

impl<R: ResourceManager> Program<R> {
    /// Parses `cubin` and copies its kernels' code into GPU memory of `gpu`.
    pub fn load(gpu: &Gpu<R>, cubin: &[u8]) -> Result<Self, NativeError> {
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
            let bytes = cubin.text(k).len() as u32;
            end = at + u64::from(bytes);
            entries.push(Entry {
                name: k.name.clone(),
                at,
                bytes,
            });
        }
        if entries.is_empty() {
            return Err(NativeError::Cubin("the cubin has no kernels".into()));
        }
        let code = gpu.allocate(end + CODE_SLACK, Placement::Device, true)?;
        for (k, e) in cubin.kernels.iter().zip(&entries) {
            code.write(e.at, cubin.text(k))?;
        }
        gpu.note_program_written();
        Ok(Program {
            cubin,
            code,
            entries,
        })
    }

    /// The GPU address of `kernel`'s first instruction and the length of its code.
    fn entry(&self, kernel: &str) -> Option<(u64, u32)> {
        self.entries
            .iter()
            .find(|e| e.name == kernel)
            .map(|e| (self.code.gpu_address() + e.at, e.bytes))
    }
}

/// The chip's design as far as local memory is concerned: every TPC its GPCs can have
/// (enabled or not, since the hardware indexes local memory by TPC id), SMs per TPC and
/// warps per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub tpcs: u32,
    pub sms_per_tpc: u32,
    pub warps_per_sm: u32,
}

impl Geometry {
    /// Asks the resource manager of `gpu`.
    pub fn query<R: ResourceManager>(gpu: &Gpu<R>) -> Result<Geometry, NativeError> {
        let asked = [
            GR_INFO_INDEX_LITTER_NUM_GPCS,
            GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC,
            GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC,
            GR_INFO_INDEX_MAX_WARPS_PER_SM,
        ];
        let objects = Teardown::under(gpu);
        let info = objects.control(gpu.subdevice(), GrGetInfoV2Params::request(&asked))?;
        let [gpcs, tpcs_per_gpc, sms_per_tpc, warps_per_sm] = asked.map(|i| info.value(i));
        match (gpcs, tpcs_per_gpc, sms_per_tpc, warps_per_sm) {
            (Some(g), Some(t), Some(s), Some(w)) if g * t * s * w != 0 => Ok(Geometry {
                tpcs: g * t,
                sms_per_tpc: s,
                warps_per_sm: w,
            }),
            _ => Err(NativeError::Unreported(format!(
                "how many GPCs ({gpcs:?}), TPCs per GPC ({tpcs_per_gpc:?}), SMs per TPC \
                 ({sms_per_tpc:?}) and warps per SM ({warps_per_sm:?}) the GPU has, which \
                 sizes local memory"
            ))),
        }
    }

    /// Local memory for stacks of `per_thread` bytes: bytes per TPC (a multiple of 32 KiB)
    /// and in all (a multiple of 128 KiB).
    pub fn local_bytes(&self, per_thread: u32) -> (u64, u64) {
        let per_warp = (u64::from(per_thread) * 32).next_multiple_of(0x200);
        let per_tpc = (per_warp * u64::from(self.warps_per_sm) * u64::from(self.sms_per_tpc))
            .next_multiple_of(0x8000);
        let total = (per_tpc * u64::from(self.tpcs)).next_multiple_of(0x2_0000);
        (per_tpc, total)
    }
}

/// One grid to run: a kernel of a loaded program, its grid and its parameter block (laid
/// out as the cubin records).
pub struct GridLaunch<'a, R: ResourceManager> {
    pub program: &'a Program<R>,
    pub kernel: &'a str,
    pub dims: LaunchDims,
    pub params: Vec<u8>,
}

/// A copy started on the copy engine, to be waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyTicket(u32);

/// A launch ready for its QMD: what the QMD says, constant bank 0 and the code's address.
pub(super) struct Prepared {
    pub launch: KernelLaunch,
    pub bank0: Vec<u8>,
    pub program_address: u64,
    pub program_bytes: u32,
}

/// The local memory a channel's compute class was given.
struct LocalMemory<R: ResourceManager> {
    _memory: Allocation<R>,
    per_thread: u32,
}

/// Runs grids on one channel, one after another. A grid is started without waiting for
/// it ([`Launcher::start`]): each submission releases the host's semaphore with the next
/// serial once the work before it has finished, which also keeps the next grid from
/// starting before; the CPU waits only where it must ([`Launcher::finish`], copies, a
/// launch slot or push buffer region still in use).
pub struct Launcher<R: ResourceManager> {
    gpu: Gpu<R>,
    geometry: Geometry,
    local: Option<LocalMemory<R>>,
    channel: Channel<R>,
    /// The semaphores and the push buffers.
    host: Allocation<R>,
    /// The launch slots.
    state: Allocation<R>,
    /// The serial each launch slot's last grid released, and its kernel; the next slot
    /// to use.
    slots: Vec<u64>,
    kernels: Vec<String>,
    next_slot: usize,
    /// The semaphore's value after the latest submission.
    serial: u64,
    /// Copies submitted: the copy engine's semaphore after the latest.
    copies: u32,
    /// The serial of the latest submission that started grids.
    grids: u64,
    /// Whether the compute class is bound and the windows placed.
    bound: bool,
    /// [`Gpu::programs_written`] when the latest grid that invalidates the instruction
    /// cache was submitted; `None` before the first.
    code_seen: Option<u64>,
}

impl<R: ResourceManager> Launcher<R> {
    /// A launcher for `gpu` on `channel`; it binds the compute class and places the
    /// memory windows with its first submission.
    pub fn new(gpu: &Gpu<R>, channel: Channel<R>) -> Result<Self, NativeError> {
        let geometry = Geometry::query(gpu)?;
        let host = gpu.allocate(HOST_BYTES, Placement::Host, true)?;
        host.write_u64(SEMAPHORE, 0)?;
        let state = gpu.allocate(STATE_BYTES, Placement::Device, true)?;
        Ok(Launcher {
            gpu: gpu.clone(),
            geometry,
            local: None,
            channel,
            host,
            state,
            slots: vec![0; SLOTS],
            kernels: vec![String::new(); SLOTS],
            next_slot: 0,
            serial: 0,
            copies: 0,
            grids: 0,
            bound: false,
            code_seen: None,
        })
    }

    pub(super) fn gpu(&self) -> &Gpu<R> {
        &self.gpu
    }

    /// Records that the submission `serial` started grids, which copies wait for, the
    /// first of them invalidating the instruction cache.
    pub(super) fn note_grids(&mut self, serial: u64, programs_written: u64) {
        self.grids = serial;
        self.code_seen = Some(programs_written);
    }

    /// The serial of the first submission the GPU has not finished.
    pub fn first_unfinished(&self) -> Result<u64, NativeError> {
        Ok(self.host.read_u64(SEMAPHORE)? + 1)
    }

    /// The channel the launcher submits on.
    pub fn channel(&self) -> &Channel<R> {
        &self.channel
    }

    /// Binds the compute class on the channel and places the memory windows, waiting up
    /// to `timeout` for the GPU to take them (once; later calls do nothing).
    pub fn bind(&mut self, timeout: Duration) -> Result<(), NativeError> {
        if !self.bound {
            let mut push = PushBuffer::new();
            push.set_object(COMPUTE, HOPPER_COMPUTE_A)?;
            push.set_object(COPY, HOPPER_DMA_COPY_A)?;
            push.shader_windows(COMPUTE, SHARED_WINDOW, LOCAL_WINDOW)?;
            self.submit_and_wait(push, "binding the compute and copy classes", timeout)?;
            self.bound = true;
        }
        Ok(())
    }

    /// Runs `l` and waits up to `timeout` for it to finish. Returns the time
    /// from submission to the semaphore, as the CPU saw it.
    pub fn run(&mut self, l: &GridLaunch<R>, timeout: Duration) -> Result<Duration, NativeError> {
        self.finish(timeout)?;
        let start = Instant::now();
        self.start(l, timeout)?;
        self.finish(timeout)?;
        Ok(start.elapsed())
    }

    /// Starts `l` after the work submitted before; `timeout` bounds any wait for a launch
    /// slot or push buffer region still in use.
    pub fn start(&mut self, l: &GridLaunch<R>, timeout: Duration) -> Result<(), NativeError> {
        self.bind(timeout)?;
        let prepared = self.prepare(l, timeout)?;
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % SLOTS;
        self.wait(
            self.slots[slot],
            &format!("a launch slot for kernel {}", l.kernel),
            timeout,
        )?;
        let base = slot as u64 * SLOT_BYTES;
        let state = self.state.gpu_address();
        let mut qmd = self.qmd_launch(&prepared, state + base + BANK0_AT);
        // Code written since the last invalidation may sit where the instruction cache
        // holds other code.
        let written = self.gpu.programs_written();
        qmd.invalidate_code = self.code_seen != Some(written);
        let qmd = qmd.pack()?;
        self.state.write(base + QMD_AT, &qmd.to_bytes())?;
        self.state.write(base + BANK0_AT, &prepared.bank0)?;

        let mut push = PushBuffer::new();
        push.launch(
            COMPUTE,
            state + base + QMD_AT,
            PcasAction::InvalidateCopySchedule,
        )?;
        self.slots[slot] = self.submit(push, timeout)?;
        self.code_seen = Some(written);
        self.grids = self.slots[slot];
        self.kernels[slot].clear();
        self.kernels[slot].push_str(l.kernel);
        Ok(())
    }

    /// `l` described for the QMD, with its constant bank 0;
    /// gives the compute class more local memory first where the kernel's stack needs it.
    pub(super) fn prepare(
        &mut self,
        l: &GridLaunch<R>,
        timeout: Duration,
    ) -> Result<Prepared, NativeError> {
        let (program, kernel) = (l.program, l.kernel);
        let launch = KernelLaunch::from_cubin(&program.cubin, kernel, &l.dims, &l.params)?;
        let bank0 = launch.constant_buffer0();
        if BANK0_AT + bank0.len() as u64 > SLOT_BYTES {
            return Err(NativeError::OutOfBounds {
                what: "a kernel's parameters and launch state (constant bank 0)",
                offset: BANK0_AT,
                length: bank0.len() as u64,
                size: SLOT_BYTES,
            });
        }
        let stack = stack_bytes(launch.local_bytes_per_thread);
        if stack > self.local_per_thread() {
            self.give_local_memory(stack, timeout)?;
        }
        let (program_address, program_bytes) = program
            .entry(kernel)
            .ok_or_else(|| NativeError::Cubin(format!("no code for kernel {kernel}")))?;
        Ok(Prepared {
            launch,
            bank0,
            program_address,
            program_bytes,
        })
    }

    /// What [`Launcher::qmd`] packs.
    pub(super) fn qmd_launch(&self, p: &Prepared, bank0: u64) -> QmdLaunch {
        let at = LaunchAddresses {
            program: p.program_address,
            constant_buffer0: bank0,
            release: None,
        };
        let mut qmd = p.launch.qmd_launch(&at);
        qmd.program_bytes = p.program_bytes;
        if stack_bytes(p.launch.local_bytes_per_thread) > 0 {
            // Each thread's share is laid out by the size the compute class was given.
            qmd.stack_bytes_per_thread = self.local_per_thread();
        }
        qmd
    }

    /// Local memory per thread the compute class was given (0: none yet).
    pub(super) fn local_per_thread(&self) -> u32 {
        self.local.as_ref().map_or(0, |l| l.per_thread)
    }

    /// Waits up to `timeout` for everything submitted so far to finish.
    pub fn finish(&mut self, timeout: Duration) -> Result<(), NativeError> {
        self.wait(self.serial, "the work submitted", timeout)
    }

    /// Copies `bytes` from the GPU virtual address `src` to `dst` on the copy engine
    /// after the work submitted before, and waits up to `timeout` for it to land.
    pub fn copy(
        &mut self,
        src: u64,
        dst: u64,
        bytes: u64,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        let ticket = self.start_copy(src, dst, bytes, timeout)?;
        self.wait_copy(ticket, timeout)
    }

    /// Starts copying `bytes` from the GPU virtual address `src` to `dst` on the copy
    /// engine, in pieces of at most [`copy::MAX_LINE`], after the grids submitted before
    /// (copies run in the order they were started); returns the ticket
    /// [`Launcher::wait_copy`] waits for.
    pub fn start_copy(
        &mut self,
        src: u64,
        dst: u64,
        bytes: u64,
        timeout: Duration,
    ) -> Result<CopyTicket, NativeError> {
        self.bind(timeout)?;
        // The copy engine does not wait for grids: the grids before go first.
        self.wait(self.grids, "the grids before a copy", timeout)?;
        let mut done = 0;
        while done < bytes {
            let piece = (bytes - done).min(copy::MAX_LINE);
            let copies = self.copies.wrapping_add(1);
            let mut push = PushBuffer::new();
            push.dma_copy(
                COPY,
                src + done,
                dst + done,
                piece,
                self.host.gpu_address() + COPY_SEMAPHORE,
                copies,
            )?;
            self.submit(push, timeout)?;
            self.copies = copies;
            done += piece;
        }
        Ok(CopyTicket(self.copies))
    }

    /// Waits up to `timeout` until the copy of `ticket` (and every copy before it) has
    /// landed.
    pub fn wait_copy(&self, ticket: CopyTicket, timeout: Duration) -> Result<(), NativeError> {
        // The copy engine's semaphore counts copies, wrapping at 2³²: reached once it is
        // no more than 2³¹ behind.
        self.wait_for(
            |h| Ok((h.read_u32(COPY_SEMAPHORE)?.wrapping_sub(ticket.0) as i32) >= 0),
            "a copy",
            timeout,
        )
    }

    /// The GPU's clock in nanoseconds once the work submitted before has finished.
    pub fn timestamp(&mut self, timeout: Duration) -> Result<u64, NativeError> {
        self.bind(timeout)?;
        let mut push = PushBuffer::new();
        push.semaphore_release_timestamp(self.host.gpu_address() + TIMESTAMP, self.serial + 1)?;
        let serial = self.submit(push, timeout)?;
        self.wait(serial, "a timestamp", timeout)?;
        self.host.read_u64(TIMESTAMP + 8)
    }

    /// Allocates local memory for stacks of `per_thread` bytes and gives it to the
    /// compute class; the previous local memory goes once the GPU has taken the new one.
    pub(super) fn give_local_memory(
        &mut self,
        per_thread: u32,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        // No grid may still be running in the local memory given before.
        self.finish(timeout)?;
        let (per_tpc, total) = self.geometry.local_bytes(per_thread);
        let memory = self.gpu.allocate(total, Placement::Device, false)?;
        let mut push = PushBuffer::new();
        push.shader_local_memory(COMPUTE, memory.gpu_address(), per_tpc)?;
        self.submit_and_wait(push, "giving the compute class local memory", timeout)?;
        self.local = Some(LocalMemory {
            _memory: memory,
            per_thread,
        });
        Ok(())
    }

    /// Submits `push` and waits up to `timeout` for it to finish.
    fn submit_and_wait(
        &mut self,
        push: PushBuffer,
        what: &str,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        let serial = self.submit(push, timeout)?;
        self.wait(serial, what, timeout)
    }

    /// Appends to `push` the release of the host's semaphore with the next serial (once
    /// the work before has finished), writes it into the next push buffer region (waiting
    /// up to `timeout` for the submission that had the region to finish) and hands it to
    /// the channel. Returns the serial.
    fn submit(&mut self, push: PushBuffer, timeout: Duration) -> Result<u64, NativeError> {
        self.submit_after(None, push, timeout)
    }

    /// As [`Launcher::submit`], with the segment `first` (a push buffer elsewhere, such
    /// as a recorded graph's) handed to the channel just before.
    pub(super) fn submit_after(
        &mut self,
        first: Option<GpEntry>,
        mut push: PushBuffer,
        timeout: Duration,
    ) -> Result<u64, NativeError> {
        let serial = self.serial + 1;
        push.semaphore_release(self.host.gpu_address() + SEMAPHORE, serial)?;
        let bytes = push.to_bytes();
        if bytes.len() as u64 > PUSH_REGION {
            return Err(NativeError::OutOfBounds {
                what: "a push buffer",
                offset: 0,
                length: bytes.len() as u64,
                size: PUSH_REGION,
            });
        }
        // Submissions outstanding stay fewer than the push buffer regions and, at up to
        // two GPFIFO entries each, than the channel's entries.
        let outstanding = PUSH_REGIONS.min((u64::from(self.channel.entries()) - 1) / 2);
        self.wait(
            serial.saturating_sub(outstanding),
            "a push buffer region",
            timeout,
        )?;
        let at = PUSH + serial % PUSH_REGIONS * PUSH_REGION;
        self.host.write(at, &bytes)?;
        if let Some(first) = first {
            self.channel.submit(first)?;
        }
        let entry = GpEntry::new(
            self.host.gpu_address() + at,
            push.words().len(),
            Level::Main,
        )?;
        self.channel.submit(entry)?;
        self.serial = serial;
        Ok(serial)
    }

    /// Waits up to `timeout` until the host's semaphore has reached `serial` (releases
    /// come in order, so it only grows).
    fn wait(&self, serial: u64, what: &str, timeout: Duration) -> Result<(), NativeError> {
        self.wait_for(|h| Ok(h.read_u64(SEMAPHORE)? >= serial), what, timeout)
    }

    /// Spins until `done` says the GPU has written what it was asked to into the host
    /// memory, or `timeout` has passed.
    fn wait_for(
        &self,
        done: impl Fn(&Allocation<R>) -> Result<bool, NativeError>,
        what: &str,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        let start = Instant::now();
        loop {
            if done(&self.host)? {
                return Ok(());
            }
            if let Some(code) = self.channel.fault()? {
                return Err(NativeError::ChannelFault {
                    code,
                    kernel: self.stopped_kernel()?,
                    what: what.to_string(),
                });
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

impl<R: ResourceManager> Launcher<R> {
    /// The kernel of the submission a fault stopped: the first one whose semaphore was
    /// not released, if it started a grid (the channel runs its work in order).
    fn stopped_kernel(&self) -> Result<Option<String>, NativeError> {
        let first_unfinished = self.first_unfinished()?;
        Ok(self
            .slots
            .iter()
            .position(|&s| s == first_unfinished)
            .map(|i| self.kernels[i].clone()))
    }
}

#[cfg(test)]
impl<R: ResourceManager> Launcher<R> {
    /// For tests over the fake resource manager, which runs nothing: every submission,
    /// made or to come, counts as finished.
    pub(super) fn pretend_all_finished(&self) {
        self.host.write_u64(SEMAPHORE, u64::MAX / 2).unwrap();
    }
}

const _: () = assert!(
    QMD_AT.is_multiple_of(QMD_ALIGN)
        && BANK0_AT.is_multiple_of(64)
        && SLOT_BYTES.is_multiple_of(QMD_ALIGN)
);

impl<R: ResourceManager> Drop for Launcher<R> {
    /// Lets the work submitted finish before its memory goes (a GPU that does not finish
    /// within a few seconds is left to the driver's teardown of the channel).
    fn drop(&mut self) {
        let _ = self.finish(Duration::from_secs(5));
    }
}

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
    fn a_fault_is_put_on_the_first_unfinished_grid() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let channel = Channel::create(&gpu, 64).unwrap();
        let mut l = Launcher::new(&gpu, channel).unwrap();
        (l.slots[0], l.kernels[0]) = (4, "first".into());
        (l.slots[1], l.kernels[1]) = (6, "second".into());
        l.host.write_u64(SEMAPHORE, 3).unwrap();
        assert_eq!(l.stopped_kernel().unwrap().as_deref(), Some("first"));
        // Submission 5 was no grid (a copy, a timestamp).
        l.host.write_u64(SEMAPHORE, 4).unwrap();
        assert_eq!(l.stopped_kernel().unwrap(), None);
        l.host.write_u64(SEMAPHORE, 5).unwrap();
        assert_eq!(l.stopped_kernel().unwrap().as_deref(), Some("second"));
    }

    #[test]
    fn a_program_is_its_kernels_code_in_gpu_memory() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let p = Program::load(&gpu, &cubin(0)).unwrap();
        assert_eq!(
            p.entry("probe"),
            Some((p.code.gpu_address(), code().len() as u32))
        );
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
    fn the_instruction_cache_is_invalidated_once_after_code_is_written() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let mut l = Launcher::new(&gpu, Channel::create(&gpu, 64).unwrap()).unwrap();
        l.pretend_all_finished();
        let p = Program::load(&gpu, &cubin(0)).unwrap();
        let start = |l: &mut Launcher<FakeRm>, p: &Program<FakeRm>| {
            let slot = l.next_slot as u64;
            let grid = GridLaunch {
                program: p,
                kernel: "probe",
                dims: LaunchDims {
                    grid: [1, 1, 1],
                    block: [32, 1, 1],
                    dynamic_shared_bytes: 0,
                },
                params: vec![0; 12],
            };
            l.start(&grid, Duration::from_millis(50)).unwrap();
            // INVALIDATE_INSTRUCTION_CACHE MW(606:606): word 18, bit 30; the data caches'
            // (604, 605) every time.
            let w = l
                .state
                .read_u32(slot * SLOT_BYTES + QMD_AT + 4 * 18)
                .unwrap();
            assert_eq!((w >> 28) & 3, 3, "texture and shader data caches");
            (w >> 30) & 1 == 1
        };
        assert!(
            start(&mut l, &p),
            "the first grid after the code was written"
        );
        assert!(!start(&mut l, &p), "a second grid of the same code");
        assert!(!start(&mut l, &p));
        let q = Program::load(&gpu, &cubin(0)).unwrap();
        assert!(
            start(&mut l, &q),
            "the first grid after more code was written"
        );
        assert!(!start(&mut l, &p));
    }

    #[test]
    fn local_memory_is_sized_for_every_thread_of_the_chip_s_design() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let g = Geometry::query(&gpu).unwrap();
        assert_eq!(
            g,
            Geometry {
                tpcs: 72,
                sms_per_tpc: 2,
                warps_per_sm: 64
            }
        );
        // A 32-byte frame: 0x260 bytes a thread with the 0x240 above the stack top, a
        // warp's 0x4c00 (a multiple of 0x200), 128 warps a TPC, 72 TPCs.
        assert_eq!(stack_bytes(32), 0x260);
        assert_eq!(g.local_bytes(0x260), (0x26_0000, 0x26_0000 * 72));
        // Rounded up: a warp to 0x200 bytes, a TPC to 32 KiB, the whole to 128 KiB.
        let odd = Geometry {
            tpcs: 3,
            sms_per_tpc: 1,
            warps_per_sm: 1,
        };
        assert_eq!(odd.local_bytes(1), (0x8000, 0x2_0000));
    }

    #[test]
    fn bad_cubins_are_refused_by_name() {
        use quench_sass::build::{build_module, FunctionDesc, ModuleDesc, RelocDesc};
        use quench_sass::cubin::R_CUDA_ABS32_LO_32;
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let e = Program::load(&gpu, b"not an ELF").err().unwrap();
        assert!(e.to_string().starts_with("cannot load the cubin: "), "{e}");
        // A kernel whose code takes a device function's address from a relocation.
        let Ok(cubin) = Cubin::parse(&cubin(0)) else {
            panic!("the probe cubin parses")
        };
        let kernel = quench_sass::build::KernelDesc::from_cubin(&cubin, &cubin.kernels[0]).unwrap();
        let linked = build_module(&ModuleDesc {
            kernel,
            functions: vec![FunctionDesc {
                name: "helper".into(),
                text: code(),
                registers: 16,
                subroutines: vec![],
            }],
            relocs: vec![RelocDesc {
                function: "probe".into(),
                offset: 0,
                r_type: R_CUDA_ABS32_LO_32,
                symbol: "helper".into(),
                addend: 0,
            }],
        })
        .unwrap();
        let e = Program::load(&gpu, &linked).err().unwrap();
        assert_eq!(
            e.to_string(),
            "kernel probe needs its code relocated (1 relocation entries: calls to functions \
             in other sections, or global symbols), which the native backend does not do yet"
        );
    }

    #[test]
    fn a_launcher_binds_the_compute_class_and_reports_a_gpu_that_never_answers() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let channel = Channel::create(&gpu, 64).unwrap();
        let mut launcher = Launcher::new(&gpu, channel).unwrap();
        let e = launcher.bind(Duration::from_millis(20)).err().unwrap();
        assert!(
            e.to_string()
                .starts_with("binding the compute and copy classes did not finish within 0.02 s"),
            "{e}"
        );
        // One GPFIFO entry was submitted, as long as the two bindings (2 words each), the
        // windows (6) and the semaphore release (6).
        let ring = launcher.channel().ring();
        let entry = ring.read_u64(0).unwrap();
        assert_eq!((entry >> 42) & 0x1f_ffff, 16);
        assert_eq!(ring.read_u64(8).unwrap(), 0);
    }

    /// A kernel `name(x, y, n)` over u32 arrays whose thread `i < n` stores what `body`
    /// makes of `x`, `i` into `y[i]`.
    fn per_thread(
        name: &str,
        max_threads: u32,
        body: impl FnOnce(
            &mut quench_ir::Builder,
            quench_ir::Value,
            quench_ir::Value,
        ) -> quench_ir::Value,
    ) -> quench_ir::Function {
        use quench_ir::{AddrSpace, Builder, Scalar, Type};
        let ptr = Type::Ptr(AddrSpace::Global, Scalar::U32);
        let mut k = Builder::new(name, max_threads);
        let x = k.param("x", ptr);
        let y = k.param("y", ptr);
        let n = k.param("n", Type::U32);
        let gid = k.global_id_x();
        let in_range = k.lt(gid, n);
        k.if_then(in_range, |k| {
            let v = body(k, x, gid);
            let py = k.ptr_add(y, gid);
            k.store(py, v);
        });
        k.finish().unwrap()
    }

    /// `y[i] = x[i] * 3 + i`: global loads and stores, the parameters, and
    /// `%ntid`/`%nctaid` from constant bank 0.
    fn probe() -> quench_ir::Function {
        per_thread("native_probe", 128, |k, x, gid| {
            let px = k.ptr_add(x, gid);
            let xv = k.load(quench_ir::Type::U32, px);
            let tripled = k.mul_const(xv, 3);
            k.add(tripled, gid)
        })
    }

    /// `y[i] = sum over j < 96 of (j + 1) * x[96 i + j]`, the 96 loads made before the
    /// sum: more values live at once than the 64 registers a 1024-thread block leaves a
    /// thread, so the code spills to a stack frame (local memory).
    fn spilling_probe() -> quench_ir::Function {
        per_thread("native_stack", 1024, |k, x, gid| {
            let base = k.mul_const(gid, 96);
            let values: Vec<_> = (0..96)
                .map(|j| {
                    let at = k.add_const(base, j);
                    let p = k.ptr_add(x, at);
                    k.load(quench_ir::Type::U32, p)
                })
                .collect();
            let mut sum = k.const_u32(0);
            for (j, v) in values.into_iter().enumerate().rev() {
                let term = k.mul_const(v, j as u32 + 1);
                sum = k.add(sum, term);
            }
            sum
        })
    }

    #[test]
    fn the_spilling_probe_has_a_stack_frame() {
        let own = quench_sass::codegen::compile_cubin(&spilling_probe()).unwrap();
        let c = Cubin::parse(&own).unwrap();
        let frame = c.kernels[0].frame_size.unwrap_or(0);
        assert!(
            frame > 0,
            "no frame: the GPU test would not reach local memory"
        );
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

        const WAIT: Duration = Duration::from_secs(5);
        const XS: u32 = 400_000;
        let step = |what: &str| eprintln!("native-dispatch: {what}");
        let module = version::loaded_module(Path::new(version::PROC_VERSION)).unwrap();
        let rm = std::rc::Rc::new(DeviceFiles::open(Path::new("/dev")).unwrap());
        let gpu = Gpu::open(&rm, &module.version, 0).unwrap();
        let x = gpu
            .allocate(u64::from(XS) * 4, Placement::Device, true)
            .unwrap();
        let y = gpu
            .allocate(u64::from(XS) * 4, Placement::Host, true)
            .unwrap();
        let xs: Vec<u32> = (0..XS)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5bd1)
            .collect();
        let packed: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
        x.write(0, &packed).unwrap();
        let channel = Channel::create(&gpu, 1024).unwrap();
        let mut launcher = Launcher::new(&gpu, channel).unwrap();
        launcher.bind(WAIT).unwrap();
        step(&format!(
            "compute class bound, windows placed; {:?}",
            launcher.geometry
        ));

        type Expect = fn(&[u32], u32) -> u32;
        let cases: [(quench_ir::Function, u32, u32, Expect); 2] = [
            (probe(), 100_003, 128, |xs, i| {
                xs[i as usize].wrapping_mul(3).wrapping_add(i)
            }),
            (spilling_probe(), 4_099, 256, |xs, i| {
                (0..96u32).fold(0u32, |sum, j| {
                    sum.wrapping_add(xs[(96 * i + j) as usize].wrapping_mul(j + 1))
                })
            }),
        ];
        for (f, n, block, expect) in cases {
            let own = quench_sass::codegen::compile_cubin(&f).unwrap();
            let ptx = quench_ptx::emit(&f).unwrap();
            let ptxas = quench_ptx::ptxas::assemble(&ptx, "sm_90").unwrap().cubin;
            let dims = LaunchDims {
                grid: [n.div_ceil(block), 1, 1],
                block: [block, 1, 1],
                dynamic_shared_bytes: 0,
            };
            for (label, cubin) in [("quench's own SASS", &own), ("ptxas", &ptxas)] {
                let name = &f.name;
                let frame = Cubin::parse(cubin).unwrap().kernels[0]
                    .frame_size
                    .unwrap_or(0);
                for i in 0..u64::from(n) {
                    y.write_u32(i * 4, 0xdead_beef).unwrap();
                }
                let program = Program::load(&gpu, cubin).unwrap();
                let block = params(
                    cubin,
                    name,
                    &[
                        &x.gpu_address().to_le_bytes(),
                        &y.gpu_address().to_le_bytes(),
                        &n.to_le_bytes(),
                    ],
                );
                let grid = GridLaunch {
                    program: &program,
                    kernel: name,
                    dims,
                    params: block,
                };
                let first = launcher.run(&grid, WAIT).unwrap();
                let wrong = (0..n)
                    .filter(|&i| y.read_u32(u64::from(i) * 4).unwrap() != expect(&xs, i))
                    .count();
                assert_eq!(
                    wrong, 0,
                    "{name} from {label}: {wrong} of {n} elements wrong"
                );
                let mut times: Vec<Duration> = (0..200)
                    .map(|_| launcher.run(&grid, WAIT).unwrap())
                    .collect();
                times.sort();
                step(&format!(
                    "{name} from {label} ({frame}-byte frame): {n} elements right (first \
                     run {first:?}); submit to semaphore, median of 200 runs {:?}",
                    times[100]
                ));
            }
        }
    }
}
