//! The f64 reference for models too large to expand whole.
//!
//! [`Decoder<f64>`](crate::Decoder) keeps every weight in memory as f64: eight bytes a
//! parameter, 64 GB for an 8-billion-parameter model. [`StreamedReference`] computes the same
//! logits teacher-forced over one token sequence, with every position fed as one batch of
//! rows, walking the layers in order and expanding one layer's weights to f64 at a time from
//! the checkpoint (which stays memory-mapped where it is a file). The token embedding is read
//! a row per token and the output projection a chunk of rows at a time.
//!
//! It runs the decoder's own layer code (norms, projections, RoPE tables, attention) in the
//! decoder's operation order, so its logits are the decoder's, bit for bit.

use std::cell::Cell;
use std::ops::{Deref, Range};
use std::time::{Duration, Instant};

use quench_models::{dequant, GgmlType};

use crate::arithmetic::Arithmetic;
use crate::decoder::{check_decoder_config, name, rope_freqs, token_row, Layer};
use crate::error::{CpuError, Result};
use crate::kv_cache::LayerCache;
use crate::load;
use crate::math::rms_norm;
use crate::matrix::{linear, Matrix};
use crate::rope::RopeTable;
use quench_models::arch::ArchError;
use quench_models::arch::ModelConfig;
use quench_models::arch::TensorSource;
use quench_models::arch::{DecoderTensor, Naming};

const F64_BYTES: usize = std::mem::size_of::<f64>();

/// How many bytes of the output projection are expanded to f64 at once by default.
const HEAD_CHUNK_BYTES: usize = 256 << 20;

/// A decoder run in f64 from its checkpoint, one layer in memory at a time.
pub struct StreamedReference<'a> {
    config: ModelConfig,
    src: &'a dyn TensorSource,
    naming: Naming,
    rope_freqs: Vec<f64>,
    head_chunk_rows: usize,
}

/// How far a pass has come, reported after each layer and each chunk of the output projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamProgress {
    /// `done` of the model's `of` layers applied.
    Layer { done: usize, of: usize },
    /// `done` of the `of` vocabulary rows of the output projection applied.
    Head { done: usize, of: usize },
}

/// What one pass held in memory and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamStats {
    /// Tokens fed.
    pub tokens: usize,
    /// Positions whose logits were returned.
    pub positions: usize,
    /// Most f64 weight bytes held at once: one layer, or one chunk of the output projection.
    pub peak_weight_bytes: usize,
    /// Most layers held expanded at once (one, by construction; counted to show it).
    pub peak_layers: usize,
    /// The largest tensor handed out whole as f32 before its conversion to f64: a layer's
    /// largest matrix, or the whole embedding or output projection where the checkpoint
    /// does not store them in a ggml type that can be read a range of rows at a time.
    pub staging_bytes: usize,
    /// An upper estimate of the activations held at once (hidden states, projections,
    /// keys and values, logits).
    pub activation_bytes: usize,
    pub elapsed: Duration,
}

impl StreamStats {
    /// An estimate of the pass's peak host memory beyond the mapped checkpoint.
    pub fn peak_host_bytes(&self) -> usize {
        self.peak_weight_bytes + self.staging_bytes + self.activation_bytes
    }
}

/// The logits of a pass, one row per requested position, and what the pass took.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamedLogits {
    pub logits: Matrix<f64>,
    pub stats: StreamStats,
}

impl<'a> StreamedReference<'a> {
    /// A reference over the decoder in `src`. Only the RoPE frequencies are read now; the
    /// weights are read, and their shapes checked, by each pass.
    pub fn new(config: ModelConfig, src: &'a dyn TensorSource, naming: Naming) -> Result<Self> {
        check_decoder_config(&config)?;
        let rope_freqs = rope_freqs(&config, src, naming)?;
        let head_chunk_rows = (HEAD_CHUNK_BYTES / (config.hidden * F64_BYTES)).max(1);
        Ok(StreamedReference {
            config,
            src,
            naming,
            rope_freqs,
            head_chunk_rows,
        })
    }

