//! Graphs as push-buffer segments: a captured sequence of launches written once into GPU
//! memory (every launch's QMD and constant bank 0, and the push buffer that starts the
//! grids in turn), so that a replay is one GPFIFO entry instead of a submission a launch.
//!
//! The grids run as a chain: each QMD names the next as its dependent, which the hardware
//! starts once the grid before has finished, with no submission or wait-for-idle between
//! them; each grid also releases a progress word with its number, so a fault names the
//! kernel it stopped in. The segment's memory: the progress word at 0; each launch's QMD
//! and then its constant bank 0; then the push buffer: the progress reset, the first
//! grid started (`SEND_PCAS`), and an acquire that holds the channel until the last grid
//! has released its number.

use std::time::Duration;

use super::dispatch::{GridLaunch, Launcher, Prepared, COMPUTE};
use super::error::NativeError;
use super::launch::stack_bytes;
use super::memory::{Allocation, Placement};
use super::pushbuf::{GpEntry, Level, PcasAction, PushBuffer};
use super::qmd::{Qmd, SemaphoreRelease, QMD_ALIGN, QMD_BYTES};
use super::rm::ResourceManager;

/// Where the progress word lies, and where the launches start.
const PROGRESS: u64 = 0;
const FIRST_LAUNCH: u64 = QMD_ALIGN;
/// Constant bank 0 after its QMD, at the next 64-byte boundary the QMD allows.
const BANK0_AFTER_QMD: u64 = (QMD_BYTES as u64).next_multiple_of(64);

/// A recorded segment; [`Launcher::replay`] runs it.
pub struct Segment<R: ResourceManager> {
    memory: Allocation<R>,
    launches: Vec<Written>,
    push_at: u64,
    push_words: usize,
    /// The largest stack of its launches, and the local memory per thread the QMDs were
    /// written for (which matters only where a launch has a stack).
    stack: u32,
    per_thread: u32,
    /// The serial of the latest replay's submission.
    last_serial: u64,
}

/// A launch as written into the segment's memory.
struct Written {
    prepared: Prepared,
    kernel: String,
    qmd_at: u64,
}

impl Written {
    fn bank0_at(&self) -> u64 {
        self.qmd_at + BANK0_AFTER_QMD
    }
}

