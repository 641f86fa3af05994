//! How an f32 decoder rounds.

/// The arithmetic of an f32 [`crate::Decoder`], chosen when it is loaded
/// ([`crate::Decoder::load_with_arithmetic`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arithmetic {
    /// Activations in f32 throughout; quantized weights multiplied as stored. Its logits stay
    /// within the FP64 check's bound (`0.05 + 0.003·|ref|`) of the f64 reference.
    #[default]
    F32,
    /// The roundings of llama.cpp's CPU path (ggml's x86 kernels of the given width, without
    /// flash attention), to pick the tokens llama.cpp picks: before each quantized weight,
    /// the activations are rounded to 8-bit blocks of 32 (Q8_1 for Q4_1 weights, Q8_0 for
    /// Q8_0) and multiplied in integers block by block; keys and values are kept in f16, and
    /// the query and the attention weights are rounded to f16 before they meet them; RoPE
    /// angles, RMSNorm, softmax and SiLU are computed as ggml computes them. Its logits stand
    /// as far from the f64 reference as llama.cpp's do (tenths of a unit where the f32 ones
    /// stand hundredths).
    ///
    /// Measured against llama.cpp (llama-cpp-python 0.3.36) on SmolLM2-135M-Instruct Q4_1:
    /// all logits of 512 greedy steps over eight prompts equal, bit for bit.
    /// Reproduced is the path of the logits llama.cpp returns by default, the last token's:
    /// asked for every position ([`crate::Logits::All`]), llama.cpp sums the output product of
    /// several rows in another order. The matrix weights must come from a GGUF file in Q4_1 or
    /// Q8_0 (others are refused by name).
    GgmlRounding(GgmlKernels),
}

/// Which of ggml's x86 kernels llama.cpp was built with: they sum the attention's f16 products,
/// the softmax and SiLU in vectors of different widths, so their last bits differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlKernels {
    /// AVX2 with FMA and F16C, 8 lanes: a build with `-DGGML_NATIVE=OFF`, or a native build on
    /// a CPU without AVX-512.
    Avx2,
    /// AVX-512 (F, DQ, BW, VL), 16 lanes: a native build on a CPU with AVX-512 (the default of
    /// `pip install llama-cpp-python` there) or one with `-DGGML_AVX512=ON`. Builds that use
    /// Intel's AMX tiles for the weights (a native build on a CPU with AMX) sum differently
    /// and are not reproduced.
    Avx512,
}

impl GgmlKernels {
    /// The kernels a native build of llama.cpp uses on this CPU.
    pub fn native() -> GgmlKernels {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                return GgmlKernels::Avx512;
            }
        }
        GgmlKernels::Avx2
    }

    /// f32 lanes of one vector register.
    pub(crate) fn lanes(self) -> usize {
        match self {
            GgmlKernels::Avx2 => 8,
            GgmlKernels::Avx512 => 16,
        }
    }
}
