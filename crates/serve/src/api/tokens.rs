//! `POST /tokenize` and `POST /detokenize`: a text-generating model's tokenizer, as the
//! completion and chat routes apply it (a text prompt with the model's framing tokens, or
//! messages through its chat template).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::body::read_json;
use super::generate::{chat_messages, check_token_ids, generator_text, text_failure};
use super::types::ChatMessage;
use super::{ApiError, AppState};

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    model: Option<String>,
    /// A completion's text prompt.
    prompt: Option<String>,
    /// A chat's messages, rendered as for a reply.
    messages: Option<Vec<ChatMessage>>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let (parts, body) = request.into_parts();
    let req: TokenizeRequest = read_json(&parts.headers, body, state.limits).await?;
    let served = state.model(req.model.as_deref(), true)?;
    let text = generator_text(&served)?;
    let tokens = match (req.prompt, req.messages) {
        (Some(p), None) => text
            .text_prompt(&p)
            .map_err(|e| text_failure(e, "prompt"))?,
        (None, Some(m)) => text
            .chat_prompt(&chat_messages(&m)?, &[])
            .map_err(|e| text_failure(e, "messages"))?,
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give either prompt (a text) or messages (a chat), one of the two",
            ))
        }
    };
    let context = served.engine().map(|e| e.context_limit());
    Ok(Json(json!({
        "model": served.id,
        "tokens": tokens,
        "count": tokens.len(),
        "max_model_len": context,
    })))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let (parts, body) = request.into_parts();
    let req: DetokenizeRequest = read_json(&parts.headers, body, state.limits).await?;
    let served = state.model(req.model.as_deref(), true)?;
    let text = generator_text(&served)?;
    check_token_ids(&*text, &req.tokens, "tokens")?;
    Ok(Json(
        json!({"model": served.id, "prompt": text.decode(&req.tokens)}),
    ))
}
