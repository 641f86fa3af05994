//! Fetching weight bytes into the caches ahead of their turn.
//!
//! One token's matrix products stream each weight once; the hardware prefetchers alone left
//! the loads waiting on memory (a 1B model's Q4_K_M decoded in 1.65× the time, a 0.5B
//! model's Q8_0 in 1.5×). Fetching a whole row at its start queues more lines than the core
//! tracks at once, and the fetches then wait too: the products that read rows as stored
//! ask for each block's bytes a fixed distance ahead instead ([`prefetch_ahead`]).

/// How far past the bytes being multiplied the fetches run: a few rows of a decoder's
/// matrices. On two cores of a Xeon, 2–8 KiB decoded a 1B Q4_K_M model equally fast; 512
/// bytes was slower than fetching whole rows.
pub(crate) const AHEAD: usize = 4096;

/// Asks the CPU to fetch `bytes` into its caches.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads nothing architecturally; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
}

/// Fetches the cache lines that begin in the `len` bytes lying [`AHEAD`] past byte `at` of
/// `rows` (those that exist): called for consecutive spans, it asks for each line once, and
/// a span shorter than a line (a 32-element legacy block) asks for one only where a line
/// begins in it.
#[inline(always)]
pub(crate) fn prefetch_ahead(rows: &[u8], at: usize, len: usize) {
    let start = (at + AHEAD).min(rows.len());
    let span = &rows[start..(start + len).min(rows.len())];
    let first = (span.as_ptr() as usize).next_multiple_of(64) - span.as_ptr() as usize;
    if let Some(lines) = span.get(first..) {
        prefetch(lines);
    }
}
