//! A cubin for one kernel from its code and ABI, laid out as ptxas lays out its own:
//! string tables, symbols, `.nv.compat`, the `.note.nv.tkinfo` and `.note.nv.cuinfo`
//! notes (at ptxas's indices 5 and 6), `.nv.info` (register count, frame and stack sizes),
//! `.nv.info.<kernel>` (parameters, exit offsets, barriers, parameter bank, and the
//! records ptxas writes for every sm_90 kernel), `.text.<kernel>`, `.nv.shared.<kernel>`
//! when it uses shared memory, and `.nv.constant0.<kernel>`, with the five program headers
//! ptxas writes.
//!
//! A kernel may come with device functions in code sections of their own, as the driver's
//! JIT (a linker, unlike ptxas) writes the slow paths of division and square root: each
//! gets `.text.<function>` (before the kernel's, as nvlink orders them), a local function
//! symbol, `.nv.info.<function>`, its register count in `.nv.info`, and an edge in
//! `.nv.callgraph` from each caller; the calls are relocations in `.rela.text.<caller>`
//! that the driver resolves when it loads the code (`CALL.ABS` to the function, and the
//! return address in two `MOV`s), since a section's address is known only then.

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
    /// Bytes of local memory a thread's frame takes (registers spilled there).
    pub frame_bytes: u32,
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
            frame_bytes: k.frame_size.unwrap_or(0),
            barriers: k.barriers.unwrap_or(0),
            exit_offsets: k.exit_offsets.clone(),
            max_threads,
            subroutines: subroutines(c, k),
        })
    }
}

/// A device function in a code section of its own, which the kernel (or another function)
/// calls through relocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionDesc {
    pub name: String,
    /// The code: whole 16-byte instructions.
    pub text: Vec<u8>,
    pub registers: u32,
    /// Subroutines inside its code: name, offset and size (local function symbols).
    pub subroutines: Vec<(String, u64, u64)>,
}

/// A relocation of code, which the driver applies when it loads the cubin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelocDesc {
    /// The kernel or function whose code it patches.
    pub function: String,
    /// Byte offset of the patched instruction in that code.
    pub offset: u64,
    /// `R_CUDA_…` (see [`cubin::RELOCATIONS`]): which bits it fills, and with what.
    pub r_type: u32,
    /// The function symbol whose address, plus `addend`, goes into those bits.
    pub symbol: String,
    pub addend: i64,
}

/// Everything needed to write a cubin: one kernel, the device functions it calls, and the
/// relocations that connect them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleDesc {
    pub kernel: KernelDesc,
    pub functions: Vec<FunctionDesc>,
    pub relocs: Vec<RelocDesc>,
}

impl ModuleDesc {
    /// A kernel alone.
    pub fn kernel(kernel: KernelDesc) -> ModuleDesc {
        ModuleDesc {
            kernel,
            functions: Vec::new(),
            relocs: Vec::new(),
        }
    }

    /// The description of kernel `k` of a parsed cubin with every device function of the
    /// cubin and the relocations of their code.
    pub fn from_cubin(c: &cubin::Cubin, k: &cubin::Kernel) -> Result<ModuleDesc> {
        let kernel = KernelDesc::from_cubin(c, k)?;
        let mut functions = Vec::new();
        for f in &c.functions {
            functions.push(FunctionDesc {
                name: f.name.clone(),
                text: c.text(f).to_vec(),
                registers: f.registers.ok_or_else(|| {
                    SassError::malformed(format!("function {}", f.name), "no EIATTR_REGCOUNT")
                })?,
                subroutines: subroutines(c, f),
            });
        }
        let mut relocs = Vec::new();
        for f in std::iter::once(k).chain(&c.functions) {
            for r in &f.relocs {
                let symbol = c.symbols.get(r.sym as usize).ok_or_else(|| {
                    SassError::malformed(
                        format!("section .rela.text.{}", f.name),
                        format!(
                            "relocation at {:#x} names symbol {}, which does not exist",
                            r.offset, r.sym
                        ),
                    )
                })?;
                relocs.push(RelocDesc {
                    function: f.name.clone(),
                    offset: r.offset,
                    r_type: r.r_type,
                    symbol: symbol.name.clone(),
                    addend: r.addend,
                });
            }
        }
        Ok(ModuleDesc {
            kernel,
            functions,
            relocs,
        })
    }
}