    /// Expands the output projection `rows` vocabulary rows at a time (at least one) instead
    /// of the default of 256 MiB of f64.
    pub fn with_head_chunk_rows(mut self, rows: usize) -> Self {
        self.head_chunk_rows = rows.max(1);
        self
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Feeds `tokens` from position 0 as one batch and returns the logits after each token
    /// at `positions` (row `i` for position `positions.start + i`), as
    /// [`Decoder::forward`](crate::Decoder::forward) with [`Logits::All`](crate::Logits::All)
    /// computes them. `progress` hears of each layer and each chunk of the output projection.
    pub fn logits(
        &self,
        tokens: &[u32],
        positions: Range<usize>,
        progress: &mut dyn FnMut(StreamProgress),
    ) -> Result<StreamedLogits> {
        let started = Instant::now();
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(CpuError::NoTokens);
        }
        if n > c.max_positions {
            return Err(CpuError::ContextOverflow {
                limit: c.max_positions,
                used: 0,
                added: n,
            });
        }
        if positions.is_empty() || positions.end > n {
            return Err(CpuError::Positions {
                start: positions.start,
                end: positions.end,
                tokens: n,
            });
        }
        let rows: Vec<usize> = tokens
            .iter()
            .map(|&t| token_row(t, c.vocab))
            .collect::<Result<_>>()?;
        let ledger = Ledger::default();

        let embedding_name = name(DecoderTensor::TokenEmbedding, self.naming);
        let embedding = RowReader::open(self.src, &embedding_name, c.vocab, c.hidden)?;
        let mut x = Matrix::zeros(n, c.hidden);
        for (t, &row) in rows.iter().enumerate() {
            x.row_mut(t)
                .copy_from_slice(embedding.rows(row..row + 1)?.as_slice());
        }
        let mut staging = embedding.staging_bytes();
        drop(embedding);

        let rope = RopeTable::<f64>::new(&self.rope_freqs, 0, n);
        for i in 0..c.layers {
            let loaded = Layer::<f64>::load(c, self.src, self.naming, i)?;
            let bytes = loaded.held_bytes();
            let layer = ledger.hold(loaded, bytes, Held::Layer);
            // Keys and values live for this layer only: the whole sequence is one batch.
            let mut kv = LayerCache {
                keys: Vec::new(),
                values: Vec::new(),
            };
            layer.attention_block(c, &mut x, &rope, 0, &mut kv, Arithmetic::F32);
            layer.ffn_block(c, &mut x, Arithmetic::F32);
            progress(StreamProgress::Layer {
                done: i + 1,
                of: c.layers,
            });
        }
        staging = staging.max(c.ffn.max(c.heads * c.head_dim) * c.hidden * 4);

        let mut h = Matrix::zeros(positions.len(), c.hidden);
        for (i, p) in positions.clone().enumerate() {
            h.row_mut(i).copy_from_slice(x.row(p));
        }
        drop(x);
        let output_norm = load::vector::<f64>(
            self.src,
            &name(DecoderTensor::OutputNorm, self.naming),
            c.hidden,
        )?;
        for t in 0..h.rows() {
            rms_norm(h.row_mut(t), &output_norm, c.norm_eps);
        }
        let logits = self.head(&h, &ledger, &mut staging, progress)?;

        let stats = StreamStats {
            tokens: n,
            positions: positions.len(),
            peak_weight_bytes: ledger.peak_bytes.get(),
            peak_layers: ledger.peak_layers.get(),
            staging_bytes: staging,
            activation_bytes: self.activation_bytes(n, positions.len()),
            elapsed: started.elapsed(),
        };
        Ok(StreamedLogits { logits, stats })
    }

    /// The output projection of the normed hidden states `h`, a chunk of vocabulary rows
    /// expanded at a time (the token embedding where the two are tied).
    fn head(
        &self,
        h: &Matrix<f64>,
        ledger: &Ledger,
        staging: &mut usize,
        progress: &mut dyn FnMut(StreamProgress),
    ) -> Result<Matrix<f64>> {
        let c = &self.config;
        let tensor = if c.tied_embeddings {
            DecoderTensor::TokenEmbedding
        } else {
            DecoderTensor::Output
        };
        let reader = RowReader::open(self.src, &name(tensor, self.naming), c.vocab, c.hidden)?;
        *staging = (*staging).max(reader.staging_bytes());
        let mut logits = Matrix::zeros(h.rows(), c.vocab);
        let mut first = 0;
        while first < c.vocab {
            let end = (first + self.head_chunk_rows).min(c.vocab);
            let chunk = reader.rows(first..end)?;
            let bytes = chunk.as_slice().len() * F64_BYTES;
            let chunk = ledger.hold(chunk, bytes, Held::HeadChunk);
            let part = linear(h, &*chunk, None);
            for t in 0..h.rows() {
                logits.row_mut(t)[first..end].copy_from_slice(part.row(t));
            }
            first = end;
            progress(StreamProgress::Head {
                done: end,
                of: c.vocab,
            });
        }
        Ok(logits)
    }

    /// An upper estimate of the activation bytes held at once by a pass over `n` tokens that
    /// returns `positions` rows: the largest of the attention block, the feed-forward block
    /// and the output projection, each with the transposed copy a projection makes.
    fn activation_bytes(&self, n: usize, positions: usize) -> usize {
        let c = &self.config;
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let attention = n * (4 * c.hidden + 3 * q + 4 * kv);
        let ffn = n * (2 * c.hidden + 3 * c.ffn);
        let chunk = self.head_chunk_rows.min(c.vocab);
        let head = n * c.hidden + positions * (c.hidden + c.vocab + 2 * chunk);
        attention.max(ffn).max(head) * F64_BYTES
    }
}

