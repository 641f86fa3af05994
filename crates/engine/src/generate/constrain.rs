//! Structured output: a grammar (JSON, JSON that a schema describes, or a Lark grammar) enforced while
//! decoding, by masking the logits of every token the grammar does not allow next.
//!
//! [`Grammars`] is built once per model from its tokenizer (each token's bytes in a trie,
//! with llguidance); it compiles an [`OutputFormat`] into a [`Constraint`] per request.
//! Each step the caller asks the constraint to [`mask`](Constraint::mask) the logits, samples
//! as usual, then [`commit`](Constraint::commit)s the drawn token. End-of-sequence tokens are
//! allowed only where the grammar may end, and once the grammar can go no further
//! [`Constraint::finished`] says so.
//!
//! The mask of the next token depends only on the tokens drawn so far, as does the model's
//! next step: [`Constraint::overlap`] computes the mask on another thread while the step
//! runs, so that a step waits only for what the mask takes beyond it.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
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
            next: None,
            steps: 0,
            waited: Duration::ZERO,
            computed: Duration::ZERO,
        })
    }
}

/// Sets every logit that `words` (a grammar's mask: bit `t mod 32` of word `t / 32` set
/// when token `t` is allowed; tokens past its words are not) does not allow to -infinity.
/// Returns whether a logit other than -infinity is left.
pub fn apply_mask(words: &[u32], logits: &mut [f32]) -> bool {
    let mut any = false;
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            any |= chunk.iter().any(|&v| v != f32::NEG_INFINITY);
            continue;
        }
        // Most words of a mask allow nothing.
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
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
    any
}

/// One reply's grammar state. A clone continues independently from the same state (the
/// grammar's compiled tables are shared).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    logits_len: usize,
    /// The next token's mask, computed ahead ([`Constraint::overlap`]).
    next: Option<Result<SimpleVob, String>>,
    steps: u64,
    /// Time the steps waited for masks: computing those not computed ahead, the part of
    /// those computed ahead that outlasted the step, and applying them.
    waited: Duration,
    /// Time spent computing masks, wherever it was spent.
    computed: Duration,
}

/// What [`Constraint::mask_cost`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MaskCost {
    /// Masks applied.
    pub masks: u64,
    /// Time the steps waited for them (computing and applying).
    pub waited: Duration,
    /// Time spent computing them, in the background or not.
    pub computed: Duration,
}

impl Constraint {
    /// Runs `step` (the model's next step, which does not depend on the grammar) while
    /// another thread computes the mask of the token that step's logits will draw; the
    /// next [`Constraint::mask`] uses it. Returns what `step` returned.
    pub fn overlap<T>(&mut self, step: impl FnOnce() -> T) -> T {
        Constraint::overlap_all(&mut [self], step)
    }

    /// As [`Constraint::overlap`] for the constraints of several sequences that one step
    /// moves: a thread computes their masks, one after another, while `step` runs.
    pub fn overlap_all<T>(constraints: &mut [&mut Constraint], step: impl FnOnce() -> T) -> T {
        Constraint::overlap_masks(constraints, |_| step())
    }

    /// As [`Constraint::overlap_all`], for a step that applies the masks itself (greedy
    /// decoding on a device): `step` gets a function that waits for the masks and gives
    /// their words (one per constraint, in order; `None` where computing one failed), to
    /// call once the step is under way. Each token then picked goes through
    /// [`Constraint::check_pick`].
    pub fn overlap_masks<T>(
        constraints: &mut [&mut Constraint],
        step: impl FnOnce(&dyn Fn() -> Vec<Option<Vec<u32>>>) -> T,
    ) -> T {
        if constraints.is_empty() {
            return step(&Vec::new);
        }
        let n = constraints.len();
        let matchers: Vec<&mut Matcher> = constraints.iter_mut().map(|c| &mut c.matcher).collect();
        type Computed = Vec<(Result<SimpleVob, String>, Duration)>;
        let (out, masks, waited) = std::thread::scope(|scope| {
            let ahead = scope.spawn(move || {
                matchers
                    .into_iter()
                    .map(|m| {
                        let start = Instant::now();
                        let mask = m.compute_mask().map_err(|e| e.to_string());
                        (mask, start.elapsed())
                    })
                    .collect::<Computed>()
            });
            let handle = RefCell::new(Some(ahead));
            let done: RefCell<Option<Computed>> = RefCell::new(None);
            let waited = Cell::new(Duration::ZERO);
            let wait = || {
                if let Some(h) = handle.borrow_mut().take() {
                    let start = Instant::now();
                    *done.borrow_mut() = h.join().ok();
                    waited.set(start.elapsed());
                }
                match &*done.borrow() {
                    Some(masks) => masks
                        .iter()
                        .map(|(m, _)| m.as_ref().ok().map(|m| m.as_slice().to_vec()))
                        .collect(),
                    None => vec![None; n],
                }
            };
            let out = step(&wait);
            // Joined here where the step did not ask.
            wait();
            (out, done.into_inner(), waited.get())
        });
        let mut masks = masks.map(Vec::into_iter);
        for c in constraints.iter_mut() {
            let (mask, computed) = masks.as_mut().and_then(Iterator::next).unwrap_or_else(|| {
                let failed = "computing the grammar's mask failed".to_string();
                (Err(failed), Duration::ZERO)
            });
            c.next = Some(mask);
            c.computed += computed;
            c.waited += waited;
        }
        out
    }

