//! Push buffers and GPFIFO entries for Hopper's channel class HOPPER_CHANNEL_GPFIFO_A
//! (0xC86F): the command stream a channel fetches. A push buffer is a run of 32-bit words,
//! each method header followed by its data; a GPFIFO entry points the channel at one such
//! run (its address and length in words).
//!
//! Where the numbers come from:
//! - method header layout (`NV*_DMA_*`: SEC_OP 31:29, count or immediate data 28:16,
//!   subchannel 15:13, method address >> 2 in 11:0): `clc46f.h` as NVIDIA's UVM driver
//!   uses it for every channel class up to Hopper's (open-gpu-kernel-modules 595.45.04,
//!   kernel-open/nvidia-uvm/clc46f.h and uvm_push_macros.h);
//! - host methods (`NVC86F_SET_OBJECT`, `SEM_ADDR_LO` … `SEM_EXECUTE`) and the GPFIFO
//!   entry (`NVC86F_GP_ENTRY0/1`): `clc86f.h` (src/common/sdk/nvidia/inc/class/clc86f.h,
//!   same release); the values `RELEASE_WFI_EN` and `PAYLOAD_SIZE_64BIT`, which that copy
//!   leaves out, from `clc76f.h` (open-gpu-doc, classes/host), whose fields sit at the
//!   same bits;
//! - compute methods (`NVCBC0_SET_OBJECT`, `SEND_PCAS_A`, `SEND_SIGNALING_PCAS2_B`):
//!   `clcbc0.h` (open-gpu-doc, classes/compute, commit c8607fe5).

use super::qmd::QMD_ALIGN;

/// HOPPER_CHANNEL_GPFIFO_A: the channel's own class, whose methods (the semaphores
/// below) the host executes itself; quench sends them on subchannel 0.
pub const HOPPER_CHANNEL_GPFIFO_A: u32 = 0xC86F;
/// HOPPER_COMPUTE_A: the compute class.
pub const HOPPER_COMPUTE_A: u32 = 0xCBC0;

/// The opcode in bits 31:29 of a method header (`NVC46F_DMA_SEC_OP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SecOp {
    /// `INC_METHOD`: the data go to consecutive methods.
    Incrementing = 1,
    /// `NON_INC_METHOD`: every data word goes to the same method.
    NonIncrementing = 3,
    /// `IMMD_DATA_METHOD`: no data words; 13 bits of data in the header.
    Immediate = 4,
    /// `ONE_INC`: the first word to the method, the rest to the next one.
    IncrementOnce = 5,
}

/// Host methods (`NVC86F_*`), byte addresses.
pub mod host {
    pub const SET_OBJECT: u32 = 0x0000;
    pub const SEM_ADDR_LO: u32 = 0x005c;
    pub const SEM_ADDR_HI: u32 = 0x0060;
    pub const SEM_PAYLOAD_LO: u32 = 0x0064;
    pub const SEM_PAYLOAD_HI: u32 = 0x0068;
    pub const SEM_EXECUTE: u32 = 0x006c;
    /// `SEM_EXECUTE_OPERATION` (2:0): `ACQUIRE`, wait until the semaphore equals the
    /// payload.
    pub const SEM_EXECUTE_OPERATION_ACQUIRE: u32 = 0;
    /// `SEM_EXECUTE_OPERATION_RELEASE`: write the payload.
    pub const SEM_EXECUTE_OPERATION_RELEASE: u32 = 1;
    /// `SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ`: wait until the semaphore is at least the
    /// payload, comparing as a wrapping counter.
    pub const SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ: u32 = 3;
    /// `SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN` at bit 12: yield the GPU while waiting.
    pub const SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN: u32 = 1 << 12;
    /// `SEM_EXECUTE_RELEASE_WFI_EN` at bit 20: wait for the work before it to finish.
    pub const SEM_EXECUTE_RELEASE_WFI_EN: u32 = 1 << 20;
    /// `SEM_EXECUTE_PAYLOAD_SIZE_64BIT` at bit 24.
    pub const SEM_EXECUTE_PAYLOAD_SIZE_64BIT: u32 = 1 << 24;
    /// `SEM_EXECUTE_RELEASE_TIMESTAMP_EN` at bit 25: the release writes a 16-byte report,
    /// the payload and then the GPU's time in nanoseconds.
    pub const SEM_EXECUTE_RELEASE_TIMESTAMP_EN: u32 = 1 << 25;
}

