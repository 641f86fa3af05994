//! A GPU opened for work, its virtual address space, and memory in it.
//!
//! [`Gpu::open`] makes the objects everything else hangs from: a client, the device and
//! subdevice of one GPU, and a `FERMI_VASPACE_A` address space under the device.
//! [`Gpu::allocate`] makes an [`Allocation`]: a memory object on the GPU
//! (`NV01_MEMORY_LOCAL_USER`) or in host memory (`NV01_MEMORY_SYSTEM`), a range of the
//! address space (`NV50_MEMORY_VIRTUAL`) with the memory mapped into it
//! (`NV_ESC_RM_MAP_MEMORY_DMA`), and optionally a mapping for the CPU
//! (`NV_ESC_RM_MAP_MEMORY` and `mmap`).
//!
//! Each of these keeps what it made on a [`Teardown`] stack and undoes it, the most
//! recent first, when dropped, also when a later step of its construction fails.

use std::ptr::NonNull;

use super::controls::{Control, FbGetInfoV2Params, GpuGetIdInfoV2Params, FB_INFO_INDEX_HEAP_SIZE};
use super::error::NativeError;
use super::ioctl::Params;
use super::objects::{
    alloc_flags, attr, attr2, Class, Nv0080AllocParameters, Nv2080AllocParameters,
    NvMemoryAllocationParams, NvVaspaceAllocationParameters, FERMI_VASPACE_A, NV01_DEVICE_0,
    NV01_MEMORY_LOCAL_USER, NV01_MEMORY_SYSTEM, NV01_ROOT_CLIENT, NV20_SUBDEVICE_0,
    NV50_MEMORY_VIRTUAL, NVOS32_TYPE_IMAGE,
};
use super::query::handshake;
use super::rm::{CpuMapping, Handle, MapNode, ResourceManager};

/// One thing to undo.
enum Undo {
    Free {
        parent: Handle,
        object: Handle,
    },
    UnmapDma {
        device: Handle,
        dma: Handle,
        memory: Handle,
        address: u64,
    },
    UnmapCpu {
        device: Handle,
        memory: Handle,
        mapping: CpuMapping,
    },
}

/// What one owner made of the resource manager, undone the most recent first on drop.
pub(crate) struct Teardown<'rm, R: ResourceManager> {
    rm: &'rm R,
    client: Handle,
    stack: Vec<Undo>,
}

impl<'rm, R: ResourceManager> Teardown<'rm, R> {
    pub(crate) fn new(rm: &'rm R, client: Handle) -> Self {
        Teardown {
            rm,
            client,
            stack: vec![],
        }
    }

    pub(crate) fn rm(&self) -> &'rm R {
        self.rm
    }

    /// An object of `class` under `parent`, freed on teardown.
    pub(crate) fn alloc(
        &mut self,
        parent: Handle,
        class: Class,
        params: Option<&mut dyn Params>,
    ) -> Result<Handle, NativeError> {
        let object = self
            .rm
            .alloc(self.client, parent, class.id, params)
            .map_err(|e| NativeError::call(alloc_call(class), e))?;
        self.stack.push(Undo::Free { parent, object });
        Ok(object)
    }

    /// Runs control `P` on `object`; returns the parameters as the resource manager left
    /// them.
    pub(crate) fn control<P: Control>(
        &self,
        object: Handle,
        mut params: P,
    ) -> Result<P, NativeError> {
        self.rm
            .control(self.client, object, P::CMD, &mut params)
            .map_err(|e| NativeError::call(format!("{} ({:#x})", P::NAME, P::CMD), e))?;
        Ok(params)
    }

    /// Maps `memory` into the GPU range `dma`; unmapped on teardown.
    fn map_dma(
        &mut self,
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
    ) -> Result<u64, NativeError> {
        let address = self
            .rm
            .map_memory_dma(self.client, device, dma, memory, length)
            .map_err(|e| {
                NativeError::call(
                    format!("NV_ESC_RM_MAP_MEMORY_DMA of memory {memory:#x} into range {dma:#x}"),
                    e,
                )
            })?;
        self.stack.push(Undo::UnmapDma {
            device,
            dma,
            memory,
            address,
        });
        Ok(address)
    }

    /// Maps `memory` for the CPU; unmapped on teardown.
    pub(crate) fn map_cpu(
        &mut self,
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    ) -> Result<NonNull<u8>, NativeError> {
        let mapping = self
            .rm
            .map_memory(self.client, device, memory, length, flags, node)?;
        let address = NonNull::new(mapping.address).ok_or_else(|| NativeError::Mmap {
            node: node.to_string(),
            length,
            message: "the mapping is at address 0".into(),
        });
        self.stack.push(Undo::UnmapCpu {
            device,
            memory,
            mapping,
        });
        address
    }
}