impl<R: ResourceManager> Launcher<R> {
    /// Writes `launches` into GPU memory as one segment; waits up to `timeout` where the
    /// compute class must first be bound or given local memory.
    pub fn record(
        &mut self,
        launches: &[GridLaunch<'_, R>],
        timeout: Duration,
    ) -> Result<Segment<R>, NativeError> {
        self.bind(timeout)?;
        let mut written = Vec::with_capacity(launches.len());
        let mut end = FIRST_LAUNCH;
        for l in launches {
            let prepared = self.prepare(l, timeout)?;
            let qmd_at = end;
            end = (qmd_at + BANK0_AFTER_QMD + prepared.bank0.len() as u64)
                .next_multiple_of(QMD_ALIGN);
            written.push(Written {
                prepared,
                kernel: l.kernel.to_string(),
                qmd_at,
            });
        }
        // Stacks are laid out by the local memory given last, which the largest needs.
        let stack = written
            .iter()
            .map(|w| stack_bytes(w.prepared.launch.local_bytes_per_thread))
            .max()
            .unwrap_or(0);
        let per_thread = self.local_per_thread();

        // The push buffer goes after the launches; its length does not depend on where.
        let push_at = end;
        let push_words = push_buffer(0, &written)?.words().len();
        let memory =
            self.gpu()
                .allocate(push_at + 4 * push_words as u64, Placement::Device, true)?;
        for (i, w) in written.iter().enumerate() {
            let qmd = self.chained_qmd(&memory, &written, i)?;
            memory.write(w.qmd_at, &qmd.to_bytes())?;
            memory.write(w.bank0_at(), &w.prepared.bank0)?;
        }
        let push = push_buffer(memory.gpu_address(), &written)?;
        memory.write(push_at, &push.to_bytes())?;
        Ok(Segment {
            memory,
            launches: written,
            push_at,
            push_words,
            stack,
            per_thread,
            last_serial: 0,
        })
    }

    /// Runs `segment` after the work submitted before, as one GPFIFO entry; waits up to
    /// `timeout` only where the compute class's local memory changed since the segment
    /// was written (its stacks are laid out again) or a push buffer region is in use.
    pub fn replay(
        &mut self,
        segment: &mut Segment<R>,
        timeout: Duration,
    ) -> Result<(), NativeError> {
        self.bind(timeout)?;
        if segment.stack > 0 {
            // A launcher made since (after a fault) has no local memory yet.
            if segment.stack > self.local_per_thread() {
                self.give_local_memory(segment.stack, timeout)?;
            }
            let now = self.local_per_thread();
            if now != segment.per_thread {
                // The grids of an earlier replay may still read the QMDs.
                self.finish(timeout)?;
                for (i, w) in segment.launches.iter().enumerate() {
                    let qmd = self.chained_qmd(&segment.memory, &segment.launches, i)?;
                    segment.memory.write(w.qmd_at, &qmd.to_bytes())?;
                }
                segment.per_thread = now;
            }
        }
        let entry = GpEntry::new(
            segment.memory.gpu_address() + segment.push_at,
            segment.push_words,
            Level::Main,
        )?;
        let written = self.gpu().programs_written();
        segment.last_serial = self.submit_after(Some(entry), PushBuffer::new(), timeout)?;
        self.note_grids(segment.last_serial, written);
        Ok(())
    }
}

impl<R: ResourceManager> Launcher<R> {
    /// The QMD of launch `i` of `written` in the segment memory `memory`: it releases the
    /// progress word with `i + 1` when its grid has finished and starts the next grid.
    fn chained_qmd(
        &self,
        memory: &Allocation<R>,
        written: &[Written],
        i: usize,
    ) -> Result<Qmd, NativeError> {
        let base = memory.gpu_address();
        let w = &written[i];
        let mut qmd = self.qmd_launch(&w.prepared, base + w.bank0_at());
        qmd.release = Some(SemaphoreRelease {
            address: base + PROGRESS,
            payload: i as u32 + 1,
        });
        qmd.next = written.get(i + 1).map(|n| base + n.qmd_at);
        // The first grid invalidates the instruction cache, so a replay runs the code
        // written before it; the grids after it run the same code.
        qmd.invalidate_code = i == 0;
        Ok(qmd.pack()?)
    }
}

impl<R: ResourceManager> Segment<R> {
    /// Where the submission `serial` is this segment's latest replay, the kernel it has
    /// not finished: its name and place in the segment.
    pub fn unfinished(&self, serial: u64) -> Result<Option<String>, NativeError> {
        if serial != self.last_serial || self.launches.is_empty() {
            return Ok(None);
        }
        let done = self.memory.read_u64(PROGRESS)? as usize;
        Ok(self.launches.get(done).map(|w| {
            format!(
                "{} (launch {} of {} in a graph)",
                w.kernel,
                done + 1,
                self.launches.len()
            )
        }))
    }
}

/// The push buffer of a segment whose memory is at `base`: the progress reset, the first
/// grid of the chain started, and a wait until the last has released its number.
fn push_buffer(base: u64, written: &[Written]) -> Result<PushBuffer, NativeError> {
    let mut push = PushBuffer::new();
    push.semaphore_release(base + PROGRESS, 0)?;
    if let Some(first) = written.first() {
        push.launch(
            COMPUTE,
            base + first.qmd_at,
            PcasAction::InvalidateCopySchedule,
        )?;
        push.semaphore_acquire(base + PROGRESS, written.len() as u64)?;
    }
    Ok(push)
}

#[cfg(test)]
mod tests {
    use super::super::channel::Channel;
    use super::super::dispatch::Program;
    use super::super::fake::{FakeRm, H200};
    use super::super::launch::tests::desc;
    use super::super::launch::LaunchDims;
    use super::super::memory::tests::DRIVER;
    use super::super::memory::Gpu;
    use super::super::pushbuf::compute;
    use super::*;
    use quench_sass::build::build;
    use quench_sass::cubin::PARAM_BASE;
    use std::rc::Rc;

    const T: Duration = Duration::from_millis(50);

    /// The launch tests' kernel `scale(p, n)`: what its code does does not matter to
    /// where its launches are written.
    fn program(gpu: &Gpu<FakeRm>) -> Program<FakeRm> {
        Program::load(gpu, &build(&desc()).unwrap()).unwrap()
    }

    fn word(bytes: &[u8], i: usize) -> u32 {
        u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap())
    }

