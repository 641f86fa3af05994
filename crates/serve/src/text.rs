//! A causal model's text side: tokenizer, chat template and the tokens that end a reply.

use quench_text::{ChatTemplate, Message, Tokenizer};

/// Turns requests into token ids and generated ids back into text.
pub trait TextSide: Send + Sync + 'static {
    /// The prompt of a conversation, ready for the assistant's reply.
    fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>, TextFailure>;
    /// A plain-text prompt, with the model's framing tokens (such as BOS).
    fn text_prompt(&self, text: &str) -> Result<Vec<u32>, TextFailure>;
    /// The text of generated ids, special tokens left out.
    fn decode(&self, ids: &[u32]) -> String;
    /// The text of one token on its own, special tokens included (for logprobs).
    fn token_text(&self, id: u32) -> String;
    /// Tokens that end generation when drawn (end of sequence, end of turn).
    fn stop_ids(&self) -> &[u32];
}

/// A tokenizer, an optional chat template and the tokens that end a reply.
pub struct ModelText {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    stop_ids: Vec<u32>,
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

impl ModelText {
    /// `stop_ids`: tokens that end generation when drawn (end of sequence, end of turn).
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, stop_ids: Vec<u32>) -> Self {
        ModelText {
            tokenizer,
            template,
            stop_ids,
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

impl TextSide for ModelText {
    fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// As transformers' `apply_chat_template(tokenize=True)`, the rendered text is encoded
    /// without adding special tokens: the template writes the ones it wants.
    fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>, TextFailure> {
        let template = self.template.as_ref().ok_or(TextFailure::NoTemplate)?;
        let text = template
            .render(messages, true)
            .map_err(|e| TextFailure::Template(e.to_string()))?;
        self.tokenizer
            .encode(&text, false)
            .map_err(|e| TextFailure::Tokenize(e.to_string()))
    }

    fn text_prompt(&self, text: &str) -> Result<Vec<u32>, TextFailure> {
        self.tokenizer
            .encode(text, true)
            .map_err(|e| TextFailure::Tokenize(e.to_string()))
    }

    fn decode(&self, ids: &[u32]) -> String {
        // Generated ids come from the model's vocabulary; one outside the tokenizer's
        // (a model whose output rows outnumber its tokens) has no text.
        self.tokenizer.decode(ids, true).unwrap_or_else(|_| {
            let known: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&id| self.tokenizer.id_to_token(id).is_some())
                .collect();
            self.tokenizer.decode(&known, true).unwrap_or_default()
        })
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}