/// A `[rows, cols]` checkpoint tensor read as f64 a range of rows at a time.
enum RowReader<'s> {
    /// Stored in a ggml type: each range is dequantized from its own bytes (ggml blocks never
    /// straddle rows, so a range comes out as it would from the whole tensor).
    Stored {
        name: String,
        ggml_type: GgmlType,
        bytes: &'s [u8],
        row_bytes: usize,
        cols: usize,
    },
    /// Handed out whole as f32 by the source, kept while its rows are read.
    Whole { data: Vec<f32>, cols: usize },
}

impl<'s> RowReader<'s> {
    fn open(src: &'s dyn TensorSource, name: &str, rows: usize, cols: usize) -> Result<Self> {
        if let Some(raw) = src.raw(name)? {
            if raw.dims != [rows, cols] {
                return Err(CpuError::from(ArchError::Shape {
                    name: name.to_owned(),
                    expected: vec![rows, cols],
                    found: raw.dims,
                }));
            }
            let row_bytes = raw.ggml_type.bytes_for(cols as u64).map(|b| b as usize);
            if let Some(row_bytes) =
                row_bytes.filter(|b| rows.checked_mul(*b) == Some(raw.bytes.len()))
            {
                return Ok(RowReader::Stored {
                    name: name.to_owned(),
                    ggml_type: raw.ggml_type,
                    bytes: raw.bytes,
                    row_bytes,
                    cols,
                });
            }
        }
        // Sources without stored bytes, and layouts a range cannot be cut from: read whole
        // (which checks the shape, and names what is wrong with the bytes).
        let data = load::matrix::<f32>(src, name, rows, cols)?.into_vec();
        Ok(RowReader::Whole { data, cols })
    }

    /// Rows `range` as an f64 matrix.
    fn rows(&self, range: Range<usize>) -> Result<Matrix<f64>> {
        let count = range.len();
        let (values, cols) = match self {
            RowReader::Stored {
                name,
                ggml_type,
                bytes,
                row_bytes,
                cols,
            } => {
                let mut f32s = vec![0.0f32; count * cols];
                let bytes = &bytes[range.start * row_bytes..range.end * row_bytes];
                dequant::dequantize_into(*ggml_type, bytes, &mut f32s).map_err(|e| {
                    CpuError::from(ArchError::Tensor {
                        name: name.clone(),
                        source: Box::new(e),
                    })
                })?;
                (f32s.into_iter().map(f64::from).collect(), *cols)
            }
            RowReader::Whole { data, cols } => (
                data[range.start * cols..range.end * cols]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect(),
                *cols,
            ),
        };
        Ok(Matrix::from_vec(count, cols, values).expect("a whole number of rows"))
    }

    /// Bytes of f32 held for the whole tensor (none when ranges are read from storage).
    fn staging_bytes(&self) -> usize {
        match self {
            RowReader::Stored { .. } => 0,
            RowReader::Whole { data, .. } => data.len() * std::mem::size_of::<f32>(),
        }
    }
}

/// What a ledger entry holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    Layer,
    HeadChunk,
}

/// Counts the expanded weights a pass holds at once: each is held through [`Ledger::hold`]
/// and released when its holder is dropped.
#[derive(Default)]
struct Ledger {
    bytes: Cell<usize>,
    peak_bytes: Cell<usize>,
    layers: Cell<usize>,
    peak_layers: Cell<usize>,
}

impl Ledger {
    fn hold<V>(&self, value: V, bytes: usize, kind: Held) -> Holder<'_, V> {
        self.bytes.set(self.bytes.get() + bytes);
        self.peak_bytes
            .set(self.peak_bytes.get().max(self.bytes.get()));
        if kind == Held::Layer {
            self.layers.set(self.layers.get() + 1);
            self.peak_layers
                .set(self.peak_layers.get().max(self.layers.get()));
            debug_assert!(
                self.layers.get() == 1,
                "a streamed pass holds {} layers at once",
                self.layers.get()
            );
        }
        Holder {
            value,
            bytes,
            kind,
            ledger: self,
        }
    }
}

/// A value counted by a [`Ledger`] while it lives.
struct Holder<'l, V> {
    value: V,
    bytes: usize,
    kind: Held,
    ledger: &'l Ledger,
}

impl<V> Deref for Holder<'_, V> {
    type Target = V;
    fn deref(&self) -> &V {
        &self.value
    }
}

impl<V> Drop for Holder<'_, V> {
    fn drop(&mut self) {
        let l = self.ledger;
        l.bytes.set(l.bytes.get() - self.bytes);
        if self.kind == Held::Layer {
            l.layers.set(l.layers.get() - 1);
        }
    }
}
