//! A causal model's text side: tokenizer, chat template and the tokens that end a reply.

use quench_engine::generate::{ConstrainError, Grammars};
use quench_engine::{CausalModel, Prompt};
use quench_text::{Message, ToolFormat};
use serde_json::Value;

/// Turns requests into token ids and generated ids back into text.
pub trait TextSide: Send + Sync + 'static {
    /// The prompt of a conversation, ready for the assistant's reply, which may call
    /// `tools` (OpenAI tool definitions; none when empty).
    fn chat_prompt(&self, messages: &[Message], tools: &[Value]) -> Result<Vec<u32>, TextFailure>;
    /// The form the chat template's replies write tool calls in.
    fn tool_format(&self) -> ToolFormat;
    /// A plain-text prompt, with the model's framing tokens (such as BOS).
    fn text_prompt(&self, text: &str) -> Result<Vec<u32>, TextFailure>;
    /// The text of generated ids, special tokens left out.
    fn decode(&self, ids: &[u32]) -> String;
    /// The text of one token on its own, special tokens included (for logprobs).
    fn token_text(&self, id: u32) -> String;
    /// Tokens that end generation when drawn (end of sequence, end of turn).
    fn stop_ids(&self) -> &[u32];
    /// Token ids run from 0 to this, exclusive.
    fn vocab_size(&self) -> usize;
    /// The compiler of `response_format` grammars over the model's tokens.
    fn grammars(&self) -> Result<&Grammars, ConstrainError>;
}

/// Text that the tokenizer or the chat template refused.
#[derive(Debug, thiserror::Error)]
pub enum TextFailure {
    #[error("this model has no chat template; use /v1/completions")]
    NoTemplate,
    #[error("the chat template failed: {0}")]
    Template(String),
    #[error("the text could not be tokenized: {0}")]
    Tokenize(String),
}

impl TextSide for CausalModel {
    fn chat_prompt(&self, messages: &[Message], tools: &[Value]) -> Result<Vec<u32>, TextFailure> {
        if !self.has_chat_template() {
            return Err(TextFailure::NoTemplate);
        }
        self.prompt_tokens(Prompt::ChatWithTools(messages, tools))
            .map_err(|e| TextFailure::Template(e.to_string()))
    }

    fn tool_format(&self) -> ToolFormat {
        CausalModel::tool_format(self).unwrap_or(ToolFormat::Hermes)
    }

    fn text_prompt(&self, text: &str) -> Result<Vec<u32>, TextFailure> {
        self.prompt_tokens(Prompt::Text(text))
            .map_err(|e| TextFailure::Tokenize(e.to_string()))
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.detokenize(ids)
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer().decode(&[id], false).unwrap_or_default()
    }

    fn stop_ids(&self) -> &[u32] {
        self.eos_ids()
    }

    fn vocab_size(&self) -> usize {
        self.info().config.vocab
    }

    fn grammars(&self) -> Result<&Grammars, ConstrainError> {
        CausalModel::grammars(self)
    }
}