    /// As [`Constraint::overlap`] for a step that picks the next token itself under the
    /// mask: `step` gets a function that waits for the mask and gives its words. The
    /// token picked goes through [`Constraint::check_pick`].
    pub fn overlap_pick(
        &mut self,
        step: impl FnOnce(&dyn Fn() -> Option<Vec<u32>>) -> crate::Result<u32>,
    ) -> crate::Result<u32> {
        let picked = Constraint::overlap_masks(&mut [&mut *self], |masks| {
            step(&|| masks().pop().flatten())
        })?;
        Ok(self.check_pick(picked)?)
    }

    /// Takes the place of [`Constraint::mask`] where the model applied the mask and picked
    /// `token` itself: the token must be one the mask allows ([`ConstrainError::NoToken`]
    /// otherwise: the model gave every allowed token -infinity). Returns it.
    pub fn check_pick(&mut self, token: u32) -> Result<u32, ConstrainError> {
        let start = Instant::now();
        let mask = self.take_mask()?;
        self.steps += 1;
        self.waited += start.elapsed();
        if (token as usize) < mask.len() && mask.is_allowed(token) {
            Ok(token)
        } else {
            Err(ConstrainError::NoToken)
        }
    }

    /// Sets every logit the grammar does not allow next to -infinity, with the mask
    /// computed ahead if there is one. Returns the time the caller waited for it. Fails
    /// when the grammar has failed, or allows none of the tokens that `logits` holds.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<Duration, ConstrainError> {
        let start = Instant::now();
        let mask = self.take_mask()?;
        let any = apply_mask(mask.as_slice(), logits);
        let spent = start.elapsed();
        self.steps += 1;
        self.waited += spent;
        if any {
            Ok(spent)
        } else {
            Err(ConstrainError::NoToken)
        }
    }

    /// The next token's mask: the one computed ahead, or computed now.
    fn take_mask(&mut self) -> Result<SimpleVob, ConstrainError> {
        match self.next.take() {
            Some(ahead) => ahead,
            None => {
                let start = Instant::now();
                let mask = self.matcher.compute_mask().map_err(|e| e.to_string());
                self.computed += start.elapsed();
                mask
            }
        }
        .map_err(ConstrainError::Decoding)
    }

    /// Takes the drawn `token` into the grammar's state.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstrainError> {
        // A mask computed ahead was for the state before this token.
        self.next = None;
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

    /// Masks applied so far, the time steps waited for them and the time spent computing
    /// them.
    pub fn mask_cost(&self) -> MaskCost {
        MaskCost {
            masks: self.steps,
            waited: self.waited,
            computed: self.computed,
        }
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
        assert!(c.mask_cost().masks >= 2);
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

    /// Masks computed ahead, beside a step ([`Constraint::overlap_all`], several
    /// constraints at once), are the masks computed in place, at every step of a reply;
    /// a mask computed ahead of a token that was then committed is not used.
    #[test]
    fn masks_computed_ahead_are_the_masks_computed_in_place() {
        let (g, eos, len) = grammars();
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["name", "n"],
            "additionalProperties": false
        });
        let format = OutputFormat::JsonSchema {
            schema,
            strict: true,
        };
        let mut plain = g.constraint(&format).unwrap();
        let mut ahead = [plain.clone(), plain.clone()];
        // Given a mask ahead of each token it then commits, and never one after.
        let mut stale = plain.clone();
        let (mut steps, mut t) = (0, 0u32);
        loop {
            let mut want = vec![0.0f32; len];
            plain.mask(&mut want).unwrap();
            let [a, b] = &mut ahead;
            let ran = Constraint::overlap_all(&mut [a, b], || 7);
            assert_eq!(ran, 7);
            for c in ahead.iter_mut().chain([&mut stale]) {
                let mut got = vec![0.0f32; len];
                c.mask(&mut got).unwrap();
                assert_eq!(got, want, "step {steps}");
            }
            // Draw the allowed token after the last one drawn, to vary the reply.
            let allowed = |t: u32| want[t as usize] != f32::NEG_INFINITY;
            t = (t + 1..len as u32)
                .chain(0..=t)
                .find(|&t| allowed(t))
                .unwrap();
            if eos.contains(&t) {
                break;
            }
            plain.commit(t).unwrap();
            stale.overlap(|| ());
            for c in ahead.iter_mut().chain([&mut stale]) {
                c.commit(t).unwrap();
            }
            steps += 1;
            if plain.finished() {
                break;
            }
        }
        assert!(steps > 5, "{steps}");
        assert!(ahead[0].mask_cost().computed > Duration::ZERO);
    }
}
