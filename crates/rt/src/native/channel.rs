//! A channel: where a GPU fetches the work quench submits.
//!
//! [`Channel::create`] makes, in this order: one allocation in GPU memory, mapped for the
//! CPU, holding the GPFIFO ring and after it the channel's USERD page; a page of host
//! memory where the resource manager reports the channel's errors; a
//! `KEPLER_CHANNEL_GROUP_A` (on the graphics engine, which runs compute, in the GPU's
//! address space); a `HOPPER_CHANNEL_GPFIFO_A` in the group over that ring and USERD;
//! `HOPPER_COMPUTE_A` and `HOPPER_DMA_COPY_A` objects on the channel; the channel's work
//! submit token; the group put on the hardware's runlist; and `HOPPER_USERMODE_A`, mapped
//! for the CPU, whose doorbell register tells the GPU that a channel has new work.
//!
//! [`Channel::submit`] writes one GPFIFO entry at `GP_PUT`, advances `GP_PUT` in USERD,
//! and writes the token to the doorbell. [`Channel::fault`] reads the error notifier: when
//! the GPU faults on the channel's work (a kernel's bad address, an illegal instruction),
//! the resource manager stops the channel and writes the error there; the channel takes no
//! more work and is made again.

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use super::controls::{GpfifoGetWorkSubmitTokenParams, GpfifoScheduleParams};
use super::error::NativeError;
use super::ioctl::NVOS33_FLAGS_ACCESS_WRITE_ONLY;
use super::memory::{Allocation, Gpu, Placement, Teardown};
use super::objects::{
    NvChannelAllocParams, NvChannelGroupAllocationParameters, HOPPER_CHANNEL_GPFIFO_A,
    HOPPER_COMPUTE_A, HOPPER_DMA_COPY_A, HOPPER_USERMODE_A, KEPLER_CHANNEL_GROUP_A,
    NV2080_ENGINE_TYPE_GRAPHICS, NV_MAX_SUBDEVICES,
};
use super::pushbuf::GpEntry;
use super::rm::{MapNode, ResourceManager};

/// The USERD page of HOPPER_CHANNEL_GPFIFO_A (`Nvc86fControl` in
/// src/common/sdk/nvidia/inc/class/clc86f.h): 0x200 bytes, `GPGet` (read only) at 0x88 and
/// `GPPut` at 0x8c, both counted in entries.
pub mod userd {
    pub const SIZE: u64 = 0x200;
    pub const GP_GET: u64 = 0x88;
    pub const GP_PUT: u64 = 0x8c;
}

/// The usermode registers (`HOPPER_USERMODE_A`): how much quench maps, and the doorbell
/// `NOTIFY_CHANNEL_PENDING` (`NVC361_NOTIFY_CHANNEL_PENDING` in
/// src/common/sdk/nvidia/inc/class/clc361.h, which Hopper's usermode class keeps).
pub mod usermode {
    pub const MAP_SIZE: u64 = 0x10000;
    pub const NOTIFY_CHANNEL_PENDING: u64 = 0x90;
}

/// The channel's error notifier (`hObjectError`): an `NvNotification` array in host memory
/// (src/common/sdk/nvidia/inc/nvtypes.h; index 0, `NV_CHANNELGPFIFO_NOTIFICATION_TYPE_ERROR`,
/// is the one the resource manager writes on a robust-channel error: the error's code in
/// `info32`, then `status` 0xffff).
pub mod notifier {
    pub const BYTES: u64 = 0x1000;
    pub const INFO32: u64 = 8;
    /// `info16` (the engine) in the low half, `status` in the high half.
    pub const INFO16_STATUS: u64 = 12;
}

/// The most GPFIFO entries a channel takes here (the ring is one allocation).
pub const MAX_GPFIFO_ENTRIES: u32 = 1 << 16;

/// A GPFIFO channel with compute and copy objects, scheduled and ready for work; freed
/// when dropped, the channel's objects before its ring.
pub struct Channel<R: ResourceManager> {
    // Declared first, so dropped first: everything made after the ring goes before it.
    _objects: Teardown<R>,
    errors: Allocation<R>,
    ring: Allocation<R>,
    doorbell: NonNull<u8>,
    entries: u32,
    put: u32,
    token: u32,
}

