//! Converting one tensor's rows to their GGUF type, on several threads. Each worker
//! expands only the rows it is quantizing, so memory stays at one output tensor plus a row
//! per worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::dequant::{bf16_to_f32, f16_to_f32};
use crate::quant::quantize_into;
use crate::safetensors::Dtype;
use crate::{GgmlType, ModelError};

use super::plan::RowOrder;

/// Rows of one tensor as the checkpoint stores them (row-major, `cols` elements each).
pub struct SourceRows<'a> {
    pub dtype: Dtype,
    pub bytes: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl SourceRows<'_> {
    /// Expands row `r` into `out` (`cols` long).
    fn row_into(&self, r: usize, out: &mut [f32]) {
        let size = self.dtype.size() as usize;
        let bytes = &self.bytes[r * self.cols * size..(r + 1) * self.cols * size];
        match self.dtype {
            Dtype::F16 => expand(bytes, out, |b: [u8; 2]| f16_to_f32(u16::from_le_bytes(b))),
            Dtype::BF16 => expand(bytes, out, |b: [u8; 2]| bf16_to_f32(u16::from_le_bytes(b))),
            // The plan admits only F32, F16 and BF16.
            _ => expand(bytes, out, f32::from_le_bytes),
        }
    }
}

fn expand<const B: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; B]) -> f32) {
    for (o, &b) in out.iter_mut().zip(bytes.as_chunks::<B>().0) {
        *o = f(b);
    }
}

/// Rows handed to a worker at a time: small enough to balance the load, large enough that
/// taking them costs nothing.
const ROWS_PER_TASK: usize = 16;

/// Encodes every row of `src` as `ggml_type`, output row `r` taken from checkpoint row
/// `order.source_row(r)`, on `threads` threads. Errors name the row.
pub fn encode_rows(
    src: &SourceRows<'_>,
    order: RowOrder,
    ggml_type: GgmlType,
    threads: usize,
) -> Result<Vec<u8>, ModelError> {
    let row_bytes = ggml_type
        .bytes_for(src.cols as u64)
        .ok_or_else(|| ModelError::Quantize {
            ggml_type: ggml_type.name(),
            reason: format!("rows of {} elements are not whole blocks", src.cols),
        })? as usize;
    let expected = src.rows * src.cols * src.dtype.size() as usize;
    if src.bytes.len() != expected {
        return Err(ModelError::SizeMismatch {
            what: format!("{} rows of {} {} elements", src.rows, src.cols, src.dtype),
            expected: expected as u64,
            actual: src.bytes.len() as u64,
        });
    }
    let mut out = vec![0u8; src.rows * row_bytes];
    if out.is_empty() {
        return Ok(out);
    }
    let tasks = Mutex::new(out.chunks_mut(ROWS_PER_TASK * row_bytes).enumerate());
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<(usize, ModelError)>> = Mutex::new(None);
    let work = || {
        let mut row = vec![0f32; src.cols];
        loop {
            if failed.load(Ordering::Relaxed) {
                return;
            }
            // The lock guards only the handing out of tasks; a poisoned one means another
            // worker panicked, which the scope reports anyway.
            let Some((task, chunk)) = tasks.lock().ok().and_then(|mut t| t.next()) else {
                return;
            };
            for (i, out_row) in chunk.chunks_mut(row_bytes).enumerate() {
                let r = task * ROWS_PER_TASK + i;
                src.row_into(order.source_row(r), &mut row);
                if let Err(e) = quantize_into(ggml_type, &row, out_row) {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = first_error.lock() {
                        if slot.as_ref().is_none_or(|(at, _)| r < *at) {
                            *slot = Some((r, e));
                        }
                    }
                    return;
                }
            }
        }
    };
    let workers = threads.clamp(1, src.rows.div_ceil(ROWS_PER_TASK));
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(work);
        }
        work();
    });
    match first_error.into_inner().ok().flatten() {
        Some((r, ModelError::Quantize { ggml_type, reason })) => Err(ModelError::Quantize {
            ggml_type,
            reason: format!("row {}: {reason}", order.source_row(r)),
        }),
        Some((_, other)) => Err(other),
        None => Ok(out),
    }
}