/// HOPPER_DMA_COPY_A: the copy engine's class.
pub const HOPPER_DMA_COPY_A: u32 = 0xC8B5;

/// Copy engine methods (`NVC8B5_*` in src/common/sdk/nvidia/inc/class/clc8b5.h), byte
/// addresses.
pub mod copy {
    /// `SET_SEMAPHORE_A` (`UPPER`, 24:0), `_B` (0x244, lower 32 bits), `_PAYLOAD` (0x248).
    pub const SET_SEMAPHORE_A: u32 = 0x0240;
    /// `LAUNCH_DMA`: starts the copy set up by the methods from `OFFSET_IN_UPPER` on.
    pub const LAUNCH_DMA: u32 = 0x0300;
    /// `OFFSET_IN_UPPER` (24:0), `OFFSET_IN_LOWER`, `OFFSET_OUT_UPPER`, `OFFSET_OUT_LOWER`.
    pub const OFFSET_IN_UPPER: u32 = 0x0400;
    /// `LINE_LENGTH_IN`: bytes in a line (a one-line copy: its length).
    pub const LINE_LENGTH_IN: u32 = 0x0418;
    /// `LAUNCH_DMA_DATA_TRANSFER_TYPE_NON_PIPELINED` (1:0 = 2): the copy waits for the
    /// engine's earlier work.
    pub const LAUNCH_NON_PIPELINED: u32 = 2;
    /// `LAUNCH_DMA_FLUSH_ENABLE_TRUE` (bit 2): the data are visible when the semaphore is.
    pub const LAUNCH_FLUSH: u32 = 1 << 2;
    /// `LAUNCH_DMA_SEMAPHORE_TYPE_RELEASE_ONE_WORD_SEMAPHORE` (4:3 = 1).
    pub const LAUNCH_RELEASE_SEMAPHORE: u32 = 1 << 3;
    /// `LAUNCH_DMA_SRC_MEMORY_LAYOUT_PITCH` (bit 7) and `DST_MEMORY_LAYOUT_PITCH` (bit 8):
    /// plain byte ranges, not block-linear surfaces.
    pub const LAUNCH_PITCH: u32 = (1 << 7) | (1 << 8);
    /// The most bytes one `LAUNCH_DMA` of a single line moves (`LINE_LENGTH_IN` is 32
    /// bits); larger copies are cut into pieces of at most this.
    pub const MAX_LINE: u64 = 1 << 31;
}

/// Compute methods (`NVCBC0_*`), byte addresses.
pub mod compute {
    /// `SET_OBJECT`: `CLASS_ID` in 15:0, `ENGINE_ID` in 20:16.
    pub const SET_OBJECT: u32 = 0x0000;
    /// `SEND_PCAS_A`: `QMD_ADDRESS_SHIFTED8` (31:0).
    pub const SEND_PCAS_A: u32 = 0x02b4;
    /// `SEND_SIGNALING_PCAS2_B`: `PCAS_ACTION` in 3:0.
    pub const SEND_SIGNALING_PCAS2_B: u32 = 0x02c0;
    /// `SET_SHADER_SHARED_MEMORY_WINDOW_A`: `BASE_ADDRESS_UPPER` (16:0); `_B` (0x02a4)
    /// the lower 32 bits.
    pub const SET_SHADER_SHARED_MEMORY_WINDOW_A: u32 = 0x02a0;
    /// `SET_SHADER_LOCAL_MEMORY_WINDOW_A`: `BASE_ADDRESS_UPPER` (16:0); `_B` (0x07b4) the
    /// lower 32 bits.
    pub const SET_SHADER_LOCAL_MEMORY_WINDOW_A: u32 = 0x07b0;
    /// `SET_SHADER_LOCAL_MEMORY_A`: the local memory's `ADDRESS_UPPER` (24:0); `_B`
    /// (0x0794) the lower 32 bits.
    pub const SET_SHADER_LOCAL_MEMORY_A: u32 = 0x0790;
    /// `SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A`: bytes per TPC, `SIZE_UPPER` (7:0); `_B`
    /// (0x02e8) the lower 32 bits; `_C` (0x02ec) `MAX_SM_COUNT` (8:0).
    pub const SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A: u32 = 0x02e4;
}

