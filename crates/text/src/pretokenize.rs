//! Pre-tokenization: cutting normalized text into the pieces a model encodes one by one.
//!
//! A pre-tokenizer is a list of steps; each step cuts every piece the previous step left.
//! Byte-level tokenizers finally replace each byte of every piece by its printable
//! character (see `byte_level`).

use std::sync::Mutex;

use fancy_regex::Regex;

use crate::byte_level::bytes_to_chars;
use crate::error::{Result, TextError};
use crate::unicode::is_bert_punctuation;

/// GPT-2's pattern as llama.cpp writes it; `ByteLevel(use_regex)` adds a final `|\s+`.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names understood, for error messages.
pub(crate) const GGUF_PRE_NAMES: &str =
    "\"default\", \"gpt2\", \"gpt-2\", \"smollm\", \"starcoder\", \"refact\", \"llama-bpe\", \"llama3\", \"qwen2\"";

/// The regex sequence llama.cpp applies for a `tokenizer.ggml.pre` value.
fn gguf_pre_regexes(name: &str) -> Option<Vec<String>> {
    let gpt2 = GPT2.to_string();
    Some(match name {
        "default" => vec![
            r"[\p{P}\$\+<=>\^~\|]+".to_string(),
            gpt2,
            r"\p{N}+".to_string(),
            "[0-9][0-9][0-9]".to_string(),
        ],
        "gpt2" | "gpt-2" => vec![gpt2],
        "smollm" | "starcoder" | "refact" => vec![r"\p{N}".to_string(), gpt2],
        "llama-bpe" | "llama3" => vec![LLAMA3.to_string()],
        "qwen2" => vec![QWEN2.to_string()],
        _ => return None,
    })
}

