//! Structured output: a grammar (JSON, JSON that a schema describes, or a Lark grammar) enforced while
//! decoding, by masking the logits of every token the grammar does not allow next.
//!
//! [`Grammars`] is built once per model from its tokenizer (each token's bytes in a trie,
//! with llguidance); it compiles an [`OutputFormat`] into a [`Constraint`] per request.
//! Each step the caller asks the constraint to [`mask`](Constraint::mask) the logits, samples
//! as usual, then [`commit`](Constraint::commit)s the drawn token. End-of-sequence tokens are
//! allowed only where the grammar may end, and once the grammar can go no further
//! [`Constraint::finished`] says so.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use quench_text::Tokenizer;
use serde_json::{json, Value};

/// What a reply must be.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON that validates against `schema`. Without `strict`, keywords the compiler does
    /// not know are ignored instead of refused.
    JsonSchema { schema: Value, strict: bool },
    /// Text that a grammar in llguidance's Lark dialect derives (which can hold JSON
    /// Schemas as `%json {...}`).
    Lark(String),
}

/// Why a grammar could not be built or followed.
#[derive(Debug, thiserror::Error)]
pub enum ConstrainError {
    #[error("the tokenizer's vocabulary cannot be used for structured output: {0}")]
    Vocabulary(String),
    #[error("{0}")]
    Grammar(String),
    #[error("structured output failed while decoding: {0}")]
    Decoding(String),
    #[error("the grammar allows no token of the model's vocabulary here")]
    NoToken,
}

/// The model's tokens as llguidance sees them: a byte trie and greedy tokenization.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    /// Greedy tokenization is not the tokenizer's own, so llguidance forces no tokens.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The byte string each token id stands for, as llguidance's trie takes it: special tokens
/// (and the end-of-sequence tokens, whatever the tokenizer says of them) behind the 0xFF
/// marker so that no text matches them; ids from the tokenizer's size to `len` empty, so that
/// no grammar allows them.
pub fn trie_words(tokenizer: &Tokenizer, eos_ids: &[u32], len: usize) -> Vec<Vec<u8>> {
    (0..len)
        .map(|id| {
            let id = id as u32;
            let Some(bytes) = tokenizer.token_bytes(id) else {
                return Vec::new();
            };
            if tokenizer.is_special(id) || eos_ids.contains(&id) {
                let mut marked = Vec::with_capacity(bytes.len() + 1);
                marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
                marked.extend_from_slice(&bytes);
                marked
            } else {
                bytes
            }
        })
        .collect()
}

/// A model's grammar compiler: the token trie and llguidance's factory over it.
pub struct Grammars {
    factory: ParserFactory,
    /// Logits per step.
    logits_len: usize,
}

impl Grammars {
    /// Builds the trie of `tokenizer`'s tokens for a model whose logits hold `logits_len`
    /// values, with `eos_ids` the tokens that end a reply.
    pub fn new(
        tokenizer: &Tokenizer,
        eos_ids: &[u32],
        logits_len: usize,
    ) -> Result<Self, ConstrainError> {
        let mut len = logits_len.max(tokenizer.vocab_size());
        let mut words = trie_words(tokenizer, eos_ids, len);
        let mut eos: Vec<u32> = eos_ids
            .iter()
            .copied()
            .filter(|&e| (e as usize) < len)
            .collect();
        if eos.is_empty() {
            // llguidance wants an end-of-sequence token: one that no logit stands for.
            words.push(Vec::new());
            eos.push(len as u32);
            len += 1;
        }
        let vocab_size = u32::try_from(len).map_err(|_| {
            ConstrainError::Vocabulary(format!("{len} tokens do not fit a 32-bit id"))
        })?;
        let info = TokRxInfo::new(vocab_size, eos[0]);
        let built = catch_unwind(AssertUnwindSafe(|| {
            let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
            let env: TokEnv = Arc::new(TrieEnv { trie });
            ParserFactory::new_simple(&env)
        }));
        let mut factory = match built {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(ConstrainError::Vocabulary(e.to_string())),
            Err(_) => return Err(ConstrainError::Vocabulary("the token trie failed".into())),
        };
        factory.set_stderr_log_level(0).set_buffer_log_level(0);
        Ok(Grammars {
            factory,
            logits_len,
        })
    }