/// What `SEND_SIGNALING_PCAS2_B` asks of the QMD sent by `SEND_PCAS_A`
/// (`NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PcasAction {
    Invalidate = 1,
    Schedule = 2,
    /// Drop any cached copy of the QMD, read it afresh and schedule its grid: what a
    /// launch of a QMD just written to memory needs.
    InvalidateCopySchedule = 3,
}

/// Why a method or GPFIFO entry cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("subchannel {0} does not exist (a channel has subchannels 0 to 7)")]
    Subchannel(u32),
    #[error("method {0:#x} cannot be encoded: a method address is a multiple of 4 below 0x4000")]
    Method(u32),
    #[error("{count} data words for method {method:#x} exceed a header's 8191")]
    Count { method: u32, count: usize },
    #[error("immediate data {data:#x} for method {method:#x} exceed the header's 13 bits")]
    Immediate { method: u32, data: u32 },
    #[error("{what} at {address:#x} is not a multiple of {align} bytes")]
    Misaligned {
        what: &'static str,
        address: u64,
        align: u64,
    },
    #[error("{what} at {address:#x} is past the {bits}-bit addresses it can hold")]
    Address {
        what: &'static str,
        address: u64,
        bits: u32,
    },
    #[error("class {0:#x} does not fit SET_OBJECT's 16-bit CLASS_ID")]
    Class(u32),
    #[error("a push buffer segment of {0} words exceeds a GPFIFO entry's 2097151")]
    Length(usize),
    #[error("a copy of {0} bytes: one copy engine launch moves 1 to 2147483648 bytes")]
    CopyLength(u64),
}

/// `MAX_SM_COUNT` of `SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C`: every SM may use the
/// local memory at once.
const MAX_SM_COUNT: u32 = 0xff;

/// Largest count in a method header (13 bits, 28:16).
pub const MAX_COUNT: usize = (1 << 13) - 1;

/// A method header: `op`, `subchannel`, the method's byte address and the count (or the
/// immediate data for [`SecOp::Immediate`]).
pub fn method_header(
    op: SecOp,
    subchannel: u32,
    method: u32,
    count: u32,
) -> Result<u32, PushError> {
    if subchannel > 7 {
        return Err(PushError::Subchannel(subchannel));
    }
    if !method.is_multiple_of(4) || method >= 0x4000 {
        return Err(PushError::Method(method));
    }
    if count as usize > MAX_COUNT {
        return Err(match op {
            SecOp::Immediate => PushError::Immediate {
                method,
                data: count,
            },
            _ => PushError::Count {
                method,
                count: count as usize,
            },
        });
    }
    Ok(((op as u32) << 29) | (count << 16) | (subchannel << 13) | (method >> 2))
}

/// A push buffer being written: headers and data words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushBuffer {
    words: Vec<u32>,
}

impl PushBuffer {
    pub fn new() -> PushBuffer {
        PushBuffer::default()
    }

