//! The Queue Meta Data (QMD) of a compute launch on Hopper: version 04_00, the launch
//! descriptor that the compute class HOPPER_COMPUTE_A (0xCBC0) reads from memory when a
//! push buffer sends it (`SEND_PCAS_A`, see [`super::pushbuf`]). It holds the grid and
//! block, the code address, registers, barriers, shared memory, constant bank 0 and the
//! semaphore the GPU releases when the grid completes.
//!
//! QMD V04_00 is 3072 bits (96 words, 384 bytes; the 256-byte QMDs are those of earlier
//! classes). Every field quench writes is one row of [`field`]: its name and its bits
//! `MW(hi:lo)`, as NVIDIA's `clcbc0qmd.h` declares them (open-gpu-doc,
//! classes/compute/clcbc0qmd.h, commit c8607fe5). Indexed fields are written out for the
//! index quench uses (constant buffer 0, release 0). [`Qmd::set`] refuses a value that
//! does not fit its field, by name.

/// Bits in a QMD V04_00.
pub const QMD_BITS: u32 = 3072;
/// 32-bit words in a QMD V04_00.
pub const QMD_WORDS: usize = (QMD_BITS / 32) as usize;
/// Bytes in a QMD V04_00.
pub const QMD_BYTES: usize = QMD_WORDS * 4;
/// The QMD's address is sent shifted right by 8 (`SEND_PCAS_A_QMD_ADDRESS_SHIFTED8`), so
/// a QMD lies on a 256-byte boundary.
pub const QMD_ALIGN: u64 = 256;

/// One field of the QMD: bits `lo..=hi` of the 3072-bit descriptor, bit 0 being the
/// lowest bit of word 0 (NVIDIA's `MW(hi:lo)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub hi: u32,
    pub lo: u32,
}

impl Field {
    /// How many bits the field holds.
    pub const fn width(&self) -> u32 {
        self.hi - self.lo + 1
    }

    /// Whether the bits lie inside the QMD and hold at most 64 bits.
    pub const fn inside(&self) -> bool {
        self.lo <= self.hi && self.hi < QMD_BITS && self.hi - self.lo < 64
    }
}

