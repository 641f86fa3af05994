//! `.nv.info` and `.nv.info.<kernel>` records (EIATTR): what the driver needs to know about
//! a kernel besides its code — register count, parameter layout, exit offsets, barriers.
//!
//! Each record starts with a format byte and an attribute byte. `EIFMT_NVAL` (1) has no
//! value and is padded to four bytes, `EIFMT_BVAL` (2) one byte plus a pad byte,
//! `EIFMT_HVAL` (3) a 16-bit value, and `EIFMT_SVAL` (4) a 16-bit size followed by that
//! many bytes. Attribute numbers and names are those NVIDIA's tools print (checked against
//! nvdisasm's listing of ptxas's cubins in the tests).

use crate::elf::Reader;
use crate::error::{Result, SassError};

pub const EIFMT_NVAL: u8 = 1;
pub const EIFMT_BVAL: u8 = 2;
pub const EIFMT_HVAL: u8 = 3;
pub const EIFMT_SVAL: u8 = 4;

/// Attribute numbers and the names NVIDIA's tools give them.
pub const ATTRIBUTES: &[(u8, &str)] = &[
    (0x01, "EIATTR_PAD"),
    (0x02, "EIATTR_IMAGE_SLOT"),
    (0x03, "EIATTR_JUMPTABLE_RELOCS"),
    (0x04, "EIATTR_CTAIDZ_USED"),
    (0x05, "EIATTR_MAX_THREADS"),
    (0x06, "EIATTR_IMAGE_OFFSET"),
    (0x07, "EIATTR_IMAGE_SIZE"),
    (0x08, "EIATTR_TEXTURE_NORMALIZED"),
    (0x09, "EIATTR_SAMPLER_INIT"),
    (0x0a, "EIATTR_PARAM_CBANK"),
    (0x0b, "EIATTR_SMEM_PARAM_OFFSETS"),
    (0x0c, "EIATTR_CBANK_PARAM_OFFSETS"),
    (0x0d, "EIATTR_SYNC_STACK"),
    (0x0e, "EIATTR_TEXID_SAMPID_MAP"),
    (0x0f, "EIATTR_EXTERNS"),
    (0x10, "EIATTR_REQNTID"),
    (0x11, "EIATTR_FRAME_SIZE"),
    (0x12, "EIATTR_MIN_STACK_SIZE"),
    (0x13, "EIATTR_SAMPLER_FORCE_UNNORMALIZED"),
    (0x14, "EIATTR_BINDLESS_IMAGE_OFFSETS"),
    (0x15, "EIATTR_BINDLESS_TEXTURE_BANK"),
    (0x16, "EIATTR_BINDLESS_SURFACE_BANK"),
    (0x17, "EIATTR_KPARAM_INFO"),
    (0x18, "EIATTR_SMEM_PARAM_SIZE"),
    (0x19, "EIATTR_CBANK_PARAM_SIZE"),
    (0x1a, "EIATTR_QUERY_NUMATTRIB"),
    (0x1b, "EIATTR_MAXREG_COUNT"),
    (0x1c, "EIATTR_EXIT_INSTR_OFFSETS"),
    (0x1d, "EIATTR_S2RCTAID_INSTR_OFFSETS"),
    (0x1e, "EIATTR_CRS_STACK_SIZE"),
    (0x1f, "EIATTR_NEED_CNP_WRAPPER"),
    (0x20, "EIATTR_NEED_CNP_PATCH"),
    (0x21, "EIATTR_EXPLICIT_CACHING"),
    (0x22, "EIATTR_ISTYPEP_USED"),
    (0x23, "EIATTR_MAX_STACK_SIZE"),
    (0x24, "EIATTR_SUQ_USED"),
    (0x25, "EIATTR_LD_CACHEMOD_INSTR_OFFSETS"),
    (0x26, "EIATTR_LOAD_CACHE_REQUEST"),
    (0x27, "EIATTR_ATOM_SYS_INSTR_OFFSETS"),
    (0x28, "EIATTR_COOP_GROUP_INSTR_OFFSETS"),
    (0x29, "EIATTR_COOP_GROUP_MASK_REGIDS"),
    (0x2a, "EIATTR_SW1850030_WAR"),
    (0x2b, "EIATTR_WMMA_USED"),
    (0x2c, "EIATTR_HAS_PRE_V10_OBJECT"),
    (0x2d, "EIATTR_ATOMF16_EMUL_INSTR_OFFSETS"),
    (0x2e, "EIATTR_ATOM16_EMUL_INSTR_REG_MAP"),
    (0x2f, "EIATTR_REGCOUNT"),
    (0x30, "EIATTR_SW2393858_WAR"),
    (0x31, "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS"),
    (0x32, "EIATTR_SHARED_SCRATCH"),
    (0x33, "EIATTR_STATISTICS"),
    (0x34, "EIATTR_INDIRECT_BRANCH_TARGETS"),
    (0x35, "EIATTR_SW2861232_WAR"),
    (0x36, "EIATTR_SW_WAR"),
    (0x37, "EIATTR_CUDA_API_VERSION"),
    (0x38, "EIATTR_NUM_MBARRIERS"),
    (0x39, "EIATTR_MBARRIER_INSTR_OFFSETS"),
    (0x3a, "EIATTR_COROUTINE_RESUME_ID_OFFSETS"),
    (0x3b, "EIATTR_SAM_REGION_STACK_SIZE"),
    (0x3c, "EIATTR_PER_REG_TARGET_PERF_STATS"),
    (0x3d, "EIATTR_CTA_PER_CLUSTER"),
    (0x3e, "EIATTR_EXPLICIT_CLUSTER"),
    (0x3f, "EIATTR_MAX_CLUSTER_RANK"),
    (0x40, "EIATTR_INSTR_REG_MAP"),
    (0x41, "EIATTR_RESERVED_SMEM_USED"),
    (0x42, "EIATTR_RESERVED_SMEM_0_SIZE"),
    (0x43, "EIATTR_UCODE_SECTION_DATA"),
    (0x44, "EIATTR_UNUSED_LOAD_BYTE_OFFSET"),
    (0x45, "EIATTR_KPARAM_INFO_V2"),
    (0x46, "EIATTR_SYSCALL_OFFSETS"),
    (0x47, "EIATTR_SW_WAR_MEMBAR_SYS_INSTR_OFFSETS"),
    (0x48, "EIATTR_GRAPHICS_GLOBAL_CBANK"),
    (0x49, "EIATTR_SHADER_TYPE"),
    (0x4a, "EIATTR_VRC_CTA_INIT_COUNT"),
    (0x4b, "EIATTR_TOOLS_PATCH_FUNC"),
    (0x4c, "EIATTR_NUM_BARRIERS"),
    (0x4d, "EIATTR_TEXMODE_INDEPENDENT"),
    (0x4e, "EIATTR_PERF_STATISTICS"),
    (0x4f, "EIATTR_AT_ENTRY_FRAGMENTS"),
    (0x50, "EIATTR_SPARSE_MMA_MASK"),
    (0x51, "EIATTR_TCGEN05_1CTA_USED"),
    (0x52, "EIATTR_TCGEN05_2CTA_USED"),
    (0x53, "EIATTR_GEN_ERRBAR_AT_EXIT"),
    (0x54, "EIATTR_REG_RECONFIG"),
    (0x5f, "EIATTR_MERCURY_ISA_VERSION"),
];