impl<R: ResourceManager> Channel<R> {
    /// A channel of `entries` GPFIFO entries (a power of two from 2 to
    /// [`MAX_GPFIFO_ENTRIES`]) on `gpu`.
    pub fn create(gpu: &Gpu<R>, entries: u32) -> Result<Self, NativeError> {
        if !entries.is_power_of_two() || !(2..=MAX_GPFIFO_ENTRIES).contains(&entries) {
            return Err(NativeError::ChannelShape {
                entries,
                reason: "the ring takes a power of two from 2 to 65536 entries",
            });
        }
        let ring_bytes = u64::from(entries) * 8;
        // The ring, then USERD (entries * 8 is a multiple of 16; USERD wants 512-byte
        // alignment, which a ring of 64 or more entries gives and a smaller one is
        // padded to).
        let userd_offset = ring_bytes.next_multiple_of(userd::SIZE);
        let ring = gpu.allocate(userd_offset + userd::SIZE, Placement::Device, true)?;
        let errors = gpu.allocate(notifier::BYTES, Placement::Host, true)?;

        let mut objects = Teardown::under(gpu);
        let group = objects.alloc(
            gpu.device(),
            KEPLER_CHANNEL_GROUP_A,
            Some(&mut NvChannelGroupAllocationParameters {
                h_va_space: gpu.va_space(),
                engine_type: NV2080_ENGINE_TYPE_GRAPHICS,
                ..NvChannelGroupAllocationParameters::default()
            }),
        )?;
        let mut userd_memory = [0; NV_MAX_SUBDEVICES];
        let mut userd_offsets = [0; NV_MAX_SUBDEVICES];
        userd_memory[0] = ring.memory();
        userd_offsets[0] = userd_offset;
        let channel = objects.alloc(
            group,
            HOPPER_CHANNEL_GPFIFO_A,
            Some(&mut NvChannelAllocParams {
                h_object_error: errors.memory(),
                gp_fifo_offset: ring.gpu_address(),
                gp_fifo_entries: entries,
                h_userd_memory: userd_memory,
                userd_offset: userd_offsets,
                ..NvChannelAllocParams::default()
            }),
        )?;
        objects.alloc(channel, HOPPER_COMPUTE_A, None)?;
        objects.alloc(channel, HOPPER_DMA_COPY_A, None)?;
        let token = objects
            .control(channel, GpfifoGetWorkSubmitTokenParams::default())?
            .work_submit_token;
        objects.control(
            group,
            GpfifoScheduleParams {
                b_enable: 1,
                ..GpfifoScheduleParams::default()
            },
        )?;
        let usermode_object = objects.alloc(gpu.subdevice(), HOPPER_USERMODE_A, None)?;
        let usermode = objects.map_cpu(
            gpu.subdevice(),
            usermode_object,
            usermode::MAP_SIZE,
            NVOS33_FLAGS_ACCESS_WRITE_ONLY,
            MapNode::Gpu(gpu.minor()),
        )?;
        // SAFETY: the doorbell is inside the usermode mapping (MAP_SIZE bytes).
        let doorbell = unsafe { usermode.add(usermode::NOTIFY_CHANNEL_PENDING as usize) };
        Ok(Channel {
            _objects: objects,
            errors,
            ring,
            doorbell,
            entries,
            put: 0,
            token,
        })
    }

    /// The GPFIFO entries of the ring.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// The token [`Channel::submit`] writes to the doorbell.
    pub fn work_submit_token(&self) -> u32 {
        self.token
    }

    /// The allocation holding the ring and USERD.
    #[cfg(test)]
    pub(crate) fn ring(&self) -> &Allocation<R> {
        &self.ring
    }

    fn userd(&self) -> u64 {
        (u64::from(self.entries) * 8).next_multiple_of(userd::SIZE)
    }

    /// The error the resource manager reported on the channel, by its robust-channel code
    /// (`ROBUST_CHANNEL_*` in src/common/sdk/nvidia/inc/nverror.h); `None` while there is
    /// none.
    pub fn fault(&self) -> Result<Option<u32>, NativeError> {
        if self.errors.read_u32(notifier::INFO16_STATUS)? >> 16 == 0 {
            return Ok(None);
        }
        Ok(Some(self.errors.read_u32(notifier::INFO32)?))
    }

    /// The error notifier's page.
    #[cfg(test)]
    pub(crate) fn errors(&self) -> &Allocation<R> {
        &self.errors
    }

    /// How far the GPU has fetched: `GP_GET` from USERD.
    pub fn gp_get(&self) -> Result<u32, NativeError> {
        self.ring.read_u32(self.userd() + userd::GP_GET)
    }

