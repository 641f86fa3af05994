//! Whether dispatches that were serialized ran one after another: launches on one stream
//! of one step start no earlier than the previous one ended.

use std::collections::HashMap;

use crate::Dispatch;

/// Two dispatches of one step and stream, consecutive in submission order, where the
/// second began before the first ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub step: Option<u32>,
    pub stream: u32,
    /// Indices into the dispatches checked.
    pub first: usize,
    pub second: usize,
    /// How long before the first's end the second began, in nanoseconds.
    pub by_ns: u64,
}

/// What [`check_order`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrderCheck {
    /// Consecutive pairs compared.
    pub pairs: usize,
    pub overlaps: Vec<Overlap>,
}

/// Compare every dispatch with the previous one of the same step and stream, the
/// dispatches taken in submission order (the order given). A dispatch whose record saw
/// no launch (`launches == 0`) holds an earlier launch's times and is left out.
pub fn check_order(dispatches: &[Dispatch]) -> OrderCheck {
    let mut previous: HashMap<(Option<u32>, u32), usize> = HashMap::new();
    let mut check = OrderCheck::default();
    for (i, d) in dispatches
        .iter()
        .enumerate()
        .filter(|(_, d)| d.launches > 0)
    {
        if let Some(p) = previous.insert((d.step, d.stream), i) {
            check.pairs += 1;
            let before = &dispatches[p];
            if d.start_ns < before.end_ns {
                check.overlaps.push(Overlap {
                    step: d.step,
                    stream: d.stream,
                    first: p,
                    second: i,
                    by_ns: before.end_ns - d.start_ns,
                });
            }
        }
    }
    check
}