    /// The words written so far.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The bytes as they lie in memory for the GPU (little-endian words).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn method(&mut self, op: SecOp, sub: u32, method: u32, data: &[u32]) -> Result<(), PushError> {
        if data.len() > MAX_COUNT {
            return Err(PushError::Count {
                method,
                count: data.len(),
            });
        }
        self.words
            .push(method_header(op, sub, method, data.len() as u32)?);
        self.words.extend_from_slice(data);
        Ok(())
    }

    /// `data` to methods `method`, `method + 4`, ….
    pub fn incrementing(&mut self, sub: u32, method: u32, data: &[u32]) -> Result<(), PushError> {
        self.method(SecOp::Incrementing, sub, method, data)
    }

    /// Every word of `data` to `method`.
    pub fn non_incrementing(
        &mut self,
        sub: u32,
        method: u32,
        data: &[u32],
    ) -> Result<(), PushError> {
        self.method(SecOp::NonIncrementing, sub, method, data)
    }

    /// The first word of `data` to `method`, the rest to `method + 4`.
    pub fn increment_once(&mut self, sub: u32, method: u32, data: &[u32]) -> Result<(), PushError> {
        self.method(SecOp::IncrementOnce, sub, method, data)
    }

    /// `data` (at most 13 bits) to `method`, inside the header.
    pub fn immediate(&mut self, sub: u32, method: u32, data: u32) -> Result<(), PushError> {
        if data as usize > MAX_COUNT {
            return Err(PushError::Immediate { method, data });
        }
        self.words
            .push(method_header(SecOp::Immediate, sub, method, data)?);
        Ok(())
    }

    /// Binds `class` (e.g. [`HOPPER_COMPUTE_A`]) to subchannel `sub`: `SET_OBJECT` with
    /// the class in `CLASS_ID` (15:0).
    pub fn set_object(&mut self, sub: u32, class: u32) -> Result<(), PushError> {
        if class > 0xffff {
            return Err(PushError::Class(class));
        }
        self.incrementing(sub, compute::SET_OBJECT, &[class])
    }

    /// The host writes the 64-bit `payload` to `address` once the work before it has
    /// finished.
    pub fn semaphore_release(&mut self, address: u64, payload: u64) -> Result<(), PushError> {
        self.semaphore(
            address,
            payload,
            host::SEM_EXECUTE_OPERATION_RELEASE
                | host::SEM_EXECUTE_RELEASE_WFI_EN
                | host::SEM_EXECUTE_PAYLOAD_SIZE_64BIT,
        )
    }

    /// As [`PushBuffer::semaphore_release`], and the GPU's time in nanoseconds written
    /// at `address + 8` (16-byte aligned).
    pub fn semaphore_release_timestamp(
        &mut self,
        address: u64,
        payload: u64,
    ) -> Result<(), PushError> {
        if !address.is_multiple_of(16) {
            return Err(PushError::Misaligned {
                what: "a timestamped semaphore",
                address,
                align: 16,
            });
        }
        self.semaphore(
            address,
            payload,
            host::SEM_EXECUTE_OPERATION_RELEASE
                | host::SEM_EXECUTE_RELEASE_WFI_EN
                | host::SEM_EXECUTE_PAYLOAD_SIZE_64BIT
                | host::SEM_EXECUTE_RELEASE_TIMESTAMP_EN,
        )
    }

    /// The copy engine bound to `sub` copies `bytes` (1 to [`copy::MAX_LINE`]) from the
    /// GPU virtual address `src` to `dst`, then writes the 32-bit `payload` to the
    /// semaphore at `semaphore` (4-byte aligned) once the data have landed.
    pub fn dma_copy(
        &mut self,
        sub: u32,
        src: u64,
        dst: u64,
        bytes: u64,
        semaphore: u64,
        payload: u32,
    ) -> Result<(), PushError> {
        if bytes == 0 || bytes > copy::MAX_LINE {
            return Err(PushError::CopyLength(bytes));
        }
        if !semaphore.is_multiple_of(4) {
            return Err(PushError::Misaligned {
                what: "a copy engine semaphore",
                address: semaphore,
                align: 4,
            });
        }
        for (what, address) in [
            ("a copy's source", src),
            ("a copy's destination", dst),
            ("a copy engine semaphore", semaphore),
        ] {
            if address >> 57 != 0 {
                return Err(PushError::Address {
                    what,
                    address,
                    bits: 57,
                });
            }
        }
        self.incrementing(
            sub,
            copy::SET_SEMAPHORE_A,
            &[(semaphore >> 32) as u32, semaphore as u32, payload],
        )?;
        self.incrementing(
            sub,
            copy::OFFSET_IN_UPPER,
            &[
                (src >> 32) as u32,
                src as u32,
                (dst >> 32) as u32,
                dst as u32,
            ],
        )?;
        self.incrementing(sub, copy::LINE_LENGTH_IN, &[bytes as u32])?;
        self.incrementing(
            sub,
            copy::LAUNCH_DMA,
            &[copy::LAUNCH_NON_PIPELINED
                | copy::LAUNCH_FLUSH
                | copy::LAUNCH_RELEASE_SEMAPHORE
                | copy::LAUNCH_PITCH],
        )
    }

    /// The host waits until the 64-bit semaphore at `address` has reached `payload`
    /// (as a wrapping counter), yielding the GPU meanwhile.
    pub fn semaphore_acquire(&mut self, address: u64, payload: u64) -> Result<(), PushError> {
        self.semaphore(
            address,
            payload,
            host::SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ
                | host::SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN
                | host::SEM_EXECUTE_PAYLOAD_SIZE_64BIT,
        )
    }

    fn semaphore(&mut self, address: u64, payload: u64, execute: u32) -> Result<(), PushError> {
        const WHAT: &str = "a 64-bit semaphore";
        if !address.is_multiple_of(8) {
            return Err(PushError::Misaligned {
                what: WHAT,
                address,
                align: 8,
            });
        }
        // SEM_ADDR_LO_OFFSET is 31:2 of the address, SEM_ADDR_HI_OFFSET (24:0) the bits
        // above: 57 bits in all.
        if address >> 57 != 0 {
            return Err(PushError::Address {
                what: WHAT,
                address,
                bits: 57,
            });
        }
        self.incrementing(
            0,
            host::SEM_ADDR_LO,
            &[
                address as u32,
                (address >> 32) as u32,
                payload as u32,
                (payload >> 32) as u32,
                execute,
            ],
        )
    }

    /// Places the windows through which generic addresses reach shared and local memory
    /// for the compute class bound to `sub`.
    pub fn shader_windows(&mut self, sub: u32, shared: u64, local: u64) -> Result<(), PushError> {
        for (what, method, address) in [
            (
                "the shared memory window",
                compute::SET_SHADER_SHARED_MEMORY_WINDOW_A,
                shared,
            ),
            (
                "the local memory window",
                compute::SET_SHADER_LOCAL_MEMORY_WINDOW_A,
                local,
            ),
        ] {
            if address >> 49 != 0 {
                return Err(PushError::Address {
                    what,
                    address,
                    bits: 49,
                });
            }
            self.incrementing(sub, method, &[(address >> 32) as u32, address as u32])?;
        }
        Ok(())
    }

    /// Gives the compute class bound to `sub` its local memory: `bytes_per_tpc` for each
    /// TPC, the TPCs' shares one after another from `address`.
    pub fn shader_local_memory(
        &mut self,
        sub: u32,
        address: u64,
        bytes_per_tpc: u64,
    ) -> Result<(), PushError> {
        if address >> 57 != 0 {
            return Err(PushError::Address {
                what: "local memory",
                address,
                bits: 57,
            });
        }
        if bytes_per_tpc >> 40 != 0 {
            return Err(PushError::Address {
                what: "local memory per TPC",
                address: bytes_per_tpc,
                bits: 40,
            });
        }
        self.incrementing(
            sub,
            compute::SET_SHADER_LOCAL_MEMORY_A,
            &[(address >> 32) as u32, address as u32],
        )?;
        self.incrementing(
            sub,
            compute::SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
            &[
                (bytes_per_tpc >> 32) as u32,
                bytes_per_tpc as u32,
                MAX_SM_COUNT,
            ],
        )
    }

    /// Launches the grid of the QMD at `qmd_address` on the compute class bound to `sub`:
    /// `SEND_PCAS_A` with the address >> 8, then `SEND_SIGNALING_PCAS2_B` with `action`.
    pub fn launch(
        &mut self,
        sub: u32,
        qmd_address: u64,
        action: PcasAction,
    ) -> Result<(), PushError> {
        const WHAT: &str = "a QMD";
        if !qmd_address.is_multiple_of(QMD_ALIGN) {
            return Err(PushError::Misaligned {
                what: WHAT,
                address: qmd_address,
                align: QMD_ALIGN,
            });
        }
        let shifted = qmd_address >> 8;
        let Ok(shifted) = u32::try_from(shifted) else {
            return Err(PushError::Address {
                what: WHAT,
                address: qmd_address,
                bits: 40,
            });
        };
        self.incrementing(sub, compute::SEND_PCAS_A, &[shifted])?;
        self.incrementing(sub, compute::SEND_SIGNALING_PCAS2_B, &[action as u32])
    }
}

