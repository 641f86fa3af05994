//! Grammar masks applied on the device: after a step (or a prompt chunk) has written its
//! rows' logits and their argmax, the rows that have a mask get it (`mask_logits_f32`: every
//! logit the mask does not allow becomes −∞, in place) and the argmax runs again over the
//! rows, so greedy decoding under a grammar reads back one index per row, never the
//! logits. Only steps with a masked row pay for it: two launches and the masks' copy.

use quench_kernels::argmax::{self, ArgmaxParams};
use quench_kernels::mask::{self, MaskParams};
use quench_rt::{Arg, DevicePtr, Executor, KernelId, RtError, StreamId};

use super::decoder::DeviceMemory;
use super::error::GpuError;
use super::graph::row_threads;

/// The mask kernel, an argmax over the step's rows and the buffers the masks go to.
pub(crate) struct Masking {
    params: MaskParams,
    argmax: ArgmaxParams,
    mask_kernel: KernelId,
    argmax_kernel: KernelId,
    /// `[max_batch, words]` u32: the masks of a step, the masked rows' first.
    masks: DevicePtr,
    /// `[max_batch]` u32: the row each mask applies to.
    rows: DevicePtr,
    max_batch: usize,
}

impl Masking {
    /// For logits of `vocab` columns (a multiple of 4, as the argmax kernel needs) and
    /// steps of up to `max_batch` rows.
    pub fn new(mem: &mut DeviceMemory, vocab: u32, max_batch: usize) -> Result<Self, GpuError> {
        let params = MaskParams {
            cols: vocab,
            threads: 256,
        };
        let argmax = ArgmaxParams {
            cols: vocab,
            threads: row_threads(vocab / 4).max(128),
        };
        let built = |what: &str, f: Result<quench_ir::Function, quench_kernels::KernelError>| {
            f.map_err(|e| GpuError::Internal(format!("building {what}: {e}")))
        };
        let mask_fn = built(mask::NAME, mask::build(&params))?;
        let argmax_fn = built(argmax::NAME, argmax::build(&argmax))?;
        let kernels = super::decoder::compile(&mut *mem.exec, &[mask_fn, argmax_fn])?;
        let words = params.words() as u64;
        let masks = mem.alloc(4 * words * max_batch as u64, "the grammar masks")?;
        let rows = mem.alloc(4 * max_batch as u64, "the masked rows' list")?;
        Ok(Masking {
            params,
            argmax,
            mask_kernel: kernels[0],
            argmax_kernel: kernels[1],
            masks,
            rows,
            max_batch,
        })
    }

    /// Applies `masks[i]` (where given) to row `i` of `logits` and writes each of the
    /// first `masks.len()` rows' largest logit's index to `next` again. Nothing runs when
    /// no row has a mask.
    pub fn apply(
        &self,
        exec: &mut dyn Executor,
        masks: &[Option<Vec<u32>>],
        logits: DevicePtr,
        next: DevicePtr,
    ) -> Result<(), RtError> {
        let listed: Vec<(u32, &[u32])> = masks
            .iter()
            .take(self.max_batch)
            .enumerate()
            .filter_map(|(i, m)| m.as_deref().map(|m| (i as u32, m)))
            .collect();
        if listed.is_empty() {
            return Ok(());
        }
        let words = self.params.words() as usize;
        let mut bytes = Vec::with_capacity(4 * words * listed.len());
        let mut rows = Vec::with_capacity(4 * listed.len());
        for (row, mask) in &listed {
            // Words past the mask's end allow nothing.
            let padded = mask.iter().copied().chain(std::iter::repeat(0));
            bytes.extend(padded.take(words).flat_map(u32::to_le_bytes));
            rows.extend(row.to_le_bytes());
        }
        exec.copy_to_device(self.masks, &bytes)?;
        exec.copy_to_device(self.rows, &rows)?;
        let s = StreamId::DEFAULT;
        let args = [Arg::Ptr(logits), Arg::Ptr(self.masks), Arg::Ptr(self.rows)];
        let launch = self.params.launch(listed.len() as u32);
        exec.launch(self.mask_kernel, &launch, &args, s)?;
        let launch = self.argmax.launch(masks.len().min(self.max_batch) as u32);
        exec.launch(
            self.argmax_kernel,
            &launch,
            &[Arg::Ptr(logits), Arg::Ptr(next)],
            s,
        )
    }
}
