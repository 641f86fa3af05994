//! One rank of a tensor-parallel model ([`crate::gpu::TensorParallel`]): its step run a
//! segment at a time, and the buffers the host combines between segments.

use quench_rt::{DevicePtr, StreamId};

use super::{capture, read_logits, write_rows, GpuDecoder, OnDevice};
use crate::gpu::error::GpuError;
use crate::gpu::graph::Reduction;
use crate::gpu::kv::GpuSession;

/// Which program of a rank the ranks' rows are combined in: the decode step or the
/// prompt path's chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Step,
    Chunk,
}

/// A rank's `[rows, hidden]` f32 buffers that the ranks' rows are combined in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RankBuffer {
    /// The residual stream, the same on every rank between segments.
    Residual,
    /// The rank's share of the output or down projection's product.
    Partial,
}

impl GpuDecoder {
    /// How the ranks' rows are combined after each segment but the last.
    pub(crate) fn reductions(&self) -> Vec<Reduction> {
        let d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        d.reductions.iter().map(|&(_, r)| r).collect()
    }

    /// Whether `session` was made by this decoder.
    pub(crate) fn owns(&self, session: &GpuSession) -> bool {
        session.model == self.id
    }

    /// Readies a step of `rows`: takes each session's next KV block and writes the block
    /// tables and the step record, the tokens less `token_base` (the first token of the
    /// rank's share of the vocabulary).
    pub(crate) fn rank_begin(
        &self,
        rows: &mut [(&mut GpuSession, u32)],
        token_base: u32,
    ) -> Result<(), GpuError> {
        for (session, _) in rows.iter_mut() {
            if !self.owns(session) {
                return Err(GpuError::ForeignSession);
            }
            session.reserve_next()?;
        }
        let mut d = self.lock_rank()?;
        let during = |what: &str| format!("a tensor-parallel step: {what}");
        write_rows(&mut d, rows, token_base, &during)
    }

    /// Tokens a chunk of the prompt path takes at most; 0 where the rank has none.
    pub(crate) fn rank_chunk(&self) -> usize {
        self.summary.prefill_chunk
    }

    /// How the ranks' rows are combined in the prompt path's chunks (as in the step).
    pub(crate) fn chunk_reductions(&self) -> Vec<Reduction> {
        let d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let chunk = d.prefill.iter().flat_map(|p| &p.reductions);
        chunk.map(|&(_, r)| r).collect()
    }

    /// Readies a chunk of the prompt path: `tokens` (at most [`GpuDecoder::rank_chunk`])
    /// after the positions `session` holds, which it takes (its blocks included); writes
    /// the chunk's record (tokens less `token_base`) and block tables. Returns the chunk's
    /// first position. On error the session holds what it held before.
    pub(crate) fn rank_chunk_begin(
        &self,
        session: &mut GpuSession,
        tokens: &[u32],
        token_base: u32,
    ) -> Result<u32, GpuError> {
        if !self.owns(session) {
            return Err(GpuError::ForeignSession);
        }
        let start = session.len();
        let mut d = self.lock_rank()?;
        let d = &mut *d;
        let begun = (|| {
            let p = d.prefill.as_ref().ok_or_else(|| {
                GpuError::Internal("a rank without the prompt path was fed a chunk".into())
            })?;
            for _ in tokens {
                session.reserve_next()?;
                session.advance();
            }
            p.begin(
                &mut *d.mem.exec,
                tokens,
                token_base,
                start as u32,
                &session.blocks,
            )
        })();
        if let Err(e) = begun {
            session.truncate(start);
            return Err(e);
        }
        Ok(start as u32)
    }

    /// Launches segment `k` of a chunk of `n` tokens at `start`.
    pub(crate) fn rank_chunk_segment(
        &self,
        k: usize,
        n: usize,
        start: u32,
    ) -> Result<(), GpuError> {
        let mut d = self.lock_rank()?;
        let d = &mut *d;
        match d.prefill.as_ref() {
            Some(p) => p.segment(&mut *d.mem.exec, k, n as u32, start),
            None => Err(GpuError::Internal(
                "a rank without the prompt path was fed a chunk".into(),
            )),
        }
    }

