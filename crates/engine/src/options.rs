//! How a model is to be loaded.

pub use quench_cpu::{Arithmetic, GgmlKernels};
pub use quench_rt::Codegen;

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// quench's CPU forward passes, on every core.
    #[default]
    Cpu,
    /// An NVIDIA GPU ([`LoadOptions::gpu`]) through quench's kernels.
    Cuda,
    /// quench's kernels on its interpreter (on the CPU, slow): the GPU path where no GPU
    /// is, for checking it.
    Interp,
}

impl Device {
    /// Whether quench's kernels run the model (on a GPU or on the interpreter).
    pub fn runs_kernels(self) -> bool {
        self != Device::Cpu
    }
}

/// The element type weights and activations are held in on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Fast enough to chat with small models.
    #[default]
    F32,
    /// Double precision everywhere: the reference other results are judged against.
    F64,
}

impl Precision {
    /// Bytes of one element.
    pub fn bytes(self) -> u64 {
        match self {
            Precision::F32 => 4,
            Precision::F64 => 8,
        }
    }
}

/// The element type a GPU's KV cache holds keys and values in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvCache {
    /// Half the memory of f32; attention reads keys and values rounded to 11 bits.
    #[default]
    F16,
    /// Keys and values as computed: attention at the decode step's f32 precision, twice
    /// the cache memory and traffic of f16.
    F32,
}

impl KvCache {
    pub fn name(self) -> &'static str {
        match self {
            KvCache::F16 => "f16",
            KvCache::F32 => "f32",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    pub device: Device,
    /// With [`Device::Cuda`]: which GPU (the driver's ordinal).
    pub gpu: u32,
    pub precision: Precision,
    /// Most positions one session holds (prompt and generated tokens together), or the
    /// longest text an embedding model reads. `None`: the model's own limit. Never above it.
    pub context_limit: Option<usize>,
    /// On a GPU: sessions whose full contexts the KV cache holds at once (`None`: one).
    /// On the CPU each session's cache grows as it needs.
    pub sessions: Option<usize>,
    /// On a GPU: most sequences one decode step runs together
    /// ([`crate::CausalModel::feed_batch`]; `None`: one). Activation memory grows with it.
    pub max_batch: Option<usize>,
    /// On the CPU in f32: how the decoder rounds ([`Arithmetic::GgmlRounding`] picks the
    /// tokens llama.cpp's CPU path picks). Other devices and precisions take only the
    /// default.
    pub arithmetic: Arithmetic,
    /// On a GPU: multiply bf16 matrices on the tensor cores at every decode step
    /// ([`crate::gpu::GpuOptions::tensor_core_decode`]), for many sequences stepped
    /// together.
    pub tensor_core_decode: bool,
    /// On a GPU: the element type of the KV cache.
    pub kv_cache: KvCache,
    /// On a GPU: most tokens of a prompt one chunk of the prompt path takes; `None`: the
    /// default, [`crate::gpu::DEFAULT_PREFILL_CHUNK`]; 0 feeds prompts one decode step per
    /// token ([`crate::gpu::GpuOptions::prefill_chunk`]).
    pub prefill_chunk: Option<usize>,
    /// With [`Device::Cuda`]: where the kernels' machine code comes from (PTX finished by
    /// the driver, or quench's own code generator).
    pub codegen: Codegen,
    /// With [`Device::Cuda`]: which runtime drives the GPU.
    pub runtime: Runtime,
    /// Split the decoder across this many devices ([`crate::gpu::TensorParallel`]): GPUs
    /// `gpu ..` with [`Device::Cuda`], as many interpreters with [`Device::Interp`].
    /// `None`: the whole decoder on one device.
    pub tensor_parallel: Option<usize>,
}

/// Which runtime drives an NVIDIA GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runtime {
    /// NVIDIA's driver library (libcuda).
    #[default]
    Cuda,
    /// quench's own driver over NVIDIA's open kernel module, no libcuda
    /// ([`quench_rt::native`]).
    Native,
}
