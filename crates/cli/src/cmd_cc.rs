//! `quench cc`: the kernel compiler's front door.

use std::path::PathBuf;

use clap::ValueEnum;
use quench_kernels::library;

#[derive(Clone, Copy, ValueEnum)]
pub enum Emit {
    /// quench's kernel IR, as text
    Ir,
    /// PTX for sm_90 (sm_90a for a kernel that uses wgmma)
    Ptx,
    /// sm_90 SASS from quench's own code generator, no ptxas involved, as `quench sass
    /// dis` prints it (`quench sass asm` makes it a cubin); kernels it cannot compile yet
    /// are refused with the operation that stops them
    Sass,
}

#[derive(clap::Args)]
pub struct CcArgs {
    /// List the library kernels, one name per line.
    #[arg(long)]
    pub list: bool,
    /// A library kernel (see --list).
    pub kernel: Option<String>,
    /// Parameters as key=value (e.g. rows=4096 cols=4096); defaults for the rest.
    pub params: Vec<String>,
    /// What to print.
    #[arg(long, value_enum, default_value = "ir")]
    pub emit: Emit,
    /// Compile a kernel from an IR text file instead of the library.
    #[arg(long, conflicts_with_all = ["kernel", "list"])]
    pub ir_file: Option<PathBuf>,
    /// Show a kernel's parameters with their defaults.
    #[arg(long)]
    pub describe: bool,
}

pub fn run(a: &CcArgs) -> Result<(), String> {
    if a.list {
        for k in library() {
            println!("{}", k.name);
        }
        return Ok(());
    }
    let f = if let Some(path) = &a.ir_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let f = quench_ir::parse::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        quench_ir::verify(&f).map_err(|e| format!("{}: {e}", path.display()))?;
        f
    } else {
        let name = a
            .kernel
            .as_deref()
            .ok_or("name a kernel (see `quench cc --list`) or give --ir-file")?;
        let spec = quench_kernels::find(name).map_err(|e| e.to_string())?;
        if a.describe {
            println!("{}: {}", spec.name, spec.description);
            for p in spec.params {
                println!("  {}={:<10} {}", p.name, p.default, p.doc);
            }
            return Ok(());
        }
        let params = spec
            .parse_params(&a.params.join(" "))
            .map_err(|e| e.to_string())?;
        spec.build(&params).map_err(|e| e.to_string())?
    };
    match a.emit {
        Emit::Ir => print!("{}", quench_ir::print::print(&f)),
        Emit::Ptx => print!("{}", quench_ptx::emit(&f).map_err(|e| e.to_string())?),
        Emit::Sass => print!(
            "{}",
            quench_sass::codegen::compile(&f).map_err(|e| e.to_string())?
        ),
    }
    Ok(())
}
