//! Request bodies, as OpenAI's API defines them. Fields the server does not act on are
//! read too, so that a request asking for what the server does not do (legacy
//! `functions`, several choices) is refused by name rather than answered as if it
//! had not asked; a field with a value of the wrong type is refused by name. Chat and text
//! completion bodies are read twice: once for the fields they share ([`GenerationFields`]),
//! once for the endpoint's own.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The fields chat and text completion requests share.
#[derive(Debug, Deserialize)]
pub struct GenerationFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Strings>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Completions: candidates drawn to return the best of; only 1 is served.
    pub best_of: Option<i64>,
    pub tools: Option<Vec<serde_json::Value>>,
    pub tool_choice: Option<serde_json::Value>,
    pub functions: Option<Vec<serde_json::Value>>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<serde_json::Value>,
    /// Extensions other servers take as well: keep the `top_k` most likely tokens, drop
    /// those below `min_p` times the most likely one, and divide (multiply, for a negative
    /// logit) the logits of tokens already in the context by `repetition_penalty`.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    /// quench: continue this session (see the `X-Session-Id` header too).
    pub session_id: Option<String>,
    /// quench: draw past end-of-sequence tokens, for answers of a fixed length.
    pub ignore_eos: Option<bool>,
}

/// The fields of a chat completion request besides [`GenerationFields`].
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
}

/// The fields of a text completion request besides [`GenerationFields`].
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Option<PromptInput>,
    /// Completions take the number of alternatives to report.
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Content,
    /// An assistant turn's calls: `[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`, read when the messages are checked.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message: the call it answers, and the tool's name.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// A message's content: a string, or a list of parts of which only text parts are read.
#[derive(Debug, Default)]
pub struct Content(pub Option<String>, pub Option<String>);

impl Content {
    /// The text, or the name of the part type that is not supported.
    pub fn text(&self) -> Result<&str, &str> {
        match (&self.0, &self.1) {
            (_, Some(unsupported)) => Err(unsupported),
            (Some(t), None) => Ok(t),
            (None, None) => Ok(""),
        }
    }
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content(Some(s.to_owned()), None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content(None, None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content(None, None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut text = String::new();
                while let Some(part) = seq.next_element::<ContentPart>()? {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        ("text", None) => return Err(de::Error::missing_field("text")),
                        (other, _) => return Ok(Content(None, Some(other.to_owned()))),
                    }
                }
                Ok(Content(Some(text), None))
            }
        }
        d.deserialize_any(V)
    }
}

/// One string or a list of them (`stop`, the `input` of embeddings).
#[derive(Debug)]
pub struct Strings(pub Vec<String>);

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Strings;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Strings, E> {
                Ok(Strings(vec![s.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strings, A::Error> {
                let mut all = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    all.push(s);
                }
                Ok(Strings(all))
            }
        }
        d.deserialize_any(V)
    }
}

/// A completion prompt: text, or token ids; a list of one of those is accepted too.
#[derive(Debug)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    /// More than one prompt: refused (one completion per request).
    Many(usize),
}

impl<'de> Deserialize<'de> for PromptInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        let token = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        let tokens =
            |items: &[serde_json::Value]| -> Option<Vec<u32>> { items.iter().map(token).collect() };
        let bad = || {
            de::Error::custom(
                "expected a string, an array of token ids, or an array of one of those",
            )
        };
        match &value {
            serde_json::Value::String(s) => Ok(PromptInput::Text(s.clone())),
            serde_json::Value::Array(items) if items.iter().all(|v| v.is_number()) => {
                tokens(items).map(PromptInput::Tokens).ok_or_else(bad)
            }
            serde_json::Value::Array(items) if items.len() == 1 => match &items[0] {
                serde_json::Value::String(s) => Ok(PromptInput::Text(s.clone())),
                serde_json::Value::Array(inner) => {
                    tokens(inner).map(PromptInput::Tokens).ok_or_else(bad)
                }
                _ => Err(bad()),
            },
            serde_json::Value::Array(items)
                if items.iter().all(|v| v.is_string() || v.is_array()) =>
            {
                Ok(PromptInput::Many(items.len()))
            }
            _ => Err(bad()),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    /// The texts to embed.
    pub input: Strings,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
}
