//! Parsing a request body without a server: the same reading and checks the routes apply
//! before a model is involved, for fuzzing the request parsers in-process.

use super::body::{parse_json, parse_json_split};
use super::generate::{chat_messages, check_options};
use super::tokens::{DetokenizeRequest, TokenizeRequest};
use super::types::{ChatRequest, CompletionRequest, EmbeddingRequest, GenerationFields};

/// The endpoints whose bodies [`check_request`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Tokenize,
    Detokenize,
}

impl Endpoint {
    pub const ALL: [Endpoint; 5] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
    ];
}

/// Reads `body` as `endpoint` does and runs the checks that need no model; the error is
/// the message the client would get.
pub fn check_request(endpoint: Endpoint, body: &[u8]) -> Result<(), String> {
    let message = |e: super::ApiError| e.message;
    match endpoint {
        Endpoint::Chat => {
            let (fields, chat): (GenerationFields, ChatRequest) =
                parse_json_split(body).map_err(message)?;
            check_options(fields).map_err(message)?;
            chat_messages(&chat.messages).map_err(message)?;
        }
        Endpoint::Completions => {
            let (fields, _): (GenerationFields, CompletionRequest) =
                parse_json_split(body).map_err(message)?;
            check_options(fields).map_err(message)?;
        }
        Endpoint::Embeddings => {
            parse_json::<EmbeddingRequest>(body).map_err(message)?;
        }
        Endpoint::Tokenize => {
            parse_json::<TokenizeRequest>(body).map_err(message)?;
        }
        Endpoint::Detokenize => {
            parse_json::<DetokenizeRequest>(body).map_err(message)?;
        }
    }
    Ok(())
}
