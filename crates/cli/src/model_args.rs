//! The options every model command shares, and loading the model they name.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use quench_engine::gpu::Widened;
use quench_engine::{
    Arithmetic, Codegen, Device, GgmlKernels, KvCache, LoadOptions, Model, ModelInfo, Precision,
    Runtime,
};

use crate::cmd_pull;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// quench's CPU forward passes.
    Cpu,
    /// NVIDIA GPU 0, through quench's kernels.
    Cuda,
}

/// The element type of a GPU's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvCacheArg {
    /// Half the memory; keys and values rounded to f16.
    F16,
    /// Keys and values as computed: twice the memory and attention traffic of f16.
    F32,
}

/// Where the machine code of the GPU's kernels comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CodegenArg {
    /// PTX, finished by the driver's JIT (ptxas)
    Ptx,
    /// sm_90 SASS from quench's own code generator, no ptxas involved; a kernel it cannot
    /// compile yet stops the load with the operation that stops it
    Sass,
}

impl From<CodegenArg> for Codegen {
    fn from(a: CodegenArg) -> Codegen {
        match a {
            CodegenArg::Ptx => Codegen::Ptx,
            CodegenArg::Sass => Codegen::Sass,
        }
    }
}

/// Which runtime drives the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeArg {
    /// NVIDIA's driver library (libcuda)
    Cuda,
    /// quench's own driver over NVIDIA's open kernel module, no libcuda (kernels from
    /// ptxas, or from quench's own code generator with `--codegen sass`)
    Native,
}

impl From<RuntimeArg> for Runtime {
    fn from(a: RuntimeArg) -> Runtime {
        match a {
            RuntimeArg::Cuda => Runtime::Cuda,
            RuntimeArg::Native => Runtime::Native,
        }
    }
}

/// Which build of llama.cpp `--llama-cpp-rounding` follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LlamaCppKernelsArg {
    /// The kernels llama.cpp built natively for this CPU uses (`pip install
    /// llama-cpp-python` builds natively): avx512 where the CPU has AVX-512, else avx2.
    Native,
    /// ggml's AVX2 kernels: a build with -DGGML_NATIVE=OFF, or native on a CPU without
    /// AVX-512.
    Avx2,
    /// ggml's AVX-512 kernels: native on a CPU with AVX-512, or -DGGML_AVX512=ON.
    Avx512,
}

impl From<LlamaCppKernelsArg> for GgmlKernels {
    fn from(a: LlamaCppKernelsArg) -> GgmlKernels {
        match a {
            LlamaCppKernelsArg::Native => GgmlKernels::native(),
            LlamaCppKernelsArg::Avx2 => GgmlKernels::Avx2,
            LlamaCppKernelsArg::Avx512 => GgmlKernels::Avx512,
        }
    }
}

impl From<KvCacheArg> for KvCache {
    fn from(a: KvCacheArg) -> KvCache {
        match a {
            KvCacheArg::F16 => KvCache::F16,
            KvCacheArg::F32 => KvCache::F32,
        }
    }
}

#[derive(Args)]
pub struct ModelArgs {
    /// A pulled model's name (smollm2, minilm) or the path of a GGUF file or Hugging Face
    /// checkpoint directory.
    #[arg(long, short = 'm', value_name = "NAME|PATH")]
    pub model: Option<String>,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// With --device cuda: which GPU (as `quench devices` numbers them).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: u32,
    /// The model cache pulled models are found in (as for `quench pull --cache`).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Most tokens of context (default: the model's own limit; on the GPU at most 8192).
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<usize>,
    /// Compute in double precision (the reference; slower).
    #[arg(long)]
    pub f64: bool,
    /// Round as llama.cpp's CPU path does (8-bit activation blocks, f16 keys and values),
    /// to pick the tokens llama.cpp picks: CPU only, Q4_1/Q8_0 GGUF weights.
    /// `--llama-cpp-rounding=BUILD` names the build of llama.cpp to follow (its vector width
    /// changes the last bits).
    #[arg(
        long,
        value_enum,
        value_name = "BUILD",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "native",
        conflicts_with = "f64"
    )]
    pub llama_cpp_rounding: Option<LlamaCppKernelsArg>,
    /// On a GPU, multiply bf16 weights on the tensor cores at every decode step (built for
    /// many sequences a step; one sequence decodes slightly faster without).
    #[arg(long)]
    pub tensor_core_decode: bool,
    /// On a GPU, the element type of the KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache: KvCacheArg,
    /// On a GPU, most prompt tokens one pass of the prompt path takes (tensor-core
    /// products over the pass's rows) [default: 512]; 0 feeds the prompt one token per
    /// decode step.
    #[arg(long, value_name = "TOKENS")]
    pub prefill_chunk: Option<usize>,
    /// On a GPU, where the kernels' machine code comes from.
    #[arg(long, value_enum, default_value = "ptx")]
    pub codegen: CodegenArg,
    /// On a GPU, which runtime drives it.
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: RuntimeArg,
    /// Split the model across N GPUs (from --gpu on), each holding a share of every layer
    /// (its heads, FFN width and vocabulary must divide by N); the ranks' rows meet in host
    /// memory twice a layer, in decode steps and prompt chunks alike.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tensor_parallel: Option<u32>,
    /// Print no diagnostics (load time, speed) on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// A loaded model and the name to show for it.