    /// Hands `segment` to the GPU: the entry at `GP_PUT` in the ring, `GP_PUT` one on in
    /// USERD, then the work submit token to the doorbell. The push buffer the entry
    /// points at must be written before (and stay until the GPU is done with it).
    pub fn submit(&mut self, segment: GpEntry) -> Result<(), NativeError> {
        let next = (self.put + 1) % self.entries;
        let get = self.gp_get()?;
        if next == get {
            return Err(NativeError::RingFull {
                entries: self.entries,
                put: self.put,
                get,
            });
        }
        self.ring
            .write_u64(u64::from(self.put) * 8, segment.to_u64())?;
        // The entry must be visible before GP_PUT says it is there, and GP_PUT before
        // the doorbell makes the GPU read it.
        fence(Ordering::SeqCst);
        self.ring.write_u32(self.userd() + userd::GP_PUT, next)?;
        self.put = next;
        fence(Ordering::SeqCst);
        // SAFETY: the doorbell register lies inside the usermode mapping, which lives as
        // long as `self._objects`; 0x90 is 4-byte aligned.
        unsafe { self.doorbell.cast::<u32>().write_volatile(self.token) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::controls::Control;
    use super::super::fake::{assert_undone_in_reverse, work_submit_token, Call, FakeRm, H200};
    use super::super::memory::tests::{calls_from, DEVICE, DRIVER, SUBDEVICE, VA_SPACE};
    use super::super::pushbuf::{GpEntry, Level};
    use super::*;

    // The handles the fake gives a channel's objects after Gpu::open's.
    const RING: u32 = 5;
    const RING_RANGE: u32 = 6;
    const ERRORS: u32 = 7;
    const ERRORS_RANGE: u32 = 8;
    const GROUP: u32 = 9;
    const CHANNEL: u32 = 10;
    const COMPUTE: u32 = 11;
    const COPY: u32 = 12;
    const USERMODE: u32 = 13;

    #[test]
    fn a_channel_is_made_in_order_with_the_headers_parameters() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let before = rm.calls().len();
        let channel = Channel::create(&gpu, 1024).unwrap();
        assert_eq!(channel.entries(), 1024);
        assert_eq!(channel.work_submit_token(), work_submit_token(CHANNEL));
        let ring_address = channel.ring().gpu_address();
        // Ring (8 KiB) and USERD (512 bytes), rounded up to a 64 KiB page.
        assert_eq!(channel.ring().size(), 64 << 10);
        let made = calls_from(&rm, before);
        let alloc = |class, parent, handle| Call::Alloc {
            class,
            parent,
            handle,
        };
        assert_eq!(
            made,
            vec![
                alloc(0x40, DEVICE, RING),
                alloc(0x50a0, DEVICE, RING_RANGE),
                Call::MapDma {
                    device: DEVICE,
                    dma: RING_RANGE,
                    memory: RING,
                    length: 64 << 10,
                    flags: 0,
                    address: ring_address,
                },
                Call::MapMemory {
                    device: DEVICE,
                    memory: RING,
                    length: 64 << 10,
                    flags: 0,
                    node: MapNode::Gpu(0),
                },
                alloc(0x3e, DEVICE, ERRORS),
                alloc(0x50a0, DEVICE, ERRORS_RANGE),
                Call::MapDma {
                    device: DEVICE,
                    dma: ERRORS_RANGE,
                    memory: ERRORS,
                    length: 4096,
                    flags: 0x10,
                    address: channel.errors().gpu_address(),
                },
                Call::MapMemory {
                    device: DEVICE,
                    memory: ERRORS,
                    length: 4096,
                    flags: 0,
                    node: MapNode::Control,
                },
                alloc(0xa06c, DEVICE, GROUP),
                alloc(0xc86f, GROUP, CHANNEL),
                alloc(0xcbc0, CHANNEL, COMPUTE),
                alloc(0xc8b5, CHANNEL, COPY),
                Call::Control {
                    object: CHANNEL,
                    cmd: 0xc36f_0108
                },
                Call::Control {
                    object: GROUP,
                    cmd: 0xa06c_0101
                },
                alloc(0xc661, SUBDEVICE, USERMODE),
                Call::MapMemory {
                    device: SUBDEVICE,
                    memory: USERMODE,
                    length: 0x10000,
                    flags: 2,
                    node: MapNode::Gpu(0),
                },
            ]
        );
        assert_eq!(GpfifoGetWorkSubmitTokenParams::CMD, 0xc36f_0108);
        let group = rm.params::<NvChannelGroupAllocationParameters>(GROUP);
        assert_eq!(
            group,
            NvChannelGroupAllocationParameters {
                h_va_space: VA_SPACE,
                engine_type: 1,
                ..Default::default()
            }
        );
        let p = rm.params::<NvChannelAllocParams>(CHANNEL);
        assert_eq!(p.gp_fifo_offset, ring_address);
        assert_eq!(p.gp_fifo_entries, 1024);
        assert_eq!(p.h_userd_memory, [RING, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(p.userd_offset, [8192, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            (p.h_va_space, p.h_context_share, p.h_object_error, p.flags),
            (0, 0, ERRORS, 0)
        );
        assert_eq!(
            NvChannelAllocParams {
                h_object_error: 0,
                gp_fifo_offset: 0,
                gp_fifo_entries: 0,
                h_userd_memory: [0; 8],
                userd_offset: [0; 8],
                ..p
            },
            NvChannelAllocParams::default(),
            "nothing else is set"
        );

        let errors_address = channel.errors().gpu_address();
        drop(channel);
        let calls = calls_from(&rm, before + made.len());
        let free = |parent, handle| Call::Free { parent, handle };
        assert_eq!(
            calls,
            vec![
                Call::UnmapMemory {
                    device: SUBDEVICE,
                    memory: USERMODE
                },
                free(SUBDEVICE, USERMODE),
                free(CHANNEL, COPY),
                free(CHANNEL, COMPUTE),
                free(GROUP, CHANNEL),
                free(DEVICE, GROUP),
                Call::UnmapMemory {
                    device: DEVICE,
                    memory: ERRORS
                },
                Call::UnmapDma {
                    dma: ERRORS_RANGE,
                    memory: ERRORS,
                    address: errors_address
                },
                free(DEVICE, ERRORS_RANGE),
                free(DEVICE, ERRORS),
                Call::UnmapMemory {
                    device: DEVICE,
                    memory: RING
                },
                Call::UnmapDma {
                    dma: RING_RANGE,
                    memory: RING,
                    address: ring_address
                },
                free(DEVICE, RING_RANGE),
                free(DEVICE, RING),
            ]
        );
        drop(gpu);
        assert_undone_in_reverse(&rm.calls());
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn an_error_the_resource_manager_writes_is_read_back_by_its_code() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let channel = Channel::create(&gpu, 8).unwrap();
        assert_eq!(channel.fault().unwrap(), None);
        // As the resource manager writes it: the code, then the status.
        channel.errors().write_u32(notifier::INFO32, 31).unwrap();
        assert_eq!(channel.fault().unwrap(), None, "no status, no error yet");
        channel
            .errors()
            .write_u32(notifier::INFO16_STATUS, 0xffff_0001)
            .unwrap();
        assert_eq!(channel.fault().unwrap(), Some(31));
    }

    #[test]
    fn a_small_ring_keeps_userd_aligned() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let _channel = Channel::create(&gpu, 8).unwrap();
        let p = rm.params::<NvChannelAllocParams>(CHANNEL);
        assert_eq!(p.userd_offset[0], 0x200);
    }

    #[test]
    fn submit_writes_the_entry_gp_put_and_the_doorbell_where_the_headers_say() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let mut channel = Channel::create(&gpu, 4).unwrap();
        let userd = 0x200; // 4 entries of 8 bytes, USERD at the next 512 bytes.
        let doorbell = || rm.read_u32(USERMODE, 0x90);
        assert_eq!(doorbell(), 0);
        let first = GpEntry::new(0x12_3456_7000, 10, Level::Main).unwrap();
        channel.submit(first).unwrap();
        assert_eq!(rm.read_u64(RING, 0), first.to_u64());
        assert_eq!(rm.read_u32(RING, userd + 0x8c), 1, "GP_PUT");
        assert_eq!(doorbell(), work_submit_token(CHANNEL));

        let second = GpEntry::new(0x40_0000, 3, Level::Main).unwrap();
        channel.submit(second).unwrap();
        channel.submit(second).unwrap();
        assert_eq!(rm.read_u64(RING, 8), second.to_u64());
        assert_eq!(rm.read_u64(RING, 16), second.to_u64());
        assert_eq!(rm.read_u32(RING, userd + 0x8c), 3);

        // Three entries in a ring of four that the GPU has not fetched: it is full.
        let err = channel.submit(second).unwrap_err();
        assert_eq!(
            err,
            NativeError::RingFull {
                entries: 4,
                put: 3,
                get: 0
            }
        );
        assert!(
            err.to_string().contains("GPFIFO ring of 4 entries is full"),
            "{err}"
        );
        assert_eq!(rm.read_u32(RING, userd + 0x8c), 3, "GP_PUT unchanged");

        // Once the GPU has fetched two (GP_GET, which it writes, at 2), the ring wraps.
        channel.ring().write_u32(userd + 0x88, 2).unwrap();
        assert_eq!(channel.gp_get().unwrap(), 2);
        channel.submit(first).unwrap();
        assert_eq!(rm.read_u64(RING, 24), first.to_u64());
        assert_eq!(rm.read_u32(RING, userd + 0x8c), 0, "GP_PUT wrapped");
        channel.submit(second).unwrap();
        assert_eq!(rm.read_u64(RING, 0), second.to_u64());
        assert_eq!(rm.read_u32(RING, userd + 0x8c), 1);
    }

    #[test]
    fn impossible_rings_are_refused_before_any_call() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let before = rm.calls().len();
        for entries in [0, 1, 3, 1000, 1 << 17] {
            let err = Channel::create(&gpu, entries).err().unwrap();
            assert_eq!(
                err.to_string(),
                format!(
                    "a channel of {entries} GPFIFO entries cannot be made: the ring takes a \
                     power of two from 2 to 65536 entries"
                )
            );
        }
        assert_eq!(rm.calls().len(), before);
    }

    /// Needs an NVIDIA GPU (Hopper) with the open kernel module of a 580 or 590 driver,
    /// and read-write access to /dev/nvidiactl and /dev/nvidia0: run by
    /// scripts/device/native-channel.sh, never in CI (ignored tests are opt-in there).
    ///
    /// Opens GPU 0, allocates host memory, makes a channel, writes a push buffer with one
    /// host semaphore release (a 64-bit payload to an address in that host memory) and
    /// submits it, then waits up to five seconds for the payload to appear.
    #[test]
    #[ignore = "needs an NVIDIA GPU and the open kernel module: scripts/device/native-channel.sh"]
    fn on_the_gpu_a_semaphore_release_reaches_host_memory() {
        use super::super::pushbuf::PushBuffer;
        use super::super::version;
        use super::super::DeviceFiles;
        use std::path::Path;
        use std::time::{Duration, Instant};

        const PAYLOAD: u64 = 0x0123_4567_89ab_cdef;
        let step = |what: &str| eprintln!("native-channel: {what}");
        let module = version::loaded_module(Path::new(version::PROC_VERSION)).unwrap();
        step(&format!("driver {}", module.version));
        let rm = std::rc::Rc::new(DeviceFiles::open(Path::new("/dev")).unwrap());
        let gpu = Gpu::open(&rm, &module.version, 0).unwrap();
        step(&format!(
            "opened /dev/nvidia{}, heap {} bytes",
            gpu.minor(),
            gpu.heap_bytes()
        ));
        let host = gpu.allocate(4096, Placement::Host, true).unwrap();
        step(&format!(
            "host memory at GPU address {:#x}",
            host.gpu_address()
        ));
        let device = gpu.allocate(1 << 20, Placement::Device, true).unwrap();
        device.write_u64(0, PAYLOAD).unwrap();
        assert_eq!(
            device.read_u64(0).unwrap(),
            PAYLOAD,
            "GPU memory through BAR1"
        );
        step(&format!(
            "GPU memory at GPU address {:#x}, CPU round trip ok",
            device.gpu_address()
        ));
        let mut channel = Channel::create(&gpu, 1024).unwrap();
        step(&format!(
            "channel made, work submit token {:#x}",
            channel.work_submit_token()
        ));

        // The semaphore at offset 0 of the host memory, the push buffer at 0x100.
        let semaphore = host.gpu_address();
        host.write_u64(0, 0).unwrap();
        let mut push = PushBuffer::new();
        push.semaphore_release(semaphore, PAYLOAD).unwrap();
        host.write(0x100, &push.to_bytes()).unwrap();
        let entry =
            GpEntry::new(host.gpu_address() + 0x100, push.words().len(), Level::Main).unwrap();
        channel.submit(entry).unwrap();
        step("submitted one semaphore release");

        let start = Instant::now();
        loop {
            let seen = host.read_u64(0).unwrap();
            if seen == PAYLOAD {
                step(&format!(
                    "payload arrived after {:?}; GP_GET {}",
                    start.elapsed(),
                    channel.gp_get().unwrap()
                ));
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                panic!(
                    "no payload after 5 s: the semaphore reads {seen:#x}, GP_GET {}",
                    channel.gp_get().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
