//! ELF64 little-endian, as NVIDIA's cubins use it: the file header, section headers with
//! their contents, and program headers. Reading checks every offset and size against the
//! file (with overflow-checked arithmetic) and names the part that is wrong; writing puts
//! each part back at the offset it describes, so a parsed file writes back byte for byte.

use crate::error::{Result, SassError};

pub const SHT_NULL: u32 = 0;
pub const SHT_PROGBITS: u32 = 1;
pub const SHT_SYMTAB: u32 = 2;
pub const SHT_STRTAB: u32 = 3;
pub const SHT_RELA: u32 = 4;
pub const SHT_NOTE: u32 = 7;
pub const SHT_NOBITS: u32 = 8;
pub const SHT_REL: u32 = 9;
/// NVIDIA's `SHT_CUDA_INFO` (`.nv.info*`).
pub const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// NVIDIA's `SHT_CUDA_CALLGRAPH` (`.nv.callgraph`).
pub const SHT_CUDA_CALLGRAPH: u32 = 0x7000_0001;
/// `.nv.compat`.
pub const SHT_CUDA_COMPAT: u32 = 0x7000_0086;

pub const SHF_WRITE: u64 = 0x1;
pub const SHF_ALLOC: u64 = 0x2;
pub const SHF_EXECINSTR: u64 = 0x4;
pub const SHF_INFO_LINK: u64 = 0x40;

pub const EHDR_SIZE: usize = 64;
pub const SHDR_SIZE: usize = 64;
pub const PHDR_SIZE: usize = 56;

/// One section: its header fields and, unless it is `SHT_NOBITS`, its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    /// Offset of the name in the section-name string table.
    pub name_offset: u32,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    /// The size the header declares (for `SHT_NOBITS`, memory that has no file bytes).
    pub size: u64,
    pub link: u32,
    pub info: u32,
    pub align: u64,
    pub entsize: u64,
    pub data: Vec<u8>,
}

/// One program header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub p_type: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub paddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

/// A whole ELF64 file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Elf {
    /// `e_ident`: magic, class, data, version, OS ABI (0x41 for CUDA), ABI version.
    pub ident: [u8; 16],
    pub e_type: u16,
    pub machine: u16,
    pub version: u32,
    pub entry: u64,
    pub phoff: u64,
    pub shoff: u64,
    pub flags: u32,
    pub shstrndx: u16,
    pub sections: Vec<Section>,
    pub segments: Vec<Segment>,
}

