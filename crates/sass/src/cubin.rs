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

/// What the cubin says about one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
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
    pub kernels: Vec<Kernel>,
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
                        nvinfo::Value::Half(v) => Some(v),
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
            kernels.push(Kernel {
                name: name.to_string(),
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
        })
    }

    /// The bytes of the cubin: byte for byte the file it was parsed from, unless changed.
    pub fn write(&self) -> Result<Vec<u8>> {
        self.elf.write()
    }

    /// The code of `kernel`.
    pub fn text(&self, kernel: &Kernel) -> &[u8] {
        &self.elf.sections[kernel.text_section].data
    }

    /// Replaces the code of the kernel named `name` with `code` of the same length.
    pub fn set_text(&mut self, name: &str, code: Vec<u8>) -> Result<()> {
        let k = self
            .kernels
            .iter()
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
