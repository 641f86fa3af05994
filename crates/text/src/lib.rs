//! quench-text: tokenizers and chat templates.
//!
//! - [`Tokenizer`]: byte-level BPE (GPT-2 family), SentencePiece-style BPE over scored
//!   vocabularies, and WordPiece (BERT), built from GGUF tokenizer metadata
//!   ([`Tokenizer::from_gguf_vocab`]) or a Hugging Face `tokenizer.json`
//!   ([`Tokenizer::from_tokenizer_json`]); encodes and decodes as the Hugging Face
//!   `tokenizers` package does, token for token.
//! - [`ChatTemplate`]: Jinja chat templates rendered as transformers renders them, each
//!   render within [`RenderLimits`] (instructions, output, memory with [`BudgetAllocator`],
//!   time), since a template is as untrusted as the model file it came in; [`tools`]
//!   gives a conversation tools and reads the calls back out of a reply.

mod added_tokens;
mod bpe;
mod byte_level;
mod chat_template;
mod decode;
mod error;
mod gguf_vocab;
mod normalize;
mod pretokenize;
pub mod render_budget;
mod sentencepiece;
mod template_limits;
mod token_bytes;
mod tokenizer;
mod tokenizer_json;
pub mod tools;
mod unicode;
mod vocab;
mod wordpiece;

pub use chat_template::{ChatTemplate, Message};
pub use error::{Result, TextError};
pub use gguf_vocab::GgufVocab;
pub use render_budget::BudgetAllocator;
pub use template_limits::RenderLimits;
pub use tokenizer::{DecodeStream, Tokenizer};
pub use tools::{ParsedReply, ToolCall, ToolFormat};
