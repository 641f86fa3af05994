//! The id ↔ token-text table every model shares.

use std::collections::HashMap;

use crate::error::{Result, TextError};

#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Vocab {
    /// A vocabulary from tokens in id order. When a text appears twice the later id is the
    /// one text lookups find (as llama.cpp and a Python dict both do).
    pub(crate) fn new(tokens: Vec<String>) -> Result<Self> {
        if tokens.is_empty() {
            return Err(TextError::NoVocab);
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(TextError::bad_field("vocab", "more than 2^32 tokens"));
        }
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Ok(Vocab { tokens, ids })
    }

    /// A vocabulary from a text → id map whose ids must cover 0..n without holes.
    pub(crate) fn from_map(map: HashMap<String, u32>) -> Result<Self> {
        let mut tokens = vec![None; map.len()];
        for (text, id) in map {
            let slot = tokens
                .get_mut(id as usize)
                .ok_or(TextError::VocabHole(id))?;
            *slot = Some(text);
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.ok_or(TextError::VocabHole(i as u32)))
            .collect::<Result<Vec<_>>>()?;
        Vocab::new(tokens)
    }

    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub(crate) fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Checks that `id` names a token; `what` says where the id came from.
    pub(crate) fn check_id(&self, what: &'static str, id: u64) -> Result<u32> {
        match u32::try_from(id) {
            Ok(id) if (id as usize) < self.tokens.len() => Ok(id),
            _ => Err(TextError::IdOutOfRange {
                what,
                id,
                vocab_size: self.tokens.len(),
            }),
        }
    }
}