/// Declares each field once, as a constant and as a row of [`field::ALL`].
macro_rules! qmd_fields {
    ($($(#[$doc:meta])* $name:ident = $hi:literal : $lo:literal;)*) => {
        $($(#[$doc])* pub const $name: Field = Field { name: stringify!($name), hi: $hi, lo: $lo };)*
        /// Every field quench writes, in the order of the header.
        pub const ALL: &[Field] = &[$($name),*];
        const _: () = {
            let mut i = 0;
            while i < ALL.len() {
                assert!(ALL[i].inside());
                i += 1;
            }
        };
    };
}

/// The fields quench writes, named as `NVCBC0_QMDV04_00_<name>` in `clcbc0qmd.h`.
pub mod field {
    use super::Field;

    qmd_fields! {
        /// The QMD group the grid is scheduled in: 0x3f, the group no other work names.
        QMD_GROUP_ID = 21:16;
        /// `QMD_TYPE_GRID_CTA` (2): a grid of independent CTAs.
        QMD_TYPE = 25:23;
        /// `RELEASE_ENABLE(0)`.
        RELEASE0_ENABLE = 320:320;
        /// `RELEASE_STRUCTURE_SIZE(0)`: `SEMAPHORE_ONE_WORD` (1) writes the payload alone.
        RELEASE0_STRUCTURE_SIZE = 322:321;
        /// `RELEASE_MEMBAR_TYPE(0)`: `FE_SYSMEMBAR` (1) orders the grid's writes before
        /// the release.
        RELEASE0_MEMBAR_TYPE = 323:323;
        /// `DEPENDENT_QMD_ENABLE(0)`: when the grid has finished, act on the QMD at
        /// `DEPENDENT_QMD0_POINTER`.
        DEPENDENT_QMD0_ENABLE = 368:368;
        /// `DEPENDENT_QMD_ACTION(0)`: `QMD_INVALIDATE_COPY_SCHEDULE` (3) reads it afresh
        /// and starts its grid.
        DEPENDENT_QMD0_ACTION = 371:369;
        /// `DEPENDENT_QMD_PREFETCH(0)`: fetch the dependent QMD while this grid runs.
        DEPENDENT_QMD0_PREFETCH = 372:372;
        /// `CONSTANT_BUFFER_PREFETCH(0)`: `PREFETCH_PRE` (1) loads bank 0 before the grid
        /// starts, at most `CONSTANT_BUFFER_PREFETCH_PRE_MAX_SIZE_SHIFTED8` of it.
        CONSTANT_BUFFER0_PREFETCH = 418:417;
        CONSTANT_BUFFER_PREFETCH_PRE_MAX_SIZE_SHIFTED8 = 575:570;
        /// The code to load into the instruction cache as the grid starts: its address
        /// >> 8 and its size in 256-byte units (at most 0x1ff).
        PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED = 1375:1344;
        PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED = 1392:1376;
        PROGRAM_PREFETCH_SIZE = 1401:1393;
        /// `CONSTANT_BUFFER_VALID(0)`.
        CONSTANT_BUFFER0_VALID = 416:416;
        /// `CONSTANT_BUFFER_INVALIDATE(0)`: drop cached copies of bank 0 before the grid.
        CONSTANT_BUFFER0_INVALIDATE = 419:419;
        /// The dependent QMD's address >> 8.
        DEPENDENT_QMD0_POINTER = 479:448;
        /// Local memory per thread at the top of the local window, bytes: where compiled
        /// code keeps its stack (R1 starts near the window's top and grows down).
        SHADER_LOCAL_MEMORY_HIGH_SIZE = 567:544;
        /// The SASS version of the code: 0x90 for sm_90.
        SASS_VERSION = 543:536;
        /// `API_VISIBLE_CALL_LIMIT_NO_CHECK` (1).
        API_VISIBLE_CALL_LIMIT = 568:568;
        /// `SAMPLER_INDEX_VIA_HEADER_INDEX` (1), as compiled compute code expects.
        SAMPLER_INDEX = 569:569;
        QMD_MINOR_VERSION = 579:576;
        QMD_MAJOR_VERSION = 583:580;
        /// Shared memory per CTA, bytes.
        SHARED_MEMORY_SIZE = 601:584;
        INVALIDATE_TEXTURE_HEADER_CACHE = 602:602;
        INVALIDATE_TEXTURE_SAMPLER_CACHE = 603:603;
        INVALIDATE_TEXTURE_DATA_CACHE = 604:604;
        INVALIDATE_SHADER_DATA_CACHE = 605:605;
        INVALIDATE_INSTRUCTION_CACHE = 606:606;
        INVALIDATE_SHADER_CONSTANT_CACHE = 607:607;
        /// The smallest shared-memory carveout of the SM the grid may run with.
        MIN_SM_CONFIG_SHARED_MEM_SIZE = 613:608;
        /// The largest carveout it may run with.
        MAX_SM_CONFIG_SHARED_MEM_SIZE = 619:614;
        /// The carveout asked for.
        TARGET_SM_CONFIG_SHARED_MEM_SIZE = 625:620;
        RELEASE_SEMAPHORE0_ADDR_LOWER = 671:640;
        RELEASE_SEMAPHORE0_ADDR_UPPER = 696:672;
        RELEASE_SEMAPHORE0_PAYLOAD_LOWER = 735:704;
        RELEASE_SEMAPHORE0_PAYLOAD_UPPER = 767:736;
        /// Grid size in CTAs (what earlier QMDs call `CTA_RASTER_WIDTH`).
        GRID_WIDTH = 1055:1024;
        GRID_HEIGHT = 1071:1056;
        GRID_DEPTH = 1103:1088;
        /// `CWD_MEMBAR_TYPE_L1_SYSMEMBAR` (1): a system membar when a CTA ends.
        CWD_MEMBAR_TYPE = 1137:1136;
        /// Block size in threads.
        CTA_THREAD_DIMENSION0 = 1167:1152;
        CTA_THREAD_DIMENSION1 = 1183:1168;
        CTA_THREAD_DIMENSION2 = 1199:1184;
        /// Registers per thread.
        REGISTER_COUNT = 1208:1200;
        /// Named barriers the code uses.
        BARRIER_COUNT = 1215:1211;
        /// The code's address: Hopper's QMD takes a 57-bit virtual address, not an
        /// offset from a code base as QMDs before Volta did.
        PROGRAM_ADDRESS_LOWER = 1247:1216;
        PROGRAM_ADDRESS_UPPER = 1272:1248;
        /// `CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)`: bank 0's address >> 6.
        CONSTANT_BUFFER0_ADDR_LOWER_SHIFTED6 = 1567:1536;
        CONSTANT_BUFFER0_ADDR_UPPER_SHIFTED6 = 1586:1568;
        /// `CONSTANT_BUFFER_SIZE_SHIFTED4(0)`: bank 0's size >> 4.
        CONSTANT_BUFFER0_SIZE_SHIFTED4 = 1599:1587;
    }
}

/// The QMD group quench's grids are scheduled in.
pub const QMD_GROUP_ID_OWN: u64 = 0x3f;
/// `SAMPLER_INDEX_VIA_HEADER_INDEX`.
pub const SAMPLER_INDEX_VIA_HEADER_INDEX: u64 = 1;
/// `QMD_TYPE_GRID_CTA`.
pub const QMD_TYPE_GRID_CTA: u64 = 2;
/// `RELEASE_STRUCTURE_SIZE_SEMAPHORE_ONE_WORD`.
pub const RELEASE_STRUCTURE_SIZE_ONE_WORD: u64 = 1;
/// `DEPENDENT_QMD_ACTION_QMD_INVALIDATE_COPY_SCHEDULE`.
pub const DEPENDENT_QMD_ACTION_INVALIDATE_COPY_SCHEDULE: u64 = 3;
/// `RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR`.
pub const RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR: u64 = 1;
/// `CONSTANT_BUFFER_PREFETCH_PREFETCH_PRE`.
pub const CONSTANT_BUFFER_PREFETCH_PRE: u64 = 1;
/// The largest `CONSTANT_BUFFER_PREFETCH_PRE_MAX_SIZE_SHIFTED8` (6 bits).
const CONSTANT_BUFFER_PREFETCH_MAX: u64 = 63;
/// The largest `PROGRAM_PREFETCH_SIZE` (9 bits).
const PROGRAM_PREFETCH_MAX: u64 = 0x1ff;
/// `CWD_MEMBAR_TYPE_L1_SYSMEMBAR`.
pub const CWD_MEMBAR_TYPE_L1_SYSMEMBAR: u64 = 1;
/// `API_VISIBLE_CALL_LIMIT_NO_CHECK`.
pub const API_VISIBLE_CALL_LIMIT_NO_CHECK: u64 = 1;
/// The SASS version of sm_90 code (the SM's major and minor number as hex digits).
pub const SASS_VERSION_SM90: u64 = 0x90;

/// Shared-memory carveouts a Hopper SM can be configured with, KiB.
pub const HOPPER_CARVEOUTS_KIB: [u32; 9] = [8, 16, 32, 64, 100, 132, 164, 196, 228];
/// Shared memory the hardware reserves per CTA beside what the code asks for, bytes.
pub const RESERVED_SHARED_PER_CTA: u32 = 1024;

/// Why a QMD could not be packed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QmdError {
    /// A value wider than its field.
    #[error("QMD field {field} holds {bits} bits; the value {value:#x} does not fit")]
    DoesNotFit {
        field: &'static str,
        bits: u32,
        value: u64,
    },
    /// A field row whose bits lie outside the QMD.
    #[error("QMD field {field} lies outside the {QMD_BITS}-bit QMD")]
    OutsideQmd { field: &'static str },
    /// An address the QMD stores shifted (or that the hardware reads in units) that is
    /// not a multiple of that unit.
    #[error("{what} at {address:#x} is not a multiple of {align} bytes")]
    Misaligned {
        what: &'static str,
        address: u64,
        align: u64,
    },
    /// More shared memory than the largest carveout holds.
    #[error(
        "{bytes} bytes of shared memory per CTA (plus {RESERVED_SHARED_PER_CTA} reserved) \
         exceed Hopper's largest carveout of 228 KiB"
    )]
    SharedMemory { bytes: u32 },
}

/// A QMD V04_00 as words, in the order the GPU reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qmd {
    words: [u32; QMD_WORDS],
}

impl Default for Qmd {
    fn default() -> Self {
        Qmd::new()
    }
}

impl Qmd {
    /// All fields zero.
    pub fn new() -> Qmd {
        Qmd {
            words: [0; QMD_WORDS],
        }
    }

    /// Writes `value` into `field`, or refuses a value wider than the field (naming the
    /// field and the value). A field may span two words; the other bits are kept.
    pub fn set(&mut self, field: Field, value: u64) -> Result<(), QmdError> {
        let width = field.width();
        if !field.inside() {
            return Err(QmdError::OutsideQmd { field: field.name });
        }
        if width < 64 && value >> width != 0 {
            return Err(QmdError::DoesNotFit {
                field: field.name,
                bits: width,
                value,
            });
        }
        let mut bit = field.lo;
        let mut rest = value;
        while bit <= field.hi {
            let word = (bit / 32) as usize;
            let shift = bit % 32;
            let take = (32 - shift).min(field.hi - bit + 1);
            let mask = if take == 32 {
                u32::MAX
            } else {
                (1u32 << take) - 1
            };
            self.words[word] =
                (self.words[word] & !(mask << shift)) | (((rest as u32) & mask) << shift);
            rest >>= take;
            bit += take;
        }
        Ok(())
    }

    /// The value of `field` (0 for a row outside the QMD).
    pub fn get(&self, field: Field) -> u64 {
        if !field.inside() {
            return 0;
        }
        let mut value = 0u64;
        let mut bit = field.lo;
        while bit <= field.hi {
            let word = (bit / 32) as usize;
            let shift = bit % 32;
            let take = (32 - shift).min(field.hi - bit + 1);
            let mask = if take == 32 {
                u32::MAX
            } else {
                (1u32 << take) - 1
            };
            value |= u64::from((self.words[word] >> shift) & mask) << (bit - field.lo);
            bit += take;
        }
        value
    }

    /// The words.
    pub fn words(&self) -> &[u32; QMD_WORDS] {
        &self.words
    }

    /// The bytes as they lie in memory for the GPU (little-endian words).
    pub fn to_bytes(&self) -> [u8; QMD_BYTES] {
        let mut out = [0u8; QMD_BYTES];
        for (chunk, w) in out.chunks_exact_mut(4).zip(self.words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// Constant bank 0 of a launch: where it lies and how many bytes it holds (the launch
/// state below the parameters, then the parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConstantBuffer {
    /// A multiple of 64 (the QMD stores it shifted by 6).
    pub address: u64,
    /// A multiple of 16 (the QMD stores it shifted by 4).
    pub size: u32,
}

/// A semaphore the GPU writes when the grid has completed: one 32-bit word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemaphoreRelease {
    /// A multiple of 4.
    pub address: u64,
    pub payload: u32,
}

/// Everything a QMD says about one launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QmdLaunch {
    /// CTAs in x, y, z.
    pub grid: [u32; 3],
    /// Threads per CTA in x, y, z.
    pub block: [u32; 3],
    /// Shared memory per CTA (static and dynamic), bytes.
    pub shared_bytes: u32,
    pub registers: u32,
    pub barriers: u32,
    /// Local memory per thread at the top of the local window (the stack), bytes: at
    /// most what the channel's local memory holds per thread.
    pub stack_bytes_per_thread: u32,
    /// The virtual address of the kernel's first instruction.
    pub program_address: u64,
    pub constant_buffer0: ConstantBuffer,
    pub release: Option<SemaphoreRelease>,
    /// The QMD whose grid starts once this grid has finished (a chain of grids the
    /// hardware runs in turn, with no submission between them).
    pub next: Option<u64>,
    /// Invalidate the caches a grid could see stale data in (constant bank 0, L1 data)
    /// before it runs, so it sees what was written before it.
    pub invalidate_caches: bool,
    /// Also invalidate the instruction cache: needed only once code has been written
    /// where the cache may hold other code. Doing it every grid costs each grid a cold
    /// start (measured: the decode attention kernel 19.4 µs instead of 8.5 on an H100).
    pub invalidate_code: bool,
    /// The kernel's code in bytes, prefetched into the instruction cache as the grid
    /// starts in whole 256-byte units (up to the field's limit); 0: none.
    pub program_bytes: u32,
}

/// The `*_SM_CONFIG_SHARED_MEM_SIZE` code of the smallest Hopper carveout that holds
/// `ctas` CTAs of `shared_bytes` each and their reserved kilobyte: the carveout in 4 KiB
/// units, plus one. `None` if even the largest does not.
fn carveout_for(ctas: u32, shared_bytes: u32) -> Option<u64> {
    let need = u64::from(ctas) * (u64::from(shared_bytes) + u64::from(RESERVED_SHARED_PER_CTA));
    HOPPER_CARVEOUTS_KIB
        .iter()
        .find(|&&kib| u64::from(kib) * 1024 >= need)
        .map(|&kib| u64::from(kib / 4 + 1))
}

/// The `*_SM_CONFIG_SHARED_MEM_SIZE` code of the smallest Hopper carveout that holds one
/// CTA of `shared_bytes`.
pub fn sm_config_shared_mem(shared_bytes: u32) -> Result<u64, QmdError> {
    carveout_for(1, shared_bytes).ok_or(QmdError::SharedMemory {
        bytes: shared_bytes,
    })
}

/// Threads, CTAs and registers one Hopper SM holds at once.
const SM_THREADS: u32 = 2048;
const SM_CTAS: u32 = 32;
const SM_REGISTERS: u32 = 65536;

/// The carveout to ask for: the smallest that holds as many CTAs of `threads` threads,
/// `registers` registers a thread and `shared_bytes` of shared memory as the SM's threads,
/// registers and CTA slots allow (as CUDA chooses when a kernel states no preference), or
/// the largest where shared memory is what limits them. Asking for the one-CTA minimum
/// instead leaves a kernel with shared memory one CTA per SM.
pub fn sm_config_for_occupancy(threads: u32, registers: u32, shared_bytes: u32) -> u64 {
    let warps = threads.div_ceil(32).max(1);
    // Registers are given to a warp in multiples of 8 a thread.
    let per_warp = registers.max(1).next_multiple_of(8) * 32;
    let by_registers = SM_REGISTERS / (per_warp * warps);
    let ctas = (SM_THREADS / (warps * 32))
        .min(by_registers)
        .clamp(1, SM_CTAS);
    let largest = HOPPER_CARVEOUTS_KIB[HOPPER_CARVEOUTS_KIB.len() - 1];
    carveout_for(ctas, shared_bytes).unwrap_or(u64::from(largest / 4 + 1))
}

fn aligned(what: &'static str, address: u64, align: u64) -> Result<(), QmdError> {
    if address.is_multiple_of(align) {
        Ok(())
    } else {
        Err(QmdError::Misaligned {
            what,
            address,
            align,
        })
    }
}

impl QmdLaunch {
    /// The QMD V04_00 of this launch.
    pub fn pack(&self) -> Result<Qmd, QmdError> {
        use field::*;
        let mut q = Qmd::new();
        q.set(QMD_MAJOR_VERSION, 4)?;
        q.set(QMD_MINOR_VERSION, 0)?;
        q.set(QMD_TYPE, QMD_TYPE_GRID_CTA)?;
        q.set(QMD_GROUP_ID, QMD_GROUP_ID_OWN)?;
        q.set(SAMPLER_INDEX, SAMPLER_INDEX_VIA_HEADER_INDEX)?;
        q.set(SASS_VERSION, SASS_VERSION_SM90)?;
        q.set(API_VISIBLE_CALL_LIMIT, API_VISIBLE_CALL_LIMIT_NO_CHECK)?;
        q.set(CWD_MEMBAR_TYPE, CWD_MEMBAR_TYPE_L1_SYSMEMBAR)?;

        q.set(GRID_WIDTH, u64::from(self.grid[0]))?;
        q.set(GRID_HEIGHT, u64::from(self.grid[1]))?;
        q.set(GRID_DEPTH, u64::from(self.grid[2]))?;
        q.set(CTA_THREAD_DIMENSION0, u64::from(self.block[0]))?;
        q.set(CTA_THREAD_DIMENSION1, u64::from(self.block[1]))?;
        q.set(CTA_THREAD_DIMENSION2, u64::from(self.block[2]))?;
        q.set(REGISTER_COUNT, u64::from(self.registers))?;
        q.set(BARRIER_COUNT, u64::from(self.barriers))?;
        q.set(
            SHADER_LOCAL_MEMORY_HIGH_SIZE,
            u64::from(self.stack_bytes_per_thread.next_multiple_of(16)),
        )?;

        // Shared memory is allocated in 256-byte units.
        q.set(
            SHARED_MEMORY_SIZE,
            u64::from(self.shared_bytes.next_multiple_of(256)),
        )?;
        q.set(
            MIN_SM_CONFIG_SHARED_MEM_SIZE,
            sm_config_shared_mem(self.shared_bytes)?,
        )?;
        let threads = self.block.iter().product();
        q.set(
            TARGET_SM_CONFIG_SHARED_MEM_SIZE,
            sm_config_for_occupancy(threads, self.registers, self.shared_bytes),
        )?;
        let largest = HOPPER_CARVEOUTS_KIB[HOPPER_CARVEOUTS_KIB.len() - 1];
        q.set(MAX_SM_CONFIG_SHARED_MEM_SIZE, u64::from(largest / 4 + 1))?;

        aligned("the program address", self.program_address, 16)?;
        q.set(PROGRAM_ADDRESS_LOWER, self.program_address & 0xffff_ffff)?;
        q.set(PROGRAM_ADDRESS_UPPER, self.program_address >> 32)?;
        // Whole 256-byte units (a last part under 256 bytes is fetched as the grid runs).
        let prefetch = u64::from(self.program_bytes / 256).min(PROGRAM_PREFETCH_MAX);
        if prefetch > 0 {
            let shifted = self.program_address >> 8;
            q.set(PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED, shifted & 0xffff_ffff)?;
            q.set(PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED, shifted >> 32)?;
            q.set(PROGRAM_PREFETCH_SIZE, prefetch)?;
        }

        let cb = self.constant_buffer0;
        aligned("constant bank 0", cb.address, 64)?;
        aligned("the size of constant bank 0", u64::from(cb.size), 16)?;
        let shifted = cb.address >> 6;
        q.set(CONSTANT_BUFFER0_ADDR_LOWER_SHIFTED6, shifted & 0xffff_ffff)?;
        q.set(CONSTANT_BUFFER0_ADDR_UPPER_SHIFTED6, shifted >> 32)?;
        q.set(CONSTANT_BUFFER0_SIZE_SHIFTED4, u64::from(cb.size >> 4))?;
        q.set(CONSTANT_BUFFER0_VALID, 1)?;
        q.set(CONSTANT_BUFFER0_PREFETCH, CONSTANT_BUFFER_PREFETCH_PRE)?;
        q.set(
            CONSTANT_BUFFER_PREFETCH_PRE_MAX_SIZE_SHIFTED8,
            u64::from(cb.size.div_ceil(256)).min(CONSTANT_BUFFER_PREFETCH_MAX),
        )?;

        if self.invalidate_caches {
            // Bank 0 and the data caches (L1, which is not coherent between SMs). Not the
            // constant cache as a whole (bank 0 is the only bank a launch has) nor the
            // texture header and sampler caches (no textures): dropping those costs each
            // grid a cold start for nothing.
            for f in [
                CONSTANT_BUFFER0_INVALIDATE,
                INVALIDATE_TEXTURE_DATA_CACHE,
                INVALIDATE_SHADER_DATA_CACHE,
            ] {
                q.set(f, 1)?;
            }
        }
        if self.invalidate_code {
            q.set(INVALIDATE_INSTRUCTION_CACHE, 1)?;
        }

        if let Some(next) = self.next {
            aligned("the dependent QMD", next, QMD_ALIGN)?;
            q.set(DEPENDENT_QMD0_ENABLE, 1)?;
            q.set(
                DEPENDENT_QMD0_ACTION,
                DEPENDENT_QMD_ACTION_INVALIDATE_COPY_SCHEDULE,
            )?;
            q.set(DEPENDENT_QMD0_POINTER, next >> 8)?;
            q.set(DEPENDENT_QMD0_PREFETCH, 1)?;
        }
        if let Some(r) = self.release {
            aligned("the release semaphore", r.address, 4)?;
            q.set(RELEASE0_ENABLE, 1)?;
            q.set(RELEASE0_STRUCTURE_SIZE, RELEASE_STRUCTURE_SIZE_ONE_WORD)?;
            q.set(RELEASE0_MEMBAR_TYPE, RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR)?;
            q.set(RELEASE_SEMAPHORE0_ADDR_LOWER, r.address & 0xffff_ffff)?;
            q.set(RELEASE_SEMAPHORE0_ADDR_UPPER, r.address >> 32)?;
            q.set(RELEASE_SEMAPHORE0_PAYLOAD_LOWER, u64::from(r.payload))?;
            q.set(RELEASE_SEMAPHORE0_PAYLOAD_UPPER, 0)?;
        }
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::field::*;
    use super::*;

    /// Reads `width` bits at bit `shift` of word `word`: an independent reading of a
    /// header row `MW(hi:lo)` as word `lo / 32`, shift `lo % 32`, computed by hand below.
    fn bits(q: &Qmd, word: usize, shift: u32, width: u32) -> u64 {
        let mask = if width == 32 {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        u64::from((q.words()[word] >> shift) & mask)
    }

    fn launch() -> QmdLaunch {
        QmdLaunch {
            grid: [0x12345, 3, 7],
            block: [128, 2, 1],
            shared_bytes: 5000,
            registers: 40,
            barriers: 1,
            stack_bytes_per_thread: 0x260,
            program_address: 0x1_2345_6780,
            constant_buffer0: ConstantBuffer {
                address: 0x7f_0000_1240,
                size: 0x230,
            },
            release: Some(SemaphoreRelease {
                address: 0x1_0000_0008,
                payload: 0xdead_beef,
            }),
            next: Some(0x7f_0000_2300),
            invalidate_caches: true,
            invalidate_code: true,
            program_bytes: 0x1234,
        }
    }

    #[test]
    fn a_qmd_is_384_bytes() {
        assert_eq!(QMD_WORDS, 96);
        assert_eq!(Qmd::new().to_bytes().len(), 384);
    }

    /// Each row checked against the header's numbers, transcribed independently of the
    /// table: e.g. `GRID_WIDTH MW(1055:1024)` is all of word 32.
    #[test]
    fn fields_land_where_clcbc0qmd_h_puts_them() {
        let q = launch().pack().unwrap();
        // QMD_TYPE MW(25:23): word 0, bits 23..26; QMD_GROUP_ID MW(21:16) below it.
        assert_eq!(bits(&q, 0, 23, 3), 2);
        assert_eq!(bits(&q, 0, 16, 6), 0x3f);
        // API_VISIBLE_CALL_LIMIT MW(568:568), SAMPLER_INDEX MW(569:569): word 17, bits
        // 24 and 25.
        assert_eq!(bits(&q, 17, 24, 2), 0b11);
        // RELEASE_ENABLE(0) MW(320:320), STRUCTURE_SIZE MW(322:321), MEMBAR MW(323:323).
        assert_eq!(bits(&q, 10, 0, 4), 0b1011);
        // SASS_VERSION MW(543:536): word 16, bits 24..32.
        assert_eq!(bits(&q, 16, 24, 8), 0x90);
        // SHADER_LOCAL_MEMORY_HIGH_SIZE MW(567:544): word 17, bits 0..24.
        assert_eq!(bits(&q, 17, 0, 24), 0x260);
        // QMD_MINOR_VERSION MW(579:576), QMD_MAJOR_VERSION MW(583:580): word 18.
        assert_eq!(bits(&q, 18, 0, 4), 0);
        assert_eq!(bits(&q, 18, 4, 4), 4);
        // SHARED_MEMORY_SIZE MW(601:584): word 18, bits 8..26; 5000 rounded up to 256s.
        assert_eq!(bits(&q, 18, 8, 18), 5120);
        // MIN/MAX/TARGET_SM_CONFIG_SHARED_MEM_SIZE MW(613:608), (619:614), (625:620):
        // 5000 + 1024 bytes fit the 8 KiB carveout (8 / 4 + 1 = 3); the largest is 228
        // KiB (228 / 4 + 1 = 58); the target holds six such CTAs (64 KiB: 17).
        assert_eq!(bits(&q, 19, 0, 6), 3);
        assert_eq!(bits(&q, 19, 6, 6), 58);
        assert_eq!(bits(&q, 19, 12, 6), 17);
        // RELEASE_SEMAPHORE0_ADDR_LOWER MW(671:640) = word 20, UPPER MW(696:672) = word
        // 21 bits 0..25, PAYLOAD_LOWER MW(735:704) = word 22.
        assert_eq!(q.words()[20], 0x0000_0008);
        assert_eq!(bits(&q, 21, 0, 25), 0x1);
        assert_eq!(q.words()[22], 0xdead_beef);
        // GRID_WIDTH MW(1055:1024) = word 32; GRID_HEIGHT MW(1071:1056) = word 33 bits
        // 0..16; GRID_DEPTH MW(1103:1088) = word 34 bits 0..16.
        assert_eq!(q.words()[32], 0x12345);
        assert_eq!(bits(&q, 33, 0, 16), 3);
        assert_eq!(bits(&q, 34, 0, 16), 7);
        // CWD_MEMBAR_TYPE MW(1137:1136): word 35, bits 16..18.
        assert_eq!(bits(&q, 35, 16, 2), 1);
        // CTA_THREAD_DIMENSION0/1 MW(1167:1152)/(1183:1168) share word 36; DIMENSION2
        // MW(1199:1184), REGISTER_COUNT MW(1208:1200) and BARRIER_COUNT MW(1215:1211)
        // share word 37.
        assert_eq!(q.words()[36], 128 | (2 << 16));
        assert_eq!(q.words()[37], 1 | (40 << 16) | (1 << 27));
        // PROGRAM_ADDRESS_LOWER MW(1247:1216) = word 38, UPPER MW(1272:1248) = word 39.
        assert_eq!(q.words()[38], 0x2345_6780);
        assert_eq!(q.words()[39], 0x1);
        // CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0) MW(1567:1536) = word 48, UPPER
        // MW(1586:1568) = word 49 bits 0..19, SIZE_SHIFTED4(0) MW(1599:1587) = word 49
        // bits 19..32; VALID(0) MW(416:416) and INVALIDATE(0) MW(419:419) in word 13.
        let shifted = 0x7f_0000_1240u64 >> 6;
        assert_eq!(u64::from(q.words()[48]), shifted & 0xffff_ffff);
        assert_eq!(bits(&q, 49, 0, 19), shifted >> 32);
        assert_eq!(bits(&q, 49, 19, 13), 0x230 >> 4);
        assert_eq!(bits(&q, 13, 0, 1), 1);
        assert_eq!(bits(&q, 13, 3, 1), 1);
        // DEPENDENT_QMD_ENABLE(0) MW(368:368), ACTION(0) MW(371:369): word 11, bits 16
        // and 17..20; DEPENDENT_QMD0_POINTER MW(479:448) = word 14.
        assert_eq!(bits(&q, 11, 16, 1), 1);
        assert_eq!(bits(&q, 11, 17, 3), 3);
        assert_eq!(q.words()[14], 0x7f00_0023);
        // The INVALIDATE_* flags MW(602:602)..MW(607:607): word 18, bits 26..32, from
        // texture header (26) to shader constant (31): texture data (28), shader data
        // (29) and instruction (30) set.
        assert_eq!(bits(&q, 18, 26, 6), 0b01_1100);
        // DEPENDENT_QMD_PREFETCH(0) MW(372:372): word 11, bit 20.
        assert_eq!(bits(&q, 11, 20, 1), 1);
        // CONSTANT_BUFFER_PREFETCH(0) MW(418:417): word 13, bits 1..3, PRE (1); its
        // PRE_MAX_SIZE_SHIFTED8 MW(575:570): word 17, bits 26..32, 0x230 bytes in 256s.
        assert_eq!(bits(&q, 13, 1, 2), 1);
        assert_eq!(bits(&q, 17, 26, 6), 3);
        // PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED MW(1375:1344) = word 42, UPPER
        // MW(1392:1376) = word 43 bits 0..17, SIZE MW(1401:1393) = word 43 bits 17..26:
        // 0x1234 bytes hold 0x12 whole 256-byte units.
        assert_eq!(q.words()[42], 0x0123_4567);
        assert_eq!(bits(&q, 43, 0, 17), 0);
        assert_eq!(bits(&q, 43, 17, 9), 0x12);
    }

    #[test]
    fn a_grid_invalidates_the_instruction_cache_only_when_asked() {
        let mut l = launch();
        l.invalidate_code = false;
        let q = l.pack().unwrap();
        // Texture data (28) and shader data (29) still, not instruction (30).
        assert_eq!(bits(&q, 18, 26, 6), 0b00_1100);
        // A kernel larger than the field's limit prefetches the first 0x1ff units.
        l.program_bytes = 1 << 20;
        assert_eq!(l.pack().unwrap().get(field::PROGRAM_PREFETCH_SIZE), 0x1ff);
    }

    /// The hand check above catches a row that is off by one bit: a table with
    /// `GRID_HEIGHT` at 1072:1057 would put the height where the header does not.
    #[test]
    fn a_wrong_position_is_caught() {
        let wrong = Field {
            name: "GRID_HEIGHT",
            hi: 1072,
            lo: 1057,
        };
        let mut q = Qmd::new();
        q.set(wrong, 3).unwrap();
        assert_ne!(bits(&q, 33, 0, 16), 3);
        let mut q = Qmd::new();
        q.set(GRID_HEIGHT, 3).unwrap();
        assert_eq!(bits(&q, 33, 0, 16), 3);
    }

    #[test]
    fn every_field_reads_back_what_was_written() {
        let mut q = Qmd::new();
        for (i, f) in ALL.iter().enumerate() {
            let ones = if f.width() == 64 {
                u64::MAX
            } else {
                (1u64 << f.width()) - 1
            };
            q.set(*f, ones).unwrap();
            assert_eq!(q.get(*f), ones, "{}", f.name);
            // Writing one field leaves the earlier ones alone.
            for g in &ALL[..i] {
                assert_ne!(q.get(*g), 0, "{} clobbered {}", f.name, g.name);
            }
        }
    }

    #[test]
    fn the_table_has_no_overlaps_and_no_field_spans_two_words() {
        let mut owner: Vec<Option<&str>> = vec![None; QMD_BITS as usize];
        for f in ALL {
            assert_eq!(f.lo / 32, f.hi / 32, "{} spans two words", f.name);
            for b in f.lo..=f.hi {
                if let Some(other) = owner[b as usize] {
                    panic!("{} overlaps {} at bit {b}", f.name, other);
                }
                owner[b as usize] = Some(f.name);
            }
        }
    }

    /// No V04_00 field quench writes spans two words (the 64-bit addresses are split into
    /// LOWER and UPPER rows), but the setter handles one that does.
    #[test]
    fn a_field_spanning_two_words() {
        let spanning = Field {
            name: "SPANNING",
            hi: 47,
            lo: 24,
        };
        let mut q = Qmd::new();
        q.set(spanning, 0xabcdef).unwrap();
        assert_eq!(q.words()[0], 0xef00_0000);
        assert_eq!(q.words()[1], 0x0000_abcd);
        assert_eq!(q.get(spanning), 0xabcdef);
        // Neighbouring bits survive a rewrite.
        q.set(
            Field {
                name: "LOW",
                hi: 23,
                lo: 0,
            },
            0x12_3456,
        )
        .unwrap();
        q.set(spanning, 0).unwrap();
        assert_eq!(q.words(), &{
            let mut w = [0; QMD_WORDS];
            w[0] = 0x12_3456;
            w
        });
    }

    #[test]
    fn values_that_do_not_fit_are_refused_by_name() {
        let mut q = Qmd::new();
        let e = q.set(REGISTER_COUNT, 512).unwrap_err();
        assert_eq!(
            e,
            QmdError::DoesNotFit {
                field: "REGISTER_COUNT",
                bits: 9,
                value: 512
            }
        );
        assert!(e.to_string().contains("REGISTER_COUNT"), "{e}");
        q.set(REGISTER_COUNT, 511).unwrap();

        let mut l = launch();
        l.grid[1] = 70_000;
        let e = l.pack().unwrap_err();
        assert!(e.to_string().contains("GRID_HEIGHT"), "{e}");
        assert!(e.to_string().contains("0x11170"), "{e}");

        let mut l = launch();
        l.program_address = 1 << 57;
        let e = l.pack().unwrap_err();
        assert!(e.to_string().contains("PROGRAM_ADDRESS_UPPER"), "{e}");

        let outside = Field {
            name: "PAST_THE_END",
            hi: 3072,
            lo: 3070,
        };
        assert_eq!(
            q.set(outside, 1),
            Err(QmdError::OutsideQmd {
                field: "PAST_THE_END"
            })
        );
    }

    #[test]
    fn misaligned_addresses_are_refused() {
        let mut l = launch();
        l.constant_buffer0.address += 0x20;
        let e = l.pack().unwrap_err();
        assert!(e.to_string().contains("constant bank 0"), "{e}");
        let mut l = launch();
        l.constant_buffer0.size = 0x228;
        assert!(l.pack().is_err());
        let mut l = launch();
        l.program_address += 8;
        assert!(l.pack().is_err());
    }

    #[test]
    fn the_carveout_asked_for_holds_every_cta_the_sm_can_run() {
        // 128 threads, 32 registers: 16 CTAs by threads, 16 by registers; 16 × (5000 +
        // 1024) bytes = 94.1 KiB fits the 100 KiB carveout.
        assert_eq!(sm_config_for_occupancy(128, 32, 5000), 26);
        // 256 threads, 255 registers (256 a thread as given): one CTA by registers.
        assert_eq!(sm_config_for_occupancy(256, 255, 5000), 3);
        // No shared memory: 32 CTAs of 64 threads hold 32 reserved kilobytes.
        assert_eq!(sm_config_for_occupancy(64, 16, 0), 9);
        // 48 KiB a CTA: 4 of them need more than the largest carveout, which is asked for.
        assert_eq!(sm_config_for_occupancy(256, 32, 48 << 10), 58);
        let l = launch();
        let q = l.pack().unwrap();
        assert_eq!(q.get(MIN_SM_CONFIG_SHARED_MEM_SIZE), 3);
        // 256 threads, 40 registers: 8 CTAs by threads, 6 by registers (40 × 32 × 8
        // warps = 10,240 a CTA); 6 × 6,024 bytes fit 36 KiB, so the 64 KiB carveout.
        assert_eq!(q.get(TARGET_SM_CONFIG_SHARED_MEM_SIZE), 17);
    }

    #[test]
    fn shared_memory_picks_the_smallest_carveout() {
        assert_eq!(sm_config_shared_mem(0), Ok(3)); // 8 KiB
        assert_eq!(sm_config_shared_mem(7 * 1024), Ok(3));
        assert_eq!(sm_config_shared_mem(7 * 1024 + 1), Ok(5)); // 16 KiB
        assert_eq!(sm_config_shared_mem(99 * 1024), Ok(26)); // 100 KiB
        assert_eq!(sm_config_shared_mem(227 * 1024), Ok(58)); // 228 KiB
        assert!(sm_config_shared_mem(227 * 1024 + 1).is_err());
    }

    #[test]
    fn no_release_and_no_invalidation_leave_their_fields_zero() {
        let mut l = launch();
        l.release = None;
        l.next = None;
        l.invalidate_caches = false;
        l.invalidate_code = false;
        l.program_bytes = 255;
        let q = l.pack().unwrap();
        for f in [
            DEPENDENT_QMD0_PREFETCH,
            PROGRAM_PREFETCH_SIZE,
            PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED,
            RELEASE0_ENABLE,
            RELEASE_SEMAPHORE0_ADDR_LOWER,
            RELEASE_SEMAPHORE0_PAYLOAD_LOWER,
            INVALIDATE_INSTRUCTION_CACHE,
            CONSTANT_BUFFER0_INVALIDATE,
            DEPENDENT_QMD0_ENABLE,
            DEPENDENT_QMD0_POINTER,
        ] {
            assert_eq!(q.get(f), 0, "{}", f.name);
        }
        assert_eq!(q.get(CONSTANT_BUFFER0_VALID), 1);
    }
}
