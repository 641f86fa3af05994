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

use std::cell::Cell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{fence, Ordering};

use super::controls::{Control, FbGetInfoV2Params, GpuGetIdInfoV2Params, FB_INFO_INDEX_HEAP_SIZE};
use super::error::NativeError;
use super::ioctl::{Params, NVOS46_FLAGS_CACHE_SNOOP_ENABLE};
use super::objects::{
    alloc_flags, attr, attr2, Class, Nv0080AllocParameters, Nv2080AllocParameters,
    NvMemoryAllocationParams, NvVaspaceAllocationParameters, FERMI_VASPACE_A, NV01_DEVICE_0,
    NV01_MEMORY_LOCAL_USER, NV01_MEMORY_SYSTEM, NV01_ROOT_CLIENT, NV20_SUBDEVICE_0,
    NV50_MEMORY_VIRTUAL, NVOS32_TYPE_IMAGE, NV_MMU_PTE_KIND_GENERIC_MEMORY, NV_MMU_PTE_KIND_PITCH,
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

/// Whom a [`Teardown`] answers to: the resource manager itself (a GPU's own objects), or
/// a GPU, which it keeps open until everything it made there is undone.
enum Owner<R: ResourceManager> {
    Root(Rc<R>),
    Gpu(Gpu<R>),
}

/// What one owner made of the resource manager, undone the most recent first on drop.
pub(crate) struct Teardown<R: ResourceManager> {
    owner: Owner<R>,
    client: Handle,
    stack: Vec<Undo>,
}

impl<R: ResourceManager> Teardown<R> {
    /// Objects made under `gpu`'s client; `gpu` stays open as long as they do.
    pub(crate) fn under(gpu: &Gpu<R>) -> Self {
        Teardown {
            owner: Owner::Gpu(gpu.clone()),
            client: gpu.client(),
            stack: vec![],
        }
    }

    pub(crate) fn rm(&self) -> &R {
        match &self.owner {
            Owner::Root(rm) => rm,
            Owner::Gpu(gpu) => gpu.rm(),
        }
    }

    /// An object of `class` under `parent`, freed on teardown.
    pub(crate) fn alloc(
        &mut self,
        parent: Handle,
        class: Class,
        params: Option<&mut dyn Params>,
    ) -> Result<Handle, NativeError> {
        let object = self
            .rm()
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
        self.rm()
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
        flags: u32,
    ) -> Result<u64, NativeError> {
        let address = self
            .rm()
            .map_memory_dma(self.client, device, dma, memory, length, flags)
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
            .rm()
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

impl<R: ResourceManager> Drop for Teardown<R> {
    fn drop(&mut self) {
        // A failed undo cannot be reported from here and leaks nothing for long: the
        // driver frees a client's objects and mappings with the client, and the client
        // when the control node is closed. The owner (a GPU) is let go after this.
        let rm = match &self.owner {
            Owner::Root(rm) => rm.as_ref(),
            Owner::Gpu(gpu) => gpu.rm(),
        };
        while let Some(undo) = self.stack.pop() {
            let _ = match undo {
                Undo::Free { parent, object } => rm.free(self.client, parent, object),
                Undo::UnmapDma {
                    device,
                    dma,
                    memory,
                    address,
                } => rm.unmap_memory_dma(self.client, device, dma, memory, address),
                Undo::UnmapCpu {
                    device,
                    memory,
                    mapping,
                } => rm.unmap_memory(self.client, device, memory, mapping),
            };
        }
    }
}

pub(crate) fn alloc_call(class: Class) -> String {
    format!("allocating {} (class {:#x})", class.name, class.id)
}

/// One GPU opened for work: a client of the resource manager, the GPU's device and
/// subdevice, and a virtual address space under the device. Cloning it shares it:
/// everything made on the GPU (memory, channels, programs) holds a clone, so the client
/// and its objects are freed after the last of them.
pub struct Gpu<R: ResourceManager>(Rc<Opened<R>>);

impl<R: ResourceManager> Clone for Gpu<R> {
    fn clone(&self) -> Self {
        Gpu(Rc::clone(&self.0))
    }
}

struct Opened<R: ResourceManager> {
    // Declared first, so dropped first: the objects go before the node is closed.
    objects: Teardown<R>,
    _node: R::GpuNode,
    client: Handle,
    device: Handle,
    subdevice: Handle,
    va_space: Handle,
    minor: u32,
    heap_bytes: u64,
    /// Programs whose code has been written into the GPU's memory so far.
    programs_written: Cell<u64>,
}

impl<R: ResourceManager> Gpu<R> {
    /// Checks that the driver runs `driver_version` and opens the `ordinal`-th GPU it
    /// reports (in the driver's order).
    pub fn open(rm: &Rc<R>, driver_version: &str, ordinal: usize) -> Result<Self, NativeError> {
        handshake(rm.as_ref(), driver_version)?;
        let cards = rm
            .card_info()
            .map_err(|e| NativeError::call("NV_ESC_CARD_INFO", e))?;
        let card = cards.get(ordinal).ok_or(NativeError::NoSuchGpu {
            ordinal,
            count: cards.len(),
        })?;
        let node = rm.open_gpu(card.minor_number)?;
        let mut objects = Teardown {
            owner: Owner::Root(Rc::clone(rm)),
            client: 0,
            stack: vec![],
        };
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
        Ok(Gpu(Rc::new(Opened {
            objects,
            _node: node,
            client,
            device,
            subdevice,
            va_space,
            minor: card.minor_number,
            heap_bytes,
            programs_written: Cell::new(0),
        })))
    }

    pub(crate) fn rm(&self) -> &R {
        self.0.objects.rm()
    }

    pub(crate) fn client(&self) -> Handle {
        self.0.client
    }

    pub(crate) fn device(&self) -> Handle {
        self.0.device
    }

    pub(crate) fn subdevice(&self) -> Handle {
        self.0.subdevice
    }

    pub(crate) fn va_space(&self) -> Handle {
        self.0.va_space
    }

    /// N of the GPU's device node `/dev/nvidiaN`.
    pub fn minor(&self) -> u32 {
        self.0.minor
    }

    /// Memory available for allocations (`NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE`).
    pub fn heap_bytes(&self) -> u64 {
        self.0.heap_bytes
    }

    /// Records that a program's code has been written into the GPU's memory, where an
    /// instruction cache may still hold other code from before.
    pub fn note_program_written(&self) {
        self.0
            .programs_written
            .set(self.0.programs_written.get() + 1);
    }

    /// Programs written so far ([`Gpu::note_program_written`]).
    pub fn programs_written(&self) -> u64 {
        self.0.programs_written.get()
    }

    /// `size` bytes in `placement`, mapped into the GPU's address space and, when
    /// `map_cpu`, into this process. Host memory is always mapped into this process.
    pub fn allocate(
        &self,
        size: u64,
        placement: Placement,
        map_cpu: bool,
    ) -> Result<Allocation<R>, NativeError> {
        Allocation::new(
            self,
            size,
            placement,
            map_cpu || placement == Placement::Host,
        )
    }
}

/// GPU memory's large pages.
const BIG_PAGE: u64 = 64 << 10;
/// GPU memory's huge pages.
const HUGE_PAGE: u64 = 2 << 20;

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

    /// The page size `size` bytes of this memory are made of, and rounded up to: GPU
    /// memory in 2 MiB pages where rounding up wastes at most an eighth (32 times fewer
    /// page-table entries than 64 KiB pages; decode measured no faster or slower for it),
    /// else 64 KiB pages; host memory in 4 KiB pages.
    pub fn page_size(self, size: u64) -> u64 {
        match self {
            Placement::Device
                if size >= HUGE_PAGE && size.next_multiple_of(HUGE_PAGE) - size <= size / 8 =>
            {
                HUGE_PAGE
            }
            Placement::Device => BIG_PAGE,
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
    fn attr(self, page: u64) -> u32 {
        match self {
            Placement::Device => {
                let size = if page == HUGE_PAGE {
                    attr::PAGE_SIZE_HUGE
                } else {
                    attr::PAGE_SIZE_BIG
                };
                attr::LOCATION_VIDMEM | attr::PHYSICALITY_ALLOW_NONCONTIGUOUS | size
            }
            Placement::Host => {
                attr::LOCATION_PCI
                    | attr::PHYSICALITY_NONCONTIGUOUS
                    | attr::COHERENCY_CACHED
                    | attr::PAGE_SIZE_4KB
            }
        }
    }

    /// The page table entries' kind (`format`): GPU memory as generic memory
    /// (`NV_MMU_PTE_KIND_GENERIC_MEMORY`, what NVIDIA's own drivers map buffers as; the
    /// default, pitch, measured about a tenth slower in decode), host memory as pitch.
    fn pte_kind(self) -> u32 {
        match self {
            Placement::Device => NV_MMU_PTE_KIND_GENERIC_MEMORY,
            Placement::Host => NV_MMU_PTE_KIND_PITCH,
        }
    }

    fn attr2(self, page: u64) -> u32 {
        match self {
            Placement::Device if page == HUGE_PAGE => {
                attr2::ZBC_PREFER_NO_ZBC | attr2::GPU_CACHEABLE_YES | attr2::PAGE_SIZE_HUGE_2MB
            }
            Placement::Device => attr2::ZBC_PREFER_NO_ZBC | attr2::GPU_CACHEABLE_YES,
            Placement::Host => attr2::ZBC_PREFER_NO_ZBC | attr2::GPU_CACHEABLE_NO,
        }
    }

    /// `NVOS46_FLAGS_*` of the GPU mapping: host memory, which the CPU reaches through a
    /// cached mapping, is mapped for the GPU to snoop the CPU's caches.
    fn dma_flags(self) -> u32 {
        match self {
            Placement::Device => 0,
            Placement::Host => NVOS46_FLAGS_CACHE_SNOOP_ENABLE,
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
pub struct Allocation<R: ResourceManager> {
    /// The memory, its range and mappings, undone on drop.
    _objects: Teardown<R>,
    memory: Handle,
    gpu_address: u64,
    size: u64,
    placement: Placement,
    cpu: Option<NonNull<u8>>,
}

impl<R: ResourceManager> Allocation<R> {
    fn new(
        gpu: &Gpu<R>,
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
        if size > gpu.heap_bytes() {
            return Err(refuse(format!(
                "the GPU has {} bytes for allocations",
                gpu.heap_bytes()
            )));
        }
        let page = placement.page_size(size);
        let size = size.div_ceil(page) * page;

        let mut objects = Teardown::under(gpu);
        let memory = objects.alloc(
            gpu.device(),
            placement.class(),
            Some(&mut NvMemoryAllocationParams {
                owner: gpu.client(),
                type_: NVOS32_TYPE_IMAGE,
                flags: alloc_flags::IGNORE_BANK_PLACEMENT
                    | alloc_flags::ALIGNMENT_FORCE
                    | alloc_flags::MAP_NOT_REQUIRED,
                attr: placement.attr(page),
                attr2: placement.attr2(page),
                format: placement.pte_kind(),
                size,
                alignment: page,
                ..NvMemoryAllocationParams::default()
            }),
        )?;
        let range = objects.alloc(
            gpu.device(),
            NV50_MEMORY_VIRTUAL,
            Some(&mut NvMemoryAllocationParams {
                owner: gpu.client(),
                type_: NVOS32_TYPE_IMAGE,
                flags: alloc_flags::VIRTUAL | alloc_flags::ALIGNMENT_FORCE,
                attr: placement.attr(page),
                attr2: placement.attr2(page),
                size,
                alignment: page,
                h_va_space: gpu.va_space(),
                ..NvMemoryAllocationParams::default()
            }),
        )?;
        let gpu_address =
            objects.map_dma(gpu.device(), range, memory, size, placement.dma_flags())?;
        let cpu = if map_cpu {
            Some(objects.map_cpu(
                gpu.device(),
                memory,
                size,
                0,
                placement.map_node(gpu.minor()),
            )?)
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

    /// The CPU address of `length` bytes at `offset`, which must be a multiple of `align`.
    fn cpu_at(
        &self,
        what: &'static str,
        offset: u64,
        length: u64,
        align: u64,
    ) -> Result<*mut u8, NativeError> {
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
            Some(end) if end <= self.size && offset.is_multiple_of(align) => {
                // SAFETY: within the mapping, which lives as long as `self`.
                Ok(unsafe { base.as_ptr().add(offset as usize) })
            }
            _ => Err(out_of_bounds),
        }
    }

    /// Copies `bytes` into the allocation at `offset` through the CPU mapping.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), NativeError> {
        let dst = self.cpu_at("a write", offset, bytes.len() as u64, 1)?;
        // SAFETY: in bounds (checked above); the mapping cannot overlap `bytes`, memory
        // of this process that the resource manager did not map.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        // The bytes are in place before anything after this tells the GPU to read them.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the allocation through the CPU
    /// mapping, as the GPU left them.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), NativeError> {
        let src = self.cpu_at("a read", offset, out.len() as u64, 1)?;
        // Nothing read here is older than what told the CPU the GPU was done.
        fence(Ordering::SeqCst);
        // SAFETY: in bounds (checked above), and not overlapping `out` (see `write`).
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Writes a naturally aligned 32-bit word at `offset`.
    pub fn write_u32(&self, offset: u64, value: u32) -> Result<(), NativeError> {
        let dst = self.cpu_at("a 32-bit write", offset, 4, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked above; mappings are page aligned).
        unsafe { dst.cast::<u32>().write_volatile(value) };
        Ok(())
    }

    /// Writes a naturally aligned 64-bit word at `offset`.
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<(), NativeError> {
        let dst = self.cpu_at("a 64-bit write", offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned (checked above).
        unsafe { dst.cast::<u64>().write_volatile(value) };
        Ok(())
    }

    /// Reads the naturally aligned 32-bit word at `offset`, as the GPU left it.
    pub fn read_u32(&self, offset: u64) -> Result<u32, NativeError> {
        let src = self.cpu_at("a 32-bit read", offset, 4, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked above).
        Ok(unsafe { src.cast::<u32>().read_volatile() })
    }

    /// Reads the naturally aligned 64-bit word at `offset`, as the GPU left it.
    pub fn read_u64(&self, offset: u64) -> Result<u64, NativeError> {
        let src = self.cpu_at("a 64-bit read", offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned (checked above).
        Ok(unsafe { src.cast::<u64>().read_volatile() })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::fake::{assert_undone_in_reverse, Call, FakeRm, H200};
    use super::super::status::NvStatus;
    use super::*;

    pub(crate) const DRIVER: &str = "580.159.04";
    /// The handles the fake gives [`Gpu::open`]'s objects, in order.
    pub(crate) const CLIENT: Handle = 1;
    pub(crate) const DEVICE: Handle = 2;
    pub(crate) const SUBDEVICE: Handle = 3;
    pub(crate) const VA_SPACE: Handle = 4;

    /// The calls since the `n`-th.
    pub(crate) fn calls_from(rm: &FakeRm, n: usize) -> Vec<Call> {
        rm.calls()[n..].to_vec()
    }

    #[test]
    fn a_gpu_is_a_client_device_subdevice_and_address_space_freed_in_reverse() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        assert_eq!(gpu.heap_bytes(), u64::from(H200.heap_kib) * 1024);
        assert_eq!(
            (gpu.client(), gpu.device(), gpu.subdevice(), gpu.va_space()),
            (CLIENT, DEVICE, SUBDEVICE, VA_SPACE)
        );
        let made = rm.calls();
        assert_eq!(
            made,
            vec![
                Call::CheckVersion(DRIVER.into()),
                Call::CardInfo,
                Call::OpenGpu(0),
                Call::Alloc {
                    class: 0x41,
                    parent: 0,
                    handle: CLIENT
                },
                Call::Control {
                    object: CLIENT,
                    cmd: GpuGetIdInfoV2Params::CMD
                },
                Call::Alloc {
                    class: 0x80,
                    parent: CLIENT,
                    handle: DEVICE
                },
                Call::Alloc {
                    class: 0x2080,
                    parent: DEVICE,
                    handle: SUBDEVICE
                },
                Call::Control {
                    object: SUBDEVICE,
                    cmd: FbGetInfoV2Params::CMD
                },
                Call::Alloc {
                    class: 0x90f1,
                    parent: DEVICE,
                    handle: VA_SPACE
                },
            ]
        );
        // A new address space of the driver's default size and base, its page tables
        // the resource manager's.
        assert_eq!(
            rm.params::<NvVaspaceAllocationParameters>(VA_SPACE),
            NvVaspaceAllocationParameters::default()
        );
        drop(gpu);
        assert_eq!(
            calls_from(&rm, made.len()),
            vec![
                Call::Free {
                    parent: DEVICE,
                    handle: VA_SPACE
                },
                Call::Free {
                    parent: DEVICE,
                    handle: SUBDEVICE
                },
                Call::Free {
                    parent: CLIENT,
                    handle: DEVICE
                },
                Call::Free {
                    parent: 0,
                    handle: CLIENT
                },
                Call::CloseGpu(0),
            ]
        );
        assert!(rm.live_objects().is_empty());
    }

    #[test]
    fn a_missing_gpu_is_named() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let err = Gpu::open(&rm, DRIVER, 1).err().unwrap();
        assert_eq!(
            err,
            NativeError::NoSuchGpu {
                ordinal: 1,
                count: 1
            }
        );
        assert_eq!(
            err.to_string(),
            "there is no GPU 1: this process can open 1"
        );
    }

    #[test]
    fn large_gpu_allocations_are_made_of_2_mib_pages_where_rounding_wastes_little() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        const MIB: u64 = 1 << 20;
        for (size, page, rounded) in [
            (32 * MIB, 2 * MIB, 32 * MIB),
            // 2 MiB pages would waste an eighth or less.
            (17 * MIB - 1, 2 * MIB, 18 * MIB),
            (2 * MIB, 2 * MIB, 2 * MIB),
            // They would waste more: 64 KiB pages.
            (3 * MIB, 64 << 10, 3 * MIB),
            (2 * MIB - 1, 64 << 10, 2 * MIB),
            (100_000, 64 << 10, 128 << 10),
        ] {
            let a = gpu.allocate(size, Placement::Device, false).unwrap();
            assert_eq!(a.size(), rounded, "{size} bytes");
            let p = rm.params::<NvMemoryAllocationParams>(a.memory());
            assert_eq!(p.alignment, page, "{size} bytes");
            let (attr_size, attr2_huge) = if page == 2 * MIB { (3, 1) } else { (2, 0) };
            // PAGE_SIZE (24:23) _HUGE or _BIG; attr2's PAGE_SIZE_HUGE (21:20) _2MB.
            assert_eq!((p.attr >> 23) & 3, attr_size, "{size} bytes");
            assert_eq!((p.attr2 >> 20) & 3, attr2_huge, "{size} bytes");
            // The virtual range is asked for with the same page size and alignment.
            let range = a.memory() + 1;
            let v = rm.params::<NvMemoryAllocationParams>(range);
            assert_eq!((v.attr, v.attr2, v.alignment), (p.attr, p.attr2, page));
        }
        // Host memory stays in 4 KiB pages.
        let h = gpu.allocate(32 * MIB, Placement::Host, false).unwrap();
        assert_eq!(
            rm.params::<NvMemoryAllocationParams>(h.memory()).alignment,
            4096
        );
    }

    #[test]
    fn gpu_memory_is_allocated_mapped_for_the_gpu_and_the_cpu_and_undone_in_reverse() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let before = rm.calls().len();
        let a = gpu.allocate(100_000, Placement::Device, true).unwrap();
        // Rounded up to 64 KiB pages.
        assert_eq!(a.size(), 128 << 10);
        assert_eq!(a.placement(), Placement::Device);
        let (memory, range) = (5, 6);
        assert_eq!(a.memory(), memory);
        let made = calls_from(&rm, before);
        assert_eq!(
            made,
            vec![
                Call::Alloc {
                    class: 0x40,
                    parent: DEVICE,
                    handle: memory
                },
                Call::Alloc {
                    class: 0x50a0,
                    parent: DEVICE,
                    handle: range
                },
                Call::MapDma {
                    device: DEVICE,
                    dma: range,
                    memory,
                    length: 128 << 10,
                    flags: 0,
                    address: a.gpu_address(),
                },
                Call::MapMemory {
                    device: DEVICE,
                    memory,
                    length: 128 << 10,
                    flags: 0,
                    node: MapNode::Gpu(0),
                },
            ]
        );
        let p = rm.params::<NvMemoryAllocationParams>(memory);
        assert_eq!(
            (p.owner, p.type_, p.size, p.alignment),
            (CLIENT, 0, 128 << 10, 64 << 10)
        );
        assert_eq!(
            p.flags, 0x8101,
            "IGNORE_BANK_PLACEMENT | ALIGNMENT_FORCE | MAP_NOT_REQUIRED"
        );
        // LOCATION_VIDMEM, PHYSICALITY_ALLOW_NONCONTIGUOUS, PAGE_SIZE_BIG.
        assert_eq!(p.attr, (3 << 27) | (2 << 23));
        assert_eq!(p.attr2, 0b0101, "ZBC_PREFER_NO_ZBC, GPU_CACHEABLE_YES");
        assert_eq!(p.format, 6, "NV_MMU_PTE_KIND_GENERIC_MEMORY");
        let v = rm.params::<NvMemoryAllocationParams>(range);
        assert_eq!(v.flags, 0x0008_0100, "VIRTUAL | ALIGNMENT_FORCE");
        assert_eq!(
            (v.h_va_space, v.size, v.attr),
            (VA_SPACE, 128 << 10, p.attr)
        );

        // The CPU mapping reaches the memory.
        a.write_u32(0x10, 0xdead_beef).unwrap();
        a.write(0x20, &[1, 2, 3, 4]).unwrap();
        a.write_u64(0x28, 0x0123_4567_89ab_cdef).unwrap();
        assert_eq!(rm.read_u32(memory, 0x10), 0xdead_beef);
        assert_eq!(rm.read_u32(memory, 0x20), 0x0403_0201);
        assert_eq!(rm.read_u64(memory, 0x28), 0x0123_4567_89ab_cdef);
        assert_eq!(a.read_u32(0x10).unwrap(), 0xdead_beef);
        assert_eq!(a.read_u64(0x28).unwrap(), 0x0123_4567_89ab_cdef);

        drop(a);
        assert_eq!(
            calls_from(&rm, before + made.len()),
            vec![
                Call::UnmapMemory {
                    device: DEVICE,
                    memory
                },
                Call::UnmapDma {
                    dma: range,
                    memory,
                    address: 0x20_0000_0000
                },
                Call::Free {
                    parent: DEVICE,
                    handle: range
                },
                Call::Free {
                    parent: DEVICE,
                    handle: memory
                },
            ]
        );
        assert_eq!(rm.live_mappings(), (0, 0));
        drop(gpu);
        assert_undone_in_reverse(&rm.calls());
    }

    #[test]
    fn host_memory_goes_through_the_control_node_and_is_always_mapped() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let before = rm.calls().len();
        let a = gpu.allocate(1, Placement::Host, false).unwrap();
        assert_eq!(a.size(), 4096);
        assert!(a.cpu_address().is_some());
        let calls = calls_from(&rm, before);
        assert!(matches!(
            calls[0],
            Call::Alloc {
                class: 0x3e,
                parent: DEVICE,
                ..
            }
        ));
        assert!(matches!(
            calls[2],
            Call::MapDma {
                flags: 0x10,
                length: 4096,
                ..
            }
        ));
        assert!(matches!(
            calls[3],
            Call::MapMemory {
                node: MapNode::Control,
                length: 4096,
                ..
            }
        ));
        let p = rm.params::<NvMemoryAllocationParams>(a.memory());
        // LOCATION_PCI, PHYSICALITY_NONCONTIGUOUS, COHERENCY_CACHED, PAGE_SIZE_4KB.
        assert_eq!(p.attr, (1 << 25) | (1 << 27) | (1 << 29) | (1 << 23));
        assert_eq!(p.attr2, 0b1001, "ZBC_PREFER_NO_ZBC, GPU_CACHEABLE_NO");
        assert_eq!(p.alignment, 4096);
    }

    #[test]
    fn gpu_memory_without_a_cpu_mapping_refuses_cpu_access_by_name() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let a = gpu.allocate(4096, Placement::Device, false).unwrap();
        assert!(a.cpu_address().is_none());
        assert!(!rm
            .calls()
            .iter()
            .any(|c| matches!(c, Call::MapMemory { .. })));
        let err = a.write_u32(0, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a 32-bit write of 4 bytes at offset 0x0 is outside the 0-byte allocation"
        );
        let mapped = gpu.allocate(4096, Placement::Host, false).unwrap();
        assert!(mapped.read_u64(4096).is_err());
        assert!(mapped.read_u64(4092).is_err());
        assert!(mapped.read_u32(2).is_err(), "misaligned");
        assert!(mapped.write(4090, &[0; 6]).is_ok());
        assert!(mapped.write(4090, &[0; 7]).is_err());
    }

    #[test]
    fn zero_and_absurd_sizes_are_refused_before_any_call() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        let gpu = Gpu::open(&rm, DRIVER, 0).unwrap();
        let before = rm.calls().len();
        let err = gpu.allocate(0, Placement::Device, false).err().unwrap();
        assert_eq!(
            err.to_string(),
            "cannot allocate 0 bytes of GPU memory: an allocation needs at least one byte"
        );
        let too_big = gpu.heap_bytes() + 1;
        let err = gpu.allocate(too_big, Placement::Host, false).err().unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot allocate {too_big} bytes of host memory: the GPU has {} bytes for \
                 allocations",
                gpu.heap_bytes()
            )
        );
        assert!(gpu.allocate(u64::MAX, Placement::Device, false).is_err());
        assert_eq!(rm.calls().len(), before);
    }

    /// Everything this slice makes, one after the other: a GPU, GPU memory mapped for the
    /// CPU, host memory, and a channel.
    fn everything(rm: &std::rc::Rc<FakeRm>) -> Result<(), NativeError> {
        let gpu = Gpu::open(rm, DRIVER, 0)?;
        let _device = gpu.allocate(1 << 20, Placement::Device, true)?;
        let _host = gpu.allocate(4096, Placement::Host, false)?;
        let _channel = super::super::channel::Channel::create(&gpu, 1024)?;
        Ok(())
    }

    #[test]
    fn a_failure_at_any_step_is_named_and_undoes_everything_made_before_it() {
        let rm = std::rc::Rc::new(FakeRm::new(DRIVER, vec![H200]));
        everything(&rm).unwrap();
        assert_undone_in_reverse(&rm.calls());
        let steps = rm.attempts();
        let mut failed = vec![];
        for step in 0..steps {
            let mut rm = FakeRm::new(DRIVER, vec![H200]);
            rm.fail_at = Some((step, NvStatus(0x40)));
            let rm = std::rc::Rc::new(rm);
            let err = everything(&rm).unwrap_err().to_string();
            let (call, status) = err.split_once(" failed: ").unwrap();
            assert_eq!(
                status, "the resource manager returned NV_ERR_INVALID_STATE (0x40)",
                "{err}"
            );
            failed.push(call.to_string());
            assert!(rm.live_objects().is_empty(), "step {step}: {err}");
            assert_eq!(rm.live_mappings(), (0, 0), "step {step}: {err}");
            assert_undone_in_reverse(&rm.calls());
        }
        let memory = |class: &str, n: u32| {
            [
                format!("allocating {class}"),
                "allocating NV50_MEMORY_VIRTUAL (class 0x50a0)".into(),
                format!(
                    "NV_ESC_RM_MAP_MEMORY_DMA of memory {:#x} into range {:#x}",
                    n,
                    n + 1
                ),
            ]
        };
        let mut expected = vec![
            "allocating NV01_ROOT_CLIENT (class 0x41)".to_string(),
            "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 (0x205)".into(),
            "allocating NV01_DEVICE_0 (class 0x80)".into(),
            "allocating NV20_SUBDEVICE_0 (class 0x2080)".into(),
            "NV2080_CTRL_CMD_FB_GET_INFO_V2 (0x20801303)".into(),
            "allocating FERMI_VASPACE_A (class 0x90f1)".into(),
        ];
        expected.extend(memory("NV01_MEMORY_LOCAL_USER (class 0x40)", 5));
        expected.push("NV_ESC_RM_MAP_MEMORY".into());
        expected.extend(memory("NV01_MEMORY_SYSTEM (class 0x3e)", 7));
        expected.push("NV_ESC_RM_MAP_MEMORY".into());
        expected.extend(memory("NV01_MEMORY_LOCAL_USER (class 0x40)", 9));
        expected.push("NV_ESC_RM_MAP_MEMORY".into());
        // The channel's error notifier.
        expected.extend(memory("NV01_MEMORY_SYSTEM (class 0x3e)", 11));
        expected.push("NV_ESC_RM_MAP_MEMORY".into());
        expected.extend([
            "allocating KEPLER_CHANNEL_GROUP_A (class 0xa06c)".into(),
            "allocating HOPPER_CHANNEL_GPFIFO_A (class 0xc86f)".into(),
            "allocating HOPPER_COMPUTE_A (class 0xcbc0)".into(),
            "allocating HOPPER_DMA_COPY_A (class 0xc8b5)".into(),
            "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN (0xc36f0108)".into(),
            "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE (0xa06c0101)".into(),
            "allocating HOPPER_USERMODE_A (class 0xc661)".into(),
            "NV_ESC_RM_MAP_MEMORY".into(),
        ]);
        assert_eq!(failed, expected);
    }
}
