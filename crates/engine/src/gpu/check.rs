//! The FP64 check: a greedy generation on a device, judged by the CPU reference in f64
//! teacher-forced on the device's own tokens. Every logit of every step must lie within
//! `0.05 + 0.003·|ref|` of the reference and the device's top token must be the
//! reference's, except at a near-tie: where the reference's own logits for the two tokens
//! are less than `1e-3` apart, either pick is the model's answer (the step counts as a
//! near-tie, and receipts list it). The bound is a constant, fixed before anything is
//! dispatched.

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use quench_cpu::{Decoder, Logits, Matrix, StreamProgress, StreamStats, StreamedReference};
use quench_models::arch::ModelConfig;

use super::error::GpuError;
use crate::backend::{feed_one, Decode};
use crate::checkpoint::{self, Checkpoint};
use crate::error::{EngineError, Result};

/// `|device − reference| ≤ abs + rel·|reference|` for every logit, and the reference's
/// top token picked unless the device's pick is within `near_tie` of it in the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitBound {
    pub abs: f64,
    pub rel: f64,
    pub near_tie: f64,
}

impl LogitBound {
    /// The bound of quench's FP64 check.
    pub const FP64_CHECK: LogitBound = LogitBound {
        abs: 0.05,
        rel: 0.003,
        near_tie: 1e-3,
    };

    pub fn tolerance(&self, reference: f64) -> f64 {
        self.abs + self.rel * reference.abs()
    }
}

/// The logit furthest outside (or least inside) the bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorstLogit {
    pub token: u32,
    pub device: f32,
    pub reference: f64,
    /// `|device − reference| − tolerance`: positive outside the bound.
    pub excess: f64,
}

/// The judgement of one position's logits.
#[derive(Clone, Debug, PartialEq)]
pub struct StepVerdict {
    /// The position whose logits these are (the next token follows it).
    pub position: usize,
    pub device_top1: u32,
    pub reference_top1: u32,
    /// The reference's logit of its top token minus its logit of the device's pick (0
    /// where they agree).
    pub reference_gap: f64,
    /// Whether the picks differ at a near-tie the bound accepts.
    pub near_tie: bool,
    /// Logits outside the bound (a non-finite one always is).
    pub outside: usize,
    pub max_abs_error: f64,
    pub worst: WorstLogit,
}

impl StepVerdict {
    pub fn passed(&self) -> bool {
        self.outside == 0 && (self.device_top1 == self.reference_top1 || self.near_tie)
    }
}

