//! BERT encoders (sentence embedders such as all-MiniLM-L6-v2) on a GPU, or on quench's
//! kernel interpreter.
//!
//! A batch of texts is padded to its longest and run as one matrix of `texts × longest`
//! rows; each text's length masks the padding keys out of the attention, so a text's
//! states do not depend on what it is batched with (beyond the rounding of the matrix
//! products' tiles, which is the same for every row). Per layer (post-LayerNorm, as BERT):
//!
//! ```text
//! qkv  = bias_rows(b_qkv);   qkv += h16 · W_qkvᵀ            (gemm_bf16_residual)
//! ctx  = encoder_attention(qkv, lengths)                    (bf16)
//! x    = bias_rows(b_o);     x   += ctx · W_oᵀ
//! h'   = LayerNorm(x + h)                                   (layernorm_residual_f32)
//! h16  = bf16(h')                                           (cast_f32_bf16)
//! up   = bias_rows(b_up);    up  += h16 · W_upᵀ
//! a16  = gelu(up)                                           (gelu_f32_bf16, erf form)
//! x    = bias_rows(b_down);  x   += a16 · W_downᵀ
//! h    = LayerNorm(x + h');  h16 = bf16(h)
//! ```
//!
//! The embeddings are two gathers (word rows; position rows with token type 0 added at
//! load) and a `layernorm_residual_f32`. The last layer's states come back to the host,
//! which pools them (a few hundred floats a text). See [`weights`] for what is stored in
//! which precision, and why.

mod weights;

use quench_ir::Scalar;
use quench_kernels::bias::BiasRowsParams;
use quench_kernels::embed::{EmbedParams, TableFormat};
use quench_kernels::encoder_attention::EncoderAttentionParams;
use quench_kernels::gemm::{BFormat, Core, Epilogue, GemmParams, Operands};
use quench_kernels::norm_residual::{Norm, NormOut, NormResidualParams};
use quench_kernels::to_bf16::{Activation, ToBf16Params};
use quench_models::arch::{Arch, ModelConfig, Naming, TensorSource};
use quench_rt::{Arg, DevicePtr, Executor, KernelId, Launch, StreamId};

use super::decoder::{open, Backend};
use super::graph::row_threads;
use super::GpuError;
use weights::{Dense, Layer as LayerWeights, Norm as NormWeights, Weights};

/// Padded tokens one pass takes at most: a longer list of texts runs in several passes.
const PASS_TOKENS: usize = 16384;
/// Queries per attention block (one warp each).
const ATTENTION_WARPS: u32 = 4;

/// A compiled kernel with the launch shape it needs.
/// One launch of a pass: what it does (for errors), the kernel, its launch, its arguments.
type PassLaunch = (String, KernelId, Launch, Vec<Arg>);

struct Kernel<P> {
    id: KernelId,
    params: P,
}

/// The kernels of a forward pass, built for this model's shapes.
struct Kernels {
    embed: Kernel<EmbedParams>,
    norm: Kernel<NormResidualParams>,
    cast: Kernel<ToBf16Params>,
    gelu: Kernel<ToBf16Params>,
    bias: Kernel<BiasRowsParams>,
    attention: Kernel<EncoderAttentionParams>,
    /// `[3·hidden, hidden]`, `[hidden, hidden]`, `[ffn, hidden]`, `[hidden, ffn]`.
    gemm_qkv: Kernel<GemmParams>,
    gemm_out: Kernel<GemmParams>,
    gemm_up: Kernel<GemmParams>,
    gemm_down: Kernel<GemmParams>,
}

/// A BERT encoder whose weights live on a device.
pub struct GpuEncoder {
    exec: Box<dyn Executor + Send>,
    config: ModelConfig,
    weights: Weights,
    kernels: Kernels,
}

/// Device buffers of one pass, `rows` = texts × padded length.
struct Activations {
    ids: DevicePtr,
    positions: DevicePtr,
    lens: DevicePtr,
    x: DevicePtr,
    scratch: DevicePtr,
    hidden: DevicePtr,
    hidden2: DevicePtr,
    hidden16: DevicePtr,
    qkv: DevicePtr,
    ctx16: DevicePtr,
    up: DevicePtr,
    act16: DevicePtr,
}