/// Bounds-checked little-endian reads from a byte slice; `what` names the part being read.
pub(crate) struct Reader<'a> {
    pub bytes: &'a [u8],
    pub what: String,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: impl Into<String>) -> Reader<'a> {
        Reader {
            bytes,
            what: what.into(),
        }
    }

    pub fn slice(&self, at: u64, len: u64) -> Result<&'a [u8]> {
        let end = at.checked_add(len).ok_or_else(|| {
            SassError::malformed(
                &self.what,
                format!("offset {at:#x} + size {len:#x} overflows"),
            )
        })?;
        if end > self.bytes.len() as u64 {
            return Err(SassError::malformed(
                &self.what,
                format!(
                    "truncated: needs bytes {at:#x}..{end:#x}, has {:#x}",
                    self.bytes.len()
                ),
            ));
        }
        // `end` fits in the slice's length, so both convert to usize.
        Ok(&self.bytes[at as usize..end as usize])
    }

    pub fn u8(&self, at: u64) -> Result<u8> {
        Ok(self.slice(at, 1)?[0])
    }

    pub fn u16(&self, at: u64) -> Result<u16> {
        let b = self.slice(at, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&self, at: u64) -> Result<u32> {
        let b = self.slice(at, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&self, at: u64) -> Result<u64> {
        let b = self.slice(at, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// The NUL-terminated string at `offset` of a string table.
pub(crate) fn string_at(table: &[u8], offset: u32, what: &str) -> Result<String> {
    let start = offset as usize;
    let rest = table.get(start..).ok_or_else(|| {
        SassError::malformed(
            what,
            format!(
                "name offset {offset:#x} is past the string table's {:#x} bytes",
                table.len()
            ),
        )
    })?;
    let len = rest.iter().position(|&b| b == 0).ok_or_else(|| {
        SassError::malformed(
            what,
            format!("the name at {offset:#x} has no terminating NUL"),
        )
    })?;
    String::from_utf8(rest[..len].to_vec())
        .map_err(|_| SassError::malformed(what, format!("the name at {offset:#x} is not UTF-8")))
}

impl Elf {
    /// Parses an ELF64 little-endian file.
    pub fn parse(bytes: &[u8]) -> Result<Elf> {
        let r = Reader::new(bytes, "ELF header");
        let id = r.slice(0, 16)?;
        if &id[..4] != b"\x7fELF" {
            return Err(SassError::malformed(
                "ELF header",
                "no ELF magic (not a cubin)",
            ));
        }
        if id[4] != 2 || id[5] != 1 {
            return Err(SassError::malformed(
                "ELF header",
                format!(
                    "class {} data {}: only 64-bit little-endian ELF is a cubin",
                    id[4], id[5]
                ),
            ));
        }
        let mut ident = [0u8; 16];
        ident.copy_from_slice(id);
        let phentsize = r.u16(54)?;
        let phnum = r.u16(56)?;
        let shentsize = r.u16(58)?;
        let shnum = r.u16(60)?;
        let ehsize = r.u16(52)?;
        if ehsize as usize != EHDR_SIZE {
            return Err(SassError::malformed(
                "ELF header",
                format!("e_ehsize {ehsize}, not 64"),
            ));
        }
        if shnum > 0 && shentsize as usize != SHDR_SIZE {
            return Err(SassError::malformed(
                "ELF header",
                format!("e_shentsize {shentsize}, not 64"),
            ));
        }
        if phnum > 0 && phentsize as usize != PHDR_SIZE {
            return Err(SassError::malformed(
                "ELF header",
                format!("e_phentsize {phentsize}, not 56"),
            ));
        }
        let mut elf = Elf {
            ident,
            e_type: r.u16(16)?,
            machine: r.u16(18)?,
            version: r.u32(20)?,
            entry: r.u64(24)?,
            phoff: r.u64(32)?,
            shoff: r.u64(40)?,
            flags: r.u32(48)?,
            shstrndx: r.u16(62)?,
            sections: Vec::new(),
            segments: Vec::new(),
        };

        let file = Reader::new(bytes, "section header table");
        file.slice(elf.shoff, u64::from(shnum) * SHDR_SIZE as u64)?;
        let mut raw = Vec::with_capacity(shnum as usize);
        for i in 0..u64::from(shnum) {
            let at = elf.shoff + i * SHDR_SIZE as u64;
            let h = Reader::new(bytes, format!("section header {i}"));
            let s = Section {
                name: String::new(),
                name_offset: h.u32(at)?,
                sh_type: h.u32(at + 4)?,
                flags: h.u64(at + 8)?,
                addr: h.u64(at + 16)?,
                offset: h.u64(at + 24)?,
                size: h.u64(at + 32)?,
                link: h.u32(at + 40)?,
                info: h.u32(at + 44)?,
                align: h.u64(at + 48)?,
                entsize: h.u64(at + 56)?,
                data: Vec::new(),
            };
            raw.push(s);
        }
        for (i, s) in raw.iter_mut().enumerate() {
            if s.sh_type != SHT_NOBITS && s.sh_type != SHT_NULL && s.size > 0 {
                let d = Reader::new(bytes, format!("section {i} contents"));
                s.data = d.slice(s.offset, s.size)?.to_vec();
            }
        }
        if shnum > 0 {
            let names = raw.get(elf.shstrndx as usize).ok_or_else(|| {
                SassError::malformed(
                    "ELF header",
                    format!("e_shstrndx {} is not one of {shnum} sections", elf.shstrndx),
                )
            })?;
            let table = names.data.clone();
            for (i, s) in raw.iter_mut().enumerate() {
                s.name = string_at(&table, s.name_offset, &format!("name of section {i}"))?;
            }
        }
        elf.sections = raw;

        let ph = Reader::new(bytes, "program header table");
        ph.slice(elf.phoff, u64::from(phnum) * PHDR_SIZE as u64)?;
        for i in 0..u64::from(phnum) {
            let at = elf.phoff + i * PHDR_SIZE as u64;
            elf.segments.push(Segment {
                p_type: ph.u32(at)?,
                flags: ph.u32(at + 4)?,
                offset: ph.u64(at + 8)?,
                vaddr: ph.u64(at + 16)?,
                paddr: ph.u64(at + 24)?,
                filesz: ph.u64(at + 32)?,
                memsz: ph.u64(at + 40)?,
                align: ph.u64(at + 48)?,
            });
        }
        Ok(elf)
    }

    /// The section named `name`, with its index.
    pub fn section(&self, name: &str) -> Option<(usize, &Section)> {
        self.sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
    }

    /// Writes the file: the header, each section's bytes at its offset, the section and
    /// program header tables at theirs; gaps are zeros. Fails, naming the parts, when two
    /// of them overlap or a section's bytes disagree with its declared size.
    pub fn write(&self) -> Result<Vec<u8>> {
        let too_many = |what: &str| SassError::malformed("ELF writer", format!("too many {what}"));
        let shnum = u16::try_from(self.sections.len()).map_err(|_| too_many("sections"))?;
        let phnum = u16::try_from(self.segments.len()).map_err(|_| too_many("segments"))?;
        // (start, end, what) of every part, to check that none overlaps another.
        let mut parts: Vec<(u64, u64, String)> = vec![(0, EHDR_SIZE as u64, "ELF header".into())];
        let span = |at: u64, len: u64, what: &str| {
            at.checked_add(len).ok_or_else(|| {
                SassError::malformed(what, format!("offset {at:#x} + size {len:#x} overflows"))
            })
        };
        if shnum > 0 {
            let len = u64::from(shnum) * SHDR_SIZE as u64;
            parts.push((
                self.shoff,
                span(self.shoff, len, "section headers")?,
                "section headers".into(),
            ));
        }
        if phnum > 0 {
            let len = u64::from(phnum) * PHDR_SIZE as u64;
            parts.push((
                self.phoff,
                span(self.phoff, len, "program headers")?,
                "program headers".into(),
            ));
        }
        for s in &self.sections {
            let what = format!("section {}", s.name);
            if s.sh_type == SHT_NOBITS || s.sh_type == SHT_NULL {
                continue;
            }
            if s.data.len() as u64 != s.size {
                return Err(SassError::malformed(
                    what,
                    format!("declares {} bytes but holds {}", s.size, s.data.len()),
                ));
            }
            if s.size > 0 {
                parts.push((s.offset, span(s.offset, s.size, &what)?, what));
            }
        }
        parts.sort();
        for w in parts.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(SassError::malformed(
                    "ELF writer",
                    format!("{} overlaps {}", w[1].2, w[0].2),
                ));
            }
        }
        let total = parts.iter().map(|p| p.1).max().unwrap_or(EHDR_SIZE as u64);
        let total = usize::try_from(total)
            .map_err(|_| SassError::malformed("ELF writer", "the file is too large"))?;
        let mut out = vec![0u8; total];
        let put = |out: &mut Vec<u8>, at: u64, b: &[u8]| {
            // Every part with bytes was bounded by `total` above; an empty one (a section
            // of size 0) may lie anywhere and writes nothing.
            if b.is_empty() {
                return;
            }
            let at = at as usize;
            out[at..at + b.len()].copy_from_slice(b);
        };

        let mut h = Vec::with_capacity(EHDR_SIZE);
        h.extend_from_slice(&self.ident);
        h.extend_from_slice(&self.e_type.to_le_bytes());
        h.extend_from_slice(&self.machine.to_le_bytes());
        h.extend_from_slice(&self.version.to_le_bytes());
        h.extend_from_slice(&self.entry.to_le_bytes());
        h.extend_from_slice(&self.phoff.to_le_bytes());
        h.extend_from_slice(&self.shoff.to_le_bytes());
        h.extend_from_slice(&self.flags.to_le_bytes());
        h.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        h.extend_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        h.extend_from_slice(&phnum.to_le_bytes());
        h.extend_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
        h.extend_from_slice(&shnum.to_le_bytes());
        h.extend_from_slice(&self.shstrndx.to_le_bytes());
        put(&mut out, 0, &h);

        for (i, s) in self.sections.iter().enumerate() {
            let mut b = Vec::with_capacity(SHDR_SIZE);
            b.extend_from_slice(&s.name_offset.to_le_bytes());
            b.extend_from_slice(&s.sh_type.to_le_bytes());
            b.extend_from_slice(&s.flags.to_le_bytes());
            b.extend_from_slice(&s.addr.to_le_bytes());
            b.extend_from_slice(&s.offset.to_le_bytes());
            b.extend_from_slice(&s.size.to_le_bytes());
            b.extend_from_slice(&s.link.to_le_bytes());
            b.extend_from_slice(&s.info.to_le_bytes());
            b.extend_from_slice(&s.align.to_le_bytes());
            b.extend_from_slice(&s.entsize.to_le_bytes());
            put(&mut out, self.shoff + (i * SHDR_SIZE) as u64, &b);
            if s.sh_type != SHT_NOBITS && s.sh_type != SHT_NULL {
                put(&mut out, s.offset, &s.data);
            }
        }
        for (i, p) in self.segments.iter().enumerate() {
            let mut b = Vec::with_capacity(PHDR_SIZE);
            b.extend_from_slice(&p.p_type.to_le_bytes());
            b.extend_from_slice(&p.flags.to_le_bytes());
            b.extend_from_slice(&p.offset.to_le_bytes());
            b.extend_from_slice(&p.vaddr.to_le_bytes());
            b.extend_from_slice(&p.paddr.to_le_bytes());
            b.extend_from_slice(&p.filesz.to_le_bytes());
            b.extend_from_slice(&p.memsz.to_le_bytes());
            b.extend_from_slice(&p.align.to_le_bytes());
            put(&mut out, self.phoff + (i * PHDR_SIZE) as u64, &b);
        }
        Ok(out)
    }
}
