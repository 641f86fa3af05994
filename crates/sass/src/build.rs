//! A cubin for one kernel from its code and ABI, laid out as ptxas lays out its own:
//! string tables, symbols, `.nv.compat`, the `.note.nv.tkinfo` and `.note.nv.cuinfo`
//! notes (at ptxas's indices 5 and 6), `.nv.info` (register count, frame and stack sizes),
//! `.nv.info.<kernel>` (parameters, exit offsets, barriers, parameter bank),
//! `.text.<kernel>`, `.nv.shared.<kernel>` when it uses shared memory, and
//! `.nv.constant0.<kernel>`, with the five program headers ptxas writes.

use crate::cubin::{
    self, Symbol, PARAM_BASE, STB_GLOBAL, STB_LOCAL, STO_CUDA_ENTRY, STT_FUNC, STT_SECTION,
};
use crate::elf::{self, Elf, Section, Segment};
use crate::error::{Result, SassError};
use crate::nvinfo::{self, Attr, KParam, Value};

/// `e_flags` of an sm_90 cubin as ptxas 13.0 writes it: the SM (0x5a = 90) in bits 0..8
/// shifted by 8, the virtual SM in bits 16..24, the 64-bit address flag (0x4), and the
/// ELF layout version in the top byte.
pub const SM90_EFLAGS: u32 = 0x0600_5a04;
/// `e_ident` with OS ABI 0x41 (CUDA) and ABI version 8.
pub const SM90_IDENT: [u8; 16] = [
    0x7f, b'E', b'L', b'F', 2, 1, 1, 0x41, 8, 0, 0, 0, 0, 0, 0, 0,
];

/// A kernel parameter: its size and the alignment of its offset in the parameter block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub size: u32,
    pub align: u32,
    /// Pointee log2 alignment and space as KPARAM_INFO records them (0, 0 for a scalar).
    pub pointee_log_align: u8,
    pub pointee_space: u8,
}

impl Param {
    pub fn scalar(size: u32) -> Param {
        Param {
            size,
            align: size,
            pointee_log_align: 0,
            pointee_space: 0,
        }
    }
    pub fn pointer() -> Param {
        Param {
            size: 8,
            align: 8,
            pointee_log_align: 0,
            pointee_space: 0,
        }
    }
}

/// Everything needed to write a cubin for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDesc {
    pub name: String,
    /// The code: whole 16-byte instructions.
    pub text: Vec<u8>,
    pub params: Vec<Param>,
    pub registers: u32,
    pub shared_bytes: u64,
    pub barriers: u16,
    /// Byte offsets of the EXIT instructions in `text`.
    pub exit_offsets: Vec<u32>,
    /// `(x, y, z)` of `.maxntid`, if the kernel declares one.
    pub max_threads: Option<[u32; 3]>,
    /// Subroutines inside the code (ptxas's slow paths of division and square root):
    /// name, offset and size, written as local function symbols.
    pub subroutines: Vec<(String, u64, u64)>,
}

impl KernelDesc {
    /// The description of a kernel of a parsed cubin (parameters from KPARAM_INFO).
    pub fn from_cubin(c: &cubin::Cubin, k: &cubin::Kernel) -> Result<KernelDesc> {
        let max_threads = k
            .info
            .iter()
            .find(|a| a.attr == nvinfo::EIATTR_MAX_THREADS)
            .and_then(|a| Some([a.u32_at(0)?, a.u32_at(1)?, a.u32_at(2)?]));
        Ok(KernelDesc {
            name: k.name.clone(),
            text: c.text(k).to_vec(),
            params: k
                .params
                .iter()
                .map(|p| Param {
                    size: p.size,
                    align: p.size.clamp(1, 8),
                    pointee_log_align: p.log_align,
                    pointee_space: p.space,
                })
                .collect(),
            registers: k.registers.ok_or_else(|| {
                SassError::malformed(format!("kernel {}", k.name), "no EIATTR_REGCOUNT")
            })?,
            shared_bytes: k.shared_bytes,
            barriers: k.barriers.unwrap_or(0),
            exit_offsets: k.exit_offsets.clone(),
            max_threads,
            subroutines: c
                .symbols
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    *i != k.symbol && s.kind() == STT_FUNC && usize::from(s.shndx) == k.text_section
                })
                .map(|(_, s)| (s.name.clone(), s.value, s.size))
                .collect(),
        })
    }
}

/// The `.nv.compat` records ptxas 13.0 writes for an sm_90 kernel (cuobjdump refuses a
/// cubin without them): accelerator target 0, ISA class 1, and the rest as ptxas sets them.
const SM90_COMPAT: [u8; 36] = [
    0x02, 0x09, 0x00, 0x00, 0x02, 0x02, 0x01, 0x00, 0x02, 0x05, 0x05, 0x00, 0x03, 0x07, 0x01, 0x01,
    0x02, 0x03, 0x00, 0x00, 0x02, 0x06, 0x01, 0x00, 0x04, 0x0b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
];