impl Activations {
    fn all(&self) -> [DevicePtr; 12] {
        [
            self.ids,
            self.positions,
            self.lens,
            self.x,
            self.scratch,
            self.hidden,
            self.hidden2,
            self.hidden16,
            self.qkv,
            self.ctx16,
            self.up,
            self.act16,
        ]
    }
}

/// Refuse a shape the kernels do not take, naming it.
fn check_shapes(c: &ModelConfig) -> Result<(), GpuError> {
    let unsupported = |reason: String| {
        Err(GpuError::Unsupported {
            what: "this encoder's shape".into(),
            reason,
        })
    };
    if c.arch != Arch::Bert {
        return Err(GpuError::Unsupported {
            what: format!("architecture {}", c.arch.name()),
            reason: "the GPU encoder runs BERT".into(),
        });
    }
    if !c.hidden.is_multiple_of(64) || !c.ffn.is_multiple_of(64) {
        return unsupported(format!(
            "hidden size {} and feed-forward size {} must be multiples of 64 (the matrix products' tiles)",
            c.hidden, c.ffn
        ));
    }
    if !c.head_dim.is_multiple_of(32) || c.head_dim > 256 || c.heads * c.head_dim != c.hidden {
        return unsupported(format!(
            "head size {} must be a multiple of 32 up to 256, with heads × head size = hidden ({} × {} ≠ {})",
            c.head_dim, c.heads, c.head_dim, c.hidden
        ));
    }
    if c.type_vocab == 0 {
        return unsupported("the checkpoint has no token type embeddings".into());
    }
    Ok(())
}

impl GpuEncoder {
    /// Puts the encoder `config` describes on `exec`: checks the shapes, uploads the
    /// weights and compiles the kernels.
    pub fn new(
        config: ModelConfig,
        src: &dyn TensorSource,
        naming: Naming,
        mut exec: Box<dyn Executor + Send>,
    ) -> Result<GpuEncoder, GpuError> {
        config.validate()?;
        check_shapes(&config)?;
        let kernels = compile(&config, exec.as_mut())?;
        let weights = weights::upload(&config, src, naming, exec.as_mut())?;
        Ok(GpuEncoder {
            exec,
            config,
            weights,
            kernels,
        })
    }

    /// Opens `backend` and puts the encoder there.
    pub fn on(
        backend: Backend,
        config: ModelConfig,
        src: &dyn TensorSource,
        naming: Naming,
    ) -> Result<GpuEncoder, GpuError> {
        let (exec, _) = open(backend)?;
        GpuEncoder::new(config, src, naming, exec)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes
    }

    /// `"cuda"` or `"interp"`, and the device's name.
    pub fn device(&self) -> String {
        format!("{} ({})", self.exec.device_name(), self.exec.backend())
    }