/// The first largest logit (the reference's greedy choice).
fn top1(logits: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Judges one position's device logits against the reference's.
pub fn judge(bound: LogitBound, position: usize, device: &[f32], reference: &[f64]) -> StepVerdict {
    let mut outside = 0;
    let mut max_abs_error = 0.0f64;
    let mut worst = WorstLogit {
        token: 0,
        device: f32::NAN,
        reference: f64::NAN,
        excess: f64::NEG_INFINITY,
    };
    for (i, (&d, &r)) in device.iter().zip(reference).enumerate() {
        let err = (d as f64 - r).abs();
        // NaN compares false: count it outside explicitly.
        let excess = if err.is_finite() {
            err - bound.tolerance(r)
        } else {
            f64::INFINITY
        };
        if excess > 0.0 {
            outside += 1;
        }
        if err.is_finite() {
            max_abs_error = max_abs_error.max(err);
        } else {
            max_abs_error = f64::INFINITY;
        }
        if excess > worst.excess {
            worst = WorstLogit {
                token: i as u32,
                device: d,
                reference: r,
                excess,
            };
        }
    }
    // A device row of another length cannot pass.
    outside += device.len().abs_diff(reference.len());
    let device_top1 = crate::generate::argmax(device).unwrap_or(0);
    let reference_top1 = top1(reference);
    let logit = |t: u32| {
        reference
            .get(t as usize)
            .copied()
            .unwrap_or(f64::NEG_INFINITY)
    };
    let reference_gap = logit(reference_top1) - logit(device_top1);
    StepVerdict {
        position,
        device_top1,
        reference_top1,
        reference_gap,
        near_tie: device_top1 != reference_top1 && reference_gap < bound.near_tie,
        outside,
        max_abs_error,
        worst,
    }
}

/// The f64 CPU reference that judges device runs.
///
/// Loaded from a checkpoint, it streams: each pass walks the layers in order with one
/// layer's weights expanded to f64 at a time ([`StreamedReference`]), so that it fits models
/// whose whole f64 expansion would not fit host memory. Made from a [`Decoder`] already in
/// memory, it runs that.
pub struct Reference {
    model: Model,
    progress: Option<Progress>,
    last_pass: Mutex<Option<StreamStats>>,
}

type Progress = Box<dyn Fn(StreamProgress) + Send + Sync>;

/// What a [`Reference`] runs. (One lives per check, so the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
enum Model {
    /// The checkpoint, mapped; each pass reads the weights it needs.
    Streamed {
        checkpoint: Checkpoint,
        config: ModelConfig,
    },
    Loaded(Decoder<f64>),
}

impl Reference {
    /// Opens the decoder at `path` (a GGUF file or Hugging Face directory) for streamed
    /// passes. Its config is checked now; its weights are read by each pass.
    pub fn load(path: &Path) -> Result<Reference> {
        let checkpoint = checkpoint::open(path)?;
        let config = checkpoint
            .config()
            .map_err(|e| e.in_model(checkpoint.path()))?;
        StreamedReference::new(config.clone(), checkpoint.tensors(), checkpoint.naming())?;
        Ok(Reference::new(Model::Streamed { checkpoint, config }))
    }

    /// A reference that runs `decoder`, already in memory.
    pub fn from_decoder(decoder: Decoder<f64>) -> Reference {
        Reference::new(Model::Loaded(decoder))
    }

    fn new(model: Model) -> Reference {
        Reference {
            model,
            progress: None,
            last_pass: Mutex::new(None),
        }
    }

    /// Reports the progress of each streamed pass to `progress` (layer by layer, then the
    /// output projection chunk by chunk).
    pub fn with_progress(
        mut self,
        progress: impl Fn(StreamProgress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    pub fn config(&self) -> &ModelConfig {
        match &self.model {
            Model::Streamed { config, .. } => config,
            Model::Loaded(decoder) => decoder.config(),
        }
    }

    /// The logits after each of `tokens[from..]` (teacher forcing: all fed at once).
    pub fn logits(&self, tokens: &[u32], from: usize) -> Result<Vec<Vec<f64>>> {
        let rows = |m: &Matrix<f64>, from: usize| -> Vec<Vec<f64>> {
            (from..m.rows()).map(|i| m.row(i).to_vec()).collect()
        };
        match &self.model {
            Model::Streamed { checkpoint, config } => {
                let streamed = StreamedReference::new(
                    config.clone(),
                    checkpoint.tensors(),
                    checkpoint.naming(),
                )?;
                let mut report = |p| {
                    if let Some(f) = &self.progress {
                        f(p)
                    }
                };
                let out = streamed.logits(tokens, from..tokens.len(), &mut report)?;
                *self.last_pass.lock().unwrap_or_else(|e| e.into_inner()) = Some(out.stats);
                Ok(rows(&out.logits, 0))
            }
            Model::Loaded(decoder) => {
                let mut cache = decoder.new_cache_with_limit(tokens.len());
                let all = decoder.forward(&mut cache, tokens, Logits::All)?;
                Ok(rows(&all, from))
            }
        }
    }

    /// What the last streamed pass held and how long it took (`None` before the first, and
    /// for a reference made from a decoder in memory).
    pub fn last_pass(&self) -> Option<StreamStats> {
        self.last_pass
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A checked generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationCheck {
    pub prompt: Vec<u32>,
    /// The device's greedy tokens.
    pub tokens: Vec<u32>,
    /// One verdict per generated token: the logits it was drawn from.
    pub steps: Vec<StepVerdict>,
    /// Host wall time of the prompt's steps, and of each later step (logits read back
    /// included), in milliseconds.
    pub prefill_ms: f64,
    pub step_ms: Vec<f64>,
}

impl GenerationCheck {
    pub fn passed(&self) -> bool {
        self.steps.iter().all(StepVerdict::passed)
    }
}

/// Generates `n` tokens greedily on `device` (a GPU decoder, a tensor-parallel one, or any
/// other backend) after `prompt`, then judges every step's logits with `reference` under
/// `bound`.
pub fn check_generation(
    device: &dyn Decode,
    reference: &Reference,
    bound: LogitBound,
    prompt: &[u32],
    n: usize,
) -> Result<GenerationCheck> {
    if prompt.is_empty() || n == 0 {
        return Err(GpuError::NoTokens.into());
    }
    let limit = device.context_limit();
    if prompt.len() + n - 1 > limit {
        return Err(GpuError::ContextFull {
            limit,
            used: 0,
            added: prompt.len() + n - 1,
        }
        .into());
    }
    let mut session = device.new_sequence(limit);
    let start = Instant::now();
    let mut logits = feed_one(device, &mut *session, prompt)?;
    let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut rows = vec![];
    let mut tokens = vec![];
    let mut step_ms = vec![];
    loop {
        let token = crate::generate::argmax(&logits).unwrap_or(0);
        rows.push(logits);
        tokens.push(token);
        if tokens.len() == n {
            break;
        }
        let start = Instant::now();
        logits = feed_one(device, &mut *session, &[token])?;
        step_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let steps = judge_generation(reference, bound, prompt, &tokens, &rows)?;
    Ok(GenerationCheck {
        prompt: prompt.to_vec(),
        tokens,
        steps,
        prefill_ms,
        step_ms,
    })
}

/// Judges a generation: `rows[i]` are the device logits `tokens[i]` was drawn from, the
/// first after `prompt`. The reference is fed `prompt` and `tokens` but the last (teacher
/// forcing) in one pass.
pub fn judge_generation(
    reference: &Reference,
    bound: LogitBound,
    prompt: &[u32],
    tokens: &[u32],
    rows: &[Vec<f32>],
) -> Result<Vec<StepVerdict>> {
    if prompt.is_empty() || tokens.is_empty() || rows.len() != tokens.len() {
        return Err(EngineError::Unsupported {
            what: format!(
                "judging {} logit rows for a prompt of {} and {} generated tokens",
                rows.len(),
                prompt.len(),
                tokens.len()
            ),
            reason: "a check needs a prompt and one row of logits per generated token".into(),
        });
    }
    let mut forced = prompt.to_vec();
    forced.extend_from_slice(&tokens[..tokens.len() - 1]);
    let want = reference.logits(&forced, prompt.len() - 1)?;
    Ok(rows
        .iter()
        .zip(&want)
        .enumerate()
        .map(|(i, (got, want))| judge(bound, prompt.len() - 1 + i, got, want))
        .collect())
}

impl From<GpuError> for EngineError {
    fn from(e: GpuError) -> EngineError {
        EngineError::Gpu(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_counts_every_logit_outside_and_non_finite_ones() {
        let b = LogitBound::FP64_CHECK;
        let reference = [10.0, -2.0, 0.0, 3.0];
        // 10 ± 0.08, −2 ± 0.056, 0 ± 0.05, 3 ± 0.059.
        let v = judge(b, 5, &[10.07, -2.05, 0.0, 3.0], &reference);
        assert!(v.passed(), "{v:?}");
        assert_eq!((v.position, v.device_top1, v.reference_top1), (5, 0, 0));
        let v = judge(b, 0, &[10.09, -2.0, f32::NAN, 3.0], &reference);
        assert_eq!(v.outside, 2);
        assert_eq!(v.worst.token, 2);
        assert!(!v.passed());
        // Within the bound but another top token, 2e-3 below the reference's top.
        let v = judge(b, 0, &[3.0, 0.0, 0.0, 3.05], &[3.0, 0.0, 0.0, 2.998]);
        assert_eq!(v.outside, 0);
        assert_eq!((v.device_top1, v.reference_top1), (3, 0));
        assert!(
            (v.reference_gap - 2e-3).abs() < 1e-12 && !v.near_tie,
            "{v:?}"
        );
        assert!(!v.passed());
        // Closer than the near-tie: either pick is the reference's answer.
        let v = judge(b, 0, &[3.0, 0.0, 0.0, 3.05], &[3.0, 0.0, 0.0, 2.9995]);
        assert!(v.near_tie && v.passed(), "{v:?}");
        // A device row of another length never passes, whatever it picks.
        let v = judge(b, 0, &[3.0, 0.0], &[3.0, 0.0, 0.0, 2.9995]);
        assert!(!v.passed());
    }
}
