//! A cubin read as CUDA sees it: symbols, relocations, `.nv.info` records, and per kernel
//! its code, parameters, registers, shared memory and barriers. Built on [`crate::elf`],
//! which keeps the bytes, so [`Cubin::write`] reproduces the file it parsed.

use crate::elf::{self, Elf, Reader, Section};
use crate::error::{Result, SassError};
use crate::nvinfo::{self, Attr, KParam};

pub const STT_NOTYPE: u8 = 0;
pub const STT_OBJECT: u8 = 1;
pub const STT_FUNC: u8 = 2;
pub const STT_SECTION: u8 = 3;
pub const STB_LOCAL: u8 = 0;
pub const STB_GLOBAL: u8 = 1;
pub const STB_WEAK: u8 = 2;
/// `st_other` bit that marks a kernel entry (`STO_CUDA_ENTRY`).
pub const STO_CUDA_ENTRY: u8 = 0x10;
const SYM_SIZE: u64 = 24;
const RELA_SIZE: u64 = 24;
const REL_SIZE: u64 = 16;

/// Relocation types (`ELF64_R_TYPE`) met in sm_90 cubins, with the names cuobjdump prints.
pub const R_CUDA_64: u32 = 0x02;
pub const R_CUDA_ABS32_32: u32 = 0x37;
/// The low 32 bits of an address into the 32-bit immediate at bit 32 (a `MOV`'s operand).
pub const R_CUDA_ABS32_LO_32: u32 = 0x38;
/// The high 32 bits of an address into the 32-bit immediate at bit 32.
pub const R_CUDA_ABS32_HI_32: u32 = 0x39;
pub const R_CUDA_UNUSED_CLEAR64: u32 = 0x49;
/// The absolute target of a `CALL.ABS`.
pub const R_CUDA_ABS55_16_34: u32 = 0x4b;
pub const RELOCATIONS: &[(u32, &str)] = &[
    (R_CUDA_64, "R_CUDA_64"),
    (R_CUDA_ABS32_32, "R_CUDA_ABS32_32"),
    (R_CUDA_ABS32_LO_32, "R_CUDA_ABS32_LO_32"),
    (R_CUDA_ABS32_HI_32, "R_CUDA_ABS32_HI_32"),
    (R_CUDA_UNUSED_CLEAR64, "R_CUDA_UNUSED_CLEAR64"),
    (R_CUDA_ABS55_16_34, "R_CUDA_ABS55_16_34"),
];

/// The name of relocation type `t`, if it is one quench knows.
pub fn reloc_name(t: u32) -> Option<&'static str> {
    RELOCATIONS.iter().find(|(n, _)| *n == t).map(|(_, s)| *s)
}

/// The relocation type named `name` (`R_CUDA_…`, or a number such as `0x4b`).
pub fn reloc_type(name: &str) -> Option<u32> {
    if let Some(hex) = name.strip_prefix("0x") {
        return u32::from_str_radix(hex, 16).ok();
    }
    RELOCATIONS
        .iter()
        .find(|(_, s)| *s == name)
        .map(|(n, _)| *n)
}

/// The sm_90 constant bank 0 holds the launch state below this offset; parameters follow.
pub const PARAM_BASE: u32 = 0x210;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub name_offset: u32,
    pub info: u8,
    pub other: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

impl Symbol {
    pub fn kind(&self) -> u8 {
        self.info & 0xf
    }
    pub fn binding(&self) -> u8 {
        self.info >> 4
    }
}

/// One relocation (`.rela.*` has an addend, `.rel.*` none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloc {
    pub offset: u64,
    pub sym: u32,
    pub r_type: u32,
    pub addend: i64,
}

/// What the cubin says about one function with a code section of its own: a kernel (an
/// entry, `STO_CUDA_ENTRY`) or a device function that code calls, such as the slow paths
/// of division and square root the JIT links in (`.text.__cuda_sm20_rcp_rn_f32_slowpath`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    /// A kernel entry (its symbol carries `STO_CUDA_ENTRY`), not a device function.
    pub entry: bool,
    /// Index of `.text.<name>`.
    pub text_section: usize,
    pub symbol: usize,
    pub registers: Option<u32>,
    pub frame_size: Option<u32>,
    /// Parameters in ordinal order.
    pub params: Vec<KParam>,
    /// Size of the parameter block (EIATTR_CBANK_PARAM_SIZE).
    pub param_bytes: Option<u16>,
    pub shared_bytes: u64,
    pub barriers: Option<u16>,
    pub exit_offsets: Vec<u32>,
    /// `.nv.info.<name>` records.
    pub info: Vec<Attr>,
    pub relocs: Vec<Reloc>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cubin {
    pub elf: Elf,
    pub symbols: Vec<Symbol>,
    /// `.nv.info` records (per-kernel register counts, frame and stack sizes).
    pub info: Vec<Attr>,
    /// The kernel entries, in section order.
    pub kernels: Vec<Kernel>,
    /// The device functions with a code section of their own (what a linker such as the
    /// driver's JIT makes of the subroutines ptxas would put inside the kernel's code), in
    /// section order.
    pub functions: Vec<Kernel>,
}

