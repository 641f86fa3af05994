//! A channel: where a GPU fetches the work quench submits.
//!
//! [`Channel::create`] makes, in this order: one allocation in GPU memory, mapped for the
//! CPU, holding the GPFIFO ring and after it the channel's USERD page; a
//! `KEPLER_CHANNEL_GROUP_A` (on the graphics engine, which runs compute, in the GPU's
//! address space); a `HOPPER_CHANNEL_GPFIFO_A` in the group over that ring and USERD;
//! `HOPPER_COMPUTE_A` and `HOPPER_DMA_COPY_A` objects on the channel; the channel's work
//! submit token; the group put on the hardware's runlist; and `HOPPER_USERMODE_A`, mapped
//! for the CPU, whose doorbell register tells the GPU that a channel has new work.
//!
//! [`Channel::submit`] writes one GPFIFO entry at `GP_PUT`, advances `GP_PUT` in USERD,
//! and writes the token to the doorbell.

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

/// The most GPFIFO entries a channel takes here (the ring is one allocation).
pub const MAX_GPFIFO_ENTRIES: u32 = 1 << 16;

/// A GPFIFO channel with compute and copy objects, scheduled and ready for work; freed
/// when dropped, the channel's objects before its ring.
pub struct Channel<'g, R: ResourceManager> {
    // Declared first, so dropped first: everything made after the ring goes before it.
    _objects: Teardown<'g, R>,
    ring: Allocation<'g, R>,
    doorbell: NonNull<u8>,
    entries: u32,
    put: u32,
    token: u32,
}

impl<'g, R: ResourceManager> Channel<'g, R> {
    /// A channel of `entries` GPFIFO entries (a power of two from 2 to
    /// [`MAX_GPFIFO_ENTRIES`]) on `gpu`.
    pub fn create(gpu: &'g Gpu<'_, R>, entries: u32) -> Result<Self, NativeError> {
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

        let mut objects = Teardown::new(gpu.rm(), gpu.client());
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
    pub(crate) fn ring(&self) -> &Allocation<'g, R> {
        &self.ring
    }

    fn userd(&self) -> u64 {
        (u64::from(self.entries) * 8).next_multiple_of(userd::SIZE)
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
