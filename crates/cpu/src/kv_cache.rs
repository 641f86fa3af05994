//! The keys and values a decoder has computed so far, per layer.

use crate::real::Real;

/// Keys and values of every position fed so far; one per conversation.
///
/// Made by [`crate::Decoder::new_cache`]. Rows are `kv_heads·head_dim` wide, keys stored after
/// RoPE. Memory grows with use up to `limit` positions.
#[derive(Clone, Debug)]
pub struct KvCache<T> {
    limit: usize,
    len: usize,
    width: usize,
    pub(crate) layers: Vec<LayerCache<T>>,
}

#[derive(Clone, Debug)]
pub(crate) struct LayerCache<T> {
    pub(crate) keys: Vec<T>,
    pub(crate) values: Vec<T>,
}

impl<T: Real> KvCache<T> {
    pub(crate) fn new(layers: usize, width: usize, limit: usize) -> Self {
        KvCache {
            limit,
            len: 0,
            width,
            layers: (0..layers)
                .map(|_| LayerCache {
                    keys: Vec::new(),
                    values: Vec::new(),
                })
                .collect(),
        }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this cache accepts.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Forgets every position from `len` on, so that decoding resumes there (a no-op when
    /// `len` is not below the current length).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for layer in &mut self.layers {
            layer.keys.truncate(len * self.width);
            layer.values.truncate(len * self.width);
        }
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Whether this cache has the shape a model of `layers` layers and key rows of `width`
    /// elements needs.
    pub(crate) fn fits(&self, layers: usize, width: usize) -> bool {
        self.layers.len() == layers && self.width == width
    }

    /// Marks `count` more positions as filled, once every layer has appended its rows.
    pub(crate) fn advance(&mut self, count: usize) {
        self.len += count;
        debug_assert!(self
            .layers
            .iter()
            .all(|l| l.keys.len() == self.len * self.width
                && l.values.len() == self.len * self.width));
    }
}
