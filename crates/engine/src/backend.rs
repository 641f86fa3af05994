//! The one trait every decoder backend implements: feed a batch of sequences' tokens, get
//! the logits of each one's last token.
//!
//! Generation ([`crate::generate`]), [`crate::CausalModel`] and the server's scheduler
//! drive a model only through [`Decode`]; they never name a backend. The backends today are
//! the CPU decoders (f64 reference, f32; [`crate::cpu`]) and the GPU decoder on any
//! executor ([`crate::gpu`]). A backend keeps each sequence's KV state in a [`Sequence`] of
//! its own type, made by [`Decode::new_sequence`] and handed back in every feed.

use std::any::Any;

use crate::error::{EngineError, Result};
use crate::generate::constrain::apply_mask;
use crate::generate::{argmax, ConstrainError};

/// The KV state of one sequence in one backend: the positions it holds.
pub trait Sequence: Send + Any {
    /// Positions held.
    fn len(&self) -> usize;
    /// Whether it holds no position yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Most positions it can hold.
    fn limit(&self) -> usize;
    /// Forgets every position from `len` on (a backend may forget more, where it shares the
    /// positions just before `len` with another sequence: [`Sequence::len`] tells).
    fn truncate(&mut self, len: usize);
    /// A new sequence holding a prefix of this one's positions (all of them, or as many as
    /// the backend shares without copying), for continuing one prompt in several ways.
    fn fork(&self) -> Box<dyn Sequence>;
    /// The sequence as its backend's own type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What a feed gives back for one item: the logits of its last token, or the token
/// greedy decoding picks from them ([`Decode::feed_picking`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Fed {
    Logits(Vec<f32>),
    Token(u32),
}

impl Fed {
    /// The logits, where they were read back.
    pub fn into_logits(self) -> Result<Vec<f32>> {
        match self {
            Fed::Logits(l) => Ok(l),
            Fed::Token(_) => Err(EngineError::NoLogits),
        }
    }

    /// The token picked, where one was.
    pub fn token(&self) -> Option<u32> {
        match self {
            Fed::Token(t) => Some(*t),
            Fed::Logits(_) => None,
        }
    }
}

/// Per item of a feed, a grammar's mask of the tokens allowed next (or none), given when
/// asked for.
pub type Masks<'a> = &'a dyn Fn() -> Vec<Option<Vec<u32>>>;

/// One sequence's share of a feed: `tokens` go after the positions `sequence` holds, at
/// positions `sequence.len()..sequence.len() + tokens.len()`.
pub struct Rows<'a> {
    pub sequence: &'a mut dyn Sequence,
    pub tokens: &'a [u32],
}

/// A decoder-only language model on some device.
pub trait Decode: Send + Sync + Any {
    /// Most positions one sequence holds.
    fn context_limit(&self) -> usize;

    /// An empty sequence holding up to `limit` positions (at most [`Decode::context_limit`]).
    fn new_sequence(&self, limit: usize) -> Box<dyn Sequence>;

    /// Most sequences one call of [`Decode::feed`] runs together in a step; more are run
    /// in groups of this many.
    fn max_batch(&self) -> usize;

    /// Feeds each item's tokens after its sequence and returns, per item in order, the
    /// logits of its last token. The logits of an item do not depend on the other items.
    /// An item that cannot run (a sequence of another backend, no tokens, a full context,
    /// a token outside the vocabulary) fails alone; a failed item's sequence holds the
    /// positions whose steps completed.
    fn feed(&self, items: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>>;

    /// As [`Decode::feed`], where each item with `picks[i]` set gets back only the next
    /// token of greedy decoding: the index of its last token's largest logit among those
    /// its mask allows (`masks()[i]`, a grammar's mask as [`apply_mask`] reads it; every
    /// token where it gives none). `masks` is called once the step runs or after it, so
    /// that masks computed meanwhile on another thread are waited for as late as
    /// possible. A backend on a device applies the masks and picks the tokens there,
    /// reading back one index instead of the logits; this default masks and picks on the
    /// host.
    fn feed_picking(
        &self,
        items: &mut [Rows<'_>],
        picks: &[bool],
        masks: Masks<'_>,
    ) -> Vec<Result<Fed>> {
        let fed = self.feed(items);
        let masks = if picks.contains(&true) {
            masks()
        } else {
            vec![]
        };
        fed.into_iter()
            .enumerate()
            .map(|(i, logits)| match picks.get(i) {
                Some(true) => {
                    let mask = masks.get(i).and_then(Option::as_deref);
                    host_greedy(logits?, mask).map(Fed::Token)
                }
                _ => logits.map(Fed::Logits),
            })
            .collect()
    }

    /// The backend as its own type, for callers that need what only it has (a GPU
    /// decoder's timings and dispatch list).
    fn as_any(&self) -> &dyn Any;
}

/// `sequence` as the backend type `S`, or the error of a sequence made by another model.
pub(crate) fn own<S: Sequence>(sequence: &mut dyn Sequence) -> Result<&mut S> {
    sequence
        .as_any_mut()
        .downcast_mut::<S>()
        .ok_or(EngineError::ForeignSession)
}

/// Feeds `tokens` after the positions of one `sequence`; the greedy next token under
/// `mask` ([`Decode::feed_picking`]).
pub(crate) fn pick_one(
    backend: &dyn Decode,
    sequence: &mut dyn Sequence,
    tokens: &[u32],
    mask: &dyn Fn() -> Option<Vec<u32>>,
) -> Result<u32> {
    let mut rows = [Rows { sequence, tokens }];
    let fed = backend.feed_picking(&mut rows, &[true], &|| vec![mask()]);
    match fed.into_iter().next() {
        Some(Ok(Fed::Token(t))) => Ok(t),
        Some(Err(e)) => Err(e),
        _ => Err(EngineError::NoLogits),
    }
}

/// Feeds `tokens` after the positions of one `sequence`: the logits of the last.
pub(crate) fn feed_one(
    backend: &dyn Decode,
    sequence: &mut dyn Sequence,
    tokens: &[u32],
) -> Result<Vec<f32>> {
    let mut rows = [Rows { sequence, tokens }];
    backend
        .feed(&mut rows)
        .pop()
        .unwrap_or(Err(EngineError::NoLogits))
}

/// Greedy decoding's next token from `logits` on the host, under `mask` where there is
/// one: refuses NaN and +infinity logits as sampling does, and a mask that leaves no finite
/// logit.
pub(crate) fn host_greedy(mut logits: Vec<f32>, mask: Option<&[u32]>) -> Result<u32> {
    if logits.iter().any(|v| v.is_nan()) {
        return Err(EngineError::BadLogits { what: "NaN" });
    }
    if logits.contains(&f32::INFINITY) {
        return Err(EngineError::BadLogits { what: "+infinity" });
    }
    let finite = match mask {
        Some(words) => {
            if !apply_mask(words, &mut logits) {
                return Err(ConstrainError::NoToken.into());
            }
            true
        }
        None => logits.iter().any(|&v| v != f32::NEG_INFINITY),
    };
    match argmax(&logits) {
        Some(token) if finite => Ok(token),
        _ => Err(EngineError::BadLogits {
            what: "no finite value",
        }),
    }
}