    #[test]
    fn a_graph_is_written_once_and_replayed_as_one_gpfifo_entry() {
        let rm = Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let mut launcher = Launcher::new(&gpu, Channel::create(&gpu, 64).unwrap()).unwrap();
        launcher.pretend_all_finished();
        let program = program(&gpu);
        let live = rm.live_objects().len();
        let launches: Vec<_> = (1..=3u32)
            .map(|i| GridLaunch {
                program: &program,
                kernel: "scale",
                dims: LaunchDims {
                    grid: [10 * i, 1, 1],
                    block: [128, 1, 1],
                    dynamic_shared_bytes: 0,
                },
                params: [[i as u8; 8].as_slice(), &i.to_le_bytes()].concat(),
            })
            .collect();
        let mut segment = launcher.record(&launches, T).unwrap();
        assert_eq!(segment.launches.len(), 3);
        assert_eq!(
            rm.live_objects().len(),
            live + 2,
            "one allocation and its range"
        );

        // Each launch's QMD names its grid and its own constant bank 0, which holds its
        // parameters, releases the progress word with its number and names the next QMD
        // as its dependent; the push buffer starts the first grid only.
        let base = segment.memory.gpu_address();
        let mut bytes = vec![0u8; segment.memory.size() as usize];
        segment.memory.read(0, &mut bytes).unwrap();
        let push: Vec<u32> = (0..segment.push_words)
            .map(|i| word(&bytes, segment.push_at as usize / 4 + i))
            .collect();
        let mut started = vec![];
        for (i, w) in push.iter().enumerate() {
            // An incrementing method header (SEC_OP 1) for SEND_PCAS_A on the compute
            // subchannel, one data word.
            if *w == (1 << 29) | (1 << 16) | (COMPUTE << 13) | (compute::SEND_PCAS_A >> 2) {
                started.push(u64::from(push[i + 1]) << 8);
            }
        }
        let qmds: Vec<u64> = segment.launches.iter().map(|w| base + w.qmd_at).collect();
        assert_eq!(started, qmds[..1]);
        for (i, w) in segment.launches.iter().enumerate() {
            let q = w.qmd_at as usize / 4;
            assert_eq!(
                word(&bytes, q + 1024 / 32),
                10 * (i as u32 + 1),
                "GRID_WIDTH"
            );
            let bank0 = u64::from(word(&bytes, q + 1536 / 32)) << 6;
            assert_eq!(
                bank0,
                base + w.bank0_at(),
                "CONSTANT_BUFFER0_ADDR_LOWER_SHIFTED6"
            );
            let p = w.bank0_at() as usize + PARAM_BASE as usize;
            assert_eq!(bytes[p..p + 8], [i as u8 + 1; 8]);
            assert_eq!(word(&bytes, p / 4 + 2), i as u32 + 1);
            // DEPENDENT_QMD_ENABLE(0) (368) and DEPENDENT_QMD0_POINTER (479:448);
            // RELEASE_ENABLE(0) (320), the semaphore's address (671:640) and payload
            // (735:704).
            let next = qmds.get(i + 1).copied();
            assert_eq!((word(&bytes, q + 11) >> 16) & 1, u32::from(next.is_some()));
            assert_eq!(u64::from(word(&bytes, q + 14)), next.map_or(0, |a| a >> 8));
            assert_eq!(word(&bytes, q + 10) & 1, 1);
            assert_eq!(
                u64::from(word(&bytes, q + 20)),
                (base + PROGRESS) & 0xffff_ffff
            );
            assert_eq!(word(&bytes, q + 22), i as u32 + 1);
            // DEPENDENT_QMD_PREFETCH(0) (372) where there is a next QMD; the first grid
            // alone invalidates the instruction cache (606).
            assert_eq!((word(&bytes, q + 11) >> 20) & 1, u32::from(next.is_some()));
            assert_eq!((word(&bytes, q + 18) >> 30) & 1, u32::from(i == 0));
        }

        // A replay is the segment's entry and then the host's semaphore release.
        let entry_at = |l: &Launcher<FakeRm>, e: u64| l.channel().ring().read_u64(8 * e).unwrap();
        let before = (0..64).take_while(|&e| entry_at(&launcher, e) != 0).count() as u64;
        launcher.replay(&mut segment, T).unwrap();
        let ring = launcher.channel().ring();
        let entry = GpEntry::new(base + segment.push_at, segment.push_words, Level::Main).unwrap();
        assert_eq!(ring.read_u64(8 * before).unwrap(), entry.to_u64());
        assert_ne!(ring.read_u64(8 * (before + 1)).unwrap(), 0);
        assert_eq!(ring.read_u64(8 * (before + 2)).unwrap(), 0);

        // Stopped after the first grid: the second is named.
        segment.memory.write_u64(PROGRESS, 1).unwrap();
        assert_eq!(
            segment.unfinished(segment.last_serial).unwrap().as_deref(),
            Some("scale (launch 2 of 3 in a graph)")
        );
        assert_eq!(segment.unfinished(segment.last_serial + 1).unwrap(), None);
        drop(segment);
        assert_eq!(rm.live_objects().len(), live);
    }
}