/// Parses a symbol table section whose names are in `strtab`.
pub fn parse_symbols(s: &Section, strtab: &[u8]) -> Result<Vec<Symbol>> {
    let what = format!("section {}", s.name);
    if !(s.data.len() as u64).is_multiple_of(SYM_SIZE) {
        return Err(SassError::malformed(
            what,
            format!(
                "{} bytes is not a whole number of 24-byte symbols",
                s.data.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for i in 0..s.data.len() as u64 / SYM_SIZE {
        let r = Reader::new(&s.data, format!("{what}: symbol {i}"));
        let at = i * SYM_SIZE;
        let name_offset = r.u32(at)?;
        out.push(Symbol {
            name: elf::string_at(strtab, name_offset, &format!("{what}: name of symbol {i}"))?,
            name_offset,
            info: r.u8(at + 4)?,
            other: r.u8(at + 5)?,
            shndx: r.u16(at + 6)?,
            value: r.u64(at + 8)?,
            size: r.u64(at + 16)?,
        });
    }
    Ok(out)
}

/// Writes symbols in the table layout (names must already be in the string table).
pub fn write_symbols(syms: &[Symbol]) -> Vec<u8> {
    let mut out = Vec::with_capacity(syms.len() * SYM_SIZE as usize);
    for s in syms {
        out.extend_from_slice(&s.name_offset.to_le_bytes());
        out.push(s.info);
        out.push(s.other);
        out.extend_from_slice(&s.shndx.to_le_bytes());
        out.extend_from_slice(&s.value.to_le_bytes());
        out.extend_from_slice(&s.size.to_le_bytes());
    }
    out
}

/// Writes relocations in the `SHT_RELA` layout: offset, `(symbol << 32) | type`, addend.
pub fn write_relocs(relocs: &[Reloc]) -> Vec<u8> {
    let mut out = Vec::with_capacity(relocs.len() * RELA_SIZE as usize);
    for r in relocs {
        out.extend_from_slice(&r.offset.to_le_bytes());
        out.extend_from_slice(&((u64::from(r.sym) << 32) | u64::from(r.r_type)).to_le_bytes());
        out.extend_from_slice(&r.addend.to_le_bytes());
    }
    out
}

/// Parses a `SHT_RELA` or `SHT_REL` section.
pub fn parse_relocs(s: &Section) -> Result<Vec<Reloc>> {
    let what = format!("section {}", s.name);
    let size = if s.sh_type == elf::SHT_RELA {
        RELA_SIZE
    } else {
        REL_SIZE
    };
    if !(s.data.len() as u64).is_multiple_of(size) {
        return Err(SassError::malformed(
            what,
            format!(
                "{} bytes is not a whole number of {size}-byte relocations",
                s.data.len()
            ),
        ));
    }
    let mut out = Vec::new();
    for i in 0..s.data.len() as u64 / size {
        let r = Reader::new(&s.data, format!("{what}: relocation {i}"));
        let at = i * size;
        let info = r.u64(at + 8)?;
        out.push(Reloc {
            offset: r.u64(at)?,
            sym: (info >> 32) as u32,
            r_type: info as u32,
            addend: if size == RELA_SIZE {
                r.u64(at + 16)? as i64
            } else {
                0
            },
        });
    }
    Ok(out)
}

impl Cubin {
    pub fn parse(bytes: &[u8]) -> Result<Cubin> {
        let elf = Elf::parse(bytes)?;
        if elf.machine != 190 {
            return Err(SassError::malformed(
                "ELF header",
                format!("machine {} is not CUDA (190)", elf.machine),
            ));
        }
        let mut symbols = Vec::new();
        if let Some((_, symtab)) = elf
            .sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.sh_type == elf::SHT_SYMTAB)
        {
            let strtab = elf.sections.get(symtab.link as usize).ok_or_else(|| {
                SassError::malformed(
                    "section .symtab",
                    format!("links to section {}, which does not exist", symtab.link),
                )
            })?;
            symbols = parse_symbols(symtab, &strtab.data)?;
        }
        let info = match elf.section(".nv.info") {
            Some((_, s)) => nvinfo::parse(&s.data, ".nv.info")?,
            None => Vec::new(),
        };
        let mut kernels = Vec::new();
        let mut functions = Vec::new();
        for (idx, s) in elf.sections.iter().enumerate() {
            let Some(name) = s.name.strip_prefix(".text.") else {
                continue;
            };
            let symbol = symbols
                .iter()
                .position(|y| y.name == name && y.kind() == STT_FUNC)
                .ok_or_else(|| {
                    SassError::malformed(
                        format!("section {}", s.name),
                        "no function symbol names it",
                    )
                })?;
            let per_kernel = |attr: u8| {
                info.iter()
                    .filter(|a| a.attr == attr && a.u32_at(0) == Some(symbol as u32))
                    .find_map(|a| a.u32_at(1))
            };
            let info_name = format!(".nv.info.{name}");
            let kinfo = match elf.section(&info_name) {
                Some((_, s)) => nvinfo::parse(&s.data, &info_name)?,
                None => Vec::new(),
            };
            let mut params = kinfo
                .iter()
                .filter(|a| a.attr == nvinfo::EIATTR_KPARAM_INFO)
                .map(KParam::parse)
                .collect::<Result<Vec<_>>>()?;
            params.sort_by_key(|p| p.ordinal);
            let half = |attr: u8| {
                kinfo
                    .iter()
                    .find(|a| a.attr == attr)
                    .and_then(|a| match a.value {
                        // ptxas writes some small counts (EIATTR_NUM_BARRIERS) as a byte.
                        nvinfo::Value::Half(v) => Some(v),
                        nvinfo::Value::Byte(v) => Some(u16::from(v)),
                        _ => None,
                    })
            };
            let exit_offsets = kinfo
                .iter()
                .find(|a| a.attr == nvinfo::EIATTR_EXIT_INSTR_OFFSETS)
                .and_then(Attr::data)
                .map(|d| {
                    d.chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                })
                .unwrap_or_default();
            let shared_bytes = elf
                .section(&format!(".nv.shared.{name}"))
                .map_or(0, |(_, s)| s.size);
            let relocs = match elf
                .section(&format!(".rela.text.{name}"))
                .or_else(|| elf.section(&format!(".rel.text.{name}")))
            {
                Some((_, s)) => parse_relocs(s)?,
                None => Vec::new(),
            };
            let entry = symbols[symbol].other & STO_CUDA_ENTRY != 0;
            let list = if entry { &mut kernels } else { &mut functions };
            list.push(Kernel {
                name: name.to_string(),
                entry,
                text_section: idx,
                symbol,
                registers: per_kernel(nvinfo::EIATTR_REGCOUNT),
                frame_size: per_kernel(nvinfo::EIATTR_FRAME_SIZE),
                params,
                param_bytes: half(nvinfo::EIATTR_CBANK_PARAM_SIZE),
                shared_bytes,
                barriers: half(nvinfo::EIATTR_NUM_BARRIERS),
                exit_offsets,
                info: kinfo,
                relocs,
            });
        }
        Ok(Cubin {
            elf,
            symbols,
            info,
            kernels,
            functions,
        })
    }

    /// The bytes of the cubin: byte for byte the file it was parsed from, unless changed.
    pub fn write(&self) -> Result<Vec<u8>> {
        self.elf.write()
    }

    /// The code of `kernel` (a kernel or a device function).
    pub fn text(&self, kernel: &Kernel) -> &[u8] {
        &self.elf.sections[kernel.text_section].data
    }

    /// Every function with a code section, kernels and device functions, in section order
    /// (the order of their code in the file and in nvdisasm's listing).
    pub fn code_functions(&self) -> Vec<&Kernel> {
        let mut all: Vec<&Kernel> = self.kernels.iter().chain(&self.functions).collect();
        all.sort_by_key(|k| k.text_section);
        all
    }

    /// Replaces the code of the kernel or function named `name` with `code` of the same
    /// length.
    pub fn set_text(&mut self, name: &str, code: Vec<u8>) -> Result<()> {
        let k = self
            .kernels
            .iter()
            .chain(&self.functions)
            .find(|k| k.name == name)
            .ok_or_else(|| SassError::malformed("cubin", format!("no kernel {name}")))?;
        let s = &mut self.elf.sections[k.text_section];
        if s.data.len() != code.len() {
            return Err(SassError::malformed(
                format!("section {}", s.name),
                format!(
                    "new code is {} bytes, the section {}",
                    code.len(),
                    s.data.len()
                ),
            ));
        }
        s.data = code;
        Ok(())
    }
}