pub struct Loaded {
    pub model: Model,
    pub name: String,
}

impl ModelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            device: match self.device {
                DeviceArg::Cpu => Device::Cpu,
                DeviceArg::Cuda => Device::Cuda,
            },
            gpu: self.gpu,
            precision: if self.f64 {
                Precision::F64
            } else {
                Precision::F32
            },
            context_limit: self.context,
            sessions: None,
            max_batch: None,
            arithmetic: match self.llama_cpp_rounding {
                Some(build) => Arithmetic::GgmlRounding(build.into()),
                None => Arithmetic::F32,
            },
            tensor_core_decode: self.tensor_core_decode,
            kv_cache: self.kv_cache.into(),
            prefill_chunk: self.prefill_chunk,
            codegen: self.codegen.into(),
            runtime: self.backend.into(),
            tensor_parallel: self.tensor_parallel.map(|n| n as usize),
        }
    }

    /// Loads the model given, or `default` (a pulled model's name), reporting on stderr.
    pub fn load(&self, default: &str) -> Result<Loaded, String> {
        let path = cmd_pull::resolve(self.model.as_deref(), default, self.cache.as_deref())?;
        let name = self.model.clone().unwrap_or_else(|| default.to_owned());
        let start = Instant::now();
        let model = quench_engine::load(&path, &self.load_options()).map_err(|e| e.to_string())?;
        if !self.quiet {
            eprintln!(
                "loaded {name}: {} in {:.2} s",
                summary(model.info()),
                start.elapsed().as_secs_f64()
            );
            if let Some(note) = widened_note(model.info()) {
                eprintln!("{note}");
            }
        }
        Ok(Loaded { model, name })
    }

    /// Prints a line on stderr unless `--quiet`.
    pub fn note(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }
}

/// Where the GPU expanded tensors to f16: which types (and widths), how many tensors, and
/// what that costs.
pub fn widened_note(info: &ModelInfo) -> Option<String> {
    if info.widened.is_empty() {
        return None;
    }
    Some(format!(
        "note: {}; expanded to F16 as uploaded (exact values rounded to f16), they take and \
         read more memory than stored, so decode is slower than the stored size suggests",
        widened_list(&info.widened)
    ))
}

/// `no GPU kernel reads IQ2_XS (64 tensors) as stored; the prompt path's products do not
/// take Q6_K rows of 8960 (14 tensors)`.
pub fn widened_list(widened: &[Widened]) -> String {
    let (width, kernel): (Vec<&Widened>, Vec<&Widened>) =
        widened.iter().partition(|w| w.rows_of.is_some());
    let list = |v: Vec<&Widened>| {
        Widened::counts(v)
            .iter()
            .map(|(w, n)| format!("{w} ({n} tensor{})", if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = vec![];
    if !kernel.is_empty() {
        parts.push(format!("no GPU kernel reads {} as stored", list(kernel)));
    }
    if !width.is_empty() {
        parts.push(format!(
            "the prompt path's products do not take {}",
            list(width)
        ));
    }
    parts.join("; ")
}

/// "llama, 134.5M parameters (Q4_1, F32), context 2048".
pub fn summary(info: &ModelInfo) -> String {
    let types: Vec<&str> = info.tensor_types.keys().map(String::as_str).collect();
    format!(
        "{}, {} parameters ({}), context {}",
        info.config.arch.name(),
        count(info.parameters),
        types.join(", "),
        info.context_limit
    )
}

/// A count with a unit: 134.5M, 7.6B, 40.4K.
pub fn count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// Bytes in binary units: 513.2 MiB.
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}