    /// The last layer's states of each text (`[tokens, hidden]` row-major), texts run
    /// together in passes of up to 16384 padded tokens. Every text needs at least one
    /// token and at most the model's position count.
    pub fn hidden_states(&mut self, texts: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, GpuError> {
        for t in texts {
            if t.is_empty() {
                return Err(GpuError::NoTokens);
            }
            if t.len() > self.config.max_positions {
                return Err(GpuError::Unsupported {
                    what: format!("a text of {} tokens", t.len()),
                    reason: format!(
                        "the model reads at most {} positions",
                        self.config.max_positions
                    ),
                });
            }
            if let Some(&token) = t.iter().find(|&&id| id as usize >= self.config.vocab) {
                return Err(GpuError::Token {
                    token,
                    vocab: self.config.vocab,
                });
            }
        }
        let mut states = Vec::with_capacity(texts.len());
        let mut start = 0;
        while start < texts.len() {
            // The longest run of texts from `start` whose padded size fits a pass.
            let mut end = start + 1;
            let mut longest = texts[start].len();
            while end < texts.len()
                && (end + 1 - start) * longest.max(texts[end].len()) <= PASS_TOKENS
            {
                longest = longest.max(texts[end].len());
                end += 1;
            }
            states.extend(self.pass(&texts[start..end], longest)?);
            start = end;
        }
        Ok(states)
    }

    /// One padded batch through the device; the activations are freed afterwards.
    fn pass(&mut self, texts: &[Vec<u32>], seq_len: usize) -> Result<Vec<Vec<f32>>, GpuError> {
        let rows = texts.len() * seq_len;
        let act = self.alloc_activations(texts.len(), rows)?;
        let result = self.run_pass(&act, texts, seq_len);
        let mut freed = Ok(());
        for p in act.all() {
            if let Err(e) = self.exec.free(p) {
                freed = freed.and(Err(GpuError::runtime("freeing the activations")(e)));
            }
        }
        let states = result?;
        freed?;
        Ok(states)
    }

    fn alloc_activations(&mut self, texts: usize, rows: usize) -> Result<Activations, GpuError> {
        let c = &self.config;
        let (h, f, r) = (c.hidden as u64, c.ffn as u64, rows as u64);
        let sizes = [
            4 * r,
            4 * r,
            4 * texts as u64,
            4 * r * h,
            4 * r * h,
            4 * r * h,
            4 * r * h,
            2 * r * h,
            12 * r * h,
            2 * r * h,
            4 * r * f,
            2 * r * f,
        ];
        let mut ptrs = Vec::with_capacity(sizes.len());
        for bytes in sizes {
            match self.exec.alloc(bytes) {
                Ok(p) => ptrs.push(p),
                Err(e) => {
                    for p in ptrs {
                        let _ = self.exec.free(p);
                    }
                    return Err(GpuError::runtime(format!(
                        "allocating the activations of {rows} padded tokens"
                    ))(e));
                }
            }
        }
        Ok(Activations {
            ids: ptrs[0],
            positions: ptrs[1],
            lens: ptrs[2],
            x: ptrs[3],
            scratch: ptrs[4],
            hidden: ptrs[5],
            hidden2: ptrs[6],
            hidden16: ptrs[7],
            qkv: ptrs[8],
            ctx16: ptrs[9],
            up: ptrs[10],
            act16: ptrs[11],
        })
    }

    fn run_pass(
        &mut self,
        a: &Activations,
        texts: &[Vec<u32>],
        seq_len: usize,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        self.upload_inputs(a, texts, seq_len)?;
        let mut run = self.embedding_launches(a, texts.len() * seq_len);
        for (n, l) in self.weights.layers.iter().enumerate() {
            run.extend(self.layer_launches(n, l, a, texts.len(), seq_len));
        }
        for (what, id, launch, args) in run {
            self.exec
                .launch(id, &launch, &args, StreamId::DEFAULT)
                .map_err(GpuError::runtime(what))?;
        }
        self.exec
            .synchronize()
            .map_err(GpuError::runtime("running the encoder"))?;
        let hidden = self.config.hidden;
        let mut bytes = vec![0u8; texts.len() * seq_len * hidden * 4];
        self.exec
            .copy_to_host(a.hidden, &mut bytes)
            .map_err(GpuError::runtime("reading the states back"))?;
        let all: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(texts
            .iter()
            .enumerate()
            .map(|(i, t)| all[i * seq_len * hidden..(i * seq_len + t.len()) * hidden].to_vec())
            .collect())
    }

    /// The token ids, positions and text lengths of a padded batch of `seq_len` rows a
    /// text.
    fn upload_inputs(
        &mut self,
        a: &Activations,
        texts: &[Vec<u32>],
        seq_len: usize,
    ) -> Result<(), GpuError> {
        let rows = texts.len() * seq_len;
        // Padding rows read token 0 at position 0: finite states that no real token attends to.
        let mut ids = vec![0u32; rows];
        let mut positions = vec![0u32; rows];
        for (i, t) in texts.iter().enumerate() {
            ids[i * seq_len..i * seq_len + t.len()].copy_from_slice(t);
            for (p, pos) in positions[i * seq_len..i * seq_len + t.len()]
                .iter_mut()
                .enumerate()
            {
                *pos = p as u32;
            }
        }
        let lens: Vec<u32> = texts.iter().map(|t| t.len() as u32).collect();
        self.upload_u32s("the token ids", a.ids, &ids)?;
        self.upload_u32s("the positions", a.positions, &positions)?;
        self.upload_u32s("the text lengths", a.lens, &lens)?;

        Ok(())
    }

    /// The embeddings' launches over `rows` rows: word and position embeddings, their
    /// LayerNorm, the states rounded to bf16.
    fn embedding_launches(&self, a: &Activations, rows: usize) -> Vec<PassLaunch> {
        let c = &self.config;
        let (w, k, m, p) = (&self.weights, &self.kernels, rows as u32, Arg::Ptr);
        let emb = k.embed.params.launch(m);
        let mut run = vec![
            (
                "gathering the word embeddings".into(),
                k.embed.id,
                emb,
                vec![p(a.ids), p(w.word), p(a.x), Arg::U32(c.vocab as u32)],
            ),
            (
                "gathering the position embeddings".into(),
                k.embed.id,
                emb,
                vec![
                    p(a.positions),
                    p(w.position_type),
                    p(a.scratch),
                    Arg::U32(c.max_positions as u32),
                ],
            ),
        ];
        run.extend(self.norm_launches(
            "the embedding",
            a,
            m,
            a.scratch,
            &w.embedding_norm,
            a.hidden,
        ));
        run
    }

    /// `out = LayerNorm(a.x + residual)` (f32) over `m` rows, and its bf16 copy in
    /// `a.hidden16`; `what` names them in errors.
    fn norm_launches(
        &self,
        what: &str,
        a: &Activations,
        m: u32,
        residual: DevicePtr,
        n: &NormWeights,
        out: DevicePtr,
    ) -> [PassLaunch; 2] {
        let (k, p) = (&self.kernels, Arg::Ptr);
        let eps = self.config.norm_eps as f32;
        let h = self.config.hidden as u32;
        [
            (
                format!("{what} LayerNorm"),
                k.norm.id,
                k.norm.params.launch(m),
                vec![
                    p(a.x),
                    p(residual),
                    p(n.weight),
                    p(n.bias),
                    p(out),
                    Arg::F32(eps),
                ],
            ),
            (
                format!("{what} rounding to bf16"),
                k.cast.id,
                k.cast.params.launch(m * h),
                vec![p(out), p(a.hidden16), Arg::U32(m * h)],
            ),
        ]
    }

    /// `out = x16·Wᵀ + b` over `m` rows: the bias rows, then the GEMM accumulating onto
    /// them (`width`: the output's columns).
    #[allow(clippy::too_many_arguments)]
    fn dense_launches(
        &self,
        what: &str,
        g: &Kernel<GemmParams>,
        m: u32,
        x16: DevicePtr,
        d: &Dense,
        out: DevicePtr,
        width: u32,
    ) -> [PassLaunch; 2] {
        let (k, p) = (&self.kernels, Arg::Ptr);
        [
            (
                format!("{what} bias"),
                k.bias.id,
                k.bias.params.launch(m),
                vec![p(d.bias), p(out), Arg::U32(width)],
            ),
            (
                format!("{what} projection"),
                g.id,
                g.params.launch(m),
                vec![p(x16), p(d.weight), p(out), Arg::U32(m)],
            ),
        ]
    }

    /// Layer `n`'s launches over `texts` texts of `seq_len` rows each.
    fn layer_launches(
        &self,
        n: usize,
        l: &LayerWeights,
        a: &Activations,
        texts: usize,
        seq_len: usize,
    ) -> Vec<PassLaunch> {
        let c = &self.config;
        let (h, m, ffn) = (c.hidden as u32, (texts * seq_len) as u32, c.ffn as u32);
        let (k, p) = (&self.kernels, Arg::Ptr);
        let at = |what: &str| format!("layer {n}: {what}");
        let mut run = Vec::<PassLaunch>::new();
        run.extend(self.dense_launches(
            &at("q|k|v"),
            &k.gemm_qkv,
            m,
            a.hidden16,
            &l.qkv,
            a.qkv,
            3 * h,
        ));
        run.push((
            at("attention"),
            k.attention.id,
            k.attention.params.launch(texts as u32, seq_len as u32),
            vec![p(a.qkv), p(a.lens), p(a.ctx16), Arg::U32(seq_len as u32)],
        ));
        run.extend(self.dense_launches(
            &at("output"),
            &k.gemm_out,
            m,
            a.ctx16,
            &l.attn_output,
            a.x,
            h,
        ));
        run.extend(self.norm_launches(&at("attention"), a, m, a.hidden, &l.attn_norm, a.hidden2));
        run.extend(self.dense_launches(&at("up"), &k.gemm_up, m, a.hidden16, &l.up, a.up, ffn));
        run.push((
            at("GELU"),
            k.gelu.id,
            k.gelu.params.launch(m * ffn),
            vec![p(a.up), p(a.act16), Arg::U32(m * ffn)],
        ));
        run.extend(self.dense_launches(&at("down"), &k.gemm_down, m, a.act16, &l.down, a.x, h));
        run.extend(self.norm_launches(&at("output"), a, m, a.hidden2, &l.output_norm, a.hidden));
        run
    }

    fn upload_u32s(&mut self, what: &str, at: DevicePtr, v: &[u32]) -> Result<(), GpuError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.exec
            .copy_to_device(at, &bytes)
            .map_err(GpuError::runtime(format!("uploading {what}")))
    }
}

