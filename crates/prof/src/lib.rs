//! quench-prof: GPU start and end time of every kernel dispatch, written by the kernels
//! themselves.
//!
//! - [`instrument`] rewrites a kernel so that it records, in a slot of a device ring
//!   buffer, the `%globaltimer` at entry of block 0 and at the end of the last block to
//!   finish. No host wait per dispatch is needed, and replayed graphs record as they run.
//! - [`Ring`] owns the buffer on an executor, hands out slots per launch and reads the
//!   records back as [`Dispatch`]es.
//! - [`trace`] writes a Chrome trace / Perfetto JSON with a GPU lane per stream and a
//!   host lane of [`HostSpans`]; [`summary`] tabulates time per kernel.
//!
//! On the `interp` backend `%globaltimer` is the interpreter's virtual clock (one
//! nanosecond per warp instruction issued), so timings there count instructions.

mod instrument;
mod ring;
pub mod shapes;
pub mod summary;
pub mod trace;

pub use instrument::{instrument, InstrumentError, RING_PARAM, SLOT_PARAM};
pub use ring::{Dispatch, Ring, RingError, RECORD_BYTES};
pub use summary::{summarize, SummaryRow};
pub use trace::{chrome_trace, HostSpan, HostSpans, Span};
