//! The GPU plan as text, one line per dispatch, without a device: what `quench info
//! --dispatches` prints, for reading a plan and for comparing two builds' plans line by
//! line. A line names the dispatch, its kernel (name and a fingerprint of its IR), the
//! launch and every argument: buffers by name and byte offset, weights by the tensors
//! they hold, values as passed.

use std::path::Path;

use quench_ir::Function;

use super::catalog::Catalog;
use super::graph::DecodeGraph;
use super::plan::{Buffer, Dispatch, Operand, Region};
use super::prefill::PrefillPlan;
use super::weights::{WeightData, WeightGroup};
use super::{decoder, gpu_options};
use crate::checkpoint;
use crate::error::Result;
use crate::options::LoadOptions;

/// The dispatches of a decode step of `rows` rows of the decoder at `path`, loaded as
/// `options` say (the step built for `options.max_batch` rows, at least `rows`) on a
/// device of 132 multiprocessors (an H100 SXM's or H200's), then, where `chunk` is given,
/// of a prompt chunk of that many tokens.
pub fn dispatch_listing(
    path: &Path,
    options: &LoadOptions,
    rows: u32,
    chunk: Option<u32>,
) -> Result<Vec<String>> {
    let ckpt = checkpoint::open(path)?;
    let config = ckpt.config().map_err(|e| e.in_model(ckpt.path()))?;
    let mut gpu = gpu_options(options);
    gpu.max_batch = gpu.max_batch.max(rows as usize);
    let src = super::stored(&ckpt);
    let naming = ckpt.naming();
    let listing = || -> std::result::Result<Vec<String>, super::GpuError> {
        config.validate()?;
        let catalog = Catalog::choose_for(&config, src, naming, gpu.prefill_chunk > 0)?;
        let sms = super::graph::DEFAULT_MULTIPROCESSORS;
        let (_, graph) = decoder::assemble_step(&config, &catalog, src, naming, &gpu, sms, false)?;
        let mut lines = vec![format!("decode step of {}", plural(rows, "row"))];
        lines.extend(graph.listing(rows));
        if let Some(n) = chunk {
            lines.push(format!("prompt chunk of {}", plural(n, "token")));
            // A model the prompt path cannot take still decodes: say why, as a load does.
            match PrefillPlan::new(&config, &catalog, &graph, n as usize) {
                Ok(plan) => lines.extend(plan.listing(&graph, n)),
                Err(e) => lines.push(format!("not planned, prompts feed one token per step: {e}")),
            }
        }
        Ok(lines)
    };
    listing().map_err(|e| crate::EngineError::from(e).in_model(ckpt.path()))
}

/// How the GPU engine would take the decoder at `path`, from its headers (no device, no
/// weights read): the kernels' catalog, whose [`Catalog::widened`] lists the tensors it
/// would expand to f16; or why the GPU refuses the model.
pub fn gpu_catalog(path: &Path) -> Result<Catalog> {
    let ckpt = checkpoint::open(path)?;
    let config = ckpt.config().map_err(|e| e.in_model(ckpt.path()))?;
    Catalog::choose(&config, super::stored(&ckpt), ckpt.naming())
        .map_err(|e| crate::EngineError::from(e).in_model(ckpt.path()))
}

/// A line per dispatch of `dispatches` (of a program whose kernels and buffers these
/// are) for `n` rows; regions outside the program are named by `graph`, the decode step.
pub(crate) fn lines<'a>(
    dispatches: impl Iterator<Item = &'a Dispatch>,
    kernels: &[Function],
    buffers: &[Buffer],
    graph: &DecodeGraph,
    n: u32,
) -> Vec<String> {
    dispatches
        .map(|d| {
            let args: Vec<String> = d
                .args
                .iter()
                .map(|a| operand(a, n, buffers, graph))
                .collect();
            let launch = d.launch_for(n);
            format!(
                "{} | {} #{:016x} | grid {:?} block {:?} shared {} | {}",
                d.label,
                kernels[d.kernel].name,
                fingerprint(&kernels[d.kernel].to_string()),
                launch.grid,
                launch.block,
                launch.dynamic_shared_bytes,
                args.join(", ")
            )
        })
        .collect()
}

fn operand(op: &Operand, n: u32, buffers: &[Buffer], graph: &DecodeGraph) -> String {
    match *op {
        Operand::At(Region::Act(i), off) => format!("{}+{}", buffers[i].name, off.bytes(n)),
        Operand::At(r, off) => format!("{}+{}", graph.region_text(r), off.bytes(n)),
        Operand::Value(a) => format!("{a:?}"),
        Operand::Rows => "rows".into(),
        Operand::Start => "start".into(),
        Operand::Elements(w) => format!("rows·{w}"),
    }
}

/// A weight group by its parts: stored tensors by name, host-computed values by count.
pub(crate) fn group(g: &WeightGroup) -> String {
    let parts: Vec<String> = g
        .parts
        .iter()
        .map(|(data, _)| match data {
            WeightData::Stored(name) => name.clone(),
            WeightData::Widened(name) => format!("{name} as f16"),
            WeightData::Floats(v) => format!("{} f32", v.len()),
        })
        .collect();
    format!("[{}]", parts.join(" | "))
}

/// `1 row`, `3 rows`.
fn plural(n: u32, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        _ => format!("{n} {what}s"),
    }
}

/// FNV-1a over the kernel's printed IR: equal kernels print equal fingerprints.
fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