/// Whether the channel, after this entry, carries on (`MAIN`) or returns to it
/// (`SUBROUTINE`) (`NVC86F_GP_ENTRY1_LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Main = 0,
    Subroutine = 1,
}

/// One GPFIFO entry (`NVC86F_GP_ENTRY0/1`, 8 bytes): a push buffer segment's address
/// (bits 39:2; `GET` in ENTRY0 31:2, `GET_HI` in ENTRY1 7:0) and its length in words
/// (`LENGTH`, ENTRY1 30:10), fetched unconditionally (`FETCH`, ENTRY0 0:0 = 0), without
/// waiting for the previous segment (`SYNC_PROCEED`, ENTRY1 31:31 = 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpEntry {
    pub address: u64,
    pub length_words: u32,
    pub level: Level,
}

/// Largest segment one entry can point at (21 bits of `LENGTH`).
pub const MAX_SEGMENT_WORDS: usize = (1 << 21) - 1;

impl GpEntry {
    /// The entry for `length_words` words at `address`, or why there is none.
    pub fn new(address: u64, length_words: usize, level: Level) -> Result<GpEntry, PushError> {
        const WHAT: &str = "a push buffer segment";
        if !address.is_multiple_of(4) {
            return Err(PushError::Misaligned {
                what: WHAT,
                address,
                align: 4,
            });
        }
        if address >> 40 != 0 {
            return Err(PushError::Address {
                what: WHAT,
                address,
                bits: 40,
            });
        }
        if length_words > MAX_SEGMENT_WORDS {
            return Err(PushError::Length(length_words));
        }
        Ok(GpEntry {
            address,
            length_words: length_words as u32,
            level,
        })
    }