impl Drop for GpuEncoder {
    fn drop(&mut self) {
        for &p in &self.weights.allocations {
            // Nothing to report to at drop; the device memory goes with the context anyway.
            let _ = self.exec.free(p);
        }
    }
}

fn compile(c: &ModelConfig, exec: &mut dyn Executor) -> Result<Kernels, GpuError> {
    let h = c.hidden as u32;
    let embed = EmbedParams {
        format: TableFormat::F32,
        dim: h,
        threads: row_threads(h / 8),
    };
    let norm = NormResidualParams {
        norm: Norm::Layer,
        out: NormOut::F32,
        cols: h,
        threads: row_threads(h / 4),
    };
    let cast = ToBf16Params {
        activation: Activation::Identity,
        out: Scalar::BF16,
        threads: 256,
    };
    let gelu = ToBf16Params {
        activation: Activation::GeluErf,
        out: Scalar::BF16,
        threads: 256,
    };
    let bias = BiasRowsParams { threads: 128 };
    let attention = EncoderAttentionParams {
        head_dim: c.head_dim as u32,
        n_heads: c.heads as u32,
        warps: ATTENTION_WARPS,
    };
    let gemm = |n: usize, k: usize| GemmParams {
        operands: Operands::Bf16,
        format: BFormat::Bf16,
        epilogue: Epilogue::Accumulate,
        n: n as u32,
        k: k as u32,
        bm: 64,
        bn: 64,
        wn: 32,
        stages: 3,
        core: Core::MmaSync,
    };
    let (qkv, out, up, down) = (
        gemm(3 * c.hidden, c.hidden),
        gemm(c.hidden, c.hidden),
        gemm(c.ffn, c.hidden),
        gemm(c.hidden, c.ffn),
    );
    Ok(Kernels {
        embed: kernel(
            exec,
            embed,
            quench_kernels::embed::build,
            "the embedding gather",
        )?,
        norm: kernel(
            exec,
            norm,
            quench_kernels::norm_residual::build,
            "the LayerNorm",
        )?,
        cast: kernel(
            exec,
            cast,
            quench_kernels::to_bf16::build,
            "the bf16 rounding",
        )?,
        gelu: kernel(exec, gelu, quench_kernels::to_bf16::build, "GELU")?,
        bias: kernel(exec, bias, quench_kernels::bias::build, "the biases")?,
        attention: kernel(
            exec,
            attention,
            quench_kernels::encoder_attention::build,
            "the attention",
        )?,
        gemm_qkv: kernel(
            exec,
            qkv,
            quench_kernels::gemm::build,
            "the q|k|v projection",
        )?,
        gemm_out: kernel(
            exec,
            out,
            quench_kernels::gemm::build,
            "the output projection",
        )?,
        gemm_up: kernel(exec, up, quench_kernels::gemm::build, "the up projection")?,
        gemm_down: kernel(
            exec,
            down,
            quench_kernels::gemm::build,
            "the down projection",
        )?,
    })
}

/// Builds the kernel of `params` and loads it on `exec`; `part` names it in an error.
fn kernel<P>(
    exec: &mut dyn Executor,
    params: P,
    build: fn(&P) -> Result<quench_ir::Function, quench_kernels::KernelError>,
    part: &str,
) -> Result<Kernel<P>, GpuError> {
    let f = build(&params).map_err(GpuError::kernel(part))?;
    let id = exec
        .load(&f)
        .map_err(GpuError::runtime(format!("compiling {}", f.name)))?;
    Ok(Kernel { id, params })
}