    /// Compiles `format` for one reply. A schema the compiler refuses gives
    /// [`ConstrainError::Grammar`] with its reason.
    pub fn constraint(&self, format: &OutputFormat) -> Result<Constraint, ConstrainError> {
        let (mut schema, strict) = match format {
            OutputFormat::JsonObject => (json!({"type": "object"}), true),
            OutputFormat::JsonSchema { schema, strict } => (schema.clone(), *strict),
            OutputFormat::Lark(grammar) => {
                return self.compile(TopLevelGrammar::from_lark(grammar.clone()))
            }
        };
        if let Some(object) = schema.as_object_mut() {
            // One line of JSON with the usual separators: free whitespace lets a model
            // wander through blank space until its tokens run out. (llguidance reads its
            // options from the schema; a request's own are replaced.)
            object.insert(
                "x-guidance".into(),
                json!({
                    "whitespace_flexible": false,
                    "item_separator": ", ",
                    "key_separator": ": ",
                    "lenient": !strict,
                }),
            );
        }
        self.compile(TopLevelGrammar::from_json_schema(schema))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstrainError> {
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| ConstrainError::Grammar("the grammar compiler failed".into()))?
            .map_err(|e| ConstrainError::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Grammar(e));
        }
        Ok(Constraint {
            matcher,
            logits_len: self.logits_len,
            steps: 0,
            mask_time: Duration::ZERO,
        })
    }
}