impl<R: ResourceManager> Drop for Teardown<'_, R> {
    fn drop(&mut self) {
        // A failed undo cannot be reported from here and leaks nothing for long: the
        // driver frees a client's objects and mappings with the client, and the client
        // when the control node is closed.
        while let Some(undo) = self.stack.pop() {
            let _ = match undo {
                Undo::Free { parent, object } => self.rm.free(self.client, parent, object),
                Undo::UnmapDma {
                    device,
                    dma,
                    memory,
                    address,
                } => self
                    .rm
                    .unmap_memory_dma(self.client, device, dma, memory, address),
                Undo::UnmapCpu {
                    device,
                    memory,
                    mapping,
                } => self.rm.unmap_memory(self.client, device, memory, mapping),
            };
        }
    }
}

pub(crate) fn alloc_call(class: Class) -> String {
    format!("allocating {} (class {:#x})", class.name, class.id)
}

/// One GPU opened for work: a client of the resource manager, the GPU's device and
/// subdevice, and a virtual address space under the device.
pub struct Gpu<'rm, R: ResourceManager> {
    // Declared first, so dropped first: the objects go before the node is closed.
    objects: Teardown<'rm, R>,
    _node: R::GpuNode,
    client: Handle,
    device: Handle,
    subdevice: Handle,
    va_space: Handle,
    minor: u32,
    heap_bytes: u64,
}

impl<'rm, R: ResourceManager> Gpu<'rm, R> {
    /// Checks that the driver runs `driver_version` and opens the `ordinal`-th GPU it
    /// reports (in the driver's order).
    pub fn open(rm: &'rm R, driver_version: &str, ordinal: usize) -> Result<Self, NativeError> {
        handshake(rm, driver_version)?;
        let cards = rm
            .card_info()
            .map_err(|e| NativeError::call("NV_ESC_CARD_INFO", e))?;
        let card = cards.get(ordinal).ok_or(NativeError::NoSuchGpu {
            ordinal,
            count: cards.len(),
        })?;
        let node = rm.open_gpu(card.minor_number)?;
        let mut objects = Teardown::new(rm, 0);
        let client = rm
            .alloc(0, 0, NV01_ROOT_CLIENT.id, None)
            .map_err(|e| NativeError::call(alloc_call(NV01_ROOT_CLIENT), e))?;
        objects.client = client;
        objects.stack.push(Undo::Free {
            parent: 0,
            object: client,
        });
        let ids = objects.control(client, GpuGetIdInfoV2Params::new(card.gpu_id))?;
        let device = objects.alloc(
            client,
            NV01_DEVICE_0,
            Some(&mut Nv0080AllocParameters::new(ids.device_instance, client)),
        )?;
        let subdevice = objects.alloc(
            device,
            NV20_SUBDEVICE_0,
            Some(&mut Nv2080AllocParameters { sub_device_id: 0 }),
        )?;
        let fb = objects.control(
            subdevice,
            FbGetInfoV2Params::request(&[FB_INFO_INDEX_HEAP_SIZE]),
        )?;
        // The resource manager answers in KiB.
        let heap_bytes = fb
            .value(FB_INFO_INDEX_HEAP_SIZE)
            .map_or(0, |kib| u64::from(kib) * 1024);
        let va_space = objects.alloc(
            device,
            FERMI_VASPACE_A,
            Some(&mut NvVaspaceAllocationParameters::default()),
        )?;
        Ok(Gpu {
            objects,
            _node: node,
            client,
            device,
            subdevice,
            va_space,
            minor: card.minor_number,
            heap_bytes,
        })
    }