/// The function symbols inside the code of `k` other than its own (ptxas's subroutines).
fn subroutines(c: &cubin::Cubin, k: &cubin::Kernel) -> Vec<(String, u64, u64)> {
    c.symbols
        .iter()
        .enumerate()
        .filter(|(i, s)| {
            *i != k.symbol && s.kind() == STT_FUNC && usize::from(s.shndx) == k.text_section
        })
        .map(|(_, s)| (s.name.clone(), s.value, s.size))
        .collect()
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

/// `EIATTR_SW_WAR` with the value ptxas 13.0 and nvlink write into every sm_90 kernel's
/// and function's records of the library (8; what the driver does with it is not known
/// here, so quench's files carry it as NVIDIA's tools write it).
fn sw_war() -> Attr {
    Attr::bytes(nvinfo::EIATTR_SW_WAR, 8u32.to_le_bytes().to_vec())
}

/// `EIATTR_MERCURY_ISA_VERSION` 1.1, which ptxas 13.0 and nvlink write into every sm_90
/// kernel's and function's records of the library.
fn mercury_isa_version() -> Attr {
    Attr {
        attr: nvinfo::EIATTR_MERCURY_ISA_VERSION,
        value: Value::Half(0x0101),
    }
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

/// Checks that `text` is whole instructions and `registers` fits, for `what`.
fn check_code(what: &str, text: &[u8], registers: u32) -> Result<()> {
    if text.is_empty() || !text.len().is_multiple_of(16) {
        return Err(SassError::malformed(
            what,
            format!(
                "code of {} bytes is not whole 16-byte instructions",
                text.len()
            ),
        ));
    }
    if registers > 255 {
        return Err(SassError::malformed(
            what,
            format!("{registers} registers exceed 255"),
        ));
    }
    Ok(())
}

/// Local function symbols for the subroutines inside a code section.
fn subroutine_symbols(
    what: &str,
    subs: &[(String, u64, u64)],
    code_len: usize,
    section: usize,
    strs: &mut Strtab,
) -> Result<Vec<Symbol>> {
    let mut out = Vec::new();
    for (name, value, size) in subs {
        let end = value.checked_add(*size);
        if end.is_none_or(|e| e > code_len as u64) {
            return Err(SassError::malformed(
                what,
                format!("subroutine {name} at {value:#x} (+{size:#x}) is outside the code"),
            ));
        }
        out.push(Symbol {
            name: name.clone(),
            name_offset: strs.add(name),
            info: (STB_LOCAL << 4) | STT_FUNC,
            other: 0,
            shndx: section as u16,
            value: *value,
            size: *size,
        });
    }
    Ok(out)
}

/// Writes the cubin of `k`.
pub fn build(k: &KernelDesc) -> Result<Vec<u8>> {
    build_module(&ModuleDesc::kernel(k.clone()))
}

/// Writes the cubin of a kernel with its device functions and relocations.
pub fn build_module(m: &ModuleDesc) -> Result<Vec<u8>> {
    let k = &m.kernel;
    let what = format!("kernel {}", k.name);
    check_code(&what, &k.text, k.registers)?;
    for (i, f) in m.functions.iter().enumerate() {
        let fwhat = format!("function {}", f.name);
        check_code(&fwhat, &f.text, f.registers)?;
        if f.name == k.name || m.functions[..i].iter().any(|g| g.name == f.name) {
            return Err(SassError::malformed(
                fwhat,
                "a second function of that name",
            ));
        }
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

    // The code units: the functions, then the kernel (nvlink's order of their sections).
    let units: Vec<(&str, &[u8])> = m
        .functions
        .iter()
        .map(|f| (f.name.as_str(), f.text.as_slice()))
        .chain([(k.name.as_str(), k.text.as_slice())])
        .collect();
    let kernel_unit = m.functions.len();
    let unit_of = |name: &str| units.iter().position(|(n, _)| *n == name);
    for r in &m.relocs {
        let u = unit_of(&r.function).ok_or_else(|| {
            SassError::malformed(
                format!("relocation of {} at {:#x}", r.function, r.offset),
                "no kernel or function of that name",
            )
        })?;
        if r.offset >= units[u].1.len() as u64 {
            return Err(SassError::malformed(
                format!("relocation of {} at {:#x}", r.function, r.offset),
                format!("outside its {} bytes of code", units[u].1.len()),
            ));
        }
    }
    // Units whose code has relocations, each with a `.rela.text.<unit>`.
    let relocated: Vec<usize> = (0..units.len())
        .filter(|&u| m.relocs.iter().any(|r| r.function == units[u].0))
        .collect();

    // Section indices, fixed up front because records and symbols refer to them.
    let nf = m.functions.len();
    let has_shared = k.shared_bytes > 0;
    let (shstrtab, strtab, symtab, compat, tkinfo) = (1usize, 2usize, 3usize, 4usize, 5usize);
    let kernel_info = 8usize;
    let callgraph = kernel_info + 1 + nf;
    let first_rela = callgraph + 1;
    let first_text = first_rela + relocated.len();
    let text_of = |u: usize| first_text + u;
    let text = text_of(kernel_unit);
    let shared = has_shared.then_some(text + 1);
    let constant0 = text + 1 + usize::from(has_shared);
    // Symbols: the null symbol, a section symbol for the kernel's text and constant
    // sections, each function's section and (local) function symbol, the subroutines, then
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
    let section_symbol = |name: &str, idx: usize, strs: &mut Strtab| Symbol {
        name: name.to_string(),
        name_offset: strs.add(name),
        info: (STB_LOCAL << 4) | STT_SECTION,
        other: 0,
        shndx: idx as u16,
        value: 0,
        size: 0,
    };
    let text_name = format!(".text.{}", k.name);
    let const_name = format!(".nv.constant0.{}", k.name);
    syms.push(section_symbol(&text_name, text, &mut strs));
    let constant0_sym = syms.len() as u32;
    syms.push(section_symbol(&const_name, constant0, &mut strs));
    // Symbol index of each unit's function symbol, and of every function symbol by name.
    let mut unit_sym = vec![0u32; units.len()];
    for (u, f) in m.functions.iter().enumerate() {
        syms.push(section_symbol(
            &format!(".text.{}", f.name),
            text_of(u),
            &mut strs,
        ));
        unit_sym[u] = syms.len() as u32;
        syms.push(Symbol {
            name: f.name.clone(),
            name_offset: strs.add(&f.name),
            info: (STB_LOCAL << 4) | STT_FUNC,
            other: 0,
            shndx: text_of(u) as u16,
            value: 0,
            size: f.text.len() as u64,
        });
        let subs = subroutine_symbols(
            &format!("function {}", f.name),
            &f.subroutines,
            f.text.len(),
            text_of(u),
            &mut strs,
        )?;
        syms.extend(subs);
    }
    let subs = subroutine_symbols(&what, &k.subroutines, k.text.len(), text, &mut strs)?;
    syms.extend(subs);
    let first_global = syms.len() as u32;
    let kernel_sym = syms.len() as u32;
    unit_sym[kernel_unit] = kernel_sym;
    syms.push(Symbol {
        name: k.name.clone(),
        name_offset: strs.add(&k.name),
        info: (STB_GLOBAL << 4) | STT_FUNC,
        other: STO_CUDA_ENTRY,
        shndx: text as u16,
        value: 0,
        size: k.text.len() as u64,
    });
    let function_symbol = |name: &str| {
        syms.iter()
            .position(|s| s.kind() == STT_FUNC && s.name == name)
            .map(|i| i as u32)
    };

    // Relocations by the unit they patch, with symbol indices; and the call graph's edges:
    // a unit whose code names another unit's function symbol calls it (the return address
    // names the caller's own symbol, which is no edge).
    let mut relas: Vec<Vec<cubin::Reloc>> = vec![Vec::new(); units.len()];
    let mut edges: Vec<(u32, u32)> = Vec::new();
    for r in &m.relocs {
        let u = unit_of(&r.function).unwrap_or(kernel_unit);
        let sym = function_symbol(&r.symbol).ok_or_else(|| {
            SassError::malformed(
                format!("relocation of {} at {:#x}", r.function, r.offset),
                format!("names {}, which is no function of this cubin", r.symbol),
            )
        })?;
        relas[u].push(cubin::Reloc {
            offset: r.offset,
            sym,
            r_type: r.r_type,
            addend: r.addend,
        });
        if let Some(callee) = unit_of(&r.symbol).filter(|&c| c != u) {
            let edge = (unit_sym[u], unit_sym[callee]);
            if !edges.contains(&edge) {
                edges.push(edge);
            }
        }
    }

    let mut global_info = vec![
        Attr::sym_u32(nvinfo::EIATTR_REGCOUNT, kernel_sym, k.registers),
        Attr::sym_u32(nvinfo::EIATTR_FRAME_SIZE, kernel_sym, k.frame_bytes),
        Attr::sym_u32(nvinfo::EIATTR_MIN_STACK_SIZE, kernel_sym, k.frame_bytes),
    ];
    for (u, f) in m.functions.iter().enumerate() {
        global_info.push(Attr::sym_u32(
            nvinfo::EIATTR_REGCOUNT,
            unit_sym[u],
            f.registers,
        ));
        global_info.push(Attr::sym_u32(nvinfo::EIATTR_FRAME_SIZE, unit_sym[u], 0));
    }
    let mut kernel_records = vec![Attr::bytes(
        nvinfo::EIATTR_CUDA_API_VERSION,
        0x82u32.to_le_bytes().to_vec(),
    )];
    // ptxas lists the parameters last to first.
    for p in kparams.iter().rev() {
        kernel_records.push(p.record()?);
    }
    kernel_records.push(Attr {
        attr: nvinfo::EIATTR_SPARSE_MMA_MASK,
        value: Value::Half(0),
    });
    kernel_records.push(Attr {
        attr: nvinfo::EIATTR_MAXREG_COUNT,
        value: Value::Half(0xff),
    });
    if k.barriers > 0 {
        // A byte record, as ptxas writes it (nvdisasm and cuobjdump print EIFMT_BVAL).
        let b = u8::try_from(k.barriers).map_err(|_| {
            SassError::malformed(&what, format!("{} barriers exceed 255", k.barriers))
        })?;
        kernel_records.push(Attr {
            attr: nvinfo::EIATTR_NUM_BARRIERS,
            value: Value::Byte(b),
        });
    }
    kernel_records.push(mercury_isa_version());
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
        kernel_records.push(Attr::bytes(nvinfo::EIATTR_EXIT_INSTR_OFFSETS, d));
    }
    if let Some(t) = k.max_threads {
        kernel_records.push(Attr::bytes(
            nvinfo::EIATTR_MAX_THREADS,
            t.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    kernel_records.push(Attr::bytes(nvinfo::EIATTR_CRS_STACK_SIZE, vec![0; 4]));
    kernel_records.push(Attr {
        attr: nvinfo::EIATTR_CBANK_PARAM_SIZE,
        value: Value::Half(param_bytes),
    });
    // PARAM_CBANK: the constant-bank section's symbol, then (size << 16) | offset.
    let mut pc = constant0_sym.to_le_bytes().to_vec();
    pc.extend_from_slice(&((u32::from(param_bytes) << 16) | PARAM_BASE).to_le_bytes());
    kernel_records.push(Attr::bytes(nvinfo::EIATTR_PARAM_CBANK, pc));
    kernel_records.push(sw_war());
    // A function's records, as nvlink writes them.
    let function_records = vec![
        sw_war(),
        Attr::bytes(nvinfo::EIATTR_CRS_STACK_SIZE, vec![0; 4]),
        mercury_isa_version(),
        Attr {
            attr: nvinfo::EIATTR_SPARSE_MMA_MASK,
            value: Value::Half(0),
        },
        Attr::bytes(
            nvinfo::EIATTR_CUDA_API_VERSION,
            0x82u32.to_le_bytes().to_vec(),
        ),
    ];

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
    // The notes at indices 5 and 6, where ptxas puts them: `cuobjdump -elf` calls a file
    // an invalid ELF unless section 6 is a note (measured by moving sections of ptxas's
    // files and quench's; nothing else about their order mattered).
    sections.push(section(
        ".nv.compat",
        elf::SHT_CUDA_COMPAT,
        0,
        SM90_COMPAT.to_vec(),
        4,
    ));
    sections.push(tkinfo_note());
    // ptxas and nvlink link the cuinfo note to the tkinfo note and give `.nv.compat` as
    // its info section.
    let mut s = cuinfo_note();
    s.link = tkinfo as u32;
    s.info = compat as u32;
    sections.push(s);
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
        nvinfo::write(&kernel_records)?,
        4,
    );
    s.link = symtab as u32;
    s.info = text as u32;
    sections.push(s);
    for (u, f) in m.functions.iter().enumerate() {
        let mut s = section(
            &format!(".nv.info.{}", f.name),
            elf::SHT_CUDA_INFO,
            elf::SHF_INFO_LINK,
            nvinfo::write(&function_records)?,
            4,
        );
        s.link = symtab as u32;
        s.info = text_of(u) as u32;
        sections.push(s);
    }
    // The call graph as ptxas and nvlink write it: (0, -1), each call (caller, callee) by
    // symbol, then (0, -2) .. (0, -4).
    let graph = [(0u32, u32::MAX)]
        .into_iter()
        .chain(edges)
        .chain((2..=4u32).map(|i| (0, 0u32.wrapping_sub(i))))
        .flat_map(|(a, b)| [a, b])
        .flat_map(u32::to_le_bytes)
        .collect();
    let mut s = section(".nv.callgraph", elf::SHT_CUDA_CALLGRAPH, 0, graph, 4);
    s.link = symtab as u32;
    s.entsize = 8;
    sections.push(s);
    for &u in &relocated {
        let mut s = section(
            &format!(".rela.text.{}", units[u].0),
            elf::SHT_RELA,
            elf::SHF_INFO_LINK,
            cubin::write_relocs(&relas[u]),
            8,
        );
        s.link = symtab as u32;
        s.info = text_of(u) as u32;
        s.entsize = 24;
        sections.push(s);
    }
    for (u, (name, code)) in units.iter().enumerate() {
        let mut s = section(
            &format!(".text.{name}"),
            elf::SHT_PROGBITS,
            elf::SHF_ALLOC | elf::SHF_EXECINSTR,
            code.to_vec(),
            128,
        );
        s.link = symtab as u32;
        s.info = unit_sym[u];
        sections.push(s);
    }
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
    debug_assert_eq!(sections[text].name, text_name);

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
    // One loadable segment for all the code: the functions' sections and the kernel's.
    let code_start = sections[first_text].offset;
    let code_size = sections[text].offset + sections[text].size - code_start;
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
        seg(1, 5, code_start, code_size, code_size),
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