    /// ENTRY0 and ENTRY1, in the order they lie in the GPFIFO ring.
    pub fn words(&self) -> [u32; 2] {
        let entry0 = (self.address as u32) & !0b11;
        let entry1 = ((self.address >> 32) as u32 & 0xff)
            | ((self.level as u32) << 9)
            | (self.length_words << 10);
        [entry0, entry1]
    }

    /// The entry as one little-endian 64-bit word.
    pub fn to_u64(&self) -> u64 {
        let [lo, hi] = self.words();
        u64::from(lo) | (u64::from(hi) << 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header taken apart by the header's bit numbers, independently of the encoder:
    /// (SEC_OP 31:29, COUNT 28:16, SUBCHANNEL 15:13, method byte address from 11:0).
    fn fields(h: u32) -> (u32, u32, u32, u32) {
        (
            h >> 29,
            (h >> 16) & 0x1fff,
            (h >> 13) & 0x7,
            (h & 0xfff) << 2,
        )
    }

    #[test]
    fn headers_follow_the_dma_format() {
        let h = method_header(SecOp::Incrementing, 1, compute::SEND_PCAS_A, 1).unwrap();
        assert_eq!(h, 0x2001_20ad);
        assert_eq!(fields(h), (1, 1, 1, 0x2b4));
        let h = method_header(SecOp::NonIncrementing, 7, 0x3ffc, 8191).unwrap();
        assert_eq!(fields(h), (3, 8191, 7, 0x3ffc));
        let h = method_header(SecOp::IncrementOnce, 2, 0x100, 3).unwrap();
        assert_eq!(fields(h), (5, 3, 2, 0x100));
        // A method one word off lands elsewhere: the check above would catch it.
        let off = method_header(SecOp::Incrementing, 1, compute::SEND_PCAS_A + 4, 1).unwrap();
        assert_ne!(fields(off), (1, 1, 1, 0x2b4));
    }

    #[test]
    fn immediate_data_lives_in_the_header() {
        let mut p = PushBuffer::new();
        p.immediate(1, compute::SEND_SIGNALING_PCAS2_B, 3).unwrap();
        assert_eq!(p.words(), &[0x8003_20b0]);
        assert_eq!(fields(p.words()[0]), (4, 3, 1, 0x2c0));
        assert_eq!(
            p.immediate(1, 0x100, 1 << 13),
            Err(PushError::Immediate {
                method: 0x100,
                data: 1 << 13
            })
        );
    }

    #[test]
    fn set_object_binds_the_compute_class() {
        let mut p = PushBuffer::new();
        p.set_object(1, HOPPER_COMPUTE_A).unwrap();
        assert_eq!(p.words(), &[0x2001_2000, 0xcbc0]);
        assert_eq!(p.set_object(1, 0x1_cbc0), Err(PushError::Class(0x1_cbc0)));
    }

    /// SEM_ADDR_LO (0x5c) … SEM_EXECUTE (0x6c) in one incrementing method of five words.
    #[test]
    fn host_semaphores() {
        let mut p = PushBuffer::new();
        p.semaphore_release(0x1_2345_6788, 0x1_0000_0002).unwrap();
        assert_eq!(
            p.words(),
            &[
                0x2005_0017,
                0x2345_6788,
                0x1,
                0x2,
                0x1,
                // OPERATION_RELEASE (2:0 = 1), RELEASE_WFI_EN (bit 20), PAYLOAD_SIZE_64BIT
                // (bit 24).
                0x0110_0001,
            ]
        );
        let mut p = PushBuffer::new();
        p.semaphore_acquire(0x1000, 7).unwrap();
        // OPERATION_ACQ_CIRC_GEQ (3), ACQUIRE_SWITCH_TSG_EN (bit 12), 64-bit payload.
        assert_eq!(p.words()[5], 0x0100_1003);
        assert_eq!(fields(p.words()[0]), (1, 5, 0, 0x5c));
        assert!(matches!(
            p.semaphore_release(0x1004, 1),
            Err(PushError::Misaligned { align: 8, .. })
        ));
        assert!(matches!(
            p.semaphore_release(1 << 57, 1),
            Err(PushError::Address { bits: 57, .. })
        ));
    }

    #[test]
    fn a_timestamped_release_sets_bit_25_and_wants_16_bytes() {
        let mut p = PushBuffer::new();
        p.semaphore_release_timestamp(0x1_0000_0010, 3).unwrap();
        assert_eq!(p.words()[5], 0x0310_0001);
        assert!(matches!(
            p.semaphore_release_timestamp(0x1008, 1),
            Err(PushError::Misaligned { align: 16, .. })
        ));
    }

    /// SET_SEMAPHORE_A..PAYLOAD, OFFSET_IN_UPPER..OFFSET_OUT_LOWER, LINE_LENGTH_IN,
    /// LAUNCH_DMA on the copy engine's subchannel.
    #[test]
    fn a_copy_sets_its_semaphore_and_range_then_launches() {
        let mut p = PushBuffer::new();
        p.dma_copy(4, 0x12_3456_7800, 0x9_8765_4300, 0x1_0000, 0x2_0000_0010, 9)
            .unwrap();
        let w = p.words();
        assert_eq!(fields(w[0]), (1, 3, 4, 0x240));
        assert_eq!(&w[1..4], &[0x2, 0x10, 9]);
        assert_eq!(fields(w[4]), (1, 4, 4, 0x400));
        assert_eq!(&w[5..9], &[0x12, 0x3456_7800, 0x9, 0x8765_4300]);
        assert_eq!(fields(w[9]), (1, 1, 4, 0x418));
        assert_eq!(w[10], 0x1_0000);
        assert_eq!(fields(w[11]), (1, 1, 4, 0x300));
        // NON_PIPELINED (2), FLUSH (bit 2), one-word semaphore (bit 3), pitch in and out
        // (bits 7 and 8).
        assert_eq!(w[12], 0x18e);
        assert_eq!(p.dma_copy(4, 0, 0, 0, 0, 1), Err(PushError::CopyLength(0)));
        assert_eq!(
            p.dma_copy(4, 0, 0, (1 << 31) + 1, 0, 1),
            Err(PushError::CopyLength((1 << 31) + 1))
        );
        assert!(matches!(
            p.dma_copy(4, 0, 0, 8, 2, 1),
            Err(PushError::Misaligned { align: 4, .. })
        ));
    }

    #[test]
    fn a_launch_sends_the_qmd_address_then_the_action() {
        let mut p = PushBuffer::new();
        p.launch(1, 0x7f_1234_5600, PcasAction::InvalidateCopySchedule)
            .unwrap();
        assert_eq!(p.words(), &[0x2001_20ad, 0x7f12_3456, 0x2001_20b0, 3]);
        let e = p
            .launch(1, 0x7f_1234_5680, PcasAction::Schedule)
            .unwrap_err();
        assert!(e.to_string().contains("a QMD at 0x7f12345680"), "{e}");
        assert!(p.launch(1, 1 << 40, PcasAction::Schedule).is_err());
        assert_eq!(p.words().len(), 4);
    }

    #[test]
    fn shader_windows_send_upper_then_lower_halves() {
        let mut p = PushBuffer::new();
        p.shader_windows(1, 0x7e00_1234_5678, 0x1_0000_0000)
            .unwrap();
        // INC, two words, subchannel 1, method 0x2a0 (0xa8 in words) then 0x7b0 (0x1ec).
        assert_eq!(
            p.words(),
            &[0x2002_20a8, 0x7e00, 0x1234_5678, 0x2002_21ec, 1, 0]
        );
        let e = p.shader_windows(1, 1 << 49, 0).unwrap_err();
        assert!(e.to_string().contains("the shared memory window"), "{e}");
        assert!(p.shader_windows(1, 0, 1 << 49).is_err());
    }

    #[test]
    fn local_memory_sends_its_address_then_its_size_per_tpc() {
        let mut p = PushBuffer::new();
        p.shader_local_memory(1, 0x12_3456_0000, 0x1_0002_8000)
            .unwrap();
        // INC, subchannel 1: method 0x790 (0x1e4 in words) with two words, then 0x2e4
        // (0xb9) with three.
        assert_eq!(
            p.words(),
            &[
                0x2002_21e4,
                0x12,
                0x3456_0000,
                0x2003_20b9,
                1,
                0x2_8000,
                0xff
            ]
        );
        assert!(p.shader_local_memory(1, 1 << 57, 0x8000).is_err());
        assert!(p.shader_local_memory(1, 0, 1 << 40).is_err());
        assert_eq!(p.words().len(), 7);
    }

    #[test]
    fn malformed_methods_are_refused() {
        let mut p = PushBuffer::new();
        assert_eq!(p.incrementing(8, 0, &[1]), Err(PushError::Subchannel(8)));
        assert_eq!(
            p.incrementing(0, 0x4000, &[1]),
            Err(PushError::Method(0x4000))
        );
        assert_eq!(
            p.incrementing(0, 0x102, &[1]),
            Err(PushError::Method(0x102))
        );
        let many = vec![0; MAX_COUNT + 1];
        assert_eq!(
            p.non_incrementing(0, 0x100, &many),
            Err(PushError::Count {
                method: 0x100,
                count: 8192
            })
        );
        assert!(p.words().is_empty());
        p.increment_once(0, 0x100, &[1, 2]).unwrap();
        assert_eq!(p.to_bytes().len(), 12);
    }

    #[test]
    fn gpfifo_entries() {
        let e = GpEntry::new(0x12_3456_7890, 10, Level::Main).unwrap();
        // GET (ENTRY0 31:2) holds the address's bits 31:2; GET_HI (ENTRY1 7:0) bits
        // 39:32; LENGTH (ENTRY1 30:10) the words.
        assert_eq!(e.words(), [0x3456_7890, 0x12 | (10 << 10)]);
        assert_eq!(e.to_u64(), 0x0000_2812_3456_7890);
        let s = GpEntry::new(0x1000, 1, Level::Subroutine).unwrap();
        assert_eq!(s.words()[1], (1 << 9) | (1 << 10));
        assert_eq!(
            GpEntry::new(0x1000, MAX_SEGMENT_WORDS, Level::Main)
                .unwrap()
                .words()[1]
                >> 31,
            0
        );
        assert!(matches!(
            GpEntry::new(0x1002, 1, Level::Main),
            Err(PushError::Misaligned { align: 4, .. })
        ));
        assert!(matches!(
            GpEntry::new(1 << 40, 1, Level::Main),
            Err(PushError::Address { bits: 40, .. })
        ));
        assert_eq!(
            GpEntry::new(0, MAX_SEGMENT_WORDS + 1, Level::Main),
            Err(PushError::Length(MAX_SEGMENT_WORDS + 1))
        );
    }
}