    /// Runs segment `k` of a step of `rows` rows: replays it where the decoder captures
    /// (capturing it the first time), else launches its dispatches.
    pub(crate) fn rank_segment(&self, k: usize, rows: usize) -> Result<(), GpuError> {
        let mut d = self.lock_rank()?;
        let d = &mut *d;
        let start = k.checked_sub(1).map_or(0, |i| d.reductions[i].0);
        let end = d
            .reductions
            .get(k)
            .map_or(d.step.launches.len(), |&(end, _)| end);
        let rows = rows as u32;
        let launches = &d.step.launches[start..end];
        if !d.capture {
            for l in launches.iter().filter(|l| l.rows.includes(rows)) {
                let (launch, args) = l.at(rows, 0);
                d.mem
                    .exec
                    .launch(l.kernel, &launch, &args, StreamId::DEFAULT)
                    .map_err(GpuError::runtime(l.label.clone()))?;
            }
            return Ok(());
        }
        let graph = match d.segment_graphs.get(&(rows, k)) {
            Some(&g) => g,
            None => {
                let g = capture(&mut *d.mem.exec, launches, rows)?;
                d.segment_graphs.insert((rows, k), g);
                g
            }
        };
        d.mem
            .exec
            .replay(graph, StreamId::DEFAULT)
            .map_err(GpuError::runtime(format!(
                "replaying segment {k} of a tensor-parallel step"
            )))
    }

    /// The first `rows` rows of `buffer` of `stage`.
    pub(crate) fn rank_read(
        &self,
        stage: Stage,
        buffer: RankBuffer,
        rows: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let mut d = self.lock_rank()?;
        let at = buffer_at(&d, stage, buffer)?;
        let mut bytes = vec![0u8; 4 * rows * self.config.hidden];
        d.mem
            .exec
            .copy_to_host(at, &mut bytes)
            .map_err(GpuError::runtime("reading a tensor-parallel rank's rows"))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Writes `values` (whole rows) to the start of `buffer` of `stage`.
    pub(crate) fn rank_write(
        &self,
        stage: Stage,
        buffer: RankBuffer,
        values: &[f32],
    ) -> Result<(), GpuError> {
        let mut d = self.lock_rank()?;
        let at = buffer_at(&d, stage, buffer)?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        d.mem
            .exec
            .copy_to_device(at, &bytes)
            .map_err(GpuError::runtime("writing a tensor-parallel rank's rows"))
    }

    /// The logits of the first `rows` rows over the rank's share of the vocabulary.
    pub(crate) fn rank_logits(&self, rows: usize) -> Result<Vec<Vec<f32>>, GpuError> {
        let mut d = self.lock_rank()?;
        let read = read_logits(&mut d, self.config.vocab, &vec![true; rows])
            .map_err(GpuError::runtime("reading a tensor-parallel rank's logits"))?;
        read.into_iter()
            .enumerate()
            .map(|(row, l)| l.ok_or_else(|| super::unread(row)))
            .collect()
    }

    /// The device, refusing a decoder that is not a tensor-parallel rank.
    fn lock_rank(&self) -> Result<std::sync::MutexGuard<'_, OnDevice>, GpuError> {
        let d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        match d.reductions.is_empty() {
            true => Err(GpuError::Internal(
                "a whole model's decoder was stepped as a tensor-parallel rank".into(),
            )),
            false => Ok(d),
        }
    }
}

fn buffer_at(d: &OnDevice, stage: Stage, buffer: RankBuffer) -> Result<DevicePtr, GpuError> {
    let (residual, partial) = match (stage, d.prefill.as_ref()) {
        (Stage::Step, _) => (d.io.residual, d.io.partial),
        (Stage::Chunk, Some(p)) => (p.residual, p.partial),
        (Stage::Chunk, None) => {
            return Err(GpuError::Internal("a rank without the prompt path".into()))
        }
    };
    match buffer {
        RankBuffer::Residual => Ok(residual),
        RankBuffer::Partial => {
            partial.ok_or_else(|| GpuError::Internal("a rank's step without partial sums".into()))
        }
    }
}