    pub(crate) fn rm(&self) -> &'rm R {
        self.objects.rm()
    }

    pub(crate) fn client(&self) -> Handle {
        self.client
    }

    pub(crate) fn device(&self) -> Handle {
        self.device
    }

    pub(crate) fn subdevice(&self) -> Handle {
        self.subdevice
    }

    pub(crate) fn va_space(&self) -> Handle {
        self.va_space
    }

    /// N of the GPU's device node `/dev/nvidiaN`.
    pub fn minor(&self) -> u32 {
        self.minor
    }

    /// Memory available for allocations (`NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE`).
    pub fn heap_bytes(&self) -> u64 {
        self.heap_bytes
    }

    /// `size` bytes in `placement`, mapped into the GPU's address space and, when
    /// `map_cpu`, into this process. Host memory is always mapped into this process.
    pub fn allocate(
        &self,
        size: u64,
        placement: Placement,
        map_cpu: bool,
    ) -> Result<Allocation<'_, R>, NativeError> {
        Allocation::new(
            self,
            size,
            placement,
            map_cpu || placement == Placement::Host,
        )
    }
}

/// Where an allocation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The GPU's own memory; a CPU mapping goes through BAR1.
    Device,
    /// Host memory the GPU reaches over PCIe, cached and coherent for the CPU.
    Host,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::Device => "GPU memory",
            Placement::Host => "host memory",
        }
    }

    /// The page size the memory is made of and the allocation rounded to.
    pub fn page_size(self) -> u64 {
        match self {
            Placement::Device => 64 << 10,
            Placement::Host => 4 << 10,
        }
    }

    fn class(self) -> Class {
        match self {
            Placement::Device => NV01_MEMORY_LOCAL_USER,
            Placement::Host => NV01_MEMORY_SYSTEM,
        }
    }

    /// `NVOS32_ATTR_*` of the memory and of the virtual range it is mapped into.
    fn attr(self) -> u32 {
        match self {
            Placement::Device => {
                attr::LOCATION_VIDMEM | attr::PHYSICALITY_ALLOW_NONCONTIGUOUS | attr::PAGE_SIZE_BIG
            }
            Placement::Host => {
                attr::LOCATION_PCI
                    | attr::PHYSICALITY_NONCONTIGUOUS
                    | attr::COHERENCY_CACHED
                    | attr::PAGE_SIZE_4KB
            }
        }
    }

    fn attr2(self) -> u32 {
        match self {
            Placement::Device => attr2::ZBC_PREFER_NO_ZBC | attr2::GPU_CACHEABLE_YES,
            Placement::Host => attr2::ZBC_PREFER_NO_ZBC | attr2::GPU_CACHEABLE_NO,
        }
    }

    /// The node a CPU mapping goes through.
    fn map_node(self, minor: u32) -> MapNode {
        match self {
            Placement::Device => MapNode::Gpu(minor),
            Placement::Host => MapNode::Control,
        }
    }
}

/// Memory mapped into a GPU's address space, and perhaps into this process; unmapped and
/// freed when dropped.
pub struct Allocation<'g, R: ResourceManager> {
    /// The memory, its range and mappings, undone on drop.
    _objects: Teardown<'g, R>,
    memory: Handle,
    gpu_address: u64,
    size: u64,
    placement: Placement,
    cpu: Option<NonNull<u8>>,
}