/// An ELF note of owner "NVIDIA Corp": name and descriptor sizes, `kind`, the name, then
/// `desc` (whole 4-byte words).
fn nvidia_note(kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&12u32.to_le_bytes());
    d.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    d.extend_from_slice(&kind.to_le_bytes());
    d.extend_from_slice(b"NVIDIA Corp\0");
    d.extend_from_slice(desc);
    d
}

/// `.note.nv.cuinfo`: a note of type 1000 whose descriptor is the note version (2), the
/// virtual SM (90) and the toolkit version (130 for 13.0).
fn cuinfo_note() -> Section {
    let desc: Vec<u8> = [2u16, 90, 130, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let d = nvidia_note(1000, &desc);
    section(".note.nv.cuinfo", elf::SHT_NOTE, 0x100_0040, d, 4)
}

/// `.note.nv.tkinfo`: a note of type 2000 naming the tool that wrote the file. Its
/// descriptor, as ptxas writes it: version 2, a zero word, then the offsets of four
/// strings (tool, tool version, build, options) in the string block that follows, which
/// starts with an empty string.
fn tkinfo_note() -> Section {
    let strings = [
        "quench",
        concat!("quench ", env!("CARGO_PKG_VERSION")),
        "",
        "",
    ];
    let mut block = vec![0u8];
    let mut offsets = Vec::new();
    for s in strings {
        offsets.push(block.len() as u32);
        block.extend_from_slice(s.as_bytes());
        block.push(0);
    }
    while block.len() % 4 != 0 {
        block.push(0);
    }
    let mut desc = Vec::new();
    for v in [2u32, 0].into_iter().chain(offsets) {
        desc.extend_from_slice(&v.to_le_bytes());
    }
    desc.extend_from_slice(&block);
    section(
        ".note.nv.tkinfo",
        elf::SHT_NOTE,
        0x200_0000,
        nvidia_note(2000, &desc),
        4,
    )
}

/// A growing string table.
struct Strtab(Vec<u8>);

impl Strtab {
    fn new() -> Strtab {
        Strtab(vec![0])
    }
    fn add(&mut self, s: &str) -> u32 {
        let at = self.0.len() as u32;
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        at
    }
}

fn align_up(v: u64, a: u64, what: &str) -> Result<u64> {
    let a = a.max(1);
    v.checked_add(a - 1)
        .map(|x| x / a * a)
        .ok_or_else(|| SassError::malformed(what, "offset overflows"))
}

fn section(name: &str, sh_type: u32, flags: u64, data: Vec<u8>, align: u64) -> Section {
    Section {
        name: name.into(),
        name_offset: 0,
        sh_type,
        flags,
        addr: 0,
        offset: 0,
        size: data.len() as u64,
        link: 0,
        info: 0,
        align,
        entsize: 0,
        data,
    }
}

/// Writes the cubin of `k`.
pub fn build(k: &KernelDesc) -> Result<Vec<u8>> {
    let what = format!("kernel {}", k.name);
    if k.text.is_empty() || !k.text.len().is_multiple_of(16) {
        return Err(SassError::malformed(
            &what,
            format!(
                "code of {} bytes is not whole 16-byte instructions",
                k.text.len()
            ),
        ));
    }
    if k.registers > 255 {
        return Err(SassError::malformed(
            &what,
            format!("{} registers exceed 255", k.registers),
        ));
    }
    // Parameter offsets: each aligned to its own alignment.
    let mut kparams = Vec::new();
    let mut off = 0u64;
    for (i, p) in k.params.iter().enumerate() {
        if !p.align.is_power_of_two() {
            return Err(SassError::malformed(
                &what,
                format!("parameter {i}: alignment {} is not a power of two", p.align),
            ));
        }
        off = align_up(off, u64::from(p.align), &what)?;
        let ordinal =
            u16::try_from(i).map_err(|_| SassError::malformed(&what, "too many parameters"))?;
        let offset = u16::try_from(off)
            .map_err(|_| SassError::malformed(&what, "parameters exceed 64 KiB"))?;
        kparams.push(KParam {
            index: 0,
            ordinal,
            offset,
            size: p.size,
            log_align: p.pointee_log_align,
            space: p.pointee_space,
            cbank: 0x1f,
        });
        off = off
            .checked_add(u64::from(p.size))
            .ok_or_else(|| SassError::malformed(&what, "parameter block overflows"))?;
    }
    let param_bytes =
        u16::try_from(off).map_err(|_| SassError::malformed(&what, "parameters exceed 64 KiB"))?;

    // Section indices, fixed up front because records and symbols refer to them.
    let has_shared = k.shared_bytes > 0;
    let (shstrtab, strtab, symtab, text) = (1usize, 2usize, 3usize, 10usize);
    let shared = has_shared.then_some(11usize);
    let constant0 = if has_shared { 12usize } else { 11 };
    // Symbols: the null symbol, a section symbol for the text and constant sections, then
    // the kernel (globals after locals, as ELF requires).
    let mut strs = Strtab::new();
    let mut syms = vec![Symbol {
        name: String::new(),
        name_offset: 0,
        info: 0,
        other: 0,
        shndx: 0,
        value: 0,
        size: 0,
    }];
    let text_name = format!(".text.{}", k.name);
    let const_name = format!(".nv.constant0.{}", k.name);
    for (name, idx) in [(&text_name, text), (&const_name, constant0)] {
        syms.push(Symbol {
            name: name.clone(),
            name_offset: strs.add(name),
            info: (STB_LOCAL << 4) | STT_SECTION,
            other: 0,
            shndx: idx as u16,
            value: 0,
            size: 0,
        });
    }
    for (name, value, size) in &k.subroutines {
        let end = value.checked_add(*size);
        if end.is_none_or(|e| e > k.text.len() as u64) {
            return Err(SassError::malformed(
                &what,
                format!("subroutine {name} at {value:#x} (+{size:#x}) is outside the code"),
            ));
        }
        syms.push(Symbol {
            name: name.clone(),
            name_offset: strs.add(name),
            info: (STB_LOCAL << 4) | STT_FUNC,
            other: 0,
            shndx: text as u16,
            value: *value,
            size: *size,
        });
    }
    let first_global = syms.len() as u32;
    let kernel_sym = syms.len() as u32;
    syms.push(Symbol {
        name: k.name.clone(),
        name_offset: strs.add(&k.name),
        info: (STB_GLOBAL << 4) | STT_FUNC,
        other: STO_CUDA_ENTRY,
        shndx: text as u16,
        value: 0,
        size: k.text.len() as u64,
    });

    let global_info = vec![
        Attr::sym_u32(nvinfo::EIATTR_REGCOUNT, kernel_sym, k.registers),
        Attr::sym_u32(nvinfo::EIATTR_FRAME_SIZE, kernel_sym, 0),
        Attr::sym_u32(nvinfo::EIATTR_MIN_STACK_SIZE, kernel_sym, 0),
    ];
    let mut kernel_info = vec![Attr::bytes(
        nvinfo::EIATTR_CUDA_API_VERSION,
        0x82u32.to_le_bytes().to_vec(),
    )];
    // ptxas lists the parameters last to first.
    for p in kparams.iter().rev() {
        kernel_info.push(p.record()?);
    }
    kernel_info.push(Attr {
        attr: nvinfo::EIATTR_MAXREG_COUNT,
        value: Value::Half(0xff),
    });
    if k.barriers > 0 {
        kernel_info.push(Attr {
            attr: nvinfo::EIATTR_NUM_BARRIERS,
            value: Value::Half(k.barriers),
        });
    }
    if !k.exit_offsets.is_empty() {
        for &e in &k.exit_offsets {
            if e as usize >= k.text.len() || e % 16 != 0 {
                return Err(SassError::malformed(
                    &what,
                    format!("exit offset {e:#x} is not an instruction of the code"),
                ));
            }
        }
        let d = k
            .exit_offsets
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect();
        kernel_info.push(Attr::bytes(nvinfo::EIATTR_EXIT_INSTR_OFFSETS, d));
    }
    if let Some(t) = k.max_threads {
        kernel_info.push(Attr::bytes(
            nvinfo::EIATTR_MAX_THREADS,
            t.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    kernel_info.push(Attr::bytes(nvinfo::EIATTR_CRS_STACK_SIZE, vec![0; 4]));
    kernel_info.push(Attr {
        attr: nvinfo::EIATTR_CBANK_PARAM_SIZE,
        value: Value::Half(param_bytes),
    });
    // PARAM_CBANK: the constant-bank section's symbol, then (size << 16) | offset.
    let mut pc = 2u32.to_le_bytes().to_vec();
    pc.extend_from_slice(&((u32::from(param_bytes) << 16) | PARAM_BASE).to_le_bytes());
    kernel_info.push(Attr::bytes(nvinfo::EIATTR_PARAM_CBANK, pc));

    let mut sections = vec![section("", elf::SHT_NULL, 0, Vec::new(), 0)];
    sections.push(section(".shstrtab", elf::SHT_STRTAB, 0, Vec::new(), 1));
    sections.push(section(".strtab", elf::SHT_STRTAB, 0, Vec::new(), 1));
    let mut s = section(
        ".symtab",
        elf::SHT_SYMTAB,
        0,
        cubin::write_symbols(&syms),
        8,
    );
    s.link = strtab as u32;
    s.info = first_global;
    s.entsize = 24;
    sections.push(s);
    // The notes at indices 5 and 6, where ptxas puts them: `cuobjdump -elf` calls this
    // file an invalid ELF with `.note.nv.cuinfo` at index 4, 5 or 7, and reads it at 6.
    sections.push(section(
        ".nv.compat",
        elf::SHT_CUDA_COMPAT,
        0,
        SM90_COMPAT.to_vec(),
        4,
    ));
    sections.push(tkinfo_note());
    sections.push(cuinfo_note());
    let mut s = section(
        ".nv.info",
        elf::SHT_CUDA_INFO,
        0,
        nvinfo::write(&global_info)?,
        4,
    );
    s.link = symtab as u32;
    sections.push(s);
    let mut s = section(
        &format!(".nv.info.{}", k.name),
        elf::SHT_CUDA_INFO,
        elf::SHF_INFO_LINK,
        nvinfo::write(&kernel_info)?,
        4,
    );
    s.link = symtab as u32;
    s.info = text as u32;
    sections.push(s);
    // The call graph of a kernel that calls nothing, as ptxas writes it: (0, -1) .. (0, -4).
    let graph = (1..=4u32)
        .flat_map(|i| [0u32, 0u32.wrapping_sub(i)])
        .flat_map(u32::to_le_bytes)
        .collect();
    let mut s = section(".nv.callgraph", elf::SHT_CUDA_CALLGRAPH, 0, graph, 4);
    s.link = symtab as u32;
    s.entsize = 8;
    sections.push(s);
    let mut s = section(
        &text_name,
        elf::SHT_PROGBITS,
        elf::SHF_ALLOC | elf::SHF_EXECINSTR,
        k.text.clone(),
        128,
    );
    s.link = symtab as u32;
    s.info = kernel_sym;
    sections.push(s);
    if has_shared {
        let mut s = section(
            &format!(".nv.shared.{}", k.name),
            elf::SHT_NOBITS,
            elf::SHF_WRITE | elf::SHF_ALLOC | elf::SHF_INFO_LINK,
            Vec::new(),
            128,
        );
        s.size = k.shared_bytes;
        s.info = text as u32;
        sections.push(s);
    }
    let cbank = vec![0u8; PARAM_BASE as usize + usize::from(param_bytes)];
    let mut s = section(
        &const_name,
        elf::SHT_PROGBITS,
        elf::SHF_ALLOC | elf::SHF_INFO_LINK,
        cbank,
        4,
    );
    s.info = text as u32;
    sections.push(s);
    debug_assert_eq!(sections.len() - 1, constant0);

    // Names, then the string tables' contents.
    let mut shstr = Strtab::new();
    for s in sections.iter_mut().skip(1) {
        s.name_offset = shstr.add(&s.name.clone());
    }
    sections[1].data = shstr.0;
    sections[1].size = sections[1].data.len() as u64;
    sections[2].data = strs.0;
    sections[2].size = sections[2].data.len() as u64;

    // Layout: contents in section order, each at its alignment; then the section header
    // table, then the program headers.
    let mut at = elf::EHDR_SIZE as u64;
    for s in sections.iter_mut().skip(1) {
        at = align_up(at, s.align, &what)?;
        s.offset = at;
        if s.sh_type != elf::SHT_NOBITS {
            at += s.size;
        }
    }
    let shoff = align_up(at, 8, &what)?;
    let phoff = shoff + (sections.len() * elf::SHDR_SIZE) as u64;
    let phsize = 5 * elf::PHDR_SIZE as u64;
    let t = &sections[text];
    let c = &sections[constant0];
    let shared_off = shared.map_or(c.offset, |i| sections[i].offset);
    let seg = |p_type, flags, offset, filesz, memsz| Segment {
        p_type,
        flags,
        offset,
        vaddr: 0,
        paddr: 0,
        filesz,
        memsz,
        align: 8,
    };
    let segments = vec![
        seg(6, 4, phoff, phsize, phsize),
        seg(1, 4, phoff, phsize, phsize),
        seg(1, 5, t.offset, t.size, t.size),
        seg(1, 6, shared_off, 0, k.shared_bytes),
        seg(1, 4, c.offset, c.size, c.size),
    ];
    let elf = Elf {
        ident: SM90_IDENT,
        e_type: 2,
        machine: 190,
        version: 1,
        entry: 0,
        phoff,
        shoff,
        flags: SM90_EFLAGS,
        shstrndx: shstrtab as u16,
        sections,
        segments,
    };
    elf.write()
}