/// Whether llama.cpp looks a whole pre-token up in the vocabulary before merging.
pub(crate) fn gguf_pre_ignores_merges(name: &str) -> bool {
    matches!(name, "llama-bpe" | "llama3")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitBehavior {
    /// Matches and the text between them both become pieces.
    Isolated,
    /// Only the text between matches is kept.
    Removed,
}

#[derive(Debug)]
pub(crate) enum Step {
    Split {
        regex: Regex,
        behavior: SplitBehavior,
    },
    /// Digits apart from the rest: each alone, or in runs.
    Digits { individual: bool },
    /// BERT: drop whitespace, isolate each punctuation character.
    BertBasic,
    /// Byte-level `add_prefix_space`: a piece not starting with a space gets one.
    PrefixSpace,
}

/// Compiles `pattern`, reusing a recent compilation of the same text: a pre-tokenizer
/// pattern takes about a millisecond to compile, and the same few (GPT-2's, Llama 3's,
/// Qwen 2's) come back with every tokenizer built (a loaded model, a test, a fuzz input).
fn compile(pattern: &str) -> Result<Regex> {
    /// Patterns kept; the oldest goes first.
    const KEEP: usize = 8;
    static RECENT: Mutex<Vec<(String, Regex)>> = Mutex::new(Vec::new());
    let lock = || RECENT.lock().unwrap_or_else(|e| e.into_inner());
    let found = lock()
        .iter()
        .find(|(p, _)| p == pattern)
        .map(|(_, re)| re.clone());
    if let Some(regex) = found {
        return Ok(regex);
    }
    // Compiled outside the lock: another thread may compile the same pattern meanwhile,
    // which costs only time.
    let regex = Regex::new(pattern).map_err(|e| TextError::Regex {
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    let mut recent = lock();
    if recent.len() == KEEP {
        recent.remove(0);
    }
    recent.push((pattern.to_owned(), regex.clone()));
    Ok(regex)
}

impl Step {
    pub(crate) fn split(pattern: &str, behavior: SplitBehavior) -> Result<Step> {
        let regex = compile(pattern)?;
        Ok(Step::Split { regex, behavior })
    }

    /// The steps of HF's `ByteLevel` pre-tokenizer (its byte mapping is the pre-tokenizer's flag).
    pub(crate) fn byte_level(add_prefix_space: bool, use_regex: bool) -> Result<Vec<Step>> {
        let mut steps = Vec::new();
        if add_prefix_space {
            steps.push(Step::PrefixSpace);
        }
        if use_regex {
            steps.push(Step::split(
                &format!(r"{GPT2}|\s+"),
                SplitBehavior::Isolated,
            )?);
        }
        Ok(steps)
    }

    fn apply(&self, piece: &str, out: &mut Vec<String>) -> Result<()> {
        match self {
            Step::Split { regex, behavior } => {
                let mut last = 0;
                for m in regex.find_iter(piece) {
                    let m = m.map_err(|e| TextError::Regex {
                        pattern: regex.as_str().to_string(),
                        reason: e.to_string(),
                    })?;
                    push_nonempty(out, &piece[last..m.start()]);
                    if *behavior == SplitBehavior::Isolated {
                        push_nonempty(out, m.as_str());
                    }
                    last = m.end();
                }
                push_nonempty(out, &piece[last..]);
            }
            Step::Digits { individual } => split_runs(piece, out, |c| c.is_numeric(), *individual),
            Step::BertBasic => {
                for word in piece.split(char::is_whitespace) {
                    split_runs(word, out, is_bert_punctuation, true);
                }
            }
            Step::PrefixSpace => {
                if piece.starts_with(' ') {
                    out.push(piece.to_string());
                } else {
                    out.push(format!(" {piece}"));
                }
            }
        }
        Ok(())
    }
}

fn push_nonempty(out: &mut Vec<String>, s: &str) {
    if !s.is_empty() {
        out.push(s.to_string());
    }
}

/// Cuts `text` where `is_special` changes; special characters stand alone when `alone`.
fn split_runs(text: &str, out: &mut Vec<String>, is_special: impl Fn(char) -> bool, alone: bool) {
    let mut start = 0;
    let mut run_special = None;
    for (i, c) in text.char_indices() {
        let special = is_special(c);
        if i > start && (run_special != Some(special) || (special && alone)) {
            out.push(text[start..i].to_string());
            start = i;
        }
        run_special = Some(special);
    }
    push_nonempty(out, &text[start..]);
}

#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    byte_level: bool,
}

impl PreTokenizer {
    pub(crate) fn new(steps: Vec<Step>, byte_level: bool) -> Self {
        PreTokenizer { steps, byte_level }
    }

    /// The byte-level pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
    pub(crate) fn from_gguf_pre(name: &str) -> Result<Self> {
        let regexes = gguf_pre_regexes(name)
            .ok_or_else(|| TextError::UnknownPreTokenizer(name.to_string(), GGUF_PRE_NAMES))?;
        let steps = regexes
            .iter()
            .map(|r| Step::split(r, SplitBehavior::Isolated))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer::new(steps, true))
    }

    pub(crate) fn pieces(&self, text: &str) -> Result<Vec<String>> {
        let mut pieces = vec![text.to_string()];
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len());
            for piece in &pieces {
                step.apply(piece, &mut next)?;
            }
            pieces = next;
        }
        if self.byte_level {
            for piece in &mut pieces {
                *piece = bytes_to_chars(piece);
            }
        }
        pieces.retain(|p| !p.is_empty());
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(steps: Vec<Step>) -> PreTokenizer {
        PreTokenizer::new(steps, false)
    }

    #[test]
    fn gpt2_keeps_one_space_with_the_next_word() {
        let p = plain(vec![Step::split(GPT2, SplitBehavior::Isolated).unwrap()]);
        assert_eq!(
            p.pieces("Hi   there it's").unwrap(),
            ["Hi", "  ", " there", " it", "'s"]
        );
    }

    #[test]
    fn digits_alone_or_in_runs() {
        let alone = plain(vec![Step::Digits { individual: true }]);
        assert_eq!(alone.pieces("ab123c").unwrap(), ["ab", "1", "2", "3", "c"]);
        let runs = plain(vec![Step::Digits { individual: false }]);
        assert_eq!(runs.pieces("ab123c4").unwrap(), ["ab", "123", "c", "4"]);
    }

    #[test]
    fn bert_basic_drops_spaces_and_isolates_punctuation() {
        let p = plain(vec![Step::BertBasic]);
        assert_eq!(
            p.pieces("  don't  stop!!").unwrap(),
            ["don", "'", "t", "stop", "!", "!"]
        );
    }

    #[test]
    fn removed_split_drops_matches() {
        let p = plain(vec![Step::split(r"\s+", SplitBehavior::Removed).unwrap()]);
        assert_eq!(p.pieces(" a  b ").unwrap(), ["a", "b"]);
    }

    #[test]
    fn unknown_gguf_pre_is_refused_by_name() {
        let err = PreTokenizer::from_gguf_pre("mystery-pre").unwrap_err();
        assert!(err.to_string().contains("\"mystery-pre\""), "{err}");
    }
}