/// One reply's grammar state. A clone continues independently from the same state (the
/// grammar's compiled tables are shared).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    logits_len: usize,
    steps: u64,
    mask_time: Duration,
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to -infinity. Fails when the
    /// grammar has failed, or allows none of the tokens that `logits` holds.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<Duration, ConstrainError> {
        let start = Instant::now();
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstrainError::Decoding(e.to_string()))?;
        let words = mask.as_slice();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                any |= chunk.iter().any(|&v| v != f32::NEG_INFINITY);
                continue;
            }
            for (b, v) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *v = f32::NEG_INFINITY;
                } else {
                    any |= *v != f32::NEG_INFINITY;
                }
            }
        }
        let spent = start.elapsed();
        self.steps += 1;
        self.mask_time += spent;
        if any {
            Ok(spent)
        } else {
            Err(ConstrainError::NoToken)
        }
    }

    /// Takes the drawn `token` into the grammar's state.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstrainError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstrainError::Decoding(e.to_string()))
    }

    /// The grammar is complete and allows nothing more: the reply ends here.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The grammar could end here (an end-of-sequence token is allowed).
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Masks computed so far and the time they took.
    pub fn mask_cost(&self) -> (u64, Duration) {
        (self.steps, self.mask_time)
    }

    /// Logits per step this constraint was built for.
    pub fn logits_len(&self) -> usize {
        self.logits_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::tiny_chat_model;

    fn grammars() -> (Grammars, Vec<u32>, usize) {
        let model = tiny_chat_model(7).unwrap();
        let len = model.info().config.vocab;
        let g = Grammars::new(model.tokenizer(), model.eos_ids(), len).unwrap();
        (g, model.eos_ids().to_vec(), len)
    }

    /// Drives a constraint by always drawing the lowest allowed token of `prefer` first,
    /// else the lowest allowed id.
    fn drive(c: &mut Constraint, len: usize, prefer: &[u32], eos: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        for _ in 0..200 {
            let mut logits = vec![0.0f32; len];
            c.mask(&mut logits).unwrap();
            let allowed = |t: u32| logits[t as usize] != f32::NEG_INFINITY;
            let t = prefer
                .iter()
                .copied()
                .find(|&t| allowed(t))
                .or_else(|| (0..len as u32).find(|&t| allowed(t)))
                .unwrap();
            if eos.contains(&t) {
                break;
            }
            out.push(t);
            c.commit(t).unwrap();
            if c.finished() {
                break;
            }
        }
        out
    }

    #[test]
    fn a_json_object_masks_to_json() {
        let (g, eos, len) = grammars();
        let model = tiny_chat_model(7).unwrap();
        let mut c = g.constraint(&OutputFormat::JsonObject).unwrap();
        let mut logits = vec![0.0f32; len];
        c.mask(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..len)
            .filter(|&i| logits[i] != f32::NEG_INFINITY)
            .collect();
        // The first token opens the object; no special token is ever allowed mid-way.
        assert_eq!(allowed, vec![usize::from(b'{')]);
        assert!(eos.iter().all(|&e| logits[e as usize] == f32::NEG_INFINITY));
        let ids = drive(&mut c, len, &[b'}' as u32], &eos);
        let text = model.tokenizer().decode(&ids, true).unwrap();
        assert_eq!(text, "{}");
        assert!(c.finished());
        assert!(c.mask_cost().0 >= 2);
    }

    #[test]
    fn a_schema_is_followed_and_a_bad_one_refused() {
        let (g, eos, len) = grammars();
        let model = tiny_chat_model(7).unwrap();
        let schema = json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                           "b": {"type": "boolean"}},
            "required": ["n", "b"],
            "additionalProperties": false
        });
        let mut c = g
            .constraint(&OutputFormat::JsonSchema {
                schema,
                strict: true,
            })
            .unwrap();
        let ids = drive(&mut c, len, &[], &eos);
        let text = model.tokenizer().decode(&ids, true).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["n"].is_u64() && v["b"].is_boolean(), "{text}");

        let bad = OutputFormat::JsonSchema {
            schema: json!({"type": "no-such-type"}),
            strict: true,
        };
        let e = g.constraint(&bad).err().unwrap();
        assert!(matches!(e, ConstrainError::Grammar(_)), "{e}");
    }

    #[test]
    fn a_lark_grammar_with_a_schema_inside_is_followed() {
        let (g, eos, len) = grammars();
        let model = tiny_chat_model(7).unwrap();
        let tool = json!({"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"], "additionalProperties": false}}});
        let lark = quench_text::ToolFormat::Hermes.call_grammar(&[&tool], false);
        let mut c = g.constraint(&OutputFormat::Lark(lark)).unwrap();
        let ids = drive(&mut c, len, &[], &eos);
        let text = model.tokenizer().decode(&ids, true).unwrap();
        let parsed = quench_text::ToolFormat::Hermes.parse(&text);
        assert_eq!(parsed.malformed, None, "{text}");
        assert_eq!(parsed.calls.len(), 1, "{text}");
        assert_eq!(parsed.calls[0].name, "add");
        assert!(parsed.calls[0].arguments["a"].is_u64(), "{text}");
        assert!(
            text.starts_with("<tool_call>\n{\"name\": \"add\", \"arguments\": {"),
            "{text}"
        );

        let e = g
            .constraint(&OutputFormat::Lark("start: nowhere".into()))
            .err()
            .unwrap();
        assert!(matches!(e, ConstrainError::Grammar(_)), "{e}");
    }

    #[test]
    fn trie_words_mark_specials_and_pad() {
        let model = tiny_chat_model(7).unwrap();
        let tok = model.tokenizer();
        let words = trie_words(tok, model.eos_ids(), tok.vocab_size() + 2);
        assert_eq!(words[usize::from(b'a')], b"a");
        for &e in model.eos_ids() {
            assert_eq!(words[e as usize][0], TokTrie::SPECIAL_TOKEN_MARKER);
        }
        assert!(words[tok.vocab_size()].is_empty());
    }
}
