//! quench: a GPU compiler, runtime and inference engine for NVIDIA Hopper.

mod cmd_cc;
mod cmd_check_kernels;
mod cmd_devices;
mod cmd_isa;
mod cmd_top;
mod gpu;
mod receipt;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "quench", version, about = "A GPU compiler, runtime and LLM inference engine for NVIDIA Hopper (sm_90)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile library kernels: list them, print their IR or PTX.
    Cc(cmd_cc::CcArgs),
    /// List the GPUs the NVIDIA driver sees.
    Devices,
    /// Measure the machine model of the GPU.
    #[command(subcommand)]
    Isa(IsaCommand),
    /// Run every library kernel on the GPU and in the interpreter on the same inputs
    /// and compare them; time each on the GPU.
    CheckKernels(cmd_check_kernels::CheckArgs),
    /// Watch the GPUs: utilization, memory, clocks, power, processes, server metrics.
    Top(cmd_top::TopArgs),
}

#[derive(Subcommand)]
enum IsaCommand {
    /// Run the probe kernels and write the tables under isa/sm90 with a receipt.
    Probe(cmd_isa::ProbeArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Cc(a) => cmd_cc::run(a),
        Command::Devices => cmd_devices::run(),
        Command::Isa(IsaCommand::Probe(a)) => cmd_isa::probe(a),
        Command::CheckKernels(a) => cmd_check_kernels::run(a),
        Command::Top(a) => cmd_top::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