pub const EIATTR_MAX_THREADS: u8 = 0x05;
pub const EIATTR_PARAM_CBANK: u8 = 0x0a;
pub const EIATTR_FRAME_SIZE: u8 = 0x11;
pub const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
pub const EIATTR_KPARAM_INFO: u8 = 0x17;
pub const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
pub const EIATTR_MAXREG_COUNT: u8 = 0x1b;
pub const EIATTR_EXIT_INSTR_OFFSETS: u8 = 0x1c;
pub const EIATTR_CRS_STACK_SIZE: u8 = 0x1e;
pub const EIATTR_REGCOUNT: u8 = 0x2f;
pub const EIATTR_SW_WAR: u8 = 0x36;
pub const EIATTR_CUDA_API_VERSION: u8 = 0x37;
pub const EIATTR_NUM_BARRIERS: u8 = 0x4c;
pub const EIATTR_SPARSE_MMA_MASK: u8 = 0x50;
pub const EIATTR_MERCURY_ISA_VERSION: u8 = 0x5f;

/// The name of attribute `a`, if it is one quench knows.
pub fn attribute_name(a: u8) -> Option<&'static str> {
    ATTRIBUTES.iter().find(|(n, _)| *n == a).map(|(_, s)| *s)
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    None,
    Byte(u8),
    Half(u16),
    Bytes(Vec<u8>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub attr: u8,
    pub value: Value,
}

impl Attr {
    pub fn bytes(attr: u8, data: Vec<u8>) -> Attr {
        Attr {
            attr,
            value: Value::Bytes(data),
        }
    }

    /// A `(symbol index, u32)` record, the shape of REGCOUNT, FRAME_SIZE and the like.
    pub fn sym_u32(attr: u8, sym: u32, v: u32) -> Attr {
        let mut d = sym.to_le_bytes().to_vec();
        d.extend_from_slice(&v.to_le_bytes());
        Attr::bytes(attr, d)
    }

    pub fn name(&self) -> String {
        attribute_name(self.attr)
            .map_or_else(|| format!("EIATTR_{:#04x}", self.attr), str::to_string)
    }

