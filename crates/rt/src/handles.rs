//! What both backends check about the handles they gave out and about open captures.

use crate::error::RtError;

/// Entry `id` of a table of handles (`None`: released), or the error naming it unknown.
pub(crate) fn lookup<T: Copy>(
    table: &[Option<T>],
    kind: &'static str,
    id: u32,
) -> Result<T, RtError> {
    table
        .get(id as usize)
        .copied()
        .flatten()
        .ok_or(RtError::UnknownHandle {
            kind,
            id: id as u64,
        })
}

/// Refuses `what`, an operation that cannot be part of a graph, while one of the streams
/// `capturing` is recording one.
pub(crate) fn refuse_during_capture(
    mut capturing: impl Iterator<Item = u32>,
    what: &str,
) -> Result<(), RtError> {
    match capturing.next() {
        Some(s) => Err(RtError::Capture {
            message: format!("{what} is not allowed while stream {s} is capturing"),
        }),
        None => Ok(()),
    }
}
