//! quench-prof: GPU start and end time of every kernel dispatch, written by the kernels
//! themselves.
//!
//! - [`instrument`] rewrites a kernel so that it records, in a slot of a device ring
//!   buffer, the `%globaltimer` at entry of block 0 and at the end of the last block to
//!   finish (spread over [`LANES`] words, so that no address takes a reduction from
//!   every block), and counts its launches. No host wait per dispatch is needed, nothing
//!   needs resetting between launches, and replayed graphs record as they run.
//! - [`Ring`] owns the buffer on an executor, hands out slots per launch and reads the
//!   records back as [`Dispatch`]es.
//! - [`History`] keeps a copy of a ring's records per step on the device, made without
//!   a host wait, and reads many steps' records back in one copy.
//! - [`access`] finds which pointer parameters a kernel reads and writes, directly or at
//!   addresses computed from loaded data, for a model of the bytes each dispatch moves.
//! - [`ceiling`] measures the f32 FMA throughput, the compute ceiling of a roofline.
//! - [`order`] checks that the dispatches of each step ran one after another.
//! - [`trace`] writes a Chrome trace / Perfetto JSON with a GPU lane per stream and a
//!   host lane of [`HostSpans`]; [`summary`] tabulates time, bandwidth and FLOP/s per
//!   kernel; [`roofline`] draws them against the ceilings as a PNG.
//!
//! On the `interp` backend `%globaltimer` is the interpreter's virtual clock (one
//! nanosecond per warp instruction issued), so timings there count instructions.

pub mod access;
mod canvas;
pub mod ceiling;
pub mod history;
mod instrument;
pub mod order;
mod ring;
pub mod roofline;
pub mod summary;
pub mod trace;

pub use history::History;
pub use instrument::{instrument, InstrumentError, RING_PARAM, STRIDE_PARAM};
pub use ring::{
    Dispatch, Ring, RingError, FIRST_LANE_PLANE, LANES, LAUNCH_PLANE, PLANES, RECORD_BYTES,
    START_PLANE,
};
pub use summary::{summarize, Ceilings, Summary, SummaryRow};
pub use trace::{chrome_trace, HostSpan, HostSpans, Span};