impl<'g, R: ResourceManager> Allocation<'g, R> {
    fn new(
        gpu: &'g Gpu<'_, R>,
        size: u64,
        placement: Placement,
        map_cpu: bool,
    ) -> Result<Self, NativeError> {
        let refuse = |reason: String| NativeError::AllocationSize {
            size,
            placement: placement.name(),
            reason,
        };
        if size == 0 {
            return Err(refuse("an allocation needs at least one byte".into()));
        }
        if size > gpu.heap_bytes {
            return Err(refuse(format!(
                "the GPU has {} bytes for allocations",
                gpu.heap_bytes
            )));
        }
        let page = placement.page_size();
        let size = size.div_ceil(page) * page;

        let mut objects = Teardown::new(gpu.rm(), gpu.client);
        let memory = objects.alloc(
            gpu.device,
            placement.class(),
            Some(&mut NvMemoryAllocationParams {
                owner: gpu.client,
                type_: NVOS32_TYPE_IMAGE,
                flags: alloc_flags::IGNORE_BANK_PLACEMENT
                    | alloc_flags::ALIGNMENT_FORCE
                    | alloc_flags::MAP_NOT_REQUIRED,
                attr: placement.attr(),
                attr2: placement.attr2(),
                size,
                alignment: page,
                ..NvMemoryAllocationParams::default()
            }),
        )?;
        let range = objects.alloc(
            gpu.device,
            NV50_MEMORY_VIRTUAL,
            Some(&mut NvMemoryAllocationParams {
                owner: gpu.client,
                type_: NVOS32_TYPE_IMAGE,
                flags: alloc_flags::VIRTUAL | alloc_flags::ALIGNMENT_FORCE,
                attr: placement.attr(),
                attr2: placement.attr2(),
                size,
                alignment: page,
                h_va_space: gpu.va_space,
                ..NvMemoryAllocationParams::default()
            }),
        )?;
        let gpu_address = objects.map_dma(gpu.device, range, memory, size)?;
        let cpu = if map_cpu {
            Some(objects.map_cpu(gpu.device, memory, size, 0, placement.map_node(gpu.minor))?)
        } else {
            None
        };
        Ok(Allocation {
            _objects: objects,
            memory,
            gpu_address,
            size,
            placement,
            cpu,
        })
    }

    /// The allocation's address in the GPU's virtual address space.
    pub fn gpu_address(&self) -> u64 {
        self.gpu_address
    }

    /// Its size in bytes: the size asked for, rounded up to whole pages.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Where it is mapped in this process, if it is.
    pub fn cpu_address(&self) -> Option<NonNull<u8>> {
        self.cpu
    }

    /// The memory object's handle.
    pub(crate) fn memory(&self) -> Handle {
        self.memory
    }

    fn cpu_at(&self, what: &'static str, offset: u64, length: u64) -> Result<*mut u8, NativeError> {
        // Memory not mapped for the CPU has no bytes the CPU can reach.
        let out_of_bounds = NativeError::OutOfBounds {
            what,
            offset,
            length,
            size: if self.cpu.is_some() { self.size } else { 0 },
        };
        let Some(base) = self.cpu else {
            return Err(out_of_bounds);
        };
        match offset.checked_add(length) {
            Some(end) if end <= self.size && offset.is_multiple_of(length.min(8).max(1)) => {
                // SAFETY: within the mapping, which lives as long as `self`.
                Ok(unsafe { base.as_ptr().add(offset as usize) })
            }
            _ => Err(out_of_bounds),
        }
    }

    /// Copies `bytes` into the allocation at `offset` through the CPU mapping.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), NativeError> {
        let dst = self.cpu_at("a write", offset, bytes.len() as u64)?;
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: in bounds (checked above); volatile, since the GPU reads it.
            unsafe { dst.add(i).write_volatile(*b) };
        }
        Ok(())
    }

    /// Writes a naturally aligned 32-bit word at `offset`.
    pub fn write_u32(&self, offset: u64, value: u32) -> Result<(), NativeError> {
        let dst = self.cpu_at("a 32-bit write", offset, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked above; mappings are page aligned).
        unsafe { dst.cast::<u32>().write_volatile(value) };
        Ok(())
    }

    /// Writes a naturally aligned 64-bit word at `offset`.
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<(), NativeError> {
        let dst = self.cpu_at("a 64-bit write", offset, 8)?;
        // SAFETY: in bounds and 8-byte aligned (checked above).
        unsafe { dst.cast::<u64>().write_volatile(value) };
        Ok(())
    }

    /// Reads the naturally aligned 32-bit word at `offset`, as the GPU left it.
    pub fn read_u32(&self, offset: u64) -> Result<u32, NativeError> {
        let src = self.cpu_at("a 32-bit read", offset, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked above).
        Ok(unsafe { src.cast::<u32>().read_volatile() })
    }

    /// Reads the naturally aligned 64-bit word at `offset`, as the GPU left it.
    pub fn read_u64(&self, offset: u64) -> Result<u64, NativeError> {
        let src = self.cpu_at("a 64-bit read", offset, 8)?;
        // SAFETY: in bounds and 8-byte aligned (checked above).
        Ok(unsafe { src.cast::<u64>().read_volatile() })
    }
}