    /// The value bytes of an `EIFMT_SVAL` record.
    pub fn data(&self) -> Option<&[u8]> {
        match &self.value {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The `index`-th little-endian u32 of an `EIFMT_SVAL` record.
    pub fn u32_at(&self, index: usize) -> Option<u32> {
        let b = self.data()?.get(index * 4..index * 4 + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Parses the records of one `.nv.info*` section; `what` names it in errors.
pub fn parse(data: &[u8], what: &str) -> Result<Vec<Attr>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    let len = data.len() as u64;
    while at < len {
        let rec = format!("{what}: record {} at {at:#x}", out.len());
        let r = Reader::new(data, rec.clone());
        let format = r.u8(at)?;
        let attr = r.u8(at + 1)?;
        let value = match format {
            EIFMT_NVAL => {
                at += 4;
                Value::None
            }
            EIFMT_BVAL => {
                let v = r.u8(at + 2)?;
                at += 4;
                Value::Byte(v)
            }
            EIFMT_HVAL => {
                let v = r.u16(at + 2)?;
                at += 4;
                Value::Half(v)
            }
            EIFMT_SVAL => {
                let size = r.u16(at + 2)?;
                let b = r.slice(at + 4, u64::from(size))?.to_vec();
                at += 4 + u64::from(size);
                Value::Bytes(b)
            }
            f => {
                return Err(SassError::malformed(
                    rec,
                    format!("unknown format byte {f:#x}"),
                ))
            }
        };
        out.push(Attr { attr, value });
    }
    Ok(out)
}

/// The bytes of a `.nv.info*` section holding `attrs`.
pub fn write(attrs: &[Attr]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for a in attrs {
        match &a.value {
            Value::None => out.extend_from_slice(&[EIFMT_NVAL, a.attr, 0, 0]),
            Value::Byte(v) => out.extend_from_slice(&[EIFMT_BVAL, a.attr, *v, 0]),
            Value::Half(v) => {
                out.extend_from_slice(&[EIFMT_HVAL, a.attr]);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::Bytes(b) => {
                let size = u16::try_from(b.len()).map_err(|_| {
                    SassError::malformed(a.name(), format!("{} bytes do not fit a record", b.len()))
                })?;
                out.extend_from_slice(&[EIFMT_SVAL, a.attr]);
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    Ok(out)
}

/// One kernel parameter as `EIATTR_KPARAM_INFO` describes it: a u32 index, u16 ordinal,
/// u16 offset, and a u32 with the pointee's log2 alignment in bits 0..8, the pointee's
/// space in bits 8..12, the constant bank in bits 12..18 and the size in bytes in bits
/// 18..32 (the fields cuobjdump prints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KParam {
    pub index: u32,
    pub ordinal: u16,
    /// Offset within the parameter block (which starts at `c[0x0][0x210]` on sm_90).
    pub offset: u16,
    pub size: u32,
    pub log_align: u8,
    pub space: u8,
    pub cbank: u8,
}

impl KParam {
    pub fn parse(a: &Attr) -> Result<KParam> {
        let d = a
            .data()
            .filter(|d| d.len() == 12)
            .ok_or_else(|| SassError::malformed("EIATTR_KPARAM_INFO", "not a 12-byte record"))?;
        let word = u32::from_le_bytes([d[8], d[9], d[10], d[11]]);
        Ok(KParam {
            index: u32::from_le_bytes([d[0], d[1], d[2], d[3]]),
            ordinal: u16::from_le_bytes([d[4], d[5]]),
            offset: u16::from_le_bytes([d[6], d[7]]),
            size: word >> 18,
            log_align: (word & 0xff) as u8,
            space: ((word >> 8) & 0xf) as u8,
            cbank: ((word >> 12) & 0x3f) as u8,
        })
    }

    pub fn record(&self) -> Result<Attr> {
        let bad = |why: String| SassError::malformed("EIATTR_KPARAM_INFO", why);
        if self.size >= 1 << 14 {
            return Err(bad(format!(
                "parameter {} of {} bytes exceeds 16383",
                self.ordinal, self.size
            )));
        }
        if self.space >= 1 << 4 || self.cbank >= 1 << 6 {
            return Err(bad(format!(
                "parameter {}: space {} or bank {} out of range",
                self.ordinal, self.space, self.cbank
            )));
        }
        let word = (self.size << 18)
            | (u32::from(self.cbank) << 12)
            | (u32::from(self.space) << 8)
            | u32::from(self.log_align);
        let mut d = self.index.to_le_bytes().to_vec();
        d.extend_from_slice(&self.ordinal.to_le_bytes());
        d.extend_from_slice(&self.offset.to_le_bytes());
        d.extend_from_slice(&word.to_le_bytes());
        Ok(Attr::bytes(EIATTR_KPARAM_INFO, d))
    }
}
