//! `quench sass`: quench's own sm_90 machine code — disassemble a cubin, assemble SASS text.

use std::path::PathBuf;

use quench_sass::table::Tables;

#[derive(clap::Subcommand)]
pub enum SassCommand {
    /// Print a cubin's kernels as SASS in nvdisasm's syntax, each instruction with its
    /// control bits (wait mask, read/write barriers, yield, stall), headed by the kernel's ABI.
    Dis {
        /// A cubin (e.g. from `ptxas -arch=sm_90 k.ptx -o k.cubin`).
        file: PathBuf,
    },
    /// Assemble SASS text as `quench sass dis` prints it into a cubin.
    Asm {
        /// The SASS text.
        file: PathBuf,
        /// Where to write the cubin.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Run every library kernel on the GPU from the driver's cubin and from that cubin
    /// disassembled and reassembled by quench, and compare the outputs bit for bit.
    CheckGpu(crate::cmd_sass_gpu::CheckGpuArgs),
}

pub fn run(c: &SassCommand) -> Result<(), String> {
    let tables = Tables::sm90()?;
    match c {
        SassCommand::CheckGpu(a) => crate::cmd_sass_gpu::run(a),
        SassCommand::Dis { file } => {
            let bytes =
                std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let cubin = quench_sass::cubin::Cubin::parse(&bytes)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            let (text, cov) =
                quench_sass::dis::disassemble(&cubin, tables).map_err(|e| e.to_string())?;
            print!("{text}");
            if cov.decoded < cov.instructions {
                eprintln!(
                    "{} of {} instructions are not in the tables (printed as .inst)",
                    cov.instructions - cov.decoded,
                    cov.instructions
                );
            }
            Ok(())
        }
        SassCommand::Asm { file, output } => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let cubin = quench_sass::asm::assemble_cubin(&text, tables)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            std::fs::write(output, cubin)
                .map_err(|e| format!("cannot write {}: {e}", output.display()))
        }
    }
}
